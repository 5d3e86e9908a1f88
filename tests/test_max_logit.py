"""attn/.../max_logit: hand computations on fixed q and k (padding, the causal mask, cross-attention keys, l2
QK-norm's temperature) and one logits computation for entropy and max logit. The output logits' ``out/max_logit``:
tests/test_telemetry_logits.py."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.telemetry import batch, make

K = 8  # head size of make(): d_model 32, 4 heads
MAX_LOGIT = TelemetryConfig(every=1, sites=(), grads=False, attn_max_logit=True)


class Fixed(nn.Module):
    """Stands in for an attention's q or k tap: outputs ``value`` (B, H, L, K) whatever it is given."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value


def along_first_feature(a: torch.Tensor) -> torch.Tensor:
    """(B, H, L) -> (B, H, L, K) vectors a * e_0: q.k of two of them is the product of their a's."""
    return F.pad(a[..., None], (0, K - 1))


def attention_max_logits(model, src, tgt_in, cfg=MAX_LOGIT) -> dict[str, float]:
    tele = Telemetry(model, cfg)
    with tele.watch(src.eq(0), tgt_in.eq(0)), torch.no_grad():
        model(src, tgt_in)
    return tele.collect()


def test_max_logit_of_fixed_q_and_k_leaves_out_padding_and_future_keys():
    model = make(n=1).eval()
    src = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])  # (B, S): row 1 has 2 padding positions
    tgt_in = torch.tensor([[5, 6, 7], [5, 6, 0]])  # (B, T): row 1 has 1
    ones = lambda L: torch.ones(2, 4, L)  # noqa: E731 - (B, H, L)
    # Encoder self-attention: the largest real logit 3 * 2 sits in head 2; a padding key (50) and a padding
    # query (100) would give larger ones.
    enc_q, enc_k = ones(4), ones(4)
    enc_q[0, 2, 1], enc_k[0, 2, 3] = 3.0, 2.0
    enc_q[1, :, 3], enc_k[1, :, 2] = 100.0, 50.0
    # Decoder self-attention, a = (0.5, 1, 0.01) on the queries, c = (1, 2, 50) on the keys: query 1 seeing
    # itself gives the largest logit, 2; a future key would give 0.5 * 50 = 25 and no diagonal 1 * 1.
    dec_q = torch.tensor([0.5, 1.0, 0.01]).expand(2, 4, 3).clone()
    dec_k = torch.tensor([1.0, 2.0, 50.0]).expand(2, 4, 3).clone()
    # Cross-attention: keys are source positions; row 1's source padding (40) is left out, row 0's key 2 gives 4.
    cross_q, cross_k = ones(3), ones(4)
    cross_k[0, 1, 2], cross_k[1, :, 2:] = 4.0, 40.0
    for attn, q, k in ((model.encoder[0].self_attn, enc_q, enc_k), (model.decoder[0].self_attn, dec_q, dec_k),
                       (model.decoder[0].cross_attn, cross_q, cross_k)):  # fmt: skip
        attn.branch.q_tap, attn.branch.k_tap = Fixed(along_first_feature(q)), Fixed(along_first_feature(k))
    stats = attention_max_logits(model, src, tgt_in)
    # each attention's max over heads, and each head's: 1 where only the ones are real
    per_head = {"enc.0.self_attn": [1, 1, 6, 1], "dec.0.self_attn": [2, 2, 2, 2], "dec.0.cross_attn": [1, 4, 1, 1]}
    expected = {f"attn/{a}/max_logit": max(v) / math.sqrt(K) for a, v in per_head.items()}
    expected |= {f"attn/{a}.h{h}/max_logit": x / math.sqrt(K) for a, v in per_head.items() for h, x in enumerate(v)}
    assert stats == pytest.approx(expected, rel=1e-6)


def heads(t: torch.Tensor) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, K)."""
    return t.view(t.shape[0], t.shape[1], 4, K).transpose(1, 2)


def hand_max_logit(q: torch.Tensor, k: torch.Tensor, scale: float, queries: torch.Tensor, keys: torch.Tensor,
                   causal: bool) -> float:  # fmt: skip
    """max of scale * q.k over heads, real queries and the real keys each sees, one (b, t, s) at a time."""
    best = -math.inf
    for b in range(q.shape[0]):
        for t in range(q.shape[2]):
            for s in range(k.shape[2]):
                if queries[b, t] and keys[b, s] and not (causal and s > t):
                    best = max(best, (scale * (q[b, :, t] * k[b, :, s]).sum(-1)).max().item())
    return best


@pytest.mark.parametrize("qk", ["none", "l2"])
def test_max_logit_is_the_logit_the_attention_computes_after_qk_norm(qk):
    """Plain attention: q.k / sqrt(K) of the projections; l2 QK-norm: g * cos(q, k), g the learned temperature."""
    model = make(qk=qk).eval()
    src, tgt_in, _ = batch()
    if qk == "l2":
        with torch.no_grad():
            model.decoder[1].cross_attn.branch.temperature.fill_(7.5)  # off its init of 10
    attentions = {"enc.1.self_attn": model.encoder[1].self_attn, "dec.0.self_attn": model.decoder[0].self_attn,
                  "dec.1.cross_attn": model.decoder[1].cross_attn}  # fmt: skip
    seen = {}
    hooks = [
        proj.register_forward_hook(lambda m, a, out, key=(name, role): seen.__setitem__(key, heads(out.detach())))
        for name, attn in attentions.items()
        for role, proj in (("q", attn.branch.q_proj), ("k", attn.branch.k_proj))
    ]
    stats = attention_max_logits(model, src, tgt_in)
    for h in hooks:
        h.remove()
    real_src, real_tgt = src.ne(0), tgt_in.ne(0)
    for name, attn in attentions.items():
        q, k = seen[name, "q"], seen[name, "k"]
        scale = K**-0.5
        if qk == "l2":
            q, k, scale = F.normalize(q, dim=-1), F.normalize(k, dim=-1), attn.branch.temperature.item()
        queries = real_src if name.startswith("enc") else real_tgt
        keys = real_tgt if name == "dec.0.self_attn" else real_src
        want = hand_max_logit(q, k, scale, queries, keys, causal=name == "dec.0.self_attn")
        assert stats[f"attn/{name}/max_logit"] == pytest.approx(want, rel=1e-5), name
        if qk == "l2":
            assert stats[f"attn/{name}/max_logit"] <= scale * (1 + 1e-6)  # g * cos is at most g


def test_entropy_and_max_logit_come_from_one_score_computation_and_equal_each_alone():
    model = make().eval()
    src, tgt_in, _ = batch()
    both = TelemetryConfig(every=1, sites=(), grads=False, attn_entropy=True, attn_max_logit=True)
    entropy = TelemetryConfig(every=1, sites=(), grads=False, attn_entropy=True)
    tele = Telemetry(model, both)
    with tele.watch(src.eq(0), tgt_in.eq(0)):
        attention = model.encoder[0].self_attn.branch
        assert len(attention._forward_hooks) == 1  # one hook computes the scores for both statistics
        with torch.no_grad():
            model(src, tgt_in)
    together = tele.collect()
    alone = {**attention_max_logits(model, src, tgt_in), **attention_max_logits(model, src, tgt_in, entropy)}
    assert together == alone and len(together) == 6 * (2 + 4)  # 6 attentions: entropy, max logit, 4 heads' max logits
