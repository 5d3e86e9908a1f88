"""docs/results/provenance.csv: each committed value is its section CSV's, each sd is the arm's over its committed
rows, the difference columns are arithmetic, each row is its spec entry's (docs/results/provenance_cells.yaml), and
each runs' commit is an ancestor of the commit that last wrote the section's CSV. Then the library and the CLI on
small inputs (the re-runs' run dirs are not committed: ``python -m scripts.provenance`` read their values once)."""

import csv
import json
import math
import re
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml

from analysis.provenance import FIELDS, committed_cell, key_text, parse_key, row
from scripts import provenance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
SPEC = yaml.safe_load((RESULTS / "provenance_cells.yaml").read_text(encoding="utf-8"))
HASH = r"[0-9a-f]{7}"


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


ROWS = read(RESULTS / "provenance.csv")


def number(text: str) -> float | None:
    return float(text) if text else None


def test_the_csv_has_one_row_per_spec_entry_in_order() -> None:
    assert list(ROWS[0]) == list(FIELDS) and len(ROWS) == len(SPEC) >= 13
    for r, entry in zip(ROWS, SPEC, strict=True):
        for field in ("section", "folder", "runs_commit", "runs_commit_source", "csv", "metric"):
            assert r[field] == str(entry[field]), (r["section"], field)
        assert parse_key(r["key"]) == {k: str(v) for k, v in entry["key"].items()}
        assert r["rerun_command"] == entry.get("command", "") and r["note"] == entry.get("note", "")
        assert (r["rerun"] != "") == bool(entry.get("run_dir")), r["section"]
        assert r["rerun_commit"] == (entry.get("rerun_commit", "deaf845") if r["rerun"] else ""), r["section"]


@pytest.mark.parametrize("r", ROWS, ids=lambda r: f"{r['section']}-{r['metric'][:14]}")
def test_each_committed_value_and_sd_is_its_section_csvs(r: dict[str, str]) -> None:
    # derived here from the section CSV by hand, not through analysis.provenance
    entry = next(e for e in SPEC if e["section"] == r["section"] and e["metric"] == r["metric"])
    rows = read(RESULTS.parent / r["csv"])
    key = {k: str(v) for k, v in entry["key"].items()}
    found = [x for x in rows if all(x[k] == v for k, v in key.items())]
    assert len(found) == 1
    if r["metric"].startswith("per_run["):
        per_run = json.loads(found[0]["per_run"])
        label = r["metric"][len("per_run[") : -1]
        assert float(r["committed"]) == per_run[label]
        arm = list(per_run.values())
    else:
        assert r["committed"] == found[0][r["metric"]]
        arm_key = {k: key[k] for k in entry["arm"]}
        arm = [float(x[r["metric"]]) for x in rows if all(x[k] == v for k, v in arm_key.items())]
        arm = arm if arm_key else [float(r["committed"])]  # no arm: the cell alone
    assert int(r["arm_n"]) == len(arm)
    if len(arm) > 1:
        assert float(r["arm_sd"]) == pytest.approx(statistics.stdev(arm), rel=1e-12)
    else:
        assert r["arm_sd"] == "" and r["diff_in_sd"] == ""


@pytest.mark.parametrize("r", [r for r in ROWS if r["rerun"]], ids=lambda r: f"{r['section']}-{r['metric'][:14]}")
def test_the_differences_are_arithmetic(r: dict[str, str]) -> None:
    diff = float(r["rerun"]) - float(r["committed"])
    assert float(r["diff"]) == pytest.approx(diff, rel=1e-12, abs=1e-15)
    if r["arm_sd"]:
        assert float(r["diff_in_sd"]) == pytest.approx(diff / float(r["arm_sd"]), rel=1e-12)
    assert r["rerun_command"] and math.isfinite(float(r["rerun"]))


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("r", ROWS, ids=lambda r: f"{r['section']}-{r['metric'][:14]}")
def test_each_runs_commit_is_older_than_the_section_csv(r: dict[str, str]) -> None:
    wrote = git("log", "-1", "--format=%H", "--", f"docs/{r['csv']}").stdout.split()  # the commit of its values
    if not wrote:
        pytest.skip("no git history here (the commits are checked in a clone)")
    commits = re.findall(HASH, r["runs_commit"])
    assert commits, r["runs_commit"]
    for commit in commits:
        assert git("rev-parse", commit).stdout.strip() != wrote[0], (commit, r["csv"])  # runs made before the write
        assert git("merge-base", "--is-ancestor", commit, wrote[0]).returncode == 0, (commit, r["csv"])


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


CELLS = "arm,seed,test/per,ratio\nln,0,0.25,1.5\nln,1,0.35,2.0\nln,2,0.30,2.5\nbn,0,0.40,3.0\n"


def test_committed_cell_takes_the_sd_over_the_arm_and_refuses_a_bad_key(tmp_path: Path) -> None:
    rows = read(write(tmp_path / "runs.csv", CELLS))
    value, sd, n = committed_cell(rows, {"arm": "ln", "seed": 1}, ["arm"], "test/per")
    assert (value, n) == ("0.35", 3) and sd == pytest.approx(0.05)
    assert committed_cell(rows, {"arm": "bn", "seed": 0}, ["arm"], "test/per")[1:] == (None, 1)
    with pytest.raises(ValueError, match="0 rows match"):
        committed_cell(rows, {"arm": "pn", "seed": 0}, ["arm"], "test/per")
    with pytest.raises(ValueError, match="'wer' is not a column"):
        committed_cell(rows, {"arm": "ln", "seed": 0}, ["arm"], "wer")
    assert parse_key(key_text({"a": "x=1 y", "b": 2})) == {"a": "x=1 y", "b": "2"}


def test_a_row_reads_its_rerun_from_a_run_dir_or_a_csv(tmp_path: Path) -> None:
    write(tmp_path / "docs" / "runs.csv", CELLS)
    write(tmp_path / "runs" / "r" / "config.yaml", "seed: 1\n")
    write(tmp_path / "runs" / "r" / "status.json", json.dumps({"state": "finished", "test": {"test/per": 0.4}}))
    write(tmp_path / "runs" / "bench.csv", "arm,seed,ratio\nln,1,2.25\n")
    base = {"section": "s", "folder": "f", "runs_commit": "abc1234", "runs_commit_source": "x", "csv": "runs.csv",
            "key": {"arm": "ln", "seed": 1}, "arm": ["arm"]}  # fmt: skip
    args = (tmp_path / "docs", tmp_path / "runs", provenance.READERS, "deaf845")
    got = dict(zip(FIELDS, row({**base, "metric": "test/per", "run_dir": "r", "command": "c"}, *args), strict=True))
    assert got["rerun"] == 0.4 and got["diff"] == pytest.approx(0.05) and got["diff_in_sd"] == pytest.approx(1.0)
    assert got["rerun_commit"] == "deaf845" and got["key"] == "arm=ln; seed=1"
    later = {**base, "metric": "test/per", "run_dir": "r", "rerun_commit": "b0f1e97"}  # a cell re-run after the others
    assert dict(zip(FIELDS, row(later, *args), strict=True))["rerun_commit"] == "b0f1e97"
    got = dict(zip(FIELDS, row({**base, "metric": "ratio", "run_dir": "bench.csv"}, *args), strict=True))
    assert got["rerun"] == 2.25 and got["diff"] == pytest.approx(0.25) and got["diff_in_sd"] == pytest.approx(0.5)
    got = dict(zip(FIELDS, row({**base, "metric": "ratio", "note": "not re-run"}, *args), strict=True))
    assert got["rerun"] is got["diff"] is None and got["rerun_commit"] == "" and got["note"] == "not re-run"


def test_the_cli_writes_the_rows_and_says_what_is_wrong_in_one_line(tmp_path: Path, capsys) -> None:
    write(tmp_path / "docs" / "runs.csv", CELLS)
    entry = {"section": "s", "folder": "f", "runs_commit": "abc1234", "runs_commit_source": "x", "csv": "runs.csv",
             "key": {"arm": "ln", "seed": 0}, "arm": ["arm"], "metric": "test/per"}  # fmt: skip
    spec = write(tmp_path / "spec.yaml", yaml.safe_dump([entry]))
    argv = [str(spec), "--runs", str(tmp_path), "--rerun-commit", "deaf845", "--docs", str(tmp_path / "docs")]
    assert provenance.main([*argv, "--out", str(tmp_path / "p.csv")]) == 0
    assert [r["committed"] for r in read(tmp_path / "p.csv")] == ["0.25"]
    write(spec, yaml.safe_dump([{**entry, "key": {"arm": "pn", "seed": 0}}]))
    assert provenance.main([*argv, "--out", str(tmp_path / "q.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "arm=pn; seed=0: 0 rows match" in err and not (tmp_path / "q.csv").exists()
