"""Sweeps on a real SLURM cluster (``scripts/slurm_local.sh``: slurmctld, slurmd and munged on this machine) through
``hydra/launcher=slurm``: a job that hits its time limit or is preempted checkpoints, is requeued and ends with the
weights and losses of a run that never stopped; a job that may not be requeued says why; a 4-job array sweep caps
its concurrency and equals the same sweep on the local launcher. Skipped without slurm-wlm, munge or root."""

import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch

import train as train_module
from tests.helpers.config import ROOT, TINY, make_cfg
from tests.helpers.resume import EXACT, losses
from tests.helpers.slurm_cluster import LAUNCHER, finish, hold_until_signalled, job_dir, job_pid, start_sweep, wait_for
from training.checkpoint import load_checkpoint

pytestmark = pytest.mark.slurm
# The exact-resume run of tests/test_resume.py; validation and test on a few examples (decoding is most of a tiny run).
RUN = [*EXACT, "trainer.eval_max_examples=8", "trainer.test_max_examples=8"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of RUN trained without a stop (in this process: the jobs inherit its environment and threads)."""
    run_dir = tmp_path_factory.mktemp("straight")
    train_module.train(make_cfg(*RUN), run_dir)
    return run_dir


def submitit_log(sweep_dir: Path) -> str:
    """Every attempt's stdout and stderr of the sweep's jobs (submitit appends each attempt to its job's logs)."""
    return "".join(p.read_text() for p in sorted(sweep_dir.glob(".submitit/*/*_log.*")))


def assert_same_run(run_dir: Path, straight: Path) -> None:
    """Loss and learning rate at every step, and the final weights, bit for bit."""
    assert losses(run_dir) == losses(straight) and sorted(losses(run_dir)) == list(range(1, 13))
    a, b = (load_checkpoint(d / "checkpoint.pt")["model"] for d in (straight, run_dir))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_job_at_its_time_limit_checkpoints_is_requeued_and_ends_as_an_uninterrupted_run(slurm_env, straight, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # A 2-minute limit: SLURM sends USR2 when at most signal_delay_s + 30 s remain (slurmctld checks limits every
    # 30 s), here 60 to 90 s into the job, time enough for a loaded machine to start it (a USR2 before submitit has
    # set up its handler kills the job). The job, held at its first step until the signal is pending, takes it mid-run.
    proc = start_sweep(slurm_env, tmp_path, *TINY, *RUN, *LAUNCHER, "hydra.launcher.timeout_min=2",
                       "hydra.launcher.signal_delay_s=30", f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    run_dir = wait_for("a logged training loss", lambda: job_dir(sweep_dir), proc)
    hold_until_signalled(wait_for("the job's process", lambda: job_pid(sweep_dir), proc), signal.SIGUSR2, proc)
    out, err = finish(proc, tmp_path)
    assert proc.returncode == 0, err[-3000:]
    assert "1 job: 1 finished" in out

    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["slurm"]["restarts"] >= 1
    log = submitit_log(sweep_dir)
    assert "this job is timed-out" in log and "Requeued job" in log  # submitit's own account of it
    assert "normlab: stopped by SIGUSR2 after step " in log, "the job was requeued without a checkpoint of its last step"
    stopped = int(log.split("normlab: stopped by SIGUSR2 after step ")[1].split(";")[0])
    assert 1 <= stopped < 12 and f"resuming from step {stopped} " in log  # the requeued job went on from there
    assert_same_run(run_dir, straight)


def test_a_preempted_job_checkpoints_is_requeued_and_ends_as_an_uninterrupted_run(slurm_env, straight, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = start_sweep(slurm_env, tmp_path, *TINY, *RUN, *LAUNCHER, f"hydra.sweep.dir={sweep_dir}")
    run_dir = wait_for("a logged training loss", lambda: job_dir(sweep_dir), proc)
    job_id = json.loads((run_dir / "status.json").read_text())["slurm"]["job_id"]
    # What a preemption does (SLURM sends SIGTERM, then requeues the job), as an admin would: scontrol requeue.
    requeue = lambda: subprocess.run(["scontrol", "requeue", job_id], env={**os.environ, **slurm_env}, check=True)  # noqa: E731
    hold_until_signalled(wait_for("the job's process", lambda: job_pid(sweep_dir), proc), signal.SIGTERM, proc, requeue)
    out, err = finish(proc, tmp_path)
    assert proc.returncode == 0, err[-3000:]
    assert "1 job: 1 finished" in out and f"slurm {job_id} requeued 1x" in out

    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["slurm"] == {"job_id": job_id, "restarts": 1, "node": status["slurm"]["node"]}
    log = submitit_log(sweep_dir)
    stopped = int(log.split("normlab: stopped by SIGTERM after step ")[1].split(";")[0])
    assert 1 <= stopped < 12 and f"resuming from step {stopped} " in log
    assert_same_run(run_dir, straight)


def test_a_job_out_of_requeues_says_why_in_its_status_and_the_sweep_summary(slurm_env, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = start_sweep(slurm_env, tmp_path, *TINY, *RUN, *LAUNCHER, "hydra.launcher.max_num_timeout=0",
                       "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    run_dir = wait_for("a logged training loss", lambda: job_dir(sweep_dir), proc)
    job_id = json.loads((run_dir / "status.json").read_text())["slurm"]["job_id"]
    # The time-limit warning sent by hand (as submitit's own tests send it): with a limit of 10 minutes or less
    # submitit counts any USR2 as a timeout (min(0.8 limit, limit - 10 min) has passed), and max_num_timeout=0 allows none.
    warn = lambda: subprocess.run(["scancel", "--signal=USR2", job_id], env={**os.environ, **slurm_env}, check=True)  # noqa: E731
    hold_until_signalled(wait_for("the job's process", lambda: job_pid(sweep_dir), proc), signal.SIGUSR2, proc, warn)
    out, err = finish(proc, tmp_path)
    assert proc.returncode == 1, err[-3000:]  # a failed job: the sweep's exit status

    status = json.loads((run_dir / "status.json").read_text())
    step = load_checkpoint(run_dir / "checkpoint.pt")["step"]
    why = "not requeued: timed-out too many times (hydra.launcher.max_num_timeout=0)"
    assert status["state"] == "failed" and status["error"].startswith(f"{why}; stopped by SIGUSR2 after step {step};")
    assert 1 <= step < 12 and status["step"] == step
    assert "1 job: 1 failed" in out
    assert f"failed  {step}  slurm {job_id} requeued 0x  {why}" in out


def run_record(run_dir: Path) -> tuple:
    """What a run computed: its resolved config, test metrics and every logged value but the timings and the peak
    memory (a process of the local sweep runs every job)."""
    rows = [{k: v for k, v in json.loads(line).items() if not k.startswith(("perf/", "time/", "mem/"))}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    status = json.loads((run_dir / "status.json").read_text())
    return (run_dir / "config.yaml").read_text(), status["state"], status["test"], rows


def test_a_4_job_array_runs_2_at_a_time_equals_the_local_sweep_and_reruns_skip_finished_jobs(slurm_env, tmp_path):
    overrides = [*TINY, "trainer.max_steps=6", "trainer.eval_max_examples=8", "trainer.test_max_examples=8", "seed=0,1,2,3"]
    local = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", *overrides, f"hydra.sweep.dir={tmp_path / 'local'}"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    sweep_dir = tmp_path / "slurm"
    args = [*overrides, *LAUNCHER, "hydra.launcher.array_parallelism=2", f"hydra.sweep.dir={sweep_dir}"]
    out, err = finish(start_sweep(slurm_env, tmp_path, *args), tmp_path)
    assert "4 jobs: 4 finished" in out, err[-3000:]

    jobs = sorted(p.parent.name for p in (tmp_path / "local").glob("*/status.json"))
    assert len(jobs) == 4 and sorted(p.parent.name for p in sweep_dir.glob("*/status.json")) == jobs
    for job in jobs:  # the same run, seed by seed
        assert run_record(sweep_dir / job) == run_record(tmp_path / "local" / job), job
    ids = [json.loads((sweep_dir / job / "status.json").read_text())["slurm"]["job_id"] for job in jobs]
    array = ids[0].split("_")[0]
    assert sorted(ids) == [f"{array}_{i}" for i in range(4)]
    assert all(f"slurm {i} requeued 0x" in out for i in ids)

    # SLURM's record of the array (kept MinJobAge after the jobs end): never more than 2 tasks at once. The sweep
    # returns once every job has written its result; SLURM may still be ending the last ones for a moment.
    def completed() -> list[dict[str, str]] | None:
        show = subprocess.run(["scontrol", "-o", "show", "job", array], env={**os.environ, **slurm_env},
                              capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
        tasks = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in show]
        return tasks if len(tasks) == 4 and all(t["JobState"] == "COMPLETED" for t in tasks) else None

    tasks = wait_for("the 4 tasks COMPLETED in scontrol", completed, None, timeout=60)
    spans = [(datetime.fromisoformat(t["StartTime"]), datetime.fromisoformat(t["EndTime"])) for t in tasks]
    assert max(sum(s <= start < e for s, e in spans) for start, _ in spans) == 2  # 2 at once, never 3

    before = {p: p.read_text() for p in sweep_dir.glob("*/metrics.jsonl")}
    out, err = finish(start_sweep(slurm_env, tmp_path, *args), tmp_path)  # the same command again
    assert "4 jobs: 4 finished" in out, err[-3000:]
    assert submitit_log(sweep_dir).count("already finished at step 6; skipped") == 4
    assert {p: p.read_text() for p in sweep_dir.glob("*/metrics.jsonl")} == before
