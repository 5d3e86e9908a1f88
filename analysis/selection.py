"""Rows of committed per-run CSVs picked by ``column: value`` selectors and paired by a column (e.g. ``seed``): the
mechanism a claims file (:mod:`analysis.claims`, :mod:`analysis.verdicts`) and a contrasts spec
(:mod:`analysis.contrasts`) share.

A contrast is ``arm`` minus ``baseline``, each a selector of rows of ``csv`` (a side may name its own ``csv``), or
``arm`` minus a number (``against``); ``at`` is a selector both sides share. Its per-pair differences are the arm's
``metric`` minus the baseline's, pair by pair; a ``minus`` contrast's differences are subtracted from them pair by pair
(a difference of differences). A selector's value selects a cell that spells it (``pre_ln``), the same number (``1.0``
selects ``1``), the same boolean in any case (``true`` selects ``True``), or, for a null, an empty cell or ``None``.

A row is *unfinished* when its ``learned`` is false, its ``state`` is not ``finished`` or its ``diverged`` is true.
Every error is a :class:`SelectionError` of one line naming the file, the entry, the bad value and the valid choices.
"""

import csv
import math
from dataclasses import dataclass
from pathlib import Path

FAILED = (("learned", "false"), ("state", None), ("diverged", "true"))  # (column, its failing value; None: not finished)
UNFINISHED = ("flag", "skip", "keep")  # what an unfinished row does: stops the contrast, is left out, is compared
MINUS_KEYS = ("arm", "baseline", "at")


class SelectionError(ValueError):
    """A spec, CSV or row that cannot give paired values; the message is one line naming the file, the entry, the bad
    value and the valid choices."""


class Absent(SelectionError):
    """The rows asked for are not there (no CSV, no matching row, a pair missing); ``what`` says which in a few words
    (a claims file written before its runs calls them not yet run)."""

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


class Unfinished(Exception):
    """A side has an unfinished row (with ``unfinished="flag"``): the message says which rows and why."""


@dataclass(frozen=True)
class Side:
    """The rows of ``csv`` (a path under the root the CSVs are read from) whose columns equal ``where``'s values."""

    csv: str
    where: tuple[tuple[str, object], ...]

    def label(self, default_csv: str, skip: tuple[str, ...] = ()) -> str:
        """``column=value`` pairs (but the columns in ``skip``), with the CSV's path first when it is not the
        contrast's own ``default_csv``."""
        text = " ".join(f"{k}={v}" for k, v in self.where if k not in skip)
        return text if self.csv == default_csv else f"{self.csv}: {text}"


@dataclass(frozen=True)
class Contrast:
    """arm minus baseline, or arm minus the number ``against``; ``at``: the selector both sides share (already in
    each side's ``where``; kept to write the contrast once)."""

    arm: Side
    baseline: Side | None
    against: float | None
    at: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class Measure:
    """What a contrast reads: ``metric``, a column of ``csv`` (the contrast's own CSV, a path under the root), its rows
    paired by the column ``pair_by``."""

    csv: str
    metric: str
    pair_by: str


def parse_contrast(raw: dict, csv: str, here: str, allow_against: bool) -> Contrast:
    """The contrast of ``raw``'s ``arm``, ``baseline`` (or, if ``allow_against``, ``against``) and ``at``, its sides
    in ``csv`` unless they name their own; ``here`` (the file and entry) starts every error.

    Raises:
        SelectionError: not exactly one of baseline and against, an against that is not a number, a selector that is
            not a mapping or selects nothing.
    """
    at = mapping(raw.get("at", {}), here, "at")
    has_baseline, has_against = "baseline" in raw, allow_against and "against" in raw
    if has_baseline == has_against:
        valid = "baseline (a selector) or against (a number)" if allow_against else "baseline"
        raise SelectionError(f"{here}: needs exactly one of {valid}")
    against = raw.get("against") if has_against else None
    if has_against and (isinstance(against, bool) or not isinstance(against, int | float)):
        raise SelectionError(f"{here}: against is {against!r}; valid: a number")
    baseline = _side(raw["baseline"], at, csv, here, "baseline") if has_baseline else None
    arm = _side(raw.get("arm"), at, csv, here, "arm")
    return Contrast(arm, baseline, None if against is None else float(against), tuple(at.items()))


def parse_minus(raw: object, csv: str, here: str) -> Contrast:
    """The ``minus`` contrast of an entry (``{arm:, baseline:, at:}``); errors as :func:`parse_contrast`'s."""
    raw = mapping(raw, here, "minus")
    keys(raw, MINUS_KEYS, ("arm", "baseline"), f"{here}: minus")
    return parse_contrast(raw, csv, f"{here}: minus", allow_against=False)


def _side(raw: object, at: dict, csv: str, here: str, name: str) -> Side:
    raw = mapping(raw, here, name)
    if not raw or set(raw) == {"csv"}:
        raise SelectionError(f"{here}: {name} is {raw!r}; valid: a selector of column: value pairs, e.g. {{family: pre_ln}}")
    where = {**at, **{k: v for k, v in raw.items() if k != "csv"}}
    return Side(str(raw.get("csv", csv)), tuple(where.items()))


def mapping(value: object, where: str, name: str) -> dict:
    """``value`` (``name`` at ``where``), typed as the mapping it is; raises SelectionError unless it is one."""
    if not isinstance(value, dict):
        raise SelectionError(f"{where}: {name} is {value!r}; valid: a mapping of keys to values")
    return value


def keys(raw: dict, allowed: tuple[str, ...], required: tuple[str, ...], where: str) -> None:
    """Raises SelectionError naming the first key of ``raw`` not ``allowed``, or the first ``required`` one missing."""
    for key in raw:
        if key not in allowed:
            raise SelectionError(f"{where}: unknown key {key!r}; valid: {', '.join(allowed)}")
    for key in required:
        if key not in raw:
            raise SelectionError(f"{where}: missing key {key!r}; required: {', '.join(required)}")


class Tables:
    """The CSVs under ``root``, each read once: path -> its rows (column -> cell text)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._rows: dict[str, list[dict[str, str]]] = {}

    def rows(self, csv_path: str, here: str) -> list[dict[str, str]]:
        """The rows of ``csv_path`` (relative to the root). Raises :class:`Absent` when it is not a file."""
        if csv_path not in self._rows:
            path = self.root / csv_path
            if not path.is_file():
                raise Absent(
                    f"{here}: no CSV {csv_path} under {self.root}; valid: a path under {self.root}", f"{csv_path} does not exist"
                )
            with path.open(newline="", encoding="utf-8") as f:
                self._rows[csv_path] = list(csv.DictReader(f))
        return self._rows[csv_path]


def differences(
    contrast: Contrast,
    minus: Contrast | None,
    measure: Measure,
    tables: Tables,
    here: str,
    pairs: tuple[object, ...] | None = None,
    unfinished: str = "flag",
) -> dict[str, float]:
    """pair -> the contrast's difference (minus ``minus``'s), over ``pairs`` (every one required) or, when None, the
    pairs every side has; ``unfinished``: one of ``UNFINISHED``.

    Raises:
        Absent: a CSV, a selector's rows or one of ``pairs`` is not there.
        Unfinished: a compared row is unfinished (``unfinished="flag"``).
        SelectionError: a missing column, a selector matching more than one row of a pair, a metric value that is not
            a finite number, no pair on every side.
    """
    diffs = _difference(contrast, measure, tables, here, pairs, unfinished)
    if minus is not None:
        other = _difference(minus, measure, tables, here, pairs, unfinished)
        diffs = {k: d - other[k] for k, d in diffs.items() if k in other}
    if not diffs:
        raise SelectionError(f"{here}: no {measure.pair_by} is on every side; valid: sides sharing a {measure.pair_by}")
    return diffs


def _difference(contrast: Contrast, measure: Measure, tables: Tables, here: str, pairs, unfinished) -> dict[str, float]:
    arm = side_values(contrast.arm, measure, tables, here, pairs, unfinished)
    if contrast.baseline is None:
        assert contrast.against is not None  # a contrast has a baseline or an against (parse_contrast)
        return {k: v - contrast.against for k, v in arm.items()}
    base = side_values(contrast.baseline, measure, tables, here, pairs, unfinished)
    return {k: v - base[k] for k, v in arm.items() if k in base}


def side_values(
    side: Side, measure: Measure, tables: Tables, here: str, pairs: tuple[object, ...] | None = None, unfinished: str = "flag"
) -> dict[str, float]:
    """pair -> the metric of ``side``'s row for it, over ``pairs`` (or every pair it has, when None); an unfinished
    row is flagged, skipped or kept as ``unfinished`` says, and so (when skipped) is a row with an empty metric.
    Raises as :func:`differences`."""
    rows = tables.rows(side.csv, here)
    for column in [measure.pair_by, measure.metric, *(k for k, _ in side.where)]:
        if rows and column not in rows[0]:
            raise SelectionError(f"{here}: {side.csv} has no column {column!r}; valid: {', '.join(rows[0])}")
    chosen = [r for r in rows if all(matches(r[k], v) for k, v in side.where)]
    if unfinished == "skip":
        chosen = [r for r in chosen if not _failures(r) and r[measure.metric] != ""]
    label, which = side.label(measure.csv), " ".join(f"{k}={v}" for k, v in side.where)
    if not chosen and (rows or pairs is None):
        valid = "; ".join(f"{k}: {', '.join(sorted({r[k] for r in rows}))}" for k, _ in side.where)
        finished = "finished row with a value " if unfinished == "skip" else "row "
        raise Absent(
            f"{here}: {label} matches no {finished}of {side.csv}; valid values there: {valid}",
            f"no row of {side.csv} with {which} and {measure.pair_by} {', '.join(map(str, pairs or ()))}",
        )
    by_pair = _by_pair(chosen, measure.pair_by, side, label, here)
    missing = [s for s in pairs or () if str(s) not in by_pair]
    if missing:
        text = f"no row of {side.csv} with {which} and {measure.pair_by} {', '.join(map(str, missing))}"
        valid = ", ".join(sorted(by_pair)) or "none"
        raise Absent(f"{here}: {text}; valid {measure.pair_by} values there: {valid}", text)
    picked = by_pair if pairs is None else {str(s): by_pair[str(s)] for s in pairs}
    if unfinished == "flag":
        failed = [f"{label} {measure.pair_by}={k} ({why})" for k, r in picked.items() for why in _failures(r)]
        if failed:
            raise Unfinished("; ".join(failed))
    return {k: _number(r[measure.metric], here, f"{label} {measure.pair_by}={k}") for k, r in picked.items()}


def _by_pair(rows: list[dict[str, str]], pair_by: str, side: Side, label: str, here: str) -> dict[str, dict[str, str]]:
    by_pair: dict[str, dict[str, str]] = {}
    for row in rows:
        if row[pair_by] in by_pair:
            raise SelectionError(
                f"{here}: {label} matches more than one row of {side.csv} with {pair_by}={row[pair_by]}; "
                "valid: a selector naming one row per pair"
            )
        by_pair[row[pair_by]] = row
    return by_pair


def matches(cell: str, value: object) -> bool:
    """Whether a CSV ``cell`` is the selector's ``value``: the same text or number (``1.0`` selects ``1``), a boolean
    in any case, a null as an empty cell or ``None``."""
    if isinstance(value, bool):
        return cell.lower() == str(value).lower()
    if value is None:
        return cell in ("", "None")
    if cell == str(value):
        return True
    try:
        return float(cell) == float(str(value))  # a YAML scalar: its text parses as it does in a cell
    except ValueError:
        return False


def _failures(row: dict[str, str]) -> list[str]:
    """``column=cell`` for each way ``row`` is unfinished (module docstring); empty for a finished row."""
    bad = [(c, row[c]) for c, failing in FAILED if c in row and _failed(row[c], failing)]
    return [f"{c}={cell}" for c, cell in bad]


def _failed(cell: str, bad: str | None) -> bool:
    return cell != "finished" if bad is None else cell.lower() == bad


def _number(cell: str, here: str, which: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise SelectionError(f"{here}: {which} has metric value {cell!r}; valid: a finite number")
    return value
