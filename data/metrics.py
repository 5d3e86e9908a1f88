"""Decoding metrics: PER/WER for G2P, sacreBLEU BLEU and chrF for translation.

Scoring follows Bisani & Ney 2008 and their scorer, Sequitur G2P's ``Evaluator`` (``g2p.py
--test``; ``Evaluation.py`` in github.com/sequitur-g2p/sequitur-g2p): a hypothesis is scored
against the *closest* reference pronunciation of its word, the one with the fewest errors;
among equally close references, the one that sorts first (Python order of its tuple of phoneme
symbols), since Sequitur sorts (errors, reference, alignment) and takes the first. PER = sum
over words of edit distance to that reference / sum of its lengths (phonemes); WER = share of
words whose hypothesis matches none of the references exactly. Edit distance is Levenshtein
over phoneme symbols (unit costs, as Sequitur's ``align``), from ``rapidfuzz``.

Single-reference scores (``first_only=True``) count the same errors against each word's *first* reference
only: for CMUdict its primary entry (``word``, not ``word(2)``...), which the data keeps first
(``data.cmudict_g2p.load_cmudict``). A word whose hypothesis spells a variant is then wrong, so single-reference
WER is never below the closest-reference one (PER can be, by a hair: its denominator is the first references'
lengths); published G2P results differ in which they report.

Translation is scored on detokenized text with ``sacrebleu``'s defaults (Post 2018): corpus
BLEU (Papineni et al. 2002) with its 13a tokenizer, mixed case, exponential smoothing, and chrF
(Popovic 2015, character 6-grams, beta 2), both on a 0-100 scale.
"""

from collections.abc import Sequence

import sacrebleu
from rapidfuzz.distance import Levenshtein


def per_wer(
    hyps: Sequence[Sequence[str]], refs: Sequence[Sequence[Sequence[str]]], first_only: bool = False
) -> tuple[float, float]:
    """PER and WER, both as fractions in [0, inf) and [0, 1], against each word's closest reference (``first_only``:
    against its first reference alone).

    Among equally close references the one that sorts first counts (Sequitur G2P's rule, see the
    module docstring): a hypothesis "D AO G Z" against "D AO G" and "D AA G Z" (1 edit each)
    counts 1 error in 4 phonemes, whatever order the references come in.

    Args:
        hyps: one phoneme sequence per word.
        refs: for each word, its reference pronunciations (at least one each), the primary one first.
        first_only: score against ``refs[i][0]`` only (single-reference PER/WER, module docstring).

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
        # The tie-break on the reference itself (not its length) is Sequitur's: see the module docstring.
        dist, ref = min((Levenshtein.distance(hyp, r), tuple(r)) for r in (word_refs[:1] if first_only else word_refs))
        edits += dist
        ref_len += len(ref)
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
