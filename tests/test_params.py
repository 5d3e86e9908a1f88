"""Parameter counts: what a run records in status.json, the report's parameter columns and ratio to the
baseline, and ``scripts.match_params`` at the LR-sensitivity study size."""

import csv
import json
import re
from pathlib import Path

import pytest

import train as train_module
from analysis.load import load_runs
from analysis.lrs import Family
from analysis.paired import BASELINE_COLUMNS, NAME_COLUMNS, PARAMS_BASELINE_COLUMNS, PARAMS_COLUMNS, SUMMARY_COLUMNS
from reporting import page as report_page
from reporting.lrs import lrs_columns
from scripts import match_params
from tests.helpers.config import make_cfg
from tests.helpers.runs import config, finished, metric_rows, table, write_run
from training import match_params as matching
from training.checkpoint import load_checkpoint, model_from

LRS = ["+experiment=lr_sensitivity"]
PRE_LN, MHC, MHC_HC = 471_936, 597_414, 125_478  # counted at the LR-sensitivity size (d_model 64, d_ff 256, 4+4 layers)
SWEEPS = (Path(__file__).resolve().parents[1] / "docs" / "sweeps.md").read_text(encoding="utf-8")
D_FF_STEP = 2 * (2 * 64 + 1) * 4  # one more FFN unit: W1 row + b1 entry + W2 column in each of 4 + 4 FFNs: 1,032


def test_a_tiny_run_records_its_parameters_with_the_tied_matrix_once(tmp_path: Path) -> None:
    quick = ["trainer.max_steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=2", "trainer.log_every=1",
             "trainer.eval_max_examples=5", "trainer.test_max_examples=5", "telemetry=off"]  # fmt: skip
    train_module.train(make_cfg("norm=pre_ln_mhc", *quick), tmp_path)
    recorded = json.loads((tmp_path / "status.json").read_text())["params"]
    model = model_from(load_checkpoint(tmp_path / "checkpoint.pt"))
    every = dict(model.named_parameters(remove_duplicate=False))  # the tied output projection listed twice
    total = sum(p.numel() for p in model.parameters())
    assert recorded == {"total": total, "hc": sum(p.numel() for k, p in every.items() if ".hc." in k or "streams_merge" in k)}
    assert sum(p.numel() for p in every.values()) - total == model.output.weight.numel()  # (tgt_vocab, d_model), once
    assert 0 < recorded["hc"] < total
    assert load_runs([tmp_path])[0].params == total


@pytest.fixture(scope="module")
def sized() -> dict[str, dict[str, int]]:
    """The LR-sensitivity size's counts of pre_ln at d_ff 256, 377, 378, 379 (composed with the override) and mHC's."""
    counts = {f"d_ff={d}": matching.count(matching.model_config([*LRS, "norm=pre_ln", f"model.d_ff={d}"]))
              for d in (256, 377, 378, 379)}  # fmt: skip
    return counts | {"mhc": matching.count(matching.model_config([*LRS, "norm=pre_ln_mhc"]))}


def test_reference_counts_at_the_lr_sensitivity_size(sized: dict[str, dict[str, int]]) -> None:
    assert sized["d_ff=256"] == {"total": PRE_LN, "hc": 0}
    assert sized["mhc"] == {"total": MHC, "hc": MHC_HC}
    assert MHC - MHC_HC == PRE_LN  # hyper-connections are all that mHC adds
    assert sized["d_ff=379"]["total"] - sized["d_ff=378"]["total"] == D_FF_STEP == 1032


def test_match_params_finds_the_d_ff_of_equal_parameters(sized: dict[str, dict[str, int]], capsys) -> None:
    found = matching.match_params([*LRS, "norm=pre_ln_mhc"], ["norm=pre_ln"])
    assert (found.value, found.params, found.target, found.target_hc) == (378, 597_840, MHC, MHC_HC)
    assert (found.given_value, found.given_params, found.gap) == (256, PRE_LN, 426)
    assert found.relative_gap == pytest.approx(426 / MHC) and found.override == "model.d_ff=378"
    assert sized["d_ff=378"]["total"] == found.params  # Hydra's compose with the override gives the same model
    gaps = {d: abs(sized[f"d_ff={d}"]["total"] - MHC) for d in (377, 378, 379)}
    assert gaps == {377: 606, 378: 426, 379: 1458} and abs(found.gap) < D_FF_STEP
    # docs/sweeps.md, "Comparing at equal parameters": the command and what it prints
    command, printed = re.search(r"```bash\npython -m scripts\.match_params (.*?)\n```\n\n```\n(.*?)```", SWEEPS, re.S).groups()
    assert match_params.main(command.split()) == 0
    assert capsys.readouterr().out == printed


def test_match_params_on_d_model_steps_by_n_heads() -> None:
    found = matching.match_params([*LRS, "norm=pre_ln_mhc"], ["norm=pre_ln"], "model.d_model")  # 4 .. 16 x 64
    assert found.value % 4 == 0 and found.value == 76 and found.gap == 6_402 and f"{100 * found.relative_gap:+.2f}" == "+1.07"
    counts = [matching.count(matching.model_config([*LRS, "norm=pre_ln", f"model.d_model={d}"]))["total"]
              for d in (72, 76, 80)]  # fmt: skip
    assert counts[1] == found.params and all(abs(c - MHC) >= abs(found.gap) for c in counts)


def test_closest_takes_the_nearer_neighbour_and_the_smaller_on_a_tie() -> None:
    line = lambda v: 10 * v  # noqa: E731
    assert matching.closest(line, 34, 1, 100, 1) == 3 and matching.closest(line, 36, 1, 100, 1) == 4
    assert matching.closest(line, 35, 1, 100, 1) == 3  # 30 and 40 both 5 away
    assert matching.closest(line, 100, 4, 40, 4) == 8 and matching.closest(line, 40, 4, 40, 4) == 4


def test_bad_key_and_unmatched_ranges_are_clear_errors(capsys) -> None:
    with pytest.raises(ValueError, match=r"^unknown --vary 'model.n_heads'; valid: model.d_ff, model.d_model$"):
        matching.match_params([], ["norm=pre_ln"], "model.n_heads")
    assert match_params.main(["--baseline", "norm=pre_ln", "--vary", "model.x"]) == 1
    assert capsys.readouterr().err == "match_params: error: unknown --vary 'model.x'; valid: model.d_ff, model.d_model\n"
    # the default range: one step to 16 x the baseline's own d_ff (256): 4,096 (pre-LN 4,434,816) is below d_ff=5000
    with pytest.raises(ValueError, match=r"^model.d_ff: no value in \[1, 4096\] matches 5,367,744 parameters: the baseline has "
                                         r"208,776 at 1 and 4,434,816 at 4096;"):  # fmt: skip
        matching.match_params([*LRS, "norm=pre_ln", "model.d_ff=5000"], ["model.d_ff=256"])
    with pytest.raises(
        ValueError,
        match=r"^model.d_ff: no value in \[1, 300\] matches 597,414 parameters: the baseline has "
        r"208,776 at 1 and 517,344 at 300; give another --range, or --vary another key$",
    ):
        matching.match_params([*LRS, "norm=pre_ln_mhc"], ["norm=pre_ln"], value_range=(1, 300))
    with pytest.raises(ValueError, match=r"^--range 5 7 holds no multiple of model.n_heads=4, which model.d_model must be$"):
        matching.match_params([*LRS, "norm=pre_ln_mhc"], ["norm=pre_ln"], "model.d_model", (5, 7))
    with pytest.raises(ValueError, match=r"^--range 0 7: need 1 <= LO <= HI$"):
        matching.match_params([*LRS, "norm=pre_ln_mhc"], ["norm=pre_ln"], value_range=(0, 7))
    with pytest.raises(ValueError, match=r"^no value in \[1, 2\] matches 5 parameters: the baseline has 1 at 1 and 2 at 2$"):
        matching.closest(lambda v: v, 5, 1, 2, 1)


def write(root: Path, placement: str, seed: int, params: dict | None) -> None:
    status = finished(0.1 + seed / 100) | ({"params": params} if params else {})
    write_run(root / f"{placement},seed={seed}", config(placement, "layernorm", seed), metric_rows(1.0, seed, 0.1), status)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_report_gives_parameters_and_their_ratio_to_the_baseline(tmp_path: Path) -> None:
    for seed in (0, 1):
        write(tmp_path / "runs", "pre", seed, {"total": PRE_LN, "hc": 0})
        write(tmp_path / "runs", "sandwich", seed, {"total": MHC, "hc": MHC_HC})
    page = report_page.build_report([tmp_path / "runs"], tmp_path / "out", baseline="pre_ln").read_text(encoding="utf-8")
    summary = read_csv(tmp_path / "out" / "summary.csv")
    columns = [*SUMMARY_COLUMNS, *BASELINE_COLUMNS, *PARAMS_COLUMNS, *PARAMS_BASELINE_COLUMNS, *NAME_COLUMNS]
    assert list(summary[0]) == columns
    other = [r for r in summary if r["variant"] == "norm.placement=sandwich"]
    assert {(r["params"], r["hc_params"], r["params_ratio"]) for r in other} == {(str(MHC), str(MHC_HC), repr(MHC / PRE_LN))}
    assert {r["params_ratio"] for r in summary if r["variant"] == "norm.placement=pre"} == {""}  # not compared to itself
    rows, _ = table(page, "data-variant")
    assert rows["norm.placement=sandwich"]["params"] == (str(MHC), "597,414")
    assert rows["norm.placement=sandwich"]["params:ratio"] == (repr(MHC / PRE_LN), "1.266 (+26.6 %)")
    assert rows["norm.placement=pre"]["params:ratio"] == ("", "")
    runs = read_csv(tmp_path / "out" / "runs.csv")
    assert list(runs[0])[-3:] == ["notes", "params", "hc_params"]  # appended after the older columns
    assert sorted((r["params"], r["hc_params"]) for r in runs) == [(str(PRE_LN), "0")] * 2 + [(str(MHC), str(MHC_HC))] * 2


def test_runs_written_before_the_record_load_with_empty_parameter_cells(tmp_path: Path) -> None:
    for seed in (0, 1):
        write(tmp_path / "runs", "pre", seed, None)
        write(tmp_path / "runs", "post", seed, None)
    run = load_runs([tmp_path / "runs"])[0]
    assert (run.params, run.hc_params, run.finished) == (None, None, True)
    page = report_page.build_report([tmp_path / "runs"], tmp_path / "out", baseline="pre_ln").read_text(encoding="utf-8")
    summary = read_csv(tmp_path / "out" / "summary.csv")
    assert {(r["params"], r["hc_params"], r["params_ratio"]) for r in summary} == {("", "", "")}
    assert {(r["params"], r["hc_params"]) for r in read_csv(tmp_path / "out" / "runs.csv")} == {("", "")}
    rows, _ = table(page, "data-variant")
    assert "params" not in rows["norm.placement=post"]  # nothing to read: left out of the table, named above it


def test_the_lr_table_gives_each_familys_parameters_and_ratio(tmp_path: Path) -> None:
    for seed in (0, 1):
        write(tmp_path, "pre", seed, {"total": PRE_LN, "hc": 0})
        write(tmp_path, "post", seed, {"total": MHC, "hc": MHC_HC})
    runs = load_runs([tmp_path])
    base = Family("pre", [], [r for r in runs if "pre" in r.label], [])
    other = Family("post", [], [r for r in runs if "post" in r.label], [])
    cells = {key: cell for key, _, cell in lrs_columns(base, params=True)}
    assert cells["params"](other) == (MHC, "597,414") and cells["params:ratio"](other)[1] == "1.266 (+26.6 %)"
    assert cells["params:ratio"](base) == (None, "")
    assert "params" not in {key for key, _, _ in lrs_columns(base)}  # runs without counts: no column


def test_a_mistyped_preset_is_one_line_naming_the_valid_ones(capsys) -> None:
    # Hydra's own message is ~45 lines (one option a line, then its config search path)
    assert match_params.main(["norm=pre_ln_mhcc", "--baseline", "norm=pre_ln"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Config search path" not in err
    assert err.startswith("match_params: error: unknown norm preset 'pre_ln_mhcc'; did you mean norm=pre_ln_mhc")
    assert ", pre_ln_mhc, " in err and ", pre_rms_zc, " in err
