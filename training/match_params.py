"""Equal-parameter baselines (``python -m scripts.match_params``): the ``model.d_ff`` (or ``model.d_model``) at which a
baseline's parameter count is closest to a candidate's, counted on models built on the meta device."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from model.config import ModelConfig
from model.transformer import EncoderDecoder
from training.cli import CONF, override_error
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
        raise ValueError(
            f"no value in [{low}, {high}] matches {target:,} parameters: the baseline has "
            f"{count_at(low):,} at {low} and {count_at(high):,} at {high}"
        )
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
            changed: dict[str, Any] = {field: value}
            counts[value] = count(replace(base, **changed))["total"]
        return counts[value]

    try:
        value = closest(count_at, target["total"], lo, hi, step)
    except ValueError as e:
        raise ValueError(f"{key}: {e}; give another --range, or --vary another key") from None
    return Match(key, value, count_at(value), target["total"], target["hc"], given, count_at(given))


def report(match: Match, candidate: Sequence[str], baseline: Sequence[str]) -> str:
    """The lines ``main`` prints: both counts, the value found, the gap, the override."""
    hc = f", {match.target_hc:,} of them hyper-connections" if match.target_hc else ""
    return "\n".join(
        [
            f"candidate ({' '.join(candidate)}): {match.target:,} parameters{hc}",
            f"baseline ({' '.join([*candidate, *baseline])}): {match.given_params:,} parameters at "
            f"{match.key}={match.given_value}",
            f"closest: {match.override} gives the baseline {match.params:,} parameters, {match.gap:+,} "
            f"({100 * match.relative_gap:+.2f} %) vs the candidate",
            f"add to the baseline's sweep: {match.override}",
        ]
    )
