"""The numbers of ``+experiment=batch_vs_layer`` (docs/results.md, "BatchNorm vs LayerNorm"): per run, per arm and
batch size, and the contrasts Shen et al. 2020 ("PowerNorm", ICML, arXiv 2003.07845) make, paired by seed.

    python -m scripts.report_batch_vs_layer SWEEP_DIR [--out DIR]    # from the repository root; DIR: SWEEP_DIR/report

An arm is the encoder's norm kind (``norm.kind``; the decoder is LayerNorm), ``<kind>_both`` where the kind is in
both stacks (``norm.decoder_batch_stats`` and no ``norm.blocks``): the options of ``conf/batch_vs_layer/``. CSVs,
written with the ``csv`` module (empty field: no value; floats at full precision):

- ``runs.csv``: one row per run: ``arm, max_tokens, seed, state``, then each of :data:`METRICS` (``test/per``,
  ``test/wer``, ``best_val_loss``, ``final_val_loss``: the last ``val/loss``; ``final_val_loss_batch_stats``: the
  last ``val/loss_batch_stats``, for a model without batch-reading norms its ``val/loss``; ``train_eval_gap``: the
  one minus the other where logged; ``first_norm_<stat>``: the mean over the run's records of
  ``bstat/enc.0.self_attn.norm_in/<stat>``);
- ``summary.csv``: one row per (arm, max_tokens, metric) that some finished run has a value of: ``runs`` (the cell's
  runs), ``finished``, ``n`` (finished runs with a value), ``mean, stderr, ci95_lo, ci95_hi`` (the t interval of
  the mean), then the arm minus ``layernorm`` at the same batch size, paired by seed (``diff_mean, diff_ci95_lo,
  diff_ci95_hi, pairs, significant``; empty in LayerNorm's rows and where LayerNorm has no value). Only finished
  runs enter the statistics: ``finished`` < ``runs`` says some did not;
- ``contrasts.csv``: ``contrast, metric, diff_mean, diff_ci95_lo, diff_ci95_hi, pairs, significant`` for
  ``<arm> - layernorm: small - large batch`` (does the small batch hurt the arm more than LayerNorm? the difference
  of the two paired differences, seed by seed) and ``powernorm - batchnorm at <max_tokens>``; a contrast without a
  seed in common is left out.

Intervals: the paired t test of ``analysis.paired.paired_difference`` (95 %, n - 1 dof; a degenerate zero-spread set
of pairs has none and is not significant).
"""

import argparse
import sys
from pathlib import Path

from analysis.csvs import output_dir
from analysis.load import ReportError, load_runs
from reporting.batch_vs_layer import write_csvs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report_batch_vs_layer", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="the +experiment=batch_vs_layer sweep dir")
    parser.add_argument("--out", type=Path, help="output dir (default: SWEEP/report)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs([args.sweep])
        out = output_dir(args.out or args.sweep / "report")
        for path in write_csvs(runs, out):
            print(path)
    except (ReportError, ValueError) as err:
        print(f"report_batch_vs_layer: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
