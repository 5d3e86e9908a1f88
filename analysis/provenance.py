"""Provenance of the results page: how far a committed cell moves when it is re-run with today's code.

A *cell* is one run of a section of docs/results.md, named by a spec (``docs/results/provenance_cells.yaml``): the
section's per-run CSV and the row's key columns, the metric (a CSV column), the columns that name its arm (the key
without the seed), the commit the section's runs used, and the command and run directory of its re-run. The row of
``provenance.csv`` (``FIELDS``) puts the committed value (the CSV's, as written) beside the re-run's, read from the
re-run's run directory (made at the commit the caller names, or at the entry's own ``rerun_commit``) with the function
the section's CSV was written with (a ``reader`` per metric, given by the caller), the difference (re-run minus
committed), and the seed-to-seed sd of that metric over the arm's committed rows (``statistics.stdev``: n - 1), so the
difference also reads in sds. A spec entry without a run directory (a cell not
re-run) gets empty re-run fields and its ``note``; a benchmark's cell is re-read from the CSV its tool wrote again.
"""

import csv
import json
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from analysis.load import load_run
from analysis.runs import Run

FIELDS = (
    "section",
    "folder",
    "runs_commit",
    "runs_commit_source",
    "csv",
    "key",
    "metric",
    "committed",
    "rerun",
    "diff",
    "arm_sd",
    "arm_n",
    "diff_in_sd",
    "rerun_commit",
    "rerun_command",
    "note",
)
SPEC_KEYS = ("section", "folder", "runs_commit", "runs_commit_source", "csv", "key", "arm", "metric")
Reader = Callable[[Run, Mapping[str, Any]], float | None]  # (the re-run, the cell's key) -> its value


def key_text(key: Mapping[str, Any]) -> str:
    """A row key as one field: ``column=value`` pairs joined by ``; `` in the key's order."""
    return "; ".join(f"{k}={v}" for k, v in key.items())


def parse_key(text: str) -> dict[str, str]:
    """The inverse of :func:`key_text`."""
    return dict(pair.split("=", 1) for pair in text.split("; "))


def csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV (every field a string)."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def matching(rows: list[dict[str, str]], key: Mapping[str, Any]) -> list[dict[str, str]]:
    """The rows whose columns equal ``key``'s values (compared as text)."""
    return [r for r in rows if all(r.get(k) == str(v) for k, v in key.items())]


def committed_cell(
    rows: list[dict[str, str]], key: Mapping[str, Any], arm: list[str], metric: str
) -> tuple[str, float | None, int]:
    """(the committed value as written, the sd of ``metric`` over the arm's rows (None below 2), their number).

    Raises:
        ValueError: ``key`` matches no row or several, or the metric is not a column.
    """
    found = matching(rows, key)
    if len(found) != 1:
        raise ValueError(f"key {key_text(key)}: {len(found)} rows match (need exactly 1)")
    column, label = metric_column(metric)
    if column not in found[0]:
        raise ValueError(f"metric {metric!r}: {column!r} is not a column; the columns: {sorted(found[0])}")
    if label is not None:  # one run's entry of a JSON column; the arm is that object's runs
        per_run = json.loads(found[0][column])
        if label not in per_run:
            raise ValueError(f"metric {metric!r}: no run {label!r} in {column}; the runs: {sorted(per_run)}")
        values, value = list(per_run.values()), repr(per_run[label])
    else:
        value = found[0][column]
        arm_rows = matching(rows, {c: key[c] for c in arm}) if arm else found  # no arm: the cell alone, no sd
        values = [float(r[column]) for r in arm_rows if r[column]]
    return value, statistics.stdev(values) if len(values) > 1 else None, len(values)


def metric_column(metric: str) -> tuple[str, str | None]:
    """(column, run label): ``per_run[LABEL]`` names the run ``LABEL`` of a JSON column (``depth_growth.csv``'s
    ``per_run``), any other metric a plain column (label None)."""
    column, bracket, label = metric.partition("[")
    return (column, label.removesuffix("]")) if bracket else (metric, None)


def rerun_value(entry: Mapping[str, Any], runs: Path, readers: Mapping[str, Reader]) -> float:
    """The re-run's value of the entry's metric: from ``runs / run_dir``, a run directory (read with the metric's
    reader) or a CSV the section's own tool wrote (its row at the entry's key, as in the committed CSV).

    Raises:
        ValueError: no reader for the metric, or the re-run holds no value of it.
    """
    path, metric = runs / entry["run_dir"], entry["metric"]
    if path.suffix == ".csv":
        return float(committed_cell(csv_rows(path), entry["key"], [], metric)[0])
    if (column := metric_column(metric)[0]) not in readers:
        raise ValueError(f"metric {metric!r}: no reader; the metrics read: {sorted(readers)}")
    if (value := readers[column](load_run(path, entry["run_dir"]), entry["key"])) is None:
        raise ValueError(f"{path}: no {metric} (an unfinished or missing run?)")
    return value


def row(entry: Mapping[str, Any], docs: Path, runs: Path, readers: Mapping[str, Reader], rerun_commit: str) -> list[Any]:
    """The ``provenance.csv`` row (``FIELDS``) of one spec entry; ``docs`` holds the entry's ``csv`` path, ``runs``
    its ``run_dir`` (relative; :func:`rerun_value`), ``readers`` maps a metric's column to the function reading it
    from a re-run's run directory; ``rerun_commit`` is the re-run's commit unless the entry names its own
    (``rerun_commit``: a cell re-run later than the others). Without a ``run_dir`` the re-run fields are empty;
    without an sd (an arm of one run), ``diff_in_sd`` is.

    Raises:
        ValueError: a spec key missing, a bad key (:func:`committed_cell`) or re-run (:func:`rerun_value`).
    """
    if missing := [k for k in SPEC_KEYS if k not in entry]:
        raise ValueError(f"spec entry {entry.get('section', '?')!r}: missing {missing}; needs {list(SPEC_KEYS)}")
    key, metric = entry["key"], entry["metric"]
    committed, sd, n = committed_cell(csv_rows(docs / entry["csv"]), key, list(entry["arm"]), metric)
    rerun = diff = in_sd = None
    if entry.get("run_dir"):
        rerun = rerun_value(entry, runs, readers)
        diff = rerun - float(committed)
        in_sd = diff / sd if sd else None
    head = [entry[k] for k in ("section", "folder", "runs_commit", "runs_commit_source", "csv")]
    tail = [entry.get("rerun_commit", rerun_commit) if rerun is not None else "", entry.get("command", ""), entry.get("note", "")]
    return [*head, key_text(key), metric, committed, rerun, diff, sd, n, in_sd, *tail]
