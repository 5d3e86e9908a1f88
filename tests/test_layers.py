"""The floors of docs/architecture.md hold: nothing imports upward or sideways, nothing imports in a circle, the
ground floor (runlog/) uses the standard library only, analysis/ stays torch-free, model/ imports neither Hydra nor
wandb, and the page's table of floors is this file's ``MAY_IMPORT``."""

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What each package may import of normlab's own; a package not listed here is not yet a floor.
MAY_IMPORT = {
    "runlog": set(),
    "data": {"runlog"},
    "model": {"runlog"},
    "telemetry": {"runlog", "model"},
    "training": {"runlog", "data", "model", "telemetry"},
    "analysis": {"runlog"},
    "train": {"runlog", "data", "model", "telemetry", "training"},
    "reporting": {"runlog", "analysis", "data", "model", "training"},
    "benchmarks": {"runlog", "data", "model", "telemetry", "training", "train"},
    "scripts": {"runlog", "data", "model", "telemetry", "training", "analysis", "train", "reporting", "benchmarks"},
}
OURS = set(MAY_IMPORT)


def modules() -> dict[str, Path]:
    out = {"train": ROOT / "train.py"}
    for package in OURS - {"train"}:
        for path in (ROOT / package).rglob("*.py"):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[dotted.removesuffix(".__init__")] = path
    return out


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_no_package_imports_upward_or_sideways():
    bad = []
    for name, path in modules().items():
        home = name.split(".")[0]
        for imported in imports(path):
            top = imported.split(".")[0]
            if top in OURS and top != home and top not in MAY_IMPORT[home]:
                bad.append(f"{name} imports {imported}")
    assert bad == []


def test_runlog_uses_the_standard_library_only_analysis_no_torch_and_model_no_hydra_or_wandb():
    for name, path in modules().items():
        tops = {m.split(".")[0] for m in imports(path)}
        if name.startswith("runlog"):
            assert tops <= set(sys.stdlib_module_names) | {"runlog"}, name
        if name.startswith("analysis"):
            assert "torch" not in tops, name
        if name.startswith("model"):
            assert not tops & {"hydra", "omegaconf", "wandb"}, name


def test_no_import_cycles():
    mods = modules()
    graph = defaultdict(set)
    for name, path in mods.items():
        graph[name] = {m for m in imports(path) if m in mods and m != name}
    done, stack = set(), []

    def visit(node: str) -> None:
        if node in stack:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(node) :] + [node]))
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        stack.pop()
        done.add(node)

    for name in sorted(graph):
        visit(name)


def test_the_architecture_page_states_these_floors():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text[text.index("<!-- floors -->") : text.index("<!-- /floors -->")]
    stated = {}
    for name, allowed in re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.M):
        stated[name] = set() if allowed.startswith("(") else set(allowed.split(", "))
    assert stated == MAY_IMPORT


def test_no_test_file_imports_another_test_file_or_conftest():
    # What several test files share lives in tests/helpers/; a test file imported by another runs its module-level set-up
    # twice and ties the two files' fixtures together.
    bad = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for imported in imports(path):
            if imported.startswith(("tests.test_", "tests.conftest", "test_", "conftest")):
                bad.append(f"{path.name} imports {imported}")
    assert bad == []
