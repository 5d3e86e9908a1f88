"""Draw a run's activation scales from its metrics.jsonl, offline, as PNG.

    python -m scripts.plot_scales RUN_DIR [--stat rms] [--site out] [--steps 0 500 1000] [--out DIR]

Writes into --out (default RUN_DIR):
- ``scale_heatmap.png``: block (encoder then decoder) x training step, colour = log10 of the
  statistic at the chosen site (default: RMS of the residual stream leaving each block);
- ``scale_vs_depth.png``: the statistic vs block index at a few steps, one panel per site.
"""

import sys
from pathlib import Path

if not __package__:  # run as a file (python scripts/x.py), which cannot import the project's packages
    sys.exit(f"normlab: run it as a module from the repository root: cd {Path(__file__).resolve().parents[1]} && "
             f"python -m scripts.{Path(__file__).stem} {' '.join(sys.argv[1:])}".rstrip())  # fmt: skip

import argparse
import json

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from model.metric_names import STATS, depth_profile


def read_profiles(run_dir: Path, stat: str) -> dict[int, dict[str, list[tuple[int, float]]]]:
    """step -> site -> [(depth, value)] from every row of metrics.jsonl that carries telemetry.

    Raises:
        FileNotFoundError: no metrics.jsonl in run_dir.
        ValueError: the file holds no ``act/...`` statistics (telemetry was off).
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {str(run_dir)!r}; pass a run directory written by train.py")
    profiles = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        profile = depth_profile({k: v for k, v in row.items() if isinstance(v, float)}, stat)
        if profile:
            profiles[row["step"]] = profile
    if not profiles:
        raise ValueError(
            f"{path} has no act/.../{stat} statistics: the run had telemetry off "
            f"(telemetry=off or telemetry.every=0) or did not record this stat (telemetry.stats)"
        )
    return profiles


def plot_heatmap(profiles: dict, site: str, stat: str, out: Path) -> Path:
    steps = sorted(s for s in profiles if site in profiles[s])
    if not steps:
        raise ValueError(f"no act/*.{site}/{stat} metrics; sites present: {sorted({k for p in profiles.values() for k in p})}")
    depth = max(d for s in steps for d, _ in profiles[s][site]) + 1
    grid = np.full((depth, len(steps)), np.nan)
    for j, s in enumerate(steps):
        for d, v in profiles[s][site]:
            grid[d, j] = v
    fig, ax = plt.subplots(figsize=(8, 4))
    x0, x1 = (steps[0], steps[-1]) if len(steps) > 1 else (steps[0] - 0.5, steps[0] + 0.5)
    im = ax.imshow(np.log10(np.maximum(grid, 1e-12)), aspect="auto", origin="lower", cmap="viridis",
                   extent=(x0, x1, -0.5, depth - 0.5))  # fmt: skip
    ax.set_xlabel("training step")
    ax.set_ylabel("block (encoder, then decoder)")
    ax.set_title(f"log10 {stat} at site '{site}'")
    fig.colorbar(im, ax=ax)
    path = out / "scale_heatmap.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_depth(profiles: dict, steps: list[int] | None, stat: str, out: Path) -> Path:
    available = sorted(profiles)
    if steps:
        chosen = [min(available, key=lambda s: abs(s - want)) for want in steps]  # nearest recorded step
    else:
        chosen = sorted({available[0], available[len(available) // 2], available[-1]})
    sites = sorted({site for s in chosen for site in profiles[s]})
    cols = min(len(sites), 3)
    rows = -(-len(sites) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, site in zip(axes.flat, sites, strict=False):
        for s in chosen:
            points = sorted(profiles[s].get(site, []))
            ax.plot([d for d, _ in points], [v for _, v in points], marker="o", label=f"step {s}")
        ax.set_title(site)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("block")
        ax.set_ylabel(stat)
        ax.set_yscale("log")
    for ax in list(axes.flat)[len(sites) :]:
        ax.axis("off")
    axes.flat[0].legend()
    fig.tight_layout()
    path = out / "scale_vs_depth.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
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
    paths = [plot_heatmap(profiles, args.site, args.stat, out), plot_depth(profiles, args.steps, args.stat, out)]
    for p in paths:
        print(p)
    return paths


if __name__ == "__main__":
    main()
