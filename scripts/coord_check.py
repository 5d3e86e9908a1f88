"""The coordinate check of muP (docs/parametrization.md), ``reporting.coord_check.run_families``:

python -m scripts.coord_check --family norm=pre_ln --family norm=post_ln --out coord
"""

import argparse
import sys
from pathlib import Path

from hydra.errors import HydraException

from reporting.coord_check import run_families
from training.cli import hydra_error_line


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 with ``coord_check: error: ...`` on bad input)."""
    parser = argparse.ArgumentParser(prog="coord_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides for every family")
    parser.add_argument("--family", action="append", nargs="+", required=True, metavar="OVERRIDE", help="a family's overrides")
    parser.add_argument("--widths", nargs="+", type=int, default=[64, 128, 256, 512], help="d_model values (default: 64..512)")
    parser.add_argument("--base-width", type=int, help="muP's base width (default: the smallest width)")
    parser.add_argument("--steps", type=int, default=3, help="Adam steps after init (default: 3)")
    parser.add_argument("--lr", type=float, default=0.01, help="Adam's LR at every width (default: 0.01)")
    parser.add_argument("--out", type=Path, default=Path("coord_check"), help="output folder (default: coord_check)")
    args = parser.parse_args(argv)
    if len(args.widths) < 2 or args.steps < 1:
        parser.error(f"need two widths or more and --steps >= 1, got --widths {args.widths} --steps {args.steps}")
    try:
        base = min(args.widths) if args.base_width is None else args.base_width
        lines = run_families(args.overrides, args.family, args.widths, base, args.steps, args.lr, args.out)
    except (ValueError, HydraException) as err:
        print(f"coord_check: error: {hydra_error_line(err)}", file=sys.stderr)
        return 1
    print("\n".join(lines) + f"\ncoord_check: wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
