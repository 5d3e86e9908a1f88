"""scripts.report_contrasts / analysis.contrasts: paired contrasts from per-run CSVs against hand computations, against
the report CLIs' own numbers for the same contrasts, and the committed ``paired.csv`` files as the CLI writes them."""

import csv
from pathlib import Path

import pytest

from scripts import report_contrasts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
SPECS = sorted(RESULTS.rglob("paired.yaml"))  # every committed spec
RUNS = """arm,max_tokens,seed,state,loss
ln,256,0,finished,1.0
ln,256,1,finished,2.0
ln,256,2,finished,3.0
bn,256,0,finished,1.5
bn,256,1,finished,2.4
bn,256,2,finished,3.8
ln,1024,0,finished,1.0
ln,1024,1,finished,1.0
ln,1024,2,finished,1.0
bn,1024,0,finished,1.1
bn,1024,1,finished,1.1
bn,1024,2,finished,1.2
bn,1024,3,diverged,9.0
"""


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def run(tmp_path: Path, spec: str) -> tuple[int, list[dict[str, str]]]:
    (tmp_path / "runs.csv").write_text(RUNS)
    (tmp_path / "spec.yaml").write_text(spec)
    code = report_contrasts.main([str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "out.csv")])
    return code, rows(tmp_path / "out.csv") if code == 0 else []


def test_a_paired_difference_and_its_relative_interval(tmp_path: Path) -> None:
    # bn - ln at 256: 0.5, 0.4, 0.8: mean 0.56667, sd 0.208167, t(0.975, 2) 4.302653: [0.049552, 1.083782]; over ln's mean 2
    spec = """contrasts:
  - {contrast: bn - ln, csv: runs.csv, metric: loss, arm: {arm: bn, max_tokens: 256}, baseline: {arm: ln, max_tokens: 256},
     relative: true}
"""
    code, (row,) = run(tmp_path, spec)
    assert code == 0 and row["pairs"] == "3" and row["significant"] == "True"
    for key, want in (("diff_mean", 0.566667), ("diff_ci95_lo", 0.049552), ("diff_ci95_hi", 1.083782),
                      ("rel_diff", 0.283333), ("rel_ci95_lo", 0.024776), ("rel_ci95_hi", 0.541891)):  # fmt: skip
        assert float(row[key]) == pytest.approx(want, abs=2e-6), key


def test_a_difference_of_differences_pairs_by_seed_and_skips_unfinished_runs(tmp_path: Path) -> None:
    # (bn - ln) at 256: 0.5, 0.4, 0.8; at 1024: 0.1, 0.1, 0.2 (seed 3 diverged: left out): 0.4, 0.3, 0.6, mean 0.4333
    spec = """contrasts:
  - contrast: "bn - ln: 256 - 1024"
    csv: runs.csv
    metric: loss
    arm: {arm: bn, max_tokens: 256}
    baseline: {arm: ln, max_tokens: 256}
    minus: {arm: {arm: bn, max_tokens: 1024.0}, baseline: {arm: ln, max_tokens: 1024}}  # 1024.0 selects "1024"
"""
    code, (row,) = run(tmp_path, spec)
    assert code == 0 and row["pairs"] == "3" and row["rel_diff"] == ""
    assert float(row["diff_mean"]) == pytest.approx(0.43333, abs=1e-5)
    assert float(row["diff_ci95_lo"]) == pytest.approx(0.43333 - 4.30265 * 0.152753 / 3**0.5, abs=1e-5)


@pytest.mark.parametrize(
    "entry, words",
    [
        (
            "{contrast: c, csv: runs.csv, metric: lost, arm: {arm: bn}, baseline: {arm: ln}}",
            "contrast 'c': runs.csv has no column 'lost'; valid: arm",
        ),
        ("{contrast: c, csv: nope.csv, metric: loss, arm: {arm: bn}, baseline: {arm: ln}}", "contrast 'c': no CSV nope.csv"),
        ("{contrast: c, csv: runs.csv, metric: loss, arm: {arm: rms}, baseline: {arm: ln}}", "no finished row"),
        (
            "{contrast: c, csv: runs.csv, metric: loss, arm: {arm: bn}, baseline: {arm: ln}, sign: 1}",
            "unknown key 'sign'; valid: contrast",
        ),
        (
            "{contrast: c, csv: runs.csv, metric: loss, arm: {arm: bn, max_tokens: 256}, baseline: {arm: ln, max_tokens: 256},"
            " relative: true, minus: {arm: {arm: bn, max_tokens: 1024}, baseline: {arm: ln, max_tokens: 1024}}}",
            "not with 'minus'",
        ),
        (
            "{contrast: c, csv: runs.csv, metric: loss, arm: {arm: bn}, baseline: {arm: ln}}",
            "matches more than one row of runs.csv with seed=0",
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, capsys, entry: str, words: str) -> None:
    code, _ = run(tmp_path, f"contrasts:\n  - {entry}\n")
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "out.csv").exists()


def test_a_spec_that_is_not_a_list_of_contrasts_is_refused(tmp_path: Path, capsys) -> None:
    assert report_contrasts.main([str(tmp_path / "missing.yaml")]) == 2
    (tmp_path / "s.yaml").write_text("contrasts: 3\n")
    assert report_contrasts.main([str(tmp_path / "s.yaml")]) == 2
    assert "no spec file" in capsys.readouterr().err.splitlines()[0]


def test_the_same_contrasts_as_the_report_clis(tmp_path: Path) -> None:
    # DyT - LN at 0.01 (scripts.report_regime's regime.csv) and BatchNorm's 256 - 1024 difference of differences in PER
    # (scripts.report_batch_vs_layer's contrasts.csv), recomputed from the per-run CSVs, agree to float rounding.
    spec = f"""contrasts:
  - {{contrast: dyt, csv: {RESULTS}/dyt_data_regime/regime_runs.csv, metric: final_val_loss,
     arm: {{preset: pre_dyt, train_fraction: 0.01}}, baseline: {{preset: pre_ln, train_fraction: 0.01}}, relative: true}}
  - contrast: bn
    csv: {RESULTS}/batch_vs_layer/runs.csv
    metric: test/per
    arm: {{arm: batchnorm, max_tokens: 256}}
    baseline: {{arm: layernorm, max_tokens: 256}}
    minus: {{arm: {{arm: batchnorm, max_tokens: 1024}}, baseline: {{arm: layernorm, max_tokens: 1024}}}}
"""
    code, (dyt, bn) = run(tmp_path, spec)
    assert code == 0
    regime = next(
        r for r in rows(RESULTS / "dyt_data_regime" / "regime.csv") if r["preset"] == "pre_dyt" and r["train_fraction"] == "0.01"
    )
    contrasts = rows(RESULTS / "batch_vs_layer" / "contrasts.csv")
    batch = next(
        r for r in contrasts if r["contrast"] == "batchnorm - layernorm: 256 - 1024 tokens" and r["metric"] == "test/per"
    )
    for mine, theirs, keys in ((dyt, regime, ("diff_mean", "diff_ci95_lo", "diff_ci95_hi", "rel_diff")),
                               (bn, batch, ("diff_mean", "diff_ci95_lo", "diff_ci95_hi"))):  # fmt: skip
        for key in keys:
            assert float(mine[key]) == pytest.approx(float(theirs[key]), rel=1e-12, abs=1e-15), key


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.parent.name)
def test_the_committed_paired_csv_is_what_the_cli_writes(tmp_path: Path, spec: Path) -> None:
    assert report_contrasts.main([str(spec), "--out", str(tmp_path / "paired.csv")]) == 0
    assert (tmp_path / "paired.csv").read_text() == spec.with_suffix(".csv").read_text()
