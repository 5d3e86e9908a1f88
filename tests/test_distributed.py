"""torchrun with 2 CPU processes (gloo): one shared run dir, rank-0-only files, the same training as
one process with twice the batch (2 accumulation steps), under the default cadences and under
cadences that are not multiples of each other; exact resume of every rank's RNG stream; legacy
launchers that pass ``--local-rank``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from training.checkpoint import load_checkpoint
from training.distributed import strip_local_rank

DEFAULTS = ["model=tiny", "trainer=smoke", "logger=none"]  # every cadence as the presets set it
# log 5, telemetry 3, eval 7, checkpoint 4: each decides a different set of steps, so a rank that
# enters a collective on its own (a rank-0-only decision) would hang here.
SKEWED = [*DEFAULTS, "trainer.max_steps=12", "telemetry.every=3", "trainer.eval_every=7", "trainer.checkpoint_every=4"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
LEGACY = [sys.executable, "-m", "torch.distributed.launch", "--standalone", "--nproc_per_node=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(cmd: list[str], cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    # A hang (the failure this file guards against) ends in the timeout, not in a stuck suite.
    out = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)
    assert (out.returncode == 0) == ok, out.stderr[-3000:]
    return out


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.dist
@pytest.mark.parametrize(("args", "logged", "launcher"), [
    (DEFAULTS, [1, 5, 10, 15, 20], TORCHRUN),  # step 1: telemetry at init
    (SKEWED, [1, 3, 4, 5, 6, 7, 8, 9, 10, 12], LEGACY),  # the legacy launcher appends --local-rank=N
])  # fmt: skip
def test_two_ranks_train_exactly_as_one_process_with_twice_the_batch(tmp_path, args, logged, launcher):
    two = run([*launcher, str(ROOT / "train.py"), *args], tmp_path)
    (run_dir,) = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]  # both ranks wrote into one dir
    assert run_dir.name.endswith("_pre-layernorm-custom")  # named from the norm keys (conf/config.yaml)
    one_dir = tmp_path / "one"
    run([sys.executable, str(ROOT / "train.py"), *args, "trainer.grad_accum=2", f"hydra.run.dir={one_dir}"], tmp_path)

    ddp, accum = losses(run_dir), losses(one_dir)
    assert sorted(ddp) == sorted(accum) == logged  # rank 0 alone writes: each logged step once
    for step in ddp:
        assert ddp[step] == pytest.approx(accum[step], rel=1e-5, abs=1e-6)
    a, b = load_checkpoint(run_dir / "checkpoint.pt")["model"], load_checkpoint(one_dir / "checkpoint.pt")["model"]
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("act/enc.0.out/rms" in r for r in rows)  # telemetry from rank 0
    assert two.stdout.count("test PER") == 1  # one summary: rank 0's


# Run as `torchrun ... sigterm.py <overrides>`: both ranks get SIGTERM in their 3rd step, as a
# cluster's preemption would deliver it; the ranks agree at the next logging step and checkpoint.
SIGTERM_AT_STEP_3 = f"""
import os, runpy, signal, sys
sys.path.insert(0, {str(ROOT)!r})
import training.step
real, calls = training.step.train_step, [0]
def train_step(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 3:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
training.step.train_step = train_step  # train.py imports it from here
runpy.run_path({str(ROOT / "train.py")!r}, run_name="__main__")
"""


@pytest.mark.dist
def test_two_ranks_stopped_and_resumed_continue_each_rank_rng_stream_exactly(tmp_path):
    args = [*DEFAULTS, "model.dropout=0.1"]  # dropout: each rank's RNG stream shows in every loss
    run([*TORCHRUN, str(ROOT / "train.py"), *args, f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    (tmp_path / "sigterm.py").write_text(SIGTERM_AT_STEP_3)
    stopped = tmp_path / "stopped"
    out = run([*TORCHRUN, str(tmp_path / "sigterm.py"), *args, f"hydra.run.dir={stopped}"], tmp_path, ok=False)
    assert "stopped by SIGTERM after step 5" in out.stderr
    ckpt = load_checkpoint(stopped / "checkpoint.pt")
    assert ckpt["step"] == 5 and len(ckpt["rng"]) == 2  # one stream per rank
    assert not torch.equal(ckpt["rng"][0]["torch"], ckpt["rng"][1]["torch"])
    run([*TORCHRUN, str(ROOT / "train.py"), *args, f"hydra.run.dir={stopped}"], tmp_path)  # train.resume=auto

    straight, resumed = losses(tmp_path / "straight"), losses(stopped)
    assert sorted(resumed) == [1, 5, 10, 15, 20]
    assert resumed == straight  # bit for bit at every logged step
    a, b = load_checkpoint(tmp_path / "straight" / "checkpoint.pt")["model"], load_checkpoint(stopped / "checkpoint.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_legacy_local_rank_flags_are_removed_and_set_local_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert strip_local_rank(["train.py", "--local-rank=1", "model=tiny"]) == ["train.py", "model=tiny"]
    assert os.environ["LOCAL_RANK"] == "1"
    monkeypatch.setenv("LOCAL_RANK", "0")  # a launcher's own LOCAL_RANK wins
    assert strip_local_rank(["train.py", "--local_rank", "3", "seed=1"]) == ["train.py", "seed=1"]
    assert os.environ["LOCAL_RANK"] == "0"
