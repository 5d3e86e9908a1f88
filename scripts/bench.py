"""Benchmarks, printed as ratios measured side by side in one run.

    python -m scripts.bench norms                 # each norm kind x impl, eager and compiled, + a training step per preset
    python -m scripts.bench norms --no-compile --dims 256
    python -m scripts.bench norms --kinds layernorm rmsnorm batchnorm --dims 64 256 512 --rows 2048 8192 \
        --presets pre_ln pre_rms pre_bn           # RMSNorm / LayerNorm and custom / native, norm alone and in a step
    python -m scripts.bench norms --clock cpu --csv ratios.csv   # + those ratio tables as one CSV (RATIO_COLUMNS)
    python -m scripts.bench telemetry             # step-time overhead of telemetry=light|full vs off
    python -m scripts.bench telemetry --compile --dropout 0.1   # the same with compiled layers, + inductor's own RNG
    python -m scripts.bench model                 # a training step, normlab vs torch.nn.Transformer (scripts/bench_model.py)
    python -m scripts.bench precision             # bf16 autocast / fp32 step time per model size, + 200 steps of G2P each
    python -m scripts.bench precision --sizes small --seeds 0 --loss-steps 50   # a quicker look
    python -m scripts.bench model --device cuda --compile
    python -m scripts.bench profile               # where a training step's time goes, per model size (torch.profiler)
    python -m scripts.bench profile --sizes small --dropout 0.1 --steps 5
    python -m scripts.bench dropout               # the step with normlab's Dropout vs nn.Dropout, and attn_dropout 0 vs p

Run from the repository root (``python -m`` puts it on the import path).

Variants are timed in alternating rounds (A B C A B C ...) so that drift of a shared machine hits
all of them alike; each time is the median over rounds, each ratio of ``norms`` the median of the
per-round ratios. Ratios > 1 are slower than the baseline.
"""

from pathlib import Path

if not __package__:  # run as a file (python scripts/x.py): it answers with the module command
    import _as_module  # noqa: F401

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data.batching import Batch
from model.config import ModelConfig
from model.dropout import Dropout, with_dropout
from model.kinds import NATIVE_KINDS
from model.norms import BatchReadingNorm, build_norm
from model.transformer import EncoderDecoder
from scripts.bench_model import SIZES, bench_model
from scripts.bench_precision import bench_loss_gap
from scripts.bench_timing import CLOCKS, ratio, ratio_row, time_rounds, time_samples, write_ratios_csv
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from training.optim import build_optimizer, build_scheduler
from training.precision import autocast
from training.schema import PRECISIONS, ScheduleConfig
from training.step import StepOptions, train_step
from training.step_profile import CATEGORIES, profile_steps

ROOT = Path(__file__).resolve().parents[1]
NORM_PRESETS = sorted(p.stem for p in (ROOT / "conf" / "norm").glob("*.yaml"))

# (kind, impl, bias) rows of the norm table; the first is the baseline, measured whatever --kinds says.
NORM_VARIANTS = [
    ("layernorm", "native", True),
    ("layernorm", "custom", True),
    ("layernorm", "native", False),
    ("layernorm", "custom", False),
    ("rmsnorm", "native", True),
    ("rmsnorm", "custom", True),
    ("scalenorm", "custom", True),
    ("dyt", "custom", True),
    ("dyisru", "custom", True),
    ("batchnorm", "native", True),
    ("batchnorm", "custom", True),
]
TOKEN_WISE = ["layernorm", "rmsnorm", "scalenorm", "dyt", "dyisru"]  # --kinds' default: the norms that read one token
# Presets also stepped with impl=native (every norm of the model native): one per kind of NATIVE_KINDS, and post-LN.
TWINS = ("pre_ln", "post_ln", "pre_rms", "pre_bn")


def fwd_bwd(module: torch.nn.Module, x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    """Forward and backward of ``module`` on x (rows, d); a batch-reading norm gets x as one
    sentence of ``rows`` real tokens (keep all True)."""
    args = (x[None], torch.ones(1, x.shape[0], dtype=torch.bool)) if isinstance(module, BatchReadingNorm) else (x,)

    def run() -> None:
        x.grad = None
        module(*args).backward(g.view_as(args[0]))

    return run


def bench_norms(kinds: list[str], dims: list[int], rows_list: list[int], rounds: int, compile_: bool, clock: str) -> list[dict]:
    """Forward+backward time of each (kind, impl, bias) of ``NORM_VARIANTS`` whose kind is in ``kinds``, per
    (rows, d), eager and (``compile_``) compiled; printed as a ratio to native LayerNorm (eager), then as the
    ratios RMSNorm / LayerNorm (same impl) and custom / native (same kind), which it returns (``ratio_row``s)."""
    # Every compiled module and shape counts toward one shared recompile limit (default 8);
    # past it dynamo silently runs eager, which would show up as a "compiled" number.
    torch._dynamo.config.recompile_limit = 256
    variants = [v for i, v in enumerate(NORM_VARIANTS) if i == 0 or v[0] in kinds]
    modes = ["eager", "compiled"] if compile_ else ["eager"]
    samples: dict[tuple, list[float]] = {}  # (kind, impl, bias, rows, d, mode) -> seconds per round
    for d in dims:
        modules = {(kind, impl, bias): build_norm(kind, d, impl=impl, bias=bias) for kind, impl, bias in variants}
        # Compiled once per d: the row count is dynamic, as a training run's varying batches make it after
        # the first recompile. x[keep]'s data-dependent shape breaks a graph: batch-reading kinds run eager only.
        compiled = {v: torch.compile(m) for v, m in modules.items() if compile_ and not isinstance(m, BatchReadingNorm)}
        for rows in rows_list:
            torch.manual_seed(0)
            x = torch.randn(rows, d, requires_grad=True)
            torch._dynamo.mark_dynamic(x, 0)
            g = torch.randn(rows, d)
            fns = {(*v, rows, d, "eager"): fwd_bwd(m, x, g) for v, m in modules.items()}
            fns |= {(*v, rows, d, "compiled"): fwd_bwd(m, x, g) for v, m in compiled.items()}
            samples |= time_samples(fns, rounds, inner=5, clock=clock)
    for rows in rows_list:
        print(f"\nForward+backward of one norm on a ({rows}, d) fp32 tensor, {torch.get_num_threads()} threads, "
              f"device cpu, {clock} clock, {rounds} rounds; ratio to native LayerNorm (eager) at the same d.")  # fmt: skip
        print(f"{'kind':<10} {'impl':<7} {'bias':<5} " + " ".join(f"{f'd={d} {m}':>18}" for d in dims for m in modes))
        for kind, impl, bias in variants:
            cells = [(samples.get((kind, impl, bias, rows, d, m)), samples[("layernorm", "native", True, rows, d, "eager")])
                     for d in dims for m in modes]  # fmt: skip
            text = " ".join(f"{'-':>18}" if t is None else f"{ratio(t, b):>18.2f}" for t, b in cells)
            print(f"{kind:<10} {impl:<7} {bias!s:<5} {text}")
    return print_pair_ratios(samples, rows_list, dims, modes)


def print_pair_ratios(samples: dict[tuple, list[float]], rows_list: list[int], dims: list[int], modes: list[str]) -> list[dict]:
    """RMSNorm / LayerNorm (bias) time per impl, and custom / native per kind, at each (rows, d, mode) where
    both were measured; printed, and returned as ``ratio_row``s."""
    pairs = {f"RMS/LN {impl}": (("rmsnorm", impl, True), ("layernorm", impl, True), "rms_over_ln", {"impl": impl})
             for impl in ("native", "custom")}  # fmt: skip
    pairs |= {f"{kind} c/n": ((kind, "custom", True), (kind, "native", True), "custom_over_native", {"kind_or_preset": kind})
              for kind in NATIVE_KINDS}  # fmt: skip
    measured = {k[:3] for k in samples}
    cols = {name: pair for name, pair in pairs.items() if pair[0] in measured and pair[1] in measured}
    print("\nRatios of forward+backward times at the same rows, d and mode (> 1: the first is slower; c/n: custom / native):")
    print(f"{'rows':>6} {'d':>5} {'mode':<9}" + "".join(f"{name:>16}" for name in cols))
    out = []
    for rows in rows_list:
        for d in dims:
            for m in modes:
                text = ""
                for a, b, table, keys in cols.values():
                    ta, tb = samples.get((*a, rows, d, m)), samples.get((*b, rows, d, m))
                    if ta is None or tb is None:  # batch-reading kinds have no compiled mode
                        text += f"{'-':>16}"
                        continue
                    out.append(ratio_row(table, ta, tb, **keys, mode=m, rows=rows, d_model=d))
                    text += f"{out[-1]['ratio']:>16.2f}"
                print(f"{rows:>6} {d:>5} {m:<9}{text}")
    return out


def bench_step(rounds: int, presets: list[str], clock: str) -> list[dict]:
    """One training step (forward, backward, AdamW) of the default model per norm preset in ``presets``, and per
    preset of ``TWINS`` among them once more with every norm native; pre_ln native is the baseline, always run.
    Returns the custom / native and pre_rms / pre_ln ratios it prints last (``ratio_row``s)."""
    norms = {name: norm_preset(name) for name in presets}
    variants = {"pre_ln native": {**norm_preset("pre_ln"), "impl": "native"}}
    variants |= norms
    variants |= {f"{n} native": {**norms[n], "impl": "native"} for n in TWINS if n in norms and n != "pre_ln"}
    fns = {name: make_step(*default_model_and_batch(norm), telemetry=None) for name, norm in variants.items()}
    samples = time_samples(fns, rounds, inner=2, warmup=2, clock=clock)
    base = samples["pre_ln native"]
    print(f"\nOne training step of the default model (conf/model/small.yaml, a 400-word batch), {clock} clock, {rounds} "
          f"alternating rounds; ratio to pre_ln with native LayerNorm ({1000 * statistics.median(base):.0f} ms):")  # fmt: skip
    for name, t in samples.items():
        print(f"  {name:<20} {ratio(t, base):6.2f}   ({1000 * statistics.median(t):.0f} ms)")
    pairs = {f"{n} custom / native": (n, f"{n} native", "step_custom_over_native", {"kind_or_preset": n}) for n in TWINS}
    pairs |= {f"pre_rms / pre_ln, {impl}": (f"pre_rms{suffix}", f"pre_ln{suffix}", "step_rms_over_ln", {"impl": impl})
              for impl, suffix in (("custom", ""), ("native", " native"))}  # fmt: skip
    out = []
    for name, (a, b, table, keys) in pairs.items():
        if a in samples and b in samples:
            out.append(ratio_row(table, samples[a], samples[b], **keys, mode="eager"))
            print(f"  {name:<28} {out[-1]['ratio']:6.3f}")
    return out


def norm_preset(name: str) -> dict:
    """The ``norm`` keys of preset ``name`` as Hydra composes them (a preset file states only what
    differs from conf/norm_base.yaml), resolved as a run resolves them: powernorm_warmup and powernorm_groups
    interpolate the default config's schedule.warmup_steps and model.n_heads."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=[f"norm={name}"]).norm, resolve=True)


def default_model_and_batch(
    norm: dict | None = None, dropout: float | None = None, size: str = "small", attn_dropout: float | None = None
) -> tuple[EncoderDecoder, Batch]:
    """The default model (conf/model/small.yaml, or ``size``'s preset; ``norm`` defaults to the pre_ln preset,
    ``dropout`` and ``attn_dropout`` to the model's) and a CMUdict-shaped batch: 400 words of 10 letters -> 10
    phonemes, the default 4096-token budget."""
    sizes = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{size}.yaml"))
    if dropout is not None:
        sizes["dropout"] = dropout
    if attn_dropout is not None:
        sizes["attn_dropout"] = attn_dropout
    norm = norm or norm_preset("pre_ln")
    torch.manual_seed(0)
    model = EncoderDecoder(ModelConfig.from_dict({"src_vocab": 31, "tgt_vocab": 43, **sizes, "norm": norm}))
    B, S, T = 400, 10, 10
    src, tgt = torch.randint(4, 31, (B, S)), torch.randint(4, 43, (B, T + 1))
    return model, Batch(src, tgt[:, :-1], tgt[:, 1:], list(range(B)), B * T)


def make_step(
    model: EncoderDecoder, batch: Batch, telemetry: TelemetryConfig | None, window: int = 1, precision: str = "fp32"
) -> Callable[[], None]:
    """``window`` consecutive training steps as train.py runs them (shared ``train_step``) in ``precision``
    (``trainer.precision``'s fp32 or bf16, on the CPU), telemetry recording on its due steps and read back to the host
    there, as when logging."""
    opt = build_optimizer(model, 1e-4, (0.9, 0.98), 0.01, 1e-9)
    sched = build_scheduler(opt, 1e-4, ScheduleConfig(0, "constant"), 10**9)
    tele = Telemetry(model, telemetry or TelemetryConfig(every=0))
    context = autocast(precision, torch.device("cpu"))

    def run() -> None:
        for step in range(1, window + 1):
            record = tele.due(step, window)
            train_step(model, [batch], opt, sched, tele, StepOptions(world=1, label_smoothing=0.1, grad_clip=1.0,
                       autocast=context, step_tokens=batch.n_tgt_tokens, record=record))  # fmt: skip
            if record:
                tele.collect()

    return run


def bench_telemetry(rounds: int, window: int, compile_: bool, dropout: float | None) -> None:
    """Step time of each conf/telemetry preset relative to ``off``, over windows of ``window``
    consecutive training steps; each window records as a run would (first step, every
    ``every`` steps, last step), so ``light`` records 2 of 50 steps here, a 1000-step run 22.

    ``compile_``: layers compiled as train.py does (``EncoderDecoder.compile_layers``, random ops
    on ATen's generator), plus a row ``off, inductor RNG`` compiled with inductor's own RNG: the
    cost of ``fallback_random`` (nonzero only with dropout > 0)."""
    torch._dynamo.config.recompile_limit = 256  # as in bench_norms: several models share the compiled code
    presets = {
        p.stem: TelemetryConfig(**OmegaConf.to_container(OmegaConf.load(p))) for p in (ROOT / "conf" / "telemetry").glob("*.yaml")
    }
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
    print(f"Training-step time with telemetry, default model ({what}), windows of {window} steps, "
          f"median of {rounds} alternating rounds; ratio to telemetry=off ({1000 * base / window:.0f} ms/step):")  # fmt: skip
    for name, t in times.items():
        every = f"every {presets[name].every:>2} steps" if name in presets else ""
        print(f"  {name:<18} {every:<14}  {t / base:6.3f}   ({1000 * t / window:.0f} ms/step)")


MODEL_SIZES = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))


def bench_precision_steps(sizes: list[str], rounds: int, clock: str) -> None:
    """One training step of each model size in ``sizes`` (conf/model/) on the 400-word batch, in fp32 and in bf16
    autocast (``trainer.precision``) alternating, the same weights; printed with the ratio bf16 / fp32 (median of the
    per-round ratios, and their quartiles: ``ratio_row``)."""
    print(f"\nOne training step (forward, backward, AdamW) on a 400-word batch, CPU, {torch.get_num_threads()} threads, "
          f"{clock} clock, {rounds} alternating rounds; bf16 autocast / fp32 (< 1: bf16 is faster):")  # fmt: skip
    print(f"  {'size':<6} {'d_model':>7} {'layers':>6} {'params':>8} {'fp32 ms':>8} {'bf16 ms':>8} {'bf16/fp32':>9} "
          f"{'q1':>6} {'q3':>6}")  # fmt: skip
    for size in sizes:
        fns = {}
        for precision in ("fp32", "bf16"):
            model, batch = default_model_and_batch(size=size)
            fns[precision] = make_step(model, batch, telemetry=None, precision=precision)
        samples = time_samples(fns, rounds, inner=1, warmup=2, clock=clock)
        row = ratio_row("bf16_over_fp32", samples["bf16"], samples["fp32"])
        cfg, ms = model.cfg, {p: 1000 * statistics.median(t) for p, t in samples.items()}
        print(f"  {size:<6} {cfg.d_model:>7} {f'{cfg.n_enc_layers}+{cfg.n_dec_layers}':>6} "
              f"{model.parameter_counts()['total'] / 1e6:>7.2f}M {ms['fp32']:>8.0f} {ms['bf16']:>8.0f} "
              f"{row['ratio']:>9.3f} {row['ratio_q1']:>6.3f} {row['ratio_q3']:>6.3f}")  # fmt: skip


def bench_profile(sizes: list[str], dropout: float | None, attn_dropout: float | None, warmup: int, steps: int) -> None:
    """Per model size (conf/model/), the share of a training step's wall time by category
    (``training.step_profile.CATEGORIES``) over ``steps`` profiled steps of the 400-word batch, after ``warmup``
    steps; pre_ln preset, AdamW, clipping and label smoothing as the default run has them, telemetry off."""
    print(f"\nShare of a training step's wall time (self CPU time of the ops, by category; host: the rest), "
          f"400-word batch, {torch.get_num_threads()} threads, {steps} profiled steps after {warmup}:")  # fmt: skip
    print(f"  {'size':<6} {'dropout':>7} {'attn':>5} {'ms/step':>8} " + " ".join(f"{c:>10}" for c in CATEGORIES))
    for size in sizes:
        model, batch = default_model_and_batch(dropout=dropout, size=size, attn_dropout=attn_dropout)
        shares = profile_steps(model, make_step(model, batch, telemetry=None), warmup, steps)
        print(f"  {size:<6} {model.cfg.dropout:>7.2f} {model.cfg.attn_dropout_p:>5.2f} {1000 * shares['step_s']:>8.0f} "
              + " ".join(f"{100 * shares[c]:>9.1f}%" for c in CATEGORIES))  # fmt: skip


def bench_dropout(size: str, dropout: float, rounds: int, clock: str) -> None:
    """One training step of ``size``'s model at model.dropout = ``dropout`` (400-word batch, pre_ln) in three
    variants alternating: every dropout an ``nn.Dropout`` (bernoulli_ masks), every one normlab's ``Dropout``
    (rand_like masks), and normlab's with attn_dropout 0 (SDPA keeps its flash kernel); each a ratio to the first."""
    variants = {"nn.Dropout (bernoulli_)": (torch.nn.Dropout, None), "Dropout (rand_like)": (Dropout, None),
                "Dropout, attn_dropout 0": (Dropout, 0.0)}  # fmt: skip
    fns = {}
    for name, (kind, attn) in variants.items():
        model, batch = default_model_and_batch(dropout=dropout, size=size, attn_dropout=attn)
        fns[name] = make_step(with_dropout(model, kind), batch, telemetry=None)
    samples = time_samples(fns, rounds, inner=1, warmup=2, clock=clock)
    base = samples["nn.Dropout (bernoulli_)"]
    print(f"\nOne training step of model={size} model.dropout={dropout} (400-word batch), {torch.get_num_threads()} threads, "
          f"{clock} clock, {rounds} alternating rounds; ratio to nn.Dropout, attn_dropout {dropout} (< 1: faster):")  # fmt: skip
    for name, t in samples.items():
        row = ratio_row("dropout", t, base)
        print(f"  {name:<26} {row['ratio']:6.3f}  (q1 {row['ratio_q1']:.3f}, q3 {row['ratio_q3']:.3f}; "
              f"{1000 * statistics.median(t):.0f} ms)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    norms = sub.add_parser("norms", help="norm kinds x impls, and a training step per preset")
    norms.add_argument("--kinds", nargs="+", choices=sorted({v[0] for v in NORM_VARIANTS}), default=TOKEN_WISE,
                       help="norm kinds of the norm-alone tables (native LayerNorm, the baseline, always runs)")  # fmt: skip
    norms.add_argument("--dims", type=int, nargs="+", default=[256, 512, 1024])
    norms.add_argument("--rows", type=int, nargs="+", default=[8192], help="B*T rows of the benchmarked tensor, one table each")
    norms.add_argument("--rounds", type=int, default=15)
    norms.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    norms.add_argument("--no-step", dest="step", action="store_false", help="skip the training-step table")
    norms.add_argument("--presets", nargs="+", choices=NORM_PRESETS, default=NORM_PRESETS, help="norm presets of the step table")
    norms.add_argument("--step-rounds", type=int, default=None, help="rounds of the step table (default: max(rounds // 3, 3))")
    norms.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: this process's CPU time (see CLOCKS)")
    norms.add_argument("--csv", type=Path, default=None, help="also write the ratio tables to this CSV (see RATIO_COLUMNS)")
    tele = sub.add_parser("telemetry", help="step-time overhead of each telemetry preset vs off")
    tele.add_argument("--rounds", type=int, default=5)
    tele.add_argument("--window", type=int, default=50, help="consecutive steps per timing (light records once per 50)")
    tele.add_argument("--compile", action="store_true", help="compile every layer, as trainer.compile=true does")
    tele.add_argument("--dropout", type=float, default=None, help="model dropout (default: conf/model/small.yaml's)")
    model = sub.add_parser("model", help="a training step of normlab vs torch.nn.Transformer, same sizes and batch")
    model.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["small", "base"])
    model.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    model.add_argument("--compile", action="store_true", help="torch.compile every layer of both models")
    model.add_argument("--rounds", type=int, default=10)
    model.add_argument("--rows", type=int, default=256, help="sentences per batch")
    model.add_argument("--length", type=int, default=16, help="src and tgt positions per sentence (padded)")
    model.add_argument("--precision", choices=PRECISIONS, default="auto", help="as trainer.precision (auto: bf16 on cuda)")
    prec = sub.add_parser("precision", help="bf16 autocast / fp32 step time per model size, and the loss gap of short runs")
    prec.add_argument("--sizes", nargs="+", choices=MODEL_SIZES, default=MODEL_SIZES, help="model presets (conf/model/)")
    prec.add_argument("--rounds", type=int, default=5)
    prec.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: this process's CPU time (see CLOCKS)")
    prec.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's fair share)")
    prec.add_argument("--loss-steps", type=int, default=200, help="steps of each G2P run of the loss gap (0: skip it)")
    prec.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one fp32 and one bf16 run per seed")
    prec.add_argument("--model", choices=MODEL_SIZES, default="small", help="model preset of the G2P runs")
    prof = sub.add_parser("profile", help="where a training step's time goes, per model size (torch.profiler)")
    prof.add_argument("--sizes", nargs="+", choices=MODEL_SIZES, default=["tiny", "small"], help="model presets (conf/model/)")
    prof.add_argument("--dropout", type=float, default=None, help="model.dropout (default: each preset's)")
    prof.add_argument("--attn-dropout", type=float, default=None, help="model.attn_dropout (default: each preset's)")
    prof.add_argument("--warmup", type=int, default=2, help="unprofiled steps first")
    prof.add_argument("--steps", type=int, default=3, help="profiled steps")
    prof.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's fair share)")
    drop = sub.add_parser("dropout", help="the step with normlab's Dropout vs nn.Dropout, and with attn_dropout 0")
    drop.add_argument("--size", choices=MODEL_SIZES, default="small", help="model preset (conf/model/)")
    drop.add_argument("--dropout", type=float, default=0.1, help="model.dropout (attn_dropout and act_dropout follow it)")
    drop.add_argument("--rounds", type=int, default=7)
    drop.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: this process's CPU time (see CLOCKS)")
    drop.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's fair share)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {load_before}, {os.cpu_count()} CPUs")
    if args.what == "model":
        bench_model(args.sizes, torch.device(args.device), args.rounds, args.compile, args.rows, args.length, args.precision)
    if args.what == "precision":
        torch.set_num_threads(args.threads)
        bench_precision_steps(args.sizes, args.rounds, args.clock)
        if args.loss_steps:
            with tempfile.TemporaryDirectory() as out:
                bench_loss_gap(Path(out), args.model, args.loss_steps, args.seeds)
    if args.what in ("profile", "dropout"):
        torch.set_num_threads(args.threads)
    if args.what == "dropout":
        bench_dropout(args.size, args.dropout, args.rounds, args.clock)
    if args.what == "profile":
        bench_profile(args.sizes, args.dropout, args.attn_dropout, args.warmup, args.steps)
    if args.what == "telemetry":
        bench_telemetry(args.rounds, args.window, args.compile, args.dropout)
    if args.what == "norms":
        ratios = bench_norms(args.kinds, args.dims, args.rows, args.rounds, args.compile, args.clock)
        if args.step:
            ratios += bench_step(args.step_rounds or max(args.rounds // 3, 3), args.presets, args.clock)
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) after: {load_after}")
    if args.what == "norms" and args.csv:
        write_ratios_csv(args.csv, ratios, args.clock, load_before[0], load_after[0])
        print(f"ratios written to {args.csv}")


if __name__ == "__main__":
    main()
