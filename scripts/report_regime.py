"""DyT's data regime from a sweep of ``+experiment=dyt_data_regime`` (the numbers: :mod:`analysis.regime`).

    python -m scripts.report_regime SWEEP_DIR... [--out DIR] [--baseline pre_ln] [--step 100]

reads every run under the sweep dirs and writes, with the ``csv`` module, into ``--out`` (default: the first sweep
dir; made when missing; empty field: no value; floats at full precision):

- ``regime_runs.csv``: one row per run: ``preset, train_fraction, seed, state, final_val_loss`` (a finished run's
  last val/loss), ``saturation`` (the mean of its ``act/.../saturation`` at ``--step``; empty for unbounded norms);
- ``regime.csv``: one row per preset and fraction: ``preset, train_fraction, runs, n`` (finished), ``val_loss_mean,
  saturation_mean``, and against ``--baseline`` at the same fraction ``diff_mean, diff_ci95_lo, diff_ci95_hi, pairs,
  significant`` (paired t test over the seeds both finished) and ``rel_diff`` ((mean − baseline mean) / baseline
  mean over those seeds, a fraction; empty in the baseline's rows), and ``saturation_step`` (``--step``).

Prints the regime table. Exit status 2 with one line when no run is found, the baseline is not in the study or
``--out`` is a file.
"""

import argparse
import sys
from pathlib import Path

from analysis.csvs import output_dir, write_csv
from analysis.load import ReportError, load_runs
from analysis.regime import cells, regimes
from reporting.regime import REGIME_FIELDS, RUN_FIELDS, regime_row, summary_line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report_regime", description="DyT's data regime: val loss and saturation by fraction")
    parser.add_argument("dirs", nargs="+", type=Path, metavar="SWEEP_DIR")
    parser.add_argument("--out", type=Path, default=None, help="folder of the CSVs (default: the first SWEEP_DIR)")
    parser.add_argument("--baseline", default="pre_ln", help="the norm preset compared against (default pre_ln)")
    parser.add_argument("--step", type=int, default=100, help="the telemetry step of the saturation (default 100)")
    args = parser.parse_args(argv)
    try:
        found = cells(load_runs(args.dirs), args.step)
        rows = regimes(found, args.baseline)
        out = output_dir(args.out or args.dirs[0])
    except (ReportError, ValueError) as e:
        print(f"report_regime: error: {e}", file=sys.stderr)
        return 2
    found.sort(key=lambda c: (c.fraction, c.preset, str(c.seed)))
    write_csv(
        out / "regime_runs.csv", RUN_FIELDS, [[c.preset, c.fraction, c.seed, c.state, c.val_loss, c.saturation] for c in found]
    )
    write_csv(out / "regime.csv", REGIME_FIELDS, [regime_row(r, args.step) for r in rows])
    for r in rows:
        print(summary_line(r, args.step, args.baseline))
    print(f"report_regime: {out / 'regime_runs.csv'}, {out / 'regime.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
