"""scripts.report_regime / analysis.regime: DyT's data regime from run dirs: the final val/loss and saturation per
preset and training fraction, and the paired difference to pre-LN's at the same fraction, against hand computations;
the saturation read from a real pre-DyT run's telemetry."""

import csv
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import train as train_module
from analysis.regime import saturation_at
from scripts import report_regime
from tests.helpers.config import make_cfg

# preset -> fraction -> seed -> final val/loss; pre_dyt's saturation at step 100: 0.4 and 0.6 at its two sites
LOSSES = {
    "pre_ln": {0.01: {0: 2.0, 1: 2.2, 2: 2.1}, 1: {0: 1.0, 1: 1.1, 2: 0.9}},
    "pre_dyt": {0.01: {0: 1.5, 1: 1.7, 2: 1.4}, 1: {0: 1.2, 1: 1.2, 2: 1.3}},
}


def write_run(path: Path, preset: str, fraction: float, seed: int, loss: float) -> None:
    path.mkdir(parents=True)
    cfg = make_cfg(f"norm={preset}", f"data.train_fraction={fraction}", f"seed={seed}")
    OmegaConf.save(cfg, path / "config.yaml")
    rows = [{"step": 0, "val/loss": 4.0}, {"step": 50, "act/enc.0.self_attn.norm_in/saturation": 0.9}]
    sat = {"act/enc.0.self_attn.norm_in/saturation": 0.4, "act/dec.final_norm/saturation": 0.6} if preset == "pre_dyt" else {}
    rows += [{"step": 100, "act/enc.0.out/rms": 1.0, **sat}, {"step": 1000, "val/loss": loss}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "status.json").write_text(json.dumps({"state": "finished", "step": 1000, "max_steps": 1000}))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("regime")
    for preset, by_fraction in LOSSES.items():
        for fraction, by_seed in by_fraction.items():
            for seed, loss in by_seed.items():
                write_run(top / f"{preset},{fraction},{seed}", preset, fraction, seed, loss)
    return top


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_the_regime_table_against_a_hand_computation(sweep, tmp_path, capsys):
    assert report_regime.main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    rows = {(r["preset"], float(r["train_fraction"])): r for r in read(tmp_path / "out" / "regime.csv")}
    assert list(rows) == [("pre_ln", 0.01), ("pre_dyt", 0.01), ("pre_ln", 1.0), ("pre_dyt", 1.0)]
    scarce = rows["pre_dyt", 0.01]
    # differences -0.5, -0.5, -0.7: mean -0.5667, sd 0.11547, t(0.975, 2) = 4.30265 -> half-width 0.28684
    assert float(scarce["diff_mean"]) == pytest.approx(-0.566667, abs=1e-6)
    assert float(scarce["diff_ci95_lo"]) == pytest.approx(-0.853510, abs=1e-6)
    assert float(scarce["diff_ci95_hi"]) == pytest.approx(-0.279824, abs=1e-6)
    assert scarce["significant"] == "True" and scarce["pairs"] == "3" and scarce["n"] == "3"
    assert float(scarce["rel_diff"]) == pytest.approx((1.533333 - 2.1) / 2.1, abs=1e-6)  # -26.98 %
    assert float(scarce["saturation_mean"]) == pytest.approx(0.5)  # step 100's two sites, not step 50's
    plenty = rows["pre_dyt", 1.0]  # differences 0.2, 0.1, 0.4: mean 0.2333, sd 0.1528, half-width 0.3795: covers 0
    assert float(plenty["diff_ci95_lo"]) < 0 < float(plenty["diff_ci95_hi"]) and plenty["significant"] == "False"
    assert float(plenty["rel_diff"]) == pytest.approx((1.233333 - 1.0) / 1.0, abs=1e-6)
    base = rows["pre_ln", 0.01]
    assert base["diff_mean"] == base["saturation_mean"] == "" and float(base["val_loss_mean"]) == pytest.approx(2.1)
    runs = read(tmp_path / "out" / "regime_runs.csv")
    assert len(runs) == 12 and {r["state"] for r in runs} == {"finished"}
    line = "fraction 0.01  pre_dyt    n 3/3  val loss 1.533  saturation@100 0.500  vs pre_ln: -0.567 (-27.0 %)"
    assert line in capsys.readouterr().out


def test_an_unknown_baseline_names_the_presets(sweep, tmp_path, capsys):
    assert report_regime.main([str(sweep), "--out", str(tmp_path), "--baseline", "post_ln"]) == 2
    assert "baseline 'post_ln' is none of the study's presets: pre_dyt, pre_ln" in capsys.readouterr().err


def test_saturation_is_read_from_a_real_pre_dyt_runs_telemetry(tmp_path):
    train_module.train(make_cfg("norm=pre_dyt"), tmp_path)  # telemetry every 5 steps (tests' TINY)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    at_10 = [v for k, v in next(r for r in rows if r["step"] == 10 and "act/enc.0.out/rms" in r).items()
             if k.endswith("/saturation")]  # fmt: skip
    assert len(at_10) >= 4 and saturation_at(tmp_path / "metrics.jsonl", 10) == pytest.approx(sum(at_10) / len(at_10))
    assert saturation_at(tmp_path / "metrics.jsonl", 11) is None  # no record at that step


def test_a_sweep_with_pre_bn_whose_norm_blocks_hold_spaces_is_told_by_its_preset(tmp_path, capsys):
    # pre_bn's norm.blocks (a list: its label value "((('kind', 'layernorm'), ('stack', 'dec')),)") holds spaces
    for preset, losses in (("pre_ln", (1.0, 1.1)), ("pre_bn", (1.3, 1.5))):
        for seed, loss in enumerate(losses):
            write_run(tmp_path / "sweep" / f"{preset},{seed}", preset, 1.0, seed, loss)
    assert report_regime.main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    rows = read(tmp_path / "out" / "regime.csv")
    assert [(r["preset"], r["n"]) for r in rows] == [("pre_ln", "2"), ("pre_bn", "2")]
    assert float(rows[1]["diff_mean"]) == pytest.approx(0.35) and rows[1]["pairs"] == "2"  # (0.3 + 0.4) / 2


def test_an_out_that_is_a_file_is_one_line(sweep, tmp_path, capsys):
    (tmp_path / "taken").write_text("keep")
    assert report_regime.main([str(sweep), "--out", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert err == f"report_regime: error: --out {tmp_path / 'taken'} is a file, not a folder; give a folder for the CSVs\n"
    assert (tmp_path / "taken").read_text() == "keep"
