"""Keys and types of plain YAML data checked against a dataclass, for ``training.schema.validate``: every key known
(or named as renamed: ``runlog.renames``), every value of its field's type, strictly (a bool is not an integer, a string
is never coerced), each problem one line naming the key, the value and the expected type."""

import dataclasses
import types
import typing
from typing import Any

from runlog.renames import renamed_message

_NOUNS = {
    bool: ("a boolean (true or false)", "booleans"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
}


def _describe(tp: Any) -> str:
    """``tp`` in words: ``an integer or null``, ``a list of 2 numbers``, ..."""
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType):
        words = " or ".join(_describe(a) for a in args if a is not type(None))
        return f"{words} or null" if type(None) in args else words
    if typing.get_origin(tp) in (tuple, list):
        count = "" if len(args) == 1 or args[-1] is Ellipsis else f"{len(args)} "
        noun = "mappings" if dataclasses.is_dataclass(args[0]) else _NOUNS[args[0]][1]  # norm.blocks: a list of BlockNorm
        return f"a list of {count}{noun}"
    if dataclasses.is_dataclass(tp) or dict in (tp, typing.get_origin(tp)):
        return "a mapping of keys to values"
    return _NOUNS[tp][0]


def _matches(value: Any, tp: Any) -> bool:
    """Whether ``value`` (plain YAML data) has type ``tp``; a bool is not an integer, an integer is a number."""
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType):
        return any(_matches(value, a) for a in args)
    if typing.get_origin(tp) in (tuple, list):
        if not isinstance(value, list):
            return False
        if len(args) == 1 or args[-1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args, strict=True))
    if dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict:  # norm.knobs: its dataclass checks the rest
        return isinstance(value, dict)
    if tp in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if tp is float else tp)


def check_keys(values: dict, schema: Any, prefix: str, group: str, skip: tuple[str, ...] = ()) -> None:
    """Check the keys and types of ``values`` (plain YAML data) against the dataclass ``schema``,
    recursing into nested dataclass fields. ``prefix`` is prepended to key names in messages
    (``trainer.``), ``group`` names the schema, ``skip`` lists fields that are not config keys.

    Raises:
        ValueError: an unknown key (the message lists the valid ones, or names the new key of a
            renamed one: ``runlog.renames``), a missing key that has
            no default, or a value of the wrong type (the message names the expected type).
    """
    fields = [f for f in dataclasses.fields(schema) if f.name not in skip]
    hints = typing.get_type_hints(schema)
    valid = [f.name for f in fields]
    for key in values:
        if key not in valid:
            if renamed := renamed_message(prefix + key):
                raise ValueError(renamed)
            raise ValueError(f"{prefix}{key} is not a key of {group}; valid keys: {', '.join(valid)}")
    for f in fields:
        key, tp = prefix + f.name, hints[f.name]
        if f.name not in values:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{key} is missing: expected {_describe(tp)}")
        elif not _matches(values[f.name], tp):
            raise ValueError(f"{key}={values[f.name]!r} is invalid: expected {_describe(tp)}")
        elif dataclasses.is_dataclass(tp):
            check_keys(values[f.name], tp, key + ".", key)
