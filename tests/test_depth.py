"""The report's depth CSVs and depth-growth table (analysis/depth.py) on synthetic run directories: every
``depth_profile.csv`` value is the one written into metrics.jsonl, the growth ratios and their mean ± stderr match
hand computations, and runs without telemetry get neither the CSVs nor the table."""

import csv
import json
from pathlib import Path

import pytest

from analysis.depth import GROWTH_COLUMNS, PROFILE_COLUMNS, block_name, growth
from analysis.runs import Run
from reporting import page as report_page
from tests.helpers.runs import N_DEC, N_ENC, TELEMETRY_STEPS, config, finished, metric_rows, rms, table, write_run

VARIANT_A = "norm.placement=pre norm.kind=layernorm"
VARIANT_B = "norm.placement=post norm.kind=rmsnorm"


def kurtosis(seed: int, depth: int) -> float:
    return 3.0 + depth / 3 + seed / 7  # not exact in binary: the CSV must keep every digit


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 variants x 2 seeds of tests/test_report.py's runs (rms and grad of each block at steps 1, 50, 100), with each
    block's kurtosis recorded at step 100 only; returns the report's folder."""
    root = tmp_path_factory.mktemp("profiled")
    for (placement, kind), offset in ((("pre", "layernorm"), 1.0), (("post", "rmsnorm"), 2.0)):
        for seed in (0, 1):
            rows = metric_rows(offset, seed, 0.1)
            last = next(r for r in rows if r["step"] == 100 and "act/enc.0.out/rms" in r)
            last.update({f"act/{block_name(d, N_ENC)}.out/kurtosis": kurtosis(seed, d) for d in range(N_ENC + N_DEC)})
            write_run(root / f"{placement}_{seed}", config(placement, kind, seed), rows, finished(0.1))
    out = root / "report"
    report_page.build_report([root], out)
    return out


def test_depth_profile_csv_holds_the_values_written(profiled: Path) -> None:
    rows = read_csv(profiled / "depth_profile.csv")
    assert tuple(rows[0]) == PROFILE_COLUMNS
    assert len(rows) == 4 * len(TELEMETRY_STEPS) * (N_ENC + N_DEC)  # runs x steps x blocks
    offsets = {"pre": 1.0, "post": 2.0}
    for row in rows:
        seed, step, depth = int(row["seed"]), int(row["step"]), int(row["depth"])
        assert row["variant"] == (VARIANT_A if row["run"].startswith("pre") else VARIANT_B)
        assert row["run"] == f"{row['run'].split('_')[0]}_{seed}"
        assert float(row["rms"]) == rms(offsets[row["run"].split("_")[0]], seed, step, depth)  # exact: floats as repr
        assert float(row["grad"]) == 0.5 / (1 + depth) + 0.01 * step
        assert row["kurtosis"] == (repr(kurtosis(seed, depth)) if step == 100 else "")
    blocks = [(int(r["depth"]), r["block"]) for r in rows if r["run"] == "pre_0" and r["step"] == "1"]
    assert blocks == [(0, "enc.0"), (1, "enc.1"), (2, "dec.0"), (3, "dec.1")]
    order = [(r["run"], r["step"]) for r in rows[::4]][:4]  # variants in the tables' order (found first), then seed, step
    assert order == [("post_0", "1"), ("post_0", "50"), ("post_0", "100"), ("post_1", "1")]


def enc_dec_rows(step: int, enc: list[float], dec: list[float]) -> dict:
    return {"step": step, **{f"act/enc.{i}.out/rms": v for i, v in enumerate(enc)},
            **{f"act/dec.{i}.out/rms": v for i, v in enumerate(dec)}}  # fmt: skip


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One variant (3 encoder, 2 decoder blocks) of three seeds. At step 1 the encoder's block-output RMS is 1, 1, 1
    (seeds 0 and 1) and 1, 1, 2 (seed 2), the decoder's 1, 1 for all; at step 100 the encoder's is 1, 2, 4 (seed 0)
    and 1, 1.5, 2 (seed 1), the decoder's 0.5, 1.5 and 0.5, 0.5; seed 2 stopped after step 1."""
    root = tmp_path_factory.mktemp("grown")
    records = {
        0: [enc_dec_rows(1, [1.0, 1.0, 1.0], [1.0, 1.0]), enc_dec_rows(100, [1.0, 2.0, 4.0], [0.5, 1.5])],
        1: [enc_dec_rows(1, [1.0, 1.0, 1.0], [1.0, 1.0]), enc_dec_rows(100, [1.0, 1.5, 2.0], [0.5, 0.5])],
        2: [enc_dec_rows(1, [1.0, 1.0, 2.0], [1.0, 1.0])],
    }
    for seed, rows in records.items():
        cfg = config("pre", "layernorm", seed, **{"model.n_enc_layers": 3})
        write_run(root / f"s{seed}", cfg, rows, finished(0.1) if seed < 2 else None)
    path = report_page.build_report([root], root / "report")
    return path.parent, path.read_text(encoding="utf-8")


def test_growth_is_last_over_first_block_mean_stderr_over_seeds(grown: tuple[Path, str]) -> None:
    rows = read_csv(grown[0] / "depth_growth.csv")
    assert tuple(rows[0]) == GROWTH_COLUMNS
    got = {(r["stack"], r["step_kind"]): (r["step"], r["n"], r["mean"], r["stderr"], json.loads(r["per_run"])) for r in rows}
    # encoder, last: 4 / 1 and 2 / 1, mean 3, sample std sqrt(2), stderr sqrt(2) / sqrt(2) = 1; seed 2 never got there
    assert got["enc", "last"] == ("100", "2", "3.0", "1.0", {"s0": 4.0, "s1": 2.0})
    assert got["dec", "last"] == ("100", "2", "2.0", "1.0", {"s0": 3.0, "s1": 1.0})  # 1.5 / 0.5, 0.5 / 0.5
    # encoder, first: 1, 1, 2: mean 4/3, sample std sqrt(1/3), stderr sqrt(1/3) / sqrt(3) = 1/3
    step, n, mean, stderr, per_run = got["enc", "first"]
    assert (step, n, per_run) == ("1", "3", {"s0": 1.0, "s1": 1.0, "s2": 2.0})
    assert float(mean) == pytest.approx(4 / 3) and float(stderr) == pytest.approx(1 / 3)
    assert got["dec", "first"] == ("1", "3", "1.0", "0.0", {"s0": 1.0, "s1": 1.0, "s2": 1.0})
    assert all(r["variant"] == "norm.placement=pre norm.kind=layernorm norm.impl=custom" for r in rows)
    profile = read_csv(grown[0] / "depth_profile.csv")
    assert len(profile) == 5 * 5 and all(r["grad"] == r["kurtosis"] == "" for r in profile)  # rms recorded only
    assert [r["block"] for r in profile[:5]] == ["enc.0", "enc.1", "enc.2", "dec.0", "dec.1"]  # n_enc from the config


def test_growth_table_sits_under_the_depth_charts(grown: tuple[Path, str]) -> None:
    page = grown[1]
    rows, _ = table(page, "data-growth")
    (row,) = rows.values()
    assert row["enc:last"] == ("3.0", "3.000 ± 1.000 (n = 2, step 100)")
    assert row["dec:last"] == ("2.0", "2.000 ± 1.000 (n = 2, step 100)")
    assert row["enc:first"][1] == "1.333 ± 0.333 (n = 3, step 1)"
    assert page.index('id="plot-grad_vs_depth"') < page.index("data-growth") < page.index("</body>")
    assert page.index('id="plot-rms_vs_depth"') < page.index('id="plot-grad_vs_depth"')
    assert '<a href="depth_growth.csv">' in page and '<a href="depth_profile.csv">' in page


def test_growth_needs_both_end_blocks_at_that_step() -> None:
    # a non-finite RMS is not kept (analysis/load.py): with enc.2 missing at step 100, enc.1 / enc.0 is no growth
    run = Run(Path("r"), "r", profiles={"rms": {1: {0: 1.0, 1: 2.0, 2: 4.0, 3: 1.0}, 100: {0: 1.0, 1: 2.0, 3: 1.0}}}, n_enc=3)
    assert growth(run, "enc", 1) == 4.0 and growth(run, "enc", 100) is None
    assert growth(run, "dec", 1) is None  # one decoder block: no growth
    assert growth(Run(Path("r"), "r", profiles={"rms": {1: {0: 0.0, 1: 2.0}}}, n_enc=2), "enc", 1) is None  # first block 0


def test_a_non_finite_value_is_an_empty_cell_and_one_run_has_no_stderr(tmp_path: Path) -> None:
    cfg = config("pre", "layernorm", 0)
    del cfg["model"]["n_enc_layers"]  # the encoder's depth as far as the telemetry shows: enc.1 is named at step 1
    rows = [{**enc_dec_rows(1, [1.0, None], [1.0, 2.0]), "grad/enc.1/norm": 0.3}, enc_dec_rows(10, [1.0, 3.0], [2.0, 1.0])]
    write_run(tmp_path / "r", cfg, rows, finished(0.1))
    path = report_page.build_report([tmp_path / "r"], tmp_path / "report")
    profile = read_csv(path.parent / "depth_profile.csv")
    assert [(r["step"], r["block"], r["rms"], r["grad"]) for r in profile[:4]] == [
        ("1", "enc.0", "1.0", ""), ("1", "enc.1", "", "0.3"), ("1", "dec.0", "1.0", ""), ("1", "dec.1", "2.0", "")]  # fmt: skip
    growths = {
        (r["stack"], r["step_kind"]): (r["n"], r["mean"], r["stderr"], r["per_run"])
        for r in read_csv(path.parent / "depth_growth.csv")
    }
    assert growths == {
        ("enc", "first"): ("0", "", "", "{}"),  # enc.1 was not finite at step 1
        ("enc", "last"): ("1", "3.0", "", '{"r": 3.0}'),  # one run: no stderr
        ("dec", "first"): ("1", "2.0", "", '{"r": 2.0}'),
        ("dec", "last"): ("1", "0.5", "", '{"r": 0.5}'),
    }
    (row,) = table(path.read_text(encoding="utf-8"), "data-growth")[0].values()
    assert row["enc:first"] == ("", "— (n = 0, step 1)") and row["enc:last"] == ("3.0", "3.000 (n = 1, step 10)")


def test_runs_without_telemetry_get_no_depth_csvs_and_no_table(tmp_path: Path) -> None:
    for seed in (0, 1):
        rows = [{"step": 10, "train/loss": 3.0 + seed}, {"step": 10, "val/loss": 3.1, "val/per": 0.5}]
        write_run(tmp_path / f"s{seed}", config("pre", "layernorm", seed), rows, finished(0.1))
    path = report_page.build_report([tmp_path], tmp_path / "report")
    page = path.read_text(encoding="utf-8")
    assert not (path.parent / "depth_profile.csv").exists() and not (path.parent / "depth_growth.csv").exists()
    assert table(page, "data-growth")[0] == {} and "depth_growth.csv" not in page
    assert (path.parent / "summary.csv").is_file()


def stream_rows(step: int, out: dict[str, list[float]], pre_norm: dict[str, list[float | None]]) -> dict:
    """A telemetry record: ``act/{stack}.{i}.out/rms`` from ``out`` and ``act/{stack}.{i}.ffn.norm_out.in/rms`` from
    ``pre_norm`` where not None."""
    row: dict = {"step": step}
    for stack, values in out.items():
        row |= {f"act/{stack}.{i}.out/rms": v for i, v in enumerate(values)}
    for stack, values in pre_norm.items():
        row |= {f"act/{stack}.{i}.ffn.norm_out.in/rms": v for i, v in enumerate(values) if v is not None}
    return row


@pytest.fixture(scope="module")
def by_placement(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], dict[str, str]]:
    """One run (3 encoder, 2 decoder blocks, one record at step 1) per kind of block, as telemetry records them:
    post-LN (``out`` 1 everywhere, the sum entering each closing norm 1.2, 1.5, 1.8 and 1.25, 2.5), pre-LN (only ``out``:
    1, 1.5, 2 and 1, 2), Mix-LN with block 0 of each stack post-LN (sum 2 then ``out`` 1.5, 3; sum 1.25 then ``out``
    5), and a post-LN run written before the pre-norm site existed (``out`` only, all 1). Returns depth_growth.csv's
    rows by (placement, stack, step_kind)."""
    root = tmp_path_factory.mktemp("by_placement")
    records = {
        "post": stream_rows(1, {"enc": [1.0] * 3, "dec": [1.0] * 2}, {"enc": [1.2, 1.5, 1.8], "dec": [1.25, 2.5]}),
        "pre": stream_rows(1, {"enc": [1.0, 1.5, 2.0], "dec": [1.0, 2.0]}, {}),
        "mix_ln": stream_rows(1, {"enc": [1.0, 1.5, 3.0], "dec": [1.0, 5.0]}, {"enc": [2.0, None, None], "dec": [1.25]}),
        "admin": stream_rows(1, {"enc": [1.0] * 3, "dec": [1.0] * 2}, {}),
    }
    for placement, row in records.items():
        write_run(root / placement, config(placement, "layernorm", 0, **{"model.n_enc_layers": 3}), [row], finished(0.1))
    report_page.build_report([root], root / "report")
    rows = read_csv(root / "report" / "depth_growth.csv")
    return {(r["variant"].split()[0].split("=")[1], r["stack"], r["step_kind"]): r for r in rows}


def test_growth_reads_the_sum_before_a_closing_norm_and_out_elsewhere(by_placement: dict) -> None:
    got = {(p, stack): (r["site"], float(r["mean"])) for (p, stack, kind), r in by_placement.items() if kind == "first"}
    assert got["post", "enc"] == ("ffn.norm_out.in", pytest.approx(1.8 / 1.2))  # not out's 1 / 1
    assert got["post", "dec"] == ("ffn.norm_out.in", 2.0)
    assert got["pre", "enc"] == ("out", 2.0) and got["pre", "dec"] == ("out", 2.0)
    assert got["mix_ln", "enc"] == ("ffn.norm_out.in->out", 1.5)  # out of block 2 / sum entering block 0's norm
    assert got["mix_ln", "dec"] == ("ffn.norm_out.in->out", 4.0)
    assert got["admin", "enc"] == ("out", 1.0)  # recorded without the site: out, and the CSV says so
    assert tuple(by_placement["post", "enc", "first"]) == GROWTH_COLUMNS
