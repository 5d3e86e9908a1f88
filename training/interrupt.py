"""Stop cleanly on SIGTERM (cluster preemption, ``kill``) or SIGINT (Ctrl-C): the loop finishes
the current step, writes a checkpoint and raises :class:`RunInterrupted`, instead of dying
mid-write. In a submitit job on SLURM, SLURM's time-limit warning (USR2) too: ``train.py`` then hands
it to submitit, which requeues the job (``training/slurm.py``).

A sweep stops as a whole: its stop file (``<sweep dir>/STOP``, holding the signal's number) is
written by the sweep's parent when it gets the signal and by a job that got it itself; every
running job of the sweep stops at its next step, and a job that has not started yet does not
start (``training/sweep.py``). A run that diverges stops too: :class:`NonFiniteLossError`."""

import signal
from pathlib import Path
from types import FrameType
from typing import Any

from runlog.atomic import atomic_write
from training.slurm import requeue_signal


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or inf at ``step``; the message names it and the last good checkpoint."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


class RunInterrupted(Exception):
    """The run stopped on a signal after checkpointing; ``signum`` says which."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def read_stop(path: Path | None) -> int:
    """The signal that stopped the sweep whose stop file is ``path``; 0 while none did (or no sweep)."""
    return int(path.read_text()) if path is not None and path.is_file() else 0


def request_stop(path: Path, signum: int) -> None:
    """Stop the sweep whose stop file is ``path``; the first signal stays recorded."""
    if not read_stop(path):
        atomic_write(path, lambda f: f.write(str(signum).encode()))


class StopRequest:
    """Within ``with StopRequest(sweep_stop) as stop:``, SIGTERM and SIGINT (and in a submitit job on SLURM its
    requeue signal, USR2) set ``stop.signum`` instead of killing the process (or, for USR2, instead of submitit
    requeuing the job mid-step); a second SIGINT still interrupts at once. With ``sweep_stop``,
    the sweep's stop file, ``stop.signum`` is also set once the sweep is stopped. The two signals
    are unblocked inside (a sweep's parent blocks them in its workers, so that an idle worker
    outlives a Ctrl-C); handlers and the signal mask are restored on exit.

    With ``at_once`` (a phase with nothing to save, e.g. ``"during the final test; <how to resume>"``) a signal
    raises :class:`RunInterrupted` (``stopped by SIGTERM <at_once>``) where the code is, instead of waiting for
    a step to end."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, sweep_stop: Path | None = None, at_once: str | None = None) -> None:
        self._signum = 0  # 0 until a signal arrives
        self._at_once = at_once
        self._sweep_stop = sweep_stop
        self._previous: dict[int, Any] = {}  # signal number -> the handler it had before
        self._mask: set[int] = set()
        self._signals = (*self.SIGNALS, *([sig] if (sig := requeue_signal()) else []))

    @property
    def signum(self) -> int:
        self._signum = self._signum or read_stop(self._sweep_stop)
        return self._signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._at_once is not None:
            raise RunInterrupted(f"stopped by {signal.Signals(signum).name} {self._at_once}", signum)
        if signum == signal.SIGINT and self._signum == signal.SIGINT:
            raise KeyboardInterrupt
        self._signum = signum

    def __enter__(self) -> "StopRequest":
        self._previous = {s: signal.signal(s, self._handle) for s in self._signals}
        self._mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, self._signals)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class StartUpSigint:
    """Within ``with StartUpSigint(keep):`` (a run's imports and set-up, before the loop's :class:`StopRequest`), a
    SIGINT raises KeyboardInterrupt where the code is, as Python's own handler does, and an error that leaves the
    block after a SIGINT came leaves it as KeyboardInterrupt, caused by that error: an interrupt landing inside
    CPython's import machinery can surface as another error (CPython 3.11 turned one that came while ``from itertools
    import izip`` built its ImportError into ``TypeError: expected a message argument``). Errors of the types in
    ``keep`` (raised on purpose, e.g. a refused resume) leave as they are. A SIGINT that is ignored (a job started
    with ``&``) or has another handler keeps it; the handler is restored on exit."""

    def __init__(self, keep: tuple[type[BaseException], ...] = ()) -> None:
        self._keep = keep
        self._arrived = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._arrived = True
        raise KeyboardInterrupt

    def __enter__(self) -> "StartUpSigint":
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if self._arrived and exc is not None and not isinstance(exc, (KeyboardInterrupt, *self._keep)):
            raise KeyboardInterrupt from exc
