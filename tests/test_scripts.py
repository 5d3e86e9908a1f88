"""scripts/ run as modules from the repository root (``python -m scripts.report DIR``) with no edits of
``sys.path``; the report's reusable code lives in the ``analysis`` package; every documented command
uses that form; bench composes the norm presets as Hydra does."""

import ast
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

SCRIPTS = ("report", "report_lrs", "bench", "predict", "plot_scales", "wandb_workspace", "probe", "powernorm_reference")
DOCUMENTS = ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))), "scripts/gpu_check.sh"]


def test_every_script_runs_as_a_module_and_answers_help():
    # One interpreter for all (torch imports once); runpy.run_module is what ``python -m`` runs, with
    # the working directory (the repository root) as the only way to find the project's packages.
    code = (
        "import runpy, sys\n"
        f"for name in {SCRIPTS!r}:\n"
        "    sys.argv = [name, '--help']\n"
        "    try:\n"
        "        runpy.run_module(f'scripts.{name}', run_name='__main__', alter_sys=True)\n"
        "    except SystemExit as e:\n"
        "        print(f'== {name} exit {e.code}')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.findall(r"^== (\w+) exit (\S+)$", proc.stdout, re.M) == [(name, "0") for name in SCRIPTS]
    assert proc.stdout.count("usage: ") == len(SCRIPTS)


def test_a_script_run_as_a_file_answers_with_the_command_that_runs_it(tmp_path):
    # issue 20 item 7: ``python scripts/report.py DIR`` ended in a ModuleNotFoundError traceback.
    for script, args in (("report", [str(tmp_path), "--out", "o"]), ("plot_scales", [])):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{script}.py"), *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr == (f"normlab: run it as a module from the repository root: cd {ROOT} && "
                               f"python -m scripts.{script} {' '.join(args)}".rstrip() + "\n")  # fmt: skip


def test_no_script_or_analysis_module_edits_sys_path():
    for path in [*sorted((ROOT / "scripts").glob("*.py")), *sorted((ROOT / "analysis").glob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "path"]
        assert "sys.path" not in names, path.name


def test_the_report_code_is_a_package_not_a_script_file():
    assert not (ROOT / "scripts" / "report_data.py").exists()
    from analysis.load import load_runs
    from analysis.variants import NORM_KEYS
    from scripts import report, wandb_workspace

    assert report.load_runs is load_runs and wandb_workspace.NORM_KEYS is NORM_KEYS  # one definition, shared


def test_every_documented_script_command_is_run_as_a_module():
    for doc in DOCUMENTS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert not re.findall(r"python3? scripts/\S+", text), doc
    commands = {m for doc in DOCUMENTS for m in re.findall(r"python -m scripts\.(\w+)", (ROOT / doc).read_text())}
    assert commands == set(SCRIPTS)  # each script is shown, and each one shown exists


def test_bench_composes_each_norm_preset_as_a_run_does():
    from scripts.bench import NORM_PRESETS, norm_preset

    assert "_base" not in NORM_PRESETS and {"pre_ln", "post_rms", "deepnorm"} <= set(NORM_PRESETS)
    off = {"qk": None, "v": None, "blocks": None, "mix_ln_alpha": 0.25, "decoder_batch_stats": False}  # the keys added since
    assert norm_preset("post_rms") == {"kind": "rmsnorm", "impl": "custom", "placement": "post", "eps": 1e-5, "bias": True, **off}
