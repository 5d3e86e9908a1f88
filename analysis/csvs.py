"""Writing the report's CSVs (summary.csv, the depth and LR-sensitivity CSVs): one header, then the rows, with the
csv module's own rules (floats as ``repr``: every digit; None as an empty field)."""

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
