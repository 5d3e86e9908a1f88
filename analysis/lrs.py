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
degrees of freedom (none for one seed), the best loss l* (its mean over seeds: what LRS is measured from), and the
best LR, the argmin of the mean over seeds of min(l(eta), l0) (none on a tie: no LR is best).

A seed whose complete grid never improved on l0 (every run diverged or ended at or above the loss at init: every
min(l(eta), l0) = l0) *did not learn at any LR of the grid*. By the formula its LRS would be 0, the best possible
score, read as a success; it gets none instead, and no best loss, and a note says so. A family with such a seed has
no mean LRS, no interval, no best loss and no best LR (a mean over the seeds that learned would score it by its
survivors), and the report says "did not learn at any LR of the grid" for it, naming the seeds; a comparison by seed
(:func:`lrs_versus`) leaves such seeds out and says how many, and compares no two families whose LR grids differ
(each LRS is a mean over its own grid).

:func:`study_from_cells` rebuilds a study from the report's ``lr_sensitivity.csv`` rows, without the run dirs.
"""

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
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
NOT_LEARNED = "did not learn at any LR of the grid"
GRIDS_DIFFER = "LR grids differ: LRS not comparable"


def capped_loss(loss: float | None, init_loss: float) -> float:
    """min(loss, l0); l0 for a None or non-finite loss (a diverged run)."""
    return init_loss if loss is None or not math.isfinite(loss) else min(loss, init_loss)


def lr_sensitivity(losses: Sequence[float | None], init_loss: float) -> float | None:
    """LRS of one seed's grid (nats/token): the mean over ``losses`` (one final validation loss per LR; None or
    non-finite for a diverged run) of min(loss, l0), minus their min; None when no loss is below l0 (the seed did
    not learn at any LR of the grid: every capped loss is l0, and the formula's 0 would read as the best score).

    Raises:
        ValueError: no losses, or a non-finite ``init_loss``.
    """
    if not losses:
        raise ValueError("no losses: the LR grid is empty")
    if not math.isfinite(init_loss):
        raise ValueError(f"the loss at init must be finite, got {init_loss}")
    capped = [capped_loss(loss, init_loss) for loss in losses]
    best = min(capped)
    return None if best >= init_loss else statistics.fmean(capped) - best


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
    def complete(self) -> bool:
        """Its l0 is known and every cell is complete (finished with a final loss, or diverged)."""
        return self.init_loss is not None and all(c.complete for c in self.cells)

    @property
    def sensitivity(self) -> float | None:
        """The seed's LRS; None unless its grid is complete, its l0 known and some LR improved on l0."""
        if self.init_loss is None or not self.complete:
            return None
        return lr_sensitivity([c.final_loss for c in self.cells], self.init_loss)

    @property
    def learned(self) -> bool | None:
        """Whether some LR of its complete grid improved on l0; None for an incomplete grid (not known)."""
        return self.sensitivity is not None if self.complete else None

    @property
    def best_loss(self) -> float | None:
        """l* = min over the grid of min(l(eta), l0), what its LRS is measured from; None without an LRS."""
        if self.sensitivity is None:
            return None
        return min(v for c in self.cells if (v := c.capped) is not None)  # a seed with an LRS knows every one


@dataclass
class Family:
    """Runs that differ only in the seed and the LR. ``grid``: its LRs, ascending; ``seeds``: one per seed."""

    label: str
    grid: list[float]
    runs: list[Run]
    seeds: list[SeedGrid]

    @property
    def averaged(self) -> list[SeedGrid]:
        """The seeds with an LRS (complete grid, l0 known): the ones every per-family number is over. None at all
        when a seed did not learn: a mean over the seeds that learned would read a failure as a low sensitivity."""
        if self.not_learned:
            return []
        return [s for s in self.seeds if s.sensitivity is not None]

    @property
    def values(self) -> list[float]:
        return [v for s in self.averaged if (v := s.sensitivity) is not None]  # every averaged seed has one

    @property
    def mean_stderr(self) -> tuple[float | None, float | None]:
        return mean_stderr(self.values)

    @property
    def ci95(self) -> tuple[float, float] | None:
        return t_interval(self.values)

    @property
    def capped_band(self) -> list[tuple[float | None, float | None]]:
        """Per LR of ``grid``: (mean, stderr) over the averaged seeds of min(l(eta), l0), the quantity LRS averages."""
        # an averaged seed knows every capped loss
        return [mean_stderr([v for s in self.averaged if (v := s.cells[i].capped) is not None]) for i in range(len(self.grid))]

    @property
    def not_learned(self) -> list[SeedGrid]:
        """The seeds that did not learn at any LR of the grid (complete grid, no LR below l0): no LRS."""
        return [s for s in self.seeds if s.learned is False]

    @property
    def learning_note(self) -> str:
        """``did not learn at any LR of the grid: seeds 1, 2 of 3``; empty when every seed with a complete grid learned."""
        if not (seeds := self.not_learned):
            return ""
        return f"{NOT_LEARNED}: seed{'s' * (len(seeds) > 1)} {', '.join(str(s.seed) for s in seeds)} of {len(self.seeds)}"

    @property
    def best_loss_mean(self) -> float | None:
        """The mean over the averaged seeds of l*, the best loss their LRS is measured from; None without one."""
        return mean_stderr([b for s in self.averaged if (b := s.best_loss) is not None])[0]  # each averaged seed has one

    @property
    def best_lrs(self) -> list[float]:
        """The LRs of the lowest mean capped loss over the averaged seeds (several on an exact tie); [] without one."""
        means = {lr: m for lr, (m, _) in zip(self.grid, self.capped_band, strict=True) if m is not None}
        return [lr for lr, m in means.items() if m == min(means.values())]

    @property
    def best_lr(self) -> float | None:
        """The LR of the lowest mean capped loss; None without an averaged seed, and on a tie (no LR is best)."""
        return self.best_lrs[0] if len(self.best_lrs) == 1 else None

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


def not_learned_pairs(family: Family, baseline: Family) -> list[Any]:
    """The seeds both families ran that :func:`lrs_versus` leaves out because either did not learn at any LR of the grid."""
    out = {s.seed for f in (family, baseline) for s in f.not_learned}
    return [s.seed for s in family.seeds if s.seed in out and s.seed in {b.seed for b in baseline.seeds}]


def lrs_versus(family: Family, baseline: Family) -> PairedDifference | None:
    """``family``'s LRS − ``baseline``'s, paired by seed over the seeds both have an LRS for (paired t test,
    :func:`analysis.paired.paired_difference`); None for the baseline itself. A seed that did not learn at any LR of
    the grid in either family has no LRS and is left out; the difference's ``note`` says how many and why. Two
    families swept over different LR grids (a sweep cut short before its last LR) are not compared: no pair, no
    mean, and the note ``GRIDS_DIFFER`` with both grids."""
    if family is baseline:
        return None
    if family.grid != baseline.grid:  # a mean over other LRs: an LRS over a narrower grid reads as less sensitive
        grids = " vs ".join(", ".join(f"{lr:g}" for lr in f.grid) for f in (family, baseline))
        return PairedDifference(0, None, None, None, note=f"{GRIDS_DIFFER} ({grids})")
    diff = paired_difference(*({s.seed: s.sensitivity for s in f.seeds if s.sensitivity is not None} for f in (family, baseline)))
    if not (left := not_learned_pairs(family, baseline)):
        return diff
    seeds = f"seed{'s' * (len(left) > 1)} {', '.join(map(str, left))}"
    return dataclasses.replace(diff, note=f"{len(left)} left out ({seeds}): {NOT_LEARNED}")


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
        grid = sorted({lr for r in members if (lr := run_lr(r)) is not None})  # each member has one (with_lr)
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
    return SeedGrid(seed, init, cells, notes + _grid_notes(seed, cells, init))


def _grid_notes(seed: Any, cells: list[Cell], init: float | None) -> list[str]:
    """Why a seed has no LRS: an incomplete grid, an unknown l0, or no LR of the grid improving on l0; [] if it has one."""
    if incomplete := [c for c in cells if not c.complete]:
        why = ", ".join(f"lr {c.lr:g} {_why(c)}" for c in incomplete)
        return [f"seed {seed}: no LRS, incomplete grid ({why})"]
    if init is None:
        return [f"seed {seed}: no LRS, no run logged {LOSS} at step 0 (the loss at init; runs written before it was)"]
    if lr_sensitivity([c.final_loss for c in cells], init) is None:
        return [f"seed {seed}: no LRS, {NOT_LEARNED} (every run diverged or ended at or above the loss at init, {init:.4f})"]
    return []


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
    return value, [
        f"seed {run.seed}: {LOSS} at step 0 differs across its runs by {spread:.3g} (> {INIT_TOLERANCE:g}), "
        f"used {run.label}'s {value:.6f}"
    ]


def _cell(lr: float, run: Run | None, init: float | None) -> Cell:
    if run is None:
        return Cell(lr, None, "missing")
    state = run_state(run)
    return _capped(Cell(lr, run, state, final_loss_of(run) if state == "finished" else None), init)


def _capped(cell: Cell, init: float | None) -> Cell:
    """``cell`` with its capped loss set when it is complete and ``init`` (l0) known."""
    if init is not None and cell.complete:
        cell.capped = capped_loss(cell.final_loss, init)
    return cell


def study_from_cells(rows: Iterable[dict[str, str]]) -> LRStudy:
    """The study of the rows of a report's ``lr_sensitivity.csv`` (``family, seed, lr, final_val_loss, init_loss,
    state``, as ``csv.DictReader`` gives them; other columns ignored): the same families, seeds, cells and per-seed
    LRS as the report that wrote them, without its run directories. Cells have no run: nothing that needs one (the
    diverged counts, the max-logit charts) is known. Families and seeds in the rows' order; a seed written as an
    integer is one."""
    by_family: dict[str, dict[Any, dict[float, dict[str, str]]]] = {}
    for row in rows:
        seed = int(row["seed"]) if row["seed"].lstrip("-").isdigit() else row["seed"]
        by_family.setdefault(row["family"], {}).setdefault(seed, {})[float(row["lr"])] = row
    families = []
    for label, seeds in by_family.items():
        grid = sorted({lr for cells in seeds.values() for lr in cells})
        families.append(Family(label, grid, [], [_seed_from_cells(seed, grid, cells) for seed, cells in seeds.items()]))
    return LRStudy(families, [])


def _seed_from_cells(seed: Any, grid: list[float], rows: dict[float, dict[str, str]]) -> SeedGrid:
    """One seed's grid from its ``lr_sensitivity.csv`` rows (lr -> row); an LR without a row is ``missing``."""
    init = _number(next(iter(rows.values()))["init_loss"])
    cells = [
        _capped(Cell(lr, None, r["state"], _number(r["final_val_loss"])), init)
        if (r := rows.get(lr))
        else Cell(lr, None, "missing")
        for lr in grid
    ]
    return SeedGrid(seed, init, cells, _grid_notes(seed, cells, init))


def _number(text: str) -> float | None:
    """A CSV field as a float; None for an empty one."""
    return float(text) if text else None


def _why(cell: Cell) -> str:
    """Why an incomplete cell is: no run, a finished run without a final loss, or the run's state."""
    if cell.state == "missing":
        return "has no run"
    if cell.state == "finished":
        return f"finished without a {LOSS} after step 0"
    return cell.state + (" (no status.json)" if cell.state == "unknown" else "")


def last_max_logit(run: Run | None) -> float | None:
    """The largest attention max logit of ``run``'s last telemetry record that has any (None: none recorded)."""
    records = [rec for _, rec in sorted(run.profile("max_logit").items()) if rec] if run else []
    return max(records[-1].values()) if records else None
