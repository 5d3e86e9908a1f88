"""The SLURM pieces that need no cluster: what a job records of its SLURM job, SLURM's time-limit warning taken at a
step boundary inside a submitit job only, and the sweep summary's SLURM column."""

import os
import signal

from runlog.status import write_status
from training import slurm
from training.interrupt import StopRequest
from training.sweep import summarize


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
        f"sweep {tmp_path}: 2 jobs, 1 failed",
        "seed=0  finished  20  slurm 15_0 requeued 1x  per 25.00%",
        f"seed=1  failed     7  slurm 15_1 requeued 3x  {why} (log: {tmp_path / 'seed=1' / 'train.log'})",
    ]
