"""Stop cleanly on SIGTERM (cluster preemption, ``kill``) or SIGINT (Ctrl-C): the loop finishes
the current step, writes a checkpoint and raises :class:`RunInterrupted`, instead of dying
mid-write."""

import signal
from types import FrameType


class RunInterrupted(Exception):
    """The run stopped on a signal after checkpointing; ``signum`` says which."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class StopRequest:
    """Within ``with StopRequest() as stop:``, SIGTERM and SIGINT set ``stop.signum`` instead of
    killing the process; a second SIGINT still interrupts at once. Handlers are restored on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum = 0  # 0 until a signal arrives
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> "StopRequest":
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
