"""The attention-logit controls side by side with the Hugging Face modules that define them (transformers 5.23.0), on
copied weights: the learned sink with ``GptOssAttention`` (``models/gpt_oss``), soft-capping with ``Gemma2Attention``
(``models/gemma2``), the elementwise output gate with the qwen3next preset's QK-norm with ``Qwen3NextAttention``
(``models/qwen3_next``); the headwise gate, which no Hugging Face model has, against its official code's split
(qiuzh20/gated_attention, ``modeling_qwen3.py``) restated; and the gemma2 and qwen3next presets' constants.

Made equal, as in tests/test_hf_reference.py: rotary embeddings are the identity (cos = 1, sin = 0), the projections
have biases on both sides (``attention_bias=True``), the logit scale is 1 / sqrt(d_head) (Gemma 2's
``query_pre_attn_scalar`` = head_dim), one full-attention layer, and the causal mask is HF's additive one.
"""

import pytest
import torch
from torch import nn

from model.attention import MultiHeadAttention
from model.transformer import EncoderDecoder
from tests.helpers.config import make_cfg, model_config
from tests.helpers.hf import copy_projections, identity_rotary, randomize

transformers = pytest.importorskip("transformers")
from transformers import Gemma2Config, GptOssConfig, Qwen3NextConfig  # noqa: E402
from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention  # noqa: E402
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention  # noqa: E402

D, H, B, T = 16, 2, 3, 7
K = D // H
SIZES = [f"model.d_model={D}", f"model.n_heads={H}", f"model.d_ff={2 * D}", "model.dropout=0.0"]
COMMON = dict(hidden_size=D, num_attention_heads=H, num_key_value_heads=H, head_dim=K, num_hidden_layers=1,
              layer_types=["full_attention"], attention_bias=True, attn_implementation="eager")  # fmt: skip
CAUSAL = torch.full((T, T), float("-inf")).triu(1)[None, None]  # (1, 1, T, T), HF's additive mask


def compare(mine: MultiHeadAttention, theirs: nn.Module, causal: bool, scale: float = 2.0, rotary: int = K) -> None:
    """Both attentions on one input (HF's probabilities against ``mine.weights`` too), causal or bidirectional."""
    seen = {}
    taps = [mine.q_tap.register_forward_hook(lambda m, a, out: seen.__setitem__("q", out)),
            mine.k_tap.register_forward_hook(lambda m, a, out: seen.__setitem__("k", out))]  # fmt: skip
    torch.manual_seed(2)
    x = torch.randn(B, T, D) * scale
    with torch.no_grad():
        y, probs = theirs(x, identity_rotary(x, rotary), CAUSAL if causal else None)
        torch.testing.assert_close(mine(x), y, atol=1e-5, rtol=0)
        torch.testing.assert_close(mine.weights(seen["q"], seen["k"]), probs, atol=1e-6, rtol=0)
    for tap in taps:
        tap.remove()


@pytest.mark.parametrize("causal", [False, True])
def test_the_sink_equals_gpt_oss_attention(causal):
    theirs = GptOssAttention(GptOssConfig(**COMMON), layer_idx=0).eval()
    randomize(theirs)
    with torch.no_grad():
        theirs.sinks.copy_(torch.tensor([1.5, -0.5]))  # one head gives its sink a large share, one a small one
    mine = MultiHeadAttention(D, H, 0.0, causal=causal, sink=True).eval()
    with torch.no_grad():
        copy_projections(mine, theirs)
        mine.sinks.copy_(theirs.sinks)
    compare(mine, theirs, causal, rotary=K // 2)  # gpt-oss rotates the two halves of a head by one (K / 2) table
    assert GptOssConfig().initializer_range == 0.02  # normlab's SINK_INIT_STD


@pytest.mark.parametrize("causal", [False, True])
def test_soft_capping_equals_gemma2_attention(causal):
    cap = 2.0  # small enough to bend these logits (Gemma 2's 50 would leave them almost as they are)
    theirs = Gemma2Attention(Gemma2Config(**COMMON, query_pre_attn_scalar=K, attn_logit_softcapping=cap), 0).eval()
    randomize(theirs)
    mine = MultiHeadAttention(D, H, 0.0, causal=causal, softcap=cap).eval()
    with torch.no_grad():
        copy_projections(mine, theirs)
    compare(mine, theirs, causal, scale=4.0)


def qwen3next_attention(causal: bool) -> MultiHeadAttention:
    torch.manual_seed(0)
    model = EncoderDecoder(model_config(make_cfg("norm=qwen3next", *SIZES), 20, 20)).eval()
    return (model.decoder[0].self_attn if causal else model.encoder[0].self_attn).branch


@pytest.mark.parametrize("causal", [False, True])
def test_the_qwen3next_presets_gated_attention_equals_qwen3next_attention(causal):
    theirs = Qwen3NextAttention(Qwen3NextConfig(**COMMON, rms_norm_eps=1e-6), layer_idx=0).eval()
    randomize(theirs)
    mine = qwen3next_attention(causal)
    assert mine.gate_proj.weight.shape == (D, D) and mine.q_norm.weight.shape == (K,)
    with torch.no_grad():
        copy_projections(mine, theirs, query=False)
        # HF's q_proj holds, per head, the query's K rows then the gate's K rows: split them into normlab's two
        for ours, half in ((mine.q_proj, slice(0, K)), (mine.gate_proj, slice(K, 2 * K))):
            ours.weight.copy_(theirs.q_proj.weight.view(H, 2 * K, D)[:, half].reshape(D, D))
            ours.bias.copy_(theirs.q_proj.bias.view(H, 2 * K)[:, half].reshape(D))
        for norm in ("q_norm", "k_norm"):  # zero-centred gains on both sides: the one stored w of 1 + w
            (stored,) = getattr(mine, norm).parameters()
            stored.copy_(getattr(theirs, norm).weight)
    compare(mine, theirs, causal)


def test_the_headwise_gate_is_the_official_split():
    """qiuzh20/gated_attention, ``headwise_attn_output_gate``: q_proj gives H*K query rows and H gate rows (one
    group per key-value head; here H groups of K + 1), the head outputs are multiplied by sigmoid(gate) per head."""
    torch.manual_seed(0)
    mine = MultiHeadAttention(D, H, 0.0, gate="headwise").eval()
    randomize(mine)
    fused = torch.cat([mine.q_proj.weight.view(H, K, D), mine.gate_proj.weight.view(H, 1, D)], 1)  # (H, K + 1, D)
    fused_bias = torch.cat([mine.q_proj.bias.view(H, K), mine.gate_proj.bias.view(H, 1)], 1)
    x = torch.randn(B, T, D)
    with torch.no_grad():
        qg = (x @ fused.reshape(-1, D).T + fused_bias.reshape(-1)).view(B, T, H, K + 1)
        q, gate = qg.split([K, 1], -1)  # (B, T, H, K), (B, T, H, 1)
        k, v = (p(x).view(B, T, H, K) for p in (mine.k_proj, mine.v_proj))
        w = torch.softmax(torch.einsum("bthk,bshk->bhts", q, k) / K**0.5, -1)
        heads = torch.einsum("bhts,bshk->bthk", w, v) * torch.sigmoid(gate)
        torch.testing.assert_close(mine(x), mine.out_proj(heads.reshape(B, T, D)), atol=1e-6, rtol=0)


def test_the_presets_constants_are_the_released_models():
    gemma2, qwen3next = (make_cfg(f"norm={p}") for p in ("gemma2", "qwen3next"))
    g2 = Gemma2Config()  # google/gemma-2-9b's config.json holds the same three values
    assert (gemma2.model.attn_softcap, gemma2.model.final_softcap) == (g2.attn_logit_softcapping, g2.final_logit_softcapping)
    g2_norm = gemma2.norm
    assert (g2_norm.placement, g2_norm.gain, g2_norm.qk, g2_norm.eps) == ("sandwich", "unit_offset", None, g2.rms_norm_eps)
    assert Qwen3NextConfig().rms_norm_eps == qwen3next.norm.eps == 1e-6 and qwen3next.model.attn_gate == "elementwise"
    q_norm = qwen3next.norm
    assert (q_norm.placement, q_norm.gain, q_norm.qk, q_norm.qk_scope) == ("pre", "unit_offset", "rmsnorm", "head")
