"""A local dashboard for a sweep: one self-contained HTML page plus PNGs, offline.

    python -m scripts.report SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--baseline VARIANT]    # from the repository root

Reads every run directory (``config.yaml`` + ``metrics.jsonl``, optionally ``status.json``) under the
given directories (a Hydra multirun dir, a single run dir, or several) and writes into ``--out``
(default ``<first dir>/report/``):

- ``index.html``: training loss, validation loss and the validation metric the runs' task leads with (its spec,
  ``task.json``: PER for G2P, BLEU for translation; ``runlog/tasks.py``; runs of several tasks are an error) vs step
  (a thin line per run; per variant the mean over seeds with a min-max band, drawn only where every
  seed has a value; an ``x`` where a run diverged), residual RMS and gradient norm vs depth, and
  summary tables per run and per variant (mean ± stderr (n) over finished runs; see docs/sweeps.md), a column with
  nothing to read left out and named. With a baseline, ``--baseline VARIANT`` (a label as the variants table shows it,
  or the norm preset its runs used: ``pre_ln``; ``analysis/presets.py``) or by default the variant of the default
  preset pre_ln when exactly one used it (``--baseline none``: none), each test metric and best valid loss gets a column
  "Δ vs VARIANT": the paired difference over the seeds both finished, with its 95% CI (paired t test; ``n.s.`` when
  it covers 0; ``degenerate (zero spread)`` when every pair differs by the same amount), under a line giving the
  method and the baseline's noise floor (``analysis/paired.py``); the variants table gives each variant's parameters
  (status.json's ``params``) and, with a baseline, their ratio to the baseline's (``1.266 (+26.6 %)``), as does the
  LR-sensitivity table for LR families. When every run ends at a test WER of 90 % or more,
  a line says they are far from trained.
  plotly.js is embedded: the page works offline. Once every chart has drawn, ``<body data-plots-drawn>``
  equals ``data-plots-expected``; JavaScript errors (uncaught, rejected promises, ``console.error``)
  are counted in ``<html data-js-errors>``.
- one PNG per chart (``loss.png``, ``val_loss.png``, ``val_<metric>.png`` (``val_per.png``), ``rms_vs_depth.png``,
  ``grad_vs_depth.png``), and those of the stability charts that have data (``analysis/stability.py``):
  ``attn_max_logit_<j>.png`` and ``sigma_max_vs_depth_<j>.png`` for the j-th variant, ``out_logz.png``,
  ``kurtosis_vs_depth.png``; with hyper-connections (``norm.hc``), ``hc_gain_<j>.png`` and ``hc_gains.csv``, their
  composite residual gain (``analysis/hyper_connections.py``).
- ``summary.csv``, always: one row per (variant, metric) with counts, n, mean, stderr, std, and with a baseline
  the paired difference and its CI, then ``params``, ``hc_params`` (the variant's parameter counts) and with a baseline
  ``params_ratio``, unformatted (columns: docs/sweeps.md, "Seed statistics and --baseline").
- ``runs.csv``, always: the per-run table unformatted, one row per run under its variant's label (the values behind
  the seed statistics: PER/WER as fractions, losses in nats), its last columns ``params`` and ``hc_params``.
- ``curves.csv``, always: the loss and validation charts' data, one row per run and step: ``variant, run, step,
  train/loss, val/loss, val/<metric>...`` (``scripts.report_tables.write_curves``).
- ``depth_profile.csv`` and ``depth_growth.csv``, when a run recorded block telemetry (``analysis/depth.py``): every run's
  residual RMS, gradient norm and kurtosis per (step, block), and per variant each stack's growth (the residual
  stream's RMS at its last block / its first, read before a block's closing norm where it has one) at the first and
  last telemetry record, mean ± stderr over seeds, shown as a table under the depth charts (columns: docs/sweeps.md,
  "Depth CSVs").
- with an LR axis (a family of runs differing only in seed and ``optim.lr`` at two or more LRs), the LR
  sensitivity (Wortsman et al. 2023; ``analysis/lrs.py``, docs/sweeps.md): a table after the variant table,
  the charts that have data (``analysis/lr_panels.py``: ``lr_loss.png``, ``lrs.png``,
  ``attn_max_logit_lr_<j>.png`` for the j-th highest LR), and ``lr_sensitivity.csv`` (per family, seed and
  LR), ``lrs.csv`` (per family) and ``lrs_seeds.csv`` (per family and seed) (``scripts/report_lrs.py``).

A run with ``probe/*.png`` (``python -m scripts.probe RUN_DIR``) gets a "Probes" section showing them.

Runs whose configs differ only in the seed form a variant (see ``analysis/variants.py``). Diverged,
crashed or half-written runs are listed and marked, never fatal; an unknown ``--baseline`` is an error
(``report: error: ...`` listing the valid labels, exit status 1). Reading, grouping, statistics and the
charts' data live in the ``analysis`` package; ``scripts/report_figures.py`` draws the charts,
``scripts/report_tables.py`` the tables and their CSVs, this script the page.
"""

import sys
from pathlib import Path

if not __package__:  # run as a file (python scripts/x.py): it answers with the module command
    import _as_module  # noqa: F401

import argparse
import base64
import html

from tqdm import tqdm

from analysis.depth import write_depth_csvs
from analysis.hyper_connections import hc_gain_panels, write_hc_gains
from analysis.load import ReportError, load_runs, runs_task
from analysis.lr_panels import lr_panels
from analysis.lrs import lr_study
from analysis.paired import (
    find_baseline,
    summary_rows,
)
from analysis.panels import build_panels
from analysis.presets import resolve_baseline
from analysis.runs import Run
from analysis.stability import stability_panels
from analysis.variants import Variant, group_variants
from scripts.report_figures import figure_html, plotly_figure, save_png, variant_colors
from scripts.report_lrs import lrs_columns, lrs_note, write_csvs
from scripts.report_tables import growth_html, run_columns, table_html, variants_html, write_curves, write_runs, write_summary

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
        "step (mean ± stderr band) and block-output kurtosis vs depth at the last record, one line per variant. "
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
        images = "".join(f'<img class="probe" alt="{html.escape(p.stem)}" '
                         f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">' for p in pngs)  # fmt: skip
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
    """Read every run under ``dirs`` and write ``out/index.html``, the PNGs, ``summary.csv`` and the depth CSVs (see the module
    docstring); the variants table compares each variant to ``baseline`` (a variant's or LR family's label, or a norm
    preset's name: ``analysis.presets.resolve_baseline``); None: to the variant of the default preset (pre_ln) when
    exactly one used it; ``"none"``: to none.

    Returns:
        the path of index.html.

    Raises:
        ReportError: a path in ``dirs`` is not a directory, no run directory was found, or ``baseline`` names no
            variant, family or preset some variant used.
    """
    runs = load_runs(dirs, progress=lambda items: tqdm(items, desc="report: reading runs", unit="run", file=sys.stderr))
    variants = group_variants(runs)
    task = runs_task(runs)
    study = lr_study(runs)  # None without an LR axis
    label, by_default = resolve_baseline(baseline, variants, study.families if study else [])
    family_baseline = study.family(label) if study else None  # --baseline FAMILY: compare LR sensitivities
    compared_to = find_baseline(variants, label, [f.label for f in study.families] if study else [])
    colors = variant_colors(variants) | variant_colors(study.families if study else [])
    panels = build_panels(variants, task) + stability_panels(variants) + hc_gain_panels(variants) + lr_panels(study)
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
    write_summary(out / "summary.csv", summary_rows(variants, task, compared_to), compared_to is not None)
    write_runs(out / "runs.csv", variants, run_columns(task))
    write_curves(out / "curves.csv", variants, task)
    write_hc_gains(variants, out)
    after = {[p.key for p in panels].index("grad_vs_depth"): growth_html(write_depth_csvs(variants, out))}
    path = out / "index.html"
    path.write_text(page_html(title, header_html(dirs, runs, variants, pngs), plots, tables, after), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 with ``report: error: ...`` on bad input)."""
    parser = argparse.ArgumentParser(prog="report", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="SWEEP_DIR", help="sweep dir(s), run dir(s), or folders of them")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first dir>/report)")
    parser.add_argument("--baseline", metavar="VARIANT", default=None,
                        help="a variant label as the variants table shows it (or an LR family's, as the LR-sensitivity "
                             "table shows it), or the norm preset its runs used (pre_ln, norm=pre_ln): compare each "
                             "variant (family's LRS) to it by seed; default: the variant of the default preset pre_ln "
                             "when there is one; none: no comparison")  # fmt: skip
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else args.dirs[0] / "report"
    try:
        path = build_report(args.dirs, out, args.baseline)
    except ReportError as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 1
    print(f"report: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
