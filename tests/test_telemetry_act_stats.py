"""act/.../kurtosis, act/.../token_cos and act/.../saturation: each equals a hand computation on a fixed
tensor through the real hooks, ignores padding, and exists only at the sites that define it."""

import math

import pytest
import torch

from model.config import ModelConfig, NormConfig
from model.transformer import EncoderDecoder
from runlog.metric_names import ACT_STAT_SITES, STATS, parse
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.telemetry import batch, qkv_model_and_batch, record

GARBAGE = 1e4  # written at padding positions, which must not count


def make(kind: str = "layernorm", d: int = 8) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=30, tgt_vocab=30, d_model=d, n_heads=2, d_ff=16, n_enc_layers=1, n_dec_layers=1,
                      dropout=0.0, norm=NormConfig(kind=kind, placement="pre"))  # fmt: skip
    return EncoderDecoder(cfg).eval()


def block_stats(model: EncoderDecoder, x: torch.Tensor, pad: torch.Tensor, sites: tuple, out=None) -> dict[str, float]:
    """Every act stat of encoder block 0 run on ``x`` (B, L, D), ``pad`` (B, L) True at padding, keyed
    ``{site}/{stat}``; ``out`` (B, L, D), when given, replaces the block's output before telemetry reads it."""
    block = model.encoder[0]
    handles = [] if out is None else [block.register_forward_hook(lambda m, a, o: out)]  # runs before telemetry's hook
    tele = Telemetry(model, TelemetryConfig(every=1, sites=sites, grads=False, weights=False, scales=False))
    with tele.watch(pad, pad), torch.no_grad():
        block(x, pad)
    for h in handles:
        h.remove()
    return {k.split(".", 2)[2]: v for k, v in tele.collect().items()}  # act/enc.0.{site}/{stat} -> {site}/{stat}


def padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences (n_b, D) as one (B, L, D) batch with ``GARBAGE`` at the padding, and its (B, L) padding mask."""
    L = max(len(r) for r in rows) + 1  # every row gets padding
    x = torch.full((len(rows), L, rows[0].shape[1]), GARBAGE)
    for b, r in enumerate(rows):
        x[b, : len(r)] = r
    return x, torch.arange(L)[None, :] >= torch.tensor([len(r) for r in rows])[:, None]


def test_kurtosis_of_one_outlier_channel_equals_hand_computation():
    # He et al. 2024, eq. 1: s_j = RMS of channel j over real tokens, kurtosis = mean(s^4) / mean(s^2)^2.
    # Channels 1..7 at +-1 (s_j = 1), channel 0 at +-4 (s_0 = 4): kurtosis = 8 (4^4 + 7) / (4^2 + 7)^2.
    signs = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0])[:, None]
    rows = [signs * torch.ones(5, 8), signs[:3] * torch.ones(3, 8)]
    for r in rows:
        r[:, 0] *= 4
    stats = block_stats(make(), *padded(rows), sites=("in",))
    assert stats["in/kurtosis"] == pytest.approx(8 * (4**4 + 7) / (4**2 + 7) ** 2, rel=1e-6)
    assert 3.97 < stats["in/kurtosis"] < 3.98
    flat = block_stats(make(), *padded([r.sign() for r in rows]), sites=("in",))  # every s_j = 1: the minimum, 1
    assert flat["in/kurtosis"] == pytest.approx(1.0, rel=1e-6)


def test_token_cos_of_identical_tokens_is_1_and_of_orthogonal_tokens_0():
    v = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, 3.0, -0.5, 1.5])
    same = torch.stack([v, 2 * v, 0.1 * v, 7 * v])  # one direction, different norms
    orthogonal = torch.eye(8)[:3] * torch.tensor([[1.0], [5.0], [0.2]])
    lone = v[None]  # one real token: no pair, left out of the mean over sequences
    model = make()
    for rows, want in (([same], 1.0), ([orthogonal], 0.0), ([same, orthogonal, lone], 0.5)):
        x, pad = padded(rows)
        assert block_stats(model, x, pad, sites=("out",), out=x)["out/token_cos"] == pytest.approx(want, abs=1e-6)


def test_token_cos_is_the_mean_over_sequences_of_the_off_diagonal_cosine_mean():
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(n, 8, generator=gen) + 0.5 for n in (6, 2, 4)]
    x, pad = padded(rows)
    per_sequence = []
    for r in rows:  # the n x n cosine matrix, its diagonal left out
        c = torch.nn.functional.cosine_similarity(r[:, None], r[None, :], dim=-1)
        per_sequence.append((c.sum() - c.diagonal().sum()) / (len(r) * (len(r) - 1)))
    got = block_stats(make(), x, pad, sites=("out",), out=x)["out/token_cos"]
    assert got == pytest.approx(torch.stack(per_sequence).mean().item(), rel=1e-5)


@pytest.mark.parametrize("kind", ["dyt", "dyisru"])
def test_saturation_is_the_share_of_norm_inputs_beyond_99_percent_of_the_bound(kind):
    # Pre-LN: enc.0's self_attn.norm_in reads the block input x. DyT: |tanh(alpha x)| > 0.99 iff
    # |x| > atanh(0.99) / alpha; DyISRU: |x| / sqrt(beta + x^2) > 0.99 iff |x| > 0.99 sqrt(beta / (1 - 0.99^2)).
    model = make(kind)
    norm = model.encoder[0].self_attn.norm_in
    with torch.no_grad():
        (norm.alpha if kind == "dyt" else norm.beta).fill_(0.5 if kind == "dyt" else 4.0)
    bound = math.atanh(0.99) / 0.5 if kind == "dyt" else 0.99 * math.sqrt(4.0 / (1 - 0.99**2))  # 5.29, 14.04
    values = torch.tensor([0.0, 1.0, -3.0, 5.0, -5.6, 6.0, 14.0, -14.2, 20.0, -100.0])  # 6 of 10 beyond 5.29, 3 beyond 14.04
    rows = [values.repeat(4).view(5, 8), values[:8].view(1, 8)]
    stats = block_stats(model, *padded(rows), sites=("norm",))
    real = torch.cat(rows)
    assert stats["self_attn.norm_in/saturation"] == pytest.approx((real.abs() > bound).float().mean().item(), rel=1e-6)
    assert stats["self_attn.norm_in/saturation"] == pytest.approx((24 + 4) / 48 if kind == "dyt" else (12 + 1) / 48)


def test_derf_saturation_reads_erf_of_alpha_x_plus_shift():
    # |erf(alpha x + shift)| > 0.99 iff |alpha x + shift| > erfinv(0.99) = 1.8214: with alpha 0.5 and shift 0.5,
    # x > 2.643 or x < -4.643, so 3.0, 3.5, -5.0 and 10.0 of the 8 values; without the shift (|x| > 3.643) or with
    # its sign flipped (x > 4.643 or x < -2.643) it would be 3 of them (-4.0, -5.0, 10.0; -4.0, -5.0, 10.0).
    model = make("derf")
    norm = model.encoder[0].self_attn.norm_in
    with torch.no_grad():
        norm.alpha.fill_(0.5)
        norm.shift.fill_(0.5)
    v = torch.tensor([0.0, 3.0, -4.0, 3.5, -5.0, 10.0, -1.0, 1.0])
    rows = [torch.stack([v, v.flip(0)]), v[None]]
    stats = block_stats(model, *padded(rows), sites=("norm",))
    real = torch.cat(rows)
    by_hand = (torch.erf(0.5 * real + 0.5).abs() > 0.99).float().mean().item()
    assert stats["self_attn.norm_in/saturation"] == pytest.approx(by_hand)
    assert stats["self_attn.norm_in/saturation"] == pytest.approx(12 / 24)


def test_the_stats_of_a_model_equal_hand_computation_at_out_and_per_head_sites():
    model, src, tgt_in, tgt_out = qkv_model_and_batch()
    seen = {}
    watched = {"out": model.encoder[1], "q_norm": model.encoder[0].self_attn.branch.q_norm}
    for name, m in watched.items():
        m.register_forward_hook(lambda mod, a, o, name=name: seen.__setitem__(name, o.detach()))
    stats = record(model, src, tgt_in, tgt_out)
    keep = ~src.eq(0)
    out = seen["out"]  # (B, S, D)
    q = seen["q_norm"].transpose(1, 2).flatten(2)  # (B, H, S, K) -> (B, S, H * K): one channel per head feature
    for x, metric in ((out, "act/enc.1.out/kurtosis"), (q, "act/enc.0.self_attn.q_norm/kurtosis")):
        s2 = x[keep].pow(2).mean(0)  # (channels,): s_j^2
        assert stats[metric] == pytest.approx((s2.pow(2).mean() / s2.mean() ** 2).item(), rel=1e-5), metric
    cos = []
    for b in range(len(src)):
        u = torch.nn.functional.normalize(out[b][keep[b]], dim=-1)
        n = len(u)
        cos.append(((u @ u.T).sum() - n) / (n * (n - 1)))
    assert stats["act/enc.1.out/token_cos"] == pytest.approx(torch.stack(cos).mean().item(), rel=1e-5)


def test_each_stat_is_recorded_only_where_defined_and_only_when_configured():
    stats = record(make("dyt", d=32), *batch(), cfg=TelemetryConfig(every=1, stats=STATS))  # every stat, massive too
    where = {}
    for key in stats:
        m = parse(key)
        assert m is not None and m.name == key, key
        if m.family == "act":
            where.setdefault(m.stat, set()).add(m.site)
    assert where["token_cos"] == where["massive"] == {"out"}
    assert where["saturation"] == {"self_attn.norm_in", "cross_attn.norm_in", "ffn.norm_in", "final_norm"}
    derf = {parse(k).site for k in record(make("derf", d=32), *batch()) if parse(k).stat == "saturation"}
    assert derf == where["saturation"]  # Derf's erf is bounded by 1 like DyT's tanh
    assert where["kurtosis"] == where["rms"]
    assert "saturation" not in {parse(k).stat for k in record(make(d=32), *batch())}  # LayerNorm: unbounded
    only = record(make("dyt", d=32), *batch(), cfg=TelemetryConfig(every=1, stats=("rms",), grads=False))
    assert {parse(k).stat for k in only if parse(k).family == "act"} == {"rms"}
    assert set(ACT_STAT_SITES) == {"token_cos", "massive", "saturation"}
    assert "massive" not in {parse(k).stat for k in record(make(d=32), *batch(), cfg=TelemetryConfig(every=1))}  # light's


def test_stats_are_taken_in_float32_inside_a_bf16_autocast_pass():
    # train_step runs the recorded forward pass under autocast (bf16 on CUDA; here on the CPU), where
    # einsum would sum the per-channel x^2 and the unit vectors in bf16 (8-bit mantissa: ~0.4 % off).
    model, src, tgt_in, tgt_out = qkv_model_and_batch()
    seen = {}
    model.encoder[1].register_forward_hook(lambda mod, a, o: seen.__setitem__("out", o.detach().double()))
    tele = Telemetry(model, TelemetryConfig(every=1, sites=("out",), grads=False))
    with tele.watch(src.eq(0), tgt_out.eq(0)), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(src, tgt_in)
    stats = tele.collect()
    keep = ~src.eq(0)
    s2 = seen["out"][keep].pow(2).mean(0)
    assert stats["act/enc.1.out/kurtosis"] == pytest.approx((s2.pow(2).mean() / s2.mean() ** 2).item(), rel=1e-5)
    u = [torch.nn.functional.normalize(seen["out"][b][keep[b]], dim=-1) for b in range(len(src))]
    cos = [((v @ v.T).sum() - len(v)) / (len(v) * (len(v) - 1)) for v in u]
    assert stats["act/enc.1.out/token_cos"] == pytest.approx(torch.stack(cos).mean().item(), rel=1e-5)
