"""Metrics go to ``metrics.jsonl`` in the run dir (always: the local source of truth) and to
wandb when ``logger=wandb``.

wandb runs offline when no API key is configured (``WANDB_API_KEY`` or a ``~/.netrc`` entry for
the wandb host) and ``WANDB_MODE`` is unset; one line then says how to upload with ``wandb sync``.

wandb itself prints nothing (``wandb.Settings(silent=True)``: no banner, no end-of-run history and
summary), so normlab's own summary table is the last thing a job prints; its errors still raise.
``WANDB_SILENT=false`` (or ``WANDB_QUIET``) in the environment hands the choice back to wandb.

One run dir is one wandb run, across resumes: the first attempt keeps its wandb run id in
``status.json`` (``wandb_id``) and every later attempt in that dir resumes that id (see
docs/scale.md, "wandb across resumes").
"""

import contextlib
import json
import math
import netrc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from runlog.atomic import atomic_write
from runlog.metric_names import DEPTH_CHART, FAMILIES, depth_profile
from runlog.status import read_status, write_status

# The prefixes of everything logged per step, each plotted against trainer/step in wandb: the trainer's own and
# every telemetry family of metric_names (optim/ is shared by both). wandb takes a glob only as a prefix: "p/*"
# matches every name starting with "p/" (wandb-core internal/runmetric, matchGlobMetric).
STEP_METRIC_PREFIXES = tuple(dict.fromkeys(("train", "val", "test", "optim", "perf", "mem", *FAMILIES)))
# Environment variables by which the user sets wandb's own output; with neither set, wandb runs silent.
WANDB_OUTPUT_ENV = ("WANDB_SILENT", "WANDB_QUIET")


def wandb_mode() -> str:
    """``WANDB_MODE`` if set, else ``online`` when an API key is configured, else ``offline``."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return "online" if netrc.netrc().authenticators(host or "") else "offline"  # no host: netrc's default entry
    except (FileNotFoundError, netrc.NetrcParseError):
        return "offline"


class MetricsLogger:
    """Appends one JSON object per logging step to ``run_dir/metrics.jsonl``; mirrors to wandb.

    Args:
        run_dir: the run directory, or None to write nothing (ranks other than 0).
        wandb_run: kwargs for ``wandb.init`` (project, group, name, tags, config), or None for no wandb.
        resume_step: the step this run starts after (0: a fresh start): rows an earlier run in
            this dir logged past it (after its last checkpoint) are dropped, so every step appears once.
            A fresh start drops them all, the earlier run's step-0 row too (it logs its own).

    Raises:
        ValueError: a line of the earlier ``metrics.jsonl`` other than its last does not parse (:func:`logged_rows`).
    """

    def __init__(self, run_dir: Path | None, wandb_run: dict[str, Any] | None, resume_step: int = 0) -> None:
        self._file = None
        last_logged = 0  # the last step an earlier attempt in this dir logged (to wandb too, if it used wandb)
        if run_dir is not None:
            path = run_dir / "metrics.jsonl"
            if path.exists():
                rows = logged_rows(path)
                last_logged = max((step for step, _ in rows), default=0)
                kept = "".join(f"{line}\n" for step, line in rows if resume_step and step <= resume_step)
                atomic_write(path, lambda f: f.write(kept.encode()))
            self._file = path.open("a", encoding="utf-8")
        self._wandb = None
        if wandb_run is not None and run_dir is not None:  # no run dir: nothing written, wandb's run id included
            self._wandb = start_wandb(run_dir, wandb_run, resume_step, last_logged)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at training step ``step``. Non-finite values are written as null."""
        if self._file is None:
            return
        row = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._to_wandb(lambda run: run.log({"trainer/step": step, **metrics}, step=step))

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
        self._to_wandb(lambda run: run.log({DEPTH_CHART: chart}, step=step))

    def close(self, state: str = "finished") -> None:
        """Close ``metrics.jsonl`` and end the wandb run as ``state`` ended (``status.json``'s: finished, diverged,
        interrupted, failed): its summary's ``run/state`` holds it, which every server shows, and wandb's exit code
        is 0 for ``finished``, else 1, so W&B marks the run failed; an interrupted run is marked preempting first
        (W&B: preempted, until its resume continues it)."""
        if self._file is not None:
            self._file.close()
        if self._wandb is not None:

            def end(run: Any) -> None:
                run.summary["run/state"] = state
                if state == "interrupted":
                    run.mark_preempting()
                run.finish(exit_code=0 if state == "finished" else 1)

            self._to_wandb(end)
            self._wandb = None

    def _to_wandb(self, call: Callable[[Any], object]) -> None:
        """``call(wandb run)``; when wandb's service process is gone, one line says so and this attempt goes on without
        wandb (metrics.jsonl has every row). SLURM stops a preempted or cancelled job by SIGTERM to every process of
        it, wandb's service too, which exits at once (wandb/wandb#9963): the server then lacks the rows the service
        had not sent yet; the requeued job resumes the same wandb run."""
        import wandb

        try:
            call(self._wandb)
        except OSError as e:  # the service's socket: ConnectionResetError, BrokenPipeError
            print(
                f"normlab: wandb's service process is gone ({type(e).__name__}: {e}); this attempt logs to "
                "metrics.jsonl only, and the server lacks the rows wandb had not sent (a later attempt in this run dir "
                "resumes the wandb run)"
            )
            self._wandb = None
            with contextlib.suppress(OSError):
                wandb.teardown()  # it fails too, but lets go of the dead service: no traceback at exit


def logged_rows(path: Path) -> list[tuple[int, str]]:
    """(step, line) of each row of an earlier attempt's ``metrics.jsonl``. A last line cut short (no newline at its
    end, not JSON) is what a run killed mid-write leaves: it is dropped, saying so in one line.

    Raises:
        ValueError: any other line that is not a JSON row with a ``step``; the message names the file and line.
    """
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append((int(json.loads(line)["step"]), line))
        except (ValueError, KeyError, TypeError) as e:
            if number == len(lines) and not text.endswith("\n"):
                print(f"normlab: {path}: dropped its last line (line {number}), cut short by a run killed mid-write")
                continue
            raise ValueError(
                f"{path} line {number} is not a metrics row ({type(e).__name__}: {e}); only a last line "
                "cut short by a kill is dropped on resume: repair or delete that line"
            ) from None
    return rows


def start_wandb(run_dir: Path, init_kwargs: dict[str, Any], resume_step: int, last_logged: int) -> Any:
    """``wandb.init`` for this run dir: a new wandb run on the first attempt (its id is then kept in
    ``status.json`` as ``wandb_id``), else that run resumed, so one run dir stays one wandb run.

    Online, when an earlier attempt logged past ``resume_step`` (killed after its last checkpoint),
    the run is rewound to ``resume_step`` (``resume_from="<id>?_step=<k>"``, wandb's rewind; a
    server-side preview feature) so the replayed steps replace the old rows; where the server
    refuses, the run is resumed as it is (``resume="allow"``): wandb then keeps the old rows for those
    steps and drops the replayed ones (it ignores rows below its last step). Offline, the run is
    resumed by id: each attempt is its own ``wandb/offline-run-*-<id>`` folder, uploaded into one run
    by ``wandb sync <run_dir>/wandb``. The source is wandb's ``wandb.init`` (``id``, ``resume``,
    ``resume_from``) and wandb-core ``internal/runbranch`` (a rewind starts at step ``k + 1``).

    Returns:
        the ``wandb.Run``.
    """
    import wandb  # only runs that log to wandb pay for importing it

    mode = wandb_mode()
    run_id = read_status(run_dir).get("wandb_id")
    kwargs = {"dir": str(run_dir), "mode": mode, "job_type": "train", "reinit": "finish_previous", **init_kwargs}
    if not any(k in os.environ for k in WANDB_OUTPUT_ENV):  # else wandb reads them itself
        kwargs["settings"] = wandb.Settings(silent=True)
    replayed = f"steps {resume_step + 1}..{last_logged}"
    run = None
    if run_id and last_logged > resume_step and mode == "online":
        try:
            run = wandb.init(**kwargs, resume_from=f"{run_id}?_step={resume_step}")
        except wandb.errors.Error as e:  # rewind is not enabled on every server
            print(
                f"normlab: wandb could not rewind run {run_id} to step {resume_step} ({e}); it keeps the earlier rows "
                f"for {replayed} and ignores the replayed ones (metrics.jsonl has the replayed ones)"
            )
    elif run_id and last_logged > resume_step and mode == "offline":
        print(
            f"normlab: wandb is offline: the interrupted attempt's rows for {replayed} stay in its offline folder, so "
            f"after wandb sync those steps appear twice (metrics.jsonl has them once)"
        )
    if run is None:
        run = wandb.init(**kwargs, **({"id": run_id, "resume": "allow"} if run_id else {}))
    if not run_id:
        write_status(run_dir, wandb_id=run.id)
    define_step_metrics(run)
    if mode == "offline":
        wandb_dir = Path(run.dir).parents[1]  # <run_dir>/wandb: every attempt's offline-run-*-<id> folder
        print(f"wandb is offline (no API key found); upload every attempt of this run later with: wandb sync {wandb_dir}")
    return run


def define_step_metrics(run: Any) -> None:
    """Make ``trainer/step`` the x axis of every metric under ``STEP_METRIC_PREFIXES`` in the wandb ``run``
    (``run.define_metric``, one prefix glob each)."""
    run.define_metric("trainer/step")
    for prefix in STEP_METRIC_PREFIXES:
        run.define_metric(f"{prefix}/*", step_metric="trainer/step")
