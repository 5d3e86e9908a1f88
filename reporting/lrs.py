"""The LR-sensitivity tables of ``python -m scripts.report_lrs`` and the report page: per-family LRS with its interval,
per-seed values, and the cells' CSVs; what is computed lives in :mod:`analysis.lrs`."""

import html
from collections.abc import Callable
from pathlib import Path

from analysis.csvs import output_dir, read_rows, write_csv
from analysis.lrs import (
    GRIDS_DIFFER,
    NOT_LEARNED,
    Family,
    LRStudy,
    last_max_logit,
    lrs_versus,
    not_learned_pairs,
    study_from_cells,
)
from analysis.paired import delta_text
from analysis.presets import shown_label, stored_label, study_names
from reporting.tables import params_columns

CELL_COLUMNS = ("family", "seed", "lr", "final_val_loss", "init_loss", "state")  # what study_from_cells reads
CELL_FIELDS = ("family", "seed", "lr", "final_val_loss", "init_loss", "capped_loss", "state", "max_attn_logit")
PAIRED_FIELDS = ("baseline", "diff_mean", "diff_ci95_lo", "diff_ci95_hi", "pairs", "significant")
ADDED_FIELDS = ("best_loss_mean", "did_not_learn", "lrs_note", "pairs_left_out", "degenerate")  # after the older ones
SEED_FIELDS = ("family", "seed", "lrs", "best_loss", "init_loss", "learned")
FAMILY_FIELDS = (
    "family",
    "n",
    "lrs_mean",
    "lrs_stderr",
    "ci95_lo",
    "ci95_hi",
    "per_seed_lrs",
    "best_lr",
    *PAIRED_FIELDS,
    *ADDED_FIELDS,
)
CSVS = ("lr_sensitivity.csv", "lrs.csv", "lrs_seeds.csv")
NOTE = (
    "LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322, §2.2): a family is the runs that differ only in the seed "
    "and optim.lr. Per seed, LRS = the mean over the family's LR grid of min(final valid loss, loss at init) minus its "
    "minimum over the grid (nats/token); the loss at init is val/loss at step 0, and a diverged run counts as it. A seed "
    "whose grid is incomplete (an LR without a finished or diverged run) gets no LRS; nor does a seed that did not learn at "
    "any LR of the grid (every run diverged or ended at or above the loss at init), whose LRS would otherwise be 0, the "
    "best score. Mean ± stderr over seeds; 95% CI from the t distribution with n − 1 dof (none for n = 1); best loss: "
    "the mean over seeds of the minimum over the grid, what LRS is measured from; best LR: the lowest mean of min(final "
    "valid loss, loss at init) over the seeds with an LRS (none on a tie). Per run and LR: lr_sensitivity.csv; per "
    "family: lrs.csv."
)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def per_seed(family: Family) -> str:
    """``seed=LRS`` for each seed with an LRS, space-separated (full precision)."""
    return " ".join(f"{s.seed}={s.sensitivity!r}" for s in family.seeds if s.sensitivity is not None)


def _mean_cell(family: Family) -> tuple[float | None, str]:
    mean, stderr = family.mean_stderr
    if mean is None and family.not_learned:  # the seeds named when some learned: no mean over the survivors
        return None, NOT_LEARNED if len(family.not_learned) == len(family.seeds) else family.learning_note
    return mean, _fmt(mean) + ("" if stderr is None else f" ± {_fmt(stderr)}")


def best_lr_text(family: Family) -> str:
    """The best LR, ``tie: 0.001, 0.01`` when several LRs share the lowest mean capped loss, or ``—``."""
    if len(family.best_lrs) > 1:
        return "tie: " + ", ".join(f"{lr:g}" for lr in family.best_lrs)
    return "—" if family.best_lr is None else f"{family.best_lr:g}"


def lrs_note_field(family: Family) -> str:
    """``lrs.csv``'s ``lrs_note``: the family's seeds that did not learn, and a best-LR tie; empty when neither."""
    parts = [family.learning_note] if family.learning_note else []
    if len(family.best_lrs) > 1:
        parts.append(f"best LR {best_lr_text(family)}")
    return "; ".join(parts)


def _ci_cell(family: Family) -> tuple[str | None, str]:
    ci = family.ci95
    return (None, "—") if ci is None else (f"{ci[0]!r} {ci[1]!r}", f"[{_fmt(ci[0])}, {_fmt(ci[1])}]")


def lrs_columns(baseline: Family | None = None, params: bool = False) -> list[tuple[str, str, Callable[[Family], tuple]]]:
    """The LR-sensitivity table's columns, as ``reporting.tables.table_html`` takes them: (key, header, cell), where
    cell(family) -> (raw value for data-value, shown text); with ``baseline``, after the CI a column ``lrs:delta``:
    the family's LRS − the baseline's, paired by seed (:func:`analysis.lrs.lrs_versus`), ``n.s.`` when its 95% CI
    covers 0, empty in the baseline's row. With ``params`` (some run recorded its count), after the family its parameters
    and with ``baseline`` their ratio to the baseline's (:func:`reporting.tables.params_columns`), on the page
    only: ``lrs.csv`` is rebuilt from ``lr_sensitivity.csv`` alone, which holds no counts."""

    def delta(f: Family) -> tuple:
        diff = lrs_versus(f, baseline) if baseline else None
        return (None, "") if diff is None else (diff.mean, delta_text(diff, lambda x: f"{x:+.4f}"))

    compared = [("lrs:delta", f"LRS Δ vs {shown_label(baseline.label)}: mean [95% CI] (pairs)", delta)] if baseline else []
    return [
        ("family", "family", lambda f: (f.label, f.label)),
        *(params_columns(baseline) if params else []),
        ("n", "seeds (n)", lambda f: (len(f.values), f"{len(f.values)} of {len(f.seeds)}")),
        ("lrs", "LRS: mean ± stderr", _mean_cell),
        ("best_loss", "best loss l*: mean", lambda f: (f.best_loss_mean, _fmt(f.best_loss_mean))),
        ("ci95", "95% CI", _ci_cell),
        *compared,
        ("per_seed", "per seed", lambda f: (per_seed(f), ", ".join(f"seed {s.seed}: {_fmt(s.sensitivity)}" for s in f.averaged))),
        ("diverged", "runs diverged", lambda f: (k := sum(r.diverged for r in f.runs), f"{k} of {len(f.runs)}")),
        ("did_not_learn", "seeds that did not learn", lambda f: (k := len(f.not_learned), f"{k} of {len(f.seeds)}")),
        ("best_lr", "best LR", lambda f: (f.best_lr, best_lr_text(f))),
        ("notes", "notes", lambda f: ("; ".join(f.notes), "; ".join(f.notes))),
    ]


def lrs_note(study: LRStudy) -> str:
    """The paragraph above the table: the definition, and what was left out of the study."""
    left_out = "".join(f"<br>{html.escape(n)}" for n in study.notes)
    return f'<p class="note">{html.escape(NOTE)}{left_out}</p>\n'


def cell_rows(study: LRStudy) -> list[tuple]:
    """The rows of ``lr_sensitivity.csv`` (``CELL_FIELDS``)."""
    return [
        (f.label, s.seed, c.lr, c.final_loss, s.init_loss, c.capped, c.state, last_max_logit(c.run))
        for f in study.families
        for s in f.seeds
        for c in s.cells
    ]


def family_rows(study: LRStudy, baseline: Family | None = None) -> list[tuple]:
    """The rows of ``lrs.csv`` (``FAMILY_FIELDS``); the paired fields empty without ``baseline`` and in its own row."""
    rows = []
    for f in study.families:
        ci = f.ci95 or (None, None)
        diff = lrs_versus(f, baseline) if baseline else None
        paired = (None,) * 5 if diff is None else (diff.mean, *(diff.ci95 or (None, None)), diff.n, diff.significant)
        uncompared = diff.note if diff is not None and diff.note.startswith(GRIDS_DIFFER) else ""
        note = "; ".join(n for n in (lrs_note_field(f), uncompared) if n)
        left_out = None if diff is None or baseline is None else len(not_learned_pairs(f, baseline))
        degenerate = diff.degenerate if diff is not None and diff.n > 1 else None  # no test with fewer than two pairs
        rows.append(
            (
                f.label,
                len(f.values),
                *f.mean_stderr,
                *ci,
                per_seed(f),
                f.best_lr,
                baseline and baseline.label,
                *paired,
                f.best_loss_mean,
                len(f.not_learned),
                note,
                left_out,
                degenerate,
            )
        )
    return rows


def seed_rows(study: LRStudy) -> list[tuple]:
    """The rows of ``lrs_seeds.csv`` (``SEED_FIELDS``): each seed's LRS and l* (empty without an LRS), its l0, and
    ``learned`` (``True``, ``False``: did not learn at any LR of the grid; empty for an incomplete grid)."""
    return [(f.label, s.seed, s.sensitivity, s.best_loss, s.init_loss, s.learned) for f in study.families for s in f.seeds]


def write_csvs(study: LRStudy, out: Path, baseline: Family | None = None) -> list[Path]:
    """Write ``lr_sensitivity.csv``, ``lrs.csv`` (with ``baseline``: the paired LRS differences) and ``lrs_seeds.csv``
    into ``out``; returns their paths."""
    rows = (cell_rows(study), family_rows(study, baseline), seed_rows(study))
    tables = zip(CSVS, (CELL_FIELDS, FAMILY_FIELDS, SEED_FIELDS), rows, strict=True)
    return [write_csv(out / name, fields, rows) for name, fields, rows in tables]


def rebuild_lrs_csv(
    cells_csv: Path | list[Path],
    out: Path,
    baseline: str | None = None,
    by_preset: bool = False,
    families: list[str] | None = None,
) -> Path:
    """Write ``out`` (``lrs.csv``) and ``lrs_seeds.csv`` beside it from ``cells_csv`` (one or more reports'
    ``lr_sensitivity.csv``) alone, compared with the family labelled ``baseline`` if given
    (:func:`analysis.lrs.study_from_cells`, :func:`family_rows`, :func:`seed_rows`), making ``out``'s folder if
    needed; returns ``out``. With ``by_preset`` each file's families are first relabelled by the norm preset they name
    (:func:`analysis.presets.study_name`: ``pre_ln`` for a long ``norm.placement=pre ...``; ``pre_ln muon`` where the
    label also sets ``optim.*`` keys, a study with the optimizer as a factor), and the relabelled cells
    (of the kept families, every file's) are written beside ``out`` too, as ``lr_sensitivity.csv``; ``baseline`` and
    ``families`` then name presets. With ``families``, the other families' rows are dropped.

    Raises:
        OSError: a ``cells_csv`` cannot be read.
        ValueError: a ``cells_csv`` lacks a column of ``CELL_COLUMNS`` (the message names the file, the missing and the
            expected columns) or has no rows; ``out``'s folder is a file. No family is labelled ``baseline`` (a null
            value spelled ``null`` or ``None``) or one of ``families``; the message lists the valid labels. One
            (family, seed, lr) cell in two rows (two files that share a seed). With ``by_preset``: a family that names
            no preset or several, two families of one file naming one, or ``out`` beside a ``cells_csv`` (the
            relabelled cells would overwrite their source). Nothing is written then.
    """
    paths = [cells_csv] if isinstance(cells_csv, Path) else list(cells_csv)
    rows = _kept([row for path in paths for row in _cells_of(path, by_preset, out.parent / CSVS[0])], families)
    study = study_from_cells(rows)
    family = study.family(None if baseline is None else stored_label(baseline))  # norm.qk=null as the page shows it
    if baseline is not None and family is None:
        raise ValueError(f"unknown --baseline {baseline!r}; valid: {', '.join(repr(f.label) for f in study.families)}")
    output_dir(out.parent)  # as scripts.report makes its --out; nothing is written before every check has passed
    if by_preset:
        fields = list(dict.fromkeys(k for r in rows for k in r))
        write_csv(out.parent / CSVS[0], fields, [[r.get(k, "") for k in fields] for r in rows])
    write_csv(out.parent / CSVS[2], SEED_FIELDS, seed_rows(study))
    return write_csv(out, FAMILY_FIELDS, family_rows(study, family))


def _cells_of(cells_csv: Path, by_preset: bool, relabelled: Path) -> list[dict[str, str]]:
    """The rows of one ``lr_sensitivity.csv``, relabelled by preset if ``by_preset`` (written later to ``relabelled``)."""
    rows = read_rows(cells_csv, CELL_COLUMNS)
    return _by_preset(rows, cells_csv, relabelled) if by_preset else rows


def _kept(rows: list[dict[str, str]], families: list[str] | None) -> list[dict[str, str]]:
    """``rows`` of ``families`` only (all without), each (family, seed, lr) once; see :func:`rebuild_lrs_csv`."""
    labels = list(dict.fromkeys(r["family"] for r in rows))
    if families is not None:
        if unknown := [f for f in families if f not in labels]:
            raise ValueError(f"unknown --families {', '.join(map(repr, unknown))}; valid: {', '.join(map(repr, labels))}")
        rows = [r for r in rows if r["family"] in families]
    seen: set[tuple[str, str, float]] = set()
    for r in rows:
        cell = (r["family"], r["seed"], float(r["lr"]))
        if cell in seen:
            raise ValueError(f"cell family {cell[0]!r} seed {cell[1]} lr {r['lr']} is given twice: each seed once")
        seen.add(cell)
    return rows


def _by_preset(rows: list[dict[str, str]], cells_csv: Path, relabelled: Path) -> list[dict[str, str]]:
    """``rows`` with each family relabelled by its norm preset (:func:`analysis.presets.preset_of`); see
    :func:`rebuild_lrs_csv` for the errors."""
    if relabelled.resolve() == cells_csv.resolve():
        raise ValueError(f"--by-preset writes the relabelled cells to {relabelled}, its input: give an --out in another folder")
    names = study_names(r["family"] for r in rows)
    return [{**r, "family": names[r["family"]]} for r in rows]
