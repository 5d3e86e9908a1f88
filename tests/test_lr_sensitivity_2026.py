"""The committed CSVs of docs/results.md section (g), the LR-sensitivity study of recent norms: each is what
``scripts.report_lrs`` gives from the report cells committed beside it, and the study is whole (every preset, LR and
seed; every run finished)."""

from pathlib import Path

import pytest

from scripts import report_lrs
from tests.helpers.csvs import read_csv

STUDY_2026 = Path(__file__).parents[1] / "docs" / "results" / "lr_sensitivity_2026"


@pytest.mark.parametrize("baseline, folder", [("pre_ln", "."), ("pre_dyt", "vs_pre_dyt"), ("pre_rms", "vs_pre_rms")])
def test_the_2026_study_csvs_are_what_report_lrs_gives_from_its_report_cells(baseline: str, folder: str, tmp_path: Path) -> None:
    cells = STUDY_2026 / "report_cells.csv"  # the report's lr_sensitivity.csv of the study's run dirs, long labels
    assert report_lrs.main([str(cells), "--out", str(tmp_path / "lrs.csv"), "--baseline", baseline, "--by-preset"]) == 0
    assert (tmp_path / "lrs.csv").read_text() == (STUDY_2026 / folder / "lrs.csv").read_text()
    for name in ("lrs_seeds.csv", "lr_sensitivity.csv"):  # the same for any baseline: committed once
        assert (tmp_path / name).read_text() == (STUDY_2026 / name).read_text(), name
    rows = read_csv(cells)  # the whole grid of every preset, every run finished: no LRS over part of a grid
    presets = ["pre_ln", "pre_rms", "pre_dyt", "pre_derf", "pre_dyt_lm", "pre_ln_gpas", "olmo2", "pre_rms_zc", "pre_ln_mhc"]
    assert len(rows) == len(presets) * 7 * 3 and {r["state"] for r in rows} == {"finished"}
    assert sorted(r["family"] for r in read_csv(STUDY_2026 / "lrs.csv")) == sorted(presets)


def test_the_2026_equal_parameter_csvs_are_what_report_lrs_gives_from_their_cells(tmp_path: Path) -> None:
    folder = STUDY_2026 / "equal_params"  # pre-LN widened to mHC's parameter count (model.d_ff=378), run alone
    cells = folder / "report_cells.csv"
    assert report_lrs.main([str(cells), "--out", str(tmp_path / "lrs.csv"), "--baseline", "pre_ln", "--by-preset"]) == 0
    for name in ("lrs.csv", "lrs_seeds.csv", "lr_sensitivity.csv"):
        assert (tmp_path / name).read_text() == (folder / name).read_text(), name
    rows = read_csv(cells)
    assert len(rows) == 7 * 3 and {r["state"] for r in rows} == {"finished"}
