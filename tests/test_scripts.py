"""scripts/ run as modules from the repository root (``python -m scripts.report DIR``) with no edits of
``sys.path``; the report's reusable code lives in the ``analysis`` package; every documented command
uses that form; bench composes the norm presets as Hydra does, its --csv holds the ratios it prints, and its precision
table the runs it made."""

import ast
import csv
import math
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.config import ROOT

SCRIPTS = (
    "report",
    "report_lrs",
    "bench",
    "predict",
    "plot_scales",
    "wandb_workspace",
    "probe",
    "report_batch_vs_layer",
    "match_params",
    "estimate_time",
    "seeds_needed",
    "report_regime",
    "verdicts",
    "report_contrasts",
    "provenance",
    "run_values",
    "coord_check",
    "lr_transfer",
)
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


def test_a_script_run_as_a_file_from_another_directory_runs_as_the_module_does(tmp_path):
    # The repository is installed (requirements.txt's ``-e .``): ``python scripts/report.py`` finds its packages from any
    # directory, with no path preamble, and answers as ``python -m scripts.report`` does.
    for script in ("report", "plot_scales"):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        as_file = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{script}.py"), "--help"], cwd=tmp_path,
                                 capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        as_module = subprocess.run([sys.executable, "-m", f"scripts.{script}", "--help"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert as_file.returncode == 0, as_file.stderr[-2000:]
        assert as_file.stdout == as_module.stdout != ""


def test_no_script_or_analysis_module_edits_sys_path():
    for path in [*sorted((ROOT / "scripts").glob("*.py")), *sorted((ROOT / "analysis").glob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "path"]
        assert "sys.path" not in names, path.name


def test_scripts_are_command_line_entry_points_only():
    # The libraries behind them live in the packages (reporting/, benchmarks/, training/, analysis/); scripts/ defines
    # each command's main and nothing else, each under 120 lines (its docstring and argparse), and nothing outside
    # tests/ imports it (tests/test_layers.py: no floor may import scripts).
    for path in sorted((ROOT / "scripts").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        assert defined == ([] if path.name == "__init__.py" else ["main"]), path.name
        assert len(path.read_text(encoding="utf-8").splitlines()) < 120, path.name
    from analysis.load import load_runs
    from analysis.variants import NORM_KEYS
    from reporting import page, wandb_workspace

    assert page.load_runs is load_runs and wandb_workspace.NORM_KEYS is NORM_KEYS  # one definition, shared


def test_every_documented_script_command_is_run_as_a_module():
    for doc in DOCUMENTS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert not re.findall(r"python3? scripts/\S+", text), doc
    commands = {m for doc in DOCUMENTS for m in re.findall(r"python -m scripts\.(\w+)", (ROOT / doc).read_text())}
    assert commands == set(SCRIPTS)  # each script is shown, and each one shown exists


def test_bench_composes_each_norm_preset_as_a_run_does():
    from benchmarks.norms import NORM_PRESETS, norm_preset

    assert "_base" not in NORM_PRESETS and {"pre_ln", "post_rms", "deepnorm"} <= set(NORM_PRESETS)
    off = {"qk": None, "v": None, "blocks": None, "mix_ln_alpha": 0.25, "decoder_batch_stats": False}  # the keys added since
    # resolved: the default config's schedule.warmup_steps (conf/schedule/warmup_linear.yaml) and model.n_heads (small.yaml)
    off |= {
        "knobs": {"powernorm": {"warmup_iters": 200, "group_num": 4}},
        "gpas": False,
        "gain": "plain",
        "qk_scope": "head",
        "hc": None,
    }
    off |= {"alpha_init_attn": 0.5, "alpha_init_ffn": 0.5, "alpha_init_final": 0.5, "learned_embed_scale": False}
    assert norm_preset("post_rms") == {"kind": "rmsnorm", "impl": "custom", "placement": "post", "eps": 1e-5, "bias": True, **off}


def test_bench_norms_csv_holds_each_ratio_it_prints(tmp_path, monkeypatch, capsys):
    import torch

    from benchmarks import norms
    from data.batching import Batch
    from scripts import bench

    full = norms.default_model_and_batch

    def eight_words(norm=None, dropout=None):  # the step table's code on 8 of the batch's 400 words: seconds, not minutes
        model, b = full(norm, dropout)
        return model, Batch(b.src[:8], b.tgt_in[:8], b.tgt_out[:8], b.index[:8], 8 * b.tgt_out.shape[1])

    monkeypatch.setattr(norms, "default_model_and_batch", eight_words)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", torch._dynamo.config.recompile_limit)  # bench raises it
    path = tmp_path / "new" / "ratios.csv"
    argv = "norms --kinds layernorm rmsnorm batchnorm --dims 16 32 --rows 64 --rounds 3 --no-compile --step-rounds 2"
    monkeypatch.setattr(sys, "argv", ["bench", *argv.split(), "--presets", "pre_ln", "pre_rms", "pre_bn", "--clock", "cpu",
                                      "--csv", str(path)])  # fmt: skip
    bench.main()
    out = capsys.readouterr().out

    # What it printed, keyed as the CSV's rows: (table, kind_or_preset, impl, mode, rows, d_model) -> the ratio's text.
    printed = {}
    header = out[out.index("\nRatios of forward+backward") :].splitlines()[2]
    names = re.findall(r"RMS/LN \w+|\w+ c/n", header)
    for rows, d, mode, cells in re.findall(r"^ +(\d+) +(\d+) (eager|compiled) +(.*)$", out, re.M):
        for name, cell in zip(names, cells.split(), strict=True):
            what, impl = name.split()
            pair = ("rms_over_ln", "", impl) if what == "RMS/LN" else ("custom_over_native", what, "")
            printed[(*pair, mode, rows, d)] = cell
    for preset, cell in re.findall(r"^  (\w+) custom / native +(\S+)$", out, re.M):
        printed[("step_custom_over_native", preset, "", "eager", "", "")] = cell
    for impl, cell in re.findall(r"^  pre_rms / pre_ln, (\w+) +(\S+)$", out, re.M):
        printed[("step_rms_over_ln", "", impl, "eager", "", "")] = cell

    with path.open(encoding="utf-8", newline="") as f:
        assert f.readline().strip() == ("table,kind_or_preset,impl,mode,rows,d_model,ratio,ratio_q1,ratio_q3,rounds,"
                                        "clock,threads,load1_before,load1_after")  # fmt: skip
        f.seek(0)
        records = list(csv.DictReader(f))
    written = {}
    for r in records:
        key = (r["table"], r["kind_or_preset"], r["impl"], r["mode"], r["rows"], r["d_model"])
        step = r["table"].startswith("step_")
        written[key] = f"{float(r['ratio']):.{3 if step else 2}f}"  # printed with 3 decimals in the step table, 2 above
        assert r["rounds"] == ("2" if step else "3") and r["clock"] == "cpu"
        assert float(r["ratio_q1"]) <= float(r["ratio"]) <= float(r["ratio_q3"])
    # RMS/LN: impl x d; c/n: kind x d; step c/n: preset; step RMS/LN: impl
    assert len(records) == len(written) == 2 * 2 + 3 * 2 + 3 + 2
    assert written == printed
    loads = re.findall(r"^load average \(1, 5, 15 min\) (?:before|after): \(([\d.]+),", out, re.M)
    assert {(r["load1_before"], r["load1_after"]) for r in records} == {tuple(loads)}


def bench_output(monkeypatch, capsys, command: str) -> str:
    """What ``python -m scripts.bench <command>`` prints, torch's thread count restored after (it sets ``--threads``)."""
    import torch

    from scripts import bench

    threads = torch.get_num_threads()
    monkeypatch.setattr(sys, "argv", ["bench", *command.split()])
    try:
        bench.main()
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def test_bench_precision_prints_the_step_ratio_per_size_and_the_loss_gap_of_its_runs(monkeypatch, capsys):
    out = bench_output(monkeypatch, capsys, "precision --sizes tiny --rounds 3 --loss-steps 3 --seeds 0 1 --model tiny")
    ((fp32_ms, bf16_ms, ratio, q1, q3),) = [
        tuple(map(float, r))
        for r in re.findall(r"^  tiny +32 +2\+2 +[\d.]+M +(\d+) +(\d+) +([\d.]+) +([\d.]+) +([\d.]+)$", out, re.M)
    ]
    assert fp32_ms > 0 and bf16_ms > 0 and 0 < q1 <= ratio <= q3
    runs = {(p, int(s)): list(map(float, rest.split())) for p, s, rest in re.findall(r"^  (fp32|bf16) +(\d) +(.*)$", out, re.M)}
    assert sorted(runs) == [("bf16", 0), ("bf16", 1), ("fp32", 0), ("fp32", 1)]
    assert all(len(r) == 6 and all(math.isfinite(v) for v in r) for r in runs.values())  # 4 metrics, curve gap, wall s
    assert runs[("fp32", 0)][4] == runs[("fp32", 1)][4] == 0  # fp32's curve against itself
    gap = re.search(r"^  bf16 - fp32, mean over seeds +(.*)$", out, re.M).group(1).split()
    for i, printed in enumerate(gap):  # the mean of the per-seed differences of the printed (4-decimal) values
        assert float(printed) == pytest.approx(sum(runs[("bf16", s)][i] - runs[("fp32", s)][i] for s in (0, 1)) / 2, abs=2e-4)


def test_bench_optim_prints_each_optimizers_step_ratio_to_adamw(monkeypatch, capsys):
    out = bench_output(monkeypatch, capsys, "optim --size tiny --rounds 3")
    rows = re.findall(
        r"^  (adamw|muon, bfloat16 NS|muon, float32 NS) +([\d.]+) \[([\d.]+), ([\d.]+)\] +\((\d+) ms/step\)$", out, re.M
    )
    assert [r[0] for r in rows] == ["adamw", "muon, bfloat16 NS", "muon, float32 NS"]
    assert rows[0][1:4] == ("1.00", "1.00", "1.00")  # AdamW against itself, round by round
    for _, ratio, q1, q3, ms in rows:
        assert 0 < float(q1) <= float(ratio) <= float(q3) and int(ms) > 0
