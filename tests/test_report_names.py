"""The report names a variant by the norm preset its runs used (``analysis.names``): a sweep mixing presets shows
``pre_bn``, not every differing key as a Python repr, in the variants table, the Δ columns' headers and the charts'
legends, with the keys in a tooltip and a note in YAML's flow style; ``--baseline`` takes the old label, the preset and
the name; the CSVs keep their ``variant`` column and gain ``name`` and ``preset``; the table fits a 1,400 px window."""

import csv
import re
from pathlib import Path

import pytest

from scripts import report
from tests.helpers.runs import (
    draw_in_chromium,
    figures,
    finished,
    metric_rows,
    preset_config,
    table,
    visible_text,
    write_run,
)

PRESETS = ["pre_bn", "pre_ln", "pre_derf", "pre_ln_mhc", "pre_ln_gpas", "olmo2"]  # the sweep
SEEDS = (0, 1)
# the label pre_bn's variant had, and keeps in the CSVs: every key that differs between the six presets
PRE_BN_LABEL = (
    "norm.placement=pre norm.kind=batchnorm norm.blocks=((('kind', 'layernorm'), ('stack', 'dec')),) norm.eps=1e-05 "
    "norm.gpas=False norm.hc=None norm.qk=None norm.qk_scope=head"
)
PRE_BN_KEYS = PRE_BN_LABEL.replace("((('kind', 'layernorm'), ('stack', 'dec')),)", "[{kind: layernorm, stack: dec}]")
PRE_BN_KEYS = PRE_BN_KEYS.replace("=None", "=null")


def sweep_of(root: Path, runs: dict[str, dict]) -> Path:
    for i, (name, cfg) in enumerate(runs.items()):
        per = 0.2 + 0.01 * i + 0.003 * cfg["seed"] ** 2
        write_run(root / name, cfg, metric_rows(1.0 + i / 10, cfg["seed"], per), finished(per))
    return root


@pytest.fixture(scope="module")
def presets_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = {f"norm={p},seed={s}": preset_config(p, s) for p in PRESETS for s in SEEDS}
    return sweep_of(tmp_path_factory.mktemp("presets"), runs)


def build(sweep: Path, out: Path, *args: str) -> str:
    assert report.main([str(sweep), "--out", str(out), *args]) == 0
    return (out / "index.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def out(presets_sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("out")
    build(presets_sweep, path)
    return path


@pytest.fixture(scope="module")
def page(out: Path) -> str:
    return (out / "index.html").read_text(encoding="utf-8")


def test_variants_are_named_by_their_preset(page: str) -> None:
    rows, _ = table(page, "data-variant")
    shown = {label: cells["variant"][1] for label, cells in rows.items()}
    assert sorted(shown.values()) == sorted(PRESETS)
    assert shown[PRE_BN_LABEL] == "pre_bn"  # data-variant: still the label
    cell = re.search(r'<td data-col="variant" [^>]*>pre_bn<', page).group(0)
    assert f'title="{PRE_BN_KEYS}"' in cell.replace("&#x27;", "'")
    assert f"<b>pre_bn</b>: {PRE_BN_KEYS.replace(', ', ',<wbr> ')}" in page  # the note under the table


def test_no_python_repr_is_shown_and_headers_and_legends_use_the_names(page: str) -> None:
    text = visible_text(page)
    assert "(('" not in text and "None" not in text
    assert "PER (%) Δ vs pre_ln: mean [95% CI] (pairs)" in text and "baseline: pre_ln (default" in text
    loss = figures(page)["plot-loss"]
    means = sorted(t["name"] for t in loss if t["meta"]["role"] == "mean")
    assert means == sorted(f"{p} (mean of 2)" for p in PRESETS)
    assert next(t["meta"]["variant"] for t in loss if t["name"] == "pre_bn (mean of 2)") == PRE_BN_LABEL


@pytest.mark.parametrize("given", [PRE_BN_LABEL, "pre_bn", "norm=pre_bn", PRE_BN_KEYS])
def test_baseline_takes_the_label_the_preset_and_the_keys(presets_sweep: Path, tmp_path: Path, given: str) -> None:
    shown = build(presets_sweep, tmp_path, "--baseline", given)
    assert f'data-baseline="{PRE_BN_LABEL}"' in shown.replace("&#x27;", "'")
    assert "PER (%) Δ vs pre_bn: mean [95% CI] (pairs)" in visible_text(shown)


def test_an_unknown_baseline_lists_each_variant_by_its_name_then_its_keys(presets_sweep: Path, tmp_path: Path, capsys) -> None:
    assert report.main([str(presets_sweep), "--out", str(tmp_path), "--baseline", "pre"]) == 1
    assert f"'pre_bn' ('{PRE_BN_KEYS}')" in capsys.readouterr().err


def test_csvs_keep_the_label_and_add_name_and_preset(out: Path) -> None:
    with (out / "summary.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    pre_bn = next(r for r in rows if r["variant"] == PRE_BN_LABEL and r["metric"] == "test/per")
    assert (pre_bn["name"], pre_bn["preset"], pre_bn["baseline"].split()[1]) == ("pre_bn", "pre_bn", "norm.kind=layernorm")
    assert list(rows[0])[:2] == ["variant", "metric"] and list(rows[0])[-2:] == ["name", "preset"]


def test_other_keys_follow_the_preset_and_a_variant_without_one_shows_its_keys(tmp_path: Path) -> None:
    arms = [("pre_ln", 2e-3), ("pre_ln", 1e-3), ("pre_bn", 2e-3)]
    runs = {f"{p},lr={lr},seed={s}": preset_config(p, s, lr) for p, lr in arms for s in SEEDS}
    runs |= {f"eps,seed={s}": preset_config("pre_ln", s, **{"norm.eps": 1e-6}) for s in SEEDS}
    shown = build(sweep_of(tmp_path / "sweep", runs), tmp_path / "out", "--baseline", "pre_ln optim.lr=0.001")
    rows, _ = table(shown, "data-variant")
    names = sorted(cells["variant"][1] for cells in rows.values())
    want = ["norm.kind=layernorm norm.blocks=null norm.eps=1e-06 optim.lr=0.002", "pre_bn optim.lr=0.002"]
    assert names == sorted([*want, "pre_ln optim.lr=0.001", "pre_ln optim.lr=0.002"])
    assert "PER (%) Δ vs pre_ln optim.lr=0.001: mean [95% CI] (pairs)" in visible_text(shown)


@pytest.mark.browser
def test_the_variants_table_fits_1400_px(page: str, tmp_path: Path) -> None:
    measure = (
        "<script>window.addEventListener('load', function () {"
        "document.body.dataset.tableWidth = document.querySelector('tr[data-variant]').closest('table').scrollWidth;"
        "document.body.dataset.pageWidth = document.documentElement.scrollWidth; });</script></body>"
    )
    path = tmp_path / "index.html"
    path.write_text(page.replace("</body>", measure), encoding="utf-8")
    dom = draw_in_chromium(path, tmp_path / "profile", charts=page.count('class="plot"'), window="1400,1000")
    body = re.search(r"<body[^>]*>", dom).group(0)
    table_px, page_px = (int(re.search(rf'data-{k}-width="(\d+)"', body).group(1)) for k in ("table", "page"))
    assert table_px <= 1400 - 2 * 24 and page_px <= 1400, body  # the body's margins: 1.5em
