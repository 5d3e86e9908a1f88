"""The best validation checkpoint (``trainer.test_checkpoint=best``): at each validation, the weights whose
validation score on the task's headline metric (G2P: PER, lower is better; translation: BLEU, higher) beats every
earlier one are written to ``best.pt`` in the run dir, and the final test scores them instead of the last step's.
Selecting the checkpoint on the development set is the usual protocol of character-transduction Transformers
(Wu et al. 2021, "Applying the Transformer to Character-level Transduction": their scripts' ``--bestacc``).

``best.pt`` is a weights-only checkpoint (``training.checkpoint.FORMAT``: config, model config, weights, step,
vocabularies and task, plus ``best``: ``{"metric": "val/per", "value": ...}``), so ``scripts/predict.py`` reads it;
it has no optimizer state and does not resume. Its step and score also travel in every ``checkpoint.pt`` (``best``),
so a resumed run keeps comparing against them. Ties keep the earlier checkpoint.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runlog.atomic import atomic_write
from runlog.tasks import MetricSpec
from training.checkpoint import FORMAT, load_checkpoint

BEST = "best.pt"


@dataclass
class BestCheckpoint:
    """The best validation score so far of ``metric`` (the task's headline) and its step; None before the first."""

    metric: MetricSpec
    step: int | None = None
    value: float | None = None

    def beats(self, value: float) -> bool:
        """Whether ``value`` (as stored: PER a fraction) is better than the best so far (any value beats none)."""
        if self.value is None:
            return True
        return value > self.value if self.metric.higher_is_better else value < self.value

    def consider(self, run_dir: Path, step: int, scores: dict[str, float], weights: dict[str, Any]) -> bool:
        """Write ``weights`` (with ``weights["model"]`` the state dict and the rest the checkpoint's other entries) to
        ``run_dir/best.pt`` if ``scores[metric.key]`` beats the best so far; returns whether it did."""
        value = scores[self.metric.key]
        if not self.beats(value):
            return False
        self.step, self.value = step, value
        state = {"format": FORMAT, **weights, "step": step, "best": self.record()}
        atomic_write(run_dir / BEST, lambda f: torch.save(state, f))
        return True

    def record(self) -> dict[str, Any]:
        """``{"metric": "val/per", "value": ..., "step": ...}``: what status.json and checkpoints keep."""
        return {"metric": f"val/{self.metric.key}", "value": self.value, "step": self.step}

    state_dict = record  # the record is all of its state: a resumed run compares against it

    def load_state_dict(self, saved: dict[str, Any], /) -> None:
        """Continue from a checkpoint's ``best`` entry (:meth:`record`; a step of None: saved before any validation,
        so the best starts afresh)."""
        self.step, self.value = saved["step"], saved["value"]

    def weights(self, run_dir: Path) -> dict[str, torch.Tensor]:
        """The state dict of ``run_dir/best.pt``.

        Raises:
            FileNotFoundError: no best checkpoint was written (no validation ran).
            ValueError: ``best.pt`` is corrupt, or of another step than this run's best (a stale file).
        """
        if self.step is None:
            raise FileNotFoundError(f"trainer.test_checkpoint=best: no validation ran, so {run_dir / BEST} was never written")
        saved = load_checkpoint(run_dir / BEST)
        if saved["step"] != self.step:
            raise ValueError(f"{run_dir / BEST} is of step {saved['step']}, but this run's best is step {self.step}")
        return saved["model"]
