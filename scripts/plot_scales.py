"""Draw a run's activation scales from its metrics.jsonl, offline, as PNG.

    python -m scripts.plot_scales RUN_DIR [--stat rms] [--site out] [--steps 0 500 1000] [--out DIR]

Writes into --out (default RUN_DIR):
- ``scale_heatmap.png``: block (``enc.0`` ... ``dec.{n}``: encoder then decoder) x training step,
  colour = log10 of the statistic at the chosen site (default: RMS of the residual stream leaving
  each block), with a labelled colour bar;
- ``scale_vs_depth.png``: the statistic vs block at a few steps, one panel per site, one legend for
  all; a panel's y axis is logarithmic only where its values span a factor of 10 or more.
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

from reporting.scales import encoder_depth, plot_depth, plot_heatmap, read_profiles
from runlog.metric_names import STATS


def main(argv: list[str] | None = None) -> list[Path]:
    """Command-line entry point; returns the PNGs' paths (also printed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--stat", default="rms", choices=STATS, help="the statistic (default rms)")
    parser.add_argument("--site", default="out", help="site of the heatmap, e.g. out, in, ffn (default out)")
    parser.add_argument(
        "--steps", type=int, nargs="*", help="steps of the depth plot (nearest recorded; default: first, middle, last)"
    )
    parser.add_argument("--out", type=Path, help="output directory (default RUN_DIR)")
    args = parser.parse_args(argv)
    out = args.out or args.run_dir
    out.mkdir(parents=True, exist_ok=True)
    profiles = read_profiles(args.run_dir, args.stat)
    n_enc = encoder_depth(args.run_dir)
    paths = [plot_heatmap(profiles, args.site, args.stat, out, n_enc), plot_depth(profiles, args.steps, args.stat, out, n_enc)]
    for p in paths:
        print(p)
    return paths


if __name__ == "__main__":
    main()
