"""Two-process gloo runs: their settings and environment, a free port, and the check that two ranks train as one
process does."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.config import ROOT
from tests.helpers.resume import losses
from training.checkpoint import load_checkpoint

DEFAULTS = ["model=tiny", "trainer=smoke", "logger=none"]  # every cadence as the presets set it
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def assert_trains_as_one_process(run_dir: Path, tmp_path: Path, args: list[str], logged: list[int]) -> None:
    """Two ranks' run in ``run_dir`` logged the losses at ``logged`` and ended at the weights of one process run with
    ``args`` and twice the accumulation (``tmp_path / "one"``)."""
    one_dir = tmp_path / "one"
    run([sys.executable, str(ROOT / "train.py"), *args, "trainer.grad_accum=2", f"hydra.run.dir={one_dir}"], tmp_path)
    ranks, accum = losses(run_dir), losses(one_dir)
    assert sorted(ranks) == sorted(accum) == logged
    for step in ranks:
        assert ranks[step] == pytest.approx(accum[step], rel=1e-5, abs=1e-6)
    a, b = load_checkpoint(run_dir / "checkpoint.pt")["model"], load_checkpoint(one_dir / "checkpoint.pt")["model"]
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)


def free_port() -> int:
    """A TCP port free on this machine now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run(cmd: list[str], cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    # A hang (the failure this file guards against) ends in the timeout, not in a stuck suite.
    out = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)
    assert (out.returncode == 0) == ok, out.stderr[-3000:]
    return out
