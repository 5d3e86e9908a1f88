"""The LR-sensitivity part of ``scripts/report.py`` (the numbers: :mod:`analysis.lrs`; the charts:
:mod:`analysis.lr_panels`): its table's columns, the note above the table, and its two CSVs.

CSVs, written with the ``csv`` module into the report's folder (empty field: no value; floats at full precision):

- ``lr_sensitivity.csv``: one row per family, seed and LR of the family's grid: ``family, seed, lr,
  final_val_loss`` (a finished run's last ``val/loss``), ``init_loss`` (the seed's l0), ``capped_loss``
  (min(final_val_loss, init_loss); init_loss for a diverged run), ``state`` (``finished``, ``diverged``,
  ``missing``: no run, or the run's state: ``running``, ``interrupted``, ``failed``, ``unknown``),
  ``max_attn_logit`` (the largest ``attn/.../max_logit`` over the run's attentions at its last telemetry record;
  empty without one);
- ``lrs.csv``: one row per family: ``family, n`` (seeds with an LRS), ``lrs_mean, lrs_stderr, ci95_lo, ci95_hi,
  per_seed_lrs`` (``seed=value`` pairs, space-separated), ``best_lr``, and with ``--baseline FAMILY`` ``baseline,
  diff_mean, diff_ci95_lo, diff_ci95_hi, pairs, significant`` (the family's LRS − the baseline's, paired t test over
  the seeds both have an LRS for; empty without a baseline and in the baseline's own row).
"""

import html
from collections.abc import Callable
from pathlib import Path

from analysis.csvs import write_csv
from analysis.lrs import Family, LRStudy, lrs_versus
from analysis.paired import delta_text
from analysis.runs import Run

CELL_FIELDS = ("family", "seed", "lr", "final_val_loss", "init_loss", "capped_loss", "state", "max_attn_logit")
PAIRED_FIELDS = ("baseline", "diff_mean", "diff_ci95_lo", "diff_ci95_hi", "pairs", "significant")
FAMILY_FIELDS = ("family", "n", "lrs_mean", "lrs_stderr", "ci95_lo", "ci95_hi", "per_seed_lrs", "best_lr", *PAIRED_FIELDS)
CSVS = ("lr_sensitivity.csv", "lrs.csv")
NOTE = (
    "LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322, §2.2): a family is the runs that differ only in the seed "
    "and optim.lr. Per seed, LRS = the mean over the family's LR grid of min(final valid loss, loss at init) minus its "
    "minimum over the grid (nats/token); the loss at init is val/loss at step 0, and a diverged run counts as it. A seed "
    "whose grid is incomplete (an LR without a finished or diverged run) gets no LRS. Mean ± stderr over seeds; 95% CI "
    "from the t distribution with n − 1 dof (none for n = 1); best LR: the lowest mean of min(final valid loss, loss at "
    "init) over the seeds with an LRS. Per run and LR: lr_sensitivity.csv; per family: lrs.csv."
)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def per_seed(family: Family) -> str:
    """``seed=LRS`` for each seed with an LRS, space-separated (full precision)."""
    return " ".join(f"{s.seed}={s.sensitivity!r}" for s in family.averaged)


def _mean_cell(family: Family) -> tuple[float | None, str]:
    mean, stderr = family.mean_stderr
    return mean, _fmt(mean) + ("" if stderr is None else f" ± {_fmt(stderr)}")


def _ci_cell(family: Family) -> tuple[str | None, str]:
    ci = family.ci95
    return (None, "—") if ci is None else (f"{ci[0]!r} {ci[1]!r}", f"[{_fmt(ci[0])}, {_fmt(ci[1])}]")


def lrs_columns(baseline: Family | None = None) -> list[tuple[str, str, Callable[[Family], tuple]]]:
    """The LR-sensitivity table's columns, as ``scripts.report.table_html`` takes them: (key, header, cell), where
    cell(family) -> (raw value for data-value, shown text); with ``baseline``, after the CI a column ``lrs:delta``:
    the family's LRS − the baseline's, paired by seed (:func:`analysis.lrs.lrs_versus`), ``n.s.`` when its 95% CI
    covers 0, empty in the baseline's row."""

    def delta(f: Family) -> tuple:
        diff = lrs_versus(f, baseline)
        return (None, "") if diff is None else (diff.mean, delta_text(diff, lambda x: f"{x:+.4f}"))

    compared = [("lrs:delta", f"LRS Δ vs {baseline.label}: mean [95% CI] (pairs)", delta)] if baseline else []
    return [
        ("family", "family", lambda f: (f.label, f.label)),
        ("n", "seeds (n)", lambda f: (len(f.values), f"{len(f.values)} of {len(f.seeds)}")),
        ("lrs", "LRS: mean ± stderr", _mean_cell),
        ("ci95", "95% CI", _ci_cell),
        *compared,
        ("per_seed", "per seed", lambda f: (per_seed(f), ", ".join(f"seed {s.seed}: {_fmt(s.sensitivity)}" for s in f.averaged))),
        ("diverged", "runs diverged", lambda f: (k := sum(r.diverged for r in f.runs), f"{k} of {len(f.runs)}")),
        ("best_lr", "best LR", lambda f: (f.best_lr, "—" if f.best_lr is None else f"{f.best_lr:g}")),
        ("notes", "notes", lambda f: ("; ".join(f.notes), "; ".join(f.notes))),
    ]


def lrs_note(study: LRStudy) -> str:
    """The paragraph above the table: the definition, and what was left out of the study."""
    left_out = "".join(f"<br>{html.escape(n)}" for n in study.notes)
    return f'<p class="note">{html.escape(NOTE)}{left_out}</p>\n'


def last_max_logit(run: Run | None) -> float | None:
    """The largest attention max logit of ``run``'s last telemetry record that has any (None: none recorded)."""
    records = [rec for _, rec in sorted(run.max_logit.items()) if rec] if run else []
    return max(records[-1].values()) if records else None


def cell_rows(study: LRStudy) -> list[tuple]:
    """The rows of ``lr_sensitivity.csv`` (``CELL_FIELDS``)."""
    return [(f.label, s.seed, c.lr, c.final_loss, s.init_loss, c.capped, c.state, last_max_logit(c.run))
            for f in study.families for s in f.seeds for c in s.cells]  # fmt: skip


def family_rows(study: LRStudy, baseline: Family | None = None) -> list[tuple]:
    """The rows of ``lrs.csv`` (``FAMILY_FIELDS``); the last six empty without ``baseline`` and in its own row."""
    rows = []
    for f in study.families:
        ci = f.ci95 or (None, None)
        diff = lrs_versus(f, baseline) if baseline else None
        paired = (None,) * 5 if diff is None else (diff.mean, *(diff.ci95 or (None, None)), diff.n, diff.significant)
        rows.append((f.label, len(f.values), *f.mean_stderr, *ci, per_seed(f), f.best_lr, baseline and baseline.label, *paired))
    return rows


def write_csvs(study: LRStudy, out: Path, baseline: Family | None = None) -> list[Path]:
    """Write ``lr_sensitivity.csv`` and ``lrs.csv`` (with ``baseline``: the paired LRS differences) into ``out``;
    returns their paths."""
    tables = zip(CSVS, (CELL_FIELDS, FAMILY_FIELDS), (cell_rows(study), family_rows(study, baseline)), strict=True)
    return [write_csv(out / name, fields, rows) for name, fields, rows in tables]
