"""The spike score of a run's training loss and gradient norm: the share of steps whose value
jumps far above the values before it.

Source: OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious", arXiv 2501.00656, the section on training
stability): the spike score is the percentage of values in a series that are at least seven
standard deviations away from a rolling average of the last 1000 values; they report it for the
training loss and the gradient norm. Three things the paper leaves open are settled as OLMo-core's
spike monitor settles them (allenai/OLMo-core, ``src/olmo_core/train/callbacks/stability_monitor.py``,
``StabilityMonitorCallback._is_spike``): the statistics are of the values *before* the step (the
step's own value would inflate the std it is measured against), the standard deviation is the
population one (ddof 0), and only jumps *above* the mean count (a sudden drop is no instability).
The rest differs from that monitor (its window of 128, threshold of 6 std, constant-history rule,
combined score): docs/telemetry.md, "normlab vs OLMo-core", names each difference.

A few choices are normlab's, for runs far shorter than OLMo 2's (500-1000 steps, where a full
1000-value window would never fill): the window grows from ``min_history`` values until it holds
``window``, and steps with fewer than ``min_history`` values before them are never spikes but do
count in the denominator (the score is a share of *all* steps, as the paper's percentage of the
series). A non-finite value is a spike, and stays out of the window so that it does not poison
the next ``window`` steps' statistics.
"""

import math
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np

WINDOW = 1000  # values the mean and std are over (OLMo 2)
THRESHOLD = 7.0  # standard deviations above the mean (OLMo 2)
MIN_HISTORY = 100  # values needed before a step can be a spike (normlab's choice, see the module docstring)
SERIES = ("loss", "grad_norm")  # what a run scores: StepResult.loss (summed over ranks / world: the step's loss) and .grad_norm


class SpikeScore:
    """The running spike score of one per-step series, fed on the host in step order.

    Step t with value x_t and H_t = the last min(``window``, available) finite values before it is
    a spike when x_t is not finite, or when |H_t| >= ``min_history`` and

        x_t > mean(H_t)  and  x_t - mean(H_t) >= ``threshold`` * std(H_t)

    (std with ddof 0; a jump above a constant history is a spike). ``score`` = spikes / steps.

    Args:
        window: the most values H_t holds (>= 2).
        threshold: the jump, in standard deviations, that makes a spike (> 0).
        min_history: the fewest values H_t must hold (2 <= min_history <= window).

    Raises:
        ValueError: a setting out of range; the message names it and its valid range.
    """

    def __init__(self, window: int = WINDOW, threshold: float = THRESHOLD, min_history: int = MIN_HISTORY) -> None:
        if not isinstance(window, int) or window < 2:
            raise ValueError(f"spike score window={window!r} is invalid; it must be an integer >= 2")
        if not isinstance(min_history, int) or not 2 <= min_history <= window:
            raise ValueError(f"spike score min_history={min_history!r} is invalid; it must be an integer in [2, {window}]")
        if not math.isfinite(threshold) or threshold <= 0:
            raise ValueError(f"spike score threshold={threshold!r} is invalid; it must be a finite number > 0")
        self.threshold, self.min_history = threshold, min_history
        self.history: deque[float] = deque(maxlen=window)
        self.steps = 0
        self.spikes = 0

    def add(self, values: Iterable[float]) -> None:
        """Score each value of ``values`` (consecutive steps, oldest first) and slide the window over it."""
        for x in map(float, values):
            self.steps += 1
            if not math.isfinite(x):
                self.spikes += 1
                continue
            if len(self.history) >= self.min_history:
                h = np.fromiter(self.history, dtype=np.float64, count=len(self.history))
                mean = h.mean()
                self.spikes += bool(x > mean and x - mean >= self.threshold * h.std())
            self.history.append(x)

    @property
    def score(self) -> float:
        """spikes / steps: the share of the steps so far that were spikes (0.0 before any step)."""
        return self.spikes / self.steps if self.steps else 0.0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint carries so that a resumed run scores on as if never stopped."""
        return {"history": list(self.history), "steps": self.steps, "spikes": self.spikes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        self.history.extend(state["history"])
        self.steps, self.spikes = state["steps"], state["spikes"]


class RunSpikes:
    """The spike scores of a run's training loss and gradient norm (``SERIES``), each fed every
    step's value (``training.window.LogWindow`` hands them over at each logging step).

    Names: ``spike_score_{series}`` in ``status.json`` and ``train/spike_score_{series}`` in the
    metrics; values are fractions of steps (the paper's percentage / 100).
    """

    def __init__(self) -> None:
        self.series = {name: SpikeScore() for name in SERIES}

    def add(self, loss: list[float], grad_norm: list[float]) -> None:
        """Feed consecutive steps' losses and gradient norms (equal lengths, oldest first)."""
        self.series["loss"].add(loss)
        self.series["grad_norm"].add(grad_norm)

    def status(self) -> dict[str, float]:
        """The ``status.json`` fields: ``spike_score_loss``, ``spike_score_grad_norm``."""
        return {f"spike_score_{name}": s.score for name, s in self.series.items()}

    def metrics(self) -> dict[str, float]:
        """The same scores as logged metrics: ``train/spike_score_loss``, ``train/spike_score_grad_norm``."""
        return {f"train/{key}": value for key, value in self.status().items()}

    def state_dict(self) -> dict[str, Any]:
        return {name: s.state_dict() for name, s in self.series.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, s in self.series.items():
            s.load_state_dict(state[name])
