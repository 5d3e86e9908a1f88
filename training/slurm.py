"""A job on SLURM through submitit (``hydra/launcher=slurm``): what a run records of its SLURM job, and
SLURM's time-limit warning handed to submitit once the run has checkpointed.

submitit's job process handles SLURM's warning signal (USR2, sent ``signal_delay_s`` before the time limit;
``SUBMITIT_PREEMPT_SIGNAL`` names another) itself: it re-submits the same job (hydra-submitit-launcher's
``checkpoint()``) and requeues it with ``scontrol requeue``, up to ``max_num_timeout`` timeouts. Run as it is, in the
middle of a training step, that handler exits at once and the requeued job starts over from the last periodic
checkpoint. So while training, :class:`training.interrupt.StopRequest` takes the signal like SIGTERM (finish the step,
write the checkpoint, raise ``RunInterrupted``), and ``train.py`` then calls submitit's handler (:func:`requeue`);
the requeued job continues from the checkpoint (``train.resume=auto``).

``hydra/launcher=slurm``'s launcher (``hydra_plugins/normlab_slurm_launcher.py``: Hydra takes a launcher from the
``hydra_plugins`` namespace package only) stops with one line, before any job is submitted, where submitit would end
in a traceback: a ``signal_delay_s`` not below the time limit ``timeout_min`` (:func:`timing_error`: the warning
would come as the job starts), no ``sbatch`` or ``srun`` on PATH (:func:`missing_error`), ``sbatch`` failing (no
controller reachable, an unknown partition: :func:`submit_error` quotes its error and says to check with ``sinfo``).
A job that fails once submitted is the sweep's to report (training.sweep). Stdlib only: imported with the config
checks.
"""

import os
import shutil
import signal
import subprocess
from typing import Any

COMMANDS = ("sbatch", "srun")  # what submitit runs to submit a job, and inside it


def requeue_signal() -> signal.Signals | None:
    """The signal on which submitit requeues this job (SIGUSR2 unless ``SUBMITIT_PREEMPT_SIGNAL`` names another, as
    submitit reads it); None outside a submitit job on SLURM."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return None
    return signal.Signals[f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}"]


def job_record() -> dict[str, str | int] | None:
    """This process's SLURM job, as ``status.json`` records it: ``job_id`` (``"123"``, or ``"123_4"`` for task 4 of
    array job 123, as squeue and scontrol name it), ``restarts`` (how many times SLURM requeued it, for a timeout or a
    preemption: ``SLURM_RESTART_COUNT``) and ``node``; None outside SLURM."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return None
    array = "SLURM_ARRAY_JOB_ID" in env and "SLURM_ARRAY_TASK_ID" in env
    job_id = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}" if array else env["SLURM_JOB_ID"]
    return {"job_id": job_id, "restarts": int(env.get("SLURM_RESTART_COUNT", "0")), "node": env.get("SLURMD_NODENAME", "")}


def requeue(signum: int) -> str | None:
    """Hand ``signum`` to the handler installed for it before training (submitit's, restored when ``StopRequest``
    exits), as if it had just arrived. submitit re-submits the job, requeues it and exits the process (SystemExit);
    when it will not requeue, this returns its reason (e.g. ``"Job not requeued because: timed-out too many
    times."``). None: the handler returned without requeuing (submitit's, on a task other than rank 0: rank 0
    requeues the job)."""
    from submitit.core.utils import UncompletedJobError  # only ever called inside a submitit job

    handler = signal.getsignal(signum)
    if not callable(handler):
        return f"no handler for {signal.Signals(signum).name} (not a submitit job?)"
    try:
        handler(signum, None)
    except UncompletedJobError as e:
        return str(e)
    return None


def timing_error(params: dict[str, Any]) -> str | None:
    """Why ``signal_delay_s`` (seconds) does not fit the time limit ``timeout_min`` (minutes) of the launcher's
    ``params``, in one line naming both; None when it is in [0, 60 timeout_min)."""
    delay, limit = params.get("signal_delay_s", 0), params.get("timeout_min", 0)
    if 0 <= delay < 60 * limit:
        return None
    return (
        f"hydra.launcher.signal_delay_s={delay} is not within hydra.launcher.timeout_min={limit} ({60 * limit} s): "
        f"SLURM's time-limit warning (USR2, signal_delay_s before the limit) would come as the job starts; "
        f"set signal_delay_s to 0..{60 * limit - 1} or raise timeout_min"
    )


def submit_error(error: BaseException) -> str | None:
    """The line for ``error`` when it is ``sbatch`` failing (submitit's FailedJobError from the CalledProcessError of
    the sbatch command: its stderr's last line quoted); None for any other error (a failed job's is the sweep's)."""
    cause = error.__cause__
    if not (isinstance(cause, subprocess.CalledProcessError) and list(cause.cmd)[:1] == ["sbatch"]):
        return None
    said = (str(error).strip().splitlines() or [f"exit status {cause.returncode}"])[-1]
    return f"hydra/launcher=slurm: sbatch could not submit the sweep: {said}; is the SLURM controller up? check with sinfo"


def missing_error() -> str | None:
    """The line for a machine without SLURM's commands (:data:`COMMANDS` not on PATH); None when both are there."""
    if not (missing := [c for c in COMMANDS if shutil.which(c) is None]):
        return None
    return (
        f"hydra/launcher=slurm: no SLURM here ({' and '.join(missing)} not on PATH); run the sweep where sinfo lists "
        f"your cluster's partitions, or pick another hydra/launcher"
    )
