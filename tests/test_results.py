"""docs/results.md quotes numbers only from the CSVs committed beside it: each of its tables follows a marker

    <!-- csv: results/<file>.csv key=<column>[,<column>...] -->

whose key columns match the table's first columns (text, exactly), and each further column's header names a CSV
column in backticks (e.g. "LRS (`lrs_mean`)"). Every number in such a cell must equal the CSV's value to the
number of decimals shown; a cell may hold the text "diverged" or "—" where the CSV cell is empty.
"""

import csv
import math
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
MARKER = re.compile(r"<!-- csv: (\S+) key=(\S+) -->\n+((?:\|.*\|\n)+)")
NUMBER = re.compile(r"^[+-]?\d+(?:\.(\d+))?(?:e[+-]?\d+)?$")


def tables() -> list[tuple[str, list[str], list[list[str]]]]:
    """(csv path, key columns, table rows (header first, separator dropped)) of every marked table."""
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    found = []
    for path, keys, body in MARKER.findall(text):
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.strip().splitlines()]
        found.append((path, keys.split(","), [rows[0], *rows[2:]]))
    return found


def test_results_page_has_marked_tables() -> None:
    assert len(tables()) >= 3


@pytest.mark.parametrize("path, keys, rows", tables(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_number_comes_from_its_csv(path: str, keys: list[str], rows: list[list[str]]) -> None:
    with (DOCS / path).open(encoding="utf-8") as f:
        records = {tuple(r[k] for k in keys): r for r in csv.DictReader(f)}
    header, body = rows[0], rows[1:]
    columns = [re.search(r"`([^`]+)`", h).group(1) for h in header[len(keys) :]]
    assert body, f"{path}: empty table"
    for row in body:
        record = records[tuple(row[: len(keys)])]
        for column, cell in zip(columns, row[len(keys) :], strict=True):
            value = record[column]
            if cell in ("diverged", "—"):
                assert value == "" or not math.isfinite(float(value)), f"{path} {row[0]} {column}: {cell} vs {value}"
                continue
            match = NUMBER.match(cell)
            assert match, f"{path} {row[0]} {column}: {cell!r} is not a number"
            decimals = len(match.group(1) or "")
            where = f"{path} {row[: len(keys)]} {column}"
            assert abs(float(cell) - float(value)) <= 0.5 * 10**-decimals + 1e-12, f"{where}: {cell} vs {value}"
