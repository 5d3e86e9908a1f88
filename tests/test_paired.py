"""Seed statistics: analysis/paired.py's paired t test on hand examples, and the report's ``--baseline`` Δ columns,
noise floor line and ``summary.csv`` on a synthetic sweep of 3 variants x 3 seeds with one diverged run."""

import csv
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from analysis import presets
from analysis.load import ReportError, load_runs
from analysis.lrs import lr_study
from analysis.paired import (
    BASELINE_COLUMNS,
    NAME_COLUMNS,
    PARAMS_BASELINE_COLUMNS,
    PARAMS_COLUMNS,
    SUMMARY_COLUMNS,
    PairedDifference,
    delta_text,
    noise_floor,
    paired_difference,
    quality_metrics,
    summary_rows,
)
from analysis.presets import resolve_baseline
from analysis.runs import Run
from analysis.stats import mean_stderr, t_interval, zero_spread
from analysis.variants import Variant, group_variants
from reporting import page as report_page
from reporting import tables as report_tables
from runlog.renames import ADDED
from runlog.tasks import TASKS
from scripts import report
from tests.helpers.runs import DIVERGED_ERROR, config, finished, metric_rows, table, write_run

T_975_2 = 4.302652729749462  # t.ppf(0.975, 2), from a t table: 4.30265
T_975_1 = 12.706204736174707  # t.ppf(0.975, 1): 12.7062


def test_paired_difference_hand_example() -> None:
    d = paired_difference({0: 1.5, 1: 2.4, 2: 3.8}, {0: 1.0, 1: 2.0, 2: 3.0})
    # diffs 0.5, 0.4, 0.8: mean 0.56667, sd sqrt(0.08667 / 2) = 0.20817, half width 4.30265 * 0.20817 / sqrt(3) = 0.51711
    assert d.n == 3 and d.mean == pytest.approx(0.566667, abs=1e-6)
    assert d.ci95 == pytest.approx((0.049552, 1.083781), abs=1e-6)
    assert d.significant is True
    assert float(scipy_stats.t.ppf(0.975, 2)) == pytest.approx(T_975_2, rel=1e-12)
    # the same interval as scipy's own paired t test
    ci = scipy_stats.ttest_rel([1.5, 2.4, 3.8], [1.0, 2.0, 3.0]).confidence_interval(0.95)
    assert d.ci95 == pytest.approx((ci.low, ci.high), rel=1e-12)


def test_pairing_narrows_the_interval_when_the_seed_effect_is_shared() -> None:
    # docs/sweeps.md: 3 pairs need a mean above t(0.975, 2) / sqrt(3) = 2.48 sd; the two-sample interval of the
    # hand example, which ignores the seeds, is [-1.89, 3.02] against the paired [0.05, 1.08]
    assert T_975_2 / math.sqrt(3) == pytest.approx(2.48, abs=0.005)
    assert float(scipy_stats.t.ppf(0.975, 1)) == pytest.approx(T_975_1, rel=1e-12) and T_975_1 == pytest.approx(12.71, abs=0.005)
    ci = scipy_stats.ttest_ind([1.5, 2.4, 3.8], [1.0, 2.0, 3.0]).confidence_interval(0.95)
    assert (ci.low, ci.high) == pytest.approx((-1.887, 3.021), abs=1e-3)


def test_an_interval_covering_zero_is_not_significant() -> None:
    d = paired_difference({0: 1.1, 1: 0.8, 2: 1.2}, {0: 1.0, 1: 1.0, 2: 1.0})
    # diffs 0.1, -0.2, 0.2: mean 0.03333, sd 0.20817, half width 0.51711
    assert d.mean == pytest.approx(0.033333, abs=1e-6) and d.ci95 == pytest.approx((-0.483781, 0.550448), abs=1e-6)
    assert d.significant is False


def test_unmatched_seeds_are_dropped() -> None:
    d = paired_difference({0: 1.5, 1: 2.4, 2: 3.8, 7: 100.0}, {0: 1.0, 1: 2.0, 2: 3.0, 9: -100.0})
    assert d == paired_difference({0: 1.5, 1: 2.4, 2: 3.8}, {0: 1.0, 1: 2.0, 2: 3.0})
    assert d.n == 3


def test_identical_differences_are_degenerate_not_significant() -> None:
    d = paired_difference({0: 1.5, 1: 2.5, 2: 3.5}, {0: 1.0, 1: 2.0, 2: 3.0})  # every difference 0.5: sd 0
    assert (d.n, d.mean, d.ci95, d.significant, d.degenerate) == (3, 0.5, None, False, True)
    assert delta_text(d, lambda x: f"{x:+.2f}") == "+0.50 (3) degenerate (zero spread)"
    # differences that agree to float rounding only (0.10000000000000003, 0.10000000000000009) are as degenerate
    assert paired_difference({0: 0.1 + 0.2, 1: 1.1}, {0: 0.2, 1: 1.0}).degenerate is True
    assert zero_spread([0.0, 0.0]) and not zero_spread([0.5]) and not zero_spread([0.5, 0.5 + 1e-6])
    assert paired_difference({0: 1.5, 1: 2.4}, {0: 1.0, 1: 2.0}).degenerate is False  # differences 0.5, 0.4


def test_a_non_finite_value_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"^value 1 of 3 is nan: statistics need finite numbers$"):
        mean_stderr([1.0, math.nan, 2.0])
    with pytest.raises(ValueError, match=r"^value 2 of 3 is inf"):
        t_interval([1.0, 2.0, math.inf])
    with pytest.raises(ValueError, match=r"^value 0 of 1 is None"):
        mean_stderr([None])
    with pytest.raises(ValueError, match=r"^values\[1\] is nan: a paired difference needs finite numbers$"):
        paired_difference({0: 1.0, 1: math.nan}, {0: 1.0, 1: 2.0})
    with pytest.raises(ValueError, match=r"^baseline\['s2'\] is -inf"):
        paired_difference({"s2": 1.0}, {"s2": -math.inf})


def test_one_pair_has_no_interval_and_none_has_no_mean() -> None:
    one = paired_difference({0: 1.5, 1: 2.0}, {0: 1.0})
    assert (one.n, one.mean, one.ci95, one.significant) == (1, 0.5, None, None)
    none = paired_difference({1: 2.0}, {0: 1.0})
    assert (none.n, none.mean, none.ci95, none.significant) == (0, None, None, None)


BASE = "norm.placement=pre norm.kind=layernorm"
POST = "norm.placement=post norm.kind=rmsnorm"
RMS = "norm.placement=pre norm.kind=rmsnorm"
# variant -> (placement, kind, loss offset, {seed: test PER}); RMS seed 1 diverges at step 60, after one validation
VARIANTS = {
    BASE: ("pre", "layernorm", 1.0, {0: 0.10, 1: 0.12, 2: 0.14}),
    POST: ("post", "rmsnorm", 1.0, {0: 0.105, 1: 0.124, 2: 0.148}),  # PER diffs 0.005, 0.004, 0.008: the hand example / 100
    RMS: ("pre", "rmsnorm", 1.5, {0: 0.11, 2: 0.12}),  # PER diffs 0.01, -0.02
}


def best_val_loss(offset: float, seed: int) -> float:
    return offset + 3.0 / 100 + 0.01 * seed + 0.2  # metric_rows' val/loss at step 100, its lowest


@pytest.fixture(scope="module")
def paired_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paired")
    for placement, kind, offset, pers in VARIANTS.values():
        for seed in range(3):
            cfg, path = config(placement, kind, seed), root / f"{placement}_{kind},seed={seed}"
            if seed in pers:
                write_run(path, cfg, metric_rows(offset, seed, pers[seed]), finished(pers[seed]))
            else:  # its val/loss at step 50 is finite: a best valid loss that must not be paired
                diverged = {"state": "diverged", "step": 60, "max_steps": 100, "error": DIVERGED_ERROR.format(60), "test": None}
                write_run(path, cfg, metric_rows(offset, seed, None, diverge_at=60), diverged)
    return root


@pytest.fixture(scope="module")
def compared(paired_sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    out = tmp_path_factory.mktemp("paired_report")
    page = report_page.build_report([paired_sweep], out, baseline=BASE).read_text(encoding="utf-8")
    with (out / "summary.csv").open(newline="", encoding="utf-8") as f:
        return page, list(csv.DictReader(f))


def test_delta_cells_give_mean_ci_and_pairs(compared: tuple[str, list[dict]]) -> None:
    rows, _ = table(compared[0], "data-variant")
    post, rms = rows[POST], rows[RMS]
    # PER in %: diffs 0.5, 0.4, 0.8 points -> 0.567 [0.050, 1.084]; WER = 2 x PER, so twice that
    assert float(post["test/per:delta"][0]) == pytest.approx(0.00566667, abs=1e-8)
    assert post["test/per:delta"][1] == "+0.57 [+0.05, +1.08] (3)"
    assert post["test/wer:delta"][1] == "+1.13 [+0.10, +2.17] (3)"
    # the same losses, seed by seed: every difference 0, zero spread: no interval, not significant
    assert post["best_val_loss:delta"] == ("0.0", "+0.000 (3) degenerate (zero spread)")
    # seeds 0 and 2 only (seed 1 diverged): diffs 1 and -2 points, half width 12.7062 * 2.1213 / sqrt(2) = 19.0593
    assert float(rms["test/per:delta"][0]) == pytest.approx(-0.005, abs=1e-12)
    assert rms["test/per:delta"][1] == "-0.50 [-19.56, +18.56] (2) n.s."
    # not 3 pairs: the diverged seed's loss is left out; both differences 0.5: no zero-width interval called significant
    assert rms["best_val_loss:delta"][1] == "+0.500 (2) degenerate (zero spread)"
    assert rms["diverged"][1] == "1 of 3"
    assert all(rows[BASE][f"{m}:delta"] == ("", "") for m in ("test/per", "test/wer", "best_val_loss"))


def test_baseline_line_and_headers(compared: tuple[str, list[dict]]) -> None:
    page = compared[0]
    assert "<th>PER (%) Δ vs pre_ln: mean [95% CI] (pairs)</th>" in page  # the baseline by its name (its preset)
    assert "<th>best valid loss Δ vs pre_ln: mean [95% CI] (pairs)</th>" in page
    assert f'<p class="note" data-baseline="{BASE}">' in page
    assert "paired t test" in page and "Diverged runs never enter a pair or a mean" in page
    assert "degenerate (zero spread): every pair differs by the same amount" in page
    # baseline PER 10, 12, 14 %: sample std 2 points; WER twice; best valid loss 1.23, 1.24, 1.25: 0.01
    # the runs here log no first-reference scores (as runs written before them): their floors are "—"
    floors = "PER (%) 2.00, WER (%) 4.00, 1-ref PER (%) —, 1-ref WER (%) —, best valid loss 0.010"
    assert f"seed-to-seed sample standard deviation: {floors}.</p>" in page


def test_summary_csv_with_baseline(compared: tuple[str, list[dict]]) -> None:
    rows = {(r["variant"], r["metric"]): r for r in compared[1]}
    columns = [*SUMMARY_COLUMNS, *BASELINE_COLUMNS, *PARAMS_COLUMNS, *PARAMS_BASELINE_COLUMNS, *NAME_COLUMNS]
    assert list(compared[1][0]) == columns
    metrics = {"test/per", "test/wer", "test/per_1ref", "test/wer_1ref", "best_val_loss"}
    assert len(rows) == 15 and {m for _, m in rows} == metrics  # no wall time, spikes
    post = rows[POST, "test/per"]
    counts = ("runs", "finished", "diverged", "n", "baseline", "pairs", "significant", "degenerate")
    assert [post[k] for k in counts] == ["3", "3", "0", "3", BASE, "3", "true", "false"]
    assert float(post["mean"]) == pytest.approx(0.377 / 3, abs=1e-12)
    assert float(post["std"]) == pytest.approx(statistics.stdev([0.105, 0.124, 0.148]), rel=1e-12)
    assert float(post["stderr"]) == pytest.approx(float(post["std"]) / math.sqrt(3), rel=1e-12)
    half = T_975_2 * statistics.stdev([0.005, 0.004, 0.008]) / math.sqrt(3)
    assert float(post["diff_mean"]) == pytest.approx(0.017 / 3, abs=1e-12)
    assert float(post["diff_ci95_lo"]) == pytest.approx(0.017 / 3 - half, abs=1e-12)
    assert float(post["diff_ci95_hi"]) == pytest.approx(0.017 / 3 + half, abs=1e-12)
    assert post["diff_ci95_lo"] == repr(float(post["diff_ci95_lo"]))  # unformatted: every digit of the float
    rms = rows[RMS, "test/per"]
    assert [rms[k] for k in counts] == ["3", "2", "1", "2", BASE, "2", "false", "false"]
    half = T_975_1 * statistics.stdev([0.01, -0.02]) / math.sqrt(2)
    assert float(rms["diff_ci95_lo"]) == pytest.approx(-0.005 - half, abs=1e-12)
    # differences 0.5 and 0.5: zero spread, no interval, not significant (a [0.5, 0.5] "interval" read as significant)
    degenerate = rows[RMS, "best_val_loss"]
    assert [degenerate[k] for k in ("pairs", "diff_ci95_lo", "diff_ci95_hi", "significant", "degenerate")] == [
        "2", "", "", "false", "true"]  # fmt: skip
    assert float(degenerate["diff_mean"]) == 0.5
    base = rows[BASE, "best_val_loss"]
    assert float(base["std"]) == pytest.approx(0.01, abs=1e-12) and float(base["mean"]) == pytest.approx(best_val_loss(1.0, 1))
    assert [base[k] for k in BASELINE_COLUMNS] == [BASE, "", "", "", "", "", ""]  # the baseline is not compared to itself


def test_summary_csv_without_baseline(paired_sweep: Path, tmp_path: Path) -> None:
    report_page.build_report([paired_sweep], tmp_path, baseline="none")
    with (tmp_path / "summary.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [*SUMMARY_COLUMNS, *PARAMS_COLUMNS, *NAME_COLUMNS] and len(rows) == 15  # 3 variants x 5 metrics
    per = next(r for r in rows if r["variant"] == RMS and r["metric"] == "test/per")
    assert per["n"] == "2" and float(per["mean"]) == pytest.approx(0.115, rel=1e-12)
    assert float(per["std"]) == pytest.approx(statistics.stdev([0.11, 0.12]), rel=1e-12)
    assert "Δ vs" not in (tmp_path / "index.html").read_text(encoding="utf-8")


def test_runs_csv_holds_every_run_unformatted(paired_sweep: Path, tmp_path: Path) -> None:
    report_page.build_report([paired_sweep], tmp_path)
    with (tmp_path / "runs.csv").open(newline="", encoding="utf-8") as f:
        rows = {(r["variant"], r["seed"]): r for r in csv.DictReader(f)}
    assert len(rows) == 9
    assert float(rows[POST, "0"]["test/per"]) == 0.105 and rows[POST, "0"]["state"] == "finished"
    assert float(rows[BASE, "2"]["best_val_loss"]) == pytest.approx(best_val_loss(1.0, 2), rel=1e-12)
    diverged = rows[RMS, "1"]  # listed, its state and step given, no test metric
    assert (diverged["diverged"], diverged["test/per"], diverged["step"]) == ("True", "", "60")


def test_an_unknown_baseline_is_an_error_listing_the_variants(paired_sweep: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(ReportError, match=r"unknown --baseline 'norm=pre_lns'; valid: .*'norm.placement=post norm.kind=rmsnorm'"):
        report_page.build_report([paired_sweep], tmp_path / "a", baseline="norm=pre_lns")  # a preset no variant used
    assert report.main([str(paired_sweep), "--out", str(tmp_path / "b"), "--baseline", "pre"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]  # after the reading progress bar
    assert err.startswith("report: error: unknown --baseline 'pre'; valid: ") and "Traceback" not in err
    assert all(repr(label) in err for label in VARIANTS)
    assert err.endswith(", a norm preset some variant used (post_rms, pre_ln, pre_rms), or 'none'")
    assert not (tmp_path / "b").exists()  # stopped before drawing anything


def run(seed: int, per: float, state: str = "finished") -> Run:
    return Run(path=Path(f"r{seed}"), label=f"r{seed}", config={"seed": seed}, status={"state": state, "test": {"test/per": per}})


def test_one_pair_no_interval_and_small_n_leave_csv_cells_empty(tmp_path: Path) -> None:
    base = Variant("base", [run(0, 0.10), run(1, 0.12)])
    # seed 0 twice (one run given twice): one pair, their mean 0.25; seed 5 has no partner; a diverged seed 1
    dup = Variant("dup", [run(0, 0.20), run(0, 0.30), run(5, 0.90), run(1, 0.01, state="diverged")])
    single = Variant("single", [run(1, 0.50)])
    report_page.write_summary(tmp_path / "s.csv", summary_rows([base, dup, single], TASKS["g2p"], base), with_baseline=True)
    with (tmp_path / "s.csv").open(newline="") as f:
        rows = {(r["variant"], r["metric"]): r for r in csv.DictReader(f)}
    got = rows["dup", "test/per"]
    assert (got["n"], got["diverged"], float(got["mean"])) == ("3", "1", pytest.approx(1.4 / 3, rel=1e-12))
    assert (got["pairs"], float(got["diff_mean"]), got["diff_ci95_lo"], got["diff_ci95_hi"], got["significant"]) == (
        "1", pytest.approx(0.15, rel=1e-12), "", "", "")  # fmt: skip
    assert (rows["single", "test/per"]["std"], rows["single", "test/per"]["stderr"]) == ("", "")  # n = 1
    assert (rows["single", "test/wer"]["n"], rows["single", "test/wer"]["mean"]) == ("0", "")  # no WER written
    assert noise_floor(single, quality_metrics(TASKS["g2p"])["test/per"]) is None
    floors = "PER (%) —, WER (%) —, 1-ref PER (%) —, 1-ref WER (%) —, best valid loss —."
    assert floors in report_tables.baseline_note(single, TASKS["g2p"])
    signed = lambda x: f"{100 * x:+.2f}"
    assert report_tables.delta_text(PairedDifference(1, 0.0015, None, None), signed) == "+0.15 (1)"
    assert report_tables.delta_text(PairedDifference(0, None, None, None), signed) == "— (0)"


def test_compared_metrics_are_the_test_metrics_and_best_valid_loss() -> None:
    assert list(quality_metrics(TASKS["g2p"])) == ["test/per", "test/wer", "test/per_1ref", "test/wer_1ref", "best_val_loss"]
    assert list(quality_metrics(TASKS["translation"])) == ["test/bleu", "test/chrf", "best_val_loss"]


def delta_cells(page: str) -> dict[str, str]:
    """variant -> its PER Δ cell's text."""
    rows, _ = table(page, "data-variant")
    return {label: row["test/per:delta"][1] for label, row in rows.items() if "test/per:delta" in row}


def test_without_baseline_the_default_presets_variant_is_the_baseline(paired_sweep: Path, tmp_path: Path) -> None:
    page = report_page.build_report([paired_sweep], tmp_path).read_text(encoding="utf-8")  # BASE used pre_ln, the default
    assert "baseline: <b>pre_ln</b> (default; --baseline to change)." in page
    assert delta_cells(page) == {BASE: "", POST: "+0.57 [+0.05, +1.08] (3)", RMS: "-0.50 [-19.56, +18.56] (2) n.s."}
    with (tmp_path / "summary.csv").open(newline="", encoding="utf-8") as f:
        assert {r["baseline"] for r in csv.DictReader(f)} == {BASE}
    off = report_page.build_report([paired_sweep], tmp_path / "off", baseline="none").read_text(encoding="utf-8")
    assert delta_cells(off) == {} and "--baseline pre_ln" in off  # none: no Δ columns; the page says how to get them


@pytest.mark.parametrize(("given", "expected"), [("pre_ln", BASE), ("norm=pre_ln", BASE), ("pre_rms", RMS), ("post_rms", POST)])
def test_baseline_by_the_norm_preset_its_runs_used(paired_sweep: Path, tmp_path: Path, given: str, expected: str) -> None:
    page = report_page.build_report([paired_sweep], tmp_path, baseline=given).read_text(encoding="utf-8")
    assert f'<p class="note" data-baseline="{expected}">Δ vs' in page  # not "(default ...)": it was asked for
    assert delta_cells(page)[expected] == ""


def test_no_default_baseline_when_no_single_variant_used_the_default_preset(tmp_path: Path) -> None:
    for lr in (1e-3, 1e-2):  # two pre-LN variants: which one would be the baseline is the user's choice
        for seed in (0, 1):
            cfg = config("pre", "layernorm", seed, lr=lr)
            write_run(tmp_path / f"lr={lr},seed={seed}", cfg, metric_rows(1.0, seed, 0.1), finished(0.1))
    page = report_page.build_report([tmp_path], tmp_path / "report").read_text(encoding="utf-8")
    assert '<p class="note" data-baseline="">Is a difference real? <code>--baseline VARIANT</code>' in page
    assert delta_cells(page) == {}
    # Asked for: the two variants are one LR family, which pre_ln names (the LR-sensitivity table's baseline).
    runs = load_runs([tmp_path])
    family = lr_study(runs).families[0]
    assert resolve_baseline("pre_ln", group_variants(runs), [family]) == (family.label, False)
    with pytest.raises(ReportError, match=r"^--baseline 'pre_ln': norm preset pre_ln was used by 2 variants, 'optim.lr=0.001', "
                                          r"'optim.lr=0.01'; pass one of these labels$"):  # fmt: skip
        resolve_baseline("pre_ln", group_variants(runs), [])  # no LR family to fall back on


def test_a_null_label_is_shown_as_null_and_accepted_in_both_spellings(tmp_path: Path) -> None:
    for qk in (None, "layernorm"):
        for seed in (0, 1):
            cfg = config("pre", "layernorm", seed, **{"norm.qk": qk})
            per = 0.1 + 0.01 * seed
            write_run(tmp_path / f"qk={qk},seed={seed}", cfg, metric_rows(1.0, seed, per), finished(per))
    for given in ("norm.qk=None", "norm.qk=null"):
        page = report_page.build_report([tmp_path], tmp_path / given, baseline=given).read_text(encoding="utf-8")
        assert '<p class="note" data-baseline="norm.qk=None">Δ vs <b>pre_ln</b>' in page  # named by its preset
        assert "<th>PER (%) Δ vs pre_ln: mean [95% CI] (pairs)</th>" in page and ">norm.qk=None<" not in page
        assert 'title="norm.qk=null"' in page  # its keys on hover
        assert delta_cells(page) == {"norm.qk=None": "", "norm.qk=layernorm": "+0.00 (2) degenerate (zero spread)"}


def test_a_preset_is_recognised_whatever_the_keys_interpolated_from_other_groups_hold() -> None:
    # PowerNorm's warmup_iters follows schedule.warmup_steps and its group_num model.n_heads: a pre_ln run with a
    # 60-step warmup used pre_ln, and so did an old run saved before the keys existed (ADDED's values).
    knobs = {"norm.knobs.powernorm.warmup_iters": 60, "norm.knobs.powernorm.group_num": 2}
    composed = {**presets.preset_keys("pre_ln"), **knobs}
    old = {k: v for k, v in presets.preset_keys("pre_ln").items() if k not in ADDED}
    for keys in (composed, old):
        assert presets.used_preset(Variant("v", [Run(path=Path("r"), label="r", config=keys)]), "pre_ln")
    assert "norm.knobs.powernorm.warmup_iters" not in presets.preset_keys("pre_pn")
    other = {**composed, "norm.kind": "rmsnorm"}
    assert not presets.used_preset(Variant("v", [Run(path=Path("r"), label="r", config=other)]), "pre_ln")
