"""The ``olmo2`` and ``gemma3`` presets against the Hugging Face modeling code (transformers
5.23.0, ``models/olmo2/modeling_olmo2.py``, ``models/gemma3/modeling_gemma3.py``) on copied weights.

Compared: each RMSNorm (Olmo2RMSNorm vs ``rmsnorm``; Gemma3RMSNorm, ``x_hat * (1 + w)`` in float32, vs ``rmsnorm``
with ``norm.gain=unit_offset``), bit for bit; each attention with its QK-norm (OLMo 2 over the full projected width,
Gemma 3 per head), output and attention probabilities; each block's residual wiring (OLMo 2: x + N(F(x)) per
branch; Gemma 3: x + N(F(N(x))), four norms). What differs by design is made equal or stubbed, and only that:

- rotary embeddings: HF's layers take ``position_embeddings=(cos, sin)``; given cos = 1, sin = 0 the rotation is the
  identity (normlab adds positions to the embeddings instead);
- the MLP: HF's gated SiLU / GELU-tanh MLP is replaced in the HF layer by normlab's own ``FeedForward`` module (the
  same object on both sides), since normlab's FFN is ReLU;
- attention biases: HF's configs get ``attention_bias=True`` (the released models have none; normlab's projections
  have biases), copied across;
- the mask: HF's eager attention with ``attention_mask=None`` is bidirectional, as normlab's encoder block (no
  padding); the causal attention is compared with an explicit additive causal mask (-inf above the diagonal);
- Gemma 3's ``query_pre_attn_scalar`` is set to head_dim (the logit scale 1 / sqrt(d_head), normlab's) and its one
  layer to ``full_attention`` (no sliding window).
"""

import pytest
import torch
from torch import nn

from model.norms import RMSNorm, build_norm
from model.transformer import EncoderDecoder
from tests.helpers.config import make_cfg, model_config
from tests.helpers.hf import copy_projections, identity_rotary, randomize

transformers = pytest.importorskip("transformers")
from transformers import Gemma3TextConfig, Olmo2Config  # noqa: E402
from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention, Gemma3DecoderLayer, Gemma3RMSNorm  # noqa: E402
from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention, Olmo2DecoderLayer, Olmo2RMSNorm  # noqa: E402

D, H, B, T = 16, 2, 3, 7
K = D // H
SIZES = [f"model.d_model={D}", f"model.n_heads={H}", f"model.d_ff={2 * D}", "model.dropout=0.0"]


def normlab(preset: str) -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder(model_config(make_cfg(f"norm={preset}", *SIZES), 20, 20)).eval()


def hf_config(preset: str, eps: float):
    common = dict(hidden_size=D, num_attention_heads=H, num_key_value_heads=H, intermediate_size=2 * D, num_hidden_layers=1,
                  vocab_size=20, attention_bias=True, rms_norm_eps=eps, attn_implementation="eager", bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)  # fmt: skip
    if preset == "olmo2":
        return Olmo2Config(**common)
    return Gemma3TextConfig(**common, head_dim=K, query_pre_attn_scalar=K, layer_types=["full_attention"])


def copy_norm(dst: nn.Module, src: nn.Module) -> None:
    """HF's stored gain parameter into normlab's one stored parameter (``weight``, or w under unit_offset)."""
    (stored,) = dst.parameters()
    stored.copy_(src.weight)


def copy_attention(dst: nn.Module, src: nn.Module) -> None:
    copy_projections(dst, src)
    copy_norm(dst.q_norm, src.q_norm)
    copy_norm(dst.k_norm, src.k_norm)


@pytest.mark.parametrize(("hf_norm", "gain"), [(Olmo2RMSNorm, "plain"), (Gemma3RMSNorm, "unit_offset")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_equals_olmo2s_and_unit_offset_equals_gemma3s_bit_for_bit(hf_norm, gain, dtype):
    theirs = hf_norm(D, eps=1e-6)
    randomize(theirs)
    mine = build_norm("rmsnorm", D, eps=1e-6, gain=gain)
    with torch.no_grad():
        copy_norm(mine, theirs)
        x = (torch.randn(B, T, D) * 5).to(dtype)
        assert torch.equal(mine(x), theirs(x))
    assert torch.equal(mine.weight, theirs.weight + (1 if gain == "unit_offset" else 0))


@pytest.mark.parametrize(("preset", "hf_attention"), [("olmo2", Olmo2Attention), ("gemma3", Gemma3Attention)])
def test_causal_attention_with_its_qk_norm_equals_hf_on_copied_weights(preset, hf_attention):
    model = normlab(preset)
    mine = model.decoder[0].self_attn.branch  # causal, QK-norm over d_model (olmo2) or d_head (gemma3)
    assert mine.q_norm.weight.shape == ((D,) if preset == "olmo2" else (K,))
    theirs = hf_attention(hf_config(preset, model.cfg.norm.eps), layer_idx=0).eval()
    randomize(theirs)
    seen = {}
    taps = [mine.q_tap.register_forward_hook(lambda m, a, out: seen.__setitem__("q", out)),
            mine.k_tap.register_forward_hook(lambda m, a, out: seen.__setitem__("k", out))]  # fmt: skip
    x = torch.randn(B, T, D) * 2
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]  # (1, 1, T, T), additive
    with torch.no_grad():
        copy_attention(mine, theirs)
        y, probs = theirs(x, identity_rotary(x, K), causal)
        torch.testing.assert_close(mine(x), y, atol=1e-5, rtol=0)  # SDPA vs HF's eager matmuls: float32 rounding
        torch.testing.assert_close(torch.softmax(mine.logits(seen["q"], seen["k"]), -1), probs, atol=1e-6, rtol=0)
    for tap in taps:
        tap.remove()


def copy_block(preset: str, mine: nn.Module, theirs: nn.Module) -> None:
    """normlab's encoder block <- HF's decoder layer; HF's MLP replaced by normlab's FeedForward."""
    copy_attention(mine.self_attn.branch, theirs.self_attn)
    slots = {"post_attention_layernorm": mine.self_attn.norm_branch, "post_feedforward_layernorm": mine.ffn.norm_branch}
    if preset == "gemma3":
        slots |= {"input_layernorm": mine.self_attn.norm_in, "pre_feedforward_layernorm": mine.ffn.norm_in}
    for name, norm in slots.items():
        copy_norm(norm, getattr(theirs, name))
    theirs.mlp = mine.ffn.branch


@pytest.mark.parametrize(("preset", "hf_layer"), [("olmo2", Olmo2DecoderLayer), ("gemma3", Gemma3DecoderLayer)])
def test_a_block_is_wired_as_hfs_decoder_layer_on_copied_weights(preset, hf_layer):
    model = normlab(preset)
    mine = model.encoder[0]  # bidirectional, as HF's eager attention without a mask
    theirs = hf_layer(hf_config(preset, model.cfg.norm.eps), layer_idx=0).eval()
    randomize(theirs)
    with torch.no_grad():
        copy_block(preset, mine, theirs)
        x = torch.randn(B, T, D) * 2
        y = theirs(x, attention_mask=None, position_embeddings=identity_rotary(x, K))
        torch.testing.assert_close(mine(x, None), y, atol=1e-5, rtol=0)
        assert (y - x).abs().max() > 0.1  # the block did something
    # Every norm slot the preset fills is one HF has: a wiring with another slot would have an uncopied norm.
    filled = {f"{r}.{s}" for r in ("self_attn", "ffn") for s in ("norm_in", "norm_branch", "norm_out")
              if not isinstance(getattr(getattr(mine, r), s), nn.Identity)}  # fmt: skip
    assert len(filled) == (2 if preset == "olmo2" else 4)
    assert isinstance(model.enc_final_norm, RMSNorm)  # OLMo 2's and Gemma 3's final norm


def test_the_presets_constants_are_the_released_models():
    olmo2, gemma3 = (normlab(p).cfg.norm for p in ("olmo2", "gemma3"))
    # allenai/OLMo-2-1124-7B and -13B config.json: rms_norm_eps 1e-06; Gemma3TextConfig.rms_norm_eps = 1e-6.
    assert olmo2.eps == gemma3.eps == Gemma3TextConfig().rms_norm_eps == 1e-6
    assert (olmo2.placement, olmo2.qk, olmo2.qk_scope, olmo2.gain) == ("res_post", "rmsnorm", "full", "plain")
    assert (gemma3.placement, gemma3.qk, gemma3.qk_scope, gemma3.gain) == ("sandwich", "rmsnorm", "head", "unit_offset")
