"""Loading and grouping for ``scripts/report.py``: run directories -> runs -> variants -> panel data.

A run directory is a folder holding ``config.yaml`` and ``metrics.jsonl`` or ``status.json`` (a
run that failed before training has no metrics; runs written before status.json existed have no
status). Runs whose configs differ only in ``seed`` (and in keys that never change what is
trained: ``train.resume``, ``logger.*``, ``hydra.*``) form a variant.

Nothing here draws: :func:`build_panels` returns plain :class:`Panel` / :class:`Line` records
that ``report.py`` renders twice, once with plotly (the HTML page) and once with matplotlib (PNGs).

Diverged runs are never averaged as if they had finished: a variant's mean curve is drawn only at
steps where every run of the variant has a finite value (:func:`mean_band`), and each diverged run
gets a marker at its last finite point (:func:`divergence_marks`).
"""

import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from training.status import STATES

RUN_CONFIG, RUN_RECORDS = "config.yaml", ("metrics.jsonl", "status.json")  # a run dir holds the first and one of the others
SKIP_DIRS = {".hydra", "wandb", "report", "__pycache__"}  # never hold a run; not searched
IGNORED_KEYS = ("seed", "train.resume", "logger.", "hydra.")  # exact keys, or prefixes ending in "."
NORM_KEYS = ("norm.placement", "norm.kind", "norm.impl")  # listed first in variant labels
DASHES = ("dot", "dash", "solid")  # profile lines, earliest step first
# Scalar series kept from metrics.jsonl; telemetry is reduced on reading (see _BLOCK_RMS, _BLOCK_GRAD).
SERIES_PREFIXES = ("train/", "val/", "test/", "perf/")
_BLOCK_RMS = re.compile(r"act/(enc|dec)\.(\d+)\.out/rms")  # the residual stream leaving block i
_BLOCK_GRAD = re.compile(r"grad/(enc|dec)\.(\d+)/norm")
# status.json "error" of a diverged run, as train.py's NonFiniteLossError words it: "non-finite training loss at step 31; ..."
_DIVERGED_AT = re.compile(r"non-finite [\w ]*loss at step (\d+)")
Values = list[float | None]  # a series with gaps (None: no finite value)
TASKS = {  # task -> (validation metric, test metrics, scale to display: fractions are shown in %)
    "g2p": ("val/per", ("test/per", "test/wer"), 100.0),
    "translation": ("val/bleu", ("test/bleu", "test/chrf"), 1.0),
}


class ReportError(Exception):
    """A problem with the report's input as a whole (no such directory, no runs found)."""


@dataclass
class Run:
    """One run directory, reduced to what the report shows.

    Attributes:
        path: the run directory.
        label: its name on the page (path relative to the directory given on the command line).
        config: the flattened config (``norm.kind`` -> ``"rmsnorm"``); empty if unreadable.
        series: metric -> [(step, value or None)] for ``train/``, ``val/``, ``test/``, ``perf/`` metrics.
        rms: telemetry step -> depth -> RMS of the residual stream leaving that block.
        grad: telemetry step -> depth -> gradient norm of that block.
        status: the parsed ``status.json``, or None when absent or unreadable.
        notes: problems met while reading (shown in the table).
    """

    path: Path
    label: str
    config: dict[str, Any] = field(default_factory=dict)
    series: dict[str, list[tuple[int, float | None]]] = field(default_factory=dict)
    rms: dict[int, dict[int, float]] = field(default_factory=dict)
    grad: dict[int, dict[int, float]] = field(default_factory=dict)
    status: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def diverged(self) -> bool:
        """status.json says so, or a logged train or valid loss is null (non-finite)."""
        if self.status_state == "diverged":
            return True
        return any(v is None for key in ("train/loss", "val/loss") for _, v in self.series.get(key, []))

    @property
    def diverged_at(self) -> int | None:
        """The step whose loss went non-finite: from status.json's error message, else the first step with a
        null train or valid loss; None for a run that did not diverge (or whose step is unknown)."""
        if not self.diverged:
            return None
        if m := _DIVERGED_AT.search(str((self.status or {}).get("error") or "")):
            return int(m.group(1))
        bad = [s for key in ("train/loss", "val/loss") for s, v in self.series.get(key, []) if v is None]
        return min(bad, default=None)

    @property
    def finished(self) -> bool:
        """status.json says ``finished``; a run without status.json counts when it reached ``max_steps`` without
        diverging. Only finished runs enter a variant's means in the report's table."""
        if self.status_state != "unknown":
            return self.status_state == "finished"
        return not self.diverged and self.max_steps is not None and self.last_step == self.max_steps

    @property
    def status_state(self) -> str:
        """``state`` from status.json, or ``unknown`` (no status.json: crashed, killed or an old run)."""
        state = (self.status or {}).get("state")
        return state if state in STATES else "unknown"

    @property
    def last_step(self) -> int | None:
        """The step reached: status.json's, else the largest step in metrics.jsonl."""
        if isinstance((self.status or {}).get("step"), int):
            return self.status["step"]
        steps = [s for points in self.series.values() for s, _ in points]
        return max(steps, default=None)

    @property
    def max_steps(self) -> int | None:
        value = (self.status or {}).get("max_steps", self.config.get("trainer.max_steps"))
        return value if isinstance(value, int) else None

    def final(self, metric: str) -> float | None:
        """A test metric (``test/per``): status.json's ``test`` entry, else its last finite value in metrics.jsonl."""
        test = (self.status or {}).get("test")
        test = test if isinstance(test, dict) else {}
        if _finite(test.get(metric)) is not None:
            return float(test[metric])
        values = [v for _, v in self.series.get(metric, []) if v is not None]
        return values[-1] if values else None

    def best(self, metric: str, lower_is_better: bool = True) -> float | None:
        """The best finite value of ``metric`` over the run, or None."""
        values = [v for _, v in self.series.get(metric, []) if v is not None]
        return (min if lower_is_better else max)(values) if values else None

    @property
    def wall_s(self) -> float | None:
        return _finite((self.status or {}).get("wall_s"))

    @property
    def tokens_per_s(self) -> float | None:
        """status.json's throughput, else the median of the logged ``perf/tokens_per_s``."""
        value = _finite((self.status or {}).get("tokens_per_s"))
        if value is not None:
            return value
        logged = [v for _, v in self.series.get("perf/tokens_per_s", []) if v is not None]
        return float(np.median(logged)) if logged else None


@dataclass
class Variant:
    """Runs whose configs differ only in the seed. ``label`` names the config keys that set it apart."""

    label: str
    runs: list[Run]


@dataclass
class Line:
    """One curve of a panel. ``role``: ``run`` (one run), ``mean`` (a variant's mean over its runs, with
    ``lo``/``hi`` the min-max band), ``diverged`` (one point: where a diverged run stopped) or ``profile``
    (a variant's value vs depth at one step). ``hover``: a text per point (e.g. ``n = 2 of 3``), or None."""

    name: str
    variant: str
    role: str
    x: list[float]
    y: list[float | None]
    lo: list[float | None] | None = None
    hi: list[float | None] | None = None
    dash: str = "solid"
    hover: list[str] | None = None

    @property
    def isolated(self) -> list[int]:
        """Indices of finite points with no finite neighbour: a line through them draws nothing, so the
        renderers put a marker there (one evaluation in a run, or a mean complete at a single step)."""
        present = [False, *(v is not None and math.isfinite(v) for v in self.y), False]  # padded: no neighbour off the ends
        return [i - 1 for i in range(1, len(present) - 1) if present[i] and not present[i - 1] and not present[i + 1]]


@dataclass
class Panel:
    """A chart: ``key`` is its file stem (``loss`` -> loss.png); ``note`` explains an empty chart;
    ``integer_x``: x is a block index (integer ticks)."""

    key: str
    title: str
    xlabel: str
    ylabel: str
    lines: list[Line]
    log_y: bool = False
    note: str = ""
    integer_x: bool = False


def _finite(value: Any) -> float | None:
    """``value`` as a float if it is a finite number (not bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def find_run_dirs(dirs: Iterable[Path]) -> list[tuple[Path, Path]]:
    """(run directory, the given directory it was found under) for every run under ``dirs``, sorted,
    each run once. A run directory is not searched further; ``.hydra``, ``wandb`` and ``report`` never are.

    Raises:
        ReportError: a given path is not a directory.
    """
    found: dict[Path, Path] = {}
    for top in dirs:
        if not top.is_dir():
            raise ReportError(f"no such directory: {str(top)!r}")
        for root, subdirs, files in os.walk(top):
            if RUN_CONFIG in files and any(f in files for f in RUN_RECORDS):
                found.setdefault(Path(root).resolve(), top)
                subdirs.clear()
            else:
                subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.startswith("."))
    return sorted(found.items())


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"a.b.c": leaf}; lists become tuples so that values compare and hash."""
    if isinstance(tree, dict):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: _freeze(tree)}


def _freeze(value: Any) -> Any:
    """Lists -> tuples, dicts -> sorted item tuples, recursively (hashable, comparable)."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def read_config(path: Path) -> dict[str, Any]:
    """The flattened config of ``path`` (config.yaml). Raises whatever OmegaConf/YAML raise on a bad file."""
    cfg = OmegaConf.load(path)
    try:
        tree = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation that does not resolve outside Hydra: keep it as written
        tree = OmegaConf.to_container(cfg, resolve=False)
    return flatten(tree) if isinstance(tree, dict) else {}


def read_metrics(path: Path, run: Run, n_enc: int | None) -> None:
    """Fill ``run.series``, ``run.rms`` and ``run.grad`` from metrics.jsonl at ``path``.

    Unparsable lines (a truncated last line of a killed run) are skipped and counted in ``run.notes``.
    Decoder block i sits at depth ``n_enc + i``; when ``n_enc`` is None it is taken from the data.
    """
    bad = 0
    raw: dict[str, dict[int, dict[tuple[str, int], float]]] = {"rms": {}, "grad": {}}
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                bad += 1
                continue
            _add_row(row, run.series, raw)
    if bad:
        run.notes.append(f"{bad} unparsable line{'s' * (bad > 1)} in metrics.jsonl")
    if not run.series and not raw["rms"]:
        run.notes.append("no metrics logged")
    if n_enc is None:
        n_enc = 1 + max((i for rec in raw["rms"].values() for s, i in rec if s == "enc"), default=-1)
    for name, records in raw.items():
        profiles = {step: {i + (n_enc if s == "dec" else 0): v for (s, i), v in rec.items()} for step, rec in records.items()}
        setattr(run, name, profiles)


def _add_row(row: dict[str, Any], series: dict, raw: dict) -> None:
    """Sort one metrics.jsonl row into scalar series and per-block telemetry (finite values only)."""
    step = row["step"]
    for key, value in row.items():
        if key.startswith(SERIES_PREFIXES):
            series.setdefault(key, []).append((step, _finite(value)))
        elif key.startswith(("act/", "grad/")) and (value := _finite(value)) is not None:
            for name, pattern in (("rms", _BLOCK_RMS), ("grad", _BLOCK_GRAD)):
                if m := pattern.fullmatch(key):
                    raw[name].setdefault(step, {})[(m.group(1), int(m.group(2)))] = value


def read_status(path: Path, run: Run) -> None:
    """Set ``run.status`` from status.json at ``path`` if it exists and parses; else note why not."""
    if not path.is_file():
        run.notes.append("no status.json")
        return
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        run.notes.append(f"unreadable status.json ({type(e).__name__})")
        return
    if isinstance(status, dict):
        run.status = status
        if status.get("error"):
            run.notes.append(f"error: {status['error']}")
    else:
        run.notes.append("status.json is not an object")


def load_run(path: Path, label: str) -> Run:
    """Read one run directory. Never raises for a bad run: what cannot be read is left empty and noted."""
    run = Run(path=path, label=label)
    try:
        run.config = read_config(path / "config.yaml")
    except Exception as e:  # any YAML/OmegaConf error: the run still shows in the table
        run.notes.append(f"unreadable config.yaml ({type(e).__name__})")
    n_enc = run.config.get("model.n_enc_layers")
    try:
        if (path / "metrics.jsonl").exists():
            read_metrics(path / "metrics.jsonl", run, n_enc if isinstance(n_enc, int) else None)
        else:
            run.notes.append("no metrics.jsonl: stopped before training")
    except OSError as e:
        run.notes.append(f"unreadable metrics.jsonl ({e.strerror})")
    read_status(path / "status.json", run)
    return run


def run_label(run_dir: Path, top: Path, several_tops: bool) -> str:
    """The run's name on the page: its path below the given directory (prefixed by that directory's name
    when several were given), or the directory's own name for a run given directly."""
    top = top.resolve()
    rel = run_dir.relative_to(top).as_posix() if run_dir != top else ""
    if not rel:
        return top.name
    return f"{top.name}/{rel}" if several_tops else rel


def _ignored(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in IGNORED_KEYS)


def differing_keys(runs: list[Run]) -> list[str]:
    """Flattened config keys whose value differs between runs (a key missing from a run counts as
    differing), leaving out the seed and keys that do not change training; norm keys first."""
    keys = {k for r in runs for k in r.config if not _ignored(k)}
    missing = object()
    differ = [k for k in keys if len({repr(r.config.get(k, missing)) for r in runs}) > 1]
    return sorted(differ, key=lambda k: (NORM_KEYS.index(k) if k in NORM_KEYS else len(NORM_KEYS), k))


def group_variants(runs: list[Run]) -> list[Variant]:
    """Group runs that differ only in the seed; a variant's label is ``key=value`` for each config key
    that varies across all runs (or the norm placement/kind/impl when there is a single variant)."""
    keys = differing_keys(runs) or list(NORM_KEYS)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        label = " ".join(f"{k}={run.config.get(k, '?')}" for k in keys)
        groups.setdefault(label, []).append(run)
    return [Variant(label, sorted(members, key=lambda r: (str(r.seed), r.label))) for label, members in groups.items()]


def detect_task(runs: list[Run]) -> str:
    """``translation`` when any run logged BLEU, else ``g2p`` (PER/WER)."""
    has_bleu = any(k in r.series or r.final(k) is not None for r in runs for k in ("val/bleu", "test/bleu"))
    return "translation" if has_bleu else "g2p"


def averaged_runs(runs: list[Run]) -> list[Run]:
    """The runs a variant's mean curve is over: every run that logged a metric or diverged (a run that
    stopped before training has no curve; it is listed in the table)."""
    return [r for r in runs if r.series or r.diverged]


def mean_band(runs: list[Run], metric: str) -> tuple[list[int], Values, Values, Values, list[int]]:
    """(steps, mean, min, max, n) of ``metric`` over ``runs`` at every step any of them logged it. ``n`` counts
    the runs with a finite value at that step; mean, min and max are None wherever ``n < len(runs)``, so a
    diverged or stopped seed ends the mean instead of leaving it to the survivors."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for step, value in run.series.get(metric, []):
            by_step.setdefault(step, [])
            if value is not None:
                by_step[step].append(value)
    steps = sorted(by_step)
    complete = [by_step[s] if len(by_step[s]) == len(runs) else [] for s in steps]
    stats = [(float(np.mean(v)), min(v), max(v)) if v else (None, None, None) for v in complete]
    return steps, [s[0] for s in stats], [s[1] for s in stats], [s[2] for s in stats], [len(by_step[s]) for s in steps]


def pick_steps(steps: Iterable[int], n: int) -> list[int]:
    """Up to ``n`` of ``steps``: the first, the last and evenly spaced ones between (sorted, unique)."""
    ordered = sorted(set(steps))
    if len(ordered) <= n:
        return ordered
    return sorted({ordered[round(j * (len(ordered) - 1) / (n - 1))] for j in range(n)})


def profile_lines(variant: Variant, attr: str, n_steps: int) -> Iterator[Line]:
    """One line per chosen telemetry step of ``variant``: value vs depth, the mean over the runs recorded
    at that step; its name ends in ``(n = k of N)`` when only k of the variant's N averaged runs were.
    ``attr`` is ``rms`` or ``grad`` (see :class:`Run`)."""
    records = [getattr(r, attr) for r in averaged_runs(variant.runs)]
    chosen = pick_steps((s for rec in records for s in rec), min(n_steps, len(DASHES)))
    for j, step in enumerate(chosen):
        per_depth: dict[int, list[float]] = {}
        for rec in records:
            for depth, value in rec.get(step, {}).items():
                per_depth.setdefault(depth, []).append(value)
        depths = sorted(per_depth)
        dash = DASHES[len(DASHES) - len(chosen) + j]  # the last step solid, earlier ones dashed
        k = sum(step in rec for rec in records)
        count = f" (n = {k} of {len(records)})" if k < len(records) else ""
        yield Line(f"{variant.label} @ step {step}{count}", variant.label, "profile", depths,
                   [float(np.mean(per_depth[d])) for d in depths], dash=dash)  # fmt: skip


def mean_line(variant: Variant, metric: str, scale: float) -> Line:
    """The variant's mean curve with its min-max band (see :func:`mean_band`); each point's hover says ``n = k of N``."""
    runs = averaged_runs(variant.runs)
    steps, mean, lo, hi, n = mean_band(runs, metric)
    left_out = len(variant.runs) - len(runs)
    name = f"{variant.label} (mean of {len(runs)}" + (f"; {left_out} logged nothing)" if left_out else ")")
    return Line(name, variant.label, "mean", steps, _scaled(mean, scale), _scaled(lo, scale), _scaled(hi, scale),
                hover=[f"n = {k} of {len(runs)}" for k in n])  # fmt: skip


def divergence_marks(variant: Variant, metric: str, scale: float) -> Iterator[Line]:
    """A one-point ``diverged`` line per diverged run of ``variant``: its last finite value of ``metric`` at or
    before the divergence step (none when it has no such value)."""
    for run in variant.runs:
        if not run.diverged:
            continue
        at = run.diverged_at
        points = [(s, v) for s, v in run.series.get(metric, []) if v is not None and (at is None or s <= at)]
        if points:
            step, value = points[-1]
            text = f"{run.label}: diverged at step {at if at is not None else '?'}"
            yield Line(text, variant.label, "diverged", [step], [value * scale], hover=[text])


def _scaled(values: Values, scale: float) -> Values:
    return [None if v is None else v * scale for v in values]


def curve_panel(variants: list[Variant], key: str, metric: str, title: str, ylabel: str, scale: float = 1.0) -> Panel:
    """Metric vs step: one thin line per run (every run, even one with no values), per variant the mean over
    its runs with a min-max band (:func:`mean_line`), and a marker where each diverged run stopped.
    Values are multiplied by ``scale``."""
    lines = []
    for variant in variants:
        for run in variant.runs:
            points = run.series.get(metric, [])
            lines.append(Line(run.label, variant.label, "run", [s for s, _ in points], _scaled([v for _, v in points], scale)))
        lines.append(mean_line(variant, metric, scale))
        lines.extend(divergence_marks(variant, metric, scale))
    has_data = any(v is not None for line in lines for v in line.y)
    return Panel(key, title, "training step", ylabel, lines, note="" if has_data else f"no run logged {metric}")


def depth_panel(variants: list[Variant], key: str, attr: str, n_steps: int, title: str, ylabel: str) -> Panel:
    """Telemetry vs depth (encoder blocks, then decoder blocks) at ``n_steps`` steps per variant, log scale."""
    lines = [line for v in variants for line in profile_lines(v, attr, n_steps)]
    note = "" if lines else "no telemetry recorded (telemetry=off?)"
    return Panel(key, title, "block (encoder, then decoder)", ylabel, lines, log_y=True, note=note, integer_x=True)


def build_panels(variants: list[Variant], task: str) -> list[Panel]:
    """The report's charts, in page order (see the module docstring of report.py)."""
    val_metric, _, scale = TASKS[task]
    name = val_metric.split("/")[1]
    unit = " (%)" if scale != 1.0 else ""
    return [
        curve_panel(variants, "loss", "train/loss", "Training loss", "train loss"),
        curve_panel(variants, "val_loss", "val/loss", "Validation loss", "valid loss"),
        curve_panel(variants, f"val_{name}", val_metric, f"Validation {name.upper()}", f"valid {name.upper()}{unit}", scale),
        depth_panel(variants, "rms_vs_depth", "rms", 3, "Residual RMS vs depth (first, middle, last record)", "block output RMS"),
        depth_panel(variants, "grad_vs_depth", "grad", 2, "Gradient norm vs depth (first, last record)", "block gradient norm"),
    ]


def load_runs(dirs: list[Path], progress: Any = None) -> list[Run]:
    """Every run under ``dirs`` (see :func:`find_run_dirs`), read with :func:`load_run`.

    Args:
        progress: wraps the list of run directories (e.g. ``tqdm``) to show reading progress; optional.

    Raises:
        ReportError: a path is not a directory, or no run directory was found under any of them.
    """
    found = find_run_dirs(dirs)
    if not found:
        names = ", ".join(repr(str(d)) for d in dirs)
        raise ReportError(f"no run directories (folders holding {RUN_CONFIG} and {' or '.join(RUN_RECORDS)}) under {names}")
    several = len({top for _, top in found}) > 1 or len(dirs) > 1
    items = progress(found) if progress else found
    return [load_run(path, run_label(path, top, several)) for path, top in items]
