"""``norm.qk_scope``: QK-norm per head over d_head (Gemma 3, Qwen3) or over the full projected
width d_model before the head split (OLMo 2), written by hand here and compared with the model's attention."""

import math

import pytest
import torch

from model.attention import KVCache, MultiHeadAttention
from model.config import ModelConfig, NormConfig
from model.norms import RMSNorm
from model.transformer import EncoderDecoder
from tests.helpers.model import randomize_norms
from tests.helpers.telemetry import by_logits

B, T, S, D, H = 2, 5, 7, 16, 2
K = D // H


def attention(scope: str) -> MultiHeadAttention:
    torch.manual_seed(0)
    dim = D if scope == "full" else K
    attn = MultiHeadAttention(D, H, 0.0, q_norm=RMSNorm(dim, 1e-6), k_norm=RMSNorm(dim, 1e-6), qk_scope=scope).eval()
    randomize_norms(attn)
    return attn


def by_hand(attn: MultiHeadAttention, x: torch.Tensor, memory: torch.Tensor, full: bool) -> torch.Tensor:
    def rms(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * t / (t.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(B, -1, H, K).transpose(1, 2)  # (B, H, L, K)

    q, k, v = attn.q_proj(x), attn.k_proj(memory), heads(attn.v_proj(memory))
    if full:  # OLMo 2: over D, then the head split
        q, k = heads(rms(q, attn.q_norm.weight)), heads(rms(k, attn.k_norm.weight))
    else:
        q, k = rms(heads(q), attn.q_norm.weight), rms(heads(k), attn.k_norm.weight)
    y = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(K), dim=-1) @ v  # (B, H, T, K)
    return attn.out_proj(y.transpose(1, 2).reshape(B, T, D))


@pytest.mark.parametrize("scope", ["head", "full"])
def test_qk_norm_acts_over_d_head_or_over_d_model_before_the_head_split(scope):
    attn = attention(scope)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D) * 3
    with torch.no_grad():
        torch.testing.assert_close(attn(x, memory), by_hand(attn, x, memory, scope == "full"), atol=1e-5, rtol=0)


def test_full_scope_norms_are_over_d_model_the_value_norm_stays_per_head():
    cfg = ModelConfig(src_vocab=20, tgt_vocab=20, d_model=D, n_heads=H, d_ff=32, n_enc_layers=1, n_dec_layers=1,
                      norm=NormConfig(qk="rmsnorm", v="rmsnorm", qk_scope="full"))  # fmt: skip
    attn = EncoderDecoder(cfg).decoder[0].cross_attn.branch
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (D,) and attn.v_norm.weight.shape == (K,)
    head = EncoderDecoder(ModelConfig(**{**cfg.__dict__, "norm": NormConfig(qk="rmsnorm")})).decoder[0].cross_attn.branch
    assert head.q_norm.weight.shape == (K,)


def test_full_scope_logits_are_what_sdpa_softmaxes_with_a_kv_cache():
    attn = MultiHeadAttention(D, H, 0.0, causal=True, q_norm=RMSNorm(D, 1e-6), k_norm=RMSNorm(D, 1e-6), qk_scope="full")
    randomize_norms(attn)
    x = torch.randn(B, 8, D)
    with torch.no_grad():
        torch.testing.assert_close(by_logits(attn.eval(), x), attn(x), atol=1e-6, rtol=0)
        full, cache = attn(x), KVCache()
        attn(x[:, :4], cache=cache)
        torch.testing.assert_close(by_logits(attn, x[:, 4:8], cache=cache), full[:, 4:8], atol=1e-6, rtol=0)


def test_a_bad_scope_or_l2_over_the_full_width_is_one_line_and_a_block_can_set_the_scope():
    with pytest.raises(ValueError, match=r"^unknown norm.qk_scope 'all'; valid: head, full$"):
        NormConfig(qk="rmsnorm", qk_scope="all")
    with pytest.raises(ValueError, match=r"^unknown norm.qk_scope 'all'; valid: head, full$"):
        MultiHeadAttention(D, H, 0.0, qk_scope="all")
    with pytest.raises(ValueError, match=r"^norm.qk=l2 needs per-head unit vectors .* set norm.qk_scope=head"):
        NormConfig(qk="l2", qk_scope="full")
    with pytest.raises(ValueError, match=r"norm.blocks\[0\]: unknown norm.qk_scope 'x'"):
        NormConfig(blocks=[{"qk_scope": "x"}])
    # Per block: the encoder's QK-norm over d_model, the decoder's per head.
    cfg = ModelConfig(src_vocab=20, tgt_vocab=20, d_model=D, n_heads=H, d_ff=32, n_enc_layers=1, n_dec_layers=1,
                      norm=NormConfig(qk="rmsnorm", blocks=[{"stack": "enc", "qk_scope": "full"}]))  # fmt: skip
    model = EncoderDecoder(cfg)
    assert model.encoder[0].self_attn.branch.q_norm.weight.shape == (D,)
    assert model.decoder[0].self_attn.branch.q_norm.weight.shape == (K,)


def test_activation_telemetry_reads_full_width_q_and_k_norm_outputs_over_real_tokens():
    from tests.helpers.telemetry import batch, make, record

    model = make(qk="rmsnorm", v="rmsnorm", qk_scope="full")
    src, tgt_in, tgt_out = batch()
    seen = {}
    attn = model.encoder[0].self_attn.branch
    hooks = [
        getattr(attn, s).register_forward_hook(lambda m, a, out, s=s: seen.__setitem__(s, out.detach()))
        for s in ("q_norm", "v_norm")
    ]
    stats = record(model, src, tgt_in, tgt_out)  # the full telemetry set: kurtosis and token_cos included
    for h in hooks:
        h.remove()
    keep = ~src.eq(0)  # (B, S)
    q, v = seen["q_norm"], seen["v_norm"]  # (B, S, D) before the head split; (B, H, S, K)
    assert q.dim() == 3 and v.dim() == 4
    assert stats["act/enc.0.self_attn.q_norm/rms"] == pytest.approx(q[keep].square().mean().sqrt().item(), rel=1e-5)
    assert stats["act/enc.0.self_attn.v_norm/rms"] == pytest.approx(
        v.transpose(1, 2)[keep].square().mean().sqrt().item(), rel=1e-5
    )
    assert stats["act/enc.0.self_attn.q_norm/maxabs"] == pytest.approx(q[keep].abs().max().item(), rel=1e-6)
