"""Reading run directories into :class:`~analysis.runs.Run` records, never failing on a bad run.

A run directory is a folder holding ``config.yaml`` and ``metrics.jsonl`` or ``status.json`` (a
run that failed before training has no metrics; runs written before status.json existed have no
status). What cannot be read is left empty and noted in ``Run.notes``; only a missing input
directory or finding no run at all raises :class:`ReportError`.
"""

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from analysis.runs import BlockSite, Run, finite
from runlog.metric_names import BSTAT_STATS, PRE_NORM_SITE, Metric, depth, n_enc_layers_seen, parse
from runlog.renames import with_current_names
from runlog.tasks import TaskSpec, read_task

RUN_CONFIG, RUN_RECORDS = "config.yaml", ("metrics.jsonl", "status.json")  # a run dir holds the first and one of the others
SKIP_DIRS = {".hydra", "wandb", "report", "__pycache__"}  # never hold a run; not searched
# Scalar series kept from metrics.jsonl; telemetry is reduced on reading to the profiles below, and the stack-less
# telemetry (out/, optim/: one number per record) and hyper-connections' per-stack gains (hc/) are kept as series.
SERIES_PREFIXES = ("train/", "val/", "test/", "perf/")
# (family, site, stat) of a block's metric -> the name of its profile in ``Run.profiles``, by depth: the stream leaving
# block i (its RMS, kurtosis and massive-activation ratio), the sum entering its FFN's closing norm (its RMS), the
# block's gradient norm and its self-attention's sink mass.
# A row here and a ``depth_panel`` in ``analysis.panels.build_panels`` chart another one (docs/extending.md).
PROFILES = {
    ("scale", "gpas", "silu_g"): "gpas_silu_g",  # GPAS's SiLU(g), the share of block i's output it removes (norm.gpas)
    ("act", "out", "rms"): "rms",
    ("act", "out", "massive"): "massive",  # max |x| / median |x| of block i's output (Sun et al. 2024)
    ("attn", "self_attn", "sink_mass"): "sink_mass",  # block i's self-attention's share on the first key
    ("act", PRE_NORM_SITE["ffn"], "rms"): "pre_norm_rms",
    ("act", "out", "kurtosis"): "kurtosis",
    ("grad", None, "norm"): "grad",
}
# (family, stat) of a per-site block metric -> the name of its profile in ``Run.profiles``, by BlockSite
# (bstat: each batch-reading residual norm's distance, under the stat's own name; a stack's final norm has no depth)
SITE_PROFILES = {
    ("attn", "max_logit"): "max_logit",
    ("weight", "sigma_max"): "sigma_max",
    **{("bstat", stat): stat for stat in BSTAT_STATS},
}
LAST_RECORD_ONLY = ("sigma_max",)  # the report shows the last record only: older ones are not kept in memory


class ReportError(Exception):
    """A problem with the report's input as a whole (no such directory, no runs found)."""


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
    """Lists -> tuples, dicts -> sorted item tuples, recursively (hashable, comparable); a float with an integer
    value -> that int, so ``norm.alpha_init_attn=1`` and ``=1.0`` (one setting, written two ways on the command line)
    label one variant, not two."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def read_config(path: Path) -> dict[str, Any]:
    """The flattened config of ``path`` (config.yaml), with today's names for renamed keys (``runlog.renames``),
    so a run written before a rename groups with runs written after it. Raises whatever OmegaConf/YAML raise
    on a bad file."""
    cfg = OmegaConf.load(path)
    try:
        tree = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation that does not resolve outside Hydra: keep it as written
        tree = OmegaConf.to_container(cfg, resolve=False)
    return flatten(with_current_names(cast(dict[str, Any], tree))) if isinstance(tree, dict) else {}  # a config's keys: str


def read_metrics(path: Path, run: Run, n_enc: int | None) -> None:
    """Fill ``run.series`` and ``run.profiles`` (``PROFILES``, ``SITE_PROFILES``) from metrics.jsonl at ``path``.

    Unparsable lines (a truncated last line of a killed run) are skipped and counted in ``run.notes``.
    Decoder block i sits at depth ``n_enc + i``; when ``n_enc`` is None it is taken from the data. Sets ``run.n_enc``.
    """
    bad = 0
    attrs = (*PROFILES.values(), *SITE_PROFILES.values())
    raw: dict[str, dict[int, dict[Metric, float]]] = {attr: {} for attr in attrs}
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
        n_enc = n_enc_layers_seen((m.stack, m.layer) for records in raw.values() for rec in records.values() for m in rec)
    run.n_enc = n_enc
    run.profiles = {
        name: {step: {_place(m, n_enc): v for m, v in rec.items()} for step, rec in records.items()}
        for name, records in raw.items()
        if records
    }


def _place(m: Metric, n_enc: int) -> int | BlockSite:
    """A block metric's key in its profile: its depth, or its BlockSite for a per-site metric."""
    assert m.stack is not None and m.layer is not None  # _add_row keeps block metrics only
    at = depth(m.stack, m.layer, n_enc)
    if (m.family, m.site, m.stat) in PROFILES:
        return at
    assert m.site is not None  # the families of SITE_PROFILES name a site in every block metric
    return BlockSite(at, f"{m.stack}.{m.layer}", m.site)


def _add_row(row: dict[str, Any], series: dict, raw: dict) -> None:
    """Sort one metrics.jsonl row into scalar series and per-block telemetry (finite values only)."""
    step = row["step"]
    for key, value in row.items():
        if key.startswith(SERIES_PREFIXES):
            series.setdefault(key, []).append((step, finite(value)))
        elif (m := parse(key)) is None:
            continue
        elif m.stack is None or m.family == "hc":  # one number per record (hc/: per stack): a series like train/loss
            series.setdefault(key, []).append((step, finite(value)))
        elif m.layer is None or (value := finite(value)) is None:  # a stack site (embed, final_norm): no depth
            continue
        elif m.head is not None:  # one head's max logit: the report charts each attention's, the max over its heads
            continue
        elif attr := PROFILES.get((m.family, m.site, m.stat)) or SITE_PROFILES.get((m.family, m.stat)):
            _keep(raw[attr], step, m, value, last_only=attr in LAST_RECORD_ONLY)


def _keep(records: dict[int, dict[Metric, float]], step: int, m: Metric, value: float, last_only: bool) -> None:
    """Add ``value`` to ``records`` at ``step``; with ``last_only``, records of earlier steps are dropped
    and a value older than the latest record ignored."""
    if last_only and records:
        latest = max(records)  # the one step kept
        if step < latest:
            return
        if step > latest:
            records.clear()
    records.setdefault(step, {})[m] = value


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
    test = (run.status or {}).get("test")
    try:
        run.task = read_task(path, logged=[*run.series, *(test if isinstance(test, dict) else ())])
    except ValueError as e:
        run.notes.append(str(e))
    return run


def runs_task(runs: list[Run]) -> TaskSpec:
    """The task every run is of (``Run.task``; runs whose task.json is unreadable left out).

    Raises:
        ReportError: runs of several tasks (the message counts each), or no run with a readable task.
    """
    specs = {r.task.name: r.task for r in runs if r.task is not None}
    if not specs:
        raise ReportError("no run has a readable task.json")
    if len(specs) > 1:
        counts = ", ".join(f"{name}: {sum(r.task is not None and r.task.name == name for r in runs)} runs" for name in specs)
        raise ReportError(f"the runs are of several tasks ({counts}); report each task's runs on its own")
    return next(iter(specs.values()))


def run_label(run_dir: Path, top: Path, several_tops: bool) -> str:
    """The run's name on the page: its path below the given directory (prefixed by that directory's name
    when several were given), or the directory's own name for a run given directly."""
    top = top.resolve()
    rel = run_dir.relative_to(top).as_posix() if run_dir != top else ""
    if not rel:
        return top.name
    return f"{top.name}/{rel}" if several_tops else rel


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
