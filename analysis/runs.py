"""One run directory, reduced to what a report shows: the :class:`Run` record.

A run is read by ``analysis.load``; its properties answer the questions a report asks of it
(finished? diverged, at which step? final and best metrics, throughput) from ``status.json``
when present, else from ``metrics.jsonl`` (runs written before status.json existed).
"""

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from runlog.status import STATES
from runlog.tasks import TaskSpec


class BlockSite(NamedTuple):
    """Where a per-site block metric was recorded: ``depth`` in the depth order (encoder blocks, then decoder
    blocks), ``block`` its name (``enc.1``), ``site`` the attention (``self_attn``) or matrix (``cross_attn.q``)."""

    depth: int
    block: str
    site: str


@dataclass
class Run:
    """One run directory, reduced to what the report shows.

    Attributes:
        path: the run directory.
        label: its name on the page (path relative to the directory given on the command line).
        config: the flattened config (``norm.kind`` -> ``"rmsnorm"``); empty if unreadable.
        series: metric -> [(step, value or None)] for ``train/``, ``val/``, ``test/``, ``perf/`` metrics and the
            stack-less telemetry (``out/logz``, ``out/max_logit``, ``optim/below_eps``) and the per-stack ``hc/`` gains.
        profiles: per-block telemetry, by profile name (``analysis.load.PROFILES``, ``SITE_PROFILES``): telemetry
            step -> depth -> value (``rms``: ``act/{block}.out/rms``), or -> :class:`BlockSite` -> value for a
            per-site metric (``max_logit``); a profile the run did not record is absent (:meth:`profile`: empty).
        n_enc: the encoder's blocks, placing decoder block i at depth ``n_enc + i`` in ``profiles``: the
            config's ``model.n_enc_layers``, else as far as the telemetry shows; 0 until metrics.jsonl is read.
        status: the parsed ``status.json``, or None when absent or unreadable.
        task: the task's metric spec (``runlog.tasks.read_task``: task.json, or the fallback of older run dirs);
            None while unread, or when task.json is unreadable (noted).
        notes: problems met while reading (shown in the table).
    """

    path: Path
    label: str
    config: dict[str, Any] = field(default_factory=dict)
    series: dict[str, list[tuple[int, float | None]]] = field(default_factory=dict)
    profiles: dict[str, dict[int, dict[Any, float]]] = field(default_factory=dict)
    n_enc: int = 0
    status: dict[str, Any] | None = None
    task: TaskSpec | None = None
    notes: list[str] = field(default_factory=list)

    def profile(self, name: str) -> dict[int, dict[Any, float]]:
        """The profile ``name`` (``rms``, ``grad``, ``max_logit``, ...): step -> depth or BlockSite -> value; {} if unrecorded."""
        return self.profiles.get(name, {})

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def diverged(self) -> bool:
        """status.json says so, or a logged train or valid loss is null (non-finite)."""
        if self.status_state == "diverged":
            return True
        return any(v is None for key in ("train/loss", "val/loss") for _, v in self.series.get(key, []))

    @property
    def diverged_at(self) -> int | None:
        """The step whose loss went non-finite: status.json's ``diverged_step``, else (runs written before it)
        the first step with a null train or valid loss; None for a run that did not diverge (or whose step is unknown)."""
        if not self.diverged:
            return None
        if (step := (self.status or {}).get("diverged_step")) is not None:
            return step
        bad = [s for key in ("train/loss", "val/loss") for s, v in self.series.get(key, []) if v is None]
        return min(bad, default=None)

    @property
    def finished(self) -> bool:
        """status.json says ``finished``; a run without status.json counts when it reached ``max_steps`` without
        diverging. Only finished runs enter a variant's means in the report's table."""
        if self.status_state != "unknown":
            return self.status_state == "finished"
        return not self.diverged and self.max_steps is not None and self.last_step == self.max_steps

    @property
    def status_state(self) -> str:
        """``state`` from status.json, or ``unknown`` (no status.json: crashed, killed or an old run)."""
        state = (self.status or {}).get("state")
        return state if state in STATES else "unknown"

    @property
    def last_step(self) -> int | None:
        """The step reached: status.json's, else the largest step in metrics.jsonl."""
        if isinstance(step := (self.status or {}).get("step"), int):
            return step
        steps = [s for points in self.series.values() for s, _ in points]
        return max(steps, default=None)

    @property
    def max_steps(self) -> int | None:
        value = (self.status or {}).get("max_steps", self.config.get("trainer.max_steps"))
        return value if isinstance(value, int) else None

    def final(self, metric: str) -> float | None:
        """A test metric (``test/per``): status.json's ``test`` entry, else its last finite value in metrics.jsonl."""
        test = (self.status or {}).get("test")
        test = test if isinstance(test, dict) else {}
        if finite(test.get(metric)) is not None:
            return float(test[metric])
        values = [v for _, v in self.series.get(metric, []) if v is not None]
        return values[-1] if values else None

    def best(self, metric: str, lower_is_better: bool = True) -> float | None:
        """The best finite value of ``metric`` the run's training reached, or None. Step 0 is left out: its
        ``val/loss`` is the untrained model's, which would otherwise stand as the best of a run whose validations
        were all worse, and of one that diverged before its first validation (None here)."""
        values = [v for s, v in self.series.get(metric, []) if v is not None and s > 0]
        return (min if lower_is_better else max)(values) if values else None

    def spike_score(self, series: str) -> float | None:
        """status.json's ``spike_score_{series}`` (``loss`` or ``grad_norm``: ``training/spikes.py``), the
        share of the run's steps that spiked; None for a run written before spike scores."""
        return finite((self.status or {}).get(f"spike_score_{series}"))

    @property
    def params(self) -> int | None:
        """status.json's ``params.total``: the model's parameters, a tied or shared matrix counted once
        (``EncoderDecoder.parameter_counts``); None for a run written before the record."""
        return self._param_count("total")

    @property
    def hc_params(self) -> int | None:
        """status.json's ``params.hc``: how many of :attr:`params` are hyper-connections' (0 without ``norm.hc``);
        None for a run written before the record."""
        return self._param_count("hc")

    def _param_count(self, key: str) -> int | None:
        record = (self.status or {}).get("params")
        value = record.get(key) if isinstance(record, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def wall_s(self) -> float | None:
        return finite((self.status or {}).get("wall_s"))

    @property
    def tokens_per_s(self) -> float | None:
        """status.json's throughput, else the median of the logged ``perf/tokens_per_s``."""
        value = finite((self.status or {}).get("tokens_per_s"))
        if value is not None:
            return value
        logged = [v for _, v in self.series.get("perf/tokens_per_s", []) if v is not None]
        return float(np.median(logged)) if logged else None


def finite(value: Any) -> float | None:
    """``value`` as a float if it is a finite number (not bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
