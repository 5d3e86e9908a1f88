"""A config group's keys as a run composes them, for the code that builds a model, telemetry or an optimizer without a
run (benchmarks, reports, tests): a preset file alone is not its config, since the presets of ``conf/model/`` and
``conf/telemetry/`` state only what differs from their base (``conf/model_base.yaml``, ``conf/telemetry_base.yaml``).
"""

import copy
import typing
from functools import cache
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from training.cli import CONF
from training.schema import OptimConfig


@cache
def _composed(overrides: tuple[str, ...]) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return typing.cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))  # conf/config.yaml: a mapping


def group_keys(group: str, name: str | None = None) -> dict[str, Any]:
    """The keys of config group ``group`` (``model``, ``telemetry``, ``optim``, ...) that ``conf/config.yaml`` composes
    with preset ``group=name`` (None: the default run's preset), interpolations resolved: plain data, a fresh copy.

    Raises:
        hydra.errors.MissingConfigException: no preset ``name`` in ``conf/<group>/``.
    """
    values = _composed(() if name is None else (f"{group}={name}",))[group]
    return copy.deepcopy(values)  # the cached one stays as composed


def default_optim(**changes: Any) -> OptimConfig:
    """The default run's ``optim`` keys (``conf/optim/adamw.yaml``) with ``changes`` (``lr=1e-3``), typed:
    ``training.optim.build_optimizer``'s settings for code that trains outside a run (benchmarks, tests).

    Raises:
        TypeError: a change that is not an ``optim`` key.
        ValueError: a changed value out of range (``OptimConfig``).
    """
    return OptimConfig(**{**group_keys("optim"), **changes})
