"""The report's per-variant activation scale over training: the seed mean of each block's residual RMS
(``act/{block}.out/rms``) per telemetry step, as ``plot_scales`` draws one run's, in scales.csv, in the page's
heatmap and in its PNG; a variant (or a sweep) without telemetry has none."""

import csv
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from analysis.load import load_runs
from analysis.scales import scale_panels
from analysis.variants import group_variants
from reporting import figures as report_figures
from reporting import page as report_page
from tests.helpers.runs import (
    TELEMETRY_STEPS,
    VARIANT_A,
    VARIANT_B,
    config,
    figures,
    finished,
    layouts,
    metric_rows,
    rms,
    write_run,
)

BLOCKS = ["enc.0", "enc.1", "dec.0", "dec.1"]  # tests.helpers.runs: 2 encoder + 2 decoder blocks
OFFSETS = {VARIANT_A: {0: 1.0, 1: 1.2}, VARIANT_B: {0: 2.0, 1: 2.1, 2: 2.2}}  # variant -> seed -> rms offset
STEPS = {VARIANT_A: TELEMETRY_STEPS, VARIANT_B: [1, 50]}  # B's seed 2 stopped before the record at 100


def untelemetered(rows: list[dict]) -> list[dict]:
    """``rows`` as a run with telemetry=off writes them: no ``act/`` or ``grad/`` metric."""
    return [{k: v for k, v in r.items() if not k.startswith(("act/", "grad/"))} for r in rows]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """(index.html, its text, the sweep). Variant A: 2 seeds recorded at 1, 50, 100. Variant B: 3 seeds, seed 2
    stopped after step 60 (interrupted). A third variant (lr=1) ran with telemetry off."""
    root = tmp_path_factory.mktemp("scales")
    for name, variant, (placement, kind) in (("a", VARIANT_A, ("pre", "layernorm")), ("b", VARIANT_B, ("post", "rmsnorm"))):
        for seed, offset in OFFSETS[variant].items():
            rows, status = metric_rows(offset, seed, 0.1), finished(0.1)
            if seed == 2:
                rows, status = [r for r in rows if r["step"] <= 60 and "test/per" not in r], {"state": "interrupted", "step": 60}
            write_run(root / f"{name},seed={seed}", config(placement, kind, seed), rows, status)
    write_run(root / "c,seed=0", config("pre", "layernorm", 0, lr=1.0), untelemetered(metric_rows(1.0, 0, 0.1)), finished(0.1))
    path = report_page.build_report([root], tmp_path_factory.mktemp("scales_report"))
    return path, path.read_text(encoding="utf-8"), root


def seed_rms(variant: str, step: int, depth: int) -> list[float]:
    return [rms(offset, seed, step, depth) for seed, offset in OFFSETS[variant].items()]


def test_scales_csv_holds_the_seed_mean_of_each_block_s_rms_at_the_steps_every_seed_recorded(
    report: tuple[Path, str, Path],
) -> None:
    with (report[0].parent / "scales.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["variant", "step", "depth", "block", "mean", "stderr", "n"]
    want = [(v, s, d) for v in (VARIANT_A, VARIANT_B) for s in STEPS[v] for d in range(4)]  # not the variant without
    assert [(r["variant"], int(r["step"]), int(r["depth"])) for r in rows] == want
    for row in rows:
        values = seed_rms(row["variant"], int(row["step"]), int(row["depth"]))
        assert row["block"] == BLOCKS[int(row["depth"])] and int(row["n"]) == len(values)
        assert float(row["mean"]) == statistics.fmean(values)
        assert float(row["stderr"]) == statistics.stdev(values) / math.sqrt(len(values))


def test_the_page_draws_a_heatmap_per_variant_with_telemetry_of_its_seed_means(report: tuple[Path, str, Path]) -> None:
    page, out = report[1], report[0].parent
    figs = figures(page)
    assert list(figs)[5:7] == ["plot-scale_heatmap_1", "plot-scale_heatmap_2"]  # after the depth charts
    assert "plot-scale_heatmap_3" not in figs and not (out / "scale_heatmap_3.png").exists()  # telemetry off
    assert f'data-plots-expected="{len(figs)}"' in page
    for j, variant in enumerate((VARIANT_A, VARIANT_B), 1):
        (trace,) = figs[f"plot-scale_heatmap_{j}"]
        assert (trace["type"], trace["meta"]) == ("heatmap", {"role": "heatmap", "variant": variant})
        assert trace["x"] == STEPS[variant] and trace["y"] == [0, 1, 2, 3]
        want = [[statistics.fmean(seed_rms(variant, s, d)) for s in STEPS[variant]] for d in range(4)]
        assert trace["customdata"] == want  # the seed mean at each (block, step), shown on hover
        assert trace["z"] == np.log10(want).tolist()  # the colour
        assert layouts(page)[f"plot-scale_heatmap_{j}"]["yaxis"]["ticktext"] == BLOCKS
        assert (out / f"scale_heatmap_{j}.png").stat().st_size > 5000 and f'href="scale_heatmap_{j}.png"' in page


def test_the_png_is_plot_scales_heatmap_of_the_seed_means(report: tuple[Path, str, Path]) -> None:
    variants = group_variants(load_runs([report[2]]))
    panel = scale_panels(variants)[1]  # B
    fig = report_figures.panel_figure(panel, report_figures.variant_colors(variants))
    try:
        ax, bar = fig.axes
        want = np.log10([[statistics.fmean(seed_rms(VARIANT_B, s, d)) for s in STEPS[VARIANT_B]] for d in range(4)])
        np.testing.assert_array_equal(ax.collections[0].get_array().reshape(4, 2), want)
        assert [t.get_text() for t in ax.get_yticklabels()] == BLOCKS and bar.get_ylabel() == "log10 rms"
        assert ax.get_xlim() == (1 - 24.5, 50 + 24.5)  # each column centred on its step
    finally:
        report_figures.plt.close(fig)


def test_a_sweep_without_telemetry_has_no_scale_chart_nor_csv(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "a", config("pre", "layernorm", 0), untelemetered(metric_rows(1.0, 0, 0.1)), finished(0.1))
    page = report_page.build_report([tmp_path / "runs"], tmp_path / "report").read_text(encoding="utf-8")
    assert not [k for k in figures(page) if "scale" in k] and 'data-plots-expected="5"' in page
    assert not list((tmp_path / "report").glob("scale*"))
