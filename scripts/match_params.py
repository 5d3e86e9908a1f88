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

import sys

if not __package__:  # run as a file (python scripts/x.py): it answers with the module command
    import _as_module  # noqa: F401

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

from model.config import ModelConfig
from model.transformer import EncoderDecoder
from training.cli import CONF, hydra_error_line, override_error
from training.run import sized_model_config
from training.schema import validate
from training.tasks import build_task

VARY_KEYS = ("model.d_ff", "model.d_model")
RANGE_FACTOR = 16  # the default --range ends at this multiple of the baseline's own value


@dataclass(frozen=True)
class Match:
    """The baseline's ``key`` at ``value``: ``params`` parameters, the closest it comes to the candidate's ``target``.

    Attributes:
        key, value: the varied key and the value found.
        params: the baseline's parameters at ``value``.
        target: the candidate's parameters; ``target_hc`` of them hyper-connections'.
        given_value, given_params: the baseline's own value of ``key`` and its parameters there.
    """

    key: str
    value: int
    params: int
    target: int
    target_hc: int
    given_value: int
    given_params: int

    @property
    def gap(self) -> int:
        """Baseline minus candidate, in parameters."""
        return self.params - self.target

    @property
    def relative_gap(self) -> float:
        """``gap / target``: +0.000713 for pre-LN at d_ff=378 against mHC at the LR-sensitivity size."""
        return self.gap / self.target

    @property
    def override(self) -> str:
        """``model.d_ff=378``: the Hydra override that gives the baseline this size."""
        return f"{self.key}={self.value}"


def model_config(overrides: Sequence[str]) -> ModelConfig:
    """The model config a run with ``overrides`` trains, sized to its task's vocabularies.

    Raises:
        ValueError: a renamed key or ``norm=<a kind>`` (``training.cli``), a bad key or value
            (``training.schema.validate``), bad data keys or missing data.
        hydra.errors.HydraException: an override Hydra cannot apply (an unknown key or preset).
    """
    if error := override_error(list(overrides)):
        raise ValueError(error)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = validate(compose("config", overrides=list(overrides)))
    return sized_model_config(cfg, build_task(cfg, None, None))


def count(mcfg: ModelConfig) -> dict[str, int]:
    """``{"total": N, "hc": M}`` of the model ``mcfg`` builds (``EncoderDecoder.parameter_counts``), built on the
    meta device: shapes only, no memory."""
    with torch.device("meta"):
        return EncoderDecoder(mcfg).parameter_counts()


def closest(count_at: Callable[[int], int], target: int, low: int, high: int, step: int) -> int:
    """The multiple of ``step`` in [``low``, ``high``] (both multiples of it) whose ``count_at`` is closest to ``target``,
    the smaller on a tie; ``count_at`` must not decrease (found by bisection).

    Raises:
        ValueError: ``target`` is outside [count_at(low), count_at(high)]: no value in the range matches it.
    """
    if not count_at(low) <= target <= count_at(high):
        raise ValueError(f"no value in [{low}, {high}] matches {target:,} parameters: the baseline has "
                         f"{count_at(low):,} at {low} and {count_at(high):,} at {high}")  # fmt: skip
    lo, hi = low // step, high // step
    while lo < hi:  # the first multiple whose count reaches the target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count_at(mid * step) < target else (lo, mid)
    value = lo * step
    if value > low and target - count_at(value - step) <= count_at(value) - target:
        value -= step
    return value


def match_params(
    candidate: Sequence[str], baseline: Sequence[str], key: str = "model.d_ff", value_range: tuple[int, int] | None = None
) -> Match:
    """The value of ``key`` that brings the baseline's parameter count closest to the candidate's (module docstring).

    Args:
        candidate: the candidate's Hydra overrides (``["norm=pre_ln_mhc", "+experiment=lr_sensitivity"]``).
        baseline: the baseline's, applied after the candidate's (``["norm=pre_ln"]``).
        key: ``model.d_ff`` or ``model.d_model`` (then searched in multiples of ``model.n_heads``).
        value_range: (LO, HI) of the search, both included; default (one step, 16 x the baseline's own value).

    Raises:
        ValueError: an unknown ``key``; a range that is not 1 <= LO <= HI or holds no multiple of n_heads; a
            candidate whose count is outside the baseline's over the range; any config error of ``model_config``.
    """
    if key not in VARY_KEYS:
        raise ValueError(f"unknown --vary {key!r}; valid: {', '.join(VARY_KEYS)}")
    target = count(model_config(candidate))
    base = model_config([*candidate, *baseline])
    field = key.removeprefix("model.")
    given = getattr(base, field)
    step = base.n_heads if field == "d_model" else 1  # d_model: the heads must divide it (ModelConfig checks)
    low, high = value_range or (step, RANGE_FACTOR * given)
    if not 1 <= low <= high:
        raise ValueError(f"--range {low} {high}: need 1 <= LO <= HI")
    lo, hi = -(-low // step) * step, high // step * step
    if lo > hi:
        raise ValueError(f"--range {low} {high} holds no multiple of model.n_heads={step}, which {key} must be")
    counts: dict[int, int] = {}

    def count_at(value: int) -> int:
        if value not in counts:
            counts[value] = count(replace(base, **{field: value}))["total"]
        return counts[value]

    try:
        value = closest(count_at, target["total"], lo, hi, step)
    except ValueError as e:
        raise ValueError(f"{key}: {e}; give another --range, or --vary another key") from None
    return Match(key, value, count_at(value), target["total"], target["hc"], given, count_at(given))


def report(match: Match, candidate: Sequence[str], baseline: Sequence[str]) -> str:
    """The lines ``main`` prints: both counts, the value found, the gap, the override."""
    hc = f", {match.target_hc:,} of them hyper-connections" if match.target_hc else ""
    return "\n".join([
        f"candidate ({' '.join(candidate)}): {match.target:,} parameters{hc}",
        f"baseline ({' '.join([*candidate, *baseline])}): {match.given_params:,} parameters at {match.key}={match.given_value}",
        f"closest: {match.override} gives the baseline {match.params:,} parameters, {match.gap:+,} "
        f"({100 * match.relative_gap:+.2f} %) vs the candidate",
        f"add to the baseline's sweep: {match.override}",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 with ``match_params: error: ...`` on bad input)."""
    parser = argparse.ArgumentParser(prog="match_params", description=__doc__.split("\n\n")[0])
    parser.add_argument("candidate", nargs="*", metavar="OVERRIDE", help="the candidate's Hydra overrides")
    parser.add_argument("--baseline", nargs="+", required=True, metavar="OVERRIDE",
                        help="the baseline's overrides, applied after the candidate's (norm=pre_ln)")  # fmt: skip
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
