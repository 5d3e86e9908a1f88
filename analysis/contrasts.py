"""Paired contrasts between rows of committed per-run CSVs (a results section's ``runs.csv``, ``regime_runs.csv``):
what docs/results.md quotes beyond its report's own tables, recomputed from the CSVs alone, so a reader needs no run
dirs to check it.

A contrast (one entry of a spec file, ``docs/results/<section>/paired.yaml``):

- ``contrast``: its name, the key of its row in the output;
- ``csv``: the per-run CSV, relative to the spec's folder; ``metric``: its column;
- ``arm`` and ``baseline``: each a selector ``{column: value}`` picking one cell's rows (one row per seed); a side may
  name its own ``csv`` (a diagnostic run's CSV beside the study's);
- ``minus`` (optional): ``{arm: ..., baseline: ...}``, a second arm-minus-baseline subtracted seed by seed: a
  difference of differences (does the first difference change with the setting?);
- ``relative`` (optional, true): also the difference over the baseline's mean over the paired seeds (the paper's unit
  where it quotes a relative change); not with ``minus``.

Only finished rows with a value enter (a ``state`` column other than ``finished`` leaves the row out). Seeds pair by
the ``seed`` column; the interval is ``analysis.paired.paired_difference``'s (95 %, t with n - 1 dof).
"""

import csv
import statistics
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from analysis.paired import PairedDifference, paired_difference

COLUMNS = ("contrast", "metric", "diff_mean", "diff_ci95_lo", "diff_ci95_hi", "pairs", "significant", "rel_diff",
           "rel_ci95_lo", "rel_ci95_hi")  # fmt: skip
SPEC_KEYS = {"contrast", "csv", "metric", "arm", "baseline", "minus", "relative"}


class ContrastError(ValueError):
    """A spec or CSV that cannot give a contrast; the message names the contrast and the bad value."""


@dataclass(frozen=True)
class Contrast:
    """One computed contrast: its paired difference and, for a ``relative`` one, that difference's mean and interval
    over the baseline's mean (fractions; None otherwise)."""

    name: str
    metric: str
    diff: PairedDifference
    relative: tuple[float, float, float] | None

    def row(self) -> list[object]:
        """The contrast as a row of ``COLUMNS`` (None: no value)."""
        d = self.diff
        lo, hi = d.ci95 or (None, None)
        return [self.name, self.metric, d.mean, lo, hi, d.n, d.significant, *(self.relative or (None, None, None))]


def _same(shown: str, wanted: Any) -> bool:
    """Whether a CSV field equals a selector's value: as text, or as numbers (``1.0`` selects ``1``)."""
    if shown == str(wanted):
        return True
    try:
        return float(shown) == float(wanted)
    except (TypeError, ValueError):
        return False


def _read(path: Path, name: str) -> list[dict[str, str]]:
    if not path.is_file():
        raise ContrastError(f"{name}: no CSV {path}")
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def side_values(rows: list[dict[str, str]], where: dict[str, Any], metric: str, name: str) -> dict[Hashable, float]:
    """seed -> ``metric`` of the finished ``rows`` that ``where`` selects.

    Raises:
        ContrastError: a selector column or ``metric`` is not a column (the valid ones listed), no finished row with a
            value matches, or a seed repeats.
    """
    columns = list(rows[0]) if rows else []
    for column in [*where, metric, "seed"]:
        if column not in columns:
            raise ContrastError(f"{name}: no column {column!r}; valid: {', '.join(columns)}")
    out: dict[Hashable, float] = {}
    for row in rows:
        if row.get("state", "finished") != "finished" or row[metric] == "":
            continue
        if all(_same(row[k], v) for k, v in where.items()):
            if row["seed"] in out:
                raise ContrastError(f"{name}: seed {row['seed']} appears twice in {where}")
            out[row["seed"]] = float(row[metric])
    if not out:
        raise ContrastError(f"{name}: no finished row with a {metric} value matches {where}")
    return out


def _difference(spec: dict, folder: Path, name: str, metric: str) -> tuple[dict[Hashable, float], dict[Hashable, float]]:
    """(arm, baseline) seed -> value of one arm-minus-baseline of a spec (``spec['csv']`` unless a side names its own)."""
    sides = []
    for side in ("arm", "baseline"):
        where = dict(spec.get(side) or {})
        if not where:
            raise ContrastError(f"{name}: no {side!r} selector")
        path = folder / str(where.pop("csv", spec.get("csv", "")))
        sides.append(side_values(_read(path, name), where, metric, name))
    return sides[0], sides[1]


def compute(spec: dict, folder: Path) -> Contrast:
    """The contrast of one spec entry (module docstring), its CSVs read under ``folder``.

    Raises:
        ContrastError: an unknown key, a missing ``contrast``/``csv``/``metric``, ``relative`` with ``minus``, or a
            side :func:`side_values` refuses; a difference of differences whose two differences share no seed.
    """
    name = str(spec.get("contrast", "?"))
    if unknown := set(spec) - SPEC_KEYS:
        raise ContrastError(f"{name}: unknown key(s) {sorted(unknown)}; valid: {', '.join(sorted(SPEC_KEYS))}")
    for key in ("contrast", "csv", "metric"):
        if not spec.get(key):
            raise ContrastError(f"{name}: no {key!r}")
    metric = spec["metric"]
    arm, base = _difference(spec, folder, name, metric)
    if "minus" not in spec:
        diff = paired_difference(arm, base)
        relative = _relative(diff, base, arm) if spec.get("relative") else None
        return Contrast(name, metric, diff, relative)
    if spec.get("relative"):
        raise ContrastError(f"{name}: 'relative' is for a plain difference, not with 'minus'")
    first = {s: arm[s] - base[s] for s in arm if s in base}
    other_arm, other_base = _difference({"csv": spec["csv"], **(spec["minus"] or {})}, folder, name, metric)
    second = {s: other_arm[s] - other_base[s] for s in other_arm if s in other_base}
    if not set(first) & set(second):
        raise ContrastError(f"{name}: the two differences share no seed")
    return Contrast(name, metric, paired_difference(first, second), None)


def _relative(diff: PairedDifference, base: dict, arm: dict) -> tuple[float, float, float] | None:
    """(mean, lo, hi) of ``diff`` over the baseline's mean over the paired seeds; None without an interval."""
    if diff.mean is None or diff.ci95 is None:
        return None
    b = statistics.fmean(base[s] for s in arm if s in base)
    return diff.mean / b, diff.ci95[0] / b, diff.ci95[1] / b


def load_spec(path: Path) -> list[dict]:
    """The contrasts of a spec file (YAML: ``contrasts:`` a list of entries).

    Raises:
        ContrastError: no such file, not YAML, or no ``contrasts`` list of mappings.
    """
    if not path.is_file():
        raise ContrastError(f"no spec file {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ContrastError(f"{path}: not YAML ({str(err).splitlines()[0]})") from None
    entries = data.get("contrasts") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ContrastError(f"{path}: wants 'contrasts:', a list of mappings (contrast, csv, metric, arm, baseline)")
    return entries
