"""scripts/plot_scales.py on a synthetic metrics.jsonl (no training): blocks named on the axes, a labelled colour bar,
a log axis only over a wide range, one legend for every panel."""

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from reporting import scales
from scripts import plot_scales

BLOCKS = ["enc.0", "enc.1", "enc.2", "dec.0", "dec.1"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """3 encoder + 2 decoder blocks at steps 1, 10, 20: ``out`` RMS from 1 to 100 (wide), ``in`` RMS within 1 %."""
    rows = []
    for step in (1, 10, 20):
        row = {"step": step}
        for depth, block in enumerate(BLOCKS):
            row[f"act/{block}.out/rms"] = 10.0 ** (depth / 2) * (1 + step / 100)
            row[f"act/{block}.in/rms"] = 1.0 + depth / 1000 + step / 10000
        rows.append(row)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.yaml").write_text("model:\n  n_enc_layers: 3\n  n_dec_layers: 2\n")
    return tmp_path


def test_the_heatmap_names_the_blocks_and_labels_its_colour_bar(run_dir: Path) -> None:
    profiles = scales.read_profiles(run_dir, "rms")
    fig = scales.heatmap_figure(profiles, "out", "rms", scales.encoder_depth(run_dir))
    ax, bar = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == BLOCKS  # not -0.5 ... 4.5
    assert list(ax.get_yticks()) == [0, 1, 2, 3, 4]
    assert bar.get_ylabel() == "log10 rms"
    plt.close(fig)


def test_depth_panels_name_the_blocks_share_one_legend_and_use_log_only_over_a_wide_range(run_dir: Path) -> None:
    profiles = scales.read_profiles(run_dir, "rms")
    fig = scales.depth_figure(profiles, None, "rms", 3)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert set(panels) == {"in", "out"}
    assert [t.get_text() for t in panels["out"].get_xticklabels()] == BLOCKS
    assert panels["out"].get_yscale() == "log"  # 1 to 100 x 1.2
    assert panels["in"].get_yscale() == "linear"  # within 1 %: a log axis would read as a flat line
    (legend,) = fig.legends  # one for every panel
    assert [t.get_text() for t in legend.get_texts()] == ["step 1", "step 10", "step 20"]
    assert all(ax.get_legend() is None for ax in fig.axes)
    plt.close(fig)


def test_without_a_config_the_encoder_is_as_deep_as_the_telemetry_names(run_dir: Path) -> None:
    (run_dir / "config.yaml").write_text("model:\n  n_enc_layers: 7\n")
    assert scales.encoder_depth(run_dir) == 7  # the config's, when there is one
    (run_dir / "config.yaml").unlink()
    assert scales.encoder_depth(run_dir) == 3  # act/enc.0 .. enc.2
    assert scales.block_name(2, 3) == "enc.2" and scales.block_name(4, 3) == "dec.1"
    assert [p.name for p in plot_scales.main([str(run_dir), "--out", str(run_dir / "png")])] == [
        "scale_heatmap.png", "scale_vs_depth.png"]  # fmt: skip
