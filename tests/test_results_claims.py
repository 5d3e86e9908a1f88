"""The claims docs/results.md makes in words ("higher in each seed", "every run without QK-norm"), each checked against
the committed CSVs it quotes (``tests/test_results.py`` checks its numbers)."""

import csv
from pathlib import Path

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
