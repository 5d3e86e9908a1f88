"""G2P metrics: phoneme error rate (PER) and word error rate (WER).

Scoring follows Bisani & Ney 2008: a hypothesis is scored against the *closest* reference
pronunciation of its word. PER = sum over words of edit distance to that reference / sum of its
lengths (phonemes); WER = share of words whose hypothesis matches none of the references
exactly. Edit distance is Levenshtein over phoneme symbols, from ``rapidfuzz``.
"""

from collections.abc import Sequence

from rapidfuzz.distance import Levenshtein


def per_wer(hyps: Sequence[Sequence[str]], refs: Sequence[Sequence[Sequence[str]]]) -> tuple[float, float]:
    """PER and WER, both as fractions in [0, inf) and [0, 1].

    Args:
        hyps: one phoneme sequence per word.
        refs: for each word, its reference pronunciations (at least one each).

    Raises:
        ValueError: different numbers of hyps and refs, no words, or a word without references.
    """
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} reference sets")
    if not hyps:
        raise ValueError("no words to score")
    edits = ref_len = wrong = 0
    for hyp, word_refs in zip(hyps, refs, strict=True):
        if not word_refs:
            raise ValueError("a word has no reference pronunciation")
        dist, ref = min((Levenshtein.distance(hyp, r), len(r)) for r in word_refs)
        edits += dist
        ref_len += ref
        wrong += dist > 0
    return edits / ref_len, wrong / len(hyps)
