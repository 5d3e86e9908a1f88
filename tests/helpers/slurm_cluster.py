"""The local SLURM cluster of ``scripts/slurm_local.sh`` for the tests marked ``slurm``, and what they share:
starting a sweep on it, finding a job's training process, and holding that process until a signal is pending, so
that a signal sent by SLURM lands in the middle of training however fast or loaded the machine is."""

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.config import ROOT

SCRIPT = ROOT / "scripts" / "slurm_local.sh"
# The local cluster's partition; no GPU, one CPU and 1 GB a job (the cluster lets 4 jobs share a CPU).
LAUNCHER = ["hydra/launcher=slurm", "hydra.launcher.partition=local", "hydra.launcher.gpus_per_node=0",
            "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]  # fmt: skip


def start_cluster() -> dict[str, str]:
    """Start the cluster (idempotent) and return the environment its clients need (``SLURM_CONF``); skips the test
    with the reason when the packages or root are missing or the cluster does not start. The cluster is left running
    for the other tests and workers (``scripts/slurm_local.sh stop`` stops it)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])  # where Debian puts the daemons
    missing = [c for c in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "flock") if shutil.which(c, path=path) is None]
    if missing:
        pytest.skip(f"no SLURM here (missing {' '.join(missing)}): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster (scripts/slurm_local.sh) needs root")
    done = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=120)
    if done.returncode:
        pytest.skip(f"the local SLURM cluster did not start: {done.stderr.strip()}")
    exports = [line.removeprefix("export ").split("=", 1) for line in done.stdout.splitlines() if line.startswith("export ")]
    return dict(exports)


def start_sweep(env: dict[str, str], cwd: Path, *overrides: str) -> subprocess.Popen:
    """``python train.py -m <overrides>`` in the background (stdout and stderr to ``cwd/sweep.out``, ``cwd/sweep.err``)."""
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *overrides]
    out, err = (open(cwd / f"sweep.{s}", "w") for s in ("out", "err"))  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, text=True, env={**os.environ, **env})


def finish(proc: subprocess.Popen, cwd: Path, timeout: float = 600) -> tuple[str, str]:
    """Wait for a sweep started by :func:`start_sweep`; its (stdout, stderr)."""
    proc.wait(timeout=timeout)
    return (cwd / "sweep.out").read_text(), (cwd / "sweep.err").read_text()


def wait_for(what: str, ready: Callable[[], object], proc: subprocess.Popen | None, timeout: float = 240) -> object:
    """Poll ``ready()`` until it is truthy and return it; fails naming ``what`` if the sweep ``proc`` ends or time runs
    out."""
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        assert proc is None or proc.poll() is None, f"the sweep ended (status {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)
    return value


def job_dir(sweep_dir: Path) -> Path | None:
    """The run dir of a one-job sweep once it has logged a training loss; None before."""
    runs = [p.parent for p in sweep_dir.glob("*/metrics.jsonl") if '"train/loss"' in p.read_text()]
    return runs[0] if runs else None


def job_pid(sweep_dir: Path) -> int | None:
    """The pid of the training process of the sweep's running SLURM job (``python -u -m submitit.core._submit
    <sweep dir>/.submitit/<job id>``, under srun); None while there is none."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
        except (OSError, ValueError):  # gone, or not a process
            continue
        if argv[1:4] == ["-u", "-m", "submitit.core._submit"] and argv[4].startswith(str(sweep_dir)):
            return int(proc.name)
    return None


def status_fields(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as {field: value}; {} once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def stopped(pid: int) -> bool:
    return status_fields(pid).get("State", "").startswith("T")


def pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits to be delivered to process ``pid``: its pending masks, bit signum - 1."""
    fields = status_fields(pid)
    return bool(fields) and bool((int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)) >> (signum - 1) & 1)


def hold_until_signalled(pid: int, signum: int, proc: subprocess.Popen, send: Callable[[], object] = lambda: None) -> None:
    """Stop the training process ``pid`` (SIGSTOP), call ``send`` (what makes SLURM signal it), wait until ``signum``
    is pending (or SLURM continued the process itself: it sends SIGCONT before SIGTERM) and let the process go on
    (SIGCONT): the signal then arrives in the middle of training, which would otherwise have ended on a fast machine
    before SLURM's signal came."""
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(f"pid {pid} stopped", lambda: stopped(pid) or not status_fields(pid), proc, timeout=30)
        send()
        name = signal.Signals(signum).name
        wait_for(f"{name} sent to pid {pid}", lambda: pending(pid, signum) or not stopped(pid), proc, timeout=120)
    finally:
        if status_fields(pid):
            os.kill(pid, signal.SIGCONT)
