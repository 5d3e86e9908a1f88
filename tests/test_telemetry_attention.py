"""telemetry/attention.py: attention entropy from the model's own attention logits, and those logits
(``MultiHeadAttention.logits``: scale, padding, causal mask, KV cache) are the ones SDPA softmaxes."""

import math

import pytest
import torch

from model.attention import KVCache
from tests.helpers.telemetry import batch, by_logits, make, record


def test_attention_entropy_of_uniform_attention_is_log_of_key_count():
    model = make().eval()
    for residual in [layer.self_attn for layer in model.encoder] + [
        r for layer in model.decoder for r in (layer.self_attn, layer.cross_attn)
    ]:
        torch.nn.init.zeros_(residual.branch.q_proj.weight)  # all scores equal: uniform attention
        torch.nn.init.zeros_(residual.branch.q_proj.bias)
    src, tgt_in, tgt_out = batch(pad=False)  # 9 keys everywhere
    stats = record(model, src, tgt_in, tgt_out)
    assert stats["attn/enc.0.self_attn/entropy"] == pytest.approx(math.log(9), rel=1e-5)
    assert stats["attn/dec.1.cross_attn/entropy"] == pytest.approx(math.log(9), rel=1e-5)
    # Causal: query t attends uniformly over t + 1 keys.
    assert stats["attn/dec.0.self_attn/entropy"] == pytest.approx(sum(math.log(t + 1) for t in range(9)) / 9, rel=1e-5)


@pytest.mark.parametrize("qk", ["none", "l2"])
def test_the_logits_are_what_sdpa_softmaxes_with_padding_causal_mask_and_kv_cache(qk):
    model = make(qk=qk).eval()
    src, tgt_in, _ = batch()
    torch.manual_seed(1)
    x, memory = torch.randn(6, 9, 32), torch.randn(6, 9, 32)
    enc, dec_self, cross = (
        model.encoder[0].self_attn.branch,
        model.decoder[0].self_attn.branch,
        model.decoder[0].cross_attn.branch,
    )
    with torch.no_grad():
        assert torch.allclose(by_logits(enc, x, None, src.eq(0)), enc(x, None, src.eq(0)), atol=1e-6)
        assert torch.allclose(by_logits(dec_self, x), dec_self(x), atol=1e-6)
        assert torch.allclose(by_logits(cross, x, memory, src.eq(0)), cross(x, memory, src.eq(0)), atol=1e-6)
        # Incremental decoding: 4 cached positions, then 3 new queries (a shifted causal mask), then 1.
        full = dec_self(x[:, :8])
        cache = KVCache()
        dec_self(x[:, :4], cache=cache)
        assert torch.allclose(by_logits(dec_self, x[:, 4:7], cache=cache), full[:, 4:7], atol=1e-6)
        assert torch.allclose(by_logits(dec_self, x[:, 7:8], cache=cache), full[:, 7:8], atol=1e-6)
    hidden = dec_self.logits(torch.randn(1, 4, 3, 8), torch.randn(1, 4, 3, 8))
    assert torch.isneginf(hidden[..., 0, 1:]).all() and torch.isfinite(hidden[..., 2, :]).all()  # future: -inf
