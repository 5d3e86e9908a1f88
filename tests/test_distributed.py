"""torchrun with 2 CPU processes (gloo): one shared run dir, rank-0-only files, and the same
training as one process with twice the batch (2 accumulation steps)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from training.checkpoint import load_checkpoint

ARGS = ["model=tiny", "trainer=smoke", "logger=none", "trainer.max_steps=6", "trainer.log_every=1", "telemetry.every=3"]


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.dist
def test_two_ranks_train_exactly_as_one_process_with_twice_the_batch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    two = subprocess.run(
        [*torchrun, str(ROOT / "train.py"), *ARGS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert two.returncode == 0, two.stderr[-3000:]
    (run_dir,) = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]  # both ranks wrote into one dir
    one_dir = tmp_path / "one"
    one = subprocess.run([sys.executable, str(ROOT / "train.py"), *ARGS, "trainer.grad_accum=2", f"hydra.run.dir={one_dir}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]

    ddp, accum = losses(run_dir), losses(one_dir)
    assert sorted(ddp) == list(range(1, 7))  # rank 0 alone writes: each step once
    for step in ddp:
        assert ddp[step] == pytest.approx(accum[step], rel=1e-5, abs=1e-6)
    a, b = load_checkpoint(run_dir / "checkpoint.pt")["model"], load_checkpoint(one_dir / "checkpoint.pt")["model"]
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("act/enc.0.out/rms" in r for r in rows)  # telemetry from rank 0
    assert two.stdout.count("test PER") == 1  # one summary: rank 0's
