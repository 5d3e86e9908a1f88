"""LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities",
arXiv 2309.14322, §2.2): how much a family's final validation loss depends on the peak learning rate.

For one family and one seed, over the family's LR grid {eta}:

    LRS = mean_eta min(l(eta), l0) - l*,    l* = min_eta min(l(eta), l0)

in nats/token. l(eta) is the run's final validation loss (``val/loss`` at its last evaluation after step 0:
unsmoothed cross-entropy); l0 the loss at initialization, the ``val/loss`` every run logs at step 0, before its
first update (``training/run.py`` ``log_init_loss``), the same for every LR of one family and seed; a diverged
run counts as l0.

A *family* is the runs whose configs differ only in the seed and ``optim.lr`` (and in keys that never change
training: ``analysis.variants.IGNORED_KEYS``); it is labelled, as variants are, by the other config keys that
differ. The study exists when some family has runs at two or more LRs; a family with a single LR is left out
with a note. A seed gets an LRS only over a complete grid: a run at every LR of its family, each finished or
diverged, and its l0 known. A run still running, interrupted, failed or crashed (or an LR with no run) leaves
that seed without an LRS, and a note says why: an LRS is never averaged over part of a grid. Per family: the
per-seed values, their mean, standard error and a 95 % confidence interval from the t distribution with n - 1
degrees of freedom (none for one seed), and the best LR, the argmin of the mean over seeds of min(l(eta), l0).
"""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from analysis.paired import PairedDifference, paired_difference
from analysis.runs import Run, finite
from analysis.stats import mean_stderr, t_interval
from analysis.variants import NORM_KEYS, config_label, differing_keys

LR_KEY = "optim.lr"
LOSS = "val/loss"
INIT_TOLERANCE = 1e-6  # nats/token: one family and seed's runs share init and data, so their l0 should agree
COMPLETE = ("finished", "diverged")  # the states whose final loss is known


def capped_loss(loss: float | None, init_loss: float) -> float:
    """min(loss, l0); l0 for a None or non-finite loss (a diverged run)."""
    return init_loss if loss is None or not math.isfinite(loss) else min(loss, init_loss)


def lr_sensitivity(losses: Sequence[float | None], init_loss: float) -> float:
    """LRS of one seed's grid (nats/token): the mean over ``losses`` (one final validation loss per LR; None or
    non-finite for a diverged run) of min(loss, l0), minus their min.

    Raises:
        ValueError: no losses, or a non-finite ``init_loss``.
    """
    if not losses:
        raise ValueError("no losses: the LR grid is empty")
    if not math.isfinite(init_loss):
        raise ValueError(f"the loss at init must be finite, got {init_loss}")
    capped = [capped_loss(loss, init_loss) for loss in losses]
    return statistics.fmean(capped) - min(capped)


@dataclass
class Cell:
    """One (seed, LR) of a family's grid. ``state``: ``finished``, ``diverged``, ``missing`` (no run), or the run's
    ``status_state`` (``running``, ``interrupted``, ``failed``, ``unknown``). ``final_loss``: a finished run's last
    ``val/loss`` after step 0; ``capped``: min(final_loss, l0), l0 for a diverged run, None when not known (an
    incomplete cell, or the seed's l0 unknown)."""

    lr: float
    run: Run | None
    state: str
    final_loss: float | None = None
    capped: float | None = None

    @property
    def complete(self) -> bool:
        return self.state == "diverged" or (self.state == "finished" and self.final_loss is not None)


@dataclass
class SeedGrid:
    """One seed of a family: its l0 (None when no run logged a finite ``val/loss`` at step 0), one cell per LR of
    the family (ascending), and notes on what is missing or odd."""

    seed: Any
    init_loss: float | None
    cells: list[Cell]
    notes: list[str] = field(default_factory=list)

    @property
    def sensitivity(self) -> float | None:
        """The seed's LRS; None unless its grid is complete and its l0 known."""
        if self.init_loss is None or not all(c.complete for c in self.cells):
            return None
        return lr_sensitivity([c.final_loss for c in self.cells], self.init_loss)


@dataclass
class Family:
    """Runs that differ only in the seed and the LR. ``grid``: its LRs, ascending; ``seeds``: one per seed."""

    label: str
    grid: list[float]
    runs: list[Run]
    seeds: list[SeedGrid]

    @property
    def averaged(self) -> list[SeedGrid]:
        """The seeds with an LRS (complete grid, l0 known): the ones every per-family number is over."""
        return [s for s in self.seeds if s.sensitivity is not None]

    @property
    def values(self) -> list[float]:
        return [s.sensitivity for s in self.averaged]

    @property
    def mean_stderr(self) -> tuple[float | None, float | None]:
        return mean_stderr(self.values)

    @property
    def ci95(self) -> tuple[float, float] | None:
        return t_interval(self.values)

    @property
    def capped_band(self) -> list[tuple[float | None, float | None]]:
        """Per LR of ``grid``: (mean, stderr) over the averaged seeds of min(l(eta), l0), the quantity LRS averages."""
        return [mean_stderr([s.cells[i].capped for s in self.averaged]) for i in range(len(self.grid))]

    @property
    def best_lr(self) -> float | None:
        """The LR of the lowest mean capped loss (the lowest such LR on a tie); None without an averaged seed."""
        means = [(m, lr) for lr, (m, _) in zip(self.grid, self.capped_band, strict=True) if m is not None]
        return min(means)[1] if means else None

    def n_diverged(self, lr: float) -> int:
        """How many of the family's runs at ``lr`` diverged."""
        return sum(r.diverged for r in self.runs if run_lr(r) == lr)

    @property
    def notes(self) -> list[str]:
        return [note for s in self.seeds for note in s.notes]


@dataclass
class LRStudy:
    """The families of a sweep with an LR axis, in first-seen order, and notes on what was left out."""

    families: list[Family]
    notes: list[str]

    def family(self, label: str | None) -> Family | None:
        """The family labelled ``label`` (None for None or for no such family)."""
        return next((f for f in self.families if f.label == label), None)


def lrs_versus(family: Family, baseline: Family) -> PairedDifference | None:
    """``family``'s LRS − ``baseline``'s, paired by seed over the seeds both have an LRS for (paired t test,
    :func:`analysis.paired.paired_difference`); None for the baseline itself."""
    if family is baseline:
        return None
    return paired_difference(*({s.seed: s.sensitivity for s in f.averaged} for f in (family, baseline)))


def run_lr(run: Run) -> float | None:
    """The run's ``optim.lr`` (the schedule's peak LR), or None when its config has no finite number there."""
    return finite(run.config.get(LR_KEY))


def init_loss_of(run: Run) -> float | None:
    """The run's l0: its first finite ``val/loss`` at step 0; None for a run written before it was logged."""
    return next((v for s, v in run.series.get(LOSS, []) if s == 0 and v is not None), None)


def final_loss_of(run: Run) -> float | None:
    """The run's last ``val/loss`` after step 0 (its final evaluation; of a step logged twice, e.g. by a resumed
    run, the later line), or None (not finite, or none logged)."""
    points = [(s, v) for s, v in run.series.get(LOSS, []) if s > 0]
    return max(reversed(points), key=lambda p: p[0])[1] if points else None


def run_state(run: Run) -> str:
    """``diverged`` (:attr:`Run.diverged`), ``finished``, or the run's ``status_state`` (not complete)."""
    return "diverged" if run.diverged else "finished" if run.finished else run.status_state


def lr_study(runs: list[Run]) -> LRStudy | None:
    """Group ``runs`` into families (see the module docstring); None when no family spans two LRs."""
    with_lr = [r for r in runs if run_lr(r) is not None]
    keys = [k for k in differing_keys(with_lr) if k != LR_KEY] or list(NORM_KEYS)
    groups: dict[str, list[Run]] = {}
    for run in with_lr:
        groups.setdefault(config_label(run, keys), []).append(run)
    families, notes = [], []
    for label, members in groups.items():
        grid = sorted({run_lr(r) for r in members})
        if len(grid) < 2:
            notes.append(f"{label}: runs at one LR only ({grid[0]:g}), no LR sensitivity")
        else:
            families.append(Family(label, grid, members, [seed_grid(seed, grid, rs) for seed, rs in _by_seed(members)]))
    if not families:
        return None
    if left_out := len(runs) - len(with_lr):
        notes.append(f"{left_out} run{'s' * (left_out > 1)} without a numeric {LR_KEY} left out")
    return LRStudy(families, notes)


def _by_seed(runs: list[Run]) -> list[tuple[Any, list[Run]]]:
    """(seed, its runs), integer seeds in numeric order, then any others by their text."""
    groups: dict[Any, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.seed, []).append(run)
    return sorted(groups.items(), key=lambda kv: (0, kv[0], "") if isinstance(kv[0], int) else (1, 0, str(kv[0])))


def seed_grid(seed: Any, grid: list[float], runs: list[Run]) -> SeedGrid:
    """One seed's cells over ``grid`` from its ``runs`` (at any LRs of the grid), its l0, and notes."""
    init, notes = _init_loss(runs)
    cells = []
    for lr in grid:
        at = sorted((r for r in runs if run_lr(r) == lr), key=lambda r: (_preference(r), r.label))
        if len(at) > 1:  # e.g. the same run given twice, or runs differing only in train.resume
            notes.append(f"seed {seed}, lr {lr:g}: {len(at)} runs ({', '.join(r.label for r in at)}), used {at[0].label}")
        cells.append(_cell(lr, at[0] if at else None, init))
    if incomplete := [c for c in cells if not c.complete]:
        why = ", ".join(f"lr {c.lr:g} {_why(c)}" for c in incomplete)
        notes.append(f"seed {seed}: no LRS, incomplete grid ({why})")
    elif init is None:
        notes.append(f"seed {seed}: no LRS, no run logged {LOSS} at step 0 (the loss at init; runs written before it was)")
    return SeedGrid(seed, init, cells, notes)


def _preference(run: Run) -> int:
    """Which of several runs of one seed and LR stands for it: a finished one, else a diverged one, else any."""
    return {"finished": 0, "diverged": 1}.get(run_state(run), 2)


def _init_loss(runs: list[Run]) -> tuple[float | None, list[str]]:
    """(l0, notes) of one seed's runs: a finished run's l0 if any has one, else another's; a note when they
    disagree by more than ``INIT_TOLERANCE``."""
    logged = [(r, v) for r in sorted(runs, key=lambda r: (not r.finished, r.label)) if (v := init_loss_of(r)) is not None]
    if not logged:
        return None, []
    run, value = logged[0]
    spread = max(v for _, v in logged) - min(v for _, v in logged)
    if spread <= INIT_TOLERANCE:
        return value, []
    return value, [f"seed {run.seed}: {LOSS} at step 0 differs across its runs by {spread:.3g} (> {INIT_TOLERANCE:g}), "
                   f"used {run.label}'s {value:.6f}"]  # fmt: skip


def _cell(lr: float, run: Run | None, init: float | None) -> Cell:
    if run is None:
        return Cell(lr, None, "missing")
    state = run_state(run)
    final = final_loss_of(run) if state == "finished" else None
    cell = Cell(lr, run, state, final)
    if init is not None and cell.complete:
        cell.capped = capped_loss(final, init)
    return cell


def _why(cell: Cell) -> str:
    """Why an incomplete cell is: no run, a finished run without a final loss, or the run's state."""
    if cell.state == "missing":
        return "has no run"
    if cell.state == "finished":
        return f"finished without a {LOSS} after step 0"
    return cell.state + (" (no status.json)" if cell.state == "unknown" else "")
