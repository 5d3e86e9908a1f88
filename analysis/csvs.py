"""Reading and writing the report's CSVs (summary.csv, the depth and LR-sensitivity CSVs): one header, then the rows,
with the csv module's own rules (floats as ``repr``: every digit; None as an empty field); and the folder they go to.
A CSV read with the wrong columns, or with no rows, and an output folder that is a file, stop with one line (a
ValueError naming the path) before anything is written."""

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Path:
    """Write ``rows`` (one value per column, in ``columns``' order) under the header ``columns``; returns ``path``."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)
    return path


def csv_field(value: object) -> object:
    """A value as a CSV field: empty for None, a float at full precision (``repr``), anything else as it is."""
    return "" if value is None else repr(value) if isinstance(value, float) else value


def read_rows(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    """The rows of the CSV ``path`` (``csv.DictReader``'s: column -> text), which must have at least ``columns``.

    Raises:
        OSError: ``path`` cannot be read (missing, a directory).
        ValueError: a column of ``columns`` is missing from the header (the message names the file, the missing
            columns and the expected ones), or the file is empty or has no row below its header.
    """
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if not header:
            raise ValueError(f"{path}: an empty file; expected a CSV with the columns {', '.join(columns)}")
        if missing := [c for c in columns if c not in header]:
            raise ValueError(
                f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(columns)} "
                f"(the file has {', '.join(header)})"
            )
        rows = list(reader)
    if not rows:
        raise ValueError(f"{path}: no rows below the header (an empty CSV)")
    return rows


def output_dir(path: Path, flag: str = "--out") -> Path:
    """Make the folder ``path`` (and its parents) if missing; returns it.

    Raises:
        ValueError: ``path`` or a parent is a file, or it cannot be made (the message names ``flag`` and ``path``).
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"{flag} {path} is a file, not a folder; give a folder for the CSVs") from None
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot make the folder: {e.strerror or e}") from None
    return path
