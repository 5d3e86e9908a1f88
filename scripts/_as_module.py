"""Imported by a script run as a file (``python scripts/report.py``), where the project's packages cannot be imported
(only ``scripts/`` is on the path): exits with one line giving the command that runs it, as a module from the repository
root."""

import sys
from pathlib import Path

_script = Path(sys.argv[0])
sys.exit(f"normlab: run it as a module from the repository root: cd {Path(__file__).resolve().parents[1]} && "
         f"python -m scripts.{_script.stem} {' '.join(sys.argv[1:])}".rstrip())  # fmt: skip
