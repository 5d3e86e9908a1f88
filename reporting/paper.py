"""The report's table for a paper: ``table.md`` (GitHub Markdown) and ``table.tex`` (a LaTeX ``tabular`` with
booktabs rules), written beside ``summary.csv`` by every report; ``python -m scripts.report DIR --table md|latex``
prints one.

A row per variant, named as the page names it (``pre_bn``, ``pre_ln optim.lr=0.002``: ``analysis.names``), then
``n``, its finished runs (``2 of 3`` when some did not finish: diverged runs are never averaged), then per metric of
the variants table (the task's test metrics, best valid loss; one no variant has is left out) its mean ± standard
error over the finished runs, in the unit the page shows it in (``runlog/tasks.py``: PER and WER in %, BLEU and chrF
as sacreBLEU gives them; losses in nats) and, with a baseline, ``Δ <metric> vs <baseline>``: the paired difference
to it, ``mean [95% CI] (pairs)`` as the page's Δ column writes it (``n.s.``: the interval covers 0). Notes under the
table (``%`` comments above it in LaTeX) give the method and each short name's keys.

Every number is a value of ``summary.csv``'s rows (``analysis.paired.summary_rows``), formatted, never recomputed.
Written by hand rather than with pandas' ``to_markdown`` / ``to_latex``: those need ``tabulate`` and ``jinja2``,
which normlab does not declare (other packages pull them in), and ``to_latex``'s escaping would escape the ``$`` of
``$\\pm$``; the two formats take 30 lines here.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analysis.names import named_keys
from analysis.paired import PairedDifference, delta_text
from analysis.variants import Variant
from reporting.tables import metric_display
from runlog.tasks import TaskSpec

TABLE_FILES = {"md": "table.md", "latex": "table.tex"}  # --table FORMAT -> the file it prints
LOSS_UNIT = "nats"  # best valid loss: the token-level cross-entropy, natural log
_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "—": "---",
    "−": "$-$",
    "√": r"$\surd$",
}


@dataclass(frozen=True)
class PaperTable:
    """A table as text cells: ``header``, ``rows`` (one per variant), ``notes`` (sentences to print under it)."""

    header: list[str]
    rows: list[list[str]]
    notes: list[str]


def paper_table(variants: list[Variant], rows: list[dict], task: TaskSpec, baseline: Variant | None) -> PaperTable:
    """The table of ``variants`` from ``rows`` (``analysis.paired.summary_rows(variants, task, baseline)``): see the
    module docstring. ``baseline``: the variant the rows compare to (None: no Δ columns)."""
    by = {(r["variant"], r["metric"]): r for r in rows}
    shown = [(k, *d) for k, d in metric_display(task).items() if any(by[v.label, k]["mean"] is not None for v in variants)]
    header = ["variant", "n"]
    for key, name, _, _ in shown:
        unit = f"{name} ({LOSS_UNIT})" if key == "best_val_loss" else name
        header += [unit, *([f"Δ {unit} vs {baseline.shown}"] if baseline is not None else [])]
    body = []
    for v in variants:
        first = by[v.label, next(iter(metric_display(task)))]
        cells = [v.shown, f"{first['finished']}" + (f" of {first['runs']}" if first["finished"] != first["runs"] else "")]
        for key, _, scale, digits in shown:
            row = by[v.label, key]
            cells.append(_mean_text(row, scale, digits))
            if baseline is not None:
                cells.append("—" if v is baseline else delta_text(_difference(row), _signed(scale, digits)))
        body.append(cells)
    return PaperTable(header, body, _notes(variants, baseline))


def _signed(scale: float, digits: int) -> Callable[[float], str]:
    return lambda x: f"{x * scale:+.{digits}f}"


def _mean_text(row: dict, scale: float, digits: int) -> str:
    if row["mean"] is None:
        return "—"
    spread = "" if row["stderr"] is None else f" ± {row['stderr'] * scale:.{digits}f}"
    return f"{row['mean'] * scale:.{digits}f}{spread}"


def _difference(row: dict) -> PairedDifference:
    """The paired difference a summary row holds (``analysis.paired._baseline_fields``), read back."""
    lo, hi = row["diff_ci95_lo"], row["diff_ci95_hi"]
    ci = None if lo is None or hi is None else (lo, hi)
    return PairedDifference(row["pairs"] or 0, row["diff_mean"], ci, row["significant"], bool(row["degenerate"]))


def _notes(variants: list[Variant], baseline: Variant | None) -> list[str]:
    notes = [
        "Mean ± standard error (sample standard deviation / √n) over the n finished runs (seeds) of each variant, "
        "in the units of the headers."
    ]
    if baseline is not None:
        notes.append(
            f"Δ: the variant minus {baseline.shown}, paired by seed over the seeds both finished: mean [95% CI of the "
            "paired t test] (pairs); n.s.: the interval covers 0; degenerate (zero spread): every pair differs by the "
            "same amount, no interval."
        )
    return notes + [f"{name}: {keys}" for name, keys in named_keys(variants)]


def markdown(table: PaperTable) -> str:
    """``table`` as a GitHub Markdown pipe table (first column left-aligned, the others right), then its notes."""
    line = lambda cells: "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    rule = "|:---|" + "---:|" * (len(table.header) - 1)
    notes = "".join(f"\n{note}\n" for note in table.notes)
    return "\n".join([line(table.header), rule, *map(line, table.rows)]) + "\n" + notes


def latex_text(text: str) -> str:
    """``text`` for LaTeX's text mode: its special characters escaped (``_`` -> ``\\_``, ``%`` -> ``\\%``), ``±`` as
    ``$\\pm$``, ``Δ`` as ``$\\Delta$``, a minus before a digit as ``$-$`` (``[-2.85`` -> ``[$-$2.85``)."""
    escaped = "".join(_LATEX.get(c, c) for c in text)
    return re.sub(r"(?<![\w.])-(?=\d)", "$-$", escaped)


def latex(table: PaperTable) -> str:
    """``table`` as a LaTeX ``tabular`` (needs ``\\usepackage{booktabs}``), its notes as ``%`` comments above it."""
    line = lambda cells: " & ".join(map(latex_text, cells)) + r" \\"
    comments = [r"% needs \usepackage{booktabs}", *(f"% {note}" for note in table.notes)]
    spec = "l" + "r" * (len(table.header) - 1)
    body = [rf"\begin{{tabular}}{{{spec}}}", r"\toprule", line(table.header), r"\midrule", *map(line, table.rows)]
    return "\n".join([*comments, *body, r"\bottomrule", r"\end{tabular}"]) + "\n"


def write_tables(out: Path, table: PaperTable) -> list[Path]:
    """Write ``out/table.md`` and ``out/table.tex`` (UTF-8); returns their paths."""
    paths = [out / TABLE_FILES["md"], out / TABLE_FILES["latex"]]
    for path, text in zip(paths, (markdown(table), latex(table)), strict=True):
        path.write_text(text, encoding="utf-8")
    return paths
