"""Parameter counts of a group of runs (a variant, an LR family) and their ratio to a baseline's, so that a difference
in a metric is read beside the parameters that may buy it (hyper-connections add ~27 % at the LR-sensitivity size).

Counts are status.json's ``params`` record (``analysis.runs.Run.params``); runs written before it have none, and
every value here is then None (an empty cell), never an error.
"""

from collections.abc import Sequence

from analysis.runs import Run


def shared_count(runs: Sequence[Run], hc: bool = False) -> int | None:
    """The parameter count the runs recorded (``Run.params``; with ``hc`` ``Run.hc_params``), when every run that
    recorded one agrees; None when none did (runs written before the record) or when they disagree. Runs that
    differ only in the seed build the same model, so they agree."""
    values = {r.hc_params if hc else r.params for r in runs} - {None}
    return values.pop() if len(values) == 1 else None


def params_ratio(runs: Sequence[Run], baseline: Sequence[Run]) -> float | None:
    """``shared_count(runs) / shared_count(baseline)``: 1.266 for mHC (597,414) over pre-LN (471,936) at the
    LR-sensitivity size; None when either has no count."""
    count, base = shared_count(runs), shared_count(baseline)
    return None if count is None or not base else count / base


def ratio_text(ratio: float | None) -> str:
    """``1.266 (+26.6 %)``: the ratio and the relative difference in %; ``—`` for None."""
    return "—" if ratio is None else f"{ratio:.3f} ({100 * (ratio - 1):+.1f} %)"
