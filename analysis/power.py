"""How many seeds a paired comparison needs: the power of the paired two-sided t test, and the sample size that
reaches a target power, from a pilot's per-seed differences.

The power of the two-sided one-sample (paired) t test at level ``alpha`` with ``n`` pairs, true mean difference
``delta`` and true sd of the differences ``sd`` is P(|T| > t(1 − alpha/2, n − 1)) with T noncentral t, n − 1 degrees
of freedom and noncentrality delta · √n / sd (Cohen 1988, "Statistical Power Analysis for the Behavioral Sciences",
ch. 2; scipy.stats.nct). A pilot's sd is itself uncertain (3 seeds: 2 degrees of freedom), so it is replaced by its
one-sided upper confidence limit sd · √(df / χ²(1 − level, df)) (Browne 1995, "On the use of a pilot sample for sample
size determination", Statistics in Medicine 14(17): the 80 % limit gives the planned power with probability >= 0.8).
"""

import math
import statistics
from collections.abc import Sequence

from scipy import stats


def paired_t_power(delta: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The probability that the two-sided paired t test at level ``alpha`` rejects "no difference" with ``n`` pairs
    when the differences have mean ``delta`` and standard deviation ``sd`` (same units as delta), in [alpha, 1].

    Raises:
        ValueError: n < 2, sd <= 0 or alpha outside (0, 1).
    """
    if n < 2 or sd <= 0 or not 0 < alpha < 1:
        raise ValueError(f"paired_t_power needs n >= 2, sd > 0 and 0 < alpha < 1; got n={n}, sd={sd}, alpha={alpha}")
    df, nc = n - 1, delta * math.sqrt(n) / sd
    t = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(t, df, nc) + stats.nct.cdf(-t, df, nc))


def pairs_needed(delta: float, sd: float, power: float = 0.8, alpha: float = 0.05, most: int = 10_000) -> int:
    """The smallest n >= 2 at which :func:`paired_t_power` reaches ``power``.

    Raises:
        ValueError: delta == 0 (no n detects it), power outside (alpha, 1), or no n up to ``most`` is enough.
    """
    if delta == 0 or not alpha < power < 1:
        raise ValueError(f"pairs_needed needs delta != 0 and alpha < power < 1; got delta={delta}, power={power}")
    for n in range(2, most + 1):
        if paired_t_power(delta, sd, n, alpha) >= power:
            return n
    raise ValueError(f"no n <= {most} reaches power {power} for delta={delta}, sd={sd}")


def sd_upper_limit(sd: float, df: int, level: float = 0.8) -> float:
    """The one-sided ``level`` upper confidence limit of a normal sample's sd from its estimate ``sd`` with ``df``
    degrees of freedom: sd · √(df / χ²(1 − level, df)) (Browne 1995).

    Raises:
        ValueError: df < 1 or level outside (0, 1).
    """
    if df < 1 or not 0 < level < 1:
        raise ValueError(f"sd_upper_limit needs df >= 1 and 0 < level < 1; got df={df}, level={level}")
    return sd * math.sqrt(df / stats.chi2.ppf(1 - level, df))


def plan(differences: Sequence[float], power: float = 0.8, alpha: float = 0.05, level: float = 0.8) -> dict[str, float]:
    """The seed plan from a pilot's per-seed differences (>= 2): their mean and sd, the sd's upper limit at
    ``level``, and the pairs needed for ``power`` at the pilot's mean difference with the sd as estimated
    (``n_point``) and at its upper limit (``n_upper``).

    Raises:
        ValueError: fewer than two differences, or all equal (no sd to plan from).
    """
    if len(differences) < 2 or statistics.stdev(differences) == 0:
        raise ValueError(f"a seed plan needs at least two differences that are not all equal; got {list(differences)}")
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    upper = sd_upper_limit(sd, len(differences) - 1, level)
    return {
        "mean": mean,
        "sd": sd,
        "sd_upper": upper,
        "n_point": pairs_needed(mean, sd, power, alpha),
        "n_upper": pairs_needed(mean, upper, power, alpha),
    }
