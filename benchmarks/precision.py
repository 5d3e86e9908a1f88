"""``python -m scripts.bench precision``'s second half: what bf16 autocast does to the loss curve.

Short G2P runs of train.py (``conf/trainer/short.yaml``: 200 steps, 50 of warmup, 2048-token batches, validation every
50 steps; the default model; no telemetry, no wandb), once with ``trainer.precision=fp32`` and once with ``bf16`` per
seed, in fresh run dirs. The gap bf16 - fp32 of the final losses is printed next to the spread between seeds of each
precision, the scale a gap must stay under to be negligible.
"""

import json
import statistics
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

import train as train_module

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ["trainer=short", "trainer.device=cpu", "logger=none", "telemetry=off"]
PRECISIONS = ("fp32", "bf16")


def short_run(out: Path, model: str, steps: int, seed: int, precision: str) -> dict:
    """Train one short G2P run in ``out / f"{precision}_seed{seed}"``: its final ``train/loss`` (the mean over the
    last logging window), ``val/loss``, ``val/per``, ``test/per``, wall seconds, and its train/loss curve {step: loss}."""
    overrides = [*OVERRIDES, f"model={model}", f"trainer.max_steps={steps}", f"seed={seed}", f"trainer.precision={precision}"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    run_dir = out / f"{precision}_seed{seed}"
    start = time.perf_counter()
    train_module.train(cfg, run_dir)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = {k: v for r in rows for k, v in r.items()}  # each metric's last logged value
    curve = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
    return {**{k: last[k] for k in ("train/loss", "val/loss", "val/per", "test/per")}, "wall_s": wall, "curve": curve}


def bench_loss_gap(out: Path, model: str, steps: int, seeds: list[int]) -> dict[tuple[str, int], dict]:
    """Run ``short_run`` for each seed in fp32 then bf16 and print the final metrics, the gap bf16 - fp32 (per seed and
    its mean) and each precision's spread over seeds (max - min); returns {(precision, seed): short_run's dict}."""
    runs = {(p, s): short_run(out, model, steps, s, p) for s in seeds for p in PRECISIONS}
    keys = ("train/loss", "val/loss", "val/per", "test/per")
    print(
        f"\n{steps} steps of G2P (trainer=short, model={model}, telemetry off), CPU, final metrics; train/loss is the mean "
        f"of the last 10 steps, curve gap the largest |bf16 - fp32| over the logged train/loss points:"
    )
    print(f"  {'precision':<9} {'seed':>4} " + " ".join(f"{k:>10}" for k in keys) + f" {'curve gap':>10} {'wall s':>7}")
    for (p, s), r in runs.items():
        fp32 = runs[("fp32", s)]["curve"]
        gap = max(abs(r["curve"][k] - fp32[k]) for k in fp32)
        print(f"  {p:<9} {s:>4} " + " ".join(f"{r[k]:>10.4f}" for k in keys) + f" {gap:>10.4f} {r['wall_s']:>7.0f}")
    mean_gap = {k: statistics.mean(runs[("bf16", s)][k] - runs[("fp32", s)][k] for s in seeds) for k in keys}
    print(f"  {'bf16 - fp32, mean over seeds':<30}" + " ".join(f"{mean_gap[k]:>+10.4f}" for k in keys))
    if len(seeds) > 1:
        for p in PRECISIONS:
            spread = {k: max(runs[(p, s)][k] for s in seeds) - min(runs[(p, s)][k] for s in seeds) for k in keys}
            print(f"  {f'{p} spread over seeds':<30}" + " ".join(f"{spread[k]:>10.4f}" for k in keys))
    return runs
