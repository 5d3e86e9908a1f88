"""``python -m scripts.bench norms``: each norm kind x impl alone (eager and compiled), and a training step per norm
preset, timed in alternating rounds; ratios > 1 are slower than the baseline (native LayerNorm, or native for custom)."""

import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.timing import ratio, ratio_row, time_samples
from data.batching import Batch
from model.config import ModelConfig
from model.kinds import NATIVE_KINDS, NORM_KIND_RECORDS, kinds_where
from model.norms import BatchReadingNorm, build_norm
from model.transformer import EncoderDecoder
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from training.optim import build_optimizer, build_scheduler
from training.precision import autocast
from training.presets import default_optim, group_keys
from training.schema import OptimConfig, ScheduleConfig
from training.step import StepOptions, train_step

ROOT = Path(__file__).resolve().parents[1]
NORM_PRESETS = sorted(p.stem for p in (ROOT / "conf" / "norm").glob("*.yaml"))

# (kind, impl, bias) rows of the norm table, from the records (native before custom); the first is the baseline, measured
# whatever --kinds says; LayerNorm without its shift too (the cost of the bias).
NORM_VARIANTS = [("layernorm", "native", True), ("layernorm", "custom", True), ("layernorm", "native", False)]
NORM_VARIANTS += [("layernorm", "custom", False)] + [
    (k.name, impl, True)
    for k in NORM_KIND_RECORDS.values()
    if k.residual and k.name not in ("layernorm", "none")
    for impl in reversed(k.impls)
]
TOKEN_WISE = [k for k in kinds_where(residual=True, reads_batch=False) if k != "none"]  # --kinds' default: one token read
# Presets also stepped with impl=native (every norm of the model native): one per kind of NATIVE_KINDS, and post-LN.
TWINS = ("pre_ln", "post_ln", "pre_rms", "pre_bn")


def fwd_bwd(module: Callable[..., torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
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
        print(
            f"\nForward+backward of one norm on a ({rows}, d) fp32 tensor, {torch.get_num_threads()} threads, "
            f"device cpu, {clock} clock, {rounds} rounds; ratio to native LayerNorm (eager) at the same d."
        )
        print(f"{'kind':<10} {'impl':<7} {'bias':<5} " + " ".join(f"{f'd={d} {m}':>18}" for d in dims for m in modes))
        for kind, impl, bias in variants:
            cells = [
                (samples.get((kind, impl, bias, rows, d, m)), samples[("layernorm", "native", True, rows, d, "eager")])
                for d in dims
                for m in modes
            ]
            text = " ".join(f"{'-':>18}" if t is None else f"{ratio(t, b):>18.2f}" for t, b in cells)
            print(f"{kind:<10} {impl:<7} {bias!s:<5} {text}")
    return print_pair_ratios(samples, rows_list, dims, modes)


def print_pair_ratios(samples: dict[tuple, list[float]], rows_list: list[int], dims: list[int], modes: list[str]) -> list[dict]:
    """RMSNorm / LayerNorm (bias) time per impl, and custom / native per kind, at each (rows, d, mode) where
    both were measured; printed, and returned as ``ratio_row``s."""
    pairs = {
        f"RMS/LN {impl}": (("rmsnorm", impl, True), ("layernorm", impl, True), "rms_over_ln", {"impl": impl})
        for impl in ("native", "custom")
    }
    pairs |= {
        f"{kind} c/n": ((kind, "custom", True), (kind, "native", True), "custom_over_native", {"kind_or_preset": kind})
        for kind in NATIVE_KINDS
    }
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
    print(
        f"\nOne training step of the default model (conf/model/small.yaml, a 400-word batch), {clock} clock, {rounds} "
        f"alternating rounds; ratio to pre_ln with native LayerNorm ({1000 * statistics.median(base):.0f} ms):"
    )
    for name, t in samples.items():
        print(f"  {name:<20} {ratio(t, base):6.2f}   ({1000 * statistics.median(t):.0f} ms)")
    pairs = {f"{n} custom / native": (n, f"{n} native", "step_custom_over_native", {"kind_or_preset": n}) for n in TWINS}
    pairs |= {
        f"pre_rms / pre_ln, {impl}": (f"pre_rms{suffix}", f"pre_ln{suffix}", "step_rms_over_ln", {"impl": impl})
        for impl, suffix in (("custom", ""), ("native", " native"))
    }
    out = []
    for name, (a, b, table, keys) in pairs.items():
        if a in samples and b in samples:
            out.append(ratio_row(table, samples[a], samples[b], **keys, mode="eager"))
            print(f"  {name:<28} {out[-1]['ratio']:6.3f}")
    return out


def norm_preset(name: str) -> dict:
    """The ``norm`` keys of preset ``name`` as Hydra composes them (a preset file states only what
    differs from conf/norm_base.yaml), resolved as a run resolves them: powernorm's knobs warmup_iters and group_num
    interpolate the default config's schedule.warmup_steps and model.n_heads."""
    return group_keys("norm", name)


def default_model_and_batch(
    norm: dict | None = None, dropout: float | None = None, size: str = "small", attn_dropout: float | None = None
) -> tuple[EncoderDecoder, Batch]:
    """The default model (conf/model/small.yaml, or ``size``'s preset; ``norm`` defaults to the pre_ln preset,
    ``dropout`` and ``attn_dropout`` to the model's) and a CMUdict-shaped batch: 400 words of 10 letters -> 10
    phonemes, the default 4096-token budget."""
    sizes = group_keys("model", size)
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
    model: EncoderDecoder,
    batch: Batch,
    telemetry: TelemetryConfig | None,
    window: int = 1,
    precision: str = "fp32",
    optim: OptimConfig | None = None,
) -> Callable[[], None]:
    """``window`` consecutive training steps as train.py runs them (shared ``train_step``) in ``precision``
    (``trainer.precision``'s fp32 or bf16, on the CPU) under ``optim`` (default: the default run's AdamW at lr 1e-4),
    telemetry recording on its due steps and read back to the host there, as when logging."""
    optim = optim or default_optim(lr=1e-4)
    opt = build_optimizer(model, optim)
    sched = build_scheduler(opt, optim.lr, ScheduleConfig(0, "constant"), 10**9)
    tele = Telemetry(model, telemetry or TelemetryConfig(every=0))
    context = autocast(precision, torch.device("cpu"))

    def run() -> None:
        for step in range(1, window + 1):
            record = tele.due(step, window)
            train_step(
                model,
                [batch],
                opt,
                sched,
                tele,
                StepOptions(
                    world=1, label_smoothing=0.1, grad_clip=1.0, autocast=context, step_tokens=batch.n_tgt_tokens, record=record
                ),
            )
            if record:
                tele.collect()

    return run
