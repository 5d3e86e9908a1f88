"""The committed CSVs of docs/results.md's finding (a) at 17 seeds: each is what ``scripts.report_lrs`` gives from the
report cells committed for it (seeds 0-2 from the LR-sensitivity study, seeds 3-16 from ``+experiment=lr_sensitivity_seeds``),
and the study is the one fixed before its runs: the preset's seeds, every LR of the grid, every run finished."""

from pathlib import Path

import pytest

from scripts import report_lrs
from tests.helpers.csvs import read_csv
from tests.helpers.results import sweep_params

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "results"
SEEDS = RESULTS / "lr_sensitivity_seeds"
FIRST = RESULTS / "lr_sensitivity" / "lr_sensitivity.csv"  # seeds 0-2, every preset of the study, long labels
LATER = SEEDS / "cells_seeds_3-16.csv"  # seeds 3-16 of post_ln and pre_ln, the report's cells of their sweep
ARGS = ["--by-preset", "--families", "post_ln,pre_ln", "--baseline", "pre_ln"]


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


def test_what_the_page_says_of_the_17_seeds_holds() -> None:
    lrs = {(r["family"], int(r["seed"])): (float(r["lrs"]), float(r["best_loss"])) for r in read_csv(SEEDS / "lrs_seeds.csv")}
    diff = {s: lrs["post_ln", s][0] - lrs["pre_ln", s][0] for s in range(17)}
    assert min(diff.values()) > 0  # "higher than pre-LN's in every one of the 17 seeds"
    worst_best = sorted(range(17), key=lambda s: -lrs["post_ln", s][1])[:5]
    assert sorted(worst_best) == sorted(sorted(diff, key=diff.get)[:5]) == [1, 3, 8, 12, 15]  # the page's five seeds
    cells = read_csv(SEEDS / "lr_sensitivity.csv")

    def losses(family: str, lr: float) -> list[float]:
        return [float(c["capped_loss"]) for c in cells if c["family"] == family and float(c["lr"]) == lr]

    assert min(losses("post_ln", 1e-2)) > max(losses("pre_ln", 1e-2))  # "at 1e-2 every post-LN run ends above"
    plateau = [v for lr in (3e-2, 1e-1, 3e-1) for v in losses("post_ln", lr)]
    assert len(plateau) == 3 * 17 and max(plateau) - min(plateau) < 0.01  # "above it ... one plateau"
    for family in ("post_ln", "pre_ln"):  # "both are best at 3e-3", in the mean over seeds
        means = {lr: sum(losses(family, lr)) / 17 for lr in (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)}
        assert min(means, key=means.get) == 3e-3
