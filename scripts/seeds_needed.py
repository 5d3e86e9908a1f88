"""How many seeds a paired LRS comparison needs, from a pilot study's per-seed LRS (``analysis.power``).

    python -m scripts.seeds_needed docs/results/lr_sensitivity/lrs_seeds.csv --family post_ln --baseline pre_ln

reads an ``lrs_seeds.csv`` (``scripts.report_lrs``), pairs the two families' LRS by seed (a family by its label or
by the norm preset it used, ``analysis.presets.preset_of``), and prints the per-seed differences, their mean and sd,
the sd's one-sided upper confidence limit (``--level``, default 0.8) and the pairs needed for ``--power`` (default
0.8) of the two-sided paired t test at ``--alpha`` (default 0.05) with the sd as estimated and at its upper limit.
For finding (a) (seeds 0-2): differences 0.366, 0.079, 0.421; sd 0.183, upper limit 0.388; n 6 and 17 (the
preset ``lr_sensitivity_seeds`` runs 17). ``--out CSV`` also writes the plan as one row (``PLAN_FIELDS``: ``pairs``
the pilot's, ``diff_mean, sd, sd_upper, n_point, n_upper``, then the targets; floats at full precision). Exit status 2
with one line on a missing file or family, a CSV without the columns ``family, seed, lrs``
(the line names the missing ones) or without rows.
"""

import argparse
import sys
from pathlib import Path

from analysis.csvs import read_rows, write_csv
from analysis.power import plan
from reporting.seeds_needed import PLAN_FIELDS, SEED_COLUMNS, seed_lrs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seeds_needed", description="seeds for a paired LRS comparison (analysis.power)")
    parser.add_argument("seeds_csv", type=Path, metavar="SEEDS_CSV", help="an lrs_seeds.csv (scripts.report_lrs)")
    parser.add_argument("--family", required=True, help="the family compared (label or norm preset)")
    parser.add_argument("--baseline", required=True, help="the family it is compared with (label or norm preset)")
    parser.add_argument("--power", type=float, default=0.8)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--level", type=float, default=0.8, help="of the sd's one-sided upper confidence limit")
    parser.add_argument("--out", type=Path, default=None, help="also write the plan to this CSV")
    args = parser.parse_args(argv)
    try:
        rows = read_rows(args.seeds_csv, SEED_COLUMNS)
        family, baseline = seed_lrs(rows, args.family), seed_lrs(rows, args.baseline)
        seeds = sorted(set(family) & set(baseline), key=int)
        diffs = [family[s] - baseline[s] for s in seeds]
        p = plan(diffs, args.power, args.alpha, args.level)
        if args.out:
            row = [args.family, args.baseline, len(diffs), *(p[k] for k in ("mean", "sd", "sd_upper", "n_point", "n_upper"))]
            write_csv(args.out, PLAN_FIELDS, [[*row, args.power, args.alpha, args.level]])
    except (OSError, ValueError) as e:
        print(f"seeds_needed: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.family} - {args.baseline}, per seed: " + ", ".join(f"{s}: {d:.3f}" for s, d in zip(seeds, diffs, strict=True)))
    print(
        f"mean {p['mean']:.3f}, sd {p['sd']:.3f} ({len(diffs) - 1} dof); sd at its one-sided {args.level:.0%} upper "
        f"limit {p['sd_upper']:.3f} (Browne 1995)"
    )
    print(
        f"pairs for {args.power:.0%} power (two-sided paired t, alpha {args.alpha:g}) at the mean difference: "
        f"{p['n_point']} with the sd as estimated, {p['n_upper']} at its upper limit"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
