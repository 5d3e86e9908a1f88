"""LR sensitivity (analysis/lrs.py, Wortsman et al. 2023 §2.2) against hand computations, and its part of the report
(analysis/lr_panels.py, scripts/report_lrs.py) on a synthetic LR sweep: the CSVs, the table and the charts hold those
numbers, and a sweep without an LR axis gets none of them."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest

import train as train_module
from analysis.csvs import write_csv
from analysis.load import ReportError, load_runs
from analysis.lr_panels import lr_panels
from analysis.lrs import Family, capped_loss, final_loss_of, init_loss_of, lr_sensitivity, lr_study, lrs_versus
from analysis.presets import preset_of, study_name
from analysis.runs import Run
from analysis.stats import t_interval
from reporting import figures as report_figures
from reporting import lrs as lrs_tables
from reporting import page as report_page
from runlog.metric_names import attn_max_logit
from scripts import report_lrs
from tests.helpers.config import make_cfg
from tests.helpers.csvs import read_csv
from tests.helpers.runs import (
    DIVERGED_ERROR,
    band_stretches,
    config,
    draw_in_chromium,
    figures,
    finished,
    layouts,
    table,
    write_run,
)

LRS3 = [1e-3, 1e-2, 1e-1]
HAND = 7.24 / 3 - 1.5  # (2.0 + 1.5 + 3.74) / 3 - 1.5 = 0.91333: losses 2.0, 1.5, diverged at l0 = 3.74
T_975_2 = 4.302652729749464  # scipy.stats.t.ppf(0.975, 2), as tables give it (4.3027)
PRE, POST = "norm.placement=pre norm.kind=layernorm", "norm.placement=post norm.kind=rmsnorm"


def fake_run(lr: float, seed: int, init: float | None, final: float, state: str = "finished", kind: str = "layernorm") -> Run:
    """An in-memory run: ``val/loss`` at step 0 (``init``; none when None), 50 (``final + 0.3``) and 100 (``final``)."""
    points = ([(0, init)] if init is not None else []) + [(50, final + 0.3), (100, final)]
    status = {"state": state, "step": 100, "max_steps": 100}
    label = f"{kind},lr={lr:g},seed={seed}"
    cfg = {"optim.lr": lr, "seed": seed, "norm.placement": "pre", "norm.kind": kind, "norm.impl": "custom"}
    cfg["trainer.max_steps"] = 100
    return Run(Path(label), label, config=cfg, series={"val/loss": points}, status=status)


def only_family(runs: list[Run]) -> Family:
    study = lr_study(runs)
    assert study is not None and len(study.families) == 1
    return study.families[0]


def test_lr_sensitivity_of_the_hand_example() -> None:
    for bad in (None, math.nan, math.inf):
        assert lr_sensitivity([2.0, 1.5, bad], 3.74) == pytest.approx(HAND) == pytest.approx(0.91333, abs=1e-5)


def test_lr_sensitivity_of_an_all_finite_grid_caps_at_the_loss_at_init() -> None:
    assert lr_sensitivity([2.0, 1.8, 2.6], 3.0) == pytest.approx((2.0 + 1.8 + 2.6) / 3 - 1.8)  # 0.3333: nothing capped
    assert lr_sensitivity([2.0, 4.0], 3.0) == pytest.approx(0.5)  # 4.0 counts as l0 = 3.0 (uncapped: 1.0)
    assert lr_sensitivity([2.0, 2.0, 2.0], 3.0) == 0.0  # the same loss at every LR
    assert capped_loss(4.0, 3.0) == 3.0 and capped_loss(None, 3.0) == 3.0 and capped_loss(2.5, 3.0) == 2.5
    with pytest.raises(ValueError, match="empty"):
        lr_sensitivity([], 3.0)
    with pytest.raises(ValueError, match="finite"):
        lr_sensitivity([2.0], math.nan)


def test_t_interval_of_three_seeds() -> None:
    lo, hi = t_interval([0.5, 0.7, 0.9])
    half = T_975_2 * 0.2 / math.sqrt(3)  # sample std 0.2, stderr 0.2 / sqrt(3) = 0.11547
    assert (lo, hi) == (pytest.approx(0.7 - half), pytest.approx(0.7 + half))
    assert (lo, hi) == (pytest.approx(0.2032, abs=1e-4), pytest.approx(1.1968, abs=1e-4))
    assert t_interval([0.5]) is None


def test_a_family_with_a_diverged_run() -> None:
    runs = [fake_run(1e-3, 0, 3.74, 2.0), fake_run(1e-2, 0, 3.74, 1.5), fake_run(1e-1, 0, 3.74, 9.0, "diverged")]
    family = only_family(runs)
    assert family.label == "norm.placement=pre norm.kind=layernorm norm.impl=custom" and family.grid == LRS3  # as variants
    (seed,) = family.seeds
    assert [c.state for c in seed.cells] == ["finished", "finished", "diverged"]
    assert [c.final_loss for c in seed.cells] == [2.0, 1.5, None]  # the value at step 100, not step 50's
    assert [c.capped for c in seed.cells] == [2.0, 1.5, 3.74]
    assert family.values == [pytest.approx(HAND)] and family.mean_stderr == (pytest.approx(HAND), None)
    assert family.ci95 is None and family.best_lr == 1e-2 and family.notes == []
    assert [family.n_diverged(lr) for lr in LRS3] == [0, 0, 1]


def test_an_incomplete_grid_gives_that_seed_no_lrs_and_a_note() -> None:
    runs = [fake_run(lr, 0, 3.74, final) for lr, final in zip(LRS3, (2.0, 1.5, 1.7), strict=True)]
    runs += [fake_run(1e-3, 1, 3.7, 2.1), fake_run(1e-2, 1, 3.7, 1.6), fake_run(1e-1, 1, 3.7, 1.2, "running")]
    runs += [fake_run(1e-3, 2, 3.7, 2.1), fake_run(1e-2, 2, 3.7, 1.6)]  # no run at lr 0.1
    crashed = fake_run(1e-1, 3, 3.7, 2.0)  # no status.json, stopped at step 50 of 100
    crashed.status, crashed.series["val/loss"] = None, [(0, 3.7), (50, 2.0)]
    runs += [fake_run(1e-3, 3, 3.7, 2.1), fake_run(1e-2, 3, 3.7, 1.6), crashed]
    family = only_family(runs)
    assert [s.sensitivity is None for s in family.seeds] == [False, True, True, True]
    assert family.values == [pytest.approx((2.0 + 1.5 + 1.7) / 3 - 1.5)]  # seed 0 alone: never part of a grid
    assert family.notes == [
        "seed 1: no LRS, incomplete grid (lr 0.1 running)",
        "seed 2: no LRS, incomplete grid (lr 0.1 has no run)",
        "seed 3: no LRS, incomplete grid (lr 0.1 unknown (no status.json))",
    ]
    assert family.seeds[1].cells[2].capped is None and family.seeds[2].cells[2].state == "missing"
    assert [m for m, _ in family.capped_band] == pytest.approx([2.0, 1.5, 1.7])  # over the averaged seed only


def test_the_loss_at_init_comes_from_step_0() -> None:
    old = only_family([fake_run(1e-3, 0, None, 2.0), fake_run(1e-2, 0, None, 1.5)])  # written before step 0 was logged
    assert old.values == [] and old.seeds[0].init_loss is None and old.best_lr is None
    assert old.notes == ["seed 0: no LRS, no run logged val/loss at step 0 (the loss at init; runs written before it was)"]
    # runs of one seed disagree: the finished run's l0 is used (not the diverged one's), and a note says so
    family = only_family([fake_run(1e-3, 0, 3.0, 2.0), fake_run(1e-2, 0, 2.9, 1.0, "diverged")])
    assert family.seeds[0].init_loss == 3.0 and family.values == [pytest.approx((2.0 + 3.0) / 2 - 2.0)]
    assert family.notes == [
        "seed 0: val/loss at step 0 differs across its runs by 0.1 (> 1e-06), used layernorm,lr=0.001,seed=0's 3.000000"
    ]
    assert only_family([fake_run(1e-3, 0, 3.0, 2.0), fake_run(1e-2, 0, 3.0 + 1e-7, 1.0)]).notes == []  # within 1e-6


def test_families_are_runs_that_differ_only_in_seed_and_lr() -> None:
    runs = [fake_run(lr, s, 3.0, 2.0, kind=k) for k in ("layernorm", "rmsnorm") for lr in (1e-3, 1e-2) for s in (0, 1)]
    study = lr_study(runs + [fake_run(1e-3, 0, 3.0, 2.0, kind="scalenorm")])
    assert [(f.label, f.grid, [s.seed for s in f.seeds]) for f in study.families] == [
        ("norm.kind=layernorm", [1e-3, 1e-2], [0, 1]), ("norm.kind=rmsnorm", [1e-3, 1e-2], [0, 1])]  # fmt: skip
    assert study.notes == ["norm.kind=scalenorm: runs at one LR only (0.001), no LR sensitivity"]
    # no LR axis: a single LR, or each LR confounded with another key (every family at one LR)
    assert lr_study([fake_run(1e-3, s, 3.0, 2.0) for s in (0, 1)]) is None
    assert lr_study([fake_run(1e-3, 0, 3.0, 2.0), fake_run(1e-2, 0, 3.0, 2.0, kind="rmsnorm")]) is None


def test_training_logs_the_loss_at_init_at_step_0_the_same_at_every_lr(tmp_path: Path) -> None:
    quick = ("trainer.max_steps=1", "trainer.eval_max_examples=5", "trainer.test_max_examples=5")
    for lr in (1e-3, 1e-1):  # same seed: same init, same validation data
        train_module.train(make_cfg(*quick, f"optim.lr={lr}"), tmp_path / f"lr={lr:g}")
    runs = load_runs([tmp_path])
    inits, finals = [init_loss_of(r) for r in runs], [final_loss_of(r) for r in runs]
    assert inits[0] == inits[1] and finals[0] != finals[1] and all(f < inits[0] for f in finals)
    assert [r.series["val/loss"][0][0] for r in runs] == [0, 0]  # logged first, before any training step
    family = only_family(runs)
    assert family.seeds[0].init_loss == inits[0] and family.values == [pytest.approx(abs(finals[0] - finals[1]) / 2)]


# The synthetic LR sweep: family PRE (seed 0: the hand example; seed 1: its lr 0.1 run still running) and family
# POST (3 seeds of LRS 0.5, 0.7, 0.9: finals 1.9 + 3 LRS, 2.0, 2.1 at l0 = 5.0). Max logits are recorded by the runs
# at lr 0.1 and by POST's at lr 0.01 only.
POST_LRS = [0.5, 0.7, 0.9]
FINALS = {(PRE, 0): (3.74, [2.0, 1.5, None]), (PRE, 1): (3.7, [2.1, 1.6, None]),
          **{(POST, s): (5.0, [1.9 + 3 * v, 2.0, 2.1]) for s, v in enumerate(POST_LRS)}}  # fmt: skip


def top_logit(lr: float, seed: int, step: int) -> float:
    """The larger of a run's two recorded attention max logits (the other is 1 less)."""
    return 10 * lr * step + seed + 1


def sweep_rows(init: float, final: float | None, lr: float, seed: int, last: int, logits: bool) -> list[dict]:
    """metrics.jsonl rows up to step ``last``: val/loss at 0 (``init``), 50 (``final + 0.3``) and 100 (``final``),
    and with ``logits`` two attentions' max logits at telemetry steps 1, 50, 100."""
    rows = [{"step": 0, "val/loss": init}]
    for step in (s for s in (1, 10, 50, 100) if s <= last):
        row = {"step": step, "train/loss": 3.0 - step / 100}
        if step in (50, 100):
            row["val/loss"] = (final if final is not None else 2.0) + (0.3 if step == 50 else 0.0)
        if logits and step != 10:
            row[attn_max_logit("enc", 0, "self_attn").name] = top_logit(lr, seed, step) - 1
            row[attn_max_logit("dec", 1, "cross_attn").name] = top_logit(lr, seed, step)
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def lr_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("lr_sweep")
    for (family, seed), (init, finals) in FINALS.items():
        placement, kind = ("pre", "layernorm") if family == PRE else ("post", "rmsnorm")
        for lr, final in zip(LRS3, finals, strict=True):
            logits = lr == 1e-1 or (family == POST and lr == 1e-2)
            if final is not None:
                rows, status = sweep_rows(init, final, lr, seed, 100, logits), finished(0.1)
            elif seed == 0:  # diverged at step 61
                rows = sweep_rows(init, None, lr, seed, 60, logits)
                status = {"state": "diverged", "step": 61, "max_steps": 100, "error": DIVERGED_ERROR.format(61), "test": None}
            else:  # still running at step 50
                rows, status = sweep_rows(init, None, lr, seed, 50, logits), {"state": "running", "step": 50, "max_steps": 100}
            write_run(root / f"{placement}_{kind},lr={lr:g},seed={seed}", config(placement, kind, seed, lr=lr), rows, status)
    path = report_page.build_report([root], root / "report")
    return path, path.read_text(encoding="utf-8")


def test_report_writes_lrs_csv(lr_sweep: tuple[Path, str]) -> None:
    rows = {r["family"]: r for r in read_csv(lr_sweep[0].parent / "lrs.csv")}
    pre, post = rows[PRE], rows[POST]
    assert list(rows) == [POST, PRE]  # the families in first-seen order (run dirs sorted: post_... first)
    assert (pre["n"], pre["lrs_stderr"], pre["ci95_lo"], pre["ci95_hi"], pre["best_lr"]) == ("1", "", "", "", "0.01")
    assert float(pre["lrs_mean"]) == pytest.approx(HAND) and pre["per_seed_lrs"] == f"0={HAND!r}"
    assert post["n"] == "3" and float(post["lrs_mean"]) == pytest.approx(0.7)
    assert float(post["lrs_stderr"]) == pytest.approx(0.2 / math.sqrt(3))
    assert (float(post["ci95_lo"]), float(post["ci95_hi"])) == (pytest.approx(0.2032, abs=1e-4), pytest.approx(1.1968, abs=1e-4))
    assert [float(kv.split("=")[1]) for kv in post["per_seed_lrs"].split()] == pytest.approx(POST_LRS)
    assert post["best_lr"] == "0.01"  # mean capped losses 4.0, 2.0, 2.1


def test_report_writes_lr_sensitivity_csv(lr_sweep: tuple[Path, str]) -> None:
    rows = {(r["family"], r["seed"], float(r["lr"])): r for r in read_csv(lr_sweep[0].parent / "lr_sensitivity.csv")}
    assert len(rows) == 5 * 3
    fields = ("final_val_loss", "init_loss", "capped_loss", "state")
    assert tuple(rows[PRE, "0", 1e-3][k] for k in fields) == ("2.0", "3.74", "2.0", "finished")  # step 100's, not 50's
    assert tuple(rows[PRE, "0", 1e-1][k] for k in fields) == ("", "3.74", "3.74", "diverged")
    assert tuple(rows[PRE, "1", 1e-1][k] for k in fields) == ("", "3.7", "", "running")
    assert float(rows[POST, "2", 1e-3]["capped_loss"]) == pytest.approx(4.6)
    # the larger of the two attentions' max logits at the last record (step 100); none recorded at lr 1e-3
    assert float(rows[POST, "0", 1e-2]["max_attn_logit"]) == top_logit(1e-2, 0, 100) == 11.0
    assert rows[POST, "0", 1e-3]["max_attn_logit"] == ""


def test_report_table_of_lr_sensitivity(lr_sweep: tuple[Path, str]) -> None:
    rows, _ = table(lr_sweep[1], "data-family")
    assert set(rows) == {PRE, POST}
    assert rows[PRE]["n"] == ("1", "1 of 2") and rows[PRE]["lrs"][1] == "0.9133" and rows[PRE]["ci95"] == ("", "—")
    assert rows[PRE]["diverged"] == ("1", "1 of 6") and rows[PRE]["best_lr"] == ("0.01", "0.01")
    assert rows[PRE]["notes"][1] == "seed 1: no LRS, incomplete grid (lr 0.1 running)"
    assert rows[POST]["lrs"][1] == "0.7000 ± 0.1155" and rows[POST]["ci95"][1] == "[0.2032, 1.1968]"
    assert rows[POST]["per_seed"][1] == "seed 0: 0.5000, seed 1: 0.7000, seed 2: 0.9000"
    assert "<h2>LR sensitivity</h2>" in lr_sweep[1]


def test_report_draws_the_lr_charts(lr_sweep: tuple[Path, str]) -> None:
    out, page = lr_sweep[0].parent, lr_sweep[1]
    keys = ["lr_loss", "lrs", "attn_max_logit_lr_1", "attn_max_logit_lr_2"]  # no max logits at lr 0.001: no _3
    assert list(figures(page))[-4:] == [f"plot-{k}" for k in keys]
    for key in keys:
        assert (out / f"{key}.png").stat().st_size > 5000 and f'href="{key}.png"' in page, key
    assert not (out / "attn_max_logit_lr_3.png").exists()
    assert layouts(page)["plot-lr_loss"]["xaxis"]["type"] == "log"
    assert layouts(page)["plot-attn_max_logit_lr_1"]["yaxis"]["type"] == "log"
    traces = figures(page)["plot-lr_loss"]
    mean = {t["meta"]["variant"]: t for t in traces if t["meta"]["role"] == "mean"}
    assert mean[PRE]["x"] == LRS3 and mean[PRE]["y"] == pytest.approx([2.0, 1.5, 3.74])  # seed 0 only
    assert mean[POST]["y"] == pytest.approx([4.0, 2.0, 2.1])
    (band,) = [t for t in traces if t["meta"] == {"role": "band", "variant": POST}]
    ((x, hi, _),) = band_stretches(band)
    assert x == LRS3 and hi == pytest.approx([4.0 + 0.6 / math.sqrt(3), 2.0, 2.1])  # ± stderr over seeds
    (mark,) = [t for t in traces if t["meta"]["role"] == "diverged"]
    assert (mark["meta"]["variant"], mark["x"], mark["y"]) == (PRE, [0.1], [pytest.approx(3.74)])
    points = {t["meta"]["variant"]: t for t in figures(page)["plot-lrs"]}
    assert (points[POST]["x"], points[POST]["y"]) == ([1], [pytest.approx(0.7)])
    assert points[POST]["name"] == f"{POST} (n = 3)" and points[POST]["hovertext"][0].startswith(f"{POST}: LRS 0.7000 ± 0.1155")
    half = T_975_2 * 0.2 / math.sqrt(3)
    assert points[POST]["error_y"]["array"] == pytest.approx([half]) == points[POST]["error_y"]["arrayminus"]
    assert points[PRE]["x"] == [2] and "error_y" not in points[PRE]  # one seed: no interval


def test_max_logit_at_the_highest_lrs_is_the_mean_over_seeds_of_the_max_over_attentions(lr_sweep: tuple[Path, str]) -> None:
    traces = {t["meta"]["variant"]: t for t in figures(lr_sweep[1])["plot-attn_max_logit_lr_1"] if t["meta"]["role"] == "mean"}
    # lr 0.1: POST's 3 seeds at 1, 50, 100; PRE's 2 seeds stopped after 50 (diverged, running): no mean at 100
    assert traces[POST]["x"] == [1, 50, 100]
    np.testing.assert_allclose(traces[POST]["y"], [np.mean([top_logit(0.1, s, t) for s in range(3)]) for t in (1, 50, 100)])
    assert traces[PRE]["x"] == [1, 50] and traces[PRE]["y"] == pytest.approx([top_logit(0.1, 0.5, t) for t in (1, 50)])
    (line,) = [t for t in figures(lr_sweep[1])["plot-attn_max_logit_lr_2"] if t["meta"]["role"] == "mean"]
    assert line["meta"]["variant"] == POST and line["y"] == pytest.approx([top_logit(0.01, 1, t) for t in (1, 50, 100)])


def test_the_pngs_draw_the_interval_and_the_log_axis(lr_sweep: tuple[Path, str]) -> None:
    study = lr_study(load_runs([lr_sweep[0].parent.parent]))
    panels = {p.key: p for p in lr_panels(study)}
    colors = report_figures.variant_colors(study.families)
    fig = report_figures.panel_figure(panels["lr_loss"], colors)
    assert fig.axes[0].get_xscale() == "log" and "x: a run at this LR diverged (counted as the loss at init)" in (
        fig.axes[0].get_legend_handles_labels()[1])  # fmt: skip
    report_figures.plt.close(fig)
    fig = report_figures.panel_figure(panels["lrs"], colors)
    bars = [c for c in fig.axes[0].containers if c.has_yerr]  # POST's CI; PRE (one seed) has none
    report_figures.plt.close(fig)
    assert len(bars) == 1


def test_a_sweep_without_an_lr_axis_gets_no_lr_sensitivity(tmp_path: Path) -> None:
    for seed in (0, 1):
        rows = sweep_rows(3.0, 2.0, 2e-3, seed, 100, logits=False)
        write_run(tmp_path / "sweep" / f"s{seed}", config("pre", "layernorm", seed), rows, finished(0.1))
    page = report_page.build_report([tmp_path / "sweep"], tmp_path / "out").read_text()
    assert len(figures(page)) == 5 and "LR sensitivity" not in page
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert not written & {"lrs.csv", "lr_sensitivity.csv", "lr_loss.png", "lrs.png", "attn_max_logit_lr_1.png"}


@pytest.mark.browser
def test_the_lr_charts_draw_in_chromium(lr_sweep: tuple[Path, str], tmp_path: Path) -> None:
    draw_in_chromium(lr_sweep[0], tmp_path / "profile", charts=len(figures(lr_sweep[1])))


def test_lrs_versus_is_the_paired_t_test_of_per_seed_lrs() -> None:
    # two LRs per seed, both finished below l0 = 5: LRS = |a - b| / 2. layernorm: 0.5, 0.6, 0.7; rmsnorm: 0.5 each
    runs = [fake_run(lr, seed, 5.0, final, kind=kind) for kind, tops in (("layernorm", (2.0, 2.2, 2.4)), ("rmsnorm", (2.0,) * 3))
            for seed, top in enumerate(tops) for lr, final in ((1e-3, 1.0), (1e-2, top))]  # fmt: skip
    study = lr_study(runs)
    layer, rms = (study.family(f"norm.kind={kind}") for kind in ("layernorm", "rmsnorm"))
    assert layer.values == pytest.approx([0.5, 0.6, 0.7]) and rms.values == pytest.approx([0.5] * 3)
    diff = lrs_versus(layer, rms)  # differences 0, 0.1, 0.2: mean 0.1, sd 0.1
    half = T_975_2 * 0.1 / math.sqrt(3)
    assert (diff.n, diff.mean, diff.significant) == (3, pytest.approx(0.1), False)
    assert diff.ci95 == (pytest.approx(0.1 - half), pytest.approx(0.1 + half))  # [-0.1484, 0.3484]: covers 0
    assert lrs_versus(rms, rms) is None and study.family("norm.kind=none") is None


def test_families_over_different_lr_grids_are_not_compared(tmp_path: Path) -> None:
    # rmsnorm's sweep stopped before lr 0.1: its LRS is a mean over two LRs, layernorm's over three, where the third,
    # the worst, would raise it. A difference would read rmsnorm as less sensitive; none is given, and the CSV says why.
    grids = {"layernorm": ((1e-3, 1.0), (1e-2, 2.0), (1e-1, 5.0)), "rmsnorm": ((1e-3, 1.0), (1e-2, 2.0))}
    runs = [fake_run(lr, seed, 5.0, final, kind=kind) for kind, cells in grids.items() for seed in (0, 1, 2)
            for lr, final in cells]  # fmt: skip
    study = lr_study(runs)
    layer, rms = (study.family(f"norm.kind={kind}") for kind in grids)
    assert layer.values == pytest.approx([5 / 3] * 3) and rms.values == pytest.approx([0.5] * 3)
    diff = lrs_versus(rms, layer)
    assert (diff.n, diff.mean, diff.ci95, diff.significant) == (0, None, None, None)
    assert diff.note == "LR grids differ: LRS not comparable (0.001, 0.01 vs 0.001, 0.01, 0.1)"
    cells = [{"family": f.label, "seed": str(s.seed), "lr": repr(c.lr), "final_val_loss": repr(c.final_loss),
              "init_loss": "5.0", "state": c.state} for f in study.families for s in f.seeds for c in s.cells]  # fmt: skip
    with (tmp_path / "cells.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(cells[0]))
        writer.writeheader()
        writer.writerows(cells)
    lrs_tables.rebuild_lrs_csv(tmp_path / "cells.csv", tmp_path / "out" / "lrs.csv", baseline="norm.kind=layernorm")  # makes out/
    row = {r["family"]: r for r in read_csv(tmp_path / "out" / "lrs.csv")}["norm.kind=rmsnorm"]
    assert (row["diff_mean"], row["pairs"], row["significant"]) == ("", "0", "")
    assert row["lrs_note"] == diff.note


def test_report_with_a_family_baseline_adds_the_paired_lrs_difference(lr_sweep: tuple[Path, str], tmp_path: Path) -> None:
    root = lr_sweep[0].parents[1]
    path = report_page.build_report([root], tmp_path, baseline=PRE)
    rows = {r["family"]: r for r in read_csv(tmp_path / "lrs.csv")}
    post, pre = rows[POST], rows[PRE]
    # PRE's seed 1 grid is incomplete: one pair (seed 0), POST's 0.5 - PRE's 0.91333, no interval
    assert (post["baseline"], post["pairs"], post["diff_ci95_lo"], post["significant"]) == (PRE, "1", "", "")
    assert float(post["diff_mean"]) == pytest.approx(POST_LRS[0] - HAND)
    assert (pre["baseline"], pre["diff_mean"], pre["pairs"]) == (PRE, "", "")
    cells, _ = table(path.read_text(encoding="utf-8"), "data-family")
    assert cells[POST]["lrs:delta"][1] == f"{POST_LRS[0] - HAND:+.4f} (1)" and cells[PRE]["lrs:delta"][1] == ""
    with pytest.raises(ReportError, match=f"valid: .*'{POST}'"):
        report_page.build_report([root], tmp_path / "bad", baseline="norm.placement=none")


# Three families through the report, one that trains (TRAINS: LRS 0.5, 0.7, 0.9 at l0 = 5.0, as
# POST above), one that diverges at every LR (DIVERGES: each run logged val/loss 2.3 at step 50, then diverged at 61)
# and one that ends at l0 at every LR (STALLS). By the formula the last two would score LRS 0, the best possible.
TRAINS, DIVERGES, STALLS = "norm.placement=pre", "norm.placement=post", "norm.placement=sandwich"
NOTE_ALL = "did not learn at any LR of the grid: seeds 0, 1, 2 of 3"


@pytest.fixture(scope="module")
def three_families(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("three_families") / "sweep"
    for seed, lrs in enumerate(POST_LRS):
        for lr, trained in zip(LRS3, [1.9 + 3 * lrs, 2.0, 2.1], strict=True):
            runs = {"pre": (sweep_rows(5.0, trained, lr, seed, 100, False), finished(0.1)),
                    "post": (sweep_rows(5.0, None, lr, seed, 60, False), {"state": "diverged", "step": 61, "max_steps": 100,
                             "error": DIVERGED_ERROR.format(61), "test": None}),
                    "sandwich": (sweep_rows(5.0, 5.0, lr, seed, 100, False), finished(0.1))}  # fmt: skip
            for placement, (rows, status) in runs.items():
                write_run(root / f"{placement},lr={lr:g},seed={seed}", config(placement, "layernorm", seed, lr=lr), rows, status)
    return root


def test_a_seed_that_never_improves_on_the_loss_at_init_has_no_lrs() -> None:
    assert lr_sensitivity([None, math.inf], 3.0) is None  # diverged at every LR: not LRS 0
    assert lr_sensitivity([3.0, 3.5, None], 3.0) is None  # at or above l0 at every LR
    assert lr_sensitivity([2.999, 3.5], 3.0) == pytest.approx((2.999 + 3.0) / 2 - 2.999)  # one LR below l0: learned
    runs = [fake_run(lr, 0, 3.0, final) for lr, final in ((1e-3, 2.0), (1e-2, 2.5))]
    runs += [fake_run(lr, 1, 3.0, 3.2, state) for lr, state in ((1e-3, "finished"), (1e-2, "diverged"))]
    family = only_family(runs)
    seed0, seed1 = family.seeds
    assert (seed0.learned, seed0.sensitivity, seed0.best_loss) == (True, pytest.approx(0.25), 2.0)
    assert (seed1.learned, seed1.sensitivity, seed1.best_loss) == (False, None, None)
    assert [s.seed for s in family.not_learned] == [1]
    assert family.notes == ["seed 1: no LRS, did not learn at any LR of the grid (every run diverged or ended at or above "
                            "the loss at init, 3.0000)"]  # fmt: skip
    assert family.learning_note == "did not learn at any LR of the grid: seed 1 of 2"
    # no mean over the seed that learned: a failed seed would leave the family scored by its survivor alone
    assert (family.values, family.ci95, family.best_loss_mean, family.best_lr) == ([], None, None, None)
    assert lrs_tables.per_seed(family) == "0=0.25" and lrs_tables._mean_cell(family) == (None, family.learning_note)


def test_lrs_versus_leaves_out_the_seeds_that_did_not_learn_and_says_so() -> None:
    learns = [fake_run(lr, s, 3.0, final - 0.1 * s) for s in (0, 1, 2) for lr, final in ((1e-3, 2.0), (1e-2, 2.6))]
    stalls = [fake_run(lr, s, 3.0, 3.0, kind="rmsnorm") for s in (0, 1, 2) for lr in (1e-3, 1e-2)]
    partly = [fake_run(lr, s, 3.0, final if s else 3.0, kind="scalenorm") for s in (0, 1, 2) for lr, final in ((1e-3, 1.0),
              (1e-2, 2.0))]  # fmt: skip
    study = lr_study(learns + stalls + partly)
    layer, rms, scale = (study.family(f"norm.kind={k}") for k in ("layernorm", "rmsnorm", "scalenorm"))
    none = lrs_versus(rms, layer)  # was: LRS 0 - 0.3 at every seed, "significantly less sensitive"
    assert (none.n, none.mean, none.ci95, none.significant) == (0, None, None, None)
    assert none.note == "3 left out (seeds 0, 1, 2): did not learn at any LR of the grid"
    assert lrs_versus(layer, rms).note == none.note  # the same with the non-learning family as the baseline
    part = lrs_versus(scale, layer)  # seed 0 left out; seeds 1, 2: 0.5 - 0.3 each, zero spread
    assert (part.n, part.mean, part.degenerate) == (2, pytest.approx(0.2), True)
    assert part.note == "1 left out (seed 0): did not learn at any LR of the grid"


def test_best_lr_is_none_on_a_tie() -> None:
    family = only_family([fake_run(lr, 0, 3.0, 2.0) for lr in (1e-3, 1e-2)] + [fake_run(1e-1, 0, 3.0, 2.5)])
    assert family.values == [pytest.approx(1 / 6)] and family.best_lrs == [1e-3, 1e-2] and family.best_lr is None
    assert lrs_tables.best_lr_text(family) == "tie: 0.001, 0.01"
    assert lrs_tables.lrs_note_field(family) == "best LR tie: 0.001, 0.01"


def test_families_that_did_not_learn_have_no_lrs_in_lrs_csv(three_families: Path, tmp_path: Path) -> None:
    report_page.build_report([three_families], tmp_path, baseline=TRAINS)
    rows = {r["family"]: r for r in read_csv(tmp_path / "lrs.csv")}
    assert list(next(iter(rows.values()))) == list(lrs_tables.FAMILY_FIELDS)
    assert list(lrs_tables.FAMILY_FIELDS[-5:]) == ["best_loss_mean", "did_not_learn", "lrs_note", "pairs_left_out", "degenerate"]
    trains = rows[TRAINS]
    assert (trains["n"], float(trains["lrs_mean"]), trains["best_lr"], trains["did_not_learn"], trains["lrs_note"]) == (
        "3", pytest.approx(0.7), "0.01", "0", "")  # fmt: skip
    assert float(trains["best_loss_mean"]) == 2.0  # l* = 2.0 at lr 0.01 for every seed
    for label in (DIVERGES, STALLS):
        row = rows[label]
        empty = ("lrs_mean", "lrs_stderr", "ci95_lo", "ci95_hi", "per_seed_lrs", "best_lr", "best_loss_mean", "diff_mean",
                 "diff_ci95_lo", "significant", "degenerate")  # fmt: skip
        assert {k: row[k] for k in empty} == dict.fromkeys(empty, ""), label
        assert (row["n"], row["did_not_learn"], row["lrs_note"], row["pairs"], row["pairs_left_out"]) == (
            "0", "3", NOTE_ALL, "0", "3")  # fmt: skip


def test_families_that_did_not_learn_read_so_in_the_table(three_families: Path, tmp_path: Path) -> None:
    page = report_page.build_report([three_families], tmp_path, baseline=TRAINS).read_text(encoding="utf-8")
    rows, _ = table(page, "data-family")
    assert rows[TRAINS]["lrs"][1] == "0.7000 ± 0.1155" and rows[TRAINS]["best_loss"] == ("2.0", "2.0000")
    assert rows[TRAINS]["did_not_learn"][1] == "0 of 3" and rows[TRAINS]["lrs:delta"] == ("", "")
    for label in (DIVERGES, STALLS):
        row = rows[label]
        assert row["lrs"] == ("", "did not learn at any LR of the grid"), label
        assert (row["ci95"], row["best_lr"], row["best_loss"], row["did_not_learn"]) == (("", "—"),) * 3 + (("3", "3 of 3"),)
        # not "significantly less sensitive" than the family that trains: no pair at all, and why
        assert row["lrs:delta"] == ("", "— (0); 3 left out (seeds 0, 1, 2): did not learn at any LR of the grid")
        assert row["notes"][1].startswith("seed 0: no LRS, did not learn at any LR of the grid (every run diverged or ended "
                                          "at or above the loss at init, 5.0000); seed 1: no LRS")  # fmt: skip
    assert "nor does a seed that did not learn at any LR of the grid" in page


def test_families_that_did_not_learn_are_left_out_of_the_lr_charts_with_a_note(three_families: Path, tmp_path: Path) -> None:
    page = report_page.build_report([three_families], tmp_path).read_text(encoding="utf-8")
    note = f"left out, did not learn at any LR of the grid: {DIVERGES}; {STALLS}"
    for key in ("lr_loss", "lrs"):
        assert {t["meta"]["variant"] for t in figures(page)[f"plot-{key}"]} == {TRAINS}, key
        (annotation,) = layouts(page)[f"plot-{key}"]["annotations"]
        assert (annotation["text"], annotation["y"], annotation["yanchor"]) == (note, 0.01, "bottom")
    study = lr_study(load_runs([three_families]))
    fig = report_figures.panel_figure({p.key: p for p in lr_panels(study)}["lrs"], report_figures.variant_colors(study.families))
    assert note in [t.get_text() for t in fig.axes[0].texts]
    report_figures.plt.close(fig)
    # no family learned: the chart is drawn empty, with the note at its centre
    alone = lr_study([r for r in load_runs([three_families]) if r.config["norm.placement"] == "post"] +
                     [r for r in load_runs([three_families]) if r.config["norm.placement"] == "sandwich"])  # fmt: skip
    (lrs,) = [p for p in lr_panels(alone) if p.key == "lrs"]
    assert (lrs.lines, lrs.note) == ([], note)


def test_lrs_csv_is_rebuilt_from_lr_sensitivity_csv_alone(lr_sweep: tuple[Path, str], tmp_path: Path) -> None:
    out = lr_sweep[0].parent
    path = lrs_tables.rebuild_lrs_csv(out / "lr_sensitivity.csv", tmp_path / "lrs.csv")
    assert path.read_bytes() == (out / "lrs.csv").read_bytes()  # the report's own lrs.csv, byte for byte
    report_page.build_report([out.parent], tmp_path / "with", baseline=PRE)
    rebuilt = lrs_tables.rebuild_lrs_csv(tmp_path / "with" / "lr_sensitivity.csv", tmp_path / "b.csv", baseline=PRE)
    assert rebuilt.read_bytes() == (tmp_path / "with" / "lrs.csv").read_bytes()
    with pytest.raises(ValueError, match=r"unknown --baseline 'norm.placement=none'; valid: .*'norm.placement=post"):
        lrs_tables.rebuild_lrs_csv(out / "lr_sensitivity.csv", tmp_path / "c.csv", baseline="norm.placement=none")


def test_report_lrs_joins_the_seeds_of_one_study_run_as_several_sweeps(tmp_path: Path) -> None:
    # Finding (a)'s seeds 0-2 (8 families, long labels) and seeds 3-16 (2 families, short labels) as one study
    cells = read_csv(Path(__file__).parents[1] / "docs" / "results" / "lr_sensitivity" / "lr_sensitivity.csv")
    first = [r for r in cells if r["seed"] in ("0", "1")]
    later = [{**r, "family": " ".join(r["family"].split()[:1])} for r in cells if r["seed"] == "2"
             and r["family"].split()[0] in ("norm.placement=post", "norm.placement=pre") and "qk=None" in r["family"]
             and "kind=layernorm" in r["family"]]  # fmt: skip
    write_csv(tmp_path / "a.csv", list(cells[0]), [list(r.values()) for r in first])
    write_csv(tmp_path / "b.csv", list(cells[0]), [list(r.values()) for r in later])
    whole, joined = tmp_path / "whole" / "lrs.csv", tmp_path / "joined" / "lrs.csv"
    args = ["--by-preset", "--baseline", "pre_ln", "--families", "post_ln,pre_ln"]
    assert report_lrs.main([str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--out", str(joined), *args]) == 0
    write_csv(tmp_path / "all.csv", list(cells[0]), [list(r.values()) for r in cells])
    assert report_lrs.main([str(tmp_path / "all.csv"), "--out", str(whole), *args]) == 0
    for name in ("lrs.csv", "lrs_seeds.csv"):  # as if the three seeds were one sweep's
        assert (joined.parent / name).read_text() == (whole.parent / name).read_text(), name
    relabelled = [sorted((d / "lr_sensitivity.csv").read_text().splitlines()) for d in (joined.parent, whole.parent)]
    assert relabelled[0] == relabelled[1] and len(relabelled[0]) == 1 + 2 * 3 * 7  # the same cells, in file order
    assert [r["family"] for r in read_csv(joined)] == ["post_ln", "pre_ln"] and read_csv(joined)[0]["n"] == "3"
    with pytest.raises(ValueError, match=r"cell family 'post_ln' seed 2 lr 0.0003 is given twice"):
        lrs_tables.rebuild_lrs_csv([tmp_path / "b.csv", tmp_path / "all.csv"], tmp_path / "c" / "lrs.csv", by_preset=True)
    with pytest.raises(ValueError, match=r"unknown --families 'pre_lm'; valid: .*'post_ln', 'pre_ln'"):
        lrs_tables.rebuild_lrs_csv(tmp_path / "b.csv", tmp_path / "d" / "lrs.csv", by_preset=True, families=["pre_lm"])


def test_the_committed_lrs_csv_is_what_its_lr_sensitivity_csv_gives(tmp_path: Path) -> None:
    results = Path(__file__).parents[1] / "docs" / "results" / "lr_sensitivity"
    baseline = "norm.placement=pre norm.kind=layernorm norm.qk=None"
    assert report_lrs.main([str(results / "lr_sensitivity.csv"), "--out", str(tmp_path / "lrs.csv"), "--baseline", baseline]) == 0
    assert (tmp_path / "lrs.csv").read_text() == (results / "lrs.csv").read_text()
    assert (tmp_path / "lrs_seeds.csv").read_text() == (results / "lrs_seeds.csv").read_text()
    seeds = read_csv(results / "lrs_seeds.csv")
    post = {r["seed"]: float(r["lrs"]) for r in seeds if r["family"].startswith("norm.placement=post")}
    assert post == {"0": pytest.approx(1.5083, abs=1e-4), "1": pytest.approx(1.1928, abs=1e-4),
                    "2": pytest.approx(1.5850, abs=1e-4)}  # fmt: skip
    rows = {r["family"]: r for r in read_csv(results / "lrs.csv")}
    deepnorm = rows["norm.placement=deepnorm norm.kind=layernorm norm.qk=None"]
    # DeepNorm's low LRS (0.23) is measured from a best loss of 2.96 nats, against pre-LN's 0.70: read side by side
    assert float(deepnorm["lrs_mean"]) == pytest.approx(0.2323, abs=1e-4)
    assert float(deepnorm["best_loss_mean"]) == pytest.approx(2.9614, abs=1e-4)
    assert float(rows[baseline]["best_loss_mean"]) == pytest.approx(0.6976, abs=1e-4)


def test_report_lrs_takes_a_family_label_as_the_page_spells_it(tmp_path: Path) -> None:
    results = Path(__file__).parents[1] / "docs" / "results" / "lr_sensitivity"
    baseline = "norm.placement=pre norm.kind=layernorm norm.qk=null"  # the page shows null; the CSVs hold None
    assert report_lrs.main([str(results / "lr_sensitivity.csv"), "--out", str(tmp_path / "lrs.csv"), "--baseline", baseline]) == 0
    assert (tmp_path / "lrs.csv").read_text() == (results / "lrs.csv").read_text()


def test_a_study_with_the_optimizer_as_a_factor_names_each_family_by_both_presets() -> None:
    # the labels of a sweep over norm=pre_ln,pre_ln_qk x optim=adamw,muon,muon_qk_clip, as its report wrote them
    muon = ("optim.muon.adjust_lr_fn={} optim.muon.lr_scale=1 optim.muon.momentum=0.95 optim.muon.nesterov=True "
            "optim.muon.ns_coefficients=(3.4445, -4.775, 2.0315) optim.muon.ns_steps=5")  # fmt: skip
    absent = "optim.muon.adjust_lr_fn=? optim.muon.lr_scale=? optim.muon.momentum=? optim.muon.nesterov=? " \
             "optim.muon.ns_coefficients=? optim.muon.ns_steps=?"  # fmt: skip
    no_clip, clip = (
        "optim.qk_clip=None optim.qk_clip.alpha=? optim.qk_clip.tau=?",
        "optim.qk_clip=? optim.qk_clip.alpha=0.5 optim.qk_clip.tau=100",
    )
    assert study_name(f"norm.qk=None {absent} {no_clip}") == "pre_ln adamw"
    assert study_name(f"norm.qk=layernorm {muon.format('match_rms_adamw')} {no_clip}") == "pre_ln_qk muon"
    assert study_name(f"norm.qk=None {muon.format('match_rms_adamw')} {clip}") == "pre_ln muon_qk_clip"
    assert study_name(f"norm.qk=None {muon.format('original')} {no_clip}") is None  # no optim preset sets it
    assert study_name("norm.placement=pre norm.kind=derf") == "pre_derf"  # no optim key: the norm preset alone
    assert study_name("norm.kind=nosuchkind optim.qk_clip=None") is None


def test_families_are_relabelled_by_the_norm_preset_their_keys_name(tmp_path: Path) -> None:
    assert preset_of("norm.placement=pre norm.kind=derf") == "pre_derf"
    assert preset_of("norm.kind=layernorm norm.gpas=True model.residual_streams=1") == "pre_ln_gpas"  # model.* not compared
    assert preset_of("norm.kind=rmsnorm norm.placement=res_post norm.qk_scope=full norm.eps=1e-06") == "olmo2"
    # pre_ln, pre_ln_qk, pre_ln_gpas, ... all fit; pre_ln alone holds norm_base.yaml's values in the keys not shown
    assert preset_of("norm.placement=pre norm.kind=layernorm") == "pre_ln"
    assert preset_of("norm.kind=dyt") == "pre_dyt"  # not pre_dyt_lm: its alpha_init_* are not the base's
    study = "norm.placement={} norm.kind={} norm.qk=None norm.gain=plain norm.gpas=False norm.hc=None norm.qk_scope=head"
    assert preset_of(study.format("pre", "layernorm")) == "pre_ln"  # pre_pn fits too, but sets norm.blocks
    assert preset_of(study.format("pre", "rmsnorm")) == "pre_rms"
    assert preset_of("norm.kind=nosuchkind") is None
    header = "family,seed,lr,final_val_loss,init_loss,capped_loss,state,max_attn_logit\n"
    families = (("norm.kind=derf", 1.0), ("norm.kind=layernorm norm.gpas=True", 1.2))
    cells = [f"{fam},{seed},{lr},{loss},3.0,{loss},finished,\n" for fam, base in families
             for seed in (0, 1) for lr, loss in ((1e-3, base + 0.1 * seed), (1e-2, base + 0.5))]  # fmt: skip
    (tmp_path / "cells.csv").write_text(header + "".join(cells))
    out = tmp_path / "lrs.csv"
    assert report_lrs.main([str(tmp_path / "cells.csv"), "--out", str(out), "--baseline", "pre_ln_gpas", "--by-preset"]) == 0
    rows = {r["family"]: r for r in csv.DictReader(out.open())}
    assert list(rows) == ["pre_derf", "pre_ln_gpas"] and rows["pre_derf"]["baseline"] == "pre_ln_gpas"
    assert float(rows["pre_derf"]["diff_mean"]) == pytest.approx(0.0)  # LRS 0.25 (seed 0), 0.2 (seed 1) in both
    relabelled = list(csv.DictReader((tmp_path / "lr_sensitivity.csv").open()))
    assert [r["family"] for r in relabelled] == ["pre_derf"] * 4 + ["pre_ln_gpas"] * 4
    (tmp_path / "bad.csv").write_text(header + "norm.kind=nosuchkind,0,0.001,1,3,1,finished,\n")
    with pytest.raises(ValueError, match="family 'norm.kind=nosuchkind' names no single norm preset"):
        lrs_tables.rebuild_lrs_csv(tmp_path / "bad.csv", tmp_path / "x" / "lrs.csv", by_preset=True)
    with pytest.raises(ValueError, match="its input: give an --out in another folder"):
        lrs_tables.rebuild_lrs_csv(tmp_path / "lr_sensitivity.csv", tmp_path / "lrs.csv", by_preset=True)


CELLS_HEADER = "family,seed,lr,final_val_loss,init_loss,capped_loss,state,max_attn_logit\n"


def test_report_lrs_on_a_csv_with_the_wrong_columns_names_the_file_and_columns_and_writes_nothing(tmp_path, capsys):
    seeds = tmp_path / "lrs_seeds.csv"  # the per-seed CSV given where the cells are expected
    seeds.write_text("variant,seed,lrs,best_loss\npre_ln,0,0.3,1.2\n")
    out = tmp_path / "out" / "lrs.csv"
    assert report_lrs.main([str(seeds), "--out", str(out)]) == 1
    assert capsys.readouterr().err == (f"report_lrs: error: {seeds}: missing column(s) family, lr, final_val_loss, "
                                       "init_loss, state; expected family, seed, lr, final_val_loss, init_loss, state "
                                       "(the file has variant, seed, lrs, best_loss)\n")  # fmt: skip
    assert not out.parent.exists()


@pytest.mark.parametrize("text", ["", CELLS_HEADER], ids=["empty_file", "header_only"])
def test_report_lrs_on_an_empty_csv_is_an_error_and_writes_nothing(tmp_path, capsys, text):
    cells = tmp_path / "lr_sensitivity.csv"
    cells.write_text(text)
    assert report_lrs.main([str(cells)]) == 1
    columns = "family, seed, lr, final_val_loss, init_loss, state"
    why = "no rows below the header (an empty CSV)" if text else f"an empty file; expected a CSV with the columns {columns}"
    assert capsys.readouterr().err == f"report_lrs: error: {cells}: {why}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lr_sensitivity.csv"]  # no lrs.csv, no lrs_seeds.csv


def test_a_study_with_the_attention_control_as_a_factor_names_each_family_by_its_attn_preset() -> None:
    # the labels of a sweep over norm=pre_ln x attn=none,qk_norm,gate,sink,softpick,softcap: the control's model keys
    # and norm.qk differ between the families
    label = "model.attn_gate={} model.attn_sink={} model.attn_softcap={} model.attn_softmax={} norm.qk={}"
    assert study_name(label.format("None", "False", "None", "softmax", "None")) == "pre_ln"  # attn=none: no suffix
    assert study_name(label.format("None", "False", "None", "softmax", "layernorm")) == "pre_ln_qk"  # the norm preset's
    assert study_name(label.format("elementwise", "False", "None", "softmax", "None")) == "pre_ln gate"
    assert study_name(label.format("None", "True", "None", "softmax", "None")) == "pre_ln sink"
    assert study_name(label.format("None", "False", "None", "softpick", "None")) == "pre_ln softpick"
    assert study_name(label.format("None", "False", "50", "softmax", "None")) == "pre_ln softcap"
    assert study_name(label.format("headwise", "False", "None", "softmax", "None")) is None  # no attn preset sets it
