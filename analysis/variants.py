"""Grouping runs into variants: runs whose configs differ only in the seed (and in keys that never
change what is trained: ``train.resume``, ``logger.*``, ``hydra.*``, ``telemetry.*``, telemetry being
bit-identical on or off) form a variant.
"""

import re
from dataclasses import dataclass

from analysis.runs import Run

# Exact keys, or prefixes ending in ".". data.task: one report is of one task (analysis.load.runs_task), and runs
# written before the key existed lack it.
IGNORED_KEYS = ("seed", "train.resume", "logger.", "hydra.", "telemetry.", "data.task")
_KEY = re.compile(r"[A-Za-z_][\w.]*=")  # a flattened config key (norm.qk_eps), then the value's =
_PAIR_START = re.compile(rf" (?={_KEY.pattern})")
NORM_KEYS = ("norm.placement", "norm.kind", "norm.impl")  # listed first in variant labels (and the wandb workspace's groups)


@dataclass
class Variant:
    """Runs whose configs differ only in the seed. ``label`` names the config keys that set it apart."""

    label: str
    runs: list[Run]


def _ignored(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in IGNORED_KEYS)


def differing_keys(runs: list[Run]) -> list[str]:
    """Flattened config keys whose value differs between runs (a key missing from a run counts as
    differing), leaving out the seed and keys that do not change training; norm keys first."""
    keys = {k for r in runs for k in r.config if not _ignored(k)}
    missing = object()
    differ = [k for k in keys if len({repr(r.config.get(k, missing)) for r in runs}) > 1]
    return sorted(differ, key=lambda k: (NORM_KEYS.index(k) if k in NORM_KEYS else len(NORM_KEYS), k))


def config_label(run: Run, keys: list[str]) -> str:
    """``key=value`` of the run's config for each of ``keys`` (``?`` for a key it lacks), space-separated: read back
    by :func:`label_pairs`."""
    return " ".join(f"{k}={run.config.get(k, '?')}" for k in keys)


def label_pairs(label: str) -> dict[str, str]:
    """``{key: value}`` of a label of :func:`config_label`, values as the label spells them. A value may hold spaces
    (``norm.blocks=((('kind', 'layernorm'), ('stack', 'dec')),)``, a list as the run's config holds it): a pair
    starts only where a space is followed by a config key and ``=``.

    Raises:
        ValueError: the label does not start with ``key=``.
    """
    parts = _PAIR_START.split(label)
    if not _KEY.match(parts[0]):
        raise ValueError(f"label {label!r} is not key=value pairs")
    return dict(part.split("=", 1) for part in parts)


def group_variants(runs: list[Run]) -> list[Variant]:
    """Group runs that differ only in the seed; a variant's label is ``key=value`` for each config key
    that varies across all runs (or the norm placement/kind/impl when there is a single variant)."""
    keys = differing_keys(runs) or list(NORM_KEYS)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(config_label(run, keys), []).append(run)
    return [Variant(label, sorted(members, key=lambda r: (str(r.seed), r.label))) for label, members in groups.items()]


def averaged_runs(runs: list[Run]) -> list[Run]:
    """The runs a variant's mean curve is over: every run that logged a metric or diverged (a run that
    stopped before training has no curve; it is listed in the table)."""
    return [r for r in runs if r.series or r.diverged]
