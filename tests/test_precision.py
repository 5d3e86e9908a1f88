"""``trainer.precision`` on the CPU: bf16 autocast (``training/precision.py``) runs the GPU's mixed-precision path in the
default suite: float32 master weights and loss, float32 norm statistics and telemetry, values within bf16's rounding
of the fp32 run's, exact resume; and what ``auto`` picks on the CPU."""

import contextlib
import io
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import train as train_module
import training.step
from benchmarks.norms import norm_preset
from data.batching import Batch
from model.config import ModelConfig
from model.transformer import EncoderDecoder
from runlog.status import read_status
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.config import make_cfg
from tests.helpers.resume import EXACT, losses, rows, stop_by_sigterm
from training.checkpoint import load_checkpoint
from training.optim import build_optimizer, build_scheduler
from training.precision import AUTO, autocast, resolve_precision
from training.presets import default_optim, group_keys
from training.schema import ScheduleConfig
from training.step import StepOptions, train_step

U = 2**-8  # bf16's unit roundoff: 8 significant bits, so rounding to bf16 moves a value by at most U of it
BF16 = "trainer.precision=bf16"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, set, str]]:
    """The EXACT run of tests/test_resume.py at the default precision and at bf16: {"auto" | "bf16": (run dir, the
    (logits, loss) dtypes of its training steps, what it printed)}."""
    out = {}
    for name, overrides in (("auto", EXACT), ("bf16", [*EXACT, BF16])):
        seen, real = [], training.step.token_losses

        def spy(logits, tgt_out, options, real=real, seen=seen):  # autocast's output, and the loss taken from it
            ce, z = real(logits, tgt_out, options)
            seen.append((logits.dtype, ce.dtype))
            return ce, z

        run_dir, printed = tmp_path_factory.mktemp(name), io.StringIO()
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
            patch.setattr(training.step, "token_losses", spy)
            train_module.train(make_cfg(*overrides), run_dir)
        out[name] = (run_dir, set(seen), printed.getvalue())
    return out


def test_the_default_on_the_cpu_is_fp32_and_bf16_trains_close_to_it_with_float32_weights(runs):
    (fp32_dir, fp32_dtypes, fp32_out), (bf16_dir, bf16_dtypes, bf16_out) = runs["auto"], runs["bf16"]
    # auto on the CPU is fp32 (training.precision.AUTO says why), said in status.json and the log line.
    assert OmegaConf.load(fp32_dir / "config.yaml").trainer.precision == "auto"
    assert read_status(fp32_dir)["precision"] == "fp32" and ", fp32, run dir" in fp32_out
    assert fp32_dtypes == {(torch.float32, torch.float32)}
    # bf16: the logits come out of autocast in bf16, the loss is taken in float32.
    assert read_status(bf16_dir)["precision"] == "bf16" and ", bf16, run dir" in bf16_out
    assert bf16_dtypes == {(torch.bfloat16, torch.float32)}
    # The master weights and AdamW's state stay float32: autocast casts a copy per op, never the parameter.
    ckpt = load_checkpoint(bf16_dir / "checkpoint.pt")
    assert {t.dtype for t in ckpt["model"].values() if t.is_floating_point()} == {torch.float32}
    states = ckpt["optimizer"]["state"].values()
    assert {t.dtype for s in states for k, t in s.items() if k != "step"} == {torch.float32}
    # Each step's loss within bf16's rounding of fp32's: logits each off by <= U relative, averaged over the tokens.
    # (Seen: <= 1.1e-3 nats over these 12 steps; U * loss ~ 0.015.) Not equal: bf16 really ran.
    a, b = losses(fp32_dir), losses(bf16_dir)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert b[step][0] == pytest.approx(a[step][0], rel=U) and b[step][1] == a[step][1]  # lr: same schedule
    assert any(b[step][0] != a[step][0] for step in a)
    # Validation runs without autocast: the loss at initialization, before any bf16 step, is fp32's to the bit.
    assert rows(bf16_dir)[0] == rows(fp32_dir)[0] and "val/loss" in rows(bf16_dir)[0]


def test_a_bf16_run_stopped_by_sigterm_and_resumed_matches_an_uninterrupted_bf16_run(runs, tmp_path, monkeypatch):
    # Exact under CPU autocast too: the bf16 kernels are deterministic for a fixed thread count and shape, and the
    # checkpoint holds the float32 master weights, from which each step's bf16 copies are made afresh.
    straight = runs["bf16"][0]
    stop_by_sigterm(monkeypatch, make_cfg(*EXACT, BF16), tmp_path, 5)
    train_module.train(make_cfg(*EXACT, BF16), tmp_path)
    resumed = losses(tmp_path)
    assert sorted(resumed) == list(range(1, 13)) and resumed == losses(straight)  # bit for bit
    a, b = (load_checkpoint(d / "checkpoint.pt") for d in (straight, tmp_path))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_auto_is_bf16_on_cuda_and_an_explicit_precision_is_kept():
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"
    assert resolve_precision("auto", torch.device("cpu")) == AUTO["cpu"] == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    assert resolve_precision("fp32", torch.device("cuda")) == "fp32"


def tiny_steps(preset: str, precision: str, steps: int = 4) -> tuple[list[float], dict[str, float], EncoderDecoder, set]:
    """``steps`` training steps of a tiny model with norm preset ``preset`` on one padded batch, telemetry=full recording
    every step: the losses, the last step's telemetry, the model, and the dtypes of every raw telemetry tensor."""
    full = TelemetryConfig(**group_keys("telemetry", "full"))
    gen = torch.Generator().manual_seed(0)
    B, S, T = 32, 10, 10
    src, tgt = torch.randint(4, 31, (B, S), generator=gen), torch.randint(4, 43, (B, T + 1), generator=gen)
    src[: B // 4, S - 3 :] = 0  # padding, so masks and the batch-reading norms' real-token statistics are exercised
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], list(range(B)), B * T)
    torch.manual_seed(0)
    sizes = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_enc_layers": 2, "n_dec_layers": 2, "dropout": 0.0}
    model = EncoderDecoder(ModelConfig.from_dict({"src_vocab": 31, "tgt_vocab": 43, **sizes, "norm": norm_preset(preset)}))
    optim = default_optim(lr=1e-3)
    opt = build_optimizer(model, optim)
    sched = build_scheduler(opt, optim.lr, ScheduleConfig(0, "constant"), 100)
    tele = Telemetry(model, full)
    context = autocast(precision, torch.device("cpu"))
    out, stats, dtypes = [], {}, set()
    for _ in range(steps):
        options = StepOptions(world=1, label_smoothing=0.1, grad_clip=1.0, autocast=context, step_tokens=B * T, record=True)
        result = train_step(model, [batch], opt, sched, tele, options)
        assert result.loss.dtype == torch.float32
        out.append(result.loss.item())
        dtypes = {t.dtype for _, t in [*tele.activations.raw(), *tele.stats.items()]}
        stats = tele.collect()
    return out, stats, model, dtypes


# The norm kinds whose statistics normlab computes itself (custom layernorm, rmsnorm, dyt; the batch-reading BatchNorm
# and PowerNorm), mHC's float32 mixing, and QK-norm, the one norm site whose input is a bf16 matmul output.
PRESETS = ["pre_ln", "pre_rms", "pre_dyt", "pre_bn", "pre_pn", "pre_ln_mhc", "pre_ln_qk"]


@pytest.mark.parametrize("preset", PRESETS)
def test_bf16_steps_of_each_norm_keep_float32_statistics_and_telemetry_close_to_fp32(preset):
    ref, ref_stats, _, _ = tiny_steps(preset, "fp32")
    got, stats, model, dtypes = tiny_steps(preset, "bf16")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert dtypes == {torch.float32}  # every statistic is recorded in float32 under autocast, not merely read back so
    assert got == pytest.approx(ref, rel=U) and got != ref  # seen: <= 1e-3 nats of ~4
    assert stats.keys() == ref_stats.keys() and all(isinstance(v, float) and math.isfinite(v) for v in stats.values())
    for name, value in stats.items():
        site, stat = name.rsplit("/", 1)
        if stat == "below_eps":  # the share of AdamW's second moments under eps^2: a count of near-zero gradients
            assert 0 <= value <= 1
        elif stat == "mean":  # a signed mean near 0: compared on the scale of the same site's RMS
            assert abs(value - ref_stats[name]) <= 2**-4 * ref_stats[f"{site}/rms"], name
        else:  # rounding to bf16 per op, compounded over 4 steps of a 4-layer model: seen <= 1.4e-2 relative
            assert value == pytest.approx(ref_stats[name], rel=2**-4), name
