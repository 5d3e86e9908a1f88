"""scripts.run_values: one telemetry value per run of an LR study, from hand-written run directories whose values are
known: the last record holding the profile, the sites a pattern names, the reduction, the families' preset names."""

from pathlib import Path

import pytest

from analysis.run_values import PROFILE_NAMES, column
from scripts import run_values
from tests.helpers.csvs import read_csv
from tests.helpers.runs import finished, metric_rows, preset_config, rms, write_run

SITES = ("enc.0.self_attn.q", "enc.0.self_attn.k", "enc.0.self_attn.v", "dec.1.cross_attn.k")


def sigma(seed: int, lr: float, step: int, site: str) -> float:
    return 1.0 + seed + 10 * lr + step / 100 + SITES.index(site) / 10  # v (index 2) above q and k: left out by *attn.[qk]


def write_study(root: Path, offsets: dict[str, float], lrs: tuple[float, ...], sigma_steps: tuple[int, ...] = (1, 100)) -> None:
    for preset, offset in offsets.items():
        for lr in lrs:
            rows = metric_rows(offset, 0, 0.3)
            for row in rows:
                if row["step"] in sigma_steps and "act/enc.0.out/rms" in row:  # a telemetry record
                    row.update({f"weight/{site}/sigma_max": sigma(0, lr, row["step"], site) for site in SITES})
            write_run(root / f"{preset}_{lr}", preset_config(preset, 0, lr), rows, finished(0.3))


def test_each_run_gets_the_reduction_over_the_named_sites_at_its_last_record_and_its_preset_name(tmp_path: Path) -> None:
    write_study(tmp_path / "runs", {"pre_ln": 1.0, "post_ln": 2.0}, (0.001, 0.01))
    out = tmp_path / "out" / "values.csv"
    args = [str(tmp_path / "runs"), "--out", str(out), "--by-preset"]
    columns = ["--column", "qk", "sigma_max", "*attn.[qk]", "max", "--column", "enc_rms", "rms", "enc.*", "mean"]
    assert run_values.main(args + columns) == 0
    rows = {(r["family"], float(r["lr"])): r for r in read_csv(out)}
    assert sorted(rows) == [("post_ln", 0.001), ("post_ln", 0.01), ("pre_ln", 0.001), ("pre_ln", 0.01)]
    for (preset, lr), row in rows.items():
        offset = 1.0 if preset == "pre_ln" else 2.0
        assert (row["seed"], row["state"]) == ("0", "finished")
        assert float(row["qk"]) == pytest.approx(sigma(0, lr, 100, "dec.1.cross_attn.k"))  # step 100, not step 1; not v
        assert float(row["enc_rms"]) == pytest.approx((rms(offset, 0, 100, 0) + rms(offset, 0, 100, 1)) / 2)


def test_a_value_comes_from_the_last_record_that_has_it_and_is_empty_where_none_does(tmp_path: Path) -> None:
    write_study(tmp_path / "runs", {"pre_ln": 1.0}, (0.001, 0.01), sigma_steps=(1,))  # sigma_max at step 1 only
    out = tmp_path / "values.csv"
    columns = ["--column", "q", "sigma_max", "*.q", "min", "--column", "sink", "sink_mass", "*", "max"]
    assert run_values.main([str(tmp_path / "runs"), "--out", str(out)] + columns) == 0
    rows = read_csv(out)
    assert [float(r["q"]) for r in rows] == pytest.approx([sigma(0, lr, 1, "enc.0.self_attn.q") for lr in (0.001, 0.01)])
    assert [r["sink"] for r in rows] == ["", ""]  # the runs recorded no sink mass


def test_bad_columns_and_a_folder_without_a_study_exit_2_naming_the_problem(tmp_path: Path, capsys) -> None:
    write_study(tmp_path / "runs", {"pre_ln": 1.0}, (0.001, 0.01))
    base = [str(tmp_path / "runs"), "--out", str(tmp_path / "v.csv"), "--column", "x"]
    assert run_values.main(base + ["sigma", "*", "max"]) == 2
    assert f"unknown profile 'sigma'; valid: {', '.join(PROFILE_NAMES)}" in capsys.readouterr().err
    assert run_values.main(base + ["rms", "*", "median"]) == 2
    assert "unknown reduce 'median'; valid: max, min, mean" in capsys.readouterr().err
    write_study(tmp_path / "one_lr", {"pre_ln": 1.0}, (0.001,))
    assert run_values.main([str(tmp_path / "one_lr"), "--out", str(tmp_path / "v.csv"), "--column", "x", "rms", "*", "max"]) == 2
    assert "no LR family" in capsys.readouterr().err
    assert not (tmp_path / "v.csv").exists()
    with pytest.raises(ValueError, match="needs a name"):
        column("", "rms", "*", "max")
