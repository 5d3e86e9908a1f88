"""docs/results.md's verdicts are the computed ones: every generated block is recomputed from its claims
file and compared word for word; no verdict word stands in hand-written prose (the rule at the top of the page); a
claims file written before its runs is older in ``git log`` than every CSV it reads; the format docs/sweeps.md
gives loads; ``python -m scripts.verdicts`` writes, checks and refuses bad input with one line."""

import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis.claims import ClaimsError, load_claims
from analysis.verdict_page import BLOCK, SUMMARY, page_blocks, section_block, summary_row
from analysis.verdicts import judge
from scripts import verdicts as cli

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGE = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
CLAIMS = sorted(RESULTS.rglob("claims.yaml"))
VERDICT_WORDS = re.compile(r"reproduced|contradicted|inconclusive|confirmed|difference detected", re.I)
EXEMPT = (r"<!-- verdicts: \S+ -->.*?<!-- /verdicts -->", r"<!-- verdict words -->.*?<!-- /verdict words -->",
          r"```.*?```", r"`[^`\n]*`", r"<!--.*?-->")  # fmt: skip


def by_file(paths: list[Path]) -> list:
    return [pytest.param(p, id=p.relative_to(RESULTS).parent.as_posix()) for p in paths]


@pytest.mark.parametrize("path", by_file(CLAIMS))
def test_each_section_s_block_and_summary_row_are_the_computed_verdicts_word_for_word(path: Path) -> None:
    claims = load_claims(path)
    verdicts = judge(claims, RESULTS)
    blocks = page_blocks(PAGE)
    assert blocks.get(claims.section) == section_block(claims, verdicts, RESULTS), (
        f"block 'verdicts: {claims.section}' differs from the computed verdicts: run python -m scripts.verdicts"
    )
    assert summary_row(PAGE, claims, verdicts, RESULTS) in blocks[SUMMARY].splitlines()


def test_every_block_has_a_claims_file_and_the_summary_a_row_for_each() -> None:
    keys = [m.group(2) for m in BLOCK.finditer(PAGE)]
    sections = [re.search(r"^section: (\S+)", p.read_text(), re.M).group(1) for p in CLAIMS]
    assert sorted(keys) == sorted([SUMMARY, *sections]) and len(set(keys)) == len(keys)
    assert len(page_blocks(PAGE)[SUMMARY].splitlines()) == 2 + len(sections)


def verdict_words(text: str) -> list[str]:
    """The verdict words of ``text`` outside what the page's rule exempts, each with its line."""
    for pattern in EXEMPT:
        text = re.sub(pattern, " ", text, flags=re.S)
    return [line.strip()[:120] for line in text.splitlines() if VERDICT_WORDS.search(line)]


def page_sections() -> list:
    texts = re.split(r"\n(?=## )", PAGE)
    ids = ["top", *(t.splitlines()[0][3:40] for t in texts[1:])]
    return [pytest.param(t, id=i) for t, i in zip(texts, ids, strict=True)]


@pytest.mark.parametrize("text", page_sections())
def test_no_verdict_word_in_hand_written_prose(text: str) -> None:
    found = verdict_words(text)
    assert not found, "verdict words outside the generated blocks (write what the numbers show instead):\n" + "\n".join(found)


def test_the_word_rule_catches_a_verdict_and_exempts_blocks_code_and_the_definition() -> None:
    assert verdict_words("The gap: **Not reproduced** here.\nfine") == ["The gap: **Not reproduced** here."]
    assert verdict_words("so no difference detected") and verdict_words("Inconclusive.")
    exempt = ("<!-- verdicts: x -->\nreproduced\n<!-- /verdicts -->\n`contradicted` in a CSV cell\n"
              "<!-- verdict words -->\n**confirmed**\n<!-- /verdict words -->")  # fmt: skip
    assert verdict_words(exempt) == []


def git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


def order_problems(claims: Path, csvs: list[Path], repo: Path) -> list[str]:
    """Why ``claims`` is not older than every CSV: its first commit must be a strict ancestor of the last commit of
    each CSV (a CSV not committed yet is newer)."""
    added = git("log", "--format=%H", "--diff-filter=A", "--", str(claims), cwd=repo).stdout.split()
    if not added:
        return [f"{claims.name} is not committed"]
    first, problems = added[-1], []
    for path in csvs:
        last = git("log", "-1", "--format=%H", "--", str(path), cwd=repo).stdout.strip()
        if last and (last == first or git("merge-base", "--is-ancestor", first, last, cwd=repo).returncode != 0):
            problems.append(f"{os.path.relpath(path, repo)} (commit {last[:9]}) is not newer than "
                            f"{os.path.relpath(claims, repo)} (commit {first[:9]})")  # fmt: skip
    return problems


def needs_history(repo: Path) -> None:
    if git("rev-parse", "--git-dir", cwd=repo).returncode != 0:
        pytest.skip("no .git: the commit order cannot be read")
    if git("rev-parse", "--is-shallow-repository", cwd=repo).stdout.strip() == "true":
        pytest.skip("a shallow clone: the commit order is incomplete")


def before_files() -> list[Path]:
    return [p for p in CLAIMS if re.search(r"^written: before the runs", p.read_text(), re.M)]


@pytest.mark.parametrize("path", by_file(before_files()))
def test_claims_written_before_the_runs_are_older_than_every_csv_they_read(path: Path) -> None:
    needs_history(ROOT)
    claims = load_claims(path)
    csvs = {RESULTS / side.csv for c in claims.claims if c.contrast for x in (c.contrast, c.minus) if x
            for side in (x.arm, x.baseline) if side} | {RESULTS / c.csv for c in claims.claims if c.csv}  # fmt: skip
    assert not order_problems(path, sorted(csvs), ROOT)


def test_the_order_check_fails_a_claims_file_committed_with_or_after_its_csv(tmp_path) -> None:
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo, claims, data = tmp_path, tmp_path / "claims.yaml", tmp_path / "runs.csv"
    author = ["-c", "user.name=t", "-c", "user.email=t@t"]
    git("init", "-q", cwd=repo)

    def commit(*files: Path) -> None:
        git("add", *map(str, files), cwd=repo)
        git(*author, "commit", "-q", "-m", "c", cwd=repo)

    claims.write_text("before\n"), data.write_text("a\n")
    commit(claims, data)
    assert order_problems(claims, [data], repo)  # the same commit
    data.write_text("b\n")
    commit(data)
    assert order_problems(claims, [data], repo) == []  # the CSV's content is newer
    assert order_problems(claims, [tmp_path / "not_yet.csv"], repo) == []  # not run yet
    later = tmp_path / "later.yaml"
    later.write_text("after\n")
    commit(later)
    assert order_problems(later, [data], repo)  # claims after the CSV


def test_d_growth_seeds_csv_is_depth_growth_csv_s_per_run_values() -> None:
    def rows(path: str) -> list[dict[str, str]]:
        with (RESULTS / path).open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    expected = sorted((r["variant"], r["stack"], r["site"], r["step_kind"], r["step"], re.search(r"seed=(\d+)", run)[1], v)
                      for r in rows("warmup_depth/depth_growth.csv") for run, v in json.loads(r["per_run"]).items())  # fmt: skip
    got = [(*(r[k] for k in ("variant", "stack", "site", "step_kind", "step", "seed")), float(r["growth"]))
           for r in rows("warmup_depth/growth/growth_seeds.csv")]  # fmt: skip
    assert sorted(got) == expected and len(got) == 108


def docs_example() -> str:
    text = (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")
    section = text[text.index("### Claims and verdicts") :]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_the_docs_example_loads_reads_not_yet_run_and_is_judged_once_its_runs_land(tmp_path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(docs_example(), encoding="utf-8")
    claims = load_claims(path)
    assert [v.word.split(":")[0] for v in judge(claims, RESULTS)] == ["not yet run", "not yet run"]
    (tmp_path / "my_sweep").mkdir()
    rows = [f"norm.kind={k},{t},{s},finished,{0.2 + (k == 'layernorm') * (0.01 + s / 1000 + (t == 256) * (0.02 + s * s / 500))}"
            for k in ("rmsnorm", "layernorm") for t in (256, 1024) for s in range(3)]  # fmt: skip
    (tmp_path / "my_sweep" / "runs.csv").write_text("variant,max_tokens,seed,state,test/per\n" + "\n".join(rows) + "\n")
    with pytest.raises(ClaimsError, match="matches more than one row"):  # rms_beats_ln names no batch size
        judge(claims, tmp_path)
    first = "    pair_by: seed\n    arm:"
    path.write_text(docs_example().replace(first, "    pair_by: seed\n    at: {max_tokens: 1024}\n    arm:", 1))
    assert [v.word for v in judge(load_claims(path), tmp_path)] == ["reproduced", "reproduced"]


def test_the_cli_writes_checks_and_refuses_bad_input_with_one_line(tmp_path, capsys) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS / "dyt_data_regime", results / "dyt_data_regime")
    page = tmp_path / "results.md"
    blocks = "<!-- verdicts: summary -->\n<!-- /verdicts -->\n\n## (h) DyT\n\n<!-- verdicts: h -->\nold\n<!-- /verdicts -->\n"
    page.write_text("# R\n\n" + blocks)
    args = ["--page", str(page), "--results", str(results)]
    assert cli.main(["--check", *args]) == 1 and "block 'verdicts: h'" in capsys.readouterr().err
    assert cli.main(args) == 0 and cli.main(["--check", *args]) == 0
    assert page_blocks(page.read_text())["h"] == page_blocks(PAGE)["h"]  # the page's block, recomputed
    (results / "dyt_data_regime" / "claims.yaml").write_text("section: h\nwritten: later\nseeds: [0]\nalpha: 0.05\nclaims: []\n")
    capsys.readouterr()
    assert cli.main(["--check", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown written 'later'" in err
