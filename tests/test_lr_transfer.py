"""analysis.transfer and scripts.lr_transfer: the best LR between grid points, its shift per doubling of the width,
and the CSVs, on LR studies made up here with known answers."""

import csv
import math
from pathlib import Path

import pytest

from analysis.lrs import Cell, SeedGrid
from analysis.transfer import best_lr, transfers
from scripts import lr_transfer
from tests.helpers.csvs import read_csv

GRID = [2.0**k for k in range(-12, -5)]  # 2^-12 ... 2^-6, a factor 2 apart
INIT = 4.0


def _losses(best_log2: float) -> list[float]:
    """A loss bowl in log2(LR) with its minimum at ``best_log2``: 1 + 0.1 (log2 lr - best)^2."""
    return [1.0 + 0.1 * (math.log2(lr) - best_log2) ** 2 for lr in GRID]


def _seed(losses: list[float]) -> SeedGrid:
    return SeedGrid(0, INIT, [Cell(lr, None, "finished", v, min(v, INIT)) for lr, v in zip(GRID, losses, strict=True)])


@pytest.mark.parametrize("best", [-9.0, -9.3, -8.55, -10.9])
def test_the_best_lr_is_the_bowl_s_minimum_between_grid_points(best: float) -> None:
    found = best_lr(_seed(_losses(best)), GRID)
    assert found is not None and not found.at_edge and found.log2_lr == pytest.approx(best, abs=1e-12)


def test_an_argmin_on_the_grid_s_edge_is_that_edge_and_says_so_and_no_learning_has_none() -> None:
    low = best_lr(_seed(_losses(-14.0)), GRID)
    assert low is not None and low.at_edge and low.log2_lr == -12.0
    assert best_lr(_seed([INIT + 1.0] * len(GRID)), GRID) is None  # every loss above l0: did not learn


def _cells(path: Path, shift: dict[str, float], seeds: int = 3) -> Path:
    """A report's lr_sensitivity.csv: pre-LN and post-LN under sp and mup at widths 64, 128, 256, each seed's best LR
    at 2^(-9 + shift * log2(width / 64) + seed / 10), ``shift`` by parametrization."""
    rows = []
    for param, s in shift.items():
        for placement in ("pre", "post"):
            for width in (64, 128, 256):
                label = f"model.d_model={width} model.d_ff={4 * width} model.parametrization={param} norm.placement={placement}"
                for seed in range(seeds):
                    best = -9 + s * math.log2(width / 64) + seed / 10
                    for lr, loss in zip(GRID, _losses(best), strict=True):
                        rows.append([label, seed, repr(lr), repr(loss), INIT, repr(loss), "finished", ""])
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["family", "seed", "lr", "final_val_loss", "init_loss", "capped_loss", "state", "max_attn_logit"])
        writer.writerows(rows)
    return path


def test_the_shift_per_doubling_is_the_slope_of_log2_best_lr_over_log2_width(tmp_path: Path) -> None:
    rows = read_csv(_cells(tmp_path / "cells.csv", {"sp": -1.0, "mup": 0.0}))
    found = {t.name: t for t in transfers(rows, "width")}
    assert len(found) == 4
    for name, t in found.items():
        assert t.points == [64, 128, 256]
        want = -1.0 if "parametrization=sp" in name else 0.0
        assert t.shifts == pytest.approx({0: want, 1: want, 2: want}, abs=1e-12)
    with pytest.raises(ValueError, match="has no model.n_enc_layers: the study does not vary the depth"):
        transfers(rows, "depth")


def test_the_command_writes_both_csvs_named_by_preset_with_intervals(tmp_path: Path) -> None:
    cells = _cells(tmp_path / "cells.csv", {"sp": -0.5, "mup": 0.25})
    out = tmp_path / "out" / "transfer.csv"
    assert lr_transfer.main([str(cells), "--axis", "width", "--out", str(out), "--by-preset"]) == 0
    summary = {r["family"]: r for r in read_csv(out)}
    assert sorted(summary) == ["post_ln mup", "post_ln sp", "pre_ln mup", "pre_ln sp"]
    row = summary["pre_ln sp"]
    assert row["n"] == "3" and float(row["shift_mean"]) == pytest.approx(-0.5, abs=1e-12) and row["seeds_at_edge"] == ""
    assert float(row["ci95_lo"]) == pytest.approx(-0.5, abs=1e-9) == float(row["ci95_hi"])  # every seed shifts alike
    points = {(r["family"], r["point"]): r for r in read_csv(out.with_name("transfer_points.csv"))}
    assert len(points) == 4 * 3 and (points["pre_ln sp", "256"]["n"], points["pre_ln sp", "256"]["at_edge"]) == ("3", "0")
    # 2 to the mean over seeds of -9 - 0.5 log2(256 / 64) + seed / 10
    assert float(points["pre_ln sp", "256"]["best_lr"]) == pytest.approx(2 ** (-9 - 1 + 0.1), rel=1e-9)
    # l0 and the lowest loss on the grid, 1 + 0.1 (seed / 10)^2 at the grid point -10, averaged over the seeds
    at = points["pre_ln sp", "256"]
    assert float(at["init_loss"]) == INIT and float(at["best_loss"]) == pytest.approx(1 + 0.1 * (0.01 + 0.04) / 3, rel=1e-12)
    grid = {(r["family"], r["point"], float(r["lr"])): r for r in read_csv(out.with_name("transfer_grid.csv"))}
    assert len(grid) == 4 * 3 * len(GRID) and grid["pre_ln sp", "256", 2.0**-10]["n"] == "3"
    mean = sum(1 + 0.1 * (seed / 10) ** 2 for seed in range(3)) / 3  # the bowl at 2^-10, each seed's minimum 2^(-10 + seed/10)
    assert float(grid["pre_ln sp", "256", 2.0**-10]["capped_loss"]) == pytest.approx(mean, rel=1e-12)
    seeds = read_csv(out.with_name("transfer_seeds.csv"))
    assert [(r["family"], r["seed"]) for r in seeds[:3]] == [("pre_ln sp", "0"), ("pre_ln sp", "1"), ("pre_ln sp", "2")]
    assert [float(r["abs_shift"]) for r in seeds if r["family"] == "post_ln mup"] == pytest.approx([0.25] * 3, abs=1e-12)
    assert lr_transfer.main([str(cells), "--axis", "depth", "--out", str(out)]) == 2


def _depth_cells(path: Path, labels: dict[str, float]) -> Path:
    """A report's lr_sensitivity.csv of a study across depth 2, 4, 8 with one seed per family label, each label's
    best LR at 2^(-9 + shift * log2(depth / 2))."""
    rows = []
    for label, shift in labels.items():
        for depth in (2, 4, 8):
            full = f"{label} model.n_dec_layers={depth} model.n_enc_layers={depth}".strip()
            for lr, loss in zip(GRID, _losses(-9 + shift * math.log2(depth / 2)), strict=True):
                rows.append([full, 0, repr(lr), repr(loss), INIT, repr(loss), "finished", ""])
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["family", "seed", "lr", "final_val_loss", "init_loss", "capped_loss", "state", "max_attn_logit"])
        writer.writerows(rows)
    return path


def test_a_study_of_one_norm_preset_is_named_by_norm_and_refused_without_it(tmp_path: Path, capsys) -> None:
    # the depth study runs pre_ln alone, so its labels hold no norm.* key (one sweep's alone: none at all)
    both = _depth_cells(
        tmp_path / "both.csv", {"model.parametrization=sp": -1.0, "model.base_depth=2 model.parametrization=completep": 0.0}
    )
    out = tmp_path / "transfer.csv"
    assert lr_transfer.main([str(both), "--axis", "depth", "--out", str(out), "--by-preset"]) == 2
    assert "holds no norm.* key: the study ran one norm preset; name it (--norm)" in capsys.readouterr().err
    assert lr_transfer.main([str(both), "--axis", "depth", "--out", str(out), "--by-preset", "--norm", "pre_ln"]) == 0
    shifts = {r["family"]: float(r["shift_mean"]) for r in read_csv(out)}
    assert shifts == pytest.approx({"pre_ln sp": -1.0, "pre_ln completep": 0.0}, abs=1e-12)
    alone = _depth_cells(tmp_path / "alone.csv", {"": -2.0})  # at depth 8 the bowl's minimum, 2^-13, is off the grid
    assert lr_transfer.main([str(alone), "--axis", "depth", "--out", str(out), "--by-preset", "--norm", "post_ln"]) == 0
    # the edge's LR stands in for it: log2 best LR -9, -11, -12 over log2 depth 1, 2, 3
    assert [(r["family"], float(r["shift_mean"])) for r in read_csv(out)] == [("post_ln", pytest.approx(-1.5, abs=1e-12))]
    at = {r["point"]: (r["n"], float(r["best_lr"]), r["at_edge"]) for r in read_csv(out.with_name("transfer_points.csv"))}
    assert at == {"2": ("1", 2.0**-9, "0"), "4": ("1", pytest.approx(2.0**-11), "0"), "8": ("1", 2.0**-12, "1")}
    with pytest.raises(SystemExit):  # --norm without --by-preset, and a preset that does not exist
        lr_transfer.main([str(both), "--axis", "depth", "--out", str(out), "--norm", "pre_ln"])
    with pytest.raises(SystemExit):
        lr_transfer.main([str(both), "--axis", "depth", "--out", str(out), "--by-preset", "--norm", "pre_lm"])
