"""The task of a run: its data and vocabularies, and how its decoded output is scored.

One module per task, ``training/tasks/<name>.py``, named as its metric spec in ``runlog.tasks.TASKS``
and selected by the data preset's ``task:`` key (``data.task``); the module's ``TASK`` is its class, a
:class:`Task`; the spec's ``data_config`` names the torch-free dataclass ``training/schema.py`` checks the
``data`` keys against. train.py only sees the interface every task shares:

- ``data``: token ids of the splits the loop trains and validates on (``train``, ``valid``, ...);
- ``src_vocab``, ``tgt_vocab``, ``share_embeddings``: what the model is sized and tied by;
- ``checkpoint_state()``: what a checkpoint must hold to rebuild the task on resume;
- ``evaluate(model, split, max_examples, device)``: decoding metrics of ``valid`` or ``test``, keyed as the spec's;
- ``describe(metrics)`` and ``summary_rows(test, max_examples)``: how they are printed (from the spec).
"""

import importlib
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from data.batching import Seq2SeqData
from model.transformer import EncoderDecoder
from runlog.tasks import TASKS, task_spec, write_task
from training.checkpoint import ResumeRefused
from training.schema import RunConfig


def restored_vocabularies(name: str, resume: dict[str, Any] | None) -> tuple[Tokenizer, Tokenizer] | None:
    """The checkpoint's vocabularies on resume (None otherwise).

    Raises:
        ResumeRefused: the checkpoint is of another task.
    """
    if resume is None:
        return None
    if resume["task"] != name:  # runlog.migrate: checkpoints written before tasks existed are G2P
        raise ResumeRefused(
            f"train.resume: the checkpoint is of task {resume['task']!r}, this run of {name!r}; resume with the same data"
        )
    return Tokenizer.from_str(resume["vocab"]["src"]), Tokenizer.from_str(resume["vocab"]["tgt"])


class Task:
    """What every task shares: its spec (``runlog.tasks.TASKS[name]``), decoding settings, vocabulary saving,
    checkpoint entries and printing. A subclass sets ``name``, ``examples``, and in
    ``__init__`` ``src_vocab``, ``tgt_vocab``, ``data`` and ``eval_sets`` (valid and test), and defines ``evaluate``."""

    name: str  # a key of runlog.tasks.TASKS, and this module's name
    examples: str  # what one entry of an eval set is, for the summary (``words``)
    src_vocab: Tokenizer
    tgt_vocab: Tokenizer
    data: dict[str, Seq2SeqData]
    eval_sets: dict[str, Any]  # valid and test: each has ``refs`` (one entry per example) and ``subset(n)``
    share_embeddings = False

    def __init__(self, cfg: RunConfig, run_dir: Path | None) -> None:
        self.spec = TASKS[self.name]
        self.run_dir = run_dir  # None: save nothing (ranks other than 0)
        self.decode = cfg.decode
        self.max_tokens = cfg.trainer.max_tokens

    def _save_vocabularies(self) -> None:
        if self.run_dir is None:
            return
        self.src_vocab.save(str(self.run_dir / "src_vocab.json"))
        self.tgt_vocab.save(str(self.run_dir / "tgt_vocab.json"))

    def checkpoint_state(self) -> dict[str, Any]:
        """``task`` and ``vocab`` entries of a checkpoint (tokenizer JSON strings)."""
        return {"task": self.name, "vocab": {"src": self.src_vocab.to_str(), "tgt": self.tgt_vocab.to_str()}}

    def evaluate(self, model: EncoderDecoder, split: str, max_examples: int | None, device: torch.device) -> dict[str, float]:
        """The spec's metrics (key -> stored value) on at most ``max_examples`` examples of ``split`` (valid or test)."""
        raise NotImplementedError

    def describe(self, metrics: dict[str, float]) -> str:
        """``PER 31.20%, WER 80.50%``."""
        return self.spec.describe(metrics)

    def summary_rows(self, test: dict[str, float], max_examples: int | None) -> list[tuple[str, str]]:
        """(``test PER (N words)``, ``31.20%``), then one row per other metric of the spec."""
        n = len(self.eval_sets["test"].subset(max_examples).refs)
        rows = [(f"test {m.label}", m.shown(test[f"test/{m.key}"])) for m in self.spec.metrics]
        return [(f"{rows[0][0]} ({n} {self.examples})", rows[0][1]), *rows[1:]]


def task_class(name: object) -> type[Task]:
    """The class of the task ``name`` (a ``data.task`` value): ``TASK`` of ``training/tasks/<name>.py``.

    Raises:
        ValueError: no such task; the message names the value and the valid ones.
    """
    return importlib.import_module(f"{__name__}.{task_spec(name).name}").TASK


def build_task(cfg: RunConfig, run_dir: Path | None, resume: dict[str, Any] | None) -> Task:
    """The task ``cfg.data.task``, with its data loaded and vocabularies built (or restored from ``resume``);
    its spec (``task.json``) and vocabularies are written into ``run_dir`` (None: nothing is written).

    Raises:
        ValueError / FileNotFoundError: an unknown task, bad data keys, missing data, a checkpoint of another task.
    """
    cls = task_class(cfg.data.task)
    task = cls(cfg, run_dir, resume)  # refuses a checkpoint of another task before task.json is written
    if run_dir is not None:
        write_task(run_dir, TASKS[cls.name])
    return task
