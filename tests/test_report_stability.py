"""The report's stability charts (analysis/stability.py) on synthetic run directories: the data each chart
plots equals the telemetry written, each chart with data is drawn into a PNG the page links, and runs
written before these metrics existed leave the charts out."""

from pathlib import Path

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.colors import to_hex

from analysis.load import load_runs
from analysis.stability import logz_line, max_logit_lines, sigma_max_lines, site_lines, stability_panels
from analysis.variants import group_variants
from reporting import page as report_page
from runlog.metric_names import (
    WEIGHT_SITES,
    act,
    attn_max_logit,
    attn_stat,
    batch_stat_dist,
    blocks,
    learned_scale,
    output_logits,
    weight_spectrum,
)
from tests.helpers.runs import (
    N_DEC,
    N_ENC,
    TELEMETRY_STEPS,
    VARIANT_A,
    VARIANT_B,
    VARIANT_LR,
    config,
    draw_in_chromium,
    figures,
    finished,
    metric_rows,
    write_run,
)

PNGS = ["attn_max_logit_1.png", "attn_max_logit_2.png", "out_logz.png", "sigma_max_vs_depth_1.png",
        "sigma_max_vs_depth_2.png", "kurtosis_vs_depth.png", "massive_vs_depth.png", "sink_vs_depth.png"]  # fmt: skip
# c0 puts pre-LN at a second LR (1.0, no max logits): an LR axis, so the LR-sensitivity max-logit chart at the
# second-highest LR, 0.002, follows (tests/test_lrs.py; the other LR charts need val/loss at step 0, not logged here)
LR_CHARTS = ["attn_max_logit_lr_2"]
BLOCKS = list(blocks(N_ENC, N_DEC))  # depth d is BLOCKS[d]
ENC_MATRICES = ["self_attn.q", "self_attn.k", "self_attn.v", "self_attn.out", "ffn.in", "ffn.out"]


def attentions(stack: str) -> list[str]:
    return ["self_attn"] + (["cross_attn"] if stack == "dec" else [])


def matrices(stack: str) -> list[str]:
    """The block matrices of a model without an attention gate (model.attn_gate)."""
    return [m for m in WEIGHT_SITES if (stack == "dec" or not m.startswith("cross_attn")) and not m.endswith(".gate")]


def max_logit(seed: int, step: int, d: int, attention: str) -> float:
    return (1 + d) * step / 10 + seed + (0.5 if attention == "cross_attn" else 0.0)  # rising linearly


def logz(seed: int, step: int) -> float:
    return 5 + step / 100 + 0.2 * seed


def sigma(seed: int, step: int, d: int, matrix: str) -> float:
    return 1 + 0.5 * WEIGHT_SITES.index(matrix) + d + step / 100 + 0.01 * seed


def kurtosis(seed: int, step: int, d: int) -> float:
    return 1 + d + step / 50 + seed


# the other block-output profiles charted by depth, each its own made-up values: (metric of block d, value)
DEPTH_CHARTS = {
    "kurtosis_vs_depth": (lambda stack, i: act(stack, i, "out", "kurtosis"), kurtosis),
    "massive_vs_depth": (lambda stack, i: act(stack, i, "out", "massive"), lambda seed, step, d: 6 + 10 * d + step + seed),
    "sink_vs_depth": (
        lambda stack, i: attn_stat(stack, i, "self_attn", "sink_mass"),
        lambda seed, step, d: 0.1 * (d + 1) + step / 1000 + seed / 100,
    ),
}


def stability_rows(seed: int, steps: list[int]) -> list[dict]:
    """Telemetry rows as train.py writes them, of the four metrics the stability charts read."""
    rows = []
    for step in steps:
        row = {"step": step, output_logits("logz").name: logz(seed, step)}
        for d, (stack, i) in enumerate(BLOCKS):
            row.update({metric(stack, i).name: value(seed, step, d) for metric, value in DEPTH_CHARTS.values()})
            row.update({attn_max_logit(stack, i, a).name: max_logit(seed, step, d, a) for a in attentions(stack)})
            row.update({weight_spectrum(stack, i, m, "sigma_max").name: sigma(seed, step, d, m) for m in matrices(stack)})
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Variant A: 2 seeds recorded at steps 1, 50, 100. Variant B: seed 0 likewise, seed 1 only at 1 and 50
    (stopped). Variant LR: a run written before the stability metrics existed."""
    root = tmp_path_factory.mktemp("stability")
    for name, (placement, kind), seed, steps in (("a0", ("pre", "layernorm"), 0, TELEMETRY_STEPS),
                                                 ("a1", ("pre", "layernorm"), 1, TELEMETRY_STEPS),
                                                 ("b0", ("post", "rmsnorm"), 0, TELEMETRY_STEPS),
                                                 ("b1", ("post", "rmsnorm"), 1, TELEMETRY_STEPS[:2])):  # fmt: skip
        rows = metric_rows(1.0, seed, 0.1) + stability_rows(seed, steps)
        write_run(root / name, config(placement, kind, seed), rows, finished(0.1))
    write_run(root / "c0", config("pre", "layernorm", 0, lr=1.0), metric_rows(1.0, 0, 0.1), finished(0.1))
    return root


@pytest.fixture(scope="module")
def variants(sweep: Path) -> dict:
    found = {v.label: v for v in group_variants(load_runs([sweep]))}
    assert list(found) == [VARIANT_A, VARIANT_B, VARIANT_LR]
    return found


def test_max_logit_lines_are_the_mean_over_seeds_per_attention(variants: dict) -> None:
    lines = max_logit_lines(variants[VARIANT_A])
    names = ["enc.0 self_attn", "enc.1 self_attn", "dec.0 self_attn", "dec.0 cross_attn", "dec.1 self_attn", "dec.1 cross_attn"]
    assert [line.name for line in lines] == names
    for line in lines:
        block, attention = line.name.split()
        d = [f"{s}.{i}" for s, i in BLOCKS].index(block)
        assert line.x == TELEMETRY_STEPS and line.role == "series"
        np.testing.assert_allclose(line.y, [np.mean([max_logit(s, t, d, attention) for s in (0, 1)]) for t in TELEMETRY_STEPS])
        assert line.dash == ("dash" if attention == "cross_attn" else "solid") and line.shade == d / 3
    # B: seed 1 stopped after step 50, so no mean at 100 (not seed 0's value alone)
    b = max_logit_lines(variants[VARIANT_B])[0]
    assert b.y[:2] == pytest.approx([max_logit(0.5, t, 0, "self_attn") for t in (1, 50)]) and b.y[2] is None
    assert b.hover == ["n = 2 of 2", "n = 2 of 2", "n = 1 of 2"]


def test_logz_line_is_the_mean_with_a_stderr_band(variants: dict) -> None:
    line = logz_line(variants[VARIANT_A])
    assert line.name == f"{VARIANT_A} (mean ± stderr of 2)" and line.x == TELEMETRY_STEPS
    mean = [logz(0, t) + 0.1 for t in TELEMETRY_STEPS]  # seeds 0 and 1 differ by 0.2: stderr = 0.2 / 2
    np.testing.assert_allclose(line.y, mean)
    np.testing.assert_allclose(line.lo, np.subtract(mean, 0.1))
    np.testing.assert_allclose(line.hi, np.add(mean, 0.1))
    assert logz_line(variants[VARIANT_LR]) is None


def test_sigma_max_lines_are_per_matrix_vs_depth_at_the_last_record(variants: dict, sweep: Path) -> None:
    step, count, lines = sigma_max_lines(variants[VARIANT_A])
    assert (step, count) == (100, "")
    order = ["self_attn.q", "cross_attn.q", "self_attn.k", "cross_attn.k", "self_attn.v", "cross_attn.v",
             "self_attn.out", "cross_attn.out", "ffn.in", "ffn.out"]  # fmt: skip
    assert [line.name for line in lines] == order
    for line in lines:
        depths = [2, 3] if line.name.startswith("cross_attn") else [0, 1, 2, 3]
        assert line.x == depths and line.role == "profile" and line.dash == ("dash" if "cross" in line.name else "solid")
        np.testing.assert_allclose(line.y, [sigma(0.5, 100, d, line.name) for d in depths])
    # shaded by the role's place among MATRIX_ROLES (q, k, v, out, gate, ffn.in, ffn.out), the gate's left unused here
    assert [line.shade for line in lines[::2]] == pytest.approx([0, 1 / 6, 2 / 6, 3 / 6, 5 / 6]) and lines[-1].shade == 1.0
    # B: seed 1's last record is step 50; the chart is at 100, from seed 0 alone, and says so
    step, count, lines = sigma_max_lines(variants[VARIANT_B])
    assert (step, count) == (100, " (n = 1 of 2)")
    np.testing.assert_allclose(lines[0].y, [sigma(0, 100, d, "self_attn.q") for d in range(4)])
    run = load_runs([sweep / "a0"])[0]
    assert list(run.profile("sigma_max")) == [100]  # only the last record is kept
    assert sigma_max_lines(variants[VARIANT_LR]) == (None, "", [])


@pytest.mark.parametrize("key", DEPTH_CHARTS)
def test_kurtosis_massive_and_sink_are_one_line_per_variant_at_its_last_record(variants: dict, key: str) -> None:
    (panel,) = [p for p in stability_panels(list(variants.values())) if p.key == key]
    value = DEPTH_CHARTS[key][1]
    assert [line.name for line in panel.lines] == [f"{VARIANT_A} @ step 100", f"{VARIANT_B} @ step 100 (n = 1 of 2)"]
    assert panel.lines[0].x == [0, 1, 2, 3]
    np.testing.assert_allclose(panel.lines[0].y, [value(0.5, 100, d) for d in range(4)])
    np.testing.assert_allclose(panel.lines[1].y, [value(0, 100, d) for d in range(4)])


def test_report_draws_each_stability_chart_with_data_into_a_linked_png(sweep: Path, tmp_path: Path) -> None:
    path = report_page.build_report([sweep], tmp_path)
    page = path.read_text()
    figs = figures(page)
    shown = [png[:-4] for png in PNGS] + LR_CHARTS
    assert [k for k in figs][8:] == [f"plot-{k}" for k in shown]  # after the 5 charts of every report, 3 scale heatmaps
    assert f'data-plots-expected="{8 + len(shown)}"' in page
    for png in PNGS:
        assert (tmp_path / png).stat().st_size > 5000 and f'href="{png}"' in page, png
    assert not (tmp_path / "attn_max_logit_3.png").exists()  # variant LR recorded none
    traces = {t["name"]: t for t in figs["plot-attn_max_logit_1"]}
    viridis = colormaps["viridis"]  # shallow blocks dark, deep ones light
    assert traces["enc.0 self_attn"]["line"]["color"] == to_hex(viridis(0.0))
    assert traces["dec.1 cross_attn"]["line"] == {"color": to_hex(viridis(0.9)), "dash": "dash", "width": 1.5}
    np.testing.assert_allclose(
        traces["dec.1 cross_attn"]["y"], [np.mean([max_logit(s, t, 3, "cross_attn") for s in (0, 1)]) for t in TELEMETRY_STEPS]
    )


@pytest.mark.browser
def test_stability_charts_draw_in_chromium(sweep: Path, tmp_path: Path) -> None:
    charts = 8 + len(PNGS) + len(LR_CHARTS)  # and 3 scale heatmaps
    draw_in_chromium(report_page.build_report([sweep], tmp_path / "report"), tmp_path / "profile", charts=charts)


def test_runs_without_the_stability_metrics_leave_the_charts_out(tmp_path: Path) -> None:
    write_run(tmp_path / "old", config("pre", "layernorm", 0), metric_rows(1.0, 0, 0.1), finished(0.1))
    assert stability_panels(group_variants(load_runs([tmp_path]))) == []
    path = report_page.build_report([tmp_path], tmp_path / "report")
    assert len(figures(path.read_text())) == 6  # the 5 of every report, the scale heatmap
    assert not [p.name for p in (tmp_path / "report").glob("*.png") if p.name in PNGS]


def bstat_rows(seed: int) -> list[dict]:
    """``bstat/`` rows of a pre-BN run: the encoder's norms (sandwich-like, two slots per residual) and final norm."""
    rows = []
    for step in TELEMETRY_STEPS:
        row = {"step": step, batch_stat_dist("enc", None, "final_norm", "mean").name: 9.0}  # no depth: not charted
        for i in range(N_ENC):
            for site in ("ffn.norm_branch", "ffn.norm_in", "self_attn.norm_in"):
                for stat in ("mean", "var"):
                    row[batch_stat_dist("enc", i, site, stat).name] = (1 + i) * step / 100 + seed + len(site) + (stat == "var")
        rows.append(row)
    return rows


def test_bstat_charts_are_one_per_variant_and_statistic_with_a_line_per_norm(tmp_path: Path) -> None:
    for seed in (0, 1):
        write_run(tmp_path / f"bn{seed}", config("pre", "batchnorm", seed), metric_rows(1.0, seed, 0.1) + bstat_rows(seed),
                  finished(0.1))  # fmt: skip
    (variant,) = group_variants(load_runs([tmp_path]))
    assert [p.key for p in stability_panels([variant])] == ["bstat_mean_dist_1", "bstat_var_dist_1"]  # no phi_dist
    lines = site_lines(variant, "var_dist")
    names = [f"enc.{i} {site}" for i in range(N_ENC) for site in ("self_attn.norm_in", "ffn.norm_in", "ffn.norm_branch")]
    assert [line.name for line in lines] == names  # forward order: residual, then slot
    for line in lines:
        block, site = line.name.split()
        i = int(block[-1])
        assert line.x == TELEMETRY_STEPS and line.dash == "solid"
        np.testing.assert_allclose(line.y, [(1 + i) * t / 100 + 0.5 + len(site) + 1 for t in TELEMETRY_STEPS])
    report_page.build_report([tmp_path], tmp_path / "report")
    assert (tmp_path / "report" / "bstat_mean_dist_1.png").stat().st_size > 5000


def test_gpas_chart_is_silu_g_vs_depth_on_a_linear_axis_and_only_where_runs_have_gpas(tmp_path: Path) -> None:
    # SiLU(g) of block d at a step: from 0 (g = 0, the init) down to below 0 and up, so a log axis could not show it
    silu = lambda seed, step, d: (d - 1) * step / 100 + 0.1 * seed  # noqa: E731
    for seed in (0, 1):
        rows = [{"step": step, **{learned_scale(stack, i, "gpas", "silu_g").name: silu(seed, step, d)
                                  for d, (stack, i) in enumerate(BLOCKS)}} for step in TELEMETRY_STEPS]  # fmt: skip
        write_run(tmp_path / f"g{seed}", config("pre", "layernorm", seed, **{"norm.gpas": True}),
                  metric_rows(1.0, seed, 0.1) + rows, finished(0.1))  # fmt: skip
    (variant,) = group_variants(load_runs([tmp_path]))
    (panel,) = [p for p in stability_panels([variant]) if p.key == "gpas_vs_depth"]
    assert not panel.log_y and [line.name for line in panel.lines] == [f"{variant.label} @ step {s}" for s in TELEMETRY_STEPS]
    for line, step in zip(panel.lines, TELEMETRY_STEPS, strict=True):
        assert line.x == [0, 1, 2, 3]
        np.testing.assert_allclose(line.y, [silu(0.5, step, d) for d in range(4)])
    report_page.build_report([tmp_path], tmp_path / "report")
    assert (tmp_path / "report" / "gpas_vs_depth.png").stat().st_size > 5000
