"""The task of a run: its data and vocabularies, and how its decoded output is scored.

``build_task(cfg, run_dir, resume)`` picks the task from ``data.name``: ``cmudict`` is
grapheme-to-phoneme (PER/WER), any corpus with a ``data.source`` is translation (BLEU/chrF).
train.py only sees the interface both share:

- ``data``: token ids of the splits the loop trains and validates on (``train``, ``valid``, ...);
- ``src_vocab``, ``tgt_vocab``, ``share_embeddings``: what the model is sized and tied by;
- ``checkpoint_state()``: what a checkpoint must hold to rebuild the task on resume;
- ``evaluate(model, split, max_examples, device)``: decoding metrics of ``valid`` or ``test``;
- ``describe(metrics)`` and ``summary_rows(test, max_examples)``: how they are printed.
"""

import functools
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from data.batching import Seq2SeqData
from data.bpe import cached_bpe
from data.cmudict_g2p import load_cmudict
from data.tokenizer import build_vocab, encode_all
from data.translation import load_pairs
from model.transformer import EncoderDecoder
from training.evaluate import G2PEvalSet, TranslationEvalSet, evaluate_g2p, evaluate_translation
from training.schema import RunConfig


def _vocabularies(name: str, resume: dict[str, Any] | None) -> tuple[Tokenizer, Tokenizer] | None:
    """The checkpoint's vocabularies on resume (None otherwise); a checkpoint of another task is an error."""
    if resume is None:
        return None
    if resume.get("task", "g2p") != name:  # checkpoints written before tasks existed are G2P
        raise ValueError(f"train.resume: the checkpoint is of task {resume.get('task', 'g2p')!r}, this run of {name!r}; "
                         "resume with the same data")  # fmt: skip
    return Tokenizer.from_str(resume["vocab"]["src"]), Tokenizer.from_str(resume["vocab"]["tgt"])


class _Task:
    name: str
    src_vocab: Tokenizer
    tgt_vocab: Tokenizer
    share_embeddings = False

    def __init__(self, cfg: RunConfig, run_dir: Path | None) -> None:
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


class G2PTask(_Task):
    """CMUdict grapheme-to-phoneme: letters in, ARPAbet phonemes out; PER and WER (fractions)."""

    name = "g2p"

    def __init__(self, cfg: RunConfig, run_dir: Path | None, resume: dict[str, Any] | None) -> None:
        super().__init__(cfg, run_dir)
        restored = _vocabularies(self.name, resume)
        vocab_json = (restored[0].to_str(), restored[1].to_str()) if restored else None
        self.src_vocab, self.tgt_vocab, self.data, self.eval_sets = _g2p_data(cfg.data.keep_stress, vocab_json)
        self._save_vocabularies()

    def evaluate(self, model: EncoderDecoder, split: str, max_examples: int | None, device: torch.device) -> dict[str, float]:
        """``{"per", "wer"}`` on at most ``max_examples`` distinct words of ``split`` (valid or test)."""
        return evaluate_g2p(model, self.eval_sets[split].subset(max_examples), self.tgt_vocab, self.decode,
                            self.max_tokens, device)  # fmt: skip

    def describe(self, metrics: dict[str, float]) -> str:
        return f"PER {metrics['per']:.2%}, WER {metrics['wer']:.2%}"

    def summary_rows(self, test: dict[str, float], max_examples: int | None) -> list[tuple[str, str]]:
        n = len(self.eval_sets["test"].subset(max_examples).words)
        return [(f"test PER ({n} words)", f"{test['test/per']:.2%}"), ("test WER", f"{test['test/wer']:.2%}")]


@functools.cache
def _g2p_data(keep_stress: bool, vocab_json: tuple[str, str] | None) -> tuple[Tokenizer, Tokenizer, dict, dict]:
    """(src_vocab, tgt_vocab, token ids per split, valid/test eval sets) of CMUdict, built from the training split
    (``vocab_json`` None) or with the given tokenizer JSONs (on resume). Cached per process: the jobs of a sweep
    that share one (Hydra's basic launcher runs them in turn, joblib reuses its workers) skip the ~4.5 s of
    parsing and encoding; the returned objects are only read, never changed."""
    # Whole columns as lists: iterating a datasets Column row by row costs ~1 s per split column.
    splits = {name: split.to_dict() for name, split in load_cmudict(keep_stress=keep_stress).items()}
    if vocab_json:
        src_vocab, tgt_vocab = Tokenizer.from_str(vocab_json[0]), Tokenizer.from_str(vocab_json[1])
    else:
        src_vocab = build_vocab(splits["train"]["word"], unit="char")
        tgt_vocab = build_vocab(splits["train"]["phonemes"], unit="space")
    data = {name: Seq2SeqData(encode_all(src_vocab, split["word"]), encode_all(tgt_vocab, split["phonemes"]))
            for name, split in splits.items()}  # fmt: skip
    eval_sets = {s: G2PEvalSet.build(splits[s]["word"], splits[s]["phonemes"], data[s].src) for s in ("valid", "test")}
    return src_vocab, tgt_vocab, data, eval_sets


class TranslationTask(_Task):
    """Sentence translation with byte-level BPE; sacreBLEU BLEU and chrF (0-100) on detokenized text.

    Training pairs with a side over ``data.max_len`` BPE tokens are dropped (null: the longest the
    model's positions cover); ``valid`` keeps the pairs within it for the loss. BLEU and chrF are
    always on every sentence of valid/test: a source beyond the model's positions is cut to fit.
    """

    name = "translation"

    def __init__(self, cfg: RunConfig, run_dir: Path | None, resume: dict[str, Any] | None) -> None:
        super().__init__(cfg, run_dir)
        dcfg = cfg.data
        longest = cfg.model.max_len - 1  # one position is BOS/EOS
        max_len = longest if dcfg.max_len is None else dcfg.max_len
        if max_len > longest:
            raise ValueError(f"data.max_len={max_len} is invalid; it must be <= model.max_len - 1 = {longest}")
        pairs = load_pairs(dcfg)
        restored = _vocabularies(self.name, resume)
        if restored:
            self.src_vocab, self.tgt_vocab = restored
            where = "from the checkpoint"
        else:
            self.src_vocab, self.tgt_vocab, path = cached_bpe(pairs["train"].src, pairs["train"].tgt, vocab_size=dcfg.vocab_size,
                                                              joint=dcfg.joint_vocab, cache_dir=dcfg.cache_dir)  # fmt: skip
            where = f"cached in {path.parent}"
        self.share_embeddings = self.src_vocab.to_str() == self.tgt_vocab.to_str()
        self._save_vocabularies()
        encoded = {s: Seq2SeqData(encode_all(self.src_vocab, p.src), encode_all(self.tgt_vocab, p.tgt)) for s, p in pairs.items()}
        self.data = {s: _within(encoded[s], max_len) for s in ("train", "valid")}
        if not len(self.data["train"]):
            raise ValueError(f"data.max_len={max_len}: every training pair has a side longer than that; raise it")
        self.eval_sets = {
            s: TranslationEvalSet([ids[:longest] for ids in encoded[s].src], pairs[s].tgt) for s in ("valid", "test")
        }
        kind = "joint" if self.share_embeddings else "separate"
        print(f"normlab: {dcfg.name} {dcfg.src_lang}->{dcfg.tgt_lang}: {len(self.data['train'])} training pairs "
              f"({len(encoded['train']) - len(self.data['train'])} over {max_len} tokens dropped), "
              f"{len(pairs['valid'].src)} valid, {len(pairs['test'].src)} test; {kind} BPE vocabulary of "
              f"{self.tgt_vocab.get_vocab_size()} tokens {where}")  # fmt: skip

    def evaluate(self, model: EncoderDecoder, split: str, max_examples: int | None, device: torch.device) -> dict[str, float]:
        """``{"bleu", "chrf"}`` on at most ``max_examples`` sentences of ``split`` (valid or test)."""
        return evaluate_translation(model, self.eval_sets[split].subset(max_examples), self.tgt_vocab, self.decode,
                                    self.max_tokens, device)  # fmt: skip

    def describe(self, metrics: dict[str, float]) -> str:
        return f"BLEU {metrics['bleu']:.2f}, chrF {metrics['chrf']:.2f}"

    def summary_rows(self, test: dict[str, float], max_examples: int | None) -> list[tuple[str, str]]:
        n = len(self.eval_sets["test"].subset(max_examples).refs)
        return [(f"test BLEU ({n} sentences)", f"{test['test/bleu']:.2f}"), ("test chrF", f"{test['test/chrf']:.2f}")]


def _within(data: Seq2SeqData, max_len: int) -> Seq2SeqData:
    """The pairs of ``data`` whose sides both have at most ``max_len`` tokens."""
    keep = [i for i in range(len(data)) if len(data.src[i]) <= max_len and len(data.tgt[i]) <= max_len]
    return Seq2SeqData([data.src[i] for i in keep], [data.tgt[i] for i in keep])


def build_task(cfg: RunConfig, run_dir: Path | None, resume: dict[str, Any] | None) -> G2PTask | TranslationTask:
    """The task ``cfg.data`` describes, with its data loaded and vocabularies built (or restored
    from ``resume``) and saved into ``run_dir`` (None: not saved).

    Raises:
        ValueError / FileNotFoundError: bad data keys, missing data, a checkpoint of another task.
    """
    if cfg.data.name == "cmudict":
        return G2PTask(cfg, run_dir, resume)
    return TranslationTask(cfg, run_dir, resume)  # data has a translation corpus's keys (training.schema)
