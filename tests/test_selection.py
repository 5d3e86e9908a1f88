"""analysis.selection: how a selector matches a CSV cell, and what an unfinished row does under each policy."""

from pathlib import Path

import pytest

from analysis.selection import Absent, Contrast, Measure, Side, Tables, Unfinished, differences, matches

RUNS = """arm,seed,state,learned,loss
ln,0,finished,true,1.0
ln,1,finished,true,2.0
ln,2,finished,true,3.0
bn,0,finished,true,1.5
bn,1,finished,false,9.0
bn,2,finished,true,3.5
"""


@pytest.mark.parametrize(
    "cell, value, want",
    [("1", 1.0, True), ("1.0", "1", True), ("pre_ln", "pre_ln", True), ("pre_ln", "pre_rms", False), ("True", True, True),
     ("true", True, True), ("1", True, False), ("", None, True), ("None", None, True), ("0", None, False)],
)  # fmt: skip
def test_a_selector_matches_the_same_text_number_boolean_or_null(cell: str, value: object, want: bool) -> None:
    assert matches(cell, value) is want


def contrast() -> Contrast:
    return Contrast(Side("runs.csv", (("arm", "bn"),)), Side("runs.csv", (("arm", "ln"),)), None)


def test_an_unfinished_row_stops_is_left_out_or_is_compared(tmp_path: Path) -> None:
    (tmp_path / "runs.csv").write_text(RUNS)
    measure, tables = Measure("runs.csv", "loss", "seed"), Tables(tmp_path)
    with pytest.raises(Unfinished, match=r"^arm=bn seed=1 \(learned=false\)$"):
        differences(contrast(), None, measure, tables, "f: c", (0, 1, 2), "flag")
    assert differences(contrast(), None, measure, tables, "f: c", None, "skip") == {"0": 0.5, "2": 0.5}
    assert differences(contrast(), None, measure, tables, "f: c", (0, 1, 2), "keep") == {"0": 0.5, "1": 7.0, "2": 0.5}
    with pytest.raises(Absent) as err:
        differences(contrast(), None, measure, tables, "f: c", (0, 3), "flag")
    assert err.value.what == "no row of runs.csv with arm=bn and seed 3"
    assert str(err.value) == "f: c: no row of runs.csv with arm=bn and seed 3; valid seed values there: 0, 1, 2"
