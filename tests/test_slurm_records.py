"""The SLURM pieces that need no cluster: what a job records of its SLURM job, SLURM's time-limit warning taken at a
step boundary inside a submitit job only, the sweep summary's SLURM column, and ``hydra/launcher=slurm``'s start-up
failures in one line (a time-limit warning past the limit, no SLURM, no controller: stand-in ``sbatch`` and ``srun``)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from runlog.status import write_status
from tests.helpers.config import ROOT, TINY, compose_conf
from training import slurm
from training.interrupt import StopRequest
from training.sweep import summarize

UNREACHABLE = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"


def test_a_job_records_its_slurm_job_id_and_requeue_count(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "SLURMD_NODENAME"):
        monkeypatch.delenv(name, raising=False)
    assert slurm.job_record() is None
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    assert slurm.job_record() == {"job_id": "17", "restarts": 0, "node": ""}
    # Task 2 of array 15 is SLURM job 17; squeue and scontrol call it 15_2.
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "15")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu7")
    assert slurm.job_record() == {"job_id": "15_2", "restarts": 3, "node": "gpu7"}


def test_the_time_limit_warning_stops_training_at_a_step_only_in_a_submitit_slurm_job(monkeypatch):
    def submitit_handler(signum, frame):  # stands for submitit's: it would requeue the job and exit
        raise AssertionError("submitit's handler ran inside StopRequest")

    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
        assert slurm.requeue_signal() == signal.SIGUSR2
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.signum == signal.SIGUSR2
        assert signal.getsignal(signal.SIGUSR2) is submitit_handler  # back for train.py to hand the signal to
        monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")  # submitit's own setting of its signal
        assert slurm.requeue_signal() == signal.SIGUSR1
        monkeypatch.delenv("SUBMITIT_EXECUTOR")
        assert slurm.requeue_signal() is None
        with StopRequest():  # outside submitit the signal is left to whoever handles it
            assert signal.getsignal(signal.SIGUSR2) is submitit_handler
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_the_sweep_summary_lists_slurm_jobs_and_why_one_was_not_requeued(tmp_path):
    for seed in (0, 1):
        (tmp_path / f"seed={seed}").mkdir()
    why = "not requeued: timed-out too many times (hydra.launcher.max_num_timeout=3); stopped by SIGUSR2 after step 7"
    write_status(tmp_path / "seed=0", state="finished", step=20, test={"test/per": 0.25}, slurm={"job_id": "15_0", "restarts": 1})
    write_status(tmp_path / "seed=1", state="failed", step=7, error=why, slurm={"job_id": "15_1", "restarts": 3})
    table, failed = summarize(tmp_path)
    assert failed == 1
    assert table.splitlines() == [
        f"sweep {tmp_path}: 2 jobs: 1 finished, 1 failed",
        "seed=0  finished  20  slurm 15_0 requeued 1x  per 25.00%",
        f"seed=1  failed     7  slurm 15_1 requeued 3x  {why} (log: {tmp_path / 'seed=1' / 'train.log'})",
    ]


def slurm_sweep(tmp_path: Path, *overrides: str, commands: bool = True) -> subprocess.CompletedProcess:
    """``train.py -m hydra/launcher=slurm`` of one job, with PATH holding only stand-ins for SLURM's commands (none
    with ``commands=False``): ``sbatch`` answers as with no controller reachable; each logs its call to ``calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "srun") if commands else ():
        fail = f"echo '{UNREACHABLE}' >&2; " if name == "sbatch" else ""
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} >> {tmp_path / 'calls'}; {fail}exit 1\n")
        (bin_dir / name).chmod(0o755)
    args = [*TINY, "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PATH": str(bin_dir)})  # fmt: skip


def test_the_slurm_presets_timing_fits_and_a_warning_past_the_limit_is_named(tmp_path):
    launcher = compose_conf("hydra/launcher=slurm", hydra=True).hydra.launcher
    assert launcher._target_ == "hydra_plugins.normlab_slurm_launcher.SlurmLauncher"
    assert slurm.timing_error(OmegaConf.to_container(launcher)) is None  # 120 s before a 240-minute limit
    assert slurm.timing_error({"signal_delay_s": 59, "timeout_min": 1}) is None
    assert slurm.timing_error({"signal_delay_s": 60, "timeout_min": 1}).startswith("hydra.launcher.signal_delay_s=60 is not")
    assert slurm.timing_error({"signal_delay_s": -1, "timeout_min": 1}) is not None


def test_a_time_limit_warning_past_the_time_limit_stops_the_sweep_at_start_in_one_line(tmp_path):
    done = slurm_sweep(tmp_path, "hydra.launcher.signal_delay_s=600", "hydra.launcher.timeout_min=1")
    assert done.returncode == 1
    assert done.stderr == ("normlab: error: hydra.launcher.signal_delay_s=600 is not within hydra.launcher.timeout_min=1 "
                           "(60 s): SLURM's time-limit warning (USR2, signal_delay_s before the limit) would come as the "
                           "job starts; set signal_delay_s to 0..59 or raise timeout_min\n")  # fmt: skip
    assert not (tmp_path / "calls").exists()  # checked before anything is submitted


def test_no_slurm_controller_reachable_is_one_normlab_line_saying_how_to_check(tmp_path):
    done = slurm_sweep(tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (f"normlab: error: hydra/launcher=slurm: sbatch could not submit the sweep: "
                                            f"{UNREACHABLE}; is the SLURM controller up? check with sinfo")  # fmt: skip
    assert (tmp_path / "calls").read_text() == "sbatch\n"


def test_no_slurm_on_the_machine_is_one_normlab_line(tmp_path):
    done = slurm_sweep(tmp_path, commands=False)
    assert done.returncode == 1
    assert done.stderr == ("normlab: error: hydra/launcher=slurm: no SLURM here (sbatch and srun not on PATH); run the sweep "
                           "where sinfo lists your cluster's partitions, or pick another hydra/launcher\n")  # fmt: skip
