"""docs/extending.md stays true: every worked example's diff applies to this checkout, and its check passes.

The page marks each example's blocks with ``<!-- example: NAME diff -->`` (a ``git diff``) and
``<!-- example: NAME check -->`` (Python run from the repository root). The diffs are applied
together to one copy of the repository (they touch disjoint files, which is checked), and the
checks run there in one process, so a change to the code an example edits fails this test.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
_BLOCK = re.compile(r"<!-- example: ([\w-]+) (diff|check) -->\n```\w+\n(.*?)^```$", re.S | re.M)
_TOUCHES = re.compile(r"^Touches (\d+) files? \(tests aside\): (.*?)\.\n\n<!-- example: ([\w-]+) diff -->", re.M)
_NOT_COPIED = {".git", ".venv", "outputs", "multirun", "wandb", "__pycache__", ".pytest_cache", ".ruff_cache"}
# Runs every check in one interpreter (one torch import) and names the ones that fail.
_RUNNER = """
import json, sys, traceback
failed = []
for name, code in json.load(sys.stdin).items():
    try:
        exec(compile(code, f"docs/extending.md, check {name}", "exec"), {"__name__": "__check__"})
    except Exception:
        failed.append(name)
        traceback.print_exc()
print("failed checks:", failed)
sys.exit(1 if failed else 0)
"""


def examples() -> dict[str, dict[str, str]]:
    """name -> {"diff": ..., "check": ...}, in page order."""
    found: dict[str, dict[str, str]] = {}
    for name, kind, body in _BLOCK.findall(DOC.read_text()):
        assert kind not in found.get(name, {}), f"example {name!r} has two {kind} blocks"
        found.setdefault(name, {})[kind] = body
    return found


def diff_files(diff: str) -> list[str]:
    """The paths a ``git diff`` touches (new files included)."""
    return re.findall(r"^diff --git a/\S+ b/(\S+)$", diff, re.M)


def test_the_page_has_every_kind_of_extension_with_a_diff_and_a_check():
    found = examples()
    assert list(found) == ["norm-kind", "placement", "attention-site", "telemetry-stat", "task", "dataset", "report-panel"]
    assert all(set(blocks) == {"diff", "check"} for blocks in found.values())


def test_each_example_states_the_files_its_diff_touches():
    found = examples()
    stated = {name: (int(n), re.findall(r"`([^`]+)`", files)) for n, files, name in _TOUCHES.findall(DOC.read_text())}
    assert set(stated) == set(found)
    for name, (count, files) in stated.items():
        touched = [f for f in diff_files(found[name]["diff"]) if not f.startswith("tests/")]
        assert count == len(files) and sorted(files) == sorted(touched), name
    table = dict(re.findall(r"^\| \[[^\]]+\]\(#([\w-]+)\) \| (\d+) \|", DOC.read_text(), re.M))
    assert [int(n) for n in table.values()] == [count for count, _ in stated.values()]


def _copy_with(tmp_path: Path, diffs: dict[str, str]) -> Path:
    """A copy of the repository (without runs' outputs and caches) under ``tmp_path`` with each named diff applied."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=lambda _, names: [n for n in names if n in _NOT_COPIED])
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)  # so git apply resolves paths from this root
    for name, diff in diffs.items():
        applied = subprocess.run(["git", "apply", "-"], cwd=repo, input=diff, text=True, capture_output=True)
        assert applied.returncode == 0, f"the {name} diff no longer applies: {applied.stderr}"
    return repo


def _env(repo: Path, tmp_path: Path) -> dict[str, str]:
    # HOME in tmp_path: the stand-in datasets and any cache land there, not in the user's caches.
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo), "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}


def test_every_example_applies_and_its_check_passes(tmp_path):
    found = examples()
    touched = [f for blocks in found.values() for f in diff_files(blocks["diff"])]
    assert len(touched) == len(set(touched)), "two examples edit one file: they cannot be applied to one copy"
    repo = _copy_with(tmp_path, {name: blocks["diff"] for name, blocks in found.items()})
    checks = {name: blocks["check"] for name, blocks in found.items()}
    run = subprocess.run([sys.executable, "-c", _RUNNER], cwd=repo, input=json.dumps(checks), text=True,
                         capture_output=True, env=_env(repo, tmp_path), timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]


def test_the_new_kind_passes_the_kind_norm_and_cli_tests_unchanged(tmp_path):
    # The page's claim that a kind is one record and one class: the tests that run over the records take the
    # example's kind as they find it, with no other file touched.
    repo = _copy_with(tmp_path, {"norm-kind": examples()["norm-kind"]["diff"]})
    tests = ["tests/test_kinds.py", "tests/test_norms.py", "tests/test_cli.py", "-k", "not test_cli or norm or help"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rA", *tests],
                         cwd=repo, text=True, capture_output=True, env=_env(repo, tmp_path), timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    ran = re.findall(r"^PASSED (\S+prmsnorm\S*)", run.stdout, re.M)
    assert len(ran) >= 5, ran  # the record's checks, its rows, its autocast pair: the new kind was tested
