"""docs/results.md's finding (j): the study preset runs the seeds the plan and the claims fix, over the LR-sensitivity
study's grid with every attention control, and the committed CSVs are what the scripts give from its runs, with the
facts the page's prose reads from them."""

from pathlib import Path

import yaml

from scripts import report_lrs
from tests.helpers.config import default_g2p_data
from tests.helpers.csvs import read_csv
from tests.helpers.results import sweep_params

STUDY = Path(__file__).parents[1] / "docs" / "results" / "attn_controls"
CONTROLS = ("none", "qk_norm", "gate", "sink", "softpick", "softcap")
# --by-preset's names: attn=none is the plain pre_ln, attn=qk_norm what norm=pre_ln_qk sets
FAMILIES = ["pre_ln", "pre_ln_qk", *(f"pre_ln {c}" for c in CONTROLS[2:])]


def test_the_study_runs_the_seeds_of_the_plan_and_the_claims_every_control_over_the_grid() -> None:
    (plan,) = read_csv(STUDY / "seeds_needed.csv")
    claims = yaml.safe_load((STUDY / "claims.yaml").read_text())
    params = sweep_params("attn_controls")
    assert [int(s) for s in params["seed"]] == claims["seeds"] == list(range(int(plan["n_upper"])))
    assert params["attn"] == list(CONTROLS) and params["optim.lr"] == sweep_params("lr_sensitivity")["optim.lr"]
    named = {side["family"] for c in claims["claims"] for side in (c["arm"], c["baseline"])}
    assert named == set(FAMILIES)


def test_the_csvs_are_what_report_lrs_gives_from_the_report_cells_and_every_run_finished(tmp_path: Path) -> None:
    cells = STUDY / "report_cells.csv"  # the report's lr_sensitivity.csv of the sweep's run dirs, long labels
    assert report_lrs.main([str(cells), "--out", str(tmp_path / "lrs.csv"), "--baseline", "pre_ln", "--by-preset"]) == 0
    for name in ("lrs.csv", "lrs_seeds.csv", "lr_sensitivity.csv"):
        assert (tmp_path / name).read_text() == (STUDY / name).read_text(), name
    rows = read_csv(cells)
    assert len(rows) == len(FAMILIES) * 7 * 3 and {r["state"] for r in rows} == {"finished"}
    assert sorted(r["family"] for r in read_csv(STUDY / "lrs.csv")) == sorted(FAMILIES)


def test_the_diagnostics_come_from_the_runs_of_the_cells() -> None:
    values = {(r["family"], r["seed"], r["lr"]): r for r in read_csv(STUDY / "diagnostics.csv")}
    cells = {(r["family"], r["seed"], r["lr"]): r for r in read_csv(STUDY / "lr_sensitivity.csv")}
    assert values.keys() == cells.keys()
    for key, row in values.items():
        assert row["state"] == cells[key]["state"] == "finished", key
        assert 0.0 <= float(row["sink_mass"]) <= 1.0 and float(row["massive"]) >= 1.0, key


def test_the_soft_cap_bounds_the_logits_the_softmax_reads_by_construction() -> None:
    # the claims file: under the soft-cap, max_attn_logit is the capped logit, at most Gemma 2's cap (50) at every cell
    cap = yaml.safe_load((Path(__file__).parents[1] / "conf" / "attn" / "softcap.yaml").read_text())["model"]["attn_softcap"]
    logits = [float(r["max_attn_logit"]) for r in read_csv(STUDY / "lr_sensitivity.csv") if r["family"] == "pre_ln softcap"]
    assert cap == 50.0 and len(logits) == 21 and max(logits) <= cap  # tanh rounds to 1 in float32 at high LRs


def test_softpick_s_floor_changed_only_the_runs_that_had_diverged() -> None:
    # the page: before the floor on m (model.attn_weights.softpick) every softpick run at lr >= 0.03 diverged; run again
    # after it, the runs below lr 0.03 equal the first ones to the last digit, and those that had diverged finish
    now = {(r["seed"], r["lr"]): r for r in read_csv(STUDY / "lr_sensitivity.csv") if r["family"] == "pre_ln softpick"}
    before = read_csv(STUDY / "softpick_before_floor.csv")
    assert len(before) == len(now) == 21
    for row in before:
        twin = now[(row["seed"], row["lr"])]
        if float(row["lr"]) < 0.03:
            assert [row[k] for k in ("final_val_loss", "max_attn_logit", "state")] == [
                twin[k] for k in ("final_val_loss", "max_attn_logit", "state")
            ], row
        else:
            assert (row["state"], row["capped_loss"], twin["state"]) == ("diverged", row["init_loss"], "finished"), row


def test_uniform_attention_puts_on_the_first_key_what_pre_ln_s_attention_does() -> None:
    # the page: on CMUdict's words uniform attention alone puts about pre-LN's share on the first key, so no sink forms.
    # Its value per site (docs/telemetry.md): the mean over real queries of 1 / (keys it sees), over the training words;
    # the diagnostic is the mean over the 12 sites: 4 encoder self-attentions, 4 decoder self- and 4 cross-attentions
    train = default_g2p_data()[2]["train"]
    src = [len(s) + 1 for s in train.src]  # + EOS
    tgt = [len(t) + 1 for t in train.tgt]  # BOS + tokens
    enc_self = len(src) / sum(src)
    cross = sum(t / s for s, t in zip(src, tgt, strict=True)) / sum(tgt)
    dec_self = sum(sum(1 / (k + 1) for k in range(t)) for t in tgt) / sum(tgt)
    uniform = (enc_self + cross + dec_self) / 3
    pre_ln = [float(r["sink_mass"]) for r in read_csv(STUDY / "diagnostics.csv") if (r["family"], r["lr"]) == ("pre_ln", "0.003")]
    assert len(pre_ln) == 3 and min(pre_ln) < uniform < max(pre_ln)
