"""Grouping runs into variants: runs whose configs differ only in the seed (and in keys that never
change what is trained: ``train.resume``, ``logger.*``, ``hydra.*``, ``telemetry.*``, telemetry being
bit-identical on or off) form a variant. A variant's ``label`` (every key that differs, values as Python spells
them) keys it in the report's CSVs; the page names it as :func:`readable_label` spells it, or by the norm preset its
runs used (``analysis.names``).
"""

import re
from dataclasses import dataclass
from typing import Any

from analysis.runs import Run

# Exact keys, or prefixes ending in ".". data.task: one report is of one task (analysis.load.runs_task), and runs
# written before the key existed lack it.
IGNORED_KEYS = ("seed", "train.resume", "logger.", "hydra.", "telemetry.", "data.task")
_KEY = re.compile(r"[A-Za-z_][\w.]*=")  # a flattened config key (norm.qk_eps), then the value's =
_PAIR_START = re.compile(rf" (?={_KEY.pattern})")
NORM_KEYS = ("norm.placement", "norm.kind", "norm.impl")  # listed first in variant labels (and the wandb workspace's groups)


@dataclass
class Variant:
    """Runs whose configs differ only in the seed. ``label`` names the config keys that set it apart; ``name`` is
    how the report shows it (``pre_bn``, ``pre_ln optim.lr=0.002``: ``analysis.names.name_variants``), empty until
    named, and ``preset`` the norm preset every one of its runs used (None: none, or not looked up)."""

    label: str
    runs: list[Run]
    name: str = ""
    preset: str | None = None

    @property
    def shown(self) -> str:
        """Its name on the page and in the charts' legends: ``name``, else :func:`readable_label`."""
        return self.name or readable_label(self)


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


def flow(value: Any) -> str:
    """A flattened config value (``analysis.load.flatten``: lists as tuples, mappings as sorted (key, value) tuples)
    in YAML's flow style, as Hydra's command line takes it: ``[1, 2]``, ``{kind: layernorm, stack: dec}``, ``null``;
    a scalar as ``str`` spells it (``True``, ``1e-06``). A tuple of (str, value) pairs with distinct keys reads as a
    mapping: a list of two-item lists led by distinct strings would too (no config key holds one)."""
    if value is None:
        return "null"
    if not isinstance(value, tuple):
        return str(value)
    pairs = all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in value)
    if value and pairs and len({p[0] for p in value}) == len(value):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value) + "}"
    return "[" + ", ".join(flow(v) for v in value) + "]"


def readable_label(group: Any) -> str:
    """A variant's (or an LR family's: anything with ``label`` and ``runs``) label with each value as its first run's
    config holds it, in flow style (:func:`flow`): ``norm.blocks=[{kind: layernorm, stack: dec}]`` for the label's
    ``norm.blocks=((('kind', 'layernorm'), ('stack', 'dec')),)``; a key the run lacks as the label spells it (``?``);
    the label itself when it is not ``key=value`` pairs."""
    try:
        pairs = label_pairs(group.label)
    except ValueError:
        return str(group.label)
    config = group.runs[0].config if group.runs else {}
    return " ".join(f"{k}={flow(config[k]) if k in config else v}" for k, v in pairs.items())


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
