"""Each claim's verdict, computed from the committed CSVs its claims file names (:mod:`analysis.claims`).

Per claim: the contrast's per-pair differences over the file's ``seeds`` (arm minus baseline, paired by ``pair_by``;
minus a second such difference for a difference of differences), their mean, the plain t interval at 1 - alpha (n - 1
degrees of freedom, :func:`analysis.paired.of_differences`), and the interval corrected for the claim's family (the claims
of the file sharing its ``family``, m of them) by Holm's step-down: the family's two-sided paired-t p-values sorted,
the k-th tested at alpha / (m - k + 1) until the first that is not rejected; it and every later one are held at that
stopping level, so the corrected interval (at 1 - its level) excludes 0 exactly when Holm rejects. A claim with no
p-value (not learned, not yet run, judged, too few pairs, zero spread) counts in m and is ranked last.

Verdict, from the corrected interval: ``reproduced`` (it excludes 0 on the claimed side), ``contradicted`` (on the
other side), ``no difference detected`` (it covers 0); for ``direction: none`` (a control): ``no difference
detected`` or ``difference detected``. Before any comparison: an unfinished row of either side (its ``learned``
false, its ``state`` not ``finished`` or its ``diverged`` true: :mod:`analysis.selection`) makes the verdict ``not
learned: <which rows>`` (unless the claim is ``about_failure``); a claims file written before the runs whose rows are
not there yet gives ``not yet run: <which>``; a ``judged`` claim gives ``not computed: <how it is judged>``.
"""

import math
from dataclasses import dataclass
from pathlib import Path

from scipy import stats as scipy_stats

from analysis.claims import Claim, ClaimsError, ClaimsFile
from analysis.paired import of_differences
from analysis.selection import Absent, Measure, SelectionError, Tables, Unfinished, differences

VERDICTS = ("reproduced", "contradicted", "no difference detected", "difference detected")


@dataclass(frozen=True)
class Verdict:
    """A claim's computed verdict.

    Attributes:
        claim: the claim judged.
        word: one of ``VERDICTS``, or a sentence starting ``not learned:``, ``not yet run:``, ``not computed:``,
            ``too few pairs`` or ``zero spread``.
        n: the number of pairs (0 when none was compared).
        m: the size of the claim's family.
        mean: the mean difference (arm minus baseline, the metric's units); None without pairs.
        plain: the uncorrected 1 - alpha t interval; None without one.
        corrected: the Holm-corrected interval, at confidence 1 - ``level``; None without one.
        level: the Holm level of ``corrected``; None without a p-value.
        p: the two-sided paired-t p-value; None without one.
    """

    claim: Claim
    word: str
    n: int = 0
    m: int = 0
    mean: float | None = None
    plain: tuple[float, float] | None = None
    corrected: tuple[float, float] | None = None
    level: float | None = None
    p: float | None = None


def judge(claims: ClaimsFile, root: Path) -> list[Verdict]:
    """The verdict of every claim of ``claims``, in its order; CSV paths are under ``root`` (docs/results/).

    Raises:
        ClaimsError: a CSV or column that does not exist, a selector matching no row or more than one for a pair, a seed
            missing from a side, a metric value that is not a finite number (in a file written after the runs; in a
            file written before them a missing CSV, selector match or seed is ``not yet run`` instead).
    """
    tables = Tables(root)
    firsts = [_first(claim, claims, tables) for claim in claims.claims]
    holm: dict[object, float] = {}
    for family in dict.fromkeys(c.family for c in claims.claims):
        members = [i for i, c in enumerate(claims.claims) if c.family == family]
        holm |= holm_levels({i: firsts[i][0].p for i in members}, claims.alpha)
    return [_final(v, values, holm[i]) for i, (v, values) in enumerate(firsts)]  # every claim is in a family


def holm_levels(pvalues: dict[object, float | None], alpha: float) -> dict[object, float]:
    """key -> the level Holm's step-down tests it at, over the family ``pvalues`` (None: no p-value, ranked last).
    The k-th smallest (k from 1) is at alpha / (m - k + 1) until the first not rejected; it and all after it get
    that stopping level. Example: p = 0.01, 0.02, 0.04 at alpha 0.05: 0.01 <= 0.05/3 and 0.02 <= 0.05/2 are
    rejected, 0.04 <= 0.05 too: levels 0.0167, 0.025, 0.05; p = 0.01, 0.04, 0.03: 0.03 > 0.025 stops, so 0.03
    and 0.04 are both held at 0.025."""
    ranked = {key: math.inf if p is None else p for key, p in pvalues.items()}
    order = sorted(pvalues, key=ranked.__getitem__)
    m, levels, stop = len(order), {}, None
    for k, key in enumerate(order):
        level = alpha / (m - k) if stop is None else stop
        p = pvalues[key]
        if stop is None and (p is None or p > level):
            stop = level
        levels[key] = level
    return levels


def _first(claim: Claim, claims: ClaimsFile, tables: Tables) -> tuple[Verdict, list[float]]:
    """The claim's verdict before Holm (``p`` set when it can be tested), with its per-pair differences."""
    m = claims.family_size(claim.family)
    if claim.judged is not None:
        return Verdict(claim, f"not computed: {claim.judged}", m=m), []
    here = f"{claims.path}: claim {claim.id!r}"
    # a measured claim has them all (load_claims)
    assert claim.csv is not None and claim.metric is not None and claim.pair_by is not None and claim.contrast is not None
    measure = Measure(claim.csv, claim.metric, claim.pair_by)
    unfinished = "keep" if claim.about_failure else "flag"
    try:
        diffs = differences(claim.contrast, claim.minus, measure, tables, here, claims.seeds, unfinished)
    except Absent as err:
        if not claims.before:
            raise ClaimsError(str(err)) from None
        return Verdict(claim, f"not yet run: {err.what}", m=m), []
    except Unfinished as err:
        return Verdict(claim, f"not learned: {err}", m=m), []
    except SelectionError as err:
        raise ClaimsError(str(err)) from None
    values = [diffs[k] for k in sorted(diffs, key=str)]
    diff = of_differences(values, 1 - claims.alpha)
    if diff.n < 2 or diff.degenerate:
        word = "too few pairs" if diff.n < 2 else "zero spread: every pair differs by the same amount"
        return Verdict(claim, word, n=diff.n, m=m, mean=diff.mean), values
    p = float(scipy_stats.ttest_1samp(values, 0.0).pvalue)
    return Verdict(claim, "", n=diff.n, m=m, mean=diff.mean, plain=diff.ci95, p=p), values


def _final(first: Verdict, values: list[float], level: float) -> Verdict:
    """``first`` with its Holm-corrected interval (the t interval at 1 - ``level``) and the verdict it gives."""
    if first.p is None:
        return first
    corrected = of_differences(values, 1 - level).ci95
    assert corrected is not None  # a tested claim has two or more pairs that differ (_first)
    return Verdict(
        first.claim,
        verdict_word(corrected, first.claim.direction),
        first.n,
        first.m,
        first.mean,
        first.plain,
        corrected,
        level,
        first.p,
    )


def verdict_word(interval: tuple[float, float], direction: str) -> str:
    """The verdict of a corrected ``interval`` for a claim of ``direction`` (module docstring)."""
    lo, hi = interval
    if lo <= 0.0 <= hi:
        return "no difference detected"
    if direction == "none":
        return "difference detected"
    return "reproduced" if (hi < 0.0) == (direction == "lower") else "contradicted"
