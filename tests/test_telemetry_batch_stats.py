"""Batch-statistics fluctuation (telemetry/batch_stats.py, ``bstat/``) and the norms' ``batch_vs_running``: the
distance equals a hand computation, pads do not count, reading changes no buffer, the sites recorded are the
batch-reading ones, the compiled path's extra pass reads what the eager pass reads, training is unchanged,
and the Gaussian baselines of docs/telemetry.md hold."""

import math

import pytest
import torch

from data.batching import Batch
from model.batch_reading import BatchReadingNorm
from model.batchnorm import MOMENTUM, BatchNorm, NativeBatchNorm
from model.powernorm import GROUP_SCALING_EPS, PowerNorm, group_scale
from model.transformer import EncoderDecoder
from runlog.metric_names import parse
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.config import make_cfg, model_config
from tests.helpers.telemetry import batch, make, record, train_steps

ONLY_BSTAT = TelemetryConfig(every=1, sites=(), stats=("rms",), grads=False, weights=False, scales=False,
                             attn_max_logit=False, logits=False, adam=False)  # fmt: skip


def bstat(stats: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in stats.items() if parse(k).family == "bstat"}


def padded(x: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x and keep with one more row of garbage pad tokens (keep False)."""
    return torch.cat([x, torch.full_like(x[:1], 1e4)]), torch.cat([keep, torch.zeros_like(keep[:1])])


# Tokens (1, 2), (3, 6) and a pad (100, -100): mean (2, 4), biased variance (1, 4).
X = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [100.0, -100.0]]])
KEEP = torch.tensor([[True, True, False]])


@pytest.mark.parametrize("norm", [BatchNorm(2, 1e-5), NativeBatchNorm(2, 1e-5)], ids=["custom", "native"])
def test_batchnorm_statistics_and_distances_by_hand(norm):
    norm.running_mean.copy_(torch.tensor([2.0, 1.0]))
    norm.running_var.copy_(torch.tensor([1.0, 0.0]))
    stats = record_norm(norm, X, KEEP)
    # mean_dist = ||(2, 4) - (2, 1)|| / 2 = 3 / 2; var_dist = ||(1, 4) - (1, 0)|| / 2 = 2
    assert stats == {"bstat/enc.final_norm/mean_dist": 1.5, "bstat/enc.final_norm/var_dist": 2.0}


def test_powernorm_statistic_and_distance_by_hand():
    norm = PowerNorm(2, group_num=1)
    norm.running_phi.copy_(torch.tensor([1.5, 2.5]))
    # Group scaling divides (1, 2) by sqrt(2.5 + e) and (3, 6) by sqrt(22.5 + e): phi = the mean of the squares.
    e = GROUP_SCALING_EPS
    phi = [(1 / (2.5 + e) + 9 / (22.5 + e)) / 2, (4 / (2.5 + e) + 36 / (22.5 + e)) / 2]
    stats = record_norm(norm, X, KEEP)
    assert stats == {"bstat/enc.final_norm/phi_dist": pytest.approx(math.dist(phi, [1.5, 2.5]) / 2, rel=1e-6)}


def record_norm(norm: BatchReadingNorm, x: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
    """``bstat/`` of ``norm`` as a pre-LN encoder's final norm reading (x, keep) in training mode; the
    buffers it reads are checked unchanged by the reading itself."""
    model = make(kind="layernorm")
    model.enc_final_norm = norm
    tele = Telemetry(model, ONLY_BSTAT)
    before = {k: b.clone() for k, b in norm.named_buffers()}
    handles = tele.batch_stats.hooks()
    with torch.no_grad():
        norm.batch_vs_running(x, keep)
        assert all(torch.equal(b, before[k]) for k, b in norm.named_buffers())  # no side effect
        norm.train()(x, keep)
    for h in handles:
        h.remove()
    return tele.collect()


@pytest.mark.parametrize("make_norm", [lambda: BatchNorm(4, 1e-5), lambda: NativeBatchNorm(4, 1e-5), lambda: PowerNorm(4)])
def test_pad_rows_do_not_change_the_statistics(make_norm):
    norm = make_norm()
    g = torch.Generator().manual_seed(0)
    x, keep = torch.randn(3, 5, 4, generator=g), torch.rand(3, 5, generator=g) > 0.3
    plain = norm.batch_vs_running(x, keep)
    with_pads = norm.batch_vs_running(*padded(x, keep))
    assert plain.keys() == with_pads.keys() == ({"phi"} if isinstance(norm, PowerNorm) else {"mean", "var"})
    assert all(torch.equal(a, b) for k in plain for a, b in zip(plain[k], with_pads[k], strict=True))


def test_custom_batchnorm_reads_this_ranks_tokens_without_a_collective():
    norm, local = BatchNorm(2, 1e-5), BatchNorm(2, 1e-5)
    norm.group = object()  # not a process group: any collective on it would raise
    read, alone = norm.batch_vs_running(X, KEEP), local.batch_vs_running(X, KEEP)
    assert all(torch.equal(a, b) for k in read for a, b in zip(read[k], alone[k], strict=True))


def test_batchnorm_statistics_are_the_forwards_bit_for_bit(monkeypatch):
    norm = BatchNorm(4, 1e-5)
    g = torch.Generator().manual_seed(1)
    x, keep = 3 * torch.randn(3, 5, 4, generator=g) + 1, torch.rand(3, 5, generator=g) > 0.3
    used = []
    original = BatchNorm._train_statistics

    def spy(self: BatchNorm, xr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        used.append(original(self, xr))
        return used[-1]

    monkeypatch.setattr(BatchNorm, "_train_statistics", spy)
    read = norm.batch_vs_running(x, keep)
    norm(x, keep)
    assert torch.equal(read["var"][0], used[0][1])  # the forward returns the centred tokens and the variance
    # the mean the forward blended into running_mean (from 0): the one read, bit for bit
    assert torch.equal(norm.running_mean, MOMENTUM * read["mean"][0] + (1 - MOMENTUM) * torch.zeros(4))
    # torch's kernel normalizes with the same biased variance, to float32 rounding
    native = NativeBatchNorm(4, 1e-5)
    mean, var = (native.batch_vs_running(x, keep)[k][0] for k in ("mean", "var"))
    torch.testing.assert_close(native(x, keep)[keep], (x[keep] - mean) / torch.sqrt(var + 1e-5), rtol=1e-5, atol=1e-5)


def test_powernorm_statistic_is_the_forwards():
    norm = PowerNorm(8, group_num=2)  # within warmup the forward divides by sqrt(phi + eps): weight 1, bias 0
    g = torch.Generator().manual_seed(2)
    x, keep = 3 * torch.randn(3, 5, 8, generator=g), torch.rand(3, 5, generator=g) > 0.3
    phi, running = norm.batch_vs_running(x, keep)["phi"]
    assert torch.equal(running, torch.ones(8)) and norm.iters.item() == 0
    assert torch.equal(norm(x, keep), group_scale(x, 2) / (phi + norm.eps).sqrt())


def test_the_contract_declares_batch_vs_running():
    with pytest.raises(NotImplementedError, match="BatchReadingNorm must define batch_vs_running"):
        BatchReadingNorm().batch_vs_running(X, KEEP)


def test_pre_ln_records_no_bstat_and_registers_no_hook():
    model = make()
    assert Telemetry(model, ONLY_BSTAT).batch_stats.hooks() == []
    assert not bstat(record(model, *batch()))


@pytest.mark.parametrize(("preset", "stats"), [("pre_bn", ("mean_dist", "var_dist")), ("pre_pn", ("phi_dist",))])
def test_a_preset_records_each_encoder_site_and_the_encoder_final_norm(preset, stats):
    model = EncoderDecoder(model_config(make_cfg(f"norm={preset}"), 30, 40))
    sites = [f"enc.{i}.{r}.norm_in" for i in range(model.cfg.n_enc_layers) for r in ("self_attn", "ffn")] + ["enc.final_norm"]
    src, tgt_in, tgt_out = batch()
    recorded = bstat(record(model, src, tgt_in, tgt_out))
    assert list(recorded) == [f"bstat/{site}/{stat}" for site in sites for stat in stats]  # forward order
    # pre_bn at init: the block-0 input's statistics against running_mean 0, running_var 1, by hand
    if preset == "pre_bn":
        norm, seen = model.encoder[0].self_attn.norm_in, []
        handle = norm.register_forward_pre_hook(lambda m, args: seen.append(args[0][args[1]].detach()))
        model(src, tgt_in)
        handle.remove()
        xr = seen[0].double()
        expect = torch.linalg.vector_norm(xr.mean(0)).item() / xr.shape[1]
        assert recorded["bstat/enc.0.self_attn.norm_in/mean_dist"] == pytest.approx(expect, rel=1e-5)
        expect = torch.linalg.vector_norm(xr.var(0, unbiased=False) - 1).item() / xr.shape[1]
        assert recorded["bstat/enc.0.self_attn.norm_in/var_dist"] == pytest.approx(expect, rel=1e-5)


def test_an_all_pad_row_leaves_the_recorded_values():
    model = make(kind="batchnorm", decoder_batch_stats=True)
    src, tgt_in, tgt_out = batch()
    plain = bstat(record(model.eval(), src, tgt_in, tgt_out))  # eval: the buffers stay, both calls read the same
    more = bstat(record(model, *(torch.cat([t, torch.zeros_like(t[:1])]) for t in (src, tgt_in, tgt_out))))
    assert len(plain) == 24 and more == pytest.approx(plain, rel=1e-5)


def test_training_is_bit_identical_with_bstat_on_and_off():
    runs = {}
    for every in (0, 1):
        model = make(kind="batchnorm", n=1, dropout=0.1, decoder_batch_stats=True)
        losses, stats, weights, rng = train_steps(model, every)
        runs[every] = losses, [*weights, *model.buffers(), rng]
        assert len(bstat(stats[-1])) == (14 if every else 0)  # 2 + 3 slots and 2 final norms, 2 statistics each
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


def test_the_compiled_paths_extra_pass_reads_the_buffers_the_training_pass_starts_from(monkeypatch):
    model = make(kind="powernorm", decoder_batch_stats=True)
    src, tgt_in, tgt_out = batch()
    b = Batch(src, tgt_in, tgt_out, list(range(6)), int(tgt_out.ne(0).sum()))
    model(src, tgt_in)  # one training step's update: running_phi no longer at its init
    tele = Telemetry(model, ONLY_BSTAT)
    monkeypatch.setattr(tele, "_compiled", lambda: True)
    with tele.around_forward(b, record=True):
        pass  # the compiled training pass would run here
    extra = tele.collect()
    monkeypatch.undo()
    with tele.around_forward(b, record=True):
        model(src, tgt_in)  # eager: the hooks ride the training pass
    assert len(extra) == 12 and extra == tele.collect()


def gaussian_distances(kind: str, n_tokens: int, d: int, sigma: float, seeds: int, groups: int = 1) -> dict[str, float]:
    """The mean over ``seeds`` Gaussian batches of ``bstat/enc.0.self_attn.norm_in/*``, the block-0 input of a
    pre-``kind`` encoder replaced by N(0, sigma^2) x (n_tokens real tokens in rows of 32, pads at 1e4), running
    statistics at the Gaussian's (BatchNorm: mean 0, var sigma^2; PowerNorm with ``groups`` groups: phi 1, its init)."""
    model = make(kind=kind, n=1, d=d, decoder_batch_stats=True, knobs={"powernorm": {"group_num": groups}})
    norm = model.encoder[0].self_attn.norm_in
    if kind == "batchnorm":
        norm.running_var.fill_(sigma**2)
    tele = Telemetry(model, ONLY_BSTAT)
    totals: dict[str, float] = {}
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        rows = -(-n_tokens // 32)
        pad = (torch.arange(rows * 32) >= n_tokens).view(rows, 32)
        x = sigma * torch.randn(rows, 32, d, generator=gen)
        x[pad] = 1e4
        with tele.watch(pad, pad), torch.no_grad():
            model.encoder[0].eval()(x, pad, keep=~pad)
        for k, v in tele.collect().items():
            if k.startswith("bstat/enc.0.self_attn.norm_in/"):
                totals[parse(k).stat] = totals.get(parse(k).stat, 0.0) + v / seeds
    return totals


def test_gaussian_baselines():
    n, d, sigma = 2000, 128, 2.0
    bn = gaussian_distances("batchnorm", n, d, sigma, seeds=8)
    assert bn["mean_dist"] == pytest.approx(sigma / math.sqrt(n * d), rel=0.05)
    assert bn["var_dist"] == pytest.approx(sigma**2 * math.sqrt((2 * n - 1) / (n * n * d)), rel=0.05)
    for groups in (1, 4):
        m = d // groups  # the channels of a scaling group
        pn = gaussian_distances("powernorm", n, d, sigma, seeds=8, groups=groups)
        assert pn["phi_dist"] == pytest.approx(math.sqrt(2 * (m - 1) / ((m + 2) * n * d)), rel=0.05)
