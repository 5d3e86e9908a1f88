"""Does the best LR transfer across width or depth? Per family, the best LR at each width (depth) and its shift per
doubling, with a 95 % interval over the seeds (``analysis.transfer``: definitions and formulas).

    python -m scripts.lr_transfer CELLS_CSV --axis width|depth --out TRANSFER_CSV [--by-preset [--norm PRESET]]

CELLS_CSV is the report's ``lr_sensitivity.csv`` of one LR study run at several widths (``model.d_model`` and
``model.d_ff``, the axis keys ``width`` leaves out of a family's label) or depths (``depth``: ``model.n_enc_layers``,
``model.n_dec_layers``); ``--by-preset`` names each family by its norm preset and parametrization (``pre_ln mup``),
and ``--norm`` the preset of a study that ran only one (its labels hold no ``norm.*`` key).
Written with the ``csv`` module (empty field: no value; floats at full precision):

- TRANSFER_CSV: one row per family: ``family, n`` (seeds with a shift), ``shift_mean, ci95_lo, ci95_hi`` (log2 of the
  best LR per doubling), ``per_seed_shift`` (``seed=value`` pairs), ``seeds_at_edge`` (seeds whose best LR sat on
  the grid's edge at some point);
- ``transfer_seeds.csv`` beside it: ``family, seed, shift, abs_shift``, what a claim compares by seed;
- ``transfer_points.csv`` beside it: ``family, point`` (a width or a depth), ``n`` (seeds with a best LR there),
  ``best_lr`` (2 to the mean over them of log2 best LR), ``at_edge`` (how many of them sat on the grid's edge),
  ``init_loss`` and ``best_loss`` (the mean over them of the loss at step 0 and of the lowest capped final loss);
- ``transfer_grid.csv`` beside it: ``family, point, lr, n`` (seeds with a capped final loss there) and ``capped_loss``
  (its mean over them): the curves the best LR is read from.

Exit status 2 with one line on a bad axis, a study that does not vary it, an unnamed family (a label without ``norm.*``
keys and no ``--norm``) or an unwritable path.
"""

import argparse
import csv
import sys
from pathlib import Path

from analysis.csvs import csv_field, output_dir, write_csv
from analysis.presets import preset_names as all_presets
from analysis.transfer import AXES, preset_names, seed_rows, stripped_labels, transfers

SUMMARY = ("family", "n", "shift_mean", "ci95_lo", "ci95_hi", "per_seed_shift", "seeds_at_edge")
POINTS = ("family", "point", "n", "best_lr", "at_edge", "init_loss", "best_loss")
GRID = ("family", "point", "lr", "n", "capped_loss")
SEEDS = ("family", "seed", "shift", "abs_shift")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lr_transfer", description="the best LR's shift per doubling of width or depth")
    parser.add_argument("cells", type=Path, metavar="CELLS_CSV", help="a report's lr_sensitivity.csv")
    parser.add_argument("--axis", required=True, choices=sorted(AXES))
    parser.add_argument("--out", type=Path, required=True, help="the summary CSV (transfer_seeds.csv goes beside it)")
    parser.add_argument("--by-preset", action="store_true", help="name each family by its presets (pre_ln mup)")
    parser.add_argument("--norm", choices=all_presets(), help="the norm preset of a study that ran only one (--by-preset)")
    args = parser.parse_args(argv)
    if args.norm and not args.by_preset:
        parser.error("--norm names the families only with --by-preset")
    try:
        with args.cells.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        names = preset_names(stripped_labels(rows, args.axis), args.norm) if args.by_preset else None
        found = transfers(rows, args.axis, names)
        output_dir(args.out.parent)
        summaries = [t.summary() for t in found]
        write_csv(args.out, SUMMARY, ([csv_field(s[c]) for c in SUMMARY] for s in summaries))
        seeds = [row for t in found for row in seed_rows(t)]
        write_csv(args.out.with_name("transfer_seeds.csv"), SEEDS, ([csv_field(r[c]) for c in SEEDS] for r in seeds))
        points = [row for t in found for row in t.point_rows()]
        write_csv(args.out.with_name("transfer_points.csv"), POINTS, ([csv_field(r[c]) for c in POINTS] for r in points))
        grid = [row for t in found for row in t.grid_rows()]
        write_csv(args.out.with_name("transfer_grid.csv"), GRID, ([csv_field(r[c]) for c in GRID] for r in grid))
    except (OSError, ValueError, KeyError) as e:
        print(f"lr_transfer: error: {e}", file=sys.stderr)
        return 2
    print(f"lr_transfer: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
