"""Probe a run's blocks: layer-drop Δloss, angular distance between residual streams, output change at init,
batch dependence of each norm.

    python -m scripts.probe RUN_DIR [--max-examples 500] [--placements post pre admin deepnorm] [--depths 1 2 4 6]

Reads ``RUN_DIR/checkpoint.pt`` (weights, model config, vocabularies, run config), rebuilds the run's
validation split (``training.tasks.build_task``, vocabularies from the checkpoint), takes at most
``--max-examples`` of its pairs at an even stride (as the runs' evaluation subsets), and writes into
``RUN_DIR/probe/``:

- ``probe.json``: ``loss`` (the full model's validation loss), ``examples``, ``layer_drop`` ({enc, dec}:
  Δloss per block), ``angular_distance`` ({enc, dec}: (L+1) x (L+1)), ``output_change``
  ({placement: {depth: value}}), ``delta``, ``batch_dependence`` ({site: value}); a non-finite value is null;
- ``layer_drop.png``, ``angular_distance.png``, ``output_change.png``.

The output change is measured on models built at init with the run's sizes and norm kind, for each
placement and depth; the run's own placement is always among them. The batch dependence is measured on the
run's model with two batches of at most 64 probed pairs each (pairs 0..m-1 and m..2m-1), so it needs 4 pairs or
more. ``python -m scripts.report``
shows the PNGs of every run that has them. Definitions and sources: docs/telemetry.md, "Probes".
"""

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import torch

from reporting.probe import DEFAULT_PLACEMENTS, probe, write_probe
from training.devices import parse_device


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 with ``probe: error: ...`` on bad input, a ``--device`` not
    of this machine among it: ``training.devices.parse_device``)."""
    parser = argparse.ArgumentParser(prog="probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run directory holding checkpoint.pt")
    parser.add_argument("--max-examples", type=int, default=500, help="validation pairs probed, at an even stride (default 500)")
    parser.add_argument(
        "--placements",
        nargs="+",
        default=None,
        help=f"output change: placements (default: {' '.join(DEFAULT_PLACEMENTS)}, run's own)",
    )
    parser.add_argument("--depths", nargs="+", type=int, default=[1, 2, 4, 6], help="output change: blocks per stack")
    parser.add_argument("--delta", type=float, default=1e-3, help="output change: δ's scale, times rms(w) (default 1e-3)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        device = parse_device(args.device)
        result = probe(args.run_dir, args.max_examples, args.placements, args.depths, args.delta, device)
    except (ValueError, FileNotFoundError) as e:
        print(f"probe: error: {e}", file=sys.stderr)
        return 1
    paths = write_probe(result, args.run_dir / "probe")
    print(
        f"probe: full valid loss {result['loss']:.4f} on {result['examples']} pairs; wrote {', '.join(p.name for p in paths)} "
        f"into {args.run_dir / 'probe'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
