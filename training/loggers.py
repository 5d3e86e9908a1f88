"""Metrics go to ``metrics.jsonl`` in the run dir (always: the local source of truth) and to
wandb when ``logger=wandb``.

wandb runs offline when no API key is configured (``WANDB_API_KEY`` or a ``~/.netrc`` entry for
the wandb host) and ``WANDB_MODE`` is unset; one line then says how to upload with ``wandb sync``.
"""

import json
import math
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from model.telemetry import depth_profile
from training.atomic import atomic_write


def wandb_mode() -> str:
    """``WANDB_MODE`` if set, else ``online`` when an API key is configured, else ``offline``."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return "online" if netrc.netrc().authenticators(host) else "offline"
    except (FileNotFoundError, netrc.NetrcParseError):
        return "offline"


class MetricsLogger:
    """Appends one JSON object per logging step to ``run_dir/metrics.jsonl``; mirrors to wandb.

    Args:
        run_dir: the run directory, or None to write nothing (ranks other than 0).
        wandb_run: kwargs for ``wandb.init`` (project, group, name, tags, config), or None for no wandb.
        resume_step: the step this run starts after (0: a fresh start): rows an earlier run in
            this dir logged past it (after its last checkpoint) are dropped, so every step appears once.
    """

    def __init__(self, run_dir: Path | None, wandb_run: dict[str, Any] | None, resume_step: int = 0) -> None:
        self._file = None
        if run_dir is not None:
            path = run_dir / "metrics.jsonl"
            if path.exists():
                kept = [line for line in path.read_text(encoding="utf-8").splitlines() if json.loads(line)["step"] <= resume_step]
                atomic_write(path, lambda f: f.write("".join(f"{line}\n" for line in kept).encode()))
            self._file = path.open("a", encoding="utf-8")
        self._wandb = None
        if wandb_run is not None:
            import wandb  # only runs that log to wandb pay for importing it

            mode = wandb_mode()
            self._wandb = wandb.init(dir=str(run_dir), mode=mode, job_type="train", reinit="finish_previous", **wandb_run)
            self._wandb.define_metric("trainer/step")
            for prefix in ("train", "val", "test", "optim", "perf", "mem", "act", "grad", "update", "attn"):
                self._wandb.define_metric(f"{prefix}/*", step_metric="trainer/step")
            if mode == "offline":
                print(f"wandb is offline (no API key found); upload later with: wandb sync {Path(self._wandb.dir).parent}")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at training step ``step``. Non-finite values are written as null."""
        if self._file is None:
            return
        row = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({"trainer/step": step, **metrics}, step=step)

    def log_depth_profile(self, step: int, stats: dict[str, float], recorded_at: int) -> None:
        """A wandb line plot of activation RMS vs depth (x = block index, encoder then decoder;
        one line per site) from the telemetry record ``stats``, logged at ``step`` and titled with
        the step ``recorded_at`` that the record comes from (the latest record before an evaluation
        may be older than it). The numbers are already in metrics.jsonl; the chart is logged at
        evaluations only, to keep the wandb run small."""
        if self._wandb is None:
            return
        import wandb

        profile = depth_profile(stats)
        if not profile:
            return
        sites = sorted(profile)
        xs = sorted({x for site in sites for x, _ in profile[site]})
        ys = [[dict(profile[site]).get(x, float("nan")) for x in xs] for site in sites]
        title = f"RMS vs depth, step {recorded_at}"
        chart = wandb.plot.line_series(xs=xs, ys=ys, keys=sites, title=title, xname="block (enc then dec)")
        self._wandb.log({"act/rms_vs_depth": chart}, step=step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
