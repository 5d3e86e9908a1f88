"""docs/results.md's finding (i): the pilot's committed CSVs are what ``scripts.report_lrs`` and
``scripts.seeds_needed`` give from its report cells, the study preset runs the seeds the plan asked for, the ones
the claims file fixes, over the LR-sensitivity study's grid with both optimizers, and the study's CSVs are what the
scripts give from its runs, with the facts the page's prose reads from them."""

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


FAMILIES = [f"{n} {o}" for n in ("post_ln", "pre_ln", "pre_rms", "pre_ln_qk", "olmo2") for o in ("adamw", "muon")] + [
    f"{n} muon_qk_clip" for n in ("post_ln", "pre_ln", "pre_rms")
]


def test_the_study_csvs_are_what_report_lrs_gives_from_its_report_cells_and_the_study_is_whole(tmp_path: Path) -> None:
    cells = STUDY / "report_cells.csv"  # the report's lr_sensitivity.csv of both sweeps' run dirs, long labels
    args = [str(cells), "--out", str(tmp_path / "lrs.csv"), "--baseline", "pre_ln adamw", "--by-preset"]
    assert report_lrs.main(args) == 0
    for name in ("lrs.csv", "lrs_seeds.csv", "lr_sensitivity.csv"):
        assert (tmp_path / name).read_text() == (STUDY / name).read_text(), name
    rows = read_csv(cells)  # every family, LR and seed of the two commands; every run finished
    assert len(rows) == len(FAMILIES) * 7 * 3 and {r["state"] for r in rows} == {"finished"}
    assert sorted(r["family"] for r in read_csv(STUDY / "lrs.csv")) == sorted(FAMILIES)


def test_the_qk_weight_norms_come_from_the_runs_of_the_cells() -> None:
    # scripts.run_values on the same run dirs: its max logit is the cells' max_attn_logit, cell for cell
    values = {(r["family"], r["seed"], r["lr"]): r for r in read_csv(STUDY / "qk_weights.csv")}
    cells = {(r["family"], r["seed"], r["lr"]): r for r in read_csv(STUDY / "lr_sensitivity.csv")}
    assert values.keys() == cells.keys()
    for key, row in values.items():
        assert float(row["max_logit"]) == float(cells[key]["max_attn_logit"]), key
        assert float(row["qk_sigma_max"]) > 0, key


def test_qk_clip_runs_are_the_muon_runs_to_the_last_digit_below_the_lrs_where_it_acts() -> None:
    # the page: the clipped runs equal the Muon runs at every LR up to 0.03 (pre-LN, pre-RMSNorm) and 0.01 (post-LN),
    # so the loss claims' paired differences are exactly 0 ("zero spread"); above, the clip changes every run
    cells = {(r["family"], r["seed"], r["lr"]): r for r in read_csv(STUDY / "lr_sensitivity.csv")}
    weights = {(r["family"], r["seed"], r["lr"]): r for r in read_csv(STUDY / "qk_weights.csv")}
    highest_equal = {"pre_ln": 0.03, "pre_rms": 0.03, "post_ln": 0.01}
    for (family, seed, lr), clip in cells.items():
        norm, optim = family.split()
        if optim != "muon_qk_clip":
            continue
        muon = (f"{norm} muon", seed, lr)
        same = [clip[k] == cells[muon][k] for k in ("capped_loss", "max_attn_logit")]
        same.append(weights[(family, seed, lr)]["qk_sigma_max"] == weights[muon]["qk_sigma_max"])
        assert same == [float(lr) <= highest_equal[norm]] * 3, (family, seed, lr, same)


def test_the_study_repeats_the_pilot_s_runs_to_the_last_digit() -> None:
    # the page: the pilot's cells (Muon, pre-LN and post-LN, seeds 0-2) are the study's, so the claim the pilot sized
    # was written after its data had been seen
    study = {(r["family"], r["seed"], r["lr"]): r for r in read_csv(STUDY / "lr_sensitivity.csv")}
    pilot = read_csv(PILOT / "lr_sensitivity.csv")
    assert {r["family"] for r in pilot} == {"pre_ln", "post_ln"} and len(pilot) == 2 * 7 * 3
    for row in pilot:
        twin = study[(f"{row['family']} muon", row["seed"], row["lr"])]
        assert [row[k] for k in ("final_val_loss", "max_attn_logit")] == [twin[k] for k in ("final_val_loss", "max_attn_logit")]
