"""The committed CSVs of docs/results.md's finding (a) at 17 seeds: each is what ``scripts.report_lrs`` gives from the
report cells committed for it (seeds 0-2 from the LR-sensitivity study, seeds 3-16 from ``+experiment=lr_sensitivity_seeds``),
and the study is the one fixed before its runs: the preset's seeds, every LR of the grid, every run finished."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from scripts import report_lrs
from tests.test_lrs import read_csv

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "results"
SEEDS = RESULTS / "lr_sensitivity_seeds"
FIRST = RESULTS / "lr_sensitivity" / "lr_sensitivity.csv"  # seeds 0-2, every preset of the study, long labels
LATER = SEEDS / "cells_seeds_3-16.csv"  # seeds 3-16 of post_ln and pre_ln, the report's cells of their sweep
ARGS = ["--by-preset", "--families", "post_ln,pre_ln", "--baseline", "pre_ln"]


def sweep_params(experiment: str) -> dict[str, list[str]]:
    """The swept keys of ``+experiment=<experiment>`` and their values."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={experiment}"], return_hydra_config=True)
    return {key: str(value).split(",") for key, value in cfg.hydra.sweeper.params.items()}


@pytest.mark.parametrize("inputs, folder", [((FIRST, LATER), "."), ((LATER,), "new_seeds_only")])
def test_the_17_seed_csvs_are_what_report_lrs_gives_from_the_committed_cells(inputs, folder: str, tmp_path: Path) -> None:
    assert report_lrs.main([*map(str, inputs), "--out", str(tmp_path / "lrs.csv"), *ARGS]) == 0
    for name in ("lrs.csv", "lrs_seeds.csv", "lr_sensitivity.csv"):
        assert (tmp_path / name).read_text() == (SEEDS / folder / name).read_text(), f"{folder}/{name}"


def test_the_study_is_the_one_fixed_before_its_runs() -> None:
    params = sweep_params("lr_sensitivity_seeds")
    assert params["norm"] == ["post_ln", "pre_ln"] and params["seed"] == [str(s) for s in range(3, 17)]
    grid = [float(lr) for lr in sweep_params("lr_sensitivity")["optim.lr"]]
    later = read_csv(LATER)
    assert {r["state"] for r in later} == {"finished"}  # no run failed or diverged
    cells = {(r["family"], int(r["seed"]), float(r["lr"])) for r in later}
    assert cells == {(f, s, lr) for f in ("norm.placement=post", "norm.placement=pre") for s in range(3, 17) for lr in grid}
    rows = {r["family"]: r for r in read_csv(SEEDS / "lrs.csv")}
    assert rows.keys() == {"post_ln", "pre_ln"} and {r["n"] for r in rows.values()} == {"17"}
    assert rows["post_ln"]["pairs"] == "17" and rows["post_ln"]["did_not_learn"] == "0"
