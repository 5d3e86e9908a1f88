"""The re-run values of ``python -m scripts.provenance``: what a committed cell's metric is, read from a run (its
residual growth included), beside the row format of :mod:`analysis.provenance`."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.depth import growth
from analysis.lrs import final_loss_of, last_max_logit
from analysis.provenance import Reader
from analysis.runs import Run

DOCS = Path(__file__).resolve().parents[1] / "docs"


def growth_of(run: Run, key: Mapping[str, Any]) -> float | None:
    """``depth_growth.csv``'s value for ``run``: its growth of ``key["stack"]`` at its first or last telemetry step
    (``key["step_kind"]``), as ``analysis.depth.growth_rows`` reads it."""
    steps = sorted(run.profile("rms"))
    return growth(run, key["stack"], steps[0 if key["step_kind"] == "first" else -1]) if steps else None


READERS: dict[str, Reader] = {
    "test/per": lambda run, _: run.final("test/per"),
    "final_val_loss": lambda run, _: final_loss_of(run),
    "max_attn_logit": lambda run, _: last_max_logit(run),
    "per_run": growth_of,
}
