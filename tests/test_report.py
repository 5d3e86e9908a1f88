"""scripts/report.py on synthetic run directories (no training): the HTML page's figures and tables hold
the numbers written, broken runs are listed and marked, and (marked ``browser``) the page draws in
headless Chromium without a JavaScript error."""

import csv
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from analysis.load import load_run, load_runs
from analysis.panels import build_panels
from analysis.variants import group_variants
from reporting import figures as report_figures
from reporting import page as report_page
from runlog.tasks import TASKS, MetricSpec, TaskSpec, write_task
from scripts import report
from tests.helpers.runs import (
    DIVERGED_ERROR,
    EVAL_STEPS,
    NAME_A,
    NAME_B,
    STEPS,
    TELEMETRY_STEPS,
    VARIANT_A,
    VARIANT_B,
    VARIANT_LR,
    band_stretches,
    config,
    draw_in_chromium,
    figures,
    finished,
    layouts,
    loss,
    metric_rows,
    rms,
    table,
    traces_of,
    write_run,
)

PANEL_TITLES = ["Training loss", "Validation loss", "Validation PER", "Residual RMS vs depth", "Gradient norm vs depth"]
PNGS = ["loss.png", "val_loss.png", "val_per.png", "rms_vs_depth.png", "grad_vs_depth.png"]
SCALES = ["scale_heatmap_1", "scale_heatmap_2", "scale_heatmap_3"]  # every variant of the sweep recorded telemetry


# run label -> (config, offset of its loss curve, test PER written)
RUNS = {
    "norm=pre_ln,seed=0": (config("pre", "layernorm", 0), 1.0, 0.1234),
    "norm=pre_ln,seed=1": (config("pre", "layernorm", 1, **{"train.resume": "/ckpt/checkpoint.pt"}), 1.2, 0.1432),
    "norm=post_rms,seed=0": (config("post", "rmsnorm", 0), 2.0, 0.2),
    "norm=post_rms,seed=1": (config("post", "rmsnorm", 1), 2.1, 0.25),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A multirun dir: 2 variants x 2 seeds, a diverged run (own variant: lr=1.0), a crashed run (variant B,
    truncated metrics.jsonl, no status.json), and a run that logged nothing (variant B, no status.json)."""
    root = tmp_path_factory.mktemp("sweep")
    (root / "multirun.yaml").write_text("hydra: {}\n")
    for label, (cfg, offset, per) in RUNS.items():
        write_run(root / label, cfg, metric_rows(offset, cfg["seed"], per), finished(per))
    diverged = {"state": "diverged", "step": 40, "max_steps": 100, "wall_s": 30.0, "tokens_per_s": None,
                "error": DIVERGED_ERROR.format(31), "diverged_step": 31, "test": None}  # fmt: skip
    write_run(root / "lr=1.0,seed=0", config("pre", "layernorm", 0, lr=1.0), metric_rows(1.0, 0, None, diverge_at=40), diverged)
    write_run(root / "norm=post_rms,seed=2", config("post", "rmsnorm", 2), metric_rows(2.2, 2, 0.3)[:8], None, truncate=True)
    write_run(root / "norm=post_rms,seed=3", config("post", "rmsnorm", 3), None, None)
    (root / "wandb" / "run-1").mkdir(parents=True)  # wandb's folder is never searched
    return root


@pytest.fixture(scope="module")
def built(sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("report")
    path = report_page.build_report([sweep], out)
    return path, path.read_text(encoding="utf-8")


ALL_LABELS = {*RUNS, "lr=1.0,seed=0", "norm=post_rms,seed=2", "norm=post_rms,seed=3"}


def test_one_trace_per_run_in_each_curve_panel(built: tuple[Path, str]) -> None:
    figs = figures(built[1])
    charts = ["plot-loss", "plot-val_loss", "plot-val_per", "plot-rms_vs_depth", "plot-grad_vs_depth"]
    assert list(figs) == charts + [f"plot-{k}" for k in SCALES]
    for key in ("plot-loss", "plot-val_loss", "plot-val_per"):
        names = [t["name"] for t in figs[key] if t["meta"]["role"] == "run"]
        assert sorted(names) == sorted(ALL_LABELS), key  # each run exactly once
        means = {t["meta"]["variant"]: t["name"] for t in figs[key] if t["meta"]["role"] == "mean"}  # one per variant
        assert means[VARIANT_B] == f"{NAME_B} (mean of 3; 1 logged nothing)" and len(means) == 3  # named by its preset


def test_panel_titles_and_offline_page(built: tuple[Path, str]) -> None:
    path, page = built
    titles = [lay["title"]["text"] for lay in layouts(page).values()]
    scales = [f"Residual RMS per block over training: {v}" for v in ("pre_ln optim.lr=1", NAME_B, NAME_A)]  # the shown names
    assert [t.split(" (")[0] for t in titles] == PANEL_TITLES + scales
    assert 'data-plots-expected="8"' in page
    assert not re.search(r"<script[^>]+src=", page)  # no CDN: plotly.js is inline
    assert "plotly.js v" in page or "plotly.js" in page[:200_000]
    for name in PNGS + [f"{k}.png" for k in SCALES]:
        assert (path.parent / name).stat().st_size > 5000, name


def test_variant_mean_and_band_are_over_seeds(built: tuple[Path, str]) -> None:
    traces = figures(built[1])["plot-loss"]
    mean = next(t for t in traces if t["meta"]["role"] == "mean" and t["meta"]["variant"] == VARIANT_A)
    want = [np.mean([loss(1.0, 0, s), loss(1.2, 1, s)]) for s in STEPS]
    assert mean["x"] == STEPS
    np.testing.assert_allclose(mean["y"], want, rtol=1e-12)
    (band,) = [t for t in traces if t["meta"]["role"] == "band" and t["meta"]["variant"] == VARIANT_A]
    ((x, hi, lo),) = band_stretches(band)
    assert x == STEPS
    np.testing.assert_allclose(hi, [loss(1.2, 1, s) for s in STEPS])  # max
    np.testing.assert_allclose(lo, [loss(1.0, 0, s) for s in STEPS])  # min
    # the diverged run's own variant: null losses from step 40 leave gaps in the mean, not NaN text
    lr_mean = next(t for t in traces if t["meta"]["role"] == "mean" and t["meta"]["variant"] == VARIANT_LR)
    assert lr_mean["y"][:3] == pytest.approx([loss(1.0, 0, s) for s in STEPS[:3]]) and lr_mean["y"][3:] == [None] * 7


def test_depth_profiles(built: tuple[Path, str]) -> None:
    traces = figures(built[1])["plot-rms_vs_depth"]
    a = {t["name"]: t for t in traces if t["meta"]["variant"] == VARIANT_A}
    assert sorted(a) == sorted(f"{NAME_A} @ step {s}" for s in TELEMETRY_STEPS)
    last = a[f"{NAME_A} @ step 100"]
    assert last["x"] == [0, 1, 2, 3]
    np.testing.assert_allclose(last["y"], [np.mean([rms(1.0, 0, 100, d), rms(1.2, 1, 100, d)]) for d in range(4)])
    grads = figures(built[1])["plot-grad_vs_depth"]
    # the crashed seed 2 recorded step 1 but not step 100: that profile says it is over 2 of the 3 runs with metrics
    want = [f"{NAME_B} @ step 1", f"{NAME_B} @ step 100 (n = 2 of 3)"]
    assert sorted(t["name"] for t in grads if t["meta"]["variant"] == VARIANT_B) == want


def test_run_table(built: tuple[Path, str]) -> None:
    rows, classes = table(built[1], "data-run")
    assert set(rows) == ALL_LABELS
    assert rows["norm=pre_ln,seed=1"]["test/per"] == ("0.1432", "14.32")
    assert rows["norm=pre_ln,seed=0"]["state"][1] == "finished" and rows["norm=pre_ln,seed=0"]["diverged"][1] == "no"
    assert rows["norm=pre_ln,seed=0"]["wall_s"][1] == "2 min 05 s"
    diverged = rows["lr=1.0,seed=0"]
    assert diverged["diverged"][1] == "yes (step 31)" and diverged["state"][1] == "diverged"
    assert classes["lr=1.0,seed=0"] == "diverged"
    assert diverged["test/per"][1] == "—"
    crashed = rows["norm=post_rms,seed=2"]
    assert crashed["state"][1] == "unknown" and crashed["diverged"][1] == "no" and classes["norm=post_rms,seed=2"] == "unknown"
    assert "1 unparsable line" in crashed["notes"][1] and "no status.json" in crashed["notes"][1]
    assert crashed["tokens_per_s"][1] == "1,002"  # no status.json: the median of the logged perf/tokens_per_s
    assert crashed["step"][1] == "60 / 100"  # from metrics.jsonl: rows 1, 10, ..., 60; the one for 70 was cut
    assert "no metrics logged" in rows["norm=post_rms,seed=3"]["notes"][1]


def test_variant_table(built: tuple[Path, str]) -> None:
    rows, _ = table(built[1], "data-variant")
    assert set(rows) == {VARIANT_A, VARIANT_B, VARIANT_LR}
    assert float(rows[VARIANT_A]["test/per"][0]) == pytest.approx((0.1234 + 0.1432) / 2)
    assert rows[VARIANT_A]["finished"][1] == "2 of 2" and rows[VARIANT_B]["finished"][1] == "2 of 4"
    assert rows[VARIANT_LR]["diverged"][1] == "1 of 1" and rows[VARIANT_B]["diverged"][1] == "0 of 4"
    assert float(rows[VARIANT_B]["test/per"][0]) == pytest.approx((0.2 + 0.25) / 2)  # crashed runs have no test PER


def test_variant_table_gives_mean_stderr_n(built: tuple[Path, str]) -> None:
    rows, _ = table(built[1], "data-variant")
    # PER 12.34 and 14.32: mean 13.33, sample std 1.40, stderr = std / sqrt(2) = 0.99
    assert rows[VARIANT_A]["test/per"][1] == "13.33 ± 0.99 (n = 2)"
    assert rows[VARIANT_A]["wall_s"][1] == "2 min 05 s ± 0.0 s (n = 2)"
    assert rows[VARIANT_A]["tokens_per_s"][1] == "2,000 ± 0 (n = 2)"
    assert rows[VARIANT_LR]["test/per"][1] == "— (n = 0)" and rows[VARIANT_LR]["best_val_loss"][1] == "— (n = 0)"
    assert "<th>PER (%): mean ± stderr (n)</th>" in built[1] and "<th>best valid loss: mean ± stderr (n)</th>" in built[1]


def test_tables_show_spike_scores_in_percent(built: tuple[Path, str]) -> None:
    variants, _ = table(built[1], "data-variant")
    # finished(): spike_score_loss = PER / 10, so 1.234 % and 1.432 %: mean 1.333, stderr |a - b| / 2 = 0.099
    assert variants[VARIANT_A]["spike_score_loss"][1] == "1.33 ± 0.10 (n = 2)"
    assert float(variants[VARIANT_A]["spike_score_grad_norm"][0]) == pytest.approx((0.1234 + 0.1432) / 40)
    assert variants[VARIANT_LR]["spike_score_loss"][1] == "— (n = 0)"  # a diverged run is never averaged
    assert "<th>loss spike score (%): mean ± stderr (n)</th>" in built[1]
    runs, _ = table(built[1], "data-run")
    assert runs["norm=pre_ln,seed=1"]["spike_score_loss"] == (repr(0.1432 / 10), "1.43")
    assert runs["norm=post_rms,seed=2"]["spike_score_grad_norm"][1] == "—"  # no status.json


VARIANT_D = "optim.lr=0.01 trainer.max_steps=100"  # 3 seeds, 2 diverge
VARIANT_S = "optim.lr=0.002 trainer.max_steps=20"  # 2 seeds, 20 steps, one validation


@pytest.fixture(scope="module")
def hard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """A report of two variants. D: seed 0 finishes, seeds 1 and 2 diverge at steps 31 and 61 (their
    metrics.jsonl stops at the last logging step before, as train.py's does). S: two runs of 20 steps
    that were evaluated once (one point per validation curve)."""
    root = tmp_path_factory.mktemp("hard")
    for seed, diverge_at in ((0, None), (1, 31), (2, 61)):
        rows = metric_rows(1.0, seed, 0.2 + seed / 100)
        if diverge_at is None:
            status = finished(0.2)
        else:
            rows = [r for r in rows if r["step"] < diverge_at and not any(k.startswith("test/") for k in r)]
            status = {"state": "diverged", "step": 0, "max_steps": 100, "error": DIVERGED_ERROR.format(diverge_at),
                      "diverged_step": diverge_at, "test": None}  # fmt: skip
        write_run(root / f"d{seed}", config("pre", "layernorm", seed, lr=0.01), rows, status)
    for seed in (0, 1):
        rows = [{"step": 10, "train/loss": 3.0 + seed}, {"step": 20, "train/loss": 2.5 + seed},
                {"step": 20, "val/loss": 2.7 + seed, "val/per": 0.6 + seed / 10}, {"step": 20, "test/per": 0.6}]  # fmt: skip
        status = {**finished(0.6), "step": 20, "max_steps": 20}
        write_run(root / f"s{seed}", config("pre", "layernorm", seed, **{"trainer.max_steps": 20}), rows, status)
    path = report_page.build_report([root], tmp_path_factory.mktemp("hard_report"))
    return path, path.read_text(encoding="utf-8"), root


def test_mean_is_drawn_only_where_every_seed_has_a_value(hard: tuple[Path, str]) -> None:
    (mean,) = traces_of(hard[1], "plot-loss", VARIANT_D, "mean")
    assert mean["name"] == f"pre_ln {VARIANT_D} (mean of 3)" and mean["x"] == STEPS
    assert mean["y"][:3] == pytest.approx([np.mean([loss(1.0, seed, s) for seed in range(3)]) for s in (10, 20, 30)])
    assert mean["y"][3:] == [None] * 7  # not the survivors' mean after seed 1 diverged
    assert mean["hovertext"] == ["n = 3 of 3"] * 3 + ["n = 2 of 3"] * 3 + ["n = 1 of 3"] * 4
    (band,) = traces_of(hard[1], "plot-loss", VARIANT_D, "band")
    ((x, _, _),) = band_stretches(band)
    assert x == [10, 20, 30]  # the band ends with the mean
    # validation at 50 (seeds 0, 2) and 100 (seed 0): never all three, so no mean at all
    assert traces_of(hard[1], "plot-val_loss", VARIANT_D, "mean")[0]["y"] == [None, None]


def test_each_diverged_run_is_marked_at_its_last_finite_value(hard: tuple[Path, str]) -> None:
    marks = traces_of(hard[1], "plot-loss", VARIANT_D, "diverged")
    got = sorted((t["x"], t["y"], t["hovertext"], t["marker"]["symbol"]) for t in marks)
    assert got == [([30], [pytest.approx(loss(1.0, 1, 30))], ["d1: diverged at step 31"], "x"),
                   ([60], [pytest.approx(loss(1.0, 2, 60))], ["d2: diverged at step 61"], "x")]  # fmt: skip
    (val_mark,) = traces_of(hard[1], "plot-val_loss", VARIANT_D, "diverged")  # seed 1 diverged before any validation
    assert (val_mark["x"], val_mark["y"]) == ([50], [pytest.approx(loss(1.0, 2, 50) + 0.2)])
    runs, classes = table(hard[1], "data-run")
    assert runs["d2"]["diverged"][1] == "yes (step 61)" and classes["d2"] == "diverged"


def test_variant_table_counts_diverged_and_averages_finished_runs_only(hard: tuple[Path, str]) -> None:
    row = table(hard[1], "data-variant")[0][VARIANT_D]
    assert row["diverged"] == ("2", "2 of 3") and row["finished"] == ("1", "1 of 3")
    best = loss(1.0, 0, 100) + 0.2  # seed 0's; seed 2's lower pre-divergence value at step 50 is left out
    assert float(row["best_val_loss"][0]) == pytest.approx(best) and row["best_val_loss"][1] == f"{best:.3f} (n = 1)"
    assert row["test/per"][1] == "20.00 (n = 1)"


def test_a_lone_point_is_drawn_with_a_marker(hard: tuple[Path, str]) -> None:
    for plot in ("plot-val_loss", "plot-val_per"):
        lone = traces_of(hard[1], plot, VARIANT_S, "run") + traces_of(hard[1], plot, VARIANT_S, "mean")
        assert len(lone) == 3 and all(t["mode"] == "lines+markers" and t["marker"]["size"] == [7] for t in lone), plot
    assert {t["mode"] for t in traces_of(hard[1], "plot-loss", VARIANT_S, "run")} == {"lines"}  # two points: a line
    (mean,) = traces_of(hard[1], "plot-val_per", VARIANT_S, "mean")
    assert mean["y"] == [pytest.approx(65.0)] and mean["hovertext"] == ["n = 2 of 2"]  # PER in %
    # the PNG: matplotlib marks the same lone points (S: 2 runs + mean; D: seed 2's one validation) and the divergence
    variants = group_variants(load_runs([hard[2]]))
    val_loss = next(p for p in build_panels(variants, TASKS["g2p"]) if p.key == "val_loss")
    fig = report_figures.panel_figure(val_loss, report_figures.variant_colors(variants))
    marked = sorted((line.get_marker(), str(line.get_markevery())) for line in fig.axes[0].lines if line.get_marker() != "None")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    report_figures.plt.close(fig)
    assert marked == [("o", "[0]")] * 4 + [("x", "None")]
    assert labels.count(report_figures.DIVERGED_LABEL) == 1


def test_the_loss_at_initialization_starts_the_validation_curve_but_is_never_the_best(tmp_path: Path) -> None:
    # train.py logs val/loss at step 0, before the first update. Three runs with an initial loss of 3.8: one that
    # improves on it, one whose validations are all worse, and one that diverged at step 20, before its first.
    initial = {"step": 0, "val/loss": 3.8}
    write_run(tmp_path / "better", config("pre", "layernorm", 0), [initial, *metric_rows(1.0, 0, 0.1)], finished(0.1))
    write_run(tmp_path / "worse", config("pre", "layernorm", 1), [initial, *metric_rows(5.0, 1, 0.9)], finished(0.9))
    diverged = {"state": "diverged", "step": 20, "max_steps": 100, "error": DIVERGED_ERROR.format(20), "diverged_step": 20,
                "test": None}  # fmt: skip
    rows = [initial, {"step": 10, "train/loss": 3.0}]
    write_run(tmp_path / "early", config("pre", "layernorm", 0, lr=1.0), rows, diverged)
    runs = {r.label: r for r in load_runs([tmp_path])}
    assert runs["better"].best("val/loss") == pytest.approx(loss(1.0, 0, 100) + 0.2)  # 1.23, below 3.8
    assert runs["worse"].best("val/loss") == pytest.approx(loss(5.0, 1, 100) + 0.2)  # 5.24, not 3.8
    assert runs["early"].best("val/loss") is None and runs["early"].diverged_at == 20
    panels = {p.key: p for p in build_panels(group_variants(list(runs.values())), TASKS["g2p"])}
    curves = {line.name: line for line in panels["val_loss"].lines if line.role == "run"}
    assert curves["better"].x == [0, *EVAL_STEPS] and curves["better"].y[0] == 3.8
    # The diverged run's x sits on its only validation loss, the one at step 0; the PER chart has none for it.
    marks = {k: [(line.x, line.y) for line in panels[k].lines if line.role == "diverged"] for k in ("val_loss", "val_per")}
    assert marks == {"val_loss": [([0], [3.8])], "val_per": []}


def test_the_divergence_step_is_status_json_s_field_and_older_runs_fall_back_to_their_first_null_loss(tmp_path: Path) -> None:
    # the step was once parsed out of the error message with a regex.
    rows = metric_rows(1.0, 0, None, diverge_at=20)
    status = {"state": "diverged", "step": 20, "max_steps": 100, "error": "NonFiniteLossError: worded otherwise", "test": None}
    new = load_run(write_run(tmp_path / "new", config("pre", "layernorm", 0), rows, {**status, "diverged_step": 17}), "new")
    old = load_run(write_run(tmp_path / "old", config("pre", "layernorm", 0), rows, status), "old")
    bare = load_run(write_run(tmp_path / "bare", config("pre", "layernorm", 0), metric_rows(1.0, 0, None), status), "bare")
    assert (new.diverged_at, old.diverged_at, bare.diverged_at) == (17, 20, None)  # None: diverged, step unknown
    assert bare.diverged


def test_status_missing_null_loss_means_diverged(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r", config("pre", "layernorm", 0), metric_rows(1.0, 0, None, diverge_at=20), None), "r")
    assert run.diverged and run.status_state == "unknown" and run.diverged_at == 20 and not run.finished


def test_a_run_without_status_json_counts_as_finished_at_max_steps(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r", config("pre", "layernorm", 0), metric_rows(1.0, 0, 0.1), None), "r")
    assert run.status_state == "unknown" and run.last_step == run.max_steps == 100 and run.finished


def test_single_run_dir_is_labelled_by_norm(sweep: Path, tmp_path: Path) -> None:
    runs = load_runs([sweep / "norm=pre_ln,seed=0"])
    assert [v.label for v in group_variants(runs)] == ["norm.placement=pre norm.kind=layernorm norm.impl=custom"]
    assert runs[0].label == "norm=pre_ln,seed=0"


def test_a_run_written_before_a_key_was_renamed_groups_with_one_written_after(tmp_path: Path) -> None:
    old = config("pre", "layernorm", 0, **{"trainer.eval_max_words": 50, "trainer.eval_max_examples": 50})  # abc122c's keys
    new = config("pre", "layernorm", 1, **{"trainer.eval_max_examples": 50})
    for name, cfg in (("old", old), ("new", new)):
        write_run(tmp_path / name, cfg, metric_rows(1.0, cfg["seed"], 0.1), finished(0.1))
    runs = load_runs([tmp_path])
    assert "trainer.eval_max_words" not in runs[1].config and runs[1].config["trainer.eval_max_examples"] == 50
    assert [len(v.runs) for v in group_variants(runs)] == [2]


def test_main_default_out_and_several_dirs(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    one = tmp_path / "one"
    shutil.copytree(sweep / "norm=pre_ln,seed=0", one / "a")
    assert report.main([str(one)]) == 0
    assert (one / "report" / "index.html").is_file()
    assert report.main([str(one)]) == 0  # the report folder is not mistaken for a run
    out = tmp_path / "out"
    assert report.main([str(one), str(sweep / "norm=post_rms,seed=0"), "--out", str(out)]) == 0
    rows, _ = table((out / "index.html").read_text(), "data-run")
    assert set(rows) == {"one/a", "norm=post_rms,seed=0"}
    assert "report: wrote" in capsys.readouterr().out


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: None], ids=["empty", "missing"])
def test_no_runs_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture, make) -> None:
    target = tmp_path / "nothing"
    make(target)
    assert report.main([str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("report: error: ") and str(target) in err and "Traceback" not in err


def test_translation_runs_show_bleu(tmp_path: Path) -> None:
    rows = [{"step": 10, "train/loss": 3.0, "val/loss": 3.1, "val/bleu": 12.5, "val/chrf": 40.0},
            {"step": 10, "test/bleu": 13.25, "test/chrf": 41.0}]  # fmt: skip
    write_run(tmp_path / "mt", config("pre", "layernorm", 0), rows, None)
    path = report_page.build_report([tmp_path / "mt"], tmp_path / "out")
    page = path.read_text()
    assert "plot-val_bleu" in figures(page) and (tmp_path / "out" / "val_bleu.png").is_file()
    assert table(page, "data-run")[0]["mt"]["test/bleu"] == ("13.25", "13.25")


def test_the_task_and_its_metrics_come_from_task_json(tmp_path: Path) -> None:
    spec = TaskSpec(
        "p2g",
        (MetricSpec("ler", "LER", 100.0, "%"), MetricSpec("wer", "WER", 100.0, "%")),
        "ler",
        "data.config:CmudictDataConfig",
    )
    rows = [{"step": 10, "train/loss": 3.0, "val/loss": 3.1, "val/ler": 0.5}, {"step": 10, "test/ler": 0.25, "test/wer": 0.5}]
    write_task(write_run(tmp_path / "p2g", config("pre", "layernorm", 0), rows, None), spec)
    page = report_page.build_report([tmp_path / "p2g"], tmp_path / "out").read_text()
    assert "plot-val_ler" in figures(page) and "Validation LER" in page and "Validation PER" not in page
    assert table(page, "data-run")[0]["p2g"]["test/ler"] == ("0.25", "25.00")


def test_runs_of_several_tasks_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path / "runs" / "mt", config("pre", "layernorm", 0), [{"step": 10, "test/bleu": 13.25}], None)
    write_run(tmp_path / "runs" / "g2p", config("pre", "layernorm", 0), [{"step": 10, "test/per": 0.25}], None)
    assert report.main([str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "report: error: the runs are of several tasks (g2p: 1 runs, translation: 1 runs)" in err


@pytest.mark.browser
def test_page_draws_in_headless_chromium(built: tuple[Path, str], tmp_path: Path) -> None:
    draw_in_chromium(built[0], tmp_path / "profile", charts=5 + len(SCALES))


@pytest.mark.browser
def test_lone_points_and_divergence_marks_are_drawn_in_chromium(hard: tuple[Path, str, Path], tmp_path: Path) -> None:
    dom = draw_in_chromium(hard[0], tmp_path / "profile", charts=6)  # the 5, and D's scale heatmap (S: no telemetry)
    starts = [(m.group(1), m.start()) for m in re.finditer(r'<div id="plot-(\w+)"', dom)]
    charts = {key: dom[a:b] for (key, a), (_, b) in zip(starts, [*starts[1:], ("", len(dom))], strict=True)}
    # SVG markers plotly drew: loss, the 2 divergence x's; each validation chart, S's 2 runs + mean, seed 2's lone point + x
    drawn = {k: charts[k].count('<path class="point"') for k in ("loss", "val_loss", "val_per")}
    assert drawn == {"loss": 2, "val_loss": 5, "val_per": 5}


def test_labels_wrap_at_spaces_and_commas_never_mid_word(built: tuple[Path, str]) -> None:
    page = built[1]
    css = page[page.index("<style>") : page.index("</style>")]
    assert "td.text { text-align: left; max-width: 32em; overflow-wrap: normal; word-break: normal; }" in css
    assert "anywhere" not in css and "break-all" not in css  # neither breaks a label inside a word
    assert '<td data-col="run" data-value="norm=pre_ln,seed=0" class=text>norm=pre_ln,<wbr>seed=0</td>' in page
    shown = f'<td data-col="variant" data-value="{VARIANT_A}" title="{VARIANT_A}" class=text>{NAME_A}</td>'
    assert shown in page  # its name, which breaks at its spaces; its keys on hover


def quiet_sweep(root: Path, wers: list[float]) -> Path:
    """A variant per test WER, one finished run each, with no spike, nothing diverged and no hyper-connection."""
    for i, wer in enumerate(wers):
        status = {**finished(wer / 2), "spike_score_loss": 0.0, "spike_score_grad_norm": 0.0, "params": {"total": 9000, "hc": 0}}
        cfg = config("pre", "layernorm", 0, lr=0.001 * (i + 1))
        write_run(root / f"lr={i},seed=0", cfg, metric_rows(1.0, 0, wer / 2), status)
    return root


def test_columns_with_nothing_to_read_are_hidden_and_named(tmp_path: Path) -> None:
    page = report_page.build_report([quiet_sweep(tmp_path, [0.3, 0.4])], tmp_path / "report").read_text(encoding="utf-8")
    variants, _ = table(page, "data-variant")
    runs, _ = table(page, "data-run")
    hidden = ("diverged", "test/per_1ref", "test/wer_1ref", "spike_score_loss", "spike_score_grad_norm")
    assert all(key not in row for key in hidden for row in [*variants.values(), *runs.values()])
    assert all("notes" not in row for row in runs.values())  # every run read cleanly: no note to show
    # the runs log no first-reference scores (as runs written before them): those columns are left out too
    assert ('<p class="note" data-hidden="diverged,test/per_1ref,test/wer_1ref,spike_score_loss,spike_score_grad_norm">'
            "Columns left out, every value 0 or empty: diverged, 1-ref PER (%): mean ± stderr (n), 1-ref WER (%): mean ± "
            "stderr (n), loss spike score (%): mean ± stderr (n), grad norm spike score (%): mean ± stderr (n).</p>"
            ) in page  # fmt: skip
    assert ("every value 0 or empty: diverged, 1-ref PER (%), 1-ref WER (%), loss spike score (%), grad norm spike score "
            "(%), notes, hyper-connection parameters.</p>") in page  # runs  # fmt: skip
    assert [row["test/wer"][1] for row in runs.values()] == ["30.00", "40.00"]  # the rest is shown
    assert [row["params"][1] for row in [*variants.values(), *runs.values()]] == ["9,000"] * 4


def test_a_sweep_far_from_trained_says_so(tmp_path: Path) -> None:
    page = report_page.build_report([quiet_sweep(tmp_path / "a", [0.99, 0.9])], tmp_path / "ra").read_text(encoding="utf-8")
    assert (
        "<b>Every run is far from trained</b> (test WER ≥ 90 %, the lowest 90.00 %; a trained G2P model is near 25 %): "
        "differences are early-training differences only.</p>"
    ) in page
    page = report_page.build_report([quiet_sweep(tmp_path / "b", [0.99, 0.89])], tmp_path / "rb").read_text(encoding="utf-8")
    assert "far from trained" not in page  # one run spells more than 1 word in 10 right


def test_an_integer_and_its_float_are_one_setting(tmp_path: Path) -> None:
    # norm.alpha_init_attn=1 on one command line and =1.0 on another: the same model, one variant (it was two)
    for seed, alpha in ((0, 1), (1, 1.0), (2, 2.0)):
        write_run(tmp_path / f"a{seed}", config("pre", "dyt", seed, **{"norm.alpha_init_attn": alpha}),
                  metric_rows(1.0, seed, 0.1), finished(0.1))  # fmt: skip
    variants = group_variants(load_runs([tmp_path]))
    assert sorted((v.label, len(v.runs)) for v in variants) == [("norm.alpha_init_attn=1", 2), ("norm.alpha_init_attn=2", 1)]


def test_curves_csv_holds_every_run_s_loss_and_validation_curves(built: tuple[Path, str]) -> None:
    with (built[0].parent / "curves.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    val = ["val/per", "val/wer", "val/per_1ref", "val/wer_1ref"]  # the last two empty: these runs log none
    assert list(rows[0]) == ["variant", "run", "step", "train/loss", "val/loss", *val]
    (_, offset, _), seed = RUNS["norm=post_rms,seed=1"], 1
    mine = {int(r["step"]): r for r in rows if r["run"] == "norm=post_rms,seed=1"}
    assert sorted(mine) == STEPS  # telemetry-only steps (1) hold none of the curves: no row
    for step, row in mine.items():
        assert float(row["train/loss"]) == loss(offset, seed, step)
        if step in EVAL_STEPS:
            assert (float(row["val/loss"]), float(row["val/per"])) == (loss(offset, seed, step) + 0.2, 0.5 - step / 1000)
        else:
            assert row["val/loss"] == row["val/per"] == ""
    diverged = {int(r["step"]): r for r in rows if r["run"] == "lr=1.0,seed=0"}
    assert diverged[40]["train/loss"] == "" and float(diverged[30]["train/loss"]) == loss(1.0, 0, 30)  # None: empty
