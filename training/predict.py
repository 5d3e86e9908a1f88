"""Spelling words with a trained run (``python -m scripts.predict``): load a checkpoint, check and prepare the input
lines as the run's task does, decode them as the run's config says."""

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from data.tokenizer import UNK, detokenize, encode_all
from model.transformer import EncoderDecoder
from runlog.status import LAST_STEP_TESTED
from runlog.tasks import TaskSpec, read_task
from training.checkpoint import LATEST, load_checkpoint, model_from
from training.evaluate import DecodeConfig, decode_all


def checkpoint_path(path: str) -> Path:
    """The checkpoint file of ``path``: ``path/checkpoint.pt`` for a run directory, else ``path`` itself."""
    return Path(path) / LATEST if Path(path).is_dir() else Path(path)


def from_checkpoint(ckpt: dict, path: Path, device: torch.device) -> tuple[EncoderDecoder, Tokenizer, Tokenizer, TaskSpec]:
    """(model in eval mode, src vocabulary, tgt vocabulary, task spec) from the checkpoint ``ckpt`` loaded from ``path``.

    Raises:
        ValueError: the run dir's task.json is not a spec.
    """
    model = model_from(ckpt)
    src, tgt = (Tokenizer.from_str(ckpt["vocab"][k]) for k in ("src", "tgt"))
    return model.to(device).eval(), src, tgt, read_task(path.parent, named=ckpt.get("task"))


def load_model(path: str, device: torch.device) -> tuple[EncoderDecoder, Tokenizer, Tokenizer, TaskSpec]:
    """(model in eval mode, src vocabulary, tgt vocabulary, task spec) from a normlab checkpoint or run directory."""
    file = checkpoint_path(path)
    return from_checkpoint(load_checkpoint(file), file, device)


def describe(ckpt: dict[str, Any], path: Path, task: TaskSpec) -> str:
    """One line: the checkpoint file (an average: of which steps), its step, and the run's test metrics from the
    ``status.json`` next to it (as ``task`` shows them), e.g. ``predict: run/checkpoint.pt at step 20 of 20; test PER
    31.20%, WER 80.50%``; when the test scored other weights than the last step's, which (status.json's ``tested``)."""
    status_file = path.parent / "status.json"
    status = json.loads(status_file.read_text(encoding="utf-8")) if status_file.is_file() else {}
    of = f" of {status['max_steps']}" if status.get("max_steps") else ""
    test = {k: v for k, v in (status.get("test") or {}).items() if isinstance(v, float)}
    metrics = task.describe(test, prefix="test/")
    at = f" (the run's, at step {status['step']})" if status.get("step") not in (None, ckpt["step"]) else ""
    scored = status.get("tested")
    of_weights = f" (tested: {scored})" if scored not in (None, LAST_STEP_TESTED, ckpt.get("average")) else ""
    tested = f"test {metrics}{at}{of_weights}" if metrics else "no test metrics in status.json"
    average = f" ({ckpt['average']})" if "average" in ckpt else ""
    return f"predict: {path}{average} at step {ckpt['step']}{of}; {tested}"


def prepared(lines: list[str], task: TaskSpec) -> list[str]:
    """The lines as the model reads them: stripped and lower- or upper-cased as ``task.input_case`` says (G2P: lower,
    as CMUdict's words), or as given."""
    if task.input_case is None:
        return lines
    return [line.strip().lower() if task.input_case == "lower" else line.strip().upper() for line in lines]


def input_notes(lines: list[str], src: Tokenizer, task: TaskSpec, max_len: int) -> list[str]:
    """One line per input line the model cannot read in full: the characters not in the source vocabulary (read as
    ``<unk>``), and the text cut off beyond ``max_len - 1`` tokens; [] when every line is read in full."""
    notes, texts = [], prepared(lines, task)
    encoded = src.encode_batch(texts, add_special_tokens=False)
    for i, (line, text, enc) in enumerate(zip(lines, texts, encoded, strict=True)):
        unknown = dict.fromkeys(text[a:b] for tok, (a, b) in zip(enc.tokens, enc.offsets, strict=True) if tok == UNK)
        if unknown:
            shown = " ".join(repr(c) for c in unknown)
            notes.append(f"predict: line {i + 1} {line!r}: not in the vocabulary, read as {UNK}: {shown}")
        if len(enc.ids) > max_len - 1:
            cut = text[enc.offsets[max_len - 1][0] :]
            notes.append(f"predict: line {i + 1}: longer than {max_len - 1} tokens (model.max_len - 1); dropped: {cut!r}")
    return notes


def predict(
    lines: list[str],
    model: EncoderDecoder,
    src: Tokenizer,
    tgt: Tokenizer,
    task: TaskSpec,
    dcfg: DecodeConfig,
    max_tokens: int,
    device: torch.device,
) -> list[str]:
    """One output string per input line (an empty line gives an empty output)."""
    ids = [x[: model.cfg.max_len - 1] for x in encode_all(src, prepared(lines, task))]
    todo = [i for i, x in enumerate(ids) if x]
    hyps = decode_all(model, [ids[i] for i in todo], dcfg, max_tokens, device)
    out = [""] * len(lines)
    for i, hyp in zip(todo, hyps, strict=True):
        out[i] = detokenize(tgt, hyp)
    return out


def read_input(path: Path) -> str:
    """The text of the input file ``path``.

    Raises:
        ValueError: ``path`` is a directory or cannot be read (the message names it and says what INPUT takes).
    """
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise  # its message names the file
    except OSError as e:
        raise ValueError(
            f"input {str(path)!r}: {e.strerror or e}; INPUT is a text file, one sentence (or word) per line, or - for stdin"
        ) from None
