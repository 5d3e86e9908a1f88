"""The LR-sensitivity part of ``scripts/report.py`` (the numbers: :mod:`analysis.lrs`; the charts:
:mod:`analysis.lr_panels`): its table's columns, the note above the table, and its two CSVs. A family none of whose
seeds learned at any LR of the grid reads "did not learn at any LR of the grid" in the table's LRS column and in
``lrs.csv``'s ``lrs_note``, with no LRS, interval, best loss or best LR.

    python -m scripts.report_lrs CELLS_CSV [CELLS_CSV ...] [--out LRS_CSV] [--baseline FAMILY] [--by-preset]
                                 [--families FAMILY,...]    # from the repository root

rebuilds ``lrs.csv`` (default: next to the first CELLS_CSV) from reports' ``lr_sensitivity.csv`` alone, with the same
code (:func:`analysis.lrs.study_from_cells`), for a study whose run directories are gone; ``--by-preset`` names each
family by its norm preset instead of its long ``key=value`` label (and writes the relabelled cells beside LRS_CSV).
Several CELLS_CSVs join the seeds of one study run as several sweeps (finding (a)'s seeds 0-2 and 3-16, whose labels
differ: ``--by-preset`` gives them one), a cell given twice being an error; ``--families`` keeps those families only.

CSVs, written with the ``csv`` module into the report's folder (empty field: no value; floats at full precision):

- ``lr_sensitivity.csv``: one row per family, seed and LR of the family's grid: ``family, seed, lr,
  final_val_loss`` (a finished run's last ``val/loss``), ``init_loss`` (the seed's l0), ``capped_loss``
  (min(final_val_loss, init_loss); init_loss for a diverged run), ``state`` (``finished``, ``diverged``,
  ``missing``: no run, or the run's state: ``running``, ``interrupted``, ``failed``, ``unknown``),
  ``max_attn_logit`` (the largest ``attn/.../max_logit`` over the run's attentions at its last telemetry record;
  empty without one);
- ``lrs.csv``: one row per family: ``family, n`` (seeds with an LRS), ``lrs_mean, lrs_stderr, ci95_lo, ci95_hi,
  per_seed_lrs`` (``seed=value`` pairs, space-separated), ``best_lr``, and with ``--baseline FAMILY`` ``baseline,
  diff_mean, diff_ci95_lo, diff_ci95_hi, pairs, significant`` (the family's LRS − the baseline's, paired t test over
  the seeds both have an LRS for; empty without a baseline and in the baseline's own row), then ``best_loss_mean``
  (the mean over the seeds with an LRS of l*, the best loss LRS is measured from), ``did_not_learn`` (how many seeds
  did not learn at any LR of the grid), ``lrs_note`` (``did not learn at any LR of the grid: seeds ... of N``; a
  best-LR tie; with a baseline, why no difference was computed: ``LR grids differ: LRS not comparable (...)``), and
  with a baseline ``pairs_left_out`` (seeds left out of the pairs because either family did not learn) and
  ``degenerate`` (every pair differs by the same amount: no interval, not significant; empty with fewer than two
  pairs);
- ``lrs_seeds.csv``: one row per family and seed: ``family, seed, lrs, best_loss`` (l*; both empty without an LRS),
  ``init_loss`` (l0), ``learned`` (``False``: did not learn at any LR of the grid; empty for an incomplete grid).
"""

import argparse
import sys
from pathlib import Path

from reporting.lrs import rebuild_lrs_csv


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of :func:`rebuild_lrs_csv`; returns the exit code (1 with ``report_lrs: error: ...``)."""
    parser = argparse.ArgumentParser(prog="report_lrs", description="rebuild lrs.csv from a report's lr_sensitivity.csv")
    parser.add_argument("cells", type=Path, nargs="+", metavar="CELLS_CSV", help="reports' lr_sensitivity.csv")
    parser.add_argument("--out", type=Path, default=None, help="output CSV (default: lrs.csv next to the first CELLS_CSV)")
    parser.add_argument("--baseline", metavar="FAMILY", default=None, help="a family's label: the paired LRS differences")
    parser.add_argument("--by-preset", action="store_true", help="label each family by the norm preset it names (pre_ln, ...)")
    parser.add_argument("--families", default=None, help="comma-separated family labels to keep (default: all)")
    args = parser.parse_args(argv)
    families = None if args.families is None else args.families.split(",")
    try:
        out = args.out or args.cells[0].with_name("lrs.csv")
        path = rebuild_lrs_csv(args.cells, out, args.baseline, args.by_preset, families)
    except (OSError, ValueError) as e:
        print(f"report_lrs: error: {e}", file=sys.stderr)
        return 1
    print(f"report_lrs: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
