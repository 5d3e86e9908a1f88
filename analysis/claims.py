"""A finding's claims as data: the claims file (``docs/results/<folder>/claims.yaml``), loaded and validated.

A file's top level: ``section`` (its key on docs/results.md), ``written`` (``before the runs`` or ``after the runs``),
``seeds`` (the pairs every claim is judged over), ``alpha`` (the family-wise error rate), ``claims`` (a list), and
optionally ``reference`` (a sentence: the section is a reference point, with no claim and no verdict).

A claim: ``id``, ``claim`` (one sentence), ``source``, ``family`` (the claims of one file sharing it are corrected
together for multiplicity), ``direction`` (``lower``: the arm below the baseline; ``higher``; ``none``: a control,
no difference expected), and how it is measured: ``csv`` (under docs/results/), ``metric`` (its column), ``pair_by``
(the column pairing the rows, e.g. ``seed``), ``arm`` and ``baseline``: column=value selectors of that CSV's rows (a
selector may name its own ``csv``; how one matches and how the pairs are read: :mod:`analysis.selection`). The
contrast is arm minus baseline. Optional: ``at`` (a selector both sides share, e.g. ``{max_tokens: 256}``),
``against`` (a number instead of ``baseline``: a one-sample contrast),
``minus`` (``{arm:, baseline:, at:}``: a second arm-minus-baseline subtracted, a difference of differences),
``about_failure: true`` (the claim is about failing, so a run that did not learn or finish is compared by its metric
instead of stopping the verdict), ``judged`` (a sentence saying how the finding is judged when no per-seed rows
exist; such a claim needs no ``metric``, ``pair_by``, ``arm`` or ``baseline`` and gets no computed verdict).

Every error is a :class:`ClaimsError` of one line naming the file, the claim id, the bad value and the valid choices.
"""

from dataclasses import dataclass
from pathlib import Path

import yaml

from analysis.selection import Contrast, SelectionError, keys, mapping, parse_contrast, parse_minus

WRITTEN = ("before the runs", "after the runs")
DIRECTIONS = ("lower", "higher", "none")
TOP_KEYS = ("section", "written", "seeds", "alpha", "claims", "reference")
TOP_REQUIRED = ("section", "written", "seeds", "alpha", "claims")
CLAIM_KEYS = (
    "id",
    "claim",
    "source",
    "family",
    "csv",
    "metric",
    "pair_by",
    "arm",
    "baseline",
    "direction",
    "minus",
    "at",
    "against",
    "about_failure",
    "judged",
)
CLAIM_REQUIRED = ("id", "claim", "source", "family", "direction")
MEASURED_REQUIRED = ("csv", "metric", "pair_by", "arm")  # and baseline or against


class ClaimsError(SelectionError):
    """A claims file that cannot be judged; the message is one line naming the file, claim, value and choices."""


@dataclass(frozen=True)
class Claim:
    """One claim of a claims file (the module docstring gives each key). ``contrast`` and ``minus`` are None for a
    ``judged`` claim; ``minus`` is None unless the claim is a difference of differences."""

    id: str
    claim: str
    source: str
    family: str
    direction: str
    csv: str | None
    metric: str | None
    pair_by: str | None
    contrast: Contrast | None
    minus: Contrast | None
    about_failure: bool
    judged: str | None


@dataclass(frozen=True)
class ClaimsFile:
    """A loaded claims file. ``path``: where it was read; ``before``: whether it was written before the runs."""

    path: Path
    section: str
    written: str
    seeds: tuple[object, ...]
    alpha: float
    claims: tuple[Claim, ...]
    reference: str | None

    @property
    def before(self) -> bool:
        return self.written == WRITTEN[0]

    def family_size(self, family: str) -> int:
        """m: how many claims of this file belong to ``family``."""
        return sum(c.family == family for c in self.claims)


def load_claims(path: Path) -> ClaimsFile:
    """Read and validate the claims file at ``path`` (the rows the selectors match are checked by
    :func:`analysis.verdicts.judge`, which reads the CSVs).

    Raises:
        ClaimsError: unreadable YAML, an unknown or missing key, an unknown ``written`` or ``direction``, no seeds,
            an alpha outside (0, 1), a repeated claim id, a selector that is not a mapping.
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ClaimsError(f"{path}: cannot read a claims file: {err.strerror}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ClaimsError(f"{path}: not valid YAML at {at}{problem}; valid: YAML (quote a value holding ': ')") from None
    try:
        return _file(data, Path(path))
    except SelectionError as err:  # the selectors' errors (analysis.selection), as this module's
        raise err if isinstance(err, ClaimsError) else ClaimsError(str(err)) from None


def _file(data: object, path: Path) -> ClaimsFile:
    where = f"{path}"
    data = mapping(data, where, "the file")
    keys(data, TOP_KEYS, TOP_REQUIRED, where)
    _choice(data["written"], WRITTEN, where, "written")
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not seeds:
        raise ClaimsError(f"{where}: seeds is {seeds!r}; valid: a non-empty list of the seeds every claim pairs over")
    alpha = data["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise ClaimsError(f"{where}: alpha is {alpha!r}; valid: a number between 0 and 1 (e.g. 0.05)")
    if not isinstance(data["claims"], list):
        raise ClaimsError(f"{where}: claims is {data['claims']!r}; valid: a list of claims")
    claims = tuple(_claim(raw, where, i) for i, raw in enumerate(data["claims"]))
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ClaimsError(f"{where}: claim id {next(i for i in ids if ids.count(i) > 1)!r} is repeated; ids are unique")
    return ClaimsFile(path, str(data["section"]), data["written"], tuple(seeds), float(alpha), claims, data.get("reference"))


def _claim(raw: object, where: str, index: int) -> Claim:
    raw = mapping(raw, where, f"claim {index}")
    here = f"{where}: claim {raw.get('id', index)!r}"
    keys(raw, CLAIM_KEYS, CLAIM_REQUIRED, here)
    _choice(raw["direction"], DIRECTIONS, here, "direction")
    common = {k: str(raw[k]) for k in ("id", "claim", "source", "family", "direction")}
    if "judged" in raw:
        extra = sorted(set(raw) - {*CLAIM_REQUIRED, "judged", "csv", "metric"})
        if extra:
            raise ClaimsError(f"{here}: a judged claim has no {extra[0]!r}; valid: {', '.join(CLAIM_REQUIRED)}, csv, metric")
        return Claim(
            **common,
            csv=raw.get("csv"),
            metric=raw.get("metric"),
            pair_by=None,
            contrast=None,
            minus=None,
            about_failure=False,
            judged=str(raw["judged"]),
        )
    keys(raw, CLAIM_KEYS, MEASURED_REQUIRED, here)
    contrast = parse_contrast(raw, raw["csv"], here, allow_against=True)
    minus = parse_minus(raw["minus"], raw["csv"], here) if "minus" in raw else None
    if not isinstance(raw.get("about_failure", False), bool):
        raise ClaimsError(f"{here}: about_failure is {raw['about_failure']!r}; valid: true, false")
    return Claim(
        **common,
        csv=str(raw["csv"]),
        metric=str(raw["metric"]),
        pair_by=str(raw["pair_by"]),
        contrast=contrast,
        minus=minus,
        about_failure=raw.get("about_failure", False),
        judged=None,
    )


def _choice(value: object, choices: tuple[str, ...], where: str, name: str) -> None:
    if value not in choices:
        raise ClaimsError(f"{where}: unknown {name} {value!r}; valid: {', '.join(repr(c) for c in choices)}")
