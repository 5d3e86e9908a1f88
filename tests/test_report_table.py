"""The report's table for a paper (``reporting/paper.py``): ``table.md`` and ``table.tex`` beside summary.csv, a row
per variant named by its preset, mean ± stderr in the page's units (PER/WER in %, the loss in nats) and the paired
difference to the baseline with its 95% CI; ``--table md|latex`` prints one. Values computed by hand from the
metrics the fake runs hold (tests/helpers/runs.py)."""

from pathlib import Path

import pytest

from scripts import report
from tests.helpers.runs import DIVERGED_ERROR, finished, metric_rows, preset_config, write_run

# test PER per seed; test WER is twice it (finished()); best valid loss offset + 0.23 + 0.01 seed (metric_rows)
PER = {"pre_ln": [0.10, 0.12, 0.14], "pre_bn": [0.13, 0.16, 0.16]}
OFFSET = {"pre_ln": [1.0, 1.0, 1.0], "pre_bn": [1.5, 1.52, 1.49]}
HEADER = (
    "| variant | n | PER (%) | Δ PER (%) vs pre_ln | WER (%) | Δ WER (%) vs pre_ln | best valid loss (nats) "
    "| Δ best valid loss (nats) vs pre_ln |"
)
# pre_bn - pre_ln: PER 3, 4, 2 points: mean 3.00, sd 1, t(0.975, 2) = 4.3027, half width 2.48; the loss 0.50, 0.52, 0.49
PRE_BN = (
    "| pre_bn | 3 of 4 | 15.00 ± 1.00 | +3.00 [+0.52, +5.48] (3) | 30.00 ± 2.00 | +6.00 [+1.03, +10.97] (3) "
    "| 1.743 ± 0.009 | +0.503 [+0.465, +0.541] (3) |"
)
PRE_LN = "| pre_ln | 3 | 12.00 ± 1.15 | — | 24.00 ± 2.31 | — | 1.240 ± 0.006 | — |"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    for preset, pers in PER.items():
        for seed, per in enumerate(pers):
            rows = metric_rows(OFFSET[preset][seed], seed, per)
            write_run(root / f"norm={preset},seed={seed}", preset_config(preset, seed), rows, finished(per))
    diverged = {"state": "diverged", "step": 40, "max_steps": 100, "error": DIVERGED_ERROR.format(31), "test": None}
    rows = metric_rows(1.5, 3, None, diverge_at=40)  # never averaged, never paired: pre_bn's n is 3 of 4
    write_run(root / "norm=pre_bn,seed=3", preset_config("pre_bn", 3), rows, diverged)
    return root


def test_table_md_is_written_beside_summary_csv(sweep: Path, tmp_path: Path) -> None:
    assert report.main([str(sweep), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "table.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[:4] == [HEADER, "|:---|---:|---:|---:|---:|---:|---:|---:|", PRE_BN, PRE_LN]
    assert "pre_bn: norm.kind=batchnorm norm.blocks=[{kind: layernorm, stack: dec}]" in lines
    assert "Δ: the variant minus pre_ln, paired by seed" in text and (tmp_path / "summary.csv").is_file()


def test_table_latex_escapes_and_prints_with_the_flag(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert report.main([str(sweep), "--out", str(tmp_path), "--baseline", "pre_bn", "--table", "latex"]) == 0
    out, err = capsys.readouterr()
    assert out == (tmp_path / "table.tex").read_text(encoding="utf-8") and "report: wrote" in err
    lines = out.splitlines()
    start = lines.index(r"\begin{tabular}{lrrrrrrr}")
    assert lines[start + 1 : start + 3] == [
        r"\toprule",
        r"variant & n & PER (\%) & $\Delta$ PER (\%) vs pre\_bn & WER (\%) & $\Delta$ WER (\%) vs pre\_bn & "
        r"best valid loss (nats) & $\Delta$ best valid loss (nats) vs pre\_bn \\",
    ]
    assert lines[start + 4 : start + 6] == [
        r"pre\_bn & 3 of 4 & 15.00 $\pm$ 1.00 & --- & 30.00 $\pm$ 2.00 & --- & 1.743 $\pm$ 0.009 & --- \\",
        r"pre\_ln & 3 & 12.00 $\pm$ 1.15 & $-$3.00 [$-$5.48, $-$0.52] (3) & 24.00 $\pm$ 2.31 & "
        r"$-$6.00 [$-$10.97, $-$1.03] (3) & 1.240 $\pm$ 0.006 & $-$0.503 [$-$0.541, $-$0.465] (3) \\",
    ]
    assert lines[-2:] == [r"\bottomrule", r"\end{tabular}"] and lines[0] == r"% needs \usepackage{booktabs}"
    assert r"% pre_bn: norm.kind=batchnorm norm.blocks=[{kind: layernorm, stack: dec}]" in lines  # a comment: as is


def test_latex_text_escapes_every_special_character() -> None:
    from reporting.paper import latex_text

    assert latex_text("a_b 5% & $x# {y} ~^ \\ ± Δ — -1.5 1e-06 pre-ln") == (
        r"a\_b 5\% \& \$x\# \{y\} \textasciitilde{}\textasciicircum{} \textbackslash{} $\pm$ $\Delta$ --- $-$1.5 1e-06 pre-ln"
    )
