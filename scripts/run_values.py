"""Per-run telemetry values of an LR-sensitivity study, one row per family, seed and LR (``analysis.run_values``).

    python -m scripts.run_values SWEEP_DIR... --out CSV --column NAME PROFILE PATTERN REDUCE [--column ...] [--by-preset]

reads every run under the sweep dirs, groups them into LR families as ``scripts.report`` does (``analysis.lrs``:
runs that differ only in the seed and ``optim.lr``), and writes with the ``csv`` module ``family, seed, lr, state``
(as the report's ``lr_sensitivity.csv``), then one field per ``--column``: REDUCE (max, min, mean) of PROFILE's values
(a per-block profile of the report: rms, sigma_max, max_logit, sink_mass, massive, ...) at the run's last record
that has any, over the sites PATTERN names (``fnmatch``: ``*attn.[qk]`` for every query and key matrix of
``sigma_max``, ``enc.*`` for the encoder's blocks of a profile by depth); empty when the run recorded none.
``--by-preset`` names each family as ``scripts.report_lrs --by-preset`` does (``pre_ln muon``). For example, the
largest W_q or W_k spectral norm of each run:

    python -m scripts.run_values RUNS --out qk_sigma.csv --column qk_sigma_max sigma_max '*attn.[qk]' max --by-preset

Exit status 2 with one line when no run or no LR family is found, a column is bad, a family names no single
preset, or ``--out`` cannot be written.
"""

import argparse
import sys
from pathlib import Path

from analysis.csvs import output_dir, write_csv
from analysis.load import ReportError, load_runs
from analysis.lrs import lr_study
from analysis.presets import study_names
from analysis.run_values import column, study_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_values", description="per-run telemetry values of an LR study")
    parser.add_argument("dirs", nargs="+", type=Path, metavar="SWEEP_DIR")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--column", nargs=4, action="append", required=True, metavar=("NAME", "PROFILE", "PATTERN", "REDUCE"))
    parser.add_argument("--by-preset", action="store_true", help="name each family by its presets (pre_ln muon)")
    args = parser.parse_args(argv)
    try:
        columns = [column(*spec) for spec in args.column]
        study = lr_study(load_runs(args.dirs))
        if study is None:
            raise ReportError(f"no LR family (runs differing only in seed and optim.lr, at two LRs or more) under {args.dirs[0]}")
        names = study_names(f.label for f in study.families) if args.by_preset else {}
        rows = study_rows(study, columns, lambda label: names.get(label, label))
        output_dir(args.out.parent)
        write_csv(args.out, ["family", "seed", "lr", "state", *(c.name for c in columns)], rows)
    except (ReportError, ValueError, OSError) as e:
        print(f"run_values: error: {e}", file=sys.stderr)
        return 2
    print(f"run_values: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
