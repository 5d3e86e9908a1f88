"""One home per default: ``conf/`` states every default a run uses. A dataclass keeps a default only where code builds it
without Hydra (a model in a test or a benchmark, ``scripts/predict.py``, a saved config written before the key), and
then the default must equal the YAML's; walked over every config group and every schema a group can take."""

import dataclasses
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf

from data.config import CmudictDataConfig, TranslationDataConfig
from model.config import ModelConfig, NormConfig
from runlog.renames import ADDED
from tests.helpers.config import compose_conf
from training.schema import LOGGERS, MODEL_KEYS_NOT_IN_CONFIG, _Composed

# group -> (the preset whose keys a default must equal, the group's schema for it, values given to both builds: keys
# that are no config key, or that the preset leaves to the user).
# The preset is the default run's, or, where a group has no default one (a translation corpus, the loggers), the
# preset that states every key at its default: data=local names no corpus; each logger has its own schema.
SCHEMAS = {
    "model": [(None, ModelConfig, {"src_vocab": 1, "tgt_vocab": 1})],
    "norm": [(None, NormConfig, {})],
    "data": [("cmudict", CmudictDataConfig, {}), ("local", TranslationDataConfig, {"path": "/corpus"})],
    "logger": [(name, schema, {}) for name, schema in LOGGERS.items()],
}


def _schemas(group: str) -> list[tuple[str | None, type, dict]]:
    return SCHEMAS.get(group) or [(None, typing.get_type_hints(_Composed)[group], {})]


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def differences(group: str, preset: str | None, schema: type, given: dict) -> list[str]:
    """``group.key: dataclass default D, YAML Y`` for each key of ``schema`` with a default that disagrees with the
    composed YAML of ``group=preset``: both compared as the dataclass builds them (a list and a tuple alike). A YAML
    value that interpolates another group's key (``norm.knobs.powernorm.warmup_iters: ${schedule.warmup_steps}``)
    cannot be a dataclass default: there the default must be the value a config without the key ran under
    (``runlog.renames.ADDED``). ``norm.knobs`` is compared knob by knob."""
    cfg = compose_conf(*([f"{group}={preset}"] if preset else []))
    raw = OmegaConf.to_container(cfg[group], resolve=False)
    values = OmegaConf.to_container(cfg[group], resolve=True)
    keyed = [f for f in dataclasses.fields(schema) if f.name not in given]
    required = {f.name: values[f.name] for f in keyed if not _has_default(f)}
    build = ModelConfig.from_dict if schema is ModelConfig else (lambda kw: schema(**kw))
    from_yaml, from_defaults = build({**values, **given}), build({**required, **given})
    out = []
    leaves = [
        leaf
        for f in keyed
        if _has_default(f) and f.name in values
        for leaf in _leaves(f"{group}.{f.name}", getattr(from_defaults, f.name), raw[f.name], getattr(from_yaml, f.name))
    ]
    for key, default, raw_value, yaml_value in leaves:
        interpolated = isinstance(raw_value, str) and raw_value.startswith("${")
        expected = ADDED.get(key, "(no value in runlog.renames.ADDED)") if interpolated else yaml_value
        if default != expected:
            out.append(f"{key}: dataclass default {default!r}, {'ADDED' if interpolated else 'YAML'} {expected!r}")
    return out


def _leaves(key: str, default: Any, raw: Any, from_yaml: Any) -> Iterator[tuple[str, Any, Any, Any]]:
    """(key, dataclass default, raw YAML, YAML as built) of a field, or of each knob of ``norm.knobs``
    ({kind: its knobs dataclass})."""
    if not isinstance(default, dict):
        yield key, default, raw, from_yaml
        return
    for kind, knobs in default.items():
        for f in dataclasses.fields(knobs):
            yield f"{key}.{kind}.{f.name}", getattr(knobs, f.name), raw[kind][f.name], getattr(from_yaml[kind], f.name)


@pytest.mark.parametrize("group", [f.name for f in dataclasses.fields(_Composed)])
def test_every_dataclass_default_equals_the_yaml_one(group):
    for preset, schema, given in _schemas(group):
        if dataclasses.is_dataclass(schema):
            assert differences(group, preset, schema, given) == [], schema.__name__


def test_the_walk_sees_every_schema_and_the_defaults_a_library_model_gets():
    walked = {schema for group in SCHEMAS for _, schema, _ in _schemas(group)}
    assert walked >= {ModelConfig, NormConfig, CmudictDataConfig, TranslationDataConfig, *LOGGERS.values()}
    # ModelConfig's fields that are no config key are the data's or the norm group's (MODEL_KEYS_NOT_IN_CONFIG).
    assert {f.name for f in dataclasses.fields(ModelConfig)} - set(compose_conf().model) == set(MODEL_KEYS_NOT_IN_CONFIG)
    # A model built without Hydra is the default run's (conf/model_base.yaml, model=small).
    library = ModelConfig(src_vocab=1, tgt_vocab=1)
    assert (library.d_model, library.n_heads, library.d_ff, library.dropout, library.max_len) == (128, 4, 512, 0.0, 64)
