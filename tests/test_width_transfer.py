"""docs/results.md's finding (k): the presets run the seeds the claims fix over one LR grid, and the committed CSVs are
what scripts.lr_transfer gives from the report cells of the runs, with the facts the page's prose reads from them."""

from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from analysis.variants import label_pairs
from scripts import lr_transfer
from tests.helpers.csvs import read_csv
from tests.helpers.results import sweep_params

STUDY = Path(__file__).parents[1] / "docs" / "results" / "width_transfer"
CLAIMS = yaml.safe_load((STUDY / "claims.yaml").read_text())


class Study(NamedTuple):
    axis: str  # lr_transfer's --axis
    preset: str  # the +experiment both sweeps ran
    scaled: str  # the parametrization set against sp
    base: str  # the run keys of its base point, where every factor of `scaled` is 1


BASE_DEPTH = "model.n_enc_layers=2 model.n_dec_layers=2"
STUDIES = {  # docs/results/width_transfer/<dir>
    "depth": Study("depth", "depth_transfer", "completep", BASE_DEPTH),
    "depth_untied": Study("depth", "depth_transfer", "completep", BASE_DEPTH),  # model.tie_embeddings=false
    "width": Study("width", "width_transfer", "mup", "model.d_model=64 model.d_ff=256"),
}
PARAMETRIZATION_KEYS = ("model.parametrization", "model.base_d_model", "model.base_depth")


def test_the_presets_run_the_claims_seeds_over_the_lr_sensitivity_study_s_grid() -> None:
    for preset in ("width_transfer", "depth_transfer"):
        params = sweep_params(preset)
        assert [int(s) for s in params["seed"]] == CLAIMS["seeds"], preset
        assert params["optim.lr"] == ["3e-4", "1e-3", "3e-3", "1e-2", "3e-2"], preset
    named = {side["family"] for c in CLAIMS["claims"] for side in (c["arm"], c.get("baseline")) if side}
    norms = sweep_params("width_transfer")["norm"] + sweep_params("depth_transfer")["norm"]
    assert {name.split()[0] for name in named} == set(norms)


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_the_csvs_are_what_lr_transfer_gives_from_the_report_cells_and_every_run_finished(study: str, tmp_path: Path) -> None:
    cells = STUDY / study / "report_cells.csv"  # the report's lr_sensitivity.csv of both sweeps' run dirs
    axis, preset = STUDIES[study].axis, STUDIES[study].preset
    params = sweep_params(preset)
    norm = ["--norm", *params["norm"]] if len(params["norm"]) == 1 else []  # a study of one preset: the labels hold none
    assert lr_transfer.main([str(cells), "--axis", axis, "--out", str(tmp_path / "transfer.csv"), "--by-preset", *norm]) == 0
    for name in ("transfer.csv", "transfer_seeds.csv", "transfer_points.csv", "transfer_grid.csv"):
        assert (tmp_path / name).read_text() == (STUDY / study / name).read_text(), name
    points = params[axis]
    rows = read_csv(cells)
    assert len(rows) == 2 * len(params["norm"]) * len(points) * len(params["optim.lr"]) * len(CLAIMS["seeds"])
    assert {r["state"] for r in rows} == {"finished"}


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_at_the_base_point_the_scaled_parametrization_s_runs_equal_sp_s_to_the_last_digit(study: str) -> None:
    # every factor of mup (completep) is 1 at its base width (depth): the runs there are sp's, bit for bit
    _, preset, scaled, base = STUDIES[study]
    by_arm: dict[str, dict[tuple[str, str, str], str]] = {"sp": {}, scaled: {}}
    for row in read_csv(STUDY / study / "report_cells.csv"):
        pairs = label_pairs(row["family"])
        if all(pair in row["family"].split() for pair in base.split()):
            rest = " ".join(f"{k}={v}" for k, v in pairs.items() if k not in PARAMETRIZATION_KEYS)
            by_arm[pairs["model.parametrization"]][(rest, row["seed"], row["lr"])] = row["final_val_loss"]
    params = sweep_params(preset)
    assert len(by_arm["sp"]) == len(params["norm"]) * len(params["optim.lr"]) * len(CLAIMS["seeds"])
    assert by_arm[scaled] == by_arm["sp"]


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_the_scaled_parametrization_s_best_lr_moves_less_than_sp_s_in_every_family_and_seed(study: str) -> None:
    # the page's readings, across depth (tied and untied) and width: each seed's absolute shift is smaller
    _, preset, scaled, _ = STUDIES[study]
    shift = {(r["family"], r["seed"]): float(r["abs_shift"]) for r in read_csv(STUDY / study / "transfer_seeds.csv")}
    for norm in sweep_params(preset)["norm"]:
        for seed in map(str, CLAIMS["seeds"]):
            assert shift[f"{norm} {scaled}", seed] < shift[f"{norm} sp", seed], (norm, seed)


def _depth_cells(study: str = "depth") -> dict[tuple[str, int, str], dict[str, float]]:
    """(parametrization, blocks per stack, seed) -> {lr: capped final loss} of a depth study's report cells."""
    grids: dict[tuple[str, int, str], dict[str, float]] = {}
    for row in read_csv(STUDY / study / "report_cells.csv"):
        pairs = label_pairs(row["family"])
        key = (pairs["model.parametrization"], int(pairs["model.n_enc_layers"]), row["seed"])
        grids.setdefault(key, {})[row["lr"]] = float(row["capped_loss"])
    return grids


def test_on_the_grid_the_best_lr_of_the_depth_study_never_moves_and_the_read_shift_is_under_a_grid_step() -> None:
    # the page: the lowest loss on the grid is at 3e-3 everywhere but one seed at 2 blocks (1e-2), which both arms share
    argmins = {key: min(grid, key=grid.__getitem__) for key, grid in _depth_cells().items()}
    assert {key for key, lr in argmins.items() if lr != "0.003"} == {("sp", 2, "1"), ("completep", 2, "1")}
    assert {argmins["sp", 2, "1"], argmins["completep", 2, "1"]} == {"0.01"}
    best = {(r["family"], r["point"]): float(r["best_lr"]) for r in read_csv(STUDY / "depth" / "transfer_points.csv")}
    step = 3e-3 / 1e-3  # the grid's narrowest step
    moved = {arm: best[f"pre_ln {arm}", "2"] / best[f"pre_ln {arm}", "8"] for arm in ("sp", "completep")}
    assert 1 < moved["completep"] < moved["sp"] < step


def test_completep_s_4_block_best_lr_is_pulled_down_by_one_run_far_above_its_seeds() -> None:
    # the page: seed 0 at lr 1e-2 and 4 blocks ended far above the other two seeds
    grids = _depth_cells()
    loss = {seed: grids["completep", 4, seed]["0.01"] for seed in ("0", "1", "2")}
    assert loss["0"] - max(loss["1"], loss["2"]) > 0.4  # every run finished: the test of the CSVs above


def test_untied_the_grid_s_best_lr_falls_a_step_under_sp_and_stays_under_completep_in_every_seed() -> None:
    # the control's reading: at 2 blocks both arms' lowest loss is at 1e-2; deeper, sp's is at 3e-3, completep's stays
    grids = _depth_cells("depth_untied")
    argmins = {key: min(grid, key=grid.__getitem__) for key, grid in grids.items()}
    assert len(argmins) == 2 * 3 * len(CLAIMS["seeds"])
    assert {key for key, lr in argmins.items() if lr != "0.01"} == {("sp", n, str(s)) for n in (4, 8) for s in CLAIMS["seeds"]}
    assert {argmins["sp", n, str(s)] for n in (4, 8) for s in CLAIMS["seeds"]} == {"0.003"}
    near_tie = grids["completep", 4, "0"]  # the page: they differ in the fourth decimal only
    assert 1e-4 < near_tie["0.003"] - near_tie["0.01"] < 1e-3


def test_the_control_s_runs_are_not_the_tied_study_s() -> None:
    # the report cells do not name model.tie_embeddings (both sweeps of a study share it): at the base depth every run
    # of a seed starts from one loss in either study, and the control's is another than the tied study's
    def init(study: str) -> dict[str, set[str]]:
        by_seed: dict[str, set[str]] = {}
        for row in read_csv(STUDY / study / "report_cells.csv"):
            if label_pairs(row["family"])["model.n_enc_layers"] == "2":
                by_seed.setdefault(row["seed"], set()).add(row["init_loss"])
        return by_seed

    tied, untied = init("depth"), init("depth_untied")
    assert all(len(tied[seed]) == len(untied[seed]) == 1 for seed in tied)
    assert all(abs(float(min(tied[seed])) - float(min(untied[seed]))) > 0.01 for seed in map(str, CLAIMS["seeds"]))


def test_across_width_mup_s_loss_falls_no_best_lr_is_at_the_edge_and_only_olmo2_s_mup_interval_excludes_0() -> None:
    # the page's reading across width; and under sp every family's interval excludes 0, under mup all but OLMo 2's cover it
    points = read_csv(STUDY / "width" / "transfer_points.csv")
    assert {r["at_edge"] for r in points} == {"0"}
    for norm in sweep_params("width_transfer")["norm"]:  # under mup the lowest final loss falls with width
        best = [float(r["best_loss"]) for r in sorted(points, key=lambda r: int(r["point"])) if r["family"] == f"{norm} mup"]
        assert len(best) == 3 and best == sorted(best, reverse=True), norm
    covers = {r["family"]: float(r["ci95_lo"]) < 0 < float(r["ci95_hi"]) for r in read_csv(STUDY / "width" / "transfer.csv")}
    assert {family for family, yes in covers.items() if yes} == {f"{n} mup" for n in ("pre_ln", "post_ln", "pre_rms", "pre_dyt")}
