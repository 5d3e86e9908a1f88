"""Compare at equal parameters: the value of one model size that brings a baseline's parameter count closest to a
candidate's.

    python -m scripts.match_params norm=pre_ln_mhc +experiment=lr_sensitivity --baseline norm=pre_ln
    python -m scripts.match_params norm=pre_ln_mhc --baseline norm=pre_ln --vary model.d_model --range 64 512

The candidate is composed from the positional overrides, the baseline from the same overrides followed by
``--baseline``'s (Hydra: the later value of a key wins, so ``norm=pre_ln`` replaces ``norm=pre_ln_mhc`` and the
baseline keeps ``+experiment=lr_sensitivity``'s sizes). Both are composed from conf/ and checked as train.py
composes and checks a run (Hydra's compose API, ``training.schema.validate``), and sized to their task's
vocabularies as a run is (``training.run.sized_model_config``: the data is loaded once, from its cache after the
first time). Models are built on the meta device (shapes only, no memory) and counted as status.json counts them
(``EncoderDecoder.parameter_counts``: a tied matrix once).

``--vary`` (``model.d_ff``, the default, or ``model.d_model``, then in steps of ``model.n_heads`` so that the
heads divide it) is searched over ``--range LO HI`` (default: one step to 16 times the baseline's own value); the
count does not decrease as either grows, so a bisection finds the closest value. Printed: both counts, the value,
the baseline's count there, the gap to the candidate (absolute and relative) and the override to add to the
baseline's sweep. At the LR-sensitivity size (``+experiment=lr_sensitivity``): mHC 597,414 parameters, pre-LN
471,936 at d_ff=256 and 597,840 at ``model.d_ff=378`` (+426, +0.07 %).
"""

import argparse
import sys

from hydra.errors import HydraException

from training.cli import hydra_error_line
from training.match_params import VARY_KEYS, match_params, report


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 with ``match_params: error: ...`` on bad input)."""
    parser = argparse.ArgumentParser(prog="match_params", description=__doc__.split("\n\n")[0])
    parser.add_argument("candidate", nargs="*", metavar="OVERRIDE", help="the candidate's Hydra overrides")
    parser.add_argument(
        "--baseline",
        nargs="+",
        required=True,
        metavar="OVERRIDE",
        help="the baseline's overrides, applied after the candidate's (norm=pre_ln)",
    )
    parser.add_argument("--vary", default="model.d_ff", metavar="KEY", help=f"the baseline's key to vary: {', '.join(VARY_KEYS)}")
    parser.add_argument("--range", nargs=2, type=int, default=None, metavar=("LO", "HI"), help="values searched, both included")
    args = parser.parse_args(argv)
    try:
        match = match_params(args.candidate, args.baseline, args.vary, tuple(args.range) if args.range else None)
    except (ValueError, FileNotFoundError, HydraException) as e:
        print(f"match_params: error: {hydra_error_line(e) if isinstance(e, HydraException) else e}", file=sys.stderr)
        return 1
    print(report(match, args.candidate, args.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
