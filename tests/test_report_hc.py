"""The report's hyper-connection charts and CSV (analysis/hyper_connections.py) on synthetic run directories: the
composite gain is read as a per-stack series, hc_gains.csv holds its last and largest values with overflows counted,
and runs without hyper-connections get neither the chart nor the CSV."""

import csv
from pathlib import Path

import numpy as np
import pytest

from analysis.hyper_connections import HC_COLUMNS, hc_gain_panels
from analysis.load import load_runs
from analysis.variants import group_variants
from reporting import page as report_page
from runlog.metric_names import hc_gain
from tests.helpers.runs import TELEMETRY_STEPS, config, finished, metric_rows, write_run


def gain(seed: int, step: int, stack: str, stat: str) -> float:
    """A dynamic-HC-like gain: grows with the step, the backward faster, the decoder's more."""
    return 1 + step * (2 if stat == "bwd_gain" else 1) * (3 if stack == "dec" else 1) / 10 + seed


def hc_rows(seed: int, overflow_at: int | None = None) -> list[dict]:
    return [{"step": step, **{hc_gain(stack, stat).name: None if step == overflow_at and stack == "dec" else
                              gain(seed, step, stack, stat) for stack in ("enc", "dec") for stat in ("fwd_gain", "bwd_gain")}}
            for step in TELEMETRY_STEPS]  # fmt: skip


def test_hc_gains_are_charted_per_stack_and_written_with_their_last_and_largest_values(tmp_path: Path) -> None:
    last = TELEMETRY_STEPS[-1]
    for seed in (0, 1):
        rows = hc_rows(seed, overflow_at=last if seed == 1 else None)  # seed 1's decoder gain overflows at its last record
        write_run(tmp_path / f"hc{seed}", config("pre", "layernorm", seed, **{"norm.hc": "dynamic"}),
                  metric_rows(1.0, seed, 0.1) + rows, finished(0.1))  # fmt: skip
    write_run(tmp_path / "plain", config("pre", "layernorm", 0), metric_rows(1.0, 0, 0.1), finished(0.1))
    variants = group_variants(load_runs([tmp_path]))
    hc = next(v for v in variants if "dynamic" in v.label)
    (panel,) = hc_gain_panels(variants)  # the plain variant has none
    assert panel.key == f"hc_gain_{variants.index(hc) + 1}" and panel.log_y
    lines = {line.name: line for line in panel.lines}
    assert list(lines) == ["enc fwd_gain", "enc bwd_gain", "dec fwd_gain", "dec bwd_gain"]
    assert lines["enc bwd_gain"].dash == "dash" and lines["enc fwd_gain"].dash == "solid"
    np.testing.assert_allclose(lines["enc fwd_gain"].y, [gain(0.5, s, "enc", "fwd_gain") for s in TELEMETRY_STEPS])
    assert lines["dec fwd_gain"].y[-1] is None  # one seed has no finite value there: no mean
    report_page.build_report([tmp_path], tmp_path / "report", baseline="none")
    assert (tmp_path / "report" / panel.key).with_suffix(".png").stat().st_size > 5000
    with (tmp_path / "report" / "hc_gains.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == HC_COLUMNS and {r["variant"] for r in rows} == {hc.label}
    by = {(r["stack"], r["stat"]): r for r in rows}
    enc = by["enc", "bwd_gain"]
    assert (enc["runs"], enc["last_step"], enc["nonfinite"]) == ("2", str(last), "0")
    assert float(enc["last_mean"]) == pytest.approx(gain(0.5, last, "enc", "bwd_gain"))
    assert float(enc["max"]) == float(enc["last_max"]) == pytest.approx(gain(1, last, "enc", "bwd_gain"))
    dec = by["dec", "fwd_gain"]  # seed 1's last finite decoder value is a record earlier; its overflow is counted
    assert dec["nonfinite"] == "1" and dec["last_step"] == str(last)
    before = TELEMETRY_STEPS[-2]
    assert float(dec["last_mean"]) == pytest.approx((gain(0, last, "dec", "fwd_gain") + gain(1, before, "dec", "fwd_gain")) / 2)


def test_runs_without_hyper_connections_get_no_hc_chart_or_csv(tmp_path: Path) -> None:
    write_run(tmp_path / "plain", config("pre", "layernorm", 0), metric_rows(1.0, 0, 0.1), finished(0.1))
    report_page.build_report([tmp_path], tmp_path / "report")
    assert not (tmp_path / "report" / "hc_gains.csv").exists()
    assert not list((tmp_path / "report").glob("hc_gain_*.png"))
