"""scripts/report_batch_vs_layer.py: arms, per-run values and the paired contrasts, on run dirs written by hand."""

import csv
from pathlib import Path

import pytest

from analysis.load import ReportError, load_runs
from reporting.batch_vs_layer import write_csvs
from scripts import report_batch_vs_layer as bvl
from tests.helpers.runs import config, finished, write_run

# (arm, max_tokens) -> test PER of seeds 0, 1, 2
PER = {
    ("layernorm", 256): (0.50, 0.52, 0.54),
    ("layernorm", 1024): (0.30, 0.31, 0.33),
    ("batchnorm", 256): (0.70, 0.75, 0.77),
    ("batchnorm", 1024): (0.35, 0.37, 0.38),
    ("powernorm", 256): (0.55, 0.56, 0.60),
    ("batchnorm_both", 1024): (0.90, 0.91, 0.92),
}


def rows(arm: str, seed: int) -> list[dict]:
    """Two validations (the loss with batch statistics where the arm reads the batch) and two bstat records."""
    val = [{"step": 0, "val/loss": 4.0}]
    for step, loss in ((50, 2.0 + seed / 10), (100, 1.5 + seed / 10)):
        row = {"step": step, "val/loss": loss}
        if arm != "layernorm":
            row["val/loss_batch_stats"] = loss + 0.25 * (1 + seed)
        val.append(row)
    for step, dist in ((1, 0.1), (50, 0.3)):  # the first norm and a later one: only the first counts
        stat = "phi_dist" if arm == "powernorm" else "mean_dist"
        if arm != "layernorm":
            val.append({"step": step, f"bstat/enc.0.self_attn.norm_in/{stat}": dist * (1 + seed),
                        f"bstat/enc.0.ffn.norm_in/{stat}": 9.0})  # fmt: skip
    return val


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for (arm, tokens), pers in PER.items():
        kind = arm.removesuffix("_both")
        for seed, per in enumerate(pers):
            extra = {"trainer.max_tokens": tokens, "norm.decoder_batch_stats": arm.endswith("_both")}
            write_run(tmp_path / f"{arm},{tokens},{seed}", config("pre", kind, seed, **extra), rows(arm, seed), finished(per))
    return tmp_path


def read(path: Path, *key: str) -> dict[tuple, dict]:
    with path.open(newline="") as f:
        return {tuple(r[k] for k in key): r for r in csv.DictReader(f)}


def test_runs_summary_and_contrasts_by_hand(sweep: Path, tmp_path: Path) -> None:
    assert bvl.main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    runs = read(tmp_path / "out" / "runs.csv", "arm", "max_tokens", "seed")
    bn = runs["batchnorm", "256", "1"]
    assert float(bn["final_val_loss"]) == pytest.approx(1.6) and float(bn["best_val_loss"]) == pytest.approx(1.6)
    assert float(bn["train_eval_gap"]) == pytest.approx(0.5)  # 0.25 * (1 + seed), at the last validation
    assert float(bn["first_norm_mean_dist"]) == pytest.approx(0.3 * 2)  # records after step 1, first norm only
    assert bn["first_norm_phi_dist"] == "" and runs["layernorm", "256", "0"]["train_eval_gap"] == ""
    assert float(bn["final_val_loss_batch_stats"]) == pytest.approx(2.1)  # 1.6 + 0.5
    ln = runs["layernorm", "256", "2"]  # no batch-reading norm: its val/loss is the loss with batch statistics
    assert float(ln["final_val_loss_batch_stats"]) == float(ln["final_val_loss"]) == pytest.approx(1.7)
    assert float(runs["powernorm", "256", "2"]["first_norm_phi_dist"]) == pytest.approx(0.9)
    summary = read(tmp_path / "out" / "summary.csv", "arm", "max_tokens", "metric")
    row = summary["batchnorm", "256", "test/per"]
    assert (row["runs"], row["finished"], row["n"], float(row["mean"])) == ("3", "3", "3", pytest.approx(0.74))
    sd = (sum((v - 0.74) ** 2 for v in (0.70, 0.75, 0.77)) / 2) ** 0.5  # the t interval of the mean
    assert float(row["ci95_hi"]) - 0.74 == pytest.approx(4.302652729911275 * sd / 3**0.5)
    # minus LayerNorm at 256 tokens, seed by seed: 0.20, 0.23, 0.23 -> mean 0.22, sd 0.01732, t(0.975, 2) = 4.3027
    half = 4.302652729911275 * 0.017320508075688773 / 3**0.5
    assert float(row["diff_mean"]) == pytest.approx(0.22)
    assert (float(row["diff_ci95_lo"]), float(row["diff_ci95_hi"])) == (pytest.approx(0.22 - half), pytest.approx(0.22 + half))
    assert (row["pairs"], row["significant"]) == ("3", "True")
    assert summary["layernorm", "256", "test/per"]["diff_mean"] == ""  # the baseline's own row
    assert ("batchnorm_both", "256", "test/per") not in summary  # no such run
    assert summary["batchnorm_both", "1024", "test/per"]["diff_mean"] != ""
    contrasts = read(tmp_path / "out" / "contrasts.csv", "contrast", "metric")
    # (BN - LN) at 256 tokens minus at 1024, by seed: 0.20 - 0.05, 0.23 - 0.06, 0.23 - 0.05 = 0.15, 0.17, 0.18
    inter = contrasts["batchnorm - layernorm: 256 - 1024 tokens", "test/per"]
    assert (inter["pairs"], float(inter["diff_mean"])) == ("3", pytest.approx(0.5 / 3))
    assert ("powernorm - layernorm: 256 - 1024 tokens", "test/per") not in contrasts  # no powernorm at 1024
    pn_bn = contrasts["powernorm - batchnorm at 256 tokens", "test/per"]
    assert float(pn_bn["diff_mean"]) == pytest.approx((0.55 + 0.56 + 0.60 - 0.70 - 0.75 - 0.77) / 3)
    assert ("powernorm - batchnorm at 1024 tokens", "test/per") not in contrasts


def test_an_unfinished_run_is_counted_not_averaged_and_a_repeated_seed_is_an_error(sweep: Path, tmp_path: Path) -> None:
    cfg = config("pre", "batchnorm", 3, **{"trainer.max_tokens": 256})
    write_run(sweep / "batchnorm,256,3", cfg, rows("batchnorm", 3), {"state": "diverged", "step": 40})
    assert bvl.main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    row = read(tmp_path / "out" / "summary.csv", "arm", "max_tokens", "metric")["batchnorm", "256", "test/per"]
    assert (row["runs"], row["finished"], row["n"], float(row["mean"])) == ("4", "3", "3", pytest.approx(0.74))
    write_run(sweep / "again", config("pre", "batchnorm", 0, **{"trainer.max_tokens": 256}), rows("batchnorm", 0), finished(0.1))
    with pytest.raises(ReportError, match=r"seed 0 is missing or repeated in arm batchnorm at 256 tokens"):
        write_csvs(load_runs([sweep]), tmp_path)


def test_no_runs_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert bvl.main([str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("report_batch_vs_layer: error: no run directories")


def test_an_out_that_is_an_existing_file_is_one_line_and_the_file_is_kept(sweep, tmp_path, capsys):
    taken = tmp_path / "notes.txt"
    taken.write_text("keep")
    assert bvl.main([str(sweep), "--out", str(taken)]) == 1
    assert capsys.readouterr().err == (f"report_batch_vs_layer: error: --out {taken} is a file, not a folder; "
                                       "give a folder for the CSVs\n")  # fmt: skip
    assert taken.read_text() == "keep"
