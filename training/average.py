"""Checkpoint averaging (``trainer.average_last=k``): the final test scores the element-wise mean of the weights at
the run's last k checkpoint steps, the steps where a checkpoint is due (every ``trainer.checkpoint_every`` steps and
the last step), as Popel & Bojar 2018 ("Training Tips for the Transformer Model", §4.10) and fairseq's
``scripts/average_checkpoints.py`` do.

At each of those steps the weights go to a weights-only snapshot ``snapshot_<step>.pt`` in the run dir (the
``best.pt`` format, ``training.best``: config, model config, weights, step, task, vocabularies), written atomically
before the step's ``checkpoint.pt``, so a kill between the two leaves a snapshot that the resumed run writes again.
Only the last k are kept. A resume removes the snapshots a straight run would not hold at the checkpoint's step
(later steps, which it trains again, and steps no longer due after a change of ``trainer.checkpoint_every`` or
``trainer.max_steps``), so a stopped and resumed run averages the same snapshots as a straight one; a fresh start
removes them all (``training.run.claim_run_dir``). A signal's checkpoint between due steps writes no snapshot.

The average is fairseq's: floating-point entries of the state dict (weights, and BatchNorm's running statistics)
are averaged (here summed in float64, then cast back); integer buffers (BatchNorm's ``num_batches_tracked``,
PowerNorm's ``iters``) take the floor of their mean, fairseq's ``//= num_models``. Those counters are read only by a
training-mode forward, so the test's scores do not depend on them. The averaged weights are written to
``averaged.pt`` (weights only; ``scripts/predict.py RUN_DIR/averaged.pt`` decodes with them).
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runlog.atomic import atomic_write
from training.checkpoint import FORMAT, load_checkpoint

AVERAGED = "averaged.pt"
_SNAPSHOT = re.compile(r"snapshot_(\d+)\.pt")


def snapshot_path(run_dir: Path, step: int) -> Path:
    """``run_dir/snapshot_<step>.pt``."""
    return run_dir / f"snapshot_{step}.pt"


def snapshots(run_dir: Path) -> dict[int, Path]:
    """step -> path of every snapshot in ``run_dir``."""
    found = (_SNAPSHOT.fullmatch(p.name) for p in run_dir.glob("snapshot_*.pt"))
    return {int(m.group(1)): run_dir / m.group(0) for m in found if m}


def remove_snapshots(run_dir: Path) -> None:
    """Remove every snapshot and ``averaged.pt`` of ``run_dir`` (a fresh start: an earlier run's)."""
    for path in [*snapshots(run_dir).values(), run_dir / AVERAGED]:
        path.unlink(missing_ok=True)


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of ``states`` (state dicts with the same keys, shapes and dtypes): floating-point
    tensors averaged in float64 and cast back to their dtype, integer tensors the floor of their mean (fairseq).

    Raises:
        ValueError: no states, or states with different keys.
    """
    if not states:
        raise ValueError("no state dicts to average")
    keys = list(states[0])
    if any(list(s) != keys for s in states[1:]):
        raise ValueError("the state dicts to average hold different entries")
    out = {}
    for key in keys:
        first = states[0][key]
        wide = torch.float64 if first.is_floating_point() else first.dtype
        total = first.to(wide)  # summed in the states' order
        for s in states[1:]:
            total = total + s[key].to(wide)
        out[key] = (total / len(states)).to(first.dtype) if first.is_floating_point() else total // len(states)
    return out


@dataclass(frozen=True)
class LastCheckpoints:
    """The snapshots of a run with ``trainer.average_last=k``: ``k`` of them, at the steps where a checkpoint is due
    (multiples of ``every`` = ``trainer.checkpoint_every``, and ``max_steps``)."""

    k: int
    every: int
    max_steps: int

    def steps(self, step: int) -> list[int]:
        """The last ``k`` due steps up to ``step``, ascending: the snapshots a straight run holds after ``step``."""
        due = set(range(self.every, step + 1, self.every)) | ({self.max_steps} if self.max_steps <= step else set())
        return sorted(due)[-self.k :]

    def save(self, run_dir: Path, step: int, weights: dict[str, Any]) -> None:
        """At a due ``step``, write ``weights`` (``training.run.weights``) as its snapshot, then remove the snapshots
        no longer among the last ``k``; at any other step (a signal's checkpoint) do nothing."""
        if step % self.every and step != self.max_steps:
            return
        state = {"format": FORMAT, **weights, "step": step}
        atomic_write(snapshot_path(run_dir, step), lambda f: torch.save(state, f))
        self.prune(run_dir, step)

    def prune(self, run_dir: Path, step: int) -> None:
        """Remove the snapshots a straight run would not hold after ``step`` (on resume: ``step`` is the checkpoint's)."""
        keep = set(self.steps(step))
        for at, path in snapshots(run_dir).items():
            if at not in keep:
                path.unlink()

    def average(self, run_dir: Path, step: int) -> tuple[dict[str, torch.Tensor], str]:
        """(the mean of the snapshots of the last ``k`` due steps up to ``step`` that ``run_dir`` holds, what it is:
        ``average of the last 5 checkpoints, steps 3000-4000``). Fewer than ``k``: the average of those there are,
        and the text says why (``... (trainer.average_last=5: the run has 2 checkpoint steps)``).

        Raises:
            FileNotFoundError: none of them is there.
            ValueError: a snapshot is corrupt or of another step than its name says.
        """
        due = self.steps(step)
        present = [s for s in due if snapshot_path(run_dir, s).is_file()]
        if not present:
            raise FileNotFoundError(f"trainer.average_last={self.k}: no snapshot of steps {due} in {run_dir}")
        states = []
        for at in present:
            saved = load_checkpoint(snapshot_path(run_dir, at))
            if saved["step"] != at:
                raise ValueError(f"{snapshot_path(run_dir, at)} holds step {saved['step']}, not {at}")
            states.append(saved["model"])
        span = f"step {present[0]}" if len(present) == 1 else f"steps {present[0]}-{present[-1]}"
        text = f"average of the last {len(present)} checkpoints, {span}"
        if len(present) < self.k:  # a short run, or snapshots missing (steps trained with trainer.average_last off)
            why = [f"the run has {len(due)} checkpoint steps"] if len(due) < self.k else []
            if missing := [str(s) for s in due if s not in present]:
                why.append(f"no snapshot of step {', '.join(missing)}")
            text += f" (trainer.average_last={self.k}: {'; '.join(why)})"
        return average_state_dicts(states), text

    def write_average(self, run_dir: Path, weights: dict[str, Any], step: int, text: str) -> None:
        """Write the averaged ``weights`` (``training.run.weights`` of the averaged model) to ``averaged.pt``, with
        ``step`` (the run's last) and ``average``: ``text``."""
        state = {"format": FORMAT, **weights, "step": step, "average": text}
        atomic_write(run_dir / AVERAGED, lambda f: torch.save(state, f))
