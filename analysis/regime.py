"""DyT's data regime (docs/results.md, "DyT's data regime"; Verma 2026, arXiv 2604.23434): per norm preset and
training fraction (``data.train_fraction``), the final validation loss and the share of saturated norm inputs at a
fixed early step, and each preset's difference to a baseline preset's at the same fraction, paired by seed.

- final validation loss: the last ``val/loss`` of a finished run (at ``trainer.max_steps``), nats per target token;
- saturation: the mean over the run's ``act/<site>/saturation`` metrics (each DyT or Derf norm site's share of real
  input elements beyond 0.99 of the bound: docs/telemetry.md) in its telemetry record at ``step``; none for norms
  that are not bounded (LayerNorm);
- the difference: the paired t test over the seeds both presets finished (``analysis.paired``), and the relative
  difference of the seed means, 100 (mean − baseline mean) / baseline mean, the paper's unit (−27.3 % at 1 M tokens).
"""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.lrs import final_loss_of, run_state
from analysis.paired import PairedDifference, paired_difference
from analysis.presets import preset_of
from analysis.runs import Run, finite
from analysis.variants import differing_keys
from runlog.metric_names import parse


@dataclass(frozen=True)
class Cell:
    """One run of the study: its preset, fraction and seed, state, final val/loss and saturation (None: absent)."""

    preset: str
    fraction: float
    seed: Any
    state: str
    val_loss: float | None
    saturation: float | None


def saturation_at(metrics: Path, step: int) -> float | None:
    """The mean of the ``act/.../saturation`` values of the telemetry record at ``step`` in ``metrics`` (a
    metrics.jsonl); None when that record has none (no bounded norm, or no record at that step)."""
    if not metrics.is_file():
        return None
    for line in metrics.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("step") == step:
            values = [finite(v) for k, v in row.items() if (m := parse(k)) and (m.family, m.stat) == ("act", "saturation")]
            if values := [v for v in values if v is not None]:
                return statistics.fmean(values)
    return None


def preset_name(run: Run, norm_keys: list[str]) -> str:
    """The norm preset of ``conf/norm/`` the run used, told by the ``norm_keys`` that differ between the study's runs
    (``analysis.presets.preset_of``, as the report names families), else its norm placement/kind."""
    label = " ".join(f"{k}={run.config.get(k, '?')}" for k in norm_keys)
    return preset_of(label) or f"{run.config.get('norm.placement')}/{run.config.get('norm.kind')}"


def cells(runs: list[Run], step: int) -> list[Cell]:
    """The study's record of each run (``data.train_fraction`` 1 for a run written before the key existed)."""
    norm_keys = [k for k in differing_keys(runs) if k.startswith("norm.")] or ["norm.placement", "norm.kind"]
    return [cell(run, preset_name(run, norm_keys), step) for run in runs]


def cell(run: Run, preset: str, step: int) -> Cell:
    """The study's record of ``run``, which used the norm ``preset``."""
    state = run_state(run)
    val_loss = final_loss_of(run) if state == "finished" else None
    fraction = float(run.config.get("data.train_fraction", 1.0))
    return Cell(preset, fraction, run.seed, state, val_loss, saturation_at(run.path / "metrics.jsonl", step))


@dataclass(frozen=True)
class Regime:
    """One preset at one fraction: its finished seeds' values and, against the baseline at that fraction, the
    paired difference of the final validation loss (None in the baseline's own row)."""

    preset: str
    fraction: float
    runs: int
    val_loss: dict[Any, float]  # seed -> final val/loss, finished runs
    saturation: dict[Any, float]  # seed -> saturation at the step
    diff: PairedDifference | None
    rel_diff: float | None  # (mean - baseline mean) / baseline mean, a fraction


def regimes(cells: list[Cell], baseline: str) -> list[Regime]:
    """Every (preset, fraction) of ``cells``, sorted by fraction then preset (the baseline first), each compared with
    ``baseline`` at its fraction.

    Raises:
        ValueError: ``baseline`` is none of the presets (the message names them).
    """
    presets = sorted({c.preset for c in cells})
    if baseline not in presets:
        raise ValueError(f"baseline {baseline!r} is none of the study's presets: {', '.join(presets)}")
    out = []
    for fraction in sorted({c.fraction for c in cells}):
        here = [c for c in cells if c.fraction == fraction]
        base = {c.seed: c.val_loss for c in here if c.preset == baseline and c.val_loss is not None}
        for preset in sorted({c.preset for c in here}, key=lambda p: (p != baseline, p)):
            mine = [c for c in here if c.preset == preset]
            loss = {c.seed: c.val_loss for c in mine if c.val_loss is not None}
            sat = {c.seed: c.saturation for c in mine if c.saturation is not None}
            diff = paired_difference(loss, base) if preset != baseline else None
            rel = None
            if diff is not None and diff.n:
                paired = [s for s in loss if s in base]
                b = statistics.fmean(base[s] for s in paired)
                rel = (statistics.fmean(loss[s] for s in paired) - b) / b
            out.append(Regime(preset, fraction, len(mine), loss, sat, diff, rel))
    return out
