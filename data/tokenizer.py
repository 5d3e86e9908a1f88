"""Vocabularies built with Hugging Face ``tokenizers`` and saved as tokenizer JSON with the run.

Both vocabularies share the special tokens and their ids: pad=0, bos=1, eos=2, unk=3, so one
``pad_id`` serves src and tgt. A symbol never seen in training maps to ``<unk>``, never vanishes.
"""

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


def build_vocab(texts: Iterable[str], *, unit: str) -> Tokenizer:
    """Train a word-level vocabulary over ``texts``.

    Args:
        texts: training strings.
        unit: ``char`` (every character is a token: letters of a word) or ``space``
            (whitespace-separated symbols: ARPAbet phonemes).

    Raises:
        ValueError: unknown unit (valid: char, space).
    """
    if unit == "char":
        pre: pre_tokenizers.PreTokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
        decoder = decoders.Fuse()
    elif unit == "space":
        pre = pre_tokenizers.WhitespaceSplit()
        decoder = None  # the default decoder joins tokens with spaces
    else:
        raise ValueError(f"unknown vocabulary unit {unit!r}; valid: char, space")
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre
    if decoder is not None:
        tok.decoder = decoder
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=list(SPECIALS), min_frequency=1))
    assert [tok.token_to_id(s) for s in SPECIALS] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    return tok


def encode_all(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (batching adds BOS/EOS)."""
    return [enc.ids for enc in tok.encode_batch(texts, add_special_tokens=False)]


def detokenize(tok: Tokenizer, ids: list[int]) -> str:
    """Text of generated ids: pad/bos/eos removed, ``<unk>`` kept visible (``decode`` with
    ``skip_special_tokens=True`` would drop it, and with it the sign that something was lost)."""
    return tok.decode([i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)], skip_special_tokens=False)
