"""Runs stopped by SIGTERM and resumed, or by a NaN loss: the exact-resume settings and readers of a run's losses and
metrics rows."""

import json
import os
import signal
import types
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

import train as train_module
import training.step

# Dropout on and a per-step log, so RNG state and data order both show in every logged loss.
EXACT = ["trainer.max_steps=12", "trainer.log_every=1", "model.dropout=0.1", "telemetry.every=4"]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["train/loss"], r["optim/lr"]) for r in rows(run_dir) if "train/loss" in r}


def stop_by_sigterm(monkeypatch: pytest.MonkeyPatch, cfg: DictConfig, run_dir: Path, step: int) -> None:
    """Train ``cfg`` in ``run_dir`` with a SIGTERM landing in the middle of step ``step``, as a cluster
    would send it: the run checkpoints that step and raises RunInterrupted (checked here)."""
    real_step, calls = train_module.train_step, {"n": 0}

    def sigterm_in_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_step", sigterm_in_step)
    with pytest.raises(train_module.RunInterrupted, match=f"stopped by SIGTERM after step {step};"):
        train_module.train(cfg, run_dir)
    monkeypatch.setattr(train_module, "train_step", real_step)


def poison_loss_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Make the loss of training step ``step`` NaN (its cross-entropy times NaN), as a diverging run's would be."""
    calls = {"n": 0}

    def poisoned_cross_entropy(*args, **kwargs):
        calls["n"] += 1
        loss = torch.nn.functional.cross_entropy(*args, **kwargs)
        return loss * float("nan") if calls["n"] == step else loss

    monkeypatch.setattr(training.step, "F", types.SimpleNamespace(cross_entropy=poisoned_cross_entropy))
