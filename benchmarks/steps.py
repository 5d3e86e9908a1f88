"""The step-level modes of ``python -m scripts.bench``: telemetry's overhead, bf16 against fp32 per model size, where a
step's time goes (torch.profiler), and normlab's dropout mask against ``nn.Dropout``, each timed side by side."""

import statistics

import torch

from benchmarks.norms import ROOT, default_model_and_batch, make_step
from benchmarks.timing import ratio_row, time_rounds, time_samples
from model.dropout import Dropout, with_dropout
from telemetry.config import TelemetryConfig
from training.presets import group_keys
from training.step_profile import CATEGORIES, profile_steps


def bench_telemetry(rounds: int, window: int, compile_: bool, dropout: float | None) -> None:
    """Step time of each conf/telemetry preset relative to ``off``, over windows of ``window``
    consecutive training steps; each window records as a run would (first step, every
    ``every`` steps, last step), so ``light`` records 2 of 50 steps here, a 1000-step run 22.

    ``compile_``: layers compiled as train.py does (``EncoderDecoder.compile_layers``, random ops
    on ATen's generator), plus a row ``off, inductor RNG`` compiled with inductor's own RNG: the
    cost of ``fallback_random`` (nonzero only with dropout > 0)."""
    torch._dynamo.config.recompile_limit = 256  # as in bench_norms: several models share the compiled code
    presets = {p.stem: TelemetryConfig(**group_keys("telemetry", p.stem)) for p in (ROOT / "conf" / "telemetry").glob("*.yaml")}
    order = ["off"] + sorted(set(presets) - {"off"})
    fns = {}
    for name in order:
        model, batch = default_model_and_batch(dropout=dropout)
        if compile_:
            model.compile_layers()
        fns[name] = make_step(model, batch, telemetry=presets[name], window=window)
    if compile_:
        model, batch = default_model_and_batch(dropout=dropout)
        for layer in [*model.encoder, *model.decoder]:
            layer.compile()
        fns["off, inductor RNG"] = make_step(model, batch, telemetry=presets["off"], window=window)
    times = time_rounds(fns, rounds, inner=1, warmup=1)
    base = times["off"]
    what = f"{'compiled' if compile_ else 'eager'} layers, dropout {model.cfg.dropout}"
    print(
        f"Training-step time with telemetry, default model ({what}), windows of {window} steps, "
        f"median of {rounds} alternating rounds; ratio to telemetry=off ({1000 * base / window:.0f} ms/step):"
    )
    for name, t in times.items():
        every = f"every {presets[name].every:>2} steps" if name in presets else ""
        print(f"  {name:<18} {every:<14}  {t / base:6.3f}   ({1000 * t / window:.0f} ms/step)")


MODEL_SIZES = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))


def bench_precision_steps(sizes: list[str], rounds: int, clock: str) -> None:
    """One training step of each model size in ``sizes`` (conf/model/) on the 400-word batch, in fp32 and in bf16
    autocast (``trainer.precision``) alternating, the same weights; printed with the ratio bf16 / fp32 (median of the
    per-round ratios, and their quartiles: ``ratio_row``)."""
    print(
        f"\nOne training step (forward, backward, AdamW) on a 400-word batch, CPU, {torch.get_num_threads()} threads, "
        f"{clock} clock, {rounds} alternating rounds; bf16 autocast / fp32 (< 1: bf16 is faster):"
    )
    print(
        f"  {'size':<6} {'d_model':>7} {'layers':>6} {'params':>8} {'fp32 ms':>8} {'bf16 ms':>8} {'bf16/fp32':>9} "
        f"{'q1':>6} {'q3':>6}"
    )
    for size in sizes:
        fns = {}
        for precision in ("fp32", "bf16"):
            model, batch = default_model_and_batch(size=size)
            fns[precision] = make_step(model, batch, telemetry=None, precision=precision)
        samples = time_samples(fns, rounds, inner=1, warmup=2, clock=clock)
        row = ratio_row("bf16_over_fp32", samples["bf16"], samples["fp32"])
        cfg, ms = model.cfg, {p: 1000 * statistics.median(t) for p, t in samples.items()}
        print(
            f"  {size:<6} {cfg.d_model:>7} {f'{cfg.n_enc_layers}+{cfg.n_dec_layers}':>6} "
            f"{model.parameter_counts()['total'] / 1e6:>7.2f}M {ms['fp32']:>8.0f} {ms['bf16']:>8.0f} "
            f"{row['ratio']:>9.3f} {row['ratio_q1']:>6.3f} {row['ratio_q3']:>6.3f}"
        )


def bench_profile(sizes: list[str], dropout: float | None, attn_dropout: float | None, warmup: int, steps: int) -> None:
    """Per model size (conf/model/), the share of a training step's wall time by category
    (``training.step_profile.CATEGORIES``) over ``steps`` profiled steps of the 400-word batch, after ``warmup``
    steps; pre_ln preset, AdamW, clipping and label smoothing as the default run has them, telemetry off."""
    print(
        f"\nShare of a training step's wall time (self CPU time of the ops, by category; host: the rest), "
        f"400-word batch, {torch.get_num_threads()} threads, {steps} profiled steps after {warmup}:"
    )
    print(f"  {'size':<6} {'dropout':>7} {'attn':>5} {'ms/step':>8} " + " ".join(f"{c:>10}" for c in CATEGORIES))
    for size in sizes:
        model, batch = default_model_and_batch(dropout=dropout, size=size, attn_dropout=attn_dropout)
        shares = profile_steps(model, make_step(model, batch, telemetry=None), warmup, steps)
        print(
            f"  {size:<6} {model.cfg.dropout:>7.2f} {model.cfg.attn_dropout_p:>5.2f} {1000 * shares['step_s']:>8.0f} "
            + " ".join(f"{100 * shares[c]:>9.1f}%" for c in CATEGORIES)
        )


def bench_dropout(size: str, dropout: float, rounds: int, clock: str) -> None:
    """One training step of ``size``'s model at model.dropout = ``dropout`` (400-word batch, pre_ln) in three
    variants alternating: every dropout an ``nn.Dropout`` (bernoulli_ masks), every one normlab's ``Dropout``
    (rand_like masks), and normlab's with attn_dropout 0 (SDPA keeps its flash kernel); each a ratio to the first."""
    variants = {
        "nn.Dropout (bernoulli_)": (torch.nn.Dropout, None),
        "Dropout (rand_like)": (Dropout, None),
        "Dropout, attn_dropout 0": (Dropout, 0.0),
    }
    fns = {}
    for name, (kind, attn) in variants.items():
        model, batch = default_model_and_batch(dropout=dropout, size=size, attn_dropout=attn)
        fns[name] = make_step(with_dropout(model, kind), batch, telemetry=None)
    samples = time_samples(fns, rounds, inner=1, warmup=2, clock=clock)
    base = samples["nn.Dropout (bernoulli_)"]
    print(
        f"\nOne training step of model={size} model.dropout={dropout} (400-word batch), {torch.get_num_threads()} threads, "
        f"{clock} clock, {rounds} alternating rounds; ratio to nn.Dropout, attn_dropout {dropout} (< 1: faster):"
    )
    for name, t in samples.items():
        row = ratio_row("dropout", t, base)
        print(
            f"  {name:<26} {row['ratio']:6.3f}  (q1 {row['ratio_q1']:.3f}, q3 {row['ratio_q3']:.3f}; "
            f"{1000 * statistics.median(t):.0f} ms)"
        )
