"""docs/results.md's finding (i), before its runs: the pilot's committed CSVs are what ``scripts.report_lrs`` and
``scripts.seeds_needed`` give from its report cells, and the study preset runs the seeds the plan asked for, the ones
the claims file fixes, over the LR-sensitivity study's grid with both optimizers."""

from pathlib import Path

import yaml

from scripts import report_lrs, seeds_needed
from tests.helpers.csvs import read_csv
from tests.helpers.results import sweep_params

ROOT = Path(__file__).parents[1]
STUDY = ROOT / "docs" / "results" / "lr_sensitivity_optim"
PILOT = STUDY / "pilot"


def test_the_pilot_csvs_are_what_the_scripts_give_from_its_cells(tmp_path: Path) -> None:
    out = tmp_path / "lrs.csv"
    assert report_lrs.main([str(PILOT / "report_cells.csv"), "--out", str(out), "--baseline", "pre_ln", "--by-preset"]) == 0
    for name in ("lrs.csv", "lrs_seeds.csv", "lr_sensitivity.csv"):
        assert (tmp_path / name).read_text() == (PILOT / name).read_text(), name
    plan = tmp_path / "seeds_needed.csv"
    args = [str(PILOT / "lrs_seeds.csv"), "--family", "post_ln", "--baseline", "pre_ln", "--out", str(plan)]
    assert seeds_needed.main(args) == 0
    assert plan.read_text() == (PILOT / "seeds_needed.csv").read_text()


def test_the_pilot_is_muon_on_pre_ln_and_post_ln_over_the_whole_grid_every_run_finished() -> None:
    grid = sorted(float(lr) for lr in sweep_params("lr_sensitivity")["optim.lr"])
    cells = read_csv(PILOT / "report_cells.csv")
    assert {r["state"] for r in cells} == {"finished"}
    assert sorted((r["family"], int(r["seed"]), float(r["lr"])) for r in cells) == sorted(
        (f, s, lr) for f in {r["family"] for r in cells} for s in (0, 1, 2) for lr in grid
    )
    assert sorted({r["family"] for r in read_csv(PILOT / "lr_sensitivity.csv")}) == ["post_ln", "pre_ln"]


def test_the_study_runs_the_seeds_of_the_plan_and_the_claims_both_optimizers_over_the_grid() -> None:
    (plan,) = read_csv(PILOT / "seeds_needed.csv")
    claims = yaml.safe_load((STUDY / "claims.yaml").read_text())
    params = sweep_params("lr_sensitivity_optim")
    seeds = [int(s) for s in params["seed"]]
    assert seeds == claims["seeds"] == list(range(max(int(plan["n_point"]), int(plan["n_upper"]))))
    assert params["optim"] == ["adamw", "muon"] and params["optim.lr"] == sweep_params("lr_sensitivity")["optim.lr"]
    assert params["norm"] == ["post_ln", "pre_ln", "pre_rms", "pre_ln_qk", "olmo2"]
    # every family a claim names is a norm preset and an optimizer preset the two commands run
    clip = {f"{n} muon_qk_clip" for n in ("post_ln", "pre_ln", "pre_rms")}
    run = {f"{n} {o}" for n in params["norm"] for o in params["optim"]} | clip
    named = {side["family"] for c in claims["claims"] for side in (c["arm"], c["baseline"])}
    assert named <= run and clip <= named
