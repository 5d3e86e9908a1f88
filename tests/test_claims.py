"""analysis.claims and analysis.verdicts on hand-made claims and CSVs with known answers: the loader's errors, Holm's
step-down (one that stops), a difference of differences, a one-sample contrast, a control, a run that did not learn,
a claim about failing, a claims file whose runs have not landed, a judged claim."""

import math
import textwrap
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from analysis.claims import ClaimsError, load_claims
from analysis.verdicts import holm_levels, judge, verdict_word

HEAD = "section: x\nwritten: after the runs\nseeds: [0, 1, 2]\nalpha: 0.05\nclaims:\n"
CLAIM = """\
  - id: {id}
    claim: a lower metric
    source: a paper
    family: {family}
    csv: runs.csv
    metric: m
    pair_by: seed
    arm: {{arm: {arm}}}
    baseline: {{arm: {baseline}}}
    direction: {direction}
"""


def write(tmp_path: Path, text: str, csv_text: str | None = None) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text(text, encoding="utf-8")
    if csv_text is not None:
        (tmp_path / "runs.csv").write_text(textwrap.dedent(csv_text), encoding="utf-8")
    return path


def claim(id: str = "c", family: str = "f", arm: str = "a", baseline: str = "b", direction: str = "lower") -> str:
    return CLAIM.format(id=id, family=family, arm=arm, baseline=baseline, direction=direction)


def runs(values: dict[str, list[float]], extra: str = "") -> str:
    """runs.csv with one row per (arm, seed); ``extra``: a column appended to every row, ``state`` by default."""
    rows = ["arm,seed,state,m"]
    rows += [f"{arm},{seed},finished,{v}" for arm, vs in values.items() for seed, v in enumerate(vs)]
    return "\n".join(rows) + "\n" + extra


def test_a_lower_arm_is_reproduced_with_its_plain_t_interval(tmp_path) -> None:
    path = write(tmp_path, HEAD + claim(), runs({"a": [1.5, 2.4, 3.8], "b": [2.0, 3.0, 4.6]}))
    (v,) = judge(load_claims(path), tmp_path)
    # differences -0.5, -0.6, -0.8: mean -0.6333, sd 0.1528, t(0.975, 2) = 4.3027
    assert (v.n, v.m, v.word) == (3, 1, "reproduced") and v.mean == pytest.approx(-0.63333, abs=1e-5)
    assert v.plain == pytest.approx((-1.01279, -0.25388), abs=1e-5) and v.corrected == pytest.approx(v.plain)
    assert v.level == 0.05 and v.p == pytest.approx(scipy_stats.ttest_rel([1.5, 2.4, 3.8], [2.0, 3.0, 4.6]).pvalue)


def test_the_other_side_is_contradicted_and_an_interval_over_0_is_no_difference_detected() -> None:
    assert verdict_word((0.1, 0.3), "lower") == "contradicted" and verdict_word((-0.3, -0.1), "higher") == "contradicted"
    assert verdict_word((-0.3, 0.1), "lower") == "no difference detected"
    assert verdict_word((0.1, 0.3), "none") == "difference detected"
    assert verdict_word((-0.1, 0.1), "none") == "no difference detected"


def test_holm_steps_down_and_holds_every_claim_after_the_first_non_rejection_at_its_level() -> None:
    assert holm_levels({"x": 0.01, "y": 0.02, "z": 0.04}, 0.05) == pytest.approx({"x": 0.05 / 3, "y": 0.025, "z": 0.05})
    # 0.03 > 0.05 / 2 stops: 0.03 and 0.04 are both held at 0.025 (0.04 would pass alone at 0.05)
    assert holm_levels({"x": 0.01, "y": 0.04, "z": 0.03}, 0.05) == pytest.approx({"x": 0.05 / 3, "y": 0.025, "z": 0.025})
    assert holm_levels({"x": None, "y": 0.001}, 0.05) == pytest.approx({"y": 0.025, "x": 0.05})  # no p-value: last


def test_a_family_s_corrected_intervals_agree_with_holm_where_the_step_down_stops(tmp_path) -> None:
    # three claims in one family: a clear one, then two whose plain intervals exclude 0 but not at Holm's levels
    values = {"b": [1.0, 2.0, 3.0], "a1": [0.0, 0.9, 2.1], "a2": [0.95, 1.9, 2.9], "a3": [0.96, 1.92, 2.95]}
    text = HEAD + claim("one", arm="a1") + claim("two", arm="a2") + claim("three", arm="a3")
    verdicts = judge(load_claims(write(tmp_path, text, runs(values))), tmp_path)
    p = {v.claim.id: v.p for v in verdicts}
    ranked = sorted(p, key=p.get)
    assert p[ranked[0]] <= 0.05 / 3 and p[ranked[1]] > 0.05 / 2  # the step-down stops at the second
    by_id = {v.claim.id: v for v in verdicts}
    assert by_id[ranked[1]].level == by_id[ranked[2]].level == 0.025 and all(v.m == 3 for v in verdicts)
    for v in verdicts:
        rejected = v.p <= v.level
        assert rejected == (not v.corrected[0] <= 0 <= v.corrected[1])
        assert v.word == ("reproduced" if rejected else "no difference detected")
        assert v.plain[1] < 0  # every plain interval excludes 0: only the correction changes the words
        assert v.corrected[0] <= v.plain[0] and v.corrected[1] >= v.plain[1]


def test_a_difference_of_differences_pairs_by_seed(tmp_path) -> None:
    minus = "    minus: {arm: {arm: c}, baseline: {arm: d}}\n"
    text = HEAD + claim(direction="lower").replace("    direction:", minus + "    direction:")
    values = {"a": [1.0, 1.1, 1.3], "b": [1.2, 1.35, 1.5], "c": [0.5, 0.6, 0.65], "d": [0.4, 0.52, 0.6]}
    (v,) = judge(load_claims(write(tmp_path, text, runs(values))), tmp_path)
    # (a - b) - (c - d) per seed: -0.3, -0.33, -0.25
    assert v.mean == pytest.approx(-0.29333, abs=1e-5) and v.n == 3 and v.word == "reproduced"


def test_at_and_against_select_a_setting_and_a_one_sample_contrast(tmp_path) -> None:
    text = HEAD + claim(direction="higher").replace("    baseline: {arm: b}\n", "    at: {tokens: 256}\n    against: 1\n")
    csv_text = "arm,tokens,seed,state,m\n" + "".join(f"a,{t},{s},finished,{1.7 + s / 10 if t == 256 else 0.2}\n"
                                                      for t in (256, 1024) for s in range(3))  # fmt: skip
    (v,) = judge(load_claims(write(tmp_path, text, csv_text)), tmp_path)
    assert v.mean == pytest.approx(0.8) and v.word == "reproduced"


def test_a_control_reads_difference_detected_or_not(tmp_path) -> None:
    text = HEAD + claim("same", arm="a", direction="none") + claim("apart", arm="c", direction="none")
    values = {"a": [1.0, 2.1, 2.9], "b": [1.05, 2.0, 3.0], "c": [2.0, 3.1, 4.0]}
    words = [v.word for v in judge(load_claims(write(tmp_path, text, runs(values))), tmp_path)]
    assert words == ["no difference detected", "difference detected"]


@pytest.mark.parametrize("column, value", [("state", "diverged"), ("learned", "False"), ("diverged", "True")])
def test_a_run_that_did_not_learn_is_never_compared(tmp_path, column: str, value: str) -> None:
    good = {"state": "finished", "learned": "True", "diverged": "False"}[column]
    metric = {("a", 0): 2.0, ("a", 1): 9.0, ("a", 2): 4.1, ("b", 0): 1.0, ("b", 1): 2.0, ("b", 2): 3.0}
    csv_text = f"arm,seed,{column},m\n" + "".join(f"{a},{s},{value if (a, s) == ('a', 1) else good},{metric[a, s]}\n"
                                                  for a in "ab" for s in range(3))  # fmt: skip
    (v,) = judge(load_claims(write(tmp_path, HEAD + claim(), csv_text)), tmp_path)
    assert v.word == f"not learned: arm=a seed=1 ({column}={value})" and v.mean is None and v.corrected is None
    # a claim about failing compares the failed run by its metric: differences 1.0, 7.0, 1.1
    failing = HEAD + claim(direction="higher").replace("    direction:", "    about_failure: true\n    direction:")
    (v,) = judge(load_claims(write(tmp_path, failing)), tmp_path)
    assert v.n == 3 and v.mean == pytest.approx(3.0333, abs=1e-4) and v.word == "no difference detected"


def test_a_file_written_before_the_runs_reads_not_yet_run_where_its_rows_are_missing(tmp_path) -> None:
    before = HEAD.replace("after the runs", "before the runs")
    text = before + claim("here") + claim("later", arm="new") + claim("no_csv").replace("csv: runs.csv", "csv: x/y.csv")
    verdicts = judge(load_claims(write(tmp_path, text, runs({"a": [1.0, 2.0, 3.5], "b": [1.2, 2.3, 3.6]}))), tmp_path)
    assert verdicts[0].n == 3
    assert verdicts[1].word == "not yet run: no row of runs.csv with arm=new and seed 0, 1, 2"
    assert verdicts[2].word == "not yet run: x/y.csv does not exist" and verdicts[2].m == 3


def test_a_judged_claim_is_not_computed(tmp_path) -> None:
    text = HEAD + "  - {id: j, claim: faster, source: s, family: f, direction: lower, judged: medians only}\n"
    (v,) = judge(load_claims(write(tmp_path, text)), tmp_path)
    assert (v.word, v.n, v.m, v.p) == ("not computed: medians only", 0, 1, None)


@pytest.mark.parametrize("text, message", [
    (HEAD + claim().replace("metric: m", "metrc: m"), "claim 'c': unknown key 'metrc'; valid: id, claim, source"),
    (HEAD + claim(direction="smaller"), "claim 'c': unknown direction 'smaller'; valid: 'lower', 'higher', 'none'"),
    (HEAD.replace("after the runs", "later"), "unknown written 'later'; valid: 'before the runs', 'after the runs'"),
    (HEAD.replace("[0, 1, 2]", "[]"), "seeds is []; valid: a non-empty list"),
    (HEAD.replace("seeds: [0, 1, 2]\n", ""), "missing key 'seeds'; required: section, written, seeds, alpha, claims"),
    (HEAD + claim() + claim(), "claim id 'c' is repeated"),
    (HEAD + claim().replace("    baseline: {arm: b}\n", ""), "claim 'c': needs exactly one of baseline (a selector) or against"),
    (HEAD + "  - id: c\n    source: a: b\n", "not valid YAML at line 7, column 14: mapping values are not allowed here"),
])  # fmt: skip
def test_a_bad_claims_file_is_one_line_naming_the_file_the_claim_the_value_and_the_choices(tmp_path, text, message) -> None:
    with pytest.raises(ClaimsError) as err:
        load_claims(write(tmp_path, text))
    assert str(err.value).startswith(str(tmp_path / "claims.yaml")) and message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("csv_text, message", [
    (runs({"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0, 3.0]}) + "a,0,finished,5\n",
     "arm=a matches more than one row of runs.csv with seed=0; valid: a selector naming one row per pair"),
    (runs({"a": [1.0, 2.0], "b": [1.0, 2.0, 3.0]}), "no row of runs.csv with arm=a and seed 2; valid seed values there: 0, 1"),
    (runs({"x": [1.0, 2.0, 3.0], "b": [1.0, 2.0, 3.0]}), "arm=a matches no row of runs.csv; valid values there: arm: b, x"),
    ("arm,seed,state,n\na,0,finished,1\n", "runs.csv has no column 'm'; valid: arm, seed, state, n"),
    (runs({"a": [1.0, math.nan, 3.0], "b": [1.0, 2.0, 3.0]}), "arm=a seed=1 has metric value 'nan'; valid: a finite number"),
])  # fmt: skip
def test_rows_that_cannot_be_judged_are_one_line_naming_the_claim(tmp_path, csv_text, message) -> None:
    with pytest.raises(ClaimsError) as err:
        judge(load_claims(write(tmp_path, HEAD + claim(), csv_text)), tmp_path)
    assert "claim 'c': " in str(err.value) and message in str(err.value)
