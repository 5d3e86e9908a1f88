"""The README stays short, its map of the code names every module, and its links, and every relative link of
docs/*.md, lead somewhere.

A link's target file must exist, and its ``#anchor`` must be a heading of that file (GitHub's
slugs: lower case, punctuation dropped, spaces to hyphens).
"""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# The packages whose every module the README's map of the code names (train.py is a line of its own).
MAPPED = ["model", "training", "telemetry", "runlog", "analysis", "reporting", "benchmarks", "data", "scripts", "hydra_plugins"]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    """Relative link targets of ``page`` outside code blocks (web links and mail left out)."""
    text = _FENCE.sub("", page.read_text())
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_readme_is_at_most_150_lines_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    setup = "python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements-test.txt && "
    first = text.index("```bash")
    train = setup.replace("requirements-test.txt", "requirements.txt") + "python train.py\n"  # without the tests' own
    assert text.index(train) > first and text.index(setup + "python -m pytest -q\n") > first
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup + "python -m pytest -q" in ci
    # the style and the types are checked before the tests, with the settings of pyproject.toml
    # each check on its own line, so that set -e stops CI on it (inside an a && b list it would not), before the tests
    lines = ci.splitlines()
    checks = [lines.index(c) for c in ("ruff check .", "ruff format --check .", "mypy")]
    assert checks == sorted(checks) and checks[-1] < ci[: ci.index(setup + "python -m pytest -q")].count("\n")


def code_map() -> dict[str, set[str]]:
    """The README's map of the code: each row's first word (``model/``, ``train.py``) -> the words of that row and
    of the indented lines under it, a ``.py`` dropped (``tasks/g2p.py`` -> ``tasks/g2p``)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Map of the code") :]
    start = section.index("```\n") + 4
    block = section[start : section.index("```", start)]
    rows: dict[str, set[str]] = {}
    for line in block.splitlines():
        if not line.startswith(" "):
            head, _, line = line.partition(" ")
            rows[head] = set()
        rows[head] |= {w.removesuffix(".py") for w in re.findall(r"[\w/]+(?:\.py)?", line)}
    return rows


def test_the_readme_map_of_the_code_names_every_module():
    rows = code_map()
    assert "train.py" in rows and set(MAPPED) <= {head.rstrip("/") for head in rows}
    for package in MAPPED:
        modules = {p.relative_to(ROOT / package).with_suffix("").as_posix() for p in (ROOT / package).rglob("*.py")}
        missing = {m for m in modules if not m.endswith("__init__")} - rows[f"{package}/"]
        assert not missing, f"README's map of the code: {package}/ does not name {sorted(missing)}"


def test_readme_links_every_docs_page():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in links(ROOT / "README.md")}
    assert set((ROOT / "docs").glob("*.md")) <= linked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target} -> no such file"
        if anchor:
            assert anchor in anchors(dest), f"{page.name}: {target} -> no heading with that anchor in {dest.name}"


def test_docs_sweeps_counts_the_variants_presets_norms_and_runs():
    preset = OmegaConf.load(ROOT / "conf" / "experiment" / "variants.yaml")
    norms = str(preset.hydra.sweeper.params.norm).split(",")
    seeds = str(preset.hydra.sweeper.params.seed).split(",")
    row = next(line for line in (ROOT / "docs" / "sweeps.md").read_text().splitlines() if line.startswith("| `variants` |"))
    every = len(list((ROOT / "conf" / "norm").glob("*.yaml")))
    assert f"{len(norms)} of the {every} norm presets" in row and f"x {len(seeds)} seeds" in row
    assert f"({len(norms) * len(seeds)} runs" in row


def test_readme_names_every_norm_preset():
    text = (ROOT / "README.md").read_text()
    assert [p.stem for p in sorted((ROOT / "conf" / "norm").glob("*.yaml")) if f"`{p.stem}`" not in text] == []


def test_docs_sweeps_has_a_row_for_every_experiment_preset():
    section = (ROOT / "docs" / "sweeps.md").read_text().split("\n## Sweeps\n")[1].split("\n## ")[0]
    rows = re.findall(r"^\| (`[^|]+`) \|", section, re.M)
    named = {name for row in rows for name in re.findall(r"`([\w-]+)`", row)}
    assert [p.stem for p in sorted((ROOT / "conf" / "experiment").glob("*.yaml")) if p.stem not in named] == []
