"""Hydra multiruns end to end: a 2 x 2 sweep, its report, re-running it, a failing job, wandb
offline runs per job, the parallel launcher, and stopping a parallel sweep."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import pytest

from reporting import page as report_page
from runlog.status import write_status
from tests.helpers.config import ROOT
from tests.helpers.runs import figures
from training.checkpoint import load_checkpoint
from training.sweep import planned_jobs, summarize

SMOKE = ["model=tiny", "trainer=smoke", "telemetry.every=5"]


def sweep(*overrides: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", *SMOKE, *overrides],
        cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("sweep")
    done = sweep("logger=none", "norm=pre_ln,post_ln", "seed=0,1", f"hydra.sweep.dir={tmp / 'sweep'}", cwd=tmp)
    return tmp / "sweep", done


def test_a_2x2_sweep_runs_every_job_in_a_dir_named_by_its_overrides(two_by_two):
    sweep_dir, done = two_by_two
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p.parent.name for p in sweep_dir.glob("*/status.json"))
    assert jobs == [
        f"logger=none,model=tiny,norm={n},seed={s},telemetry.every=5,trainer=smoke" for n in ("post_ln", "pre_ln") for s in (0, 1)
    ]
    assert all(json.loads((sweep_dir / j / "status.json").read_text())["state"] == "finished" for j in jobs)
    assert f"sweep {sweep_dir}: 4 jobs: 4 finished" in done.stdout


def test_the_report_of_the_sweep_has_one_trace_per_run_and_every_panel(two_by_two, tmp_path):
    sweep_dir, _ = two_by_two
    page = report_page.build_report([sweep_dir], tmp_path).read_text(encoding="utf-8")
    figs = figures(page)
    assert {"plot-loss", "plot-val_loss", "plot-val_per", "plot-rms_vs_depth", "plot-grad_vs_depth"} <= set(figs)
    for panel in ("plot-loss", "plot-val_loss", "plot-val_per"):
        assert sum(t["meta"]["role"] == "run" for t in figs[panel]) == 4
        assert sum(t["meta"]["role"] == "mean" for t in figs[panel]) == 2  # post_ln and pre_ln, over 2 seeds
    for png in ("loss", "val_loss", "val_per", "rms_vs_depth", "grad_vs_depth"):
        image = matplotlib.image.imread(tmp_path / f"{png}.png")
        assert image.shape[0] > 100 and image.std() > 0


def test_rerunning_the_sweep_skips_finished_jobs(two_by_two):
    sweep_dir, _ = two_by_two
    before = {p: p.read_text() for p in sweep_dir.glob("*/metrics.jsonl")}
    done = sweep("logger=none", "norm=pre_ln,post_ln", "seed=0,1", f"hydra.sweep.dir={sweep_dir}", cwd=sweep_dir.parent)
    assert done.returncode == 0 and done.stdout.count("already finished at step 20; skipped") == 4, done.stdout
    assert {p: p.read_text() for p in sweep_dir.glob("*/metrics.jsonl")} == before


def test_a_failing_job_does_not_stop_the_sweep_and_is_listed(tmp_path):
    done = sweep("logger=none", "trainer.max_steps=5", "model.n_heads=3,2", f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert done.returncode == 1
    assert "2 jobs: 1 finished, 1 failed" in done.stdout
    failed = tmp_path / "s" / "logger=none,model.n_heads=3,model=tiny,telemetry.every=5,trainer.max_steps=5,trainer=smoke"
    assert re.search(r"n_heads=3,\S+ +failed +- +ValueError: model.d_model=32 is not divisible by model.n_heads=3", done.stdout)
    assert f"(log: {failed / 'error.log'})" in done.stdout and "Traceback" in (failed / "error.log").read_text()
    assert len(list((tmp_path / "s").glob("*n_heads=2*/checkpoint.pt"))) == 1  # the other job ran to the end
    page = report_page.build_report([tmp_path / "s"], tmp_path / "report").read_text(encoding="utf-8")
    assert "2 runs in 2 variants" in page and "no metrics.jsonl: stopped before training" in page  # listed, marked


def test_each_job_of_a_sweep_is_its_own_wandb_run(tmp_path):
    env = {"WANDB_MODE": "offline", "HOME": str(tmp_path), "WANDB_API_KEY": ""}
    done = sweep("logger=wandb", "trainer.max_steps=5", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'multirun' / 'abl'}",
                 cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {seed: list((tmp_path / "multirun" / "abl").glob(f"*seed={seed}*/wandb/offline-run-*")) for seed in (0, 1)}
    assert all(len(r) == 1 for r in runs.values())
    ids = {seed: r[0].name.rsplit("-", 1)[1] for seed, r in runs.items()}
    assert ids[0] != ids[1]
    for seed, (run,) in runs.items():
        record = next(run.glob("run-*.wandb")).read_bytes()
        assert f"seed={seed},telemetry".encode() in record and f"seed={1 - seed},telemetry".encode() not in record
        assert b"\x03abl:\x05train" in record  # group "abl" (the sweep dir below multirun/), job_type "train"


def test_the_parallel_launcher_runs_jobs_side_by_side(tmp_path):
    done = sweep("logger=none", "trainer.max_steps=5", "seed=0,1", "hydra/launcher=local_parallel",
                 f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in done.stdout + done.stderr
    assert "2 jobs: 2 finished" in done.stdout


def test_sigint_stops_a_parallel_sweep_with_checkpoints_and_the_same_command_resumes_it(tmp_path):
    # SIGINT to the sweep's parent (Ctrl-C sends it to every process of the group; the
    # parent alone is the harder case: the workers must learn of it from the parent).
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *SMOKE, "logger=none", "trainer.max_steps=40", "seed=0,1",
           "hydra/launcher=local_parallel", f"hydra.sweep.dir={tmp_path / 's'}"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    logged = lambda p: p.is_file() and '"train/loss"' in p.read_text()  # noqa: E731
    while not (len(jobs := sorted((tmp_path / "s").glob("*/metrics.jsonl"))) == 2 and all(map(logged, jobs))):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    overrides = " ".join([*cmd[3:-2], "hydra/launcher=local_parallel"])  # the job's, then Hydra's
    assert stderr.rstrip().endswith(f"normlab: sweep stopped by SIGINT; continue with: python train.py -m {overrides} "
                                    f"hydra.sweep.dir={tmp_path / 's'}")  # fmt: skip
    assert "Traceback" not in stderr
    while True:  # every process of the sweep (its session) is gone: the parent, the joblib workers, their trackers
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "processes of the sweep still running"
        time.sleep(0.2)
    stopped = {}
    for job in jobs:
        status = json.loads((job.parent / "status.json").read_text())
        assert status["state"] == "interrupted" and status["error"].startswith("RunInterrupted: stopped by SIGINT after step")
        assert load_checkpoint(job.parent / "checkpoint.pt")["step"] == status["step"] >= 1
        stopped[job.parent] = status["step"]
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 jobs: 2 finished" in again.stdout
    for run_dir, step in stopped.items():
        assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
        assert f"| {step}/40 [00:00<?" in again.stderr  # each job's progress starts at its checkpoint's step
    assert "| 0/40 [" not in again.stderr  # no job started over
    assert not (tmp_path / "s" / "STOP").exists()


def test_sigint_on_a_sequential_sweep_counts_the_jobs_it_stopped_and_those_it_never_started(tmp_path):
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *SMOKE, "logger=none", "trainer.max_steps=40", "seed=0,1,2,3",
           f"hydra.sweep.dir={tmp_path / 's'}"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    first = tmp_path / "s" / "logger=none,model=tiny,seed=0,telemetry.every=5,trainer.max_steps=40,trainer=smoke"
    while not ((first / "metrics.jsonl").is_file() and '"train/loss"' in (first / "metrics.jsonl").read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    head, *rows = stdout[stdout.index(f"sweep {tmp_path / 's'}: ") :].splitlines()
    assert head == f"sweep {tmp_path / 's'}: 4 jobs: 1 interrupted, 3 not started"
    assert [row.split()[1] for row in rows[:4]] == ["interrupted", "not", "not", "not"]  # the jobs' rows, seed 0 first
    assert all(row.split()[1:4] == ["not", "started", "-"] for row in rows[1:4])


def test_the_summary_counts_every_state_and_the_jobs_planned_without_a_dir(tmp_path):
    for name, state in [("a", "finished"), ("b", "diverged"), ("c", "interrupted"), ("d", "failed"), ("e", "running")]:
        (tmp_path / name).mkdir()
        write_status(tmp_path / name, state=state, step=3)
    (tmp_path / "f" / ".hydra").mkdir(parents=True)  # Hydra made the job's dir; the stopped sweep never started it
    table, failed = summarize(tmp_path, planned=7)
    assert failed == 2  # "running" at the end: the job died without a word
    assert table.splitlines()[0] == f"sweep {tmp_path}: 7 jobs: 1 finished, 1 diverged, 1 interrupted, 2 failed, 2 not started"
    assert table.splitlines()[-1].split() == ["f", "not", "started", "-"]
    assert summarize(tmp_path / "a")[0].splitlines()[0] == f"sweep {tmp_path / 'a'}: 1 job: 1 finished"


def test_the_planned_jobs_are_the_product_of_the_sweeps_of_the_experiment_and_the_command_line():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=norm_ablation"], return_hydra_config=True)
    assert planned_jobs(cfg) == 15  # 5 norms x 3 seeds
    cfg.hydra.overrides.task = ["+experiment=norm_ablation", "seed=0,1", "optim.lr=1e-3,2e-3"]  # seed: the command line's
    assert planned_jobs(cfg) == 5 * 2 * 2
    cfg.hydra.overrides.task = ["norm=glob(pre_*)"]  # needs Hydra's config loader: not counted, never a wrong number
    assert planned_jobs(cfg) is None


@pytest.mark.parametrize("launcher, stops", [(None, True), ("local_parallel", True), ("slurm", False)])
def test_only_a_local_sweep_stops_as_a_whole(launcher, stops, tmp_path):
    # On SLURM one job's timeout or preemption must checkpoint that job alone: no stop file for its sweep.
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from training.sweep import STOP_FILE, sweep_stop_file

    overrides = [f"hydra/launcher={launcher}"] if launcher else []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
    cfg.hydra.mode = RunMode.MULTIRUN
    HydraConfig.instance().set_config(cfg)
    try:
        assert sweep_stop_file() == (tmp_path / STOP_FILE if stops else None)
    finally:
        HydraConfig.instance().cfg = None
