"""Shared fixtures: Hydra configs composed from conf/ with test-sized overrides."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=tiny", "trainer=smoke", "logger=none", "telemetry.every=5"]


def make_cfg(*overrides: str) -> DictConfig:
    """conf/config.yaml composed with the tiny test settings and ``overrides`` (later wins)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=[*TINY, *overrides])


@pytest.fixture
def cfg_factory():
    return make_cfg
