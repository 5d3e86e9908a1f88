"""A run stopped by SIGTERM or Ctrl-C and resumed logs a row at the step it stopped at, off its logging grid (train.py:
162 between 160 and 170): the report's variant mean and band leave that step out and draw as if the run never stopped,
the band as closed outlines that never span a gap; the run's own line and curves.csv keep the row."""

import csv
from pathlib import Path

import numpy as np
import pytest

from analysis.load import load_runs
from analysis.panels import build_panels
from analysis.stats import curves_band
from analysis.variants import group_variants
from reporting import figures as report_figures
from reporting import page as report_page
from runlog.tasks import TASKS
from tests.helpers.runs import STEPS, band_stretches, config, finished, loss, metric_rows, traces_of, write_run

OFFSETS = {0: 1.0, 1: 1.2, 2: 1.1}  # seed -> its loss curve's offset
STOPPED_AT = 62  # seed 0 was stopped after step 62 and resumed: its row there is off the grid of 10
VARIANT = "norm.placement=pre norm.kind=layernorm norm.impl=custom"  # one variant: labelled by its norm


def sweep(root: Path, resumed: bool) -> Path:
    """3 seeds of one variant, every one finished; with ``resumed`` seed 0 holds train.py's row at the step it was
    stopped at (training keys only: no validation or telemetry is due there)."""
    for seed, offset in OFFSETS.items():
        rows = metric_rows(offset, seed, 0.1)
        if resumed and seed == 0:
            stop = {
                "step": STOPPED_AT,
                "train/loss": loss(offset, seed, STOPPED_AT),
                "optim/lr": 1e-3,
                "perf/tokens_per_s": 1000.0,
            }
            rows = sorted([*rows, stop], key=lambda r: r["step"])  # stable: the final test row stays last
        write_run(root / f"seed={seed}", config("pre", "layernorm", seed), rows, finished(0.1))
    return root


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str, Path]]:
    """(index.html, its text, the sweep) of the sweep with seed 0 resumed, and of the same sweep with no run stopped."""
    built = {}
    for name in ("resumed", "straight"):
        root = sweep(tmp_path_factory.mktemp(name), resumed=name == "resumed")
        path = report_page.build_report([root], tmp_path_factory.mktemp(f"{name}_report"))
        built[name] = path, path.read_text(encoding="utf-8"), root
    return built


def test_the_mean_and_band_of_a_resumed_run_s_variant_are_on_the_steps_every_seed_logged(pages: dict) -> None:
    page = pages["resumed"][1]
    (mean,) = traces_of(page, "plot-loss", VARIANT, "mean")
    losses = [[loss(offset, seed, s) for seed, offset in OFFSETS.items()] for s in STEPS]
    assert mean["x"] == STEPS  # not 62: only seed 0 has it (it was None there, breaking the line)
    assert mean["y"] == [float(np.mean(values)) for values in losses]
    assert mean["hovertext"] == ["n = 3 of 3"] * len(STEPS)
    (band,) = traces_of(page, "plot-loss", VARIANT, "band")
    assert band["fill"] == "toself"
    # one outline: forward along the max, back along the min, with no edge from one end of the chart to the other
    assert band_stretches(band) == [(STEPS, [max(v) for v in losses], [min(v) for v in losses])]
    run = next(t for t in traces_of(page, "plot-loss", VARIANT, "run") if t["name"] == "seed=0")
    assert run["x"] == sorted([*STEPS, STOPPED_AT]) and run["y"][STEPS.index(60) + 1] == loss(1.0, 0, STOPPED_AT)


def test_a_resumed_run_s_variant_draws_as_if_it_never_stopped(pages: dict) -> None:
    for plot in ("plot-loss", "plot-val_loss", "plot-val_per", "plot-rms_vs_depth", "plot-grad_vs_depth"):
        for role in ("mean", "band", "profile"):
            got, want = (traces_of(pages[name][1], plot, VARIANT, role) for name in ("resumed", "straight"))
            assert got == want, (plot, role)


def test_curves_csv_keeps_the_row_of_the_step_a_run_stopped_at(pages: dict) -> None:
    with (pages["resumed"][0].parent / "curves.csv").open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["run"] == "seed=0"]
    assert [int(r["step"]) for r in rows] == sorted([*STEPS, STOPPED_AT])
    (stop,) = [r for r in rows if int(r["step"]) == STOPPED_AT]
    assert (float(stop["train/loss"]), stop["val/loss"]) == (loss(1.0, 0, STOPPED_AT), "")


def test_the_png_draws_the_mean_and_band_unbroken(pages: dict) -> None:
    variants = group_variants(load_runs([pages["resumed"][2]]))
    panel = next(p for p in build_panels(variants, TASKS["g2p"]) if p.key == "loss")
    fig = report_figures.panel_figure(panel, report_figures.variant_colors(variants))
    try:
        (band,) = fig.axes[0].collections  # fill_between: one polygon per stretch without a gap
        mean = next(line for line in fig.axes[0].lines if line.get_label().startswith(VARIANT))
        assert len(band.get_paths()) == 1 and list(mean.get_xdata()) == STEPS
        assert np.isfinite(mean.get_ydata()).all()
    finally:
        report_figures.plt.close(fig)


def test_a_step_one_curve_skipped_is_left_out_and_a_curve_that_stopped_ends_the_mean() -> None:
    resumed = [(10, 1.0), (20, 2.0), (25, 9.0), (30, 3.0)]  # 25: off the grid of 10
    straight = [(10, 3.0), (20, 4.0), (30, 5.0)]
    stopped = [(10, 2.0), (20, 3.0)]  # stopped for good after step 20
    steps, mean, lo, hi, n = curves_band([resumed, straight, stopped])
    assert (steps, mean, lo, hi, n) == ([10, 20, 30], [2.0, 3.0, None], [1.0, 2.0, None], [3.0, 4.0, None], [3, 3, 2])
