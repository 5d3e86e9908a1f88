"""``status.json``: one small file per run dir saying where the run stands.

Written atomically at start, at each checkpoint and at the end, so a sweep re-run, the sweep
summary and ``scripts/report.py`` can tell finished, diverged, failed and interrupted runs apart
without parsing logs. Fields: ``state`` (one of ``STATES``), ``step``, ``max_steps``, ``wall_s``
(seconds of training in this run dir, summed over resumes), ``tokens_per_s`` (target tokens per
second over those seconds), ``spike_score_loss`` and ``spike_score_grad_norm`` (the share of the
steps so far whose training loss / gradient norm spiked: ``training/spikes.py``; the run's at the
end), ``error`` (message or null), ``diverged_step`` (a diverged run's step whose training loss
went non-finite; absent otherwise), ``test`` (final test metrics), ``params`` (written once the model is built:
``{"total": N, "hc": M}``, its parameter entries with a tied or shared matrix counted once, and of them the
hyper-connections', 0 without ``norm.hc``: ``EncoderDecoder.parameter_counts``; absent from runs written before it),
``precision`` (``fp32`` or ``bf16``, what ``trainer.precision`` resolved to: ``training.precision``; absent from runs
written before it), ``best`` (with ``trainer.test_checkpoint=best``: ``{"metric": "val/per", "value": v, "step": n}``,
the validation whose weights the test scored: ``training/best.py``), ``tested`` (written with ``test``: the weights the
test scored, ``the last step's weights``, the best validation checkpoint's or ``average of the last 5 checkpoints,
steps 3000-4000``: ``training/average.py``), once the run logs to wandb, ``wandb_id`` (its
wandb run id, resumed by every later attempt in the dir), and in a SLURM job ``slurm``: ``{"job_id": "123_4",
"restarts": N, "node": host}``, its job id and how many times SLURM requeued it (``training/slurm.py``).
"""

import json
from pathlib import Path
from typing import Any

from runlog.atomic import atomic_write

STATES = ("running", "finished", "diverged", "failed", "interrupted")
DONE = ("finished", "diverged")  # a re-run of the same run dir skips these; the others resume
LAST_STEP_TESTED = "the last step's weights"  # ``tested`` of a run whose test scored checkpoint.pt's weights


def write_status(run_dir: Path, **fields: Any) -> None:
    """Merge ``fields`` into ``run_dir/status.json`` (temp file + rename, so readers never see half).

    Raises:
        ValueError: ``state`` is not one of ``STATES``.
    """
    if "state" in fields and fields["state"] not in STATES:
        raise ValueError(f"unknown run state {fields['state']!r}; valid: {', '.join(STATES)}")
    status = {**read_status(run_dir), **fields}
    atomic_write(run_dir / "status.json", lambda f: f.write(json.dumps(status, indent=1).encode()))


def read_status(run_dir: Path) -> dict[str, Any]:
    """The run's status dict, or ``{}`` when the run dir has none (a new run)."""
    path = run_dir / "status.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
