"""The BatchNorm-vs-LayerNorm tables of ``python -m scripts.report_batch_vs_layer``: per cell (arm, batch size) the
summary over seeds and the paired contrasts against LayerNorm, written as CSVs."""

import statistics
from collections.abc import Callable, Hashable
from pathlib import Path

from analysis.csvs import write_csv
from analysis.load import ReportError
from analysis.paired import PairedDifference, paired_difference
from analysis.runs import Run
from analysis.stats import mean_stderr, t_interval
from model.kinds import BATCH_READING_KINDS

BASELINE = "layernorm"
FIRST_NORM = "self_attn.norm_in"  # the first norm of encoder block 0 under pre-LN: where Shen et al.'s Fig. 2 measures


def _last(run: Run, metric: str) -> float | None:
    values = [v for s, v in run.series.get(metric, []) if v is not None and s > 0]
    return values[-1] if values else None


def _with_batch_stats(run: Run) -> float | None:
    """The last validation loss with each batch's own statistics (``val/loss_batch_stats``); a run without a
    batch-reading norm logs none and its plain ``val/loss`` is that loss (its norms read no batch)."""
    if run.config.get("norm.kind") in BATCH_READING_KINDS or "val/loss_batch_stats" in run.series:
        return _last(run, "val/loss_batch_stats")
    return _last(run, "val/loss")


def _gap(run: Run) -> float | None:
    """The train/eval gap at the last validation: ``val/loss_batch_stats - val/loss`` (nats per target token)."""
    batch, running = _last(run, "val/loss_batch_stats"), _last(run, "val/loss")
    return None if batch is None or running is None else batch - running


def _fluctuation(stat: str) -> Callable[[Run], float | None]:
    """The mean over the run's telemetry records after step 1 of ``bstat/enc.0.self_attn.norm_in/<stat>``: Shen et
    al.'s (1/d) ||batch statistic - running statistic|| at the first norm, averaged over training. Step 1 is left
    out: its running statistics are the initial buffers (0 and 1), not a running estimate."""

    def get(run: Run) -> float | None:
        records = [rec for step, rec in run.profile(stat).items() if step > 1]
        values = [v for rec in records for site, v in rec.items() if (site.depth, site.site) == (0, FIRST_NORM)]
        return statistics.fmean(values) if values else None

    return get


METRICS: dict[str, Callable[[Run], float | None]] = {
    "test/per": lambda r: r.final("test/per"),
    "test/wer": lambda r: r.final("test/wer"),
    "best_val_loss": lambda r: r.best("val/loss"),
    "final_val_loss": lambda r: _last(r, "val/loss"),
    "final_val_loss_batch_stats": _with_batch_stats,
    "train_eval_gap": _gap,
    **{f"first_norm_{stat}": _fluctuation(stat) for stat in ("mean_dist", "var_dist", "phi_dist")},
}


def arm(run: Run) -> str:
    """The run's arm: its encoder norm kind, ``<kind>_both`` when the decoder has it too (the flag that allows it,
    and no ``norm.blocks`` giving the decoder another kind)."""
    kind = run.config.get("norm.kind")
    both = run.config.get("norm.decoder_batch_stats") and not run.config.get("norm.blocks")
    return f"{kind}_both" if both else str(kind)


Cell = tuple[str, int]  # (arm, max_tokens)


def cells(runs: list[Run]) -> dict[Cell, list[Run]]:
    """Every run by (arm, max_tokens), in sorted order.

    Raises:
        ReportError: two runs of one cell with the same seed (a re-run, or a sweep given twice), or one without a seed
            or without an integer ``trainer.max_tokens``.
    """
    out: dict[Cell, list[Run]] = {}
    for run in runs:
        if not isinstance(tokens := run.config.get("trainer.max_tokens"), int):
            raise ReportError(f"{run.label}: trainer.max_tokens is {tokens!r}; valid: the integer of its config.yaml")
        cell = (arm(run), tokens)
        if run.seed is None or run.seed in {r.seed for r in out.get(cell, [])}:
            raise ReportError(f"{run.label}: seed {run.seed!r} is missing or repeated in arm {cell[0]} at {cell[1]} tokens")
        out.setdefault(cell, []).append(run)
    return dict(sorted(out.items()))


def by_seed(runs: list[Run], metric: str) -> dict[Hashable, float]:
    """seed -> the metric's value, over the finished runs with one."""
    return {r.seed: v for r in runs if r.finished and (v := METRICS[metric](r)) is not None}


def _paired_fields(diff: PairedDifference | None) -> list[object]:
    if diff is None or diff.mean is None:
        return ["", "", "", "", ""]
    lo, hi = diff.ci95 or ("", "")
    return [diff.mean, lo, hi, diff.n, "" if diff.significant is None else diff.significant]


def summary_rows(groups: dict[Cell, list[Run]]) -> list[list[object]]:
    rows = []
    for (name, tokens), runs in groups.items():
        for metric in METRICS:
            values = by_seed(runs, metric)
            if not values:
                continue
            mean, stderr = mean_stderr(list(values.values()))
            lo, hi = t_interval(list(values.values())) or ("", "")
            base = by_seed(groups.get((BASELINE, tokens), []), metric)
            diff = paired_difference(values, base) if name != BASELINE and base else None
            finished = sum(r.finished for r in runs)
            rows.append(
                [
                    name,
                    tokens,
                    metric,
                    len(runs),
                    finished,
                    len(values),
                    mean,
                    "" if stderr is None else stderr,
                    lo,
                    hi,
                    *_paired_fields(diff),
                ]
            )
    return rows


def contrast_rows(groups: dict[Cell, list[Run]]) -> list[list[object]]:
    """The small-minus-large-batch difference of each arm's paired difference to LayerNorm, and PowerNorm minus
    BatchNorm at each batch size; a contrast whose arms are missing is left out."""
    sizes = sorted({tokens for _, tokens in groups})
    arms = sorted({name for name, _ in groups if name != BASELINE})
    rows = []
    for metric in METRICS:
        if len(sizes) == 2:
            small, large = sizes
            for name in arms:
                per_size = []
                for tokens in (small, large):
                    values, base = (
                        by_seed(groups.get((name, tokens), []), metric),
                        by_seed(groups.get((BASELINE, tokens), []), metric),
                    )
                    per_size.append({s: values[s] - base[s] for s in values if s in base})
                if set(per_size[0]) & set(per_size[1]):
                    diff = paired_difference(*per_size)
                    rows.append([f"{name} - {BASELINE}: {small} - {large} tokens", metric, *_paired_fields(diff)])
        for tokens in sizes:
            pn, bn = (by_seed(groups.get((k, tokens), []), metric) for k in ("powernorm", "batchnorm"))
            if set(pn) & set(bn):
                rows.append([f"powernorm - batchnorm at {tokens} tokens", metric, *_paired_fields(paired_difference(pn, bn))])
    return rows


def write_csvs(runs: list[Run], out: Path) -> list[Path]:
    """Write runs.csv, summary.csv and contrasts.csv into ``out``; returns their paths."""
    groups = cells(runs)
    run_rows = [
        [arm(r), r.config.get("trainer.max_tokens"), r.seed, r.status_state, *(METRICS[m](r) for m in METRICS)]
        for r in sorted(runs, key=lambda r: (arm(r), r.config.get("trainer.max_tokens"), str(r.seed)))
    ]
    paired = ["diff_mean", "diff_ci95_lo", "diff_ci95_hi", "pairs", "significant"]
    return [
        write_csv(out / "runs.csv", ["arm", "max_tokens", "seed", "state", *METRICS], run_rows),
        write_csv(
            out / "summary.csv",
            ["arm", "max_tokens", "metric", "runs", "finished", "n", "mean", "stderr", "ci95_lo", "ci95_hi", *paired],
            summary_rows(groups),
        ),
        write_csv(out / "contrasts.csv", ["contrast", "metric", *paired], contrast_rows(groups)),
    ]
