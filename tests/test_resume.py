"""Never lose a run: exact resume after SIGTERM (losses, spike scores, telemetry's sigma_max series),
corrupt checkpoints, re-running a run dir, and the learning-rate schedule replayed from (config, step)."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train as train_module
from telemetry.parameters import POWER_ITERS_FIRST
from tests.helpers.config import ROOT, make_cfg, scheduled_lrs
from tests.helpers.resume import EXACT, losses, rows, stop_by_sigterm
from tests.helpers.telemetry import torch_sigma
from tests.helpers.wandb_log import wandb_records
from training.checkpoint import load_checkpoint, load_latest_good


def test_a_run_stopped_by_sigterm_and_resumed_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    train_module.train(make_cfg(*EXACT), tmp_path / "straight")
    stop_by_sigterm(monkeypatch, make_cfg(*EXACT), tmp_path / "stopped", 5)
    assert json.loads((tmp_path / "stopped" / "status.json").read_text())["state"] == "interrupted"
    assert load_checkpoint(tmp_path / "stopped" / "checkpoint.pt")["step"] == 5
    assert "RunInterrupted" in (tmp_path / "stopped" / "error.log").read_text()
    train_module.train(make_cfg(*EXACT), tmp_path / "stopped")  # train.resume=auto: continues at step 6
    assert not (tmp_path / "stopped" / "error.log").exists()  # the interruption's log went with it

    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "stopped")
    assert sorted(resumed) == list(range(1, 13))
    assert resumed == straight  # loss and lr, bit for bit, at every step
    # The loss at initialization was logged by the first attempt only, not again on resume.
    initial = {d: [r for r in rows(tmp_path / d) if r["step"] == 0] for d in ("straight", "stopped")}
    assert initial["stopped"] == initial["straight"] and len(initial["stopped"]) == 1
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.pt") for d in ("straight", "stopped"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # The spike scores' state rode the checkpoint: the resumed run's window holds all 12 steps' values.
    assert b["spikes"] == a["spikes"] and len(b["spikes"]["loss"]["history"]) == b["spikes"]["grad_norm"]["steps"] == 12
    for d in ("straight", "stopped"):  # 12 steps: none has the 100 values before it that scoring needs
        status = json.loads((tmp_path / d / "status.json").read_text())
        assert status["spike_score_loss"] == status["spike_score_grad_norm"] == 0.0


# Telemetry records at steps 1, 2, 4, 6, 8 (every 2 and the last); the runs below stop after step 3, between two records.
SIGMA = ["trainer.max_steps=8", "telemetry.every=2"]


def sigma_max(run_dir: Path) -> dict[int, dict[str, float]]:
    """{record step: {``weight/.../sigma_max`` name: value}} of a run's metrics."""
    records = [r for r in rows(run_dir) if any(k.startswith("weight/") for k in r)]
    return {r["step"]: {k: v for k, v in r.items() if k.endswith("/sigma_max")} for r in records}


def test_a_resumed_run_logs_the_sigma_max_series_of_an_uninterrupted_run(tmp_path, monkeypatch):
    train_module.train(make_cfg(*SIGMA), tmp_path / "straight")
    stop_by_sigterm(monkeypatch, make_cfg(*SIGMA), tmp_path / "stopped", 3)
    ckpt = load_checkpoint(tmp_path / "stopped" / "checkpoint.pt")
    assert len(ckpt["telemetry"]["power"]) == 2 * 6 + 2 * 10  # one vector per block matrix of the tiny model
    old = tmp_path / "old"  # the same checkpoint as written before it held the vectors
    shutil.copytree(tmp_path / "stopped", old)
    del ckpt["telemetry"]
    torch.save(ckpt, old / "checkpoint.pt")
    (old / "checkpoint.pt.sha256").unlink()
    for d in ("stopped", "old"):
        train_module.train(make_cfg(*SIGMA), tmp_path / d)

    straight, resumed, fresh = (sigma_max(tmp_path / d) for d in ("straight", "stopped", "old"))
    assert sorted(resumed) == sorted(straight) == [1, 2, 4, 6, 8] and len(resumed[8]) == 32
    assert resumed == straight  # bit for bit, the records after the resume (4, 6, 8) too
    # Without the vectors the first record after the resume starts over: POWER_ITERS_FIRST iterations from the
    # first vector, on the weights step 4 reads before its update (the checkpoint's).
    name, w = "weight/dec.0.cross_attn.v/sigma_max", ckpt["model"]["decoder.0.cross_attn.branch.v_proj.weight"]
    assert fresh[4][name] == pytest.approx(torch_sigma(w, POWER_ITERS_FIRST), rel=1e-5)
    assert fresh[4][name] != straight[4][name] and fresh[2] == straight[2]


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
        return scheduled_lrs(1e-3, 10, max_steps, n, decay, start=start, loaded_lr=loaded_lr)

    ran = lrs(0, 50, 50)
    assert lrs(17, 50, 33, loaded_lr=123.0) == ran[17:]
    replanned = lrs(17, 80, 10)  # resumed with a longer run: the decay is re-planned over 80 steps
    assert replanned == lrs(0, 80, 27)[17:] and (decay == "constant" or replanned != ran[17:27])


def wandb_attempts(run_dir: Path) -> list[tuple[str, bool, list[int]]]:
    """(run id, resume flag of its run record, history steps) of each offline attempt, oldest first."""
    attempts = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        deadline = time.monotonic() + 30
        # wandb-core flushes the log a moment after finish() returns; its last record is the exit record
        while not (records := wandb_records(next(folder.glob("run-*.wandb")))) or not records[-1].HasField("exit"):
            assert time.monotonic() < deadline, f"{folder}: no exit record"
            time.sleep(0.1)
        (run,) = [r.run for r in records if r.HasField("run")]
        attempts.append((run.run_id, run.resume, [r.history.step.num for r in records if r.HasField("history")]))
    return attempts


def test_a_resumed_wandb_run_stays_one_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir, steps = tmp_path / "run", ["logger=wandb", "trainer.max_steps=8", "trainer.log_every=1"]
    stop_by_sigterm(monkeypatch, make_cfg(*steps), run_dir, 5)
    train_module.train(make_cfg(*steps), run_dir)

    (first_id, first_resumes, first), (second_id, second_resumes, second) = wandb_attempts(run_dir)
    assert first_id == second_id  # one wandb run, two offline folders
    assert json.loads((run_dir / "status.json").read_text())["wandb_id"] == first_id  # where the id is kept
    assert (first_resumes, second_resumes) == (False, True)  # the second attempt resumes it when synced
    assert first == [0, 1, 2, 3, 4, 5] and second == [6, 7, 8]  # every step once, none dropped, step 0 too
    (initial,) = [r.history for r in wandb_records(sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))[0])
                  if r.HasField("history") and r.history.step.num == 0]  # fmt: skip
    logged = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in initial.item}
    assert logged["trainer/step"] == 0 and logged["val/loss"] == rows(run_dir)[0]["val/loss"]  # plotted at x = 0

    from click.testing import CliRunner
    from wandb.cli.cli import sync

    listed = CliRunner().invoke(sync, ["--dry-run", str(run_dir / "wandb")])  # the command the run prints
    assert "Would sync 2 run(s)" in listed.output


@pytest.mark.parametrize("mode, server_rewinds", [("online", True), ("online", False), ("offline", False)])
def test_a_wandb_run_killed_after_its_checkpoint_is_rewound_where_the_server_can(tmp_path, monkeypatch, capsys, mode,
                                                                                 server_rewinds):  # fmt: skip
    import wandb

    from runlog.status import write_status
    from training import loggers

    # A hard kill (no checkpoint on the way out): the checkpoint is at step 5, wandb holds steps 1..8.
    write_status(tmp_path, wandb_id="abc123")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 1.0}) + "\n" for s in range(1, 9)))
    monkeypatch.setenv("WANDB_MODE", "offline")  # the run is written offline (no network here) ...
    monkeypatch.setattr(loggers, "wandb_mode", lambda: mode)  # ... as if online when mode is
    real_init, inits = wandb.init, []

    def init(**kwargs):  # the server's answer
        inits.append({k: kwargs[k] for k in ("id", "resume", "resume_from") if k in kwargs})
        if "resume_from" in kwargs and not server_rewinds:
            raise wandb.errors.CommError("failed to rewind run: rewind is not enabled")
        return real_init(**{**kwargs, "mode": "offline"})

    monkeypatch.setattr(wandb, "init", init)
    logger = loggers.MetricsLogger(tmp_path, {"project": "normlab"}, resume_step=5)
    logger.log(6, {"train/loss": 0.5})
    logger.close()

    rewind, resume = {"resume_from": "abc123?_step=5"}, {"id": "abc123", "resume": "allow"}
    assert (
        inits
        == {("online", True): [rewind], ("online", False): [rewind, resume], ("offline", False): [resume]}[mode, server_rewinds]
    )
    ((run_id, _, steps),) = wandb_attempts(tmp_path)
    assert run_id == "abc123" and steps == [6]
    out = capsys.readouterr().out
    assert ("keeps the earlier rows for steps 6..8" in out) == ((mode, server_rewinds) == ("online", False))
    assert ("rows for steps 6..8 stay in its offline folder" in out) == (mode == "offline")
