"""What every preset of every config group composes to, pinned so that moving a default between files (a preset
onto a shared base, a key into ``conf/config.yaml``) cannot change a run's config unnoticed.

    python -m tests.reference.presets write    # regenerate tests/expected/presets.json

``write`` stores the default config (``conf/config.yaml`` composed, interpolations resolved) and, for each preset
``group=name`` of every group (``tests.helpers.config.GROUPS``), the flattened keys whose composed value differs from
the default's (``"model=tiny": {"model.d_model": 32, ...}``; a key the default or the preset lacks reads
:data:`ABSENT`).
``tests/test_presets.py`` composes them afresh against the file: run ``write`` only when a change is meant to alter
what a preset composes to, and say so in the commit.
"""

import argparse
import json
import sys
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.helpers.config import NEEDS, ROOT, presets

EXPECTED = ROOT / "tests" / "expected" / "presets.json"
ABSENT = "<absent>"  # not a value any key holds


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()} or {prefix[:-1]: {}}


def composed() -> dict[str, Any]:
    """``{"default": <the default config, flattened>, "presets": {group=name: {key: value that differs}}}``."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):

        def flat(*overrides: str) -> dict[str, Any]:
            return _flat(OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True))

        default = flat()
        out = {}
        for preset in presets():
            keys = flat(preset, *NEEDS.get(preset, []))
            changed = sorted(k for k in default.keys() | keys.keys() if keys.get(k, ABSENT) != default.get(k, ABSENT))
            out[preset] = {k: keys.get(k, ABSENT) for k in changed}
    return {"default": default, "presets": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["write"])
    parser.parse_args(argv)
    EXPECTED.write_text(json.dumps(composed(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
