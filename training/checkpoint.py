"""Checkpoints written atomically (temp file + fsync + rename) and read back with clear errors.

A checkpoint is one ``torch.save`` dict: ``model_config`` (plain dict), ``model``, ``optimizer``,
``scheduler``, ``step``, ``data_position`` (epoch, batch), ``rng`` (torch CPU/CUDA and Python
``random`` states) and ``format``. A reader never sees a half-written file: the rename is atomic.
"""

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

FORMAT = "normlab-checkpoint-v1"
KEYS = ("model_config", "model", "optimizer", "scheduler", "step", "data_position", "rng")


def rng_state() -> dict[str, Any]:
    """Every RNG the loop draws from, to restore on resume."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (must hold every key in ``KEYS``) to ``path`` atomically.

    Raises:
        KeyError: a required key is missing.
    """
    missing = [k for k in KEYS if k not in state]
    if missing:
        raise KeyError(f"checkpoint state lacks {missing}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` onto the CPU.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not a normlab checkpoint (truncated, corrupt, or another format).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"train.resume: no checkpoint file at {str(path)!r}")
    try:
        # weights_only=False: the file holds Python RNG state; only load checkpoints you trust.
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ValueError(f"train.resume: {str(path)!r} is not a readable checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"train.resume: {str(path)!r} is not a normlab checkpoint (expected format {FORMAT!r})")
    return ckpt
