"""The claims docs/results.md makes in words ("higher in each seed", "every run without QK-norm"), each checked against
the committed CSVs it quotes (``tests/test_results.py`` checks its numbers)."""

import csv
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
PRE = "norm.placement=pre norm.kind=layernorm norm.qk=None"
POST = "norm.placement=post norm.kind=layernorm norm.qk=None"
QK = "norm.placement=pre norm.kind=layernorm norm.qk=layernorm"


def read(path: str) -> list[dict[str, str]]:
    with (RESULTS / path).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def by_family(path: str, column: str) -> dict[str, dict[tuple[str, float], float]]:
    """family -> (seed, lr) -> ``column`` of lr_sensitivity.csv."""
    out: dict[str, dict[tuple[str, float], float]] = {}
    for r in read(path):
        out.setdefault(r["family"], {})[r["seed"], float(r["lr"])] = float(r[column])
    return out


def test_lr_study_every_run_finished_and_every_seed_learned() -> None:
    assert {r["state"] for r in read("lr_sensitivity/lr_sensitivity.csv")} == {"finished"}
    assert {r["learned"] for r in read("lr_sensitivity/lrs_seeds.csv")} == {"True"}


def test_a_post_ln_lrs_is_higher_than_pre_ln_in_each_seed_but_the_ci_covers_zero() -> None:
    lrs = {(r["family"], r["seed"]): float(r["lrs"]) for r in read("lr_sensitivity/lrs_seeds.csv")}
    assert all(lrs[POST, s] > lrs[PRE, s] for s in "012")
    post = next(r for r in read("lr_sensitivity/lrs.csv") if r["family"] == POST)
    assert float(post["diff_ci95_lo"]) < 0 < float(post["diff_ci95_hi"]) and post["significant"] == "False"


def test_a_post_ln_collapses_at_1e_2_where_pre_ln_learns() -> None:
    loss = by_family("lr_sensitivity/lr_sensitivity.csv", "capped_loss")
    assert all(loss[POST][s, 0.01] > 2.9 and loss[PRE][s, 0.01] < 1.1 for s in "012")  # "near 3 nats" / "still learns"
    best = {r["family"]: r["best_lr"] for r in read("lr_sensitivity/lrs.csv")}
    assert best[POST] == best[PRE] == "0.003"  # "both are best at 3e-3"


def test_b_at_lr_0_3_every_run_without_qk_norm_has_a_larger_max_logit_than_every_run_with_it() -> None:
    logit = by_family("lr_sensitivity/lr_sensitivity.csv", "max_attn_logit")
    without = [v for f, runs in logit.items() if f != QK for (_, lr), v in runs.items() if lr == 0.3]
    with_qk = [v for (_, lr), v in logit[QK].items() if lr == 0.3]
    assert (len(without), len(with_qk)) == (21, 3)  # 7 presets x 3 seeds, 3 seeds
    assert min(without) > max(with_qk)
    assert (round(min(without), 1), round(max(with_qk), 1)) == (512.5, 107.6)  # the two the page quotes


def test_b_logit_growth_in_every_seed_at_every_lr_from_3e_2_up() -> None:
    logit = by_family("lr_sensitivity/lr_sensitivity.csv", "max_attn_logit")
    high = [(s, lr) for (s, lr) in logit[PRE] if lr >= 0.03]
    assert len(high) == 9 and all(logit[PRE][k] > 10 * logit[QK][k] for k in high)


def test_b_qk_norm_is_less_bad_not_good_at_0_3() -> None:
    loss = by_family("lr_sensitivity/lr_sensitivity.csv", "capped_loss")
    best = next(float(r["best_loss_mean"]) for r in read("lr_sensitivity/lrs.csv") if r["family"] == QK)
    assert all(loss[QK][s, 0.3] > best + 1.0 and loss[QK][s, 0.3] < loss[PRE][s, 0.3] for s in "012")


def test_deepnorm_best_loss_is_far_above_every_other_family() -> None:
    best = {r["family"]: float(r["best_loss_mean"]) for r in read("lr_sensitivity/lrs.csv")}
    deepnorm = best.pop("norm.placement=deepnorm norm.kind=layernorm norm.qk=None")
    assert deepnorm > 2 * max(best.values())


def test_high_lr_qk_norm_gave_the_lowest_per_and_valid_loss() -> None:
    rows = read("high_lr/summary.csv")
    for metric in ("test/per", "best_val_loss"):
        means = {r["variant"]: float(r["mean"]) for r in rows if r["metric"] == metric}
        assert min(means, key=means.get) == "norm.placement=pre norm.qk=layernorm"


WARMUP = "warmup_depth/"


def variant(placement: str, warmup: int) -> str:
    return f"norm.placement={placement} schedule.warmup_steps={warmup}"


def test_c_runs_csv_and_the_summaries_come_from_one_sweep() -> None:
    runs = read(WARMUP + "runs.csv")
    summary = {(r["variant"], r["metric"]): float(r["mean"]) for r in read(WARMUP + "summary_vs_post_warmup300.csv")}
    for (name, metric), mean in summary.items():
        values = [float(r[metric]) for r in runs if r["variant"] == name]
        assert len(values) == 3 and sum(values) / 3 == pytest.approx(mean, rel=1e-12), (name, metric)


def test_c_post_ln_without_warmup_fails_in_every_seed_and_the_short_warmup_rescues_it() -> None:
    runs = read(WARMUP + "runs.csv")
    cold = [r for r in runs if r["variant"] == variant("post", 0)]
    short = [r for r in runs if r["variant"] == variant("post", 60)]
    assert all(float(r["test/per"]) > 1 and float(r["test/wer"]) == 1.0 for r in cold)  # "fails in every seed"
    assert all(float(r["test/per"]) < 0.4 for r in short)  # "rescues it"
    rows = {(r["variant"], r["metric"]): r for r in read(WARMUP + "summary_vs_post_warmup300.csv")}
    assert all(rows[variant("post", 0), m]["significant"] == "true" for m in ("test/per", "best_val_loss"))
    assert rows[variant("post", 60), "test/per"]["significant"] == "false"


def test_c_only_admin_s_small_loss_difference_is_significant_here_and_only_pre_ln_s_on_the_first_machine() -> None:
    def significant(folder: str, placement: str) -> dict[str, str]:
        rows = read(f"{WARMUP}{folder}summary_vs_{placement}_warmup300.csv")
        return {r["metric"]: r["significant"] for r in rows if r["variant"] == variant(placement, 0)}

    assert significant("", "pre") == {"test/per": "false", "test/wer": "false", "best_val_loss": "false"}
    assert significant("", "admin") == {"test/per": "false", "test/wer": "false", "best_val_loss": "true"}
    assert significant("first_machine/", "pre")["best_val_loss"] == "true"
    assert significant("first_machine/", "admin")["best_val_loss"] == "false"


def test_d_pre_ln_grows_with_depth_and_post_ln_s_layernorm_input_is_flat_at_init() -> None:
    growth = {(r["variant"], r["stack"], r["step_kind"]): r for r in read(WARMUP + "depth_growth.csv")}
    for stack in ("enc", "dec"):
        for warmup in (0, 60, 300):
            pre_first, pre_last = (float(growth[variant("pre", warmup), stack, k]["mean"]) for k in ("first", "last"))
            assert pre_first > 1.7 and pre_last > pre_first  # grows at init, and more after training
            for placement in ("post", "admin"):
                row = growth[variant(placement, warmup), stack, "first"]
                assert row["site"] == "ffn.norm_out.in" and abs(float(row["mean"]) - 1) < 0.02  # before the LayerNorm
        assert growth[variant("pre", 300), stack, "first"]["site"] == "out"


def test_c_the_two_machines_agree_at_step_1_to_float32_rounding_only() -> None:
    def first(folder: str) -> dict[str, float]:
        rows = read(f"{WARMUP}{folder}depth_growth.csv")
        return {r["stack"]: float(r["mean"]) for r in rows if r["variant"] == variant("pre", 300) and r["step_kind"] == "first"}

    here, there = first(""), first("first_machine/")
    assert all(here[s] != there[s] and here[s] == pytest.approx(there[s], rel=1e-7) for s in ("enc", "dec"))
