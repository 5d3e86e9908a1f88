"""The inputs of ``python -m scripts.seeds_needed``: each family's per-seed LRS read from lrs_seeds.csv, and the plan's
CSV columns (the power computation itself: :mod:`analysis.power`)."""

from analysis.presets import study_name

SEED_COLUMNS = ("family", "seed", "lrs")  # of lrs_seeds.csv, what the plan reads
PLAN_FIELDS = ("family", "baseline", "pairs", "diff_mean", "sd", "sd_upper", "n_point", "n_upper", "power", "alpha", "level")


def seed_lrs(rows: list[dict[str, str]], name: str) -> dict[str, float]:
    """``{seed: LRS}`` of the family labelled ``name``, or of the one family that used the preset(s) ``name``
    (``pre_ln``; ``pre_ln muon``: ``analysis.presets.study_name``); seeds without an LRS left out. Raises ValueError
    naming the families when none (or several) fit."""
    labels = sorted({r["family"] for r in rows})
    chosen = [label for label in labels if label == name] or [label for label in labels if study_name(label) == name]
    if len(chosen) != 1:
        raise ValueError(f"family {name!r}: {'several' if chosen else 'no'} family fits; the families: {labels}")
    return {r["seed"]: float(r["lrs"]) for r in rows if r["family"] == chosen[0] and r["lrs"]}
