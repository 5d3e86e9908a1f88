"""Hydra multirun support: the wandb group of a sweep and the summary printed when it ends.

A failing job does not stop a sweep: ``train.py`` records it in the job's ``status.json`` (and
its traceback in ``error.log``) and returns, the launcher goes on, and :class:`SweepSummary`
lists every job's state at the end and exits with status 1 if any failed.

SIGINT or SIGTERM stops a local sweep (basic or joblib launcher) as a whole: every running job
checkpoints at its next step and exits, no further job starts, and the parent, once every job has
returned, prints the table and one line with the command that continues the sweep, and exits with
status 128 + signal. The parent blocks
the two signals in itself (a thread waits for them) and so in the workers it starts, which unblock
them only while training (``training/interrupt.py``): an idle joblib worker killed by a Ctrl-C would
make joblib kill the others mid-step. On SLURM each job keeps its own signals: a timeout or
preemption checkpoints that job alone (submitit requeues it), never its sweep.
"""

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from runlog.status import read_status
from training.cli import continue_command
from training.interrupt import StopRequest, read_stop, request_stop

STOP_FILE = "STOP"  # in the sweep dir: the signal that stopped the sweep (training/interrupt.py)


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_group() -> str | None:
    """The wandb group of a multirun job: its sweep dir below the last ``multirun`` folder (e.g.
    ``norm_ablation/2026-11-30_12-00-00``), or the sweep dir's name; None outside a multirun."""
    if not in_multirun():
        return None
    parts = Path(HydraConfig.get().sweep.dir).parts
    below = parts[len(parts) - parts[::-1].index("multirun") :] if "multirun" in parts else parts[-1:]
    return "/".join(below) or parts[-1]


LOCAL_LAUNCHERS = (
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
)


def sweep_stop_file() -> Path | None:
    """This multirun job's sweep's stop file; None outside a multirun, and for a launcher that does not run the jobs
    on this machine (SLURM): there one job's timeout or preemption must not stop its sweep, whose jobs submitit
    requeues one by one."""
    if not in_multirun() or HydraConfig.get().launcher.get("_target_") not in LOCAL_LAUNCHERS:
        return None
    return Path(HydraConfig.get().sweep.dir) / STOP_FILE


def parallel_jobs() -> int:
    """How many jobs of this sweep run side by side on this machine (joblib's ``n_jobs``; 1 otherwise)."""
    if not in_multirun():
        return 1
    n_jobs = HydraConfig.get().launcher.get("n_jobs", 1)
    return os.cpu_count() or 1 if n_jobs < 0 else n_jobs


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def planned_jobs(config: DictConfig) -> int | None:
    """How many jobs the multirun ``config`` (the sweep's ``multirun.yaml``) asks for: the product of its sweeps'
    lengths, as Hydra's basic sweeper expands ``hydra.sweeper.params`` and then the command line's overrides (a key in
    both: the command line's). None for another sweeper, or overrides it cannot expand without the config loader
    (``glob(...)``)."""
    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    try:
        overrides = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
        (jobs,) = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    except HydraException:
        return None
    return len(jobs)


def _job_row(sweep_dir: Path, run_dir: Path) -> tuple[tuple[str, ...], str]:
    """One job's row of :func:`summarize` and the state it counts under (a failed job: ``failed``)."""
    status = read_status(run_dir)
    state = status.get("state", "unknown") if status else "not started"  # Hydra made its dir; train.py never began
    test = " ".join(f"{k.removeprefix('test/')} {v:.2%}" for k, v in sorted(status.get("test", {}).items()))
    if state in ("failed", "running", "unknown"):  # "running" here: the job died without a word
        log = run_dir / "error.log" if (run_dir / "error.log").exists() else run_dir / "train.log"
        error = (status.get("error") or "").splitlines()
        test = f"{error[0] if error else ''} (log: {log})"
    job = status.get("slurm")
    slurm = f"slurm {job['job_id']} requeued {job['restarts']}x" if job else ""
    counted = "failed" if state in ("running", "unknown") else state
    return (str(run_dir.relative_to(sweep_dir)), state, str(status.get("step", "-")), slurm, test), counted


SUMMARY_STATES = ("finished", "diverged", "interrupted", "failed", "not started")  # the header's order


def summarize(sweep_dir: Path, planned: int | None = None) -> tuple[str, int]:
    """A table of the jobs under ``sweep_dir`` (one per ``status.json``, and one per job dir Hydra made whose job never
    started: no ``status.json``): state, step, for a SLURM job its job id and how many times SLURM requeued it
    (timeouts and preemptions), test metrics, and for failed jobs the first line of the error (a SLURM job that was
    not requeued: why) and the log to read. Its first line counts the jobs by state (``4 jobs: 1 interrupted, 3 not
    started``); ``planned``, the sweep's number of jobs (:func:`planned_jobs`), counts those without a dir as not
    started. Returns (table, number of failed jobs)."""
    job_dirs = {p.parent for p in sweep_dir.rglob("status.json")} | {p.parent for p in sweep_dir.rglob(".hydra")}
    rows, counts = [], dict.fromkeys(SUMMARY_STATES, 0)
    for run_dir in sorted(job_dirs):
        row, counted = _job_row(sweep_dir, run_dir)
        rows.append(row)
        counts[counted] += 1
    counts["not started"] += max(0, (planned or 0) - len(rows))
    if not rows and not counts["not started"]:
        return f"no jobs found under {sweep_dir}", 0
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(4)]
    lines = [
        f"{job:<{widths[0]}}  {state:<{widths[1]}}  {step:>{widths[2]}}  "
        + (f"{slurm:<{widths[3]}}  " if widths[3] else "")
        + test
        for job, state, step, slurm, test in rows
    ]
    total, by_state = sum(counts.values()), ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    return "\n".join([f"sweep {sweep_dir}: {total} job{'s' * (total != 1)}: {by_state}", *lines]), counts["failed"]


class SweepSummary(Callback):
    """Stops the sweep on SIGINT or SIGTERM (module docstring); prints :func:`summarize` when a
    multirun ends; exit status 128 + signal if it was stopped, else 1 if a job failed."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.launcher.get("_target_") not in LOCAL_LAUNCHERS:  # SLURM: Ctrl-C leaves the submitted jobs be
            return
        stop = Path(config.hydra.sweep.dir) / STOP_FILE
        stop.unlink(missing_ok=True)  # a re-run of a stopped sweep

        def stop_sweep(signum: int, frame: object = None) -> None:
            stop.parent.mkdir(parents=True, exist_ok=True)
            request_stop(stop, signum)

        def wait_for_signals() -> None:
            while True:
                stop_sweep(signal.sigwait(StopRequest.SIGNALS))

        for s in StopRequest.SIGNALS:  # also replaces an inherited SIG_IGN, which would drop the signal
            signal.signal(s, stop_sweep)
        signal.pthread_sigmask(signal.SIG_BLOCK, StopRequest.SIGNALS)  # inherited by later threads and workers
        threading.Thread(target=wait_for_signals, name="sweep-stop", daemon=True).start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        table, failed = summarize(Path(config.hydra.sweep.dir), planned_jobs(config))
        print(table)
        if signum := read_stop(Path(config.hydra.sweep.dir) / STOP_FILE):
            again = continue_command(config.hydra, config.hydra.sweep.dir)
            print(f"normlab: sweep stopped by {signal.Signals(signum).name}; continue with: {again}", file=sys.stderr)
            sys.exit(128 + signum)
        if failed:
            sys.exit(1)
