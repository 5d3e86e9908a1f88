"""Every preset composes to what tests/expected/presets.json pins (``python -m tests.reference.presets write``), and
the model and telemetry presets state only what differs from it."""

import json

import pytest
from omegaconf import OmegaConf

from tests.helpers.config import ROOT
from tests.reference.presets import EXPECTED, composed

BASES = {"model": "model_base", "telemetry": "telemetry_base"}  # group -> conf/<base>.yaml (norm: tests/test_config.py)


def test_every_preset_composes_to_the_pinned_config():
    expected = json.loads(EXPECTED.read_text())
    fresh = composed()
    assert fresh["default"] == expected["default"]
    assert fresh["presets"] == expected["presets"]
    # The pins are real: the default run's model and a tiny one, the base's values and an override.
    assert fresh["default"]["model.d_model"] == 128 and fresh["default"]["telemetry.every"] == 50
    assert fresh["presets"]["model=tiny"]["model.d_model"] == 32 and fresh["presets"]["model=small"] == {}
    assert fresh["presets"]["telemetry=off"]["telemetry.every"] == 0 and fresh["presets"]["telemetry=light"] == {}


@pytest.mark.parametrize("group", BASES)
def test_each_preset_states_only_what_differs_from_its_base(group):
    base = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / f"{BASES[group]}.yaml"))
    presets = sorted((ROOT / "conf" / group).glob("*.yaml"))
    assert len(presets) >= 3
    for path in presets:
        own = OmegaConf.to_container(OmegaConf.load(path))
        assert own.pop("defaults") == [f"/{BASES[group]}@_here_", "_self_"], path.name
        assert all(key in base and base[key] != value for key, value in own.items()), (path.name, own)
