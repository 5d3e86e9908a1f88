"""The timing of ``scripts/bench.py``: variants timed in alternating rounds on a chosen clock, their ratios per round,
and the ratio tables' CSV."""

import csv
import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import TypeVar

import torch

# What a round's time is measured on (--clock). cpu: this process's CPU time, all threads summed; with
# OMP_NUM_THREADS=1 that is the wall time less the time other processes held the core.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}

K = TypeVar("K", bound=Hashable)  # what names a timed variant


def time_samples(
    fns: Mapping[K, Callable[[], None]], rounds: int, inner: int, warmup: int = 3, clock: str = "wall"
) -> dict[K, list[float]]:
    """Seconds per call of each fn in each of ``rounds`` rounds (the mean of ``inner`` calls), the fns
    alternating within a round, after ``warmup`` calls of each (and compilation)."""
    now = CLOCKS[clock]
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[K, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = now()
            for _ in range(inner):
                fn()
            samples[name].append((now() - t) / inner)
    return samples


def time_rounds(fns: dict[str, Callable[[], None]], rounds: int, inner: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each fn, alternating fns within each round."""
    return {k: statistics.median(v) for k, v in time_samples(fns, rounds, inner, warmup).items()}


def ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a's time / b's time in the same round: a slow moment of a shared machine
    hits both sides of each ratio."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


# Columns of ``norms --csv``, one row per ratio of the RMSNorm / LayerNorm and custom / native tables (``table``:
# rms_over_ln, custom_over_native, step_rms_over_ln, step_custom_over_native). kind_or_preset: the kind (custom_over_native)
# or preset (step_custom_over_native) whose impls are compared; impl: the impl both sides of an RMS / LN ratio use;
# rows, d_model: the norm-alone tensor's shape (empty for a step); ratio: the median of per-round ratios, as printed,
# ratio_q1/q3 its interquartile range; rounds: rounds of that table; load1_*: the 1-min load average around the run.
RATIO_COLUMNS = [
    "table",
    "kind_or_preset",
    "impl",
    "mode",
    "rows",
    "d_model",
    "ratio",
    "ratio_q1",
    "ratio_q3",
    "rounds",
    "clock",
    "threads",
    "load1_before",
    "load1_after",
]


def ratio_row(table: str, a: list[float], b: list[float], **keys: str | int) -> dict:
    """A row of ``RATIO_COLUMNS`` (less the run's columns) for a / b: the median of the per-round ratios
    (what ``ratio`` gives) and their quartiles (statistics.quantiles, inclusive; one round: the ratio)."""
    per_round = [x / y for x, y in zip(a, b, strict=True)]
    q1, _, q3 = statistics.quantiles(per_round, n=4, method="inclusive") if len(per_round) > 1 else per_round * 3
    return {"table": table, **keys, "ratio": ratio(a, b), "ratio_q1": q1, "ratio_q3": q3, "rounds": len(per_round)}


def write_ratios_csv(path: Path, rows: list[dict], clock: str, load_before: float, load_after: float) -> None:
    """``rows`` (from ``ratio_row``) as a CSV of ``RATIO_COLUMNS``, the ratios unrounded; the run's clock, torch
    threads and 1-min load averages on each row."""
    run = {"clock": clock, "threads": torch.get_num_threads(), "load1_before": load_before, "load1_after": load_after}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, RATIO_COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(row | run for row in rows)
