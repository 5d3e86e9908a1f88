"""Run directories written by hand for the report's tests (no training): configs, metrics rows with known losses, a
finished status, and readers of the page's tables and figures (headless Chromium where installed)."""

import json
import re
import shutil
import subprocess
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

TELEMETRY_STEPS = [1, 50, 100]
N_ENC, N_DEC = 2, 2
VARIANT_A = "norm.placement=pre norm.kind=layernorm optim.lr=0.002"
VARIANT_B = "norm.placement=post norm.kind=rmsnorm optim.lr=0.002"
VARIANT_LR = "norm.placement=pre norm.kind=layernorm optim.lr=1"  # config.yaml lr 1.0: labelled as its int
# their names on the page (analysis.names): the norm preset their runs used, then the keys outside norm.
NAME_A, NAME_B = "pre_ln optim.lr=0.002", "post_rms optim.lr=0.002"
# status.json's error for a diverged run, worded as train.py's NonFiniteLossError
DIVERGED_ERROR = "NonFiniteLossError: non-finite training loss at step {}; last finite checkpoint: none written yet"
STEPS = list(range(10, 101, 10))  # logging steps
EVAL_STEPS = [50, 100]


def config(placement: str, kind: str, seed: int, lr: float = 2e-3, **extra: object) -> dict:
    cfg = {
        "model": {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_enc_layers": N_ENC, "n_dec_layers": N_DEC},
        "norm": {"kind": kind, "impl": "custom", "placement": placement, "eps": 1e-5, "bias": True},
        "optim": {"lr": lr, "betas": [0.9, 0.98]},
        "schedule": {"warmup_steps": 20},
        "trainer": {"max_steps": 100},
        "logger": {"name": "wandb", "project": "normlab", "group": f"g{seed}"},  # differs, but is not a variant key
        "seed": seed,
        "train": {"resume": None},
    }
    tree = OmegaConf.create(cfg)
    for key, value in extra.items():  # dotted keys, e.g. train.resume
        OmegaConf.update(tree, key, value)
    return OmegaConf.to_container(tree)


@cache
def preset_norm(preset: str) -> dict:
    """The ``norm`` node Hydra composes for ``norm=<preset>`` (conf/norm/), resolved: what a run of it saves."""
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"norm={preset}"])
    return OmegaConf.to_container(cfg.norm, resolve=True)


def preset_config(preset: str, seed: int, lr: float = 2e-3, **extra: object) -> dict:
    """:func:`config` with the norm keys of a run of ``norm=<preset>`` (``extra``: dotted keys set after)."""
    cfg = OmegaConf.create({**config("pre", "layernorm", seed, lr), "norm": preset_norm(preset)})
    for key, value in extra.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_container(cfg)


def visible_text(page: str) -> str:
    """The text a reader of ``page`` sees, each run of white space as one space: scripts, styles and tags (with their
    attributes) left out; the space before a tag that follows a space dropped."""
    text = re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", page, flags=re.S))
    return re.sub(r"\s+", " ", text).replace(" :", ":")


def rms(offset: float, seed: int, step: int, depth: int) -> float:
    return (1 + depth) * offset * (1 + step / 100) + 0.1 * seed


def metric_rows(offset: float, seed: int, test_per: float | None, diverge_at: int | None = None) -> list[dict]:
    """Rows as train.py writes them: logging rows, eval rows, telemetry rows, the final test row."""
    rows: dict[int, dict] = {}
    for step in TELEMETRY_STEPS:
        row = rows.setdefault(step, {"step": step})
        for depth in range(N_ENC + N_DEC):
            stack, i = ("enc", depth) if depth < N_ENC else ("dec", depth - N_ENC)
            row[f"act/{stack}.{i}.out/rms"] = rms(offset, seed, step, depth)
            row[f"act/{stack}.{i}.out/mean"] = 0.0
            row[f"act/{stack}.{i}.in/rms"] = 1.0
            row[f"grad/{stack}.{i}/norm"] = 0.5 / (1 + depth) + 0.01 * step
    for step in STEPS:
        bad = diverge_at is not None and step >= diverge_at
        rows.setdefault(step, {"step": step}).update(
            {"train/loss": None if bad else loss(offset, seed, step), "optim/lr": 1e-3, "perf/tokens_per_s": 1000.0 + seed}
        )
        if step in EVAL_STEPS:
            rows[step].update(
                {"val/loss": None if bad else loss(offset, seed, step) + 0.2, "val/per": 0.5 - step / 1000, "val/wer": 0.9}
            )
    final = [{"step": STEPS[-1], "test/per": test_per, "test/wer": None if test_per is None else test_per * 2}]
    return [rows[s] for s in sorted(rows)] + final


def write_run(path: Path, cfg: dict, rows: list[dict] | None, status: dict | None, truncate: bool = False) -> Path:
    path.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(cfg), path / "config.yaml")
    text = "".join(json.dumps(r) + "\n" for r in rows or [])
    if truncate:  # a run killed while writing: the last line is cut short
        text = text[: text.rindex("{") + 25]
    (path / "metrics.jsonl").write_text(text)
    if status is not None:
        (path / "status.json").write_text(json.dumps(status))
    (path / ".hydra").mkdir()
    (path / ".hydra" / "config.yaml").write_text("ignored: true\n")
    return path


def finished(test_per: float, wall_s: float = 125.0) -> dict:
    return {"state": "finished", "step": 100, "max_steps": 100, "wall_s": wall_s, "tokens_per_s": 2000.0, "error": None,
            "spike_score_loss": test_per / 10, "spike_score_grad_norm": test_per / 20,
            "test": {"test/per": test_per, "test/wer": test_per * 2}}  # fmt: skip


def figures(page: str) -> dict[str, list[dict]]:
    """div id -> the trace list passed to Plotly.newPlot, decoded from the page's inline scripts."""
    found = {}
    decoder = json.JSONDecoder()
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        data, _ = decoder.raw_decode(page, m.end())
        found[m.group(1)] = data
    return found


def traces_of(page: str, plot: str, variant: str, role: str) -> list[dict]:
    """The traces of chart ``plot`` (its div id, ``plot-loss``) of ``variant`` with ``meta.role`` ``role``."""
    return [t for t in figures(page)[plot] if t["meta"]["variant"] == variant and t["meta"]["role"] == role]


def band_stretches(band: dict) -> list[tuple[list, list, list]]:
    """(x, hi, lo) of each closed outline of a ``band`` trace (filled ``toself``, outlines separated by None), each
    checked to run forward along hi with x rising, then back along lo over the same x reversed: no edge of it can
    span a gap or cut across the chart."""
    stretches, x, y = [], [], []
    for xi, yi in [*zip(band["x"], band["y"], strict=True), (None, None)]:
        if xi is not None:
            x.append(xi)
            y.append(yi)
            continue
        if x:
            half = len(x) // 2
            assert len(x) == 2 * half and x[half:] == x[:half][::-1], x
            assert all(a < b for a, b in zip(x[:half], x[1:half], strict=False)), x
            stretches.append((x[:half], y[:half], y[half:][::-1]))
        x, y = [], []
    return stretches


def layouts(page: str) -> dict[str, dict]:
    found = {}
    decoder = json.JSONDecoder()
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        _, end = decoder.raw_decode(page, m.end())
        layout, _ = decoder.raw_decode(page, page.index("{", end))
        found[m.group(1)] = layout
    return found


def table(page: str, attr: str) -> tuple[dict, dict]:
    parser = TableParser(attr)
    parser.feed(page)
    return parser.rows, parser.classes


def draw_in_chromium(page: Path, profile: Path, charts: int = 5, window: str | None = None) -> str:
    """The DOM of ``page`` (of ``charts`` charts) once headless Chromium has run its scripts, in a window of
    ``window`` pixels (``1400,1000``; None: Chromium's default); fails on a JavaScript error or an undrawn chart."""
    binary = chromium()
    if binary is None:
        pytest.skip("chromium not found: apt-get install chromium")
    size = [f"--window-size={window}"] if window else []
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", *size,
           f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    html_tag = re.search(r"<html[^>]*>", done.stdout).group(0)
    body_tag = re.search(r"<body[^>]*>", done.stdout).group(0)
    assert "data-js-errors" not in html_tag, html_tag
    assert "Uncaught" not in done.stderr, [line for line in done.stderr.splitlines() if "Uncaught" in line]
    assert f'data-plots-expected="{charts}"' in body_tag and f'data-plots-drawn="{charts}"' in body_tag, body_tag
    return done.stdout


def loss(offset: float, seed: int, step: int) -> float:
    return offset + 3.0 / step + 0.01 * seed


class TableParser(HTMLParser):
    """rows[attr value] = {data-col: (data-value, text)} for every <tr data-run=...> / <tr data-variant=...>."""

    def __init__(self, attr: str) -> None:
        super().__init__()
        self.attr, self.rows, self.row, self.cell, self.classes = attr, {}, None, None, {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "tr" and self.attr in a:
            self.row = self.rows.setdefault(a[self.attr], {})
            self.classes[a[self.attr]] = a.get("class", "")
        elif tag == "td" and self.row is not None:
            self.cell = [a["data-col"], a["data-value"], ""]

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell[2] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.cell is not None:
            self.row[self.cell[0]] = (self.cell[1], self.cell[2])
            self.cell = None
        elif tag == "tr":
            self.row = None


def chromium() -> str | None:
    return next((p for name in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(name))), None)
