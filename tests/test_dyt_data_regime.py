"""The committed CSVs of docs/results.md section (h), DyT's data regime: ``regime.csv`` is what ``analysis.regime`` gives
from the committed per-run ``regime_runs.csv`` (the run directories are not committed), and the study is the preset's:
every norm, fraction and seed, every run finished."""

from pathlib import Path

from analysis.csvs import write_csv
from analysis.regime import Cell, regimes
from reporting.regime import REGIME_FIELDS, RUN_FIELDS, regime_row
from tests.helpers.csvs import read_csv
from tests.helpers.results import sweep_params

STUDY = Path(__file__).parents[1] / "docs" / "results" / "dyt_data_regime"


def cells() -> list[Cell]:
    def number(text: str) -> float | None:
        return float(text) if text else None

    rows = read_csv(STUDY / "regime_runs.csv")
    assert list(rows[0]) == list(RUN_FIELDS)
    return [Cell(r["preset"], float(r["train_fraction"]), int(r["seed"]), r["state"], number(r["final_val_loss"]),
                 number(r["saturation"])) for r in rows]  # fmt: skip


def test_regime_csv_is_what_analysis_regime_gives_from_the_runs(tmp_path: Path) -> None:
    write_csv(tmp_path / "regime.csv", REGIME_FIELDS, [regime_row(r, 100) for r in regimes(cells(), "pre_ln")])
    assert (tmp_path / "regime.csv").read_text() == (STUDY / "regime.csv").read_text()


def test_the_study_is_the_presets_and_every_run_finished() -> None:
    params = sweep_params("dyt_data_regime")
    want = {(n, float(f), int(s)) for n in params["norm"] for f in params["data.train_fraction"] for s in params["seed"]}
    found = cells()
    assert {(c.preset, c.fraction, c.seed) for c in found} == want and len(found) == len(want) == 27
    assert {c.state for c in found} == {"finished"}
    assert all((c.saturation is None) == (c.preset == "pre_ln") for c in found)  # bounded norms only


def test_what_the_page_says_of_the_saturation_holds() -> None:
    # "DyT's saturation at step 100 does not separate the regimes": its per-seed ranges overlap at every pair of fractions
    by_fraction: dict[float, list[float]] = {}
    for c in cells():
        if c.preset == "pre_dyt":
            by_fraction.setdefault(c.fraction, []).append(c.saturation)
    ranges = [(min(v), max(v)) for v in by_fraction.values()]
    assert len(ranges) == 3 and all(lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in ranges for lo2, hi2 in ranges)
    derf = [c.saturation for c in cells() if c.preset == "pre_derf"]
    assert min(derf) > max(max(v) for v in by_fraction.values())  # "Derf saturates more than DyT in every run"
