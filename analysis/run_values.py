"""One number per run from its per-block telemetry: a profile's values at the run's last record that has any, over
the sites a pattern names, reduced to one (the largest W_q or W_k spectral norm, the largest sink mass).

A *column* is ``(name, profile, pattern, reduce)``: ``profile`` one of the report's per-block profiles
(``analysis.load.PROFILES`` by depth: ``rms``, ``sink_mass``, ``massive``, ...; ``SITE_PROFILES`` by site:
``max_logit``, ``sigma_max``, ...), ``pattern`` an ``fnmatch`` pattern over each value's site name (``enc.0`` for a
profile by depth, ``enc.0.self_attn.q`` for one by site: ``*attn.[qk]`` names every query and key matrix), ``reduce``
one of ``REDUCERS``. Used by ``python -m scripts.run_values``.
"""

import statistics
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

from analysis.load import PROFILES, SITE_PROFILES
from analysis.lrs import LRStudy
from analysis.runs import BlockSite, Run

REDUCERS: dict[str, Callable[[Sequence[float]], float]] = {"max": max, "min": min, "mean": statistics.fmean}
PROFILE_NAMES = tuple(sorted({*PROFILES.values(), *SITE_PROFILES.values()}))


class Column(NamedTuple):
    """One value per run: ``reduce`` over ``profile``'s values at the run's last record, at the sites ``pattern`` names."""

    name: str
    profile: str
    pattern: str
    reduce: str


def column(name: str, profile: str, pattern: str, reduce: str) -> Column:
    """A checked :class:`Column`.

    Raises:
        ValueError: ``profile`` is not a per-block profile or ``reduce`` not a reducer (the message lists the choices),
            or ``name`` is empty.
    """
    if profile not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {profile!r}; valid: {', '.join(PROFILE_NAMES)}")
    if reduce not in REDUCERS:
        raise ValueError(f"unknown reduce {reduce!r}; valid: {', '.join(REDUCERS)}")
    if not name:
        raise ValueError("a column needs a name")
    return Column(name, profile, pattern, reduce)


def site_name(key: Any, n_enc: int) -> str:
    """A profile value's site: ``enc.0.self_attn.q`` for a :class:`BlockSite`, the block (``dec.1``) for a depth."""
    if isinstance(key, BlockSite):
        return f"{key.block}.{key.site}"
    return f"enc.{key}" if key < n_enc else f"dec.{key - n_enc}"


def last_value(run: Run, col: Column) -> float | None:
    """``col``'s reduction at ``run``'s last record holding a site ``col.pattern`` names; None when no
    record does (the profile unrecorded, or no site matches)."""
    for _, record in sorted(run.profile(col.profile).items(), reverse=True):
        values = [v for key, v in record.items() if fnmatchcase(site_name(key, run.n_enc), col.pattern)]
        if values:
            return REDUCERS[col.reduce](values)
    return None


def study_rows(study: LRStudy, columns: Sequence[Column], names: Callable[[str], str] = str) -> list[list[Any]]:
    """One row per family, seed and LR of ``study`` (the cells of ``lr_sensitivity.csv``, in its order): the family's
    name (``names(label)``), seed, lr, the cell's state, then each column's :func:`last_value` (None for a cell
    without a run or without the value)."""
    rows = []
    for family in study.families:
        for seed in family.seeds:
            for cell in seed.cells:
                found = [None if cell.run is None else last_value(cell.run, col) for col in columns]
                rows.append([names(family.label), seed.seed, cell.lr, cell.state, *found])
    return rows
