"""Reading a CSV the report wrote, as rows of strings."""

import csv
from pathlib import Path


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
