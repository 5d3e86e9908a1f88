"""The report's baseline: a variant (or LR family) named by its label, in either spelling of a null value
(``norm.qk=None`` as runs' labels hold it, ``norm.qk=null`` as the page shows it), or by the norm preset its
runs used (``pre_ln`` or ``norm=pre_ln``, a file of ``conf/norm/``); and, when none is named, the default one:
the variant that used the default norm preset (``conf/config.yaml``'s ``norm``, pre-LN).

A group of runs (a variant or a family) used a preset when every one of its runs' configs holds the preset's
resolved norm keys (``norm.kind``, ``norm.placement``, ``norm.qk``, ...: what Hydra composes from the preset) at
the preset's values. A run's config that lacks a key (written before the key existed) counts as holding its
value in ``conf/norm_base.yaml``, what every preset starts from: a run from before ``norm.qk`` had no QK-norm.
A preset that sets model keys too (``gemma2``'s soft-caps, ``qwen3next``'s gate: a file written at the top level,
``# @package _global_``) counts those among its keys, so a run without the caps is not named ``gemma2``.
"""

import re
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from analysis.load import ReportError, flatten
from analysis.runs import Run
from analysis.variants import label_pairs, readable_label
from runlog.renames import ADDED

CONF = Path(__file__).resolve().parents[1] / "conf"
NO_BASELINE = "none"  # --baseline none: no Δ columns, not even the default baseline's
_NULL_SHOWN, _NULL_STORED = re.compile(r"=null(?=\s|$)"), re.compile(r"=None(?=\s|$)")


class Group(Protocol):
    """A variant or an LR family: a label and its runs."""

    label: str
    runs: list[Run]


def shown_label(label: str) -> str:
    """``label`` as the page shows it: a null value as ``null`` (YAML's and Hydra's spelling), not Python's ``None``."""
    return _NULL_STORED.sub("=null", label)


def stored_label(label: str) -> str:
    """``label`` as runs' labels hold it: ``key=null`` back to ``key=None`` (the inverse of :func:`shown_label`)."""
    return _NULL_SHOWN.sub("=None", label)


def preset_names() -> list[str]:
    """The norm presets, the names of ``conf/norm/*.yaml``, sorted."""
    return sorted(p.stem for p in (CONF / "norm").glob("*.yaml"))


def default_choice(group: str) -> str:
    """The option of config group ``group`` (``norm``, ``model``) a run uses unless told: ``conf/config.yaml``'s defaults."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml").defaults)
    assert isinstance(defaults, list)  # Hydra's defaults list
    return next(entry[group] for entry in defaults if isinstance(entry, dict) and group in entry)


def default_preset() -> str:
    """The norm preset a run without ``norm=`` uses (pre_ln)."""
    return default_choice("norm")


def _own_keys(norm: Any) -> dict[str, Any]:
    """The flattened keys of a ``norm`` node (unresolved) but those interpolated from another group
    (``norm.knobs.powernorm.warmup_iters: ${schedule.warmup_steps}``): they follow that group, not the norm preset."""
    keys = flatten({"norm": OmegaConf.to_container(norm, resolve=False)})
    return {k: v for k, v in keys.items() if not (isinstance(v, str) and v.startswith("${"))}


def _preset_file(name: str) -> tuple[DictConfig, dict[str, Any]]:
    """Preset ``name``'s file, less its defaults: its norm node, and the flattened model keys a top-level preset sets
    (``model.attn_softcap`` -> 50.0; none for a preset written in the norm package)."""
    cfg = OmegaConf.load(CONF / "norm" / f"{name}.yaml")
    assert isinstance(cfg, DictConfig)  # a config group's file: a mapping
    cfg.pop("defaults", None)
    if "norm" not in cfg:  # the norm package: the file is the norm node
        return cfg, {}
    return cfg.norm, flatten({"model": OmegaConf.to_container(cfg.get("model", {}))})


@cache
def preset_keys(name: str) -> dict[str, Any]:
    """The flattened norm keys (``norm.kind`` -> ``layernorm``, ...) Hydra composes for ``norm=<name>``, but those
    interpolated from another group (:func:`_own_keys`), and the model keys the preset sets."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"norm={name}"])
    return {**_own_keys(cfg.norm), **_preset_file(name)[1]}


def preset_of(label: str) -> str | None:
    """The norm preset a variant's or LR family's ``label`` (``key=value`` pairs, space-separated:
    :func:`analysis.variants.label_pairs`, so a value may hold spaces, as ``norm.blocks``' does) names: the one
    preset of :func:`preset_names` whose composed ``norm.*`` keys (:func:`preset_keys`) hold every ``norm.*`` pair of
    the label, values compared as the label spells them (``str``: ``None``, ``True``, ``1e-06``); keys outside
    ``norm.`` (``model.residual_streams``) are not compared. A label shows only the keys that differ between a study's
    runs, so several presets can fit (``pre_ln`` and ``pre_pn``, whose ``norm.blocks`` a study without blocks does
    not show): then the one whose other norm keys all hold ``conf/norm_base.yaml``'s values, if exactly one does. None
    when no preset fits, or several fit and that does not tell them apart, or ``label`` is not ``key=value`` pairs."""
    try:
        norm_pairs = {k: v for k, v in label_pairs(stored_label(label)).items() if k.startswith("norm.")}
    except ValueError:  # not key=value pairs (a label that already is a preset's name): names no preset by its keys
        return None

    def fits(name: str) -> bool:
        keys = preset_keys(name)
        return all(k in keys and str(keys[k]) == v for k, v in norm_pairs.items())

    def plain_elsewhere(name: str) -> bool:
        base = _base_keys()
        return all(v == base.get(k) for k, v in preset_keys(name).items() if k not in norm_pairs)

    found = [name for name in preset_names() if norm_pairs and fits(name)]
    if len(found) > 1:
        found = [name for name in found if plain_elsewhere(name)]
    return found[0] if len(found) == 1 else None


@cache
def group_preset_keys(group: str, name: str) -> dict[str, Any]:
    """The flattened keys of section ``group`` (``optim.muon.momentum`` -> 0.95; for ``attn``, the ``model`` section's)
    Hydra composes for ``{group}={name}``, resolved."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"{group}={name}"])
    section = "model" if group == "attn" else group
    return flatten({section: OmegaConf.to_container(cfg[section], resolve=True)})


def _group_preset(group: str, pairs: dict[str, str]) -> str | None:
    """The one preset of config group ``group`` whose composed keys hold each of ``pairs`` (``?``: a key the run's
    config lacks, where the preset lacks it too), ``none`` where it is among several (``attn=qk_norm`` differs from it
    in a norm key only, which the norm preset's name tells); None when none or several others do."""

    def fits(name: str) -> bool:
        keys = group_preset_keys(group, name)
        return all((v == "?" and k not in keys) or (k in keys and str(keys[k]) == v) for k, v in pairs.items())

    found = [name for name in sorted(p.stem for p in (CONF / group).glob("*.yaml")) if fits(name)]
    return "none" if len(found) > 1 and "none" in found else found[0] if len(found) == 1 else None


# The model keys an attention-logit control preset (conf/attn/) sets: how a label tells the control.
ATTN_KEYS = ("model.attn_gate", "model.attn_sink", "model.attn_softmax", "model.attn_softcap")


def study_name(label: str) -> str | None:
    """An LR family's name in a study: its norm preset (:func:`preset_of`), then its attention-logit control (a file of
    ``conf/attn/``, left out when ``none``) when the label holds the control's model keys, then its optimizer preset (a
    file of ``conf/optim/``) when the label holds ``optim.*`` keys: ``pre_ln muon``, ``pre_ln gate``. Each is the one
    preset whose composed keys hold the label's pairs of its keys. None when a preset is not found, or not alone."""
    norm = preset_of(label)
    pairs = label_pairs(stored_label(label)) if norm else {}
    by_group = {
        "attn": {k: v for k, v in pairs.items() if k in ATTN_KEYS},
        "optim": {k: v for k, v in pairs.items() if k.startswith("optim.")},
    }
    parts = [norm, *(_group_preset(group, keys) for group, keys in by_group.items() if keys)]
    named = [p for p in parts if p is not None]
    if len(named) < len(parts):
        return None
    return " ".join(p for p in named if p != "none")


def study_names(labels: Iterable[str]) -> dict[str, str]:
    """Each LR family label of one study -> its :func:`study_name` (``pre_ln muon``).

    Raises:
        ValueError: a label names no single preset (none or several fit its keys), or two labels name one."""
    names: dict[str, str] = {}
    for label in dict.fromkeys(labels):
        if (name := study_name(label)) is None:
            raise ValueError(f"family {label!r} names no single norm preset, or optimizer preset (none or several fit its keys)")
        if name in names.values():
            raise ValueError(f"families {label!r} and {next(k for k, v in names.items() if v == name)!r} both name preset {name}")
        names[label] = name
    return names


@cache
def _base_keys() -> dict[str, Any]:
    """The values of norm keys older runs lack: ``conf/norm_base.yaml``'s, flattened under ``norm.``, with each key
    added since (``runlog.renames.ADDED``) at the value the old code ran under."""
    added = {k: v for k, v in ADDED.items() if k.startswith(("norm.", "model."))}  # model.: a top-level preset's
    return {**_own_keys(OmegaConf.load(CONF / "norm_base.yaml")), **added}


def used_preset(group: Group, name: str) -> bool:
    """Whether every run of ``group`` used norm preset ``name`` (its config holds the preset's norm keys)."""
    return _holds(group, preset_keys(name))


def _holds(group: Group, keys: dict[str, Any]) -> bool:
    base = _base_keys()
    return bool(group.runs) and all(run.config.get(k, base.get(k)) == v for run in group.runs for k, v in keys.items())


@cache
def _declared_keys(name: str) -> dict[str, Any]:
    """The norm keys of ``conf/norm_base.yaml`` overlaid with those preset ``name``'s file sets (lists replaced, as
    Hydra merges them), but interpolated ones: what Hydra composes when the preset's defaults are norm_base, then
    itself, as every preset's are; read in milliseconds where a compose takes a second, so :func:`preset_used` asks
    Hydra (:func:`used_preset`) only about the presets this one allows."""
    norm, model = _preset_file(name)
    return {**_own_keys(OmegaConf.merge(OmegaConf.load(CONF / "norm_base.yaml"), norm)), **model}


def preset_used(group: Group) -> str | None:
    """The norm preset every run of ``group`` used (:func:`used_preset`): None when none did, or several did."""
    found = [name for name in preset_names() if _holds(group, _declared_keys(name)) and used_preset(group, name)]
    return found[0] if len(found) == 1 else None


def _named(groups: Sequence[Group], label: str) -> Group | None:
    """The group ``label`` names: its label (``null`` or ``None`` alike), the label in flow style
    (``analysis.variants.readable_label``), or its name on the page (a variant's ``name``: ``pre_ln optim.lr=0.002``)."""
    for g in groups:
        if stored_label(g.label) == stored_label(label) or label in (readable_label(g), getattr(g, "name", "")):
            return g
    return None


def _listed(group: Group) -> str:
    """A group as an error lists it: as the page names it (a variant's ``name``, ``analysis.names``), then its label
    in flow style where that differs (``'pre_bn' ('norm.kind=batchnorm ...')``); a family by its label."""
    name, keys = getattr(group, "name", "") or shown_label(group.label), readable_label(group)
    return repr(name) if name in (keys, shown_label(group.label)) else f"{name!r} ({keys!r})"


def resolve_baseline(given: str | None, variants: Sequence[Group], families: Sequence[Group] = ()) -> tuple[str | None, bool]:
    """(the label of the baseline, whether it is the default one) for ``--baseline given``.

    ``given`` is a variant's or a family's label (``null`` or ``None`` alike), a norm preset's name (``pre_ln``,
    ``norm=pre_ln``: the one variant whose runs used it, else the one family, as in an LR sweep where each LR is a
    variant), ``none`` (no baseline), or None:
    the variant that used the default preset when exactly one did, else no baseline.

    Raises:
        ReportError: ``given`` is none of these (the message lists the labels and the presets some variant or
            family used), or a preset several variants and no single family, or several families, used (the
            message lists them).
    """
    if given is None:
        users = [v for v in variants if used_preset(v, default_preset())]
        return (users[0].label, True) if len(users) == 1 else (None, False)
    if given == NO_BASELINE:
        return None, False
    if (group := _named(variants, given) or _named(families, given)) is not None:
        return group.label, False
    name = given.removeprefix("norm=")
    if name in preset_names():
        # A sweep with an LR axis has one variant per LR for each family: several variants, one family, which is meant.
        named = (("variants", variants), ("families", families))
        using = {what: [g for g in groups if used_preset(g, name)] for what, groups in named}
        for matched in (using["variants"], using["families"]):
            if len(matched) == 1:
                return matched[0].label, False
        what, several = next(((w, u) for w, u in using.items() if u), (None, []))
        if several:
            labels = ", ".join(_listed(g) for g in several)
            raise ReportError(
                f"--baseline {given!r}: norm preset {name} was used by {len(several)} {what}, {labels}; pass one of these labels"
            )
    labels = ", ".join(_listed(g) for g in [*variants, *families])
    used = [p for p in preset_names() if any(used_preset(g, p) for g in [*variants, *families])]
    raise ReportError(
        f"unknown --baseline {given!r}; valid: {labels}, a norm preset some variant used "
        f"({', '.join(used) or 'none here'}), or {NO_BASELINE!r}"
    )
