"""Variants' names in the report (its tables, the charts' legends, ``table.md`` and ``table.tex``): a variant whose
runs all used one norm preset (a file of ``conf/norm/``: ``analysis.presets.preset_used``) is named by it, followed
by the keys of its label outside ``norm.`` (``pre_ln optim.lr=0.002``: what else sets it apart; the preset fixes its
norm keys); any other variant by its label with values in YAML's flow style (``analysis.variants.readable_label``).
Where two variants would share a name, both keep the flow-style label.

The label itself (every key that differs between the variants, values as Python spells them) stays the variant's
key: the ``variant`` column of ``summary.csv``, ``runs.csv`` and ``curves.csv`` and the page's ``data-variant``
attributes hold it as before, and ``--baseline`` takes it, the name or the preset (``analysis.presets``).
"""

from collections import Counter

from analysis.presets import preset_used
from analysis.variants import Variant, flow, label_pairs, readable_label


def own_keys(variant: Variant) -> list[str]:
    """``key=value`` (flow style) for each key of ``variant``'s label outside ``norm.``, in the label's order."""
    try:
        keys = [k for k in label_pairs(variant.label) if not k.startswith("norm.")]
    except ValueError:  # not key=value pairs
        return []
    config = variant.runs[0].config if variant.runs else {}
    return [f"{k}={flow(config[k]) if k in config else '?'}" for k in keys]


def name_variants(variants: list[Variant]) -> None:
    """Set each variant's ``preset`` (the norm preset all its runs used, or None) and ``name``: the preset and
    :func:`own_keys` (``pre_bn``, ``pre_ln optim.lr=0.002``), else its flow-style label; where two names coincide,
    those variants' flow-style labels."""
    for variant in variants:
        variant.preset = preset_used(variant)
        readable = readable_label(variant)
        variant.name = " ".join([variant.preset, *own_keys(variant)]) if variant.preset else readable
    counts = Counter(v.name for v in variants)
    for variant in variants:
        if counts[variant.name] > 1:
            variant.name = readable_label(variant)


def named_keys(variants: list[Variant]) -> list[tuple[str, str]]:
    """(name, flow-style label) of each named variant whose name is not its label: the key to a table's short names."""
    return [(v.name, keys) for v in variants if v.name and v.name != (keys := readable_label(v))]
