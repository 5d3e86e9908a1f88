"""Byte-level BPE vocabularies for translation, trained with ``tokenizers`` and cached by fingerprint.

The model is BPE (Sennrich et al. 2016) over bytes, as in GPT-2 (Radford et al. 2019): text is
split at spaces and punctuation, each piece mapped to its UTF-8 bytes, and merges are learned
over those. All 256 bytes are in the vocabulary, so a character never seen in training (an
umlaut in an English-only corpus) is spelled by its bytes and comes back intact; nothing is
dropped and ``<unk>`` is never produced. Decoding is exact: ``decode(encode(s)) == s``.

The specials keep normlab's ids (pad=0, bos=1, eos=2, unk=3; ``data.tokenizer``). Trained
vocabularies are cached under ``cache_dir`` by a fingerprint of the training text and the
settings, so the runs of a sweep train them once.
"""

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK, UNK_ID
from runlog.atomic import atomic_write

FORMAT = "normlab-bpe-v1"  # bump when train_bpe changes, so old cache entries are not reused
MIN_VOCAB = len(SPECIALS) + 256  # specials + the byte alphabet


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer of (at most) ``vocab_size`` tokens trained on ``texts``.

    Raises:
        ValueError: ``vocab_size`` below ``MIN_VOCAB`` (the specials and the 256 bytes).
    """
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
        raise ValueError(
            f"data.vocab_size={vocab_size!r} is invalid; it must be an integer >= {MIN_VOCAB} (4 special tokens + 256 bytes)"
        )
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    assert [tok.token_to_id(s) for s in SPECIALS] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    return tok


def fingerprint(sides: Sequence[Sequence[str]], settings: dict) -> str:
    """SHA-256 (hex, 16 chars) of the texts and the settings that shape the vocabulary."""
    h = hashlib.sha256(json.dumps({**settings, "format": FORMAT, "tokenizers": tokenizers.__version__}, sort_keys=True).encode())
    for side in sides:
        h.update(b"\x01")  # side separator: (["a"], ["b"]) and (["a", "b"], []) differ
        for text in side:
            h.update(text.encode("utf-8"))
            h.update(b"\x00")
    return h.hexdigest()[:16]


def _save_atomic(tok: Tokenizer, path: Path) -> None:
    # Runs of a sweep may train the same vocabulary at once: a reader never sees half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(tok.to_str(pretty=True).encode("utf-8")))


def cached_bpe(
    src: Sequence[str], tgt: Sequence[str], *, vocab_size: int, joint: bool, cache_dir: str | Path
) -> tuple[Tokenizer, Tokenizer, Path]:
    """Source and target tokenizers for the training pairs ``(src, tgt)``, from the cache or trained.

    Args:
        src, tgt: training sentences of each side.
        vocab_size: tokens per vocabulary (the joint one, or each of the two).
        joint: one vocabulary over both sides (returned twice), else one per side.
        cache_dir: where ``{fingerprint}.{joint|src|tgt}.json`` files live.

    Returns:
        (src tokenizer, tgt tokenizer, the cache file of the source one).
    """
    key = fingerprint([src, tgt], {"vocab_size": vocab_size, "joint": joint})
    cache_dir = Path(cache_dir).expanduser()
    jobs = {"joint": [*src, *tgt]} if joint else {"src": src, "tgt": tgt}
    toks = {}
    for name, texts in jobs.items():
        path = cache_dir / f"{key}.{name}.json"
        if path.is_file():
            toks[name] = Tokenizer.from_file(str(path))
        else:
            toks[name] = train_bpe(texts, vocab_size)
            _save_atomic(toks[name], path)
    if joint:
        return toks["joint"], toks["joint"], cache_dir / f"{key}.joint.json"
    return toks["src"], toks["tgt"], cache_dir / f"{key}.src.json"
