"""Decoding metrics: PER/WER for G2P, sacreBLEU BLEU and chrF for translation.

Scoring follows Bisani & Ney 2008: a hypothesis is scored against the *closest* reference
pronunciation of its word. PER = sum over words of edit distance to that reference / sum of its
lengths (phonemes); WER = share of words whose hypothesis matches none of the references
exactly. Edit distance is Levenshtein over phoneme symbols, from ``rapidfuzz``.

Translation is scored on detokenized text with ``sacrebleu``'s defaults (Post 2018): corpus
BLEU (Papineni et al. 2002) with its 13a tokenizer, mixed case, exponential smoothing, and chrF
(Popovic 2015, character 6-grams, beta 2), both on a 0-100 scale.
"""

from collections.abc import Sequence

import sacrebleu
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


def bleu_chrf(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, float]:
    """``{"bleu": ..., "chrf": ...}`` (0-100) of detokenized hypotheses against one reference each.

    Raises:
        ValueError: different numbers of hypotheses and references, or none.
    """
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise ValueError("no sentences to score")
    return {"bleu": sacrebleu.corpus_bleu(hyps, [refs]).score, "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score}
