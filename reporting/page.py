"""The report page of ``python -m scripts.report``: the run tables, charts and probes of one or more sweeps as one
self-contained HTML page with its PNGs and CSVs (what each file holds: the script's docstring)."""

import base64
import html
import sys
from pathlib import Path

from tqdm import tqdm

from analysis.depth import write_depth_csvs
from analysis.hyper_connections import hc_gain_panels, write_hc_gains
from analysis.load import load_runs, runs_task
from analysis.lr_panels import lr_panels
from analysis.lrs import lr_study
from analysis.names import name_variants
from analysis.paired import (
    find_baseline,
    summary_rows,
)
from analysis.panels import build_panels
from analysis.presets import resolve_baseline
from analysis.runs import Run
from analysis.scales import scale_panels, write_scales
from analysis.stability import stability_panels
from analysis.variants import Variant, group_variants
from reporting.figures import figure_html, plotly_figure, save_png, variant_colors
from reporting.lrs import lrs_columns, lrs_note, write_csvs
from reporting.paper import paper_table, write_tables
from reporting.tables import growth_html, run_columns, table_html, variants_html, write_curves, write_runs, write_summary

ERRORS_JS = """window.reportErrors = [];
function reportError(message) {
  window.reportErrors.push(String(message));
  document.documentElement.dataset.jsErrors = String(window.reportErrors.length);
  document.documentElement.dataset.jsFirstError = window.reportErrors[0];
}
window.addEventListener('error', function (e) { reportError(e.message); });
window.addEventListener('unhandledrejection', function (e) { reportError('unhandled rejection: ' + e.reason); });
var consoleError = console.error;
console.error = function () {
  reportError(Array.prototype.join.call(arguments, ' '));
  consoleError.apply(console, arguments);
};"""
CSS = """body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin-bottom: 2em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; } td.text { text-align: left; max-width: 32em; overflow-wrap: normal; word-break: normal; }
tr.diverged, tr.failed { background: #fde2e2; } tr.unknown, tr.interrupted, tr.running { background: #f4f4f4; color: #555; }
.plot { height: 460px; margin-bottom: 1em; } .note { color: #666; font-size: 0.9em; }
img.probe { max-width: 32%; margin-right: 1%; }"""


def page_html(title: str, header: str, plots: list[str], tables: list[tuple[str, str]], after: dict[int, str]) -> str:
    """The whole page: ``plots`` are the figure divs (the first embeds plotly.js), ``tables`` (heading, html), ``after``
    plot index -> html placed under that plot."""
    plot_divs = "\n".join(f'<div class="plot">{p}</div>{after.get(i, "")}' for i, p in enumerate(plots))
    table_divs = "\n".join(f"<h2>{html.escape(h)}</h2>\n{t}" for h, t in tables)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<script>{ERRORS_JS}</script>
<style>{CSS}</style>
</head>
<body data-plots-expected="{len(plots)}" data-plots-drawn="0">
<h1>{html.escape(title)}</h1>
{header}
{table_divs}
<h2>Charts</h2>
{plot_divs}
</body>
</html>
"""


def header_html(dirs: list[Path], runs: list[Run], variants: list[Variant], pngs: list[Path]) -> str:
    """The lines under the title: inputs, counts, how to read the charts, links to the PNGs."""
    n_div = sum(r.diverged for r in runs)
    links = " ".join(f'<a href="{html.escape(p.name)}">{html.escape(p.name)}</a>' for p in pngs)
    return (
        f"<p>{len(runs)} runs in {len(variants)} variants ({n_div} diverged) from "
        f"{html.escape(', '.join(str(d) for d in dirs))}.</p>\n"
        '<p class="note">Variants: runs whose configs differ only in the seed. Curves: thin lines are single runs, '
        "thick lines the mean over the variant's runs with a min-max band, drawn only at steps where every one of "
        "them has a finite value (hover: n = k of N); × marks a diverged run's last finite value (hover: its "
        "divergence step); a lone point gets a dot. Depth: encoder blocks, then decoder blocks; values are means over "
        "the variant's runs recorded at that step. Stability charts (where telemetry recorded them): per variant, "
        "attention max logit vs step (one line per attention, shallow blocks dark, deep ones light; cross-attention "
        "dashed) and spectral norm vs depth (one line per matrix) at its last record; log Z of the output logits vs "
        "step (mean ± stderr band); block-output kurtosis, massive activations (max |x| / median |x|) and the "
        "self-attention sink (share on the first key) vs depth at the last record, one line per variant. "
        "Variant table: means over finished runs only, "
        "± the standard error of the mean (sample std / √n), n the runs averaged.</p>\n"
        f'<p class="note">PNGs: {links}</p>'
    )


def probes_html(runs: list[Run]) -> str:
    """The PNGs ``python -m scripts.probe`` wrote into each run's ``probe/`` (embedded, so the page stays
    self-contained), one heading per run that has them; "" when none has."""
    parts = []
    for run in runs:
        pngs = sorted((run.path / "probe").glob("*.png"))
        images = "".join(
            f'<img class="probe" alt="{html.escape(p.stem)}" '
            f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
            for p in pngs
        )
        if images:
            parts.append(f'<h3 data-probe-run="{html.escape(run.label)}">{html.escape(run.label)}</h3>\n{images}')
    if not parts:
        return ""
    note = (
        '<p class="note">python -m scripts.probe RUN_DIR: layer drop, angular distance, output change at init '
        '(docs/telemetry.md, "Probes").</p>'
    )
    return "\n".join([note, *parts])


def run_state(run: Run) -> str:
    """The class of a run's row in the runs table: ``diverged``, else its state (``finished``, ``failed``, ...)."""
    return "diverged" if run.diverged else run.status_state


def build_report(dirs: list[Path], out: Path, baseline: str | None = None) -> Path:
    """Read every run under ``dirs`` and write ``out/index.html``, the PNGs, ``summary.csv``, ``table.md``, ``table.tex``
    and the depth CSVs (see the module docstring); the variants table compares each variant to ``baseline`` (a
    variant's or LR family's label, a variant's name as the page shows it, or a norm preset's name:
    ``analysis.presets.resolve_baseline``); None: to the variant of the default preset (pre_ln) when exactly one used
    it; ``"none"``: to none.

    Returns:
        the path of index.html.

    Raises:
        ReportError: a path in ``dirs`` is not a directory, no run directory was found, or ``baseline`` names no
            variant, family or preset some variant used.
    """
    runs = load_runs(dirs, progress=lambda items: tqdm(items, desc="report: reading runs", unit="run", file=sys.stderr))
    variants = group_variants(runs)
    name_variants(variants)  # pre_bn, pre_ln optim.lr=0.002: before the baseline, which may be named so
    task = runs_task(runs)
    study = lr_study(runs)  # None without an LR axis
    label, by_default = resolve_baseline(baseline, variants, study.families if study else [])
    family_baseline = study.family(label) if study else None  # --baseline FAMILY: compare LR sensitivities
    compared_to = find_baseline(variants, label, [f.label for f in study.families] if study else [])
    colors = variant_colors(variants) | variant_colors(study.families if study else [])
    panels = build_panels(variants, task) + scale_panels(variants) + stability_panels(variants) + hc_gain_panels(variants)
    panels += lr_panels(study)
    out.mkdir(parents=True, exist_ok=True)
    pngs = [save_png(p, colors, out) for p in panels]
    plots = [figure_html(plotly_figure(p, colors), f"plot-{p.key}", include_plotlyjs=(i == 0)) for i, p in enumerate(panels)]
    ordered = [r for v in variants for r in v.runs]
    tables = [
        ("Variants", variants_html(variants, task, compared_to, by_default)),
        ("Runs", table_html(run_columns(task), ordered, "data-run", run_state, hide=True)),
    ]
    if probes := probes_html(ordered):
        tables.append(("Probes", probes))
    if study:
        counted = any(r.params is not None for r in runs)  # runs written before the count: no parameter columns
        lrs_table = table_html(lrs_columns(family_baseline, counted), study.families, "data-family", lambda f: "")
        tables.insert(1, ("LR sensitivity", lrs_note(study) + lrs_table))  # after the variants: a summary of them
        write_csvs(study, out, family_baseline)
    title = f"normlab report: {dirs[0].resolve().name}" + (f" (+{len(dirs) - 1})" if len(dirs) > 1 else "")
    rows = summary_rows(variants, task, compared_to)
    write_summary(out / "summary.csv", rows, compared_to is not None)
    write_tables(out, paper_table(variants, rows, task, compared_to))
    write_runs(out / "runs.csv", variants, run_columns(task))
    write_curves(out / "curves.csv", variants, task)
    write_hc_gains(variants, out)
    write_scales(variants, out)
    growth = growth_html(write_depth_csvs(variants, out), {v.label: v.shown for v in variants})
    after = {[p.key for p in panels].index("grad_vs_depth"): growth}
    path = out / "index.html"
    path.write_text(page_html(title, header_html(dirs, runs, variants, pngs), plots, tables, after), encoding="utf-8")
    return path
