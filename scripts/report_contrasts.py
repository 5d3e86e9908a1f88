"""Paired contrasts from committed per-run CSVs, as a spec file lists them (the numbers: :mod:`analysis.contrasts`).

    python -m scripts.report_contrasts SPEC [--out CSV]    # from the repository root

e.g. ``python -m scripts.report_contrasts docs/results/dyt_data_regime/paired.yaml`` writes ``paired.csv`` beside
the spec (``--out``: elsewhere) with the ``csv`` module: one row per contrast, ``contrast, metric, diff_mean,
diff_ci95_lo, diff_ci95_hi, pairs, significant, rel_diff, rel_ci95_lo, rel_ci95_hi`` (empty field: no value; floats
at full precision), and prints each. Exit status 2 with one line naming the contrast and the bad value when a spec
entry or its CSV cannot give a contrast; nothing is written then.
"""

import argparse
import sys
from pathlib import Path

from analysis.contrasts import COLUMNS, ContrastError, compute, load_spec
from analysis.csvs import write_csv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report_contrasts", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=Path, help="a YAML file of contrasts (analysis/contrasts.py)")
    parser.add_argument("--out", type=Path, help="the CSV written (default: the spec's path with .csv)")
    args = parser.parse_args(argv)
    try:
        contrasts = [compute(entry, args.spec) for entry in load_spec(args.spec)]
    except ContrastError as err:
        print(f"report_contrasts: error: {err}", file=sys.stderr)
        return 2
    out = args.out or args.spec.with_suffix(".csv")
    if out.is_dir():
        print(f"report_contrasts: error: --out {out} is a folder; give a CSV file's path", file=sys.stderr)
        return 2
    write_csv(out, COLUMNS, [c.row() for c in contrasts])
    for c in contrasts:
        ci = "" if c.diff.ci95 is None else f" [{c.diff.ci95[0]:+.4f}, {c.diff.ci95[1]:+.4f}]"
        print(f"{c.name} ({c.metric}): {c.diff.mean:+.4f}{ci} ({c.diff.n} pairs)")
    print(f"report_contrasts: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
