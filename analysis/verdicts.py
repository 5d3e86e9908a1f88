"""Each claim's verdict, computed from the committed CSVs its claims file names (:mod:`analysis.claims`).

Per claim: the contrast's per-pair differences over the file's ``seeds`` (arm minus baseline, paired by ``pair_by``;
minus a second such difference for a difference of differences), their mean, the plain t interval at 1 - alpha (n - 1
degrees of freedom, :func:`analysis.stats.t_interval`), and the interval corrected for the claim's family (the claims
of the file sharing its ``family``, m of them) by Holm's step-down: the family's two-sided paired-t p-values sorted,
the k-th tested at alpha / (m - k + 1) until the first that is not rejected; it and every later one are held at that
stopping level, so the corrected interval (at 1 - its level) excludes 0 exactly when Holm rejects. A claim with no
p-value (not learned, not yet run, judged, too few pairs, zero spread) counts in m and is ranked last.

Verdict, from the corrected interval: ``reproduced`` (it excludes 0 on the claimed side), ``contradicted`` (on the
other side), ``no difference detected`` (it covers 0); for ``direction: none`` (a control): ``no difference
detected`` or ``difference detected``. Before any comparison: a row of either side whose ``learned`` is false, whose
``state`` is not ``finished`` or whose ``diverged`` is true makes the verdict ``not learned: <which rows>`` (unless
the claim is ``about_failure``); a claims file written before the runs whose rows are not there yet gives
``not yet run: <which>``; a ``judged`` claim gives ``not computed: <how it is judged>``.
"""

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from scipy import stats as scipy_stats

from analysis.claims import Claim, ClaimsError, ClaimsFile, Contrast, Side
from analysis.stats import t_interval, zero_spread

VERDICTS = ("reproduced", "contradicted", "no difference detected", "difference detected")
FAILED = (("learned", "false"), ("state", None), ("diverged", "true"))  # (column, its failing value; None: not finished)


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


class NotRun(Exception):
    """A side's rows are not there (yet): the message says which."""


def judge(claims: ClaimsFile, root: Path) -> list[Verdict]:
    """The verdict of every claim of ``claims``, in its order; CSV paths are under ``root`` (docs/results/).

    Raises:
        ClaimsError: a CSV or column that does not exist, a selector matching no row or more than one for a pair, a seed
            missing from a side, a metric value that is not a finite number (in a file written after the runs; in a
            file written before them a missing CSV, selector match or seed is ``not yet run`` instead).
    """
    tables: dict[str, list[dict[str, str]]] = {}
    firsts = [_first(claim, claims, root, tables) for claim in claims.claims]
    holm = {}
    for family in dict.fromkeys(c.family for c in claims.claims):
        members = [i for i, c in enumerate(claims.claims) if c.family == family]
        holm |= holm_levels({i: firsts[i][0].p for i in members}, claims.alpha)
    return [_final(v, values, holm.get(i)) for i, (v, values) in enumerate(firsts)]


def holm_levels(pvalues: dict[object, float | None], alpha: float) -> dict[object, float]:
    """key -> the level Holm's step-down tests it at, over the family ``pvalues`` (None: no p-value, ranked last).
    The k-th smallest (k from 1) is at alpha / (m - k + 1) until the first not rejected; it and all after it get
    that stopping level. Example: p = 0.01, 0.02, 0.04 at alpha 0.05: 0.01 <= 0.05/3 and 0.02 <= 0.05/2 are
    rejected, 0.04 <= 0.05 too: levels 0.0167, 0.025, 0.05; p = 0.01, 0.04, 0.03: 0.03 > 0.025 stops, so 0.03
    and 0.04 are both held at 0.025."""
    order = sorted(pvalues, key=lambda k: math.inf if pvalues[k] is None else pvalues[k])
    m, levels, stop = len(order), {}, None
    for k, key in enumerate(order):
        level = alpha / (m - k) if stop is None else stop
        p = pvalues[key]
        if stop is None and (p is None or p > level):
            stop = level
        levels[key] = level
    return levels


def _first(claim: Claim, claims: ClaimsFile, root: Path, tables: dict) -> tuple[Verdict, list[float]]:
    """The claim's verdict before Holm (``p`` set when it can be tested), with its per-pair differences."""
    m = claims.family_size(claim.family)
    if claim.judged is not None:
        return Verdict(claim, f"not computed: {claim.judged}", m=m), []
    try:
        diffs = _contrast(claim, claim.contrast, claims, root, tables)
        if claim.minus is not None:
            minus = _contrast(claim, claim.minus, claims, root, tables)
            diffs = {k: d - minus[k] for k, d in diffs.items()}
    except NotRun as err:
        return Verdict(claim, f"not yet run: {err}", m=m), []
    except _Failed as err:
        return Verdict(claim, f"not learned: {err}", m=m), []
    values = [diffs[k] for k in sorted(diffs, key=str)]
    mean, plain = statistics.fmean(values), t_interval(values, 1 - claims.alpha)
    if len(values) < 2 or zero_spread(values):
        word = "too few pairs" if len(values) < 2 else "zero spread: every pair differs by the same amount"
        return Verdict(claim, word, n=len(values), m=m, mean=mean), values
    p = float(scipy_stats.ttest_1samp(values, 0.0).pvalue)
    return Verdict(claim, "", n=len(values), m=m, mean=mean, plain=plain, p=p), values


def _final(first: Verdict, values: list[float], level: float | None) -> Verdict:
    """``first`` with its Holm-corrected interval (the t interval at 1 - ``level``) and the verdict it gives."""
    if first.p is None:
        return first
    corrected = t_interval(values, 1 - level)
    return Verdict(first.claim, verdict_word(corrected, first.claim.direction), first.n, first.m, first.mean,
                   first.plain, corrected, level, first.p)  # fmt: skip


def verdict_word(interval: tuple[float, float], direction: str) -> str:
    """The verdict of a corrected ``interval`` for a claim of ``direction`` (module docstring)."""
    lo, hi = interval
    if lo <= 0.0 <= hi:
        return "no difference detected"
    if direction == "none":
        return "difference detected"
    return "reproduced" if (hi < 0.0) == (direction == "lower") else "contradicted"


class _Failed(Exception):
    """A side has a row that did not learn or finish: the message says which."""


def _contrast(claim: Claim, contrast: Contrast, claims: ClaimsFile, root: Path, tables: dict) -> dict[str, float]:
    arm = _values(claim, contrast.arm, claims, root, tables)
    if contrast.baseline is None:
        return {k: v - contrast.against for k, v in arm.items()}
    base = _values(claim, contrast.baseline, claims, root, tables)
    return {k: arm[k] - base[k] for k in arm}


def _values(claim: Claim, side: Side, claims: ClaimsFile, root: Path, tables: dict) -> dict[str, float]:
    """pair -> the metric of ``side``'s row for it, for every seed of the file."""
    here = f"{claims.path}: claim {claim.id!r}"
    rows = _rows(side, claims, root, tables, here)
    columns = set(rows[0]) if rows else set()
    for column in [claim.pair_by, claim.metric, *(k for k, _ in side.where)]:
        if rows and column not in columns:
            raise ClaimsError(f"{here}: {side.csv} has no column {column!r}; valid: {', '.join(rows[0])}")
    chosen = [r for r in rows if all(_equal(r[k], v) for k, v in side.where)]
    if not chosen and rows and not claims.before:
        valid = "; ".join(f"{k}: {', '.join(sorted({r[k] for r in rows}))}" for k, _ in side.where)
        raise ClaimsError(f"{here}: {side.label(claim.csv)} matches no row of {side.csv}; valid values there: {valid}")
    by_pair: dict[str, dict[str, str]] = {}
    for row in chosen:
        if row[claim.pair_by] in by_pair:
            raise ClaimsError(f"{here}: {side.label(claim.csv)} matches more than one row of {side.csv} with "
                              f"{claim.pair_by}={row[claim.pair_by]}; valid: a selector naming one row per pair")  # fmt: skip
        by_pair[row[claim.pair_by]] = row
    missing = [s for s in claims.seeds if str(s) not in by_pair]
    if missing:
        which = " ".join(f"{k}={v}" for k, v in side.where)
        text = f"no row of {side.csv} with {which} and {claim.pair_by} {', '.join(map(str, missing))}"
        if claims.before:
            raise NotRun(text)
        raise ClaimsError(f"{here}: {text}; valid {claim.pair_by} values there: {', '.join(sorted(by_pair)) or 'none'}")
    picked = {str(s): by_pair[str(s)] for s in claims.seeds}
    if not claim.about_failure:
        failed = [f"{side.label(claim.csv)} {claim.pair_by}={k} ({c}={r[c]})" for k, r in picked.items()
                  for c, bad in FAILED if c in r and _failed(r[c], bad)]  # fmt: skip
        if failed:
            raise _Failed("; ".join(failed))
    return {k: _number(r[claim.metric], here, f"{side.label(claim.csv)} {claim.pair_by}={k}") for k, r in picked.items()}


def _rows(side: Side, claims: ClaimsFile, root: Path, tables: dict, here: str) -> list[dict[str, str]]:
    if side.csv not in tables:
        path = root / side.csv
        if not path.is_file():
            if claims.before:
                raise NotRun(f"{side.csv} does not exist")
            raise ClaimsError(f"{here}: no CSV {side.csv} under {root}; valid: a path under docs/results/")
        with path.open(newline="", encoding="utf-8") as f:
            tables[side.csv] = list(csv.DictReader(f))
    return tables[side.csv]


def _equal(cell: str, value: object) -> bool:
    """Whether a CSV ``cell`` is the selector's ``value`` (numbers as numbers, booleans in any case)."""
    if isinstance(value, bool):
        return cell.lower() == str(value).lower()
    if value is None:
        return cell in ("", "None")
    if isinstance(value, int | float):
        try:
            return float(cell) == float(value)
        except ValueError:
            return False
    return cell == str(value)


def _failed(cell: str, bad: str | None) -> bool:
    return cell != "finished" if bad is None else cell.lower() == bad


def _number(cell: str, here: str, which: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ClaimsError(f"{here}: {which} has metric value {cell!r}; valid: a finite number")
    return value
