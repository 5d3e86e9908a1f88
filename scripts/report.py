"""A local dashboard for a sweep: one self-contained HTML page plus PNGs, offline.

    python -m scripts.report SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--baseline VARIANT] [--table md|latex]  # from the root

Reads every run directory (``config.yaml`` + ``metrics.jsonl``, optionally ``status.json``) under the
given directories (a Hydra multirun dir, a single run dir, or several) and writes into ``--out``
(default ``<first dir>/report/``):

- ``index.html``: training loss, validation loss and the validation metric the runs' task leads with (its spec,
  ``task.json``: PER for G2P, BLEU for translation; ``runlog/tasks.py``; runs of several tasks are an error) vs step
  (a thin line per run; per variant the mean over seeds with a min-max band, drawn only where every
  seed has a value, leaving out a step only some seeds logged between steps all did (a resumed run's row at the
  step it was stopped at: ``analysis.stats.skipped_steps``); an ``x`` where a run diverged), residual RMS and
  gradient norm vs depth, and
  summary tables per run and per variant (mean ± stderr (n) over finished runs; see docs/sweeps.md), a column with
  nothing to read left out and named. A variant is named by the norm preset its runs used where they used one, then
  by its other differing keys (``pre_bn``, ``pre_ln optim.lr=0.002``), else by its label in YAML flow style
  (``analysis/names.py``), in the tables, the Δ headers and the charts' legends; hovering a name shows the keys, and a
  note under the variants table lists them. With a baseline, ``--baseline VARIANT`` (a name as the variants table
  shows it, a label as the CSVs hold it, or the norm preset its runs used: ``pre_ln``; ``analysis/presets.py``) or
  by default the variant of the default preset pre_ln when exactly one used it (``--baseline none``: none), each test
  metric and best valid loss gets a column "Δ vs VARIANT": the paired difference over the seeds both finished, with
  its 95% CI (paired t test; ``n.s.`` when it covers 0; ``degenerate (zero spread)`` when every pair differs by the
  same amount), under a line giving the method and the baseline's noise floor (``analysis/paired.py``); the variants
  table gives each variant's parameters (status.json's ``params``) and, with a baseline, their ratio to the
  baseline's (``1.266 (+26.6 %)``), as does the LR-sensitivity table for LR families. When every run ends at a test
  WER of 90 % or more, a line says they are far from trained.
  plotly.js is embedded: the page works offline. Once every chart has drawn, ``<body data-plots-drawn>``
  equals ``data-plots-expected``; JavaScript errors (uncaught, rejected promises, ``console.error``)
  are counted in ``<html data-js-errors>``.
- one PNG per chart (``loss.png``, ``val_loss.png``, ``val_<metric>.png`` (``val_per.png``), ``rms_vs_depth.png``,
  ``grad_vs_depth.png``), and those of the stability charts that have data (``analysis/stability.py``):
  ``attn_max_logit_<j>.png`` and ``sigma_max_vs_depth_<j>.png`` for the j-th variant, ``out_logz.png``,
  ``kurtosis_vs_depth.png``, ``massive_vs_depth.png``, ``sink_vs_depth.png``; with hyper-connections (``norm.hc``),
  ``hc_gain_<j>.png`` and ``hc_gains.csv``, their
  composite residual gain (``analysis/hyper_connections.py``).
- ``summary.csv``, always: one row per (variant, metric) with counts, n, mean, stderr, std, and with a baseline
  the paired difference and its CI, then ``params``, ``hc_params`` (the variant's parameter counts) and with a baseline
  ``params_ratio``, then ``name`` and ``preset`` (the variant's name, its norm preset), unformatted (columns:
  docs/sweeps.md, "Seed statistics and --baseline"); its ``variant`` column, like the other CSVs', holds the label.
- ``table.md`` and ``table.tex``, always: the table for a paper (``reporting/paper.py``), a row per variant by its
  name, per test metric and best valid loss mean ± stderr in the page's units (losses in nats) and, with a baseline,
  the paired difference with its 95% CI; ``--table md|latex`` also prints one to stdout (the ``wrote`` line then
  goes to stderr).
- ``runs.csv``, always: the per-run table unformatted, one row per run under its variant's label (the values behind
  the seed statistics: PER/WER as fractions, losses in nats), its last columns ``params`` and ``hc_params``.
- ``curves.csv``, always: the loss and validation charts' data, one row per run and step: ``variant, run, step,
  train/loss, val/loss, val/<metric>...`` (``reporting.tables.write_curves``).
- ``scale_heatmap_<j>.png`` and ``scales.csv``, when a run recorded block telemetry: the j-th variant's residual RMS
  per block over training as ``scripts/plot_scales.py`` draws one run's, each cell the mean over its seeds at the steps
  every one recorded, and the numbers: ``variant, step, depth, block, mean, stderr, n`` (``analysis/scales.py``).
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
charts' data live in the ``analysis`` package; ``reporting/figures.py`` draws the charts,
``reporting/tables.py`` the tables and their CSVs, ``reporting/page.py`` the page; this script reads the command line.
"""

import argparse
import sys
from pathlib import Path

from analysis.load import ReportError
from reporting.page import build_report
from reporting.paper import TABLE_FILES


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 with ``report: error: ...`` on bad input)."""
    parser = argparse.ArgumentParser(prog="report", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="SWEEP_DIR", help="sweep dir(s), run dir(s), or folders of them")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first dir>/report)")
    parser.add_argument(
        "--table",
        choices=list(TABLE_FILES),
        default=None,
        help="also print the table for a paper to stdout (md: table.md, latex: table.tex, both always written "
        "beside summary.csv); the 'wrote' line then goes to stderr",
    )
    parser.add_argument(
        "--baseline",
        metavar="VARIANT",
        default=None,
        help="a variant label as the variants table shows it (or an LR family's, as the LR-sensitivity "
        "table shows it), or the norm preset its runs used (pre_ln, norm=pre_ln): compare each "
        "variant (family's LRS) to it by seed; default: the variant of the default preset pre_ln "
        "when there is one; none: no comparison",
    )
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else args.dirs[0] / "report"
    try:
        path = build_report(args.dirs, out, args.baseline)
    except ReportError as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 1
    print(f"report: wrote {path}", file=sys.stderr if args.table else sys.stdout)
    if args.table:
        print((out / TABLE_FILES[args.table]).read_text(encoding="utf-8"), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
