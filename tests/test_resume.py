"""Never lose a run: exact resume after SIGTERM, corrupt checkpoints, re-running a run dir, and
the learning-rate schedule replayed from (config, step)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train as train_module
from tests.conftest import ROOT, make_cfg
from training.checkpoint import load_checkpoint, load_latest_good
from training.optim import build_optimizer, build_scheduler

# Dropout on and a per-step log, so RNG state and data order both show in every logged loss.
EXACT = ["trainer.max_steps=12", "trainer.log_every=1", "model.dropout=0.1", "telemetry.every=4"]


def losses(run_dir: Path) -> dict[int, tuple[float, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["train/loss"], r["optim/lr"]) for r in rows if "train/loss" in r}


def test_a_run_stopped_by_sigterm_and_resumed_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    train_module.train(make_cfg(*EXACT), tmp_path / "straight")

    real_step, calls = train_module.train_step, {"n": 0}

    def sigterm_at_step_5(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # as a cluster would: the signal lands in the middle of a step
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_step", sigterm_at_step_5)
    with pytest.raises(train_module.RunInterrupted, match="stopped by SIGTERM after step 5"):
        train_module.train(make_cfg(*EXACT), tmp_path / "stopped")
    assert json.loads((tmp_path / "stopped" / "status.json").read_text())["state"] == "interrupted"
    assert load_checkpoint(tmp_path / "stopped" / "checkpoint.pt")["step"] == 5
    assert "RunInterrupted" in (tmp_path / "stopped" / "error.log").read_text()
    monkeypatch.setattr(train_module, "train_step", real_step)
    train_module.train(make_cfg(*EXACT), tmp_path / "stopped")  # train.resume=auto: continues at step 6
    assert not (tmp_path / "stopped" / "error.log").exists()  # the interruption's log went with it

    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "stopped")
    assert sorted(resumed) == list(range(1, 13))
    assert resumed == straight  # loss and lr, bit for bit, at every step
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.pt")["model"] for d in ("straight", "stopped"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_from_outside_checkpoints_and_exits_143(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "train.py"), "model=tiny", "trainer=smoke", "logger=none", "trainer.max_steps=100000",
           "trainer.log_every=1", f"hydra.run.dir={run_dir}"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().count("\n") >= 3:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM after step" in stderr and "Traceback" not in stderr
    overrides = "model=tiny trainer=smoke logger=none trainer.max_steps=100000 trainer.log_every=1"
    assert f"continue with: python train.py {overrides} hydra.run.dir={run_dir}" in stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "interrupted"
    assert load_checkpoint(run_dir / "checkpoint.pt")["step"] == status["step"] >= 3


def test_a_corrupt_latest_checkpoint_is_named_and_the_previous_one_used(tmp_path, capsys):
    train_module.train(make_cfg(), tmp_path)  # checkpoints at steps 10 (then .prev) and 20
    latest = tmp_path / "checkpoint.pt"
    data = bytearray(latest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: torch.load alone would not notice
    latest.write_bytes(data)
    with pytest.raises(ValueError, match="checkpoint.pt' is corrupt: its SHA-256 differs"):
        load_checkpoint(latest)
    ckpt, path = load_latest_good(latest)
    assert path.name == "checkpoint.prev.pt" and ckpt["step"] == 10
    assert "checkpoint.pt' is corrupt" in capsys.readouterr().out

    latest.write_bytes(bytes(data[: len(data) // 3]))  # truncated, digest file removed: unreadable
    (tmp_path / "checkpoint.pt.sha256").unlink()
    with pytest.raises(ValueError, match="checkpoint.pt' is truncated or corrupt"):
        load_checkpoint(latest)
    train_module.train(make_cfg("trainer.max_steps=25"), tmp_path)  # auto-resume falls back to step 10
    assert "using the previous checkpoint" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 25  # rows past step 10 were rewritten, not duplicated
    assert load_checkpoint(latest)["step"] == 25


def test_rerunning_a_finished_run_dir_skips_it(tmp_path, capsys):
    first = train_module.train(make_cfg("trainer.max_steps=10"), tmp_path)
    lines = (tmp_path / "metrics.jsonl").read_text()
    assert train_module.train(make_cfg("trainer.max_steps=10"), tmp_path) == first
    assert "already finished at step 10; skipped" in capsys.readouterr().out
    assert (tmp_path / "metrics.jsonl").read_text() == lines
    train_module.train(make_cfg("trainer.max_steps=15"), tmp_path)  # a longer run continues instead
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 15
    with pytest.raises(ValueError, match="checkpoint.pt is at step 15, past trainer.max_steps=12; raise trainer.max_steps"):
        train_module.train(make_cfg("trainer.max_steps=12"), tmp_path)
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "finished"  # the finished run's record stays


@pytest.mark.parametrize("decay", ["linear", "cosine", "constant"])
def test_the_schedule_replayed_to_a_step_equals_the_one_that_ran(decay):
    def lrs(start: int, max_steps: int, n: int, loaded_lr: float | None = None) -> list[float]:
        opt = build_optimizer(torch.nn.Linear(2, 2), 1e-3, (0.9, 0.98), 0.0, 1e-9)
        if loaded_lr is not None:  # an optimizer state from a checkpoint carries its own lr
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] = loaded_lr
        sched = build_scheduler(opt, 1e-3, 10, max_steps, decay, start_step=start)
        out = []
        for _ in range(n):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    ran = lrs(0, 50, 50)
    assert lrs(17, 50, 33, loaded_lr=123.0) == ran[17:]
    replanned = lrs(17, 80, 10)  # resumed with a longer run: the decay is re-planned over 80 steps
    assert replanned == lrs(0, 80, 27)[17:] and (decay == "constant" or replanned != ran[17:27])
