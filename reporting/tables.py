"""The report's tables (``scripts/report.py``): the per-run and per-variant tables with their notes (paired
differences to a baseline, untrained runs), the depth-growth table, and the CSVs behind them (``summary.csv``,
``runs.csv``); every cell carries its unformatted value in ``data-value``."""

import html
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analysis.csvs import write_csv
from analysis.depth import STEP_KINDS
from analysis.lrs import Family
from analysis.names import named_keys
from analysis.paired import (
    BASELINE_COLUMNS,
    NAME_COLUMNS,
    PARAMS_BASELINE_COLUMNS,
    PARAMS_COLUMNS,
    SUMMARY_COLUMNS,
    Getter,
    delta_text,
    finished_values,
    noise_floor,
    quality_metrics,
    versus,
)
from analysis.params import params_ratio, ratio_text, shared_count
from analysis.presets import shown_label
from analysis.runs import Run
from analysis.stats import mean_stderr
from analysis.variants import Variant, readable_label
from runlog.metric_names import STACKS
from runlog.tasks import MetricSpec, TaskSpec
from training.spikes import SERIES


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _fmt_rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _fmt_count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def _fmt_pct(value: float | None) -> str:
    return _fmt(None if value is None else 100 * value, 2)


SPIKE_HEADERS = {"loss": "loss spike score (%)", "grad_norm": "grad norm spike score (%)"}  # one per training.spikes.SERIES


def _diverged_text(run: Run) -> str:
    if not run.diverged:
        return "no"
    return "yes" if run.diverged_at is None else f"yes (step {run.diverged_at})"


# A column: (key, header, cell) where cell(run or variant) -> (raw value for data-value, shown text).
Column = tuple[str, str, Callable]


def run_columns(task: TaskSpec) -> list[Column]:
    """The per-run table's columns for ``task`` (its test metrics as its spec shows them: PER/WER in %, BLEU/chrF)."""

    def metric_col(m: MetricSpec) -> Column:
        key = f"test/{m.key}"
        return key, m.header, lambda r: (v := r.final(key), _fmt(None if v is None else v * m.scale, m.digits))

    return [
        ("run", "run", lambda r: (r.label, r.label)),
        ("seed", "seed", lambda r: (r.seed, "—" if r.seed is None else str(r.seed))),
        ("state", "state", lambda r: (r.status_state, r.status_state)),
        ("diverged", "diverged", lambda r: (r.diverged, _diverged_text(r))),
        ("step", "step", lambda r: (r.last_step, f"{r.last_step if r.last_step is not None else '—'} / {r.max_steps or '?'}")),
        *(metric_col(m) for m in task.metrics),
        ("best_val_loss", "best valid loss", lambda r: (v := r.best("val/loss"), _fmt(v))),
        *((f"spike_score_{s}", SPIKE_HEADERS[s], lambda r, s=s: (v := r.spike_score(s), _fmt_pct(v))) for s in SERIES),
        ("wall_s", "wall time", lambda r: (r.wall_s, _fmt_time(r.wall_s))),
        ("tokens_per_s", "tokens/s", lambda r: (r.tokens_per_s, _fmt_rate(r.tokens_per_s))),
        ("notes", "notes", lambda r: ("; ".join(r.notes), "; ".join(r.notes))),
        ("params", "parameters", lambda r: (r.params, _fmt_count(r.params))),  # after notes: runs.csv's older columns first
        ("hc_params", "hyper-connection parameters", lambda r: (r.hc_params, _fmt_count(r.hc_params))),
    ]


def metric_display(task: TaskSpec) -> dict[str, tuple[str, float, int]]:
    """key -> (header, scale, digits) of each metric the variants table compares (``analysis.paired.quality_metrics``):
    the task's test metrics as its spec shows them (PER/WER in %, BLEU, chrF), best valid loss."""
    return {
        **{f"test/{m.key}": (m.header, m.scale, m.digits) for m in task.metrics},
        "best_val_loss": ("best valid loss", 1.0, 3),
    }


def variant_columns(task: TaskSpec, baseline: Variant | None = None) -> list[Column]:
    """The per-variant table's columns: how many runs finished and diverged, then for each metric its
    mean ± stderr (n) over the variant's finished runs that have it (:func:`mean_stderr`). With ``baseline``,
    each test metric and best valid loss is followed by its difference to the baseline (:func:`delta_column`)."""
    metrics = quality_metrics(task)

    def mean_col(key: str, header: str, get: Getter, fmt: Callable[[float | None], str]) -> Column:
        def cell(v: Variant) -> tuple:
            values = finished_values(v.runs, get)
            mean, stderr = mean_stderr(values)
            spread = "" if stderr is None else f" ± {fmt(stderr)}"
            return mean, f"{fmt(mean)}{spread} (n = {len(values)})"

        return key, f"{header}: mean ± stderr (n)", cell

    def count_col(key: str, test: Callable[[Run], bool]) -> Column:
        return key, key, lambda v: (k := sum(map(test, v.runs)), f"{k} of {len(v.runs)}")

    def compared_cols(key: str, header: str, scale: float, digits: int) -> list[Column]:
        shown = lambda x: _fmt(None if x is None else x * scale, digits)
        signed = lambda x: f"{x * scale:+.{digits}f}"
        cols = [mean_col(key, header, metrics[key], shown)]
        if baseline is not None:
            cols.append(delta_column(key, header, metrics[key], baseline, signed))
        return cols

    return [
        ("variant", "variant", lambda v: (v.label, v.shown, readable_label(v))),
        count_col("finished", lambda r: r.finished),
        count_col("diverged", lambda r: r.diverged),
        *params_columns(baseline),
        *(col for key, shown in metric_display(task).items() for col in compared_cols(key, *shown)),
        *(mean_col(f"spike_score_{s}", SPIKE_HEADERS[s], _spike_score(s), _fmt_pct) for s in SERIES),
        mean_col("wall_s", "wall time", lambda r: r.wall_s, _fmt_time),
        mean_col("tokens_per_s", "tokens/s", lambda r: r.tokens_per_s, _fmt_rate),
    ]


def _spike_score(series: str) -> Getter:
    return lambda run: run.spike_score(series)


def params_columns(baseline: Variant | Family | None = None) -> list[Column]:
    """The parameter columns of the variants and LR-sensitivity tables, for items with ``runs`` and ``label`` (a
    variant, an LR family): ``params``, the count its runs recorded (``analysis.params.shared_count``), and with
    ``baseline`` (such an item) ``params:ratio``, the count over the baseline's as ``1.266 (+26.6 %)``, empty in the
    baseline's row. Both empty (and left out of the table) for runs written before the count was recorded."""
    count = ("params", "parameters", lambda v: (n := shared_count(v.runs), _fmt_count(n)))
    if baseline is None:
        return [count]

    def ratio(v: Variant | Family) -> tuple:
        value = None if v is baseline else params_ratio(v.runs, baseline.runs)
        return value, "" if v is baseline else ratio_text(value)

    return [count, ("params:ratio", f"parameters vs {display_name(baseline)}: ratio (Δ %)", ratio)]


def display_name(group: Variant | Family) -> str:
    """A variant's name on the page (``Variant.shown``: ``pre_ln``), an LR family's label (``null``, not None)."""
    return group.shown if isinstance(group, Variant) else shown_label(group.label)


def delta_column(key: str, header: str, get: Getter, baseline: Variant, signed: Callable[[float], str]) -> Column:
    """The column ``<key>:delta``: each variant − ``baseline`` in the metric, paired by seed (``analysis.paired.versus``),
    as ``mean [95% CI] (pairs)`` in the metric's display units (``signed``), ``n.s.`` when the interval covers 0,
    ``degenerate (zero spread)`` (no interval, not significant) when every pair differs by the same amount;
    no interval with one pair, ``— (0)`` with none, empty in the baseline's row. data-value: the mean difference as stored."""

    def cell(v: Variant) -> tuple:
        diff = versus(v, baseline, get)
        return (None, "") if diff is None else (diff.mean, delta_text(diff, signed))

    return f"{key}:delta", f"{header} Δ vs {baseline.shown}: mean [95% CI] (pairs)", cell


def variants_html(variants: list[Variant], task: TaskSpec, baseline: Variant | None, by_default: bool = False) -> str:
    """The variants table, under a note pointing to summary.csv and, with ``baseline``, the method of the Δ columns,
    the baseline (``by_default``: chosen as the default preset's variant) and its noise floor per metric; without,
    a note saying how to get paired differences. First, when every run is far from trained, a note saying so."""
    csv_link = '<a href="summary.csv">summary.csv</a>'
    notes = [f'<p class="note">Test metrics and best valid loss, unformatted, one row per variant and metric: {csv_link}.</p>']
    notes.insert(0, baseline_note(baseline, task, by_default) if baseline is not None else NO_BASELINE_NOTE)
    if untrained := untrained_note([r for v in variants for r in v.runs], task):
        notes.insert(0, untrained)
    table = table_html(variant_columns(task, baseline), variants, "data-variant", lambda v: "", hide=True)
    return "\n".join([*notes, table, names_note(variants)])


def names_note(variants: list[Variant]) -> str:
    """The note under the variants table giving each short name's keys (``analysis.names.named_keys``: ``pre_bn``:
    ``norm.kind=batchnorm norm.blocks=[{kind: layernorm, stack: dec}]``); "" when every variant shows its keys."""
    if not (named := named_keys(variants)):
        return ""
    items = "; ".join(f"<b>{html.escape(name)}</b>: {_cell_text(keys)}" for name, keys in named)
    return (
        '<p class="note" data-names>Names: a variant whose runs all used one norm preset (conf/norm/) is named by it, '
        f"then by the other keys that set it apart; hover a name for its keys. {items}.</p>"
    )


NO_BASELINE_NOTE = (
    '<p class="note" data-baseline="">Is a difference real? <code>--baseline VARIANT</code> (a label as the table '
    "shows it) or <code>--baseline PRESET</code> (the norm preset its runs used, e.g. <code>--baseline pre_ln</code>) "
    "adds to each metric the paired difference to that variant over the seeds both finished, with its 95% CI. Without "
    "--baseline the report compares to the variant that used the default preset (pre_ln) when there is exactly one.</p>"
)
UNTRAINED_WER = 0.9  # a test WER at or above it: at most 1 word in 10 spelled right (trained G2P models: ~25 %)


def untrained_note(runs: list[Run], task: TaskSpec) -> str:
    """A note when every run with a test WER (G2P) has one of at least ``UNTRAINED_WER``: the runs are far from trained
    (an untrained model is at 100 %, a trained one near 25 %, Bisani & Ney 2008), so the page shows early-training
    differences only; "" otherwise, and for translation runs."""
    wers = [w for r in runs if (w := r.final("test/wer")) is not None] if task.name == "g2p" else []
    if not wers or min(wers) < UNTRAINED_WER:
        return ""
    return (
        f'<p class="note" data-untrained="{min(wers)!r}"><b>Every run is far from trained</b> (test WER ≥ '
        f"{100 * UNTRAINED_WER:.0f} %, the lowest {100 * min(wers):.2f} %; a trained G2P model is near 25 %): "
        "differences are early-training differences only.</p>"
    )


def baseline_note(baseline: Variant, task: TaskSpec, by_default: bool = False) -> str:
    """The line above the variants table with a baseline: the baseline (``by_default``: say it is the default one),
    method, noise floor per metric."""
    metrics = quality_metrics(task)
    floors = ", ".join(
        f"{header} {_fmt(None if (sd := noise_floor(baseline, metrics[key])) is None else sd * scale, digits)}"
        for key, (header, scale, digits) in metric_display(task).items()
    )
    label, shown = html.escape(baseline.label), html.escape(baseline.shown)
    chosen = f"baseline: <b>{shown}</b> (default; --baseline to change). " if by_default else ""
    return (
        f'<p class="note" data-baseline="{label}">{chosen}Δ vs <b>{shown}</b> (the baseline): each variant minus the baseline, '
        "paired by seed over the seeds where both runs finished: mean [95% confidence interval] (pairs), the interval "
        "mean ± t(0.975, n − 1) · sd / √n of a paired t test over the n per-seed differences; n.s.: the interval "
        "covers 0; degenerate (zero spread): every pair differs by the same amount, so sd = 0 and there is no interval "
        "and no significance; one pair: no interval. Diverged runs never enter a pair or a mean: they are counted in the "
        f"diverged column. Noise floor, the baseline's seed-to-seed sample standard deviation: {floors}.</p>"
    )


def write_summary(path: Path, rows: list[dict[str, object]], with_baseline: bool) -> None:
    """``summary.csv``: ``rows`` of ``analysis.paired.summary_rows`` under ``SUMMARY_COLUMNS`` (+ ``BASELINE_COLUMNS``
    ``with_baseline``), then ``PARAMS_COLUMNS`` (+ ``PARAMS_BASELINE_COLUMNS``), then ``NAME_COLUMNS``: older columns
    first, so committed files' columns keep their places; floats as repr, None and non-finite empty, booleans
    ``true``/``false``."""
    compared = BASELINE_COLUMNS if with_baseline else ()
    columns = SUMMARY_COLUMNS + compared + PARAMS_COLUMNS + (PARAMS_BASELINE_COLUMNS if with_baseline else ()) + NAME_COLUMNS
    cells = ([str(v).lower() if isinstance(v, bool) else _raw(v) for v in (row[c] for c in columns)] for row in rows)
    write_csv(path, columns, cells)


def write_runs(path: Path, variants: list, columns: list[Column]) -> None:
    """``runs.csv``: the per-run table's unformatted values (``data-value``), one row per run, after a ``variant`` column
    (the label its run is averaged under); floats as repr, None and non-finite empty."""
    rows = ([v.label, *(_raw(cell(r)[0]) for _, _, cell in columns)] for v in variants for r in v.runs)
    write_csv(path, ["variant", *(key for key, _, _ in columns)], rows)


def write_curves(path: Path, variants: list[Variant], task: TaskSpec) -> None:
    """``curves.csv``: the data of the loss and validation charts, one row per run and step at which it logged any of
    ``train/loss``, ``val/loss`` and ``task``'s ``val/<metric>`` (columns in that order, after ``variant, run,
    step``; PER/WER as fractions, losses in nats; empty: not logged at that step, or non-finite)."""
    metrics = ["train/loss", "val/loss", *(f"val/{m.key}" for m in task.metrics)]
    rows = []
    for variant in variants:
        for run in variant.runs:
            at = {m: dict(run.series.get(m, [])) for m in metrics}
            for step in sorted({s for series in at.values() for s in series}):
                rows.append([variant.label, run.label, step, *(_raw(at[m].get(step)) for m in metrics)])
    write_csv(path, ["variant", "run", "step", *metrics], rows)


def growth_html(rows: list[dict[str, Any]], names: dict[str, str] | None = None) -> str:
    """The depth-growth table under the depth charts: per variant (``data-growth``, its label), each stack's growth at
    its first and last telemetry record (``data-col`` ``enc:first``, ..., ``data-value`` the mean) as ``mean ± stderr
    (n = k, step s)``, under a note defining it and linking the two CSVs; "" without rows (no telemetry). ``names``:
    label -> the variant's name shown in its first column (default: the label)."""
    if not rows:
        return ""
    by_key = {(r["variant"], r["stack"], r["step_kind"]): r for r in rows}

    def column(stack: str, kind: str) -> Column:
        def cell(variant: str) -> tuple:
            r = by_key[variant, stack, kind]
            spread = "" if r["stderr"] is None else f" ± {_fmt(r['stderr'])}"
            return r["mean"], f"{_fmt(r['mean'])}{spread} (n = {r['n']}, step {r['step']})"

        return f"{stack}:{kind}", f"{stack} growth, {kind} record: mean ± stderr (n, step)", cell

    shown = names or {}
    columns = [("variant", "variant", lambda v: (v, shown.get(v, v))), *(column(s, k) for s in STACKS for k in STEP_KINDS)]
    note = (
        '<h3>Depth growth</h3>\n<p class="note">The RMS of the residual stream at a stack\'s last block / at its first '
        "block, read before the block's closing norm where its FFN has one (the sum entering it, "
        "<code>ffn.norm_out.in</code>) and leaving the block otherwise (<code>out</code>; the <code>site</code> column "
        "of the CSV), at the variant's first telemetry record (step 1 by default: at initialization) and its last, "
        'mean ± stderr over the runs recorded there (n). Per run: <a href="depth_growth.csv">depth_growth.csv</a>; '
        'every run, step and block: <a href="depth_profile.csv">depth_profile.csv</a>.</p>'
    )
    return note + table_html(columns, list(dict.fromkeys(r["variant"] for r in rows)), "data-growth", lambda v: "")


ZERO_HIDDEN = ("diverged", "did_not_learn", "hc_params", *(f"spike_score_{s}" for s in SERIES))  # columns hidden when all 0


def _hidden(key: str, values: list) -> bool:
    """Whether a column is left out of its table: every value empty, or for a column of ``ZERO_HIDDEN`` every value 0
    (no run diverged, no spike): nothing to read in it. A Δ column (``:delta``) always stays: its cells say why
    there is no difference."""
    if key.endswith(":delta"):
        return False
    zero = (None, "", 0) if key in ZERO_HIDDEN else (None, "")
    return all(v in zero or (isinstance(v, float) and not math.isfinite(v)) for v in values)


def _cell_text(text: str) -> str:
    """A text cell's HTML: a null value spelled ``null`` (:func:`analysis.presets.shown_label`), and a line break
    allowed after each comma (``norm=pre_ln,seed=0``); labels wrap at spaces and commas, never mid-word."""
    return html.escape(shown_label(text)).replace(",", ",<wbr>")


def table_html(columns: list[Column], items: list, row_attr: str, row_class: Callable[[Any], str], hide: bool = False) -> str:
    """An HTML table, one row per item; each row carries ``data-<row_attr>`` (its first column's value) and each
    cell ``data-col`` and ``data-value`` (the unformatted value), so tests and scripts can read it back; a cell whose
    column gives a third item (value, text, title) shows it on hover (``title``) where it differs from the text. With
    ``hide``, columns after the first with nothing to read (:func:`_hidden`) are left out, named in a note above the
    table."""
    cells = [[(key, *cell(item)) for key, _, cell in columns] for item in items]
    kept = (j for j in range(1, len(columns)) if not (hide and _hidden(columns[j][0], [row[j][1] for row in cells])))
    shown = [0, *kept]
    head = "".join(f"<th>{html.escape(shown_label(columns[j][1]))}</th>" for j in shown)
    rows = []
    for item, row in zip(items, cells, strict=True):
        tds = "".join(
            f'<td data-col="{html.escape(key)}" data-value="{html.escape(_raw(value))}"{_title(text, *title)}'
            f"{' class=text' if isinstance(value, str) else ''}>"
            f"{_cell_text(text) if isinstance(value, str) else html.escape(text)}</td>"
            for key, value, text, *title in (row[j] for j in shown)
        )
        rows.append(f'<tr {row_attr}="{html.escape(str(row[0][1]))}" class="{row_class(item)}">{tds}</tr>')
    left_out = [columns[j] for j in range(len(columns)) if j not in shown]
    note = (
        f'<p class="note" data-hidden="{html.escape(",".join(k for k, _, _ in left_out))}">Columns left out, every value '
        f"0 or empty: {html.escape(', '.join(h for _, h, _ in left_out))}.</p>\n"
        if left_out and items
        else ""
    )
    return f"{note}<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _title(text: str, title: str = "") -> str:
    return f' title="{html.escape(title)}"' if title and title != text else ""


def _raw(value: object) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return repr(value) if isinstance(value, float) else str(value)
