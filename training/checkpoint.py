"""Checkpoints written atomically, verified on read, with the previous one kept as a fallback.

A checkpoint is one ``torch.save`` dict: what checks and rebuilds the run before anything loads (``config``, the
resolved run config; ``model_config``, a plain dict; ``task`` and ``vocab``, see ``training/tasks/``), one entry per
stateful piece of the run, each registered once in ``training.run.Run.pieces`` (``model``, ``optimizer``, ``rng``:
a list with one entry per rank, that rank's torch CPU, its own CUDA device's and Python ``random`` states;
``step``; ``data_position``: epoch, next batch; ``counters``: training seconds and tokens so far; ``spikes``: the
spike scores' running state, ``training.spikes.RunSpikes``; ``telemetry``: each weight matrix's power-iteration
vector; ``best``: the best validation so far or None), and ``format``. What older checkpoints lack or hold in
another form is read as today's by ``runlog/migrate.py``. The learning-rate schedule is not stored: it is a
function of (config, step), re-planned on resume.

On disk a run dir holds ``checkpoint.pt`` (latest), ``checkpoint.prev.pt`` (the one before) and a
``.sha256`` file next to each. A write goes to a temp file, is fsynced, and only then renamed
into place, so a reader never sees half a file; the digest catches what the rename cannot (a
disk or copy that corrupts bytes, which ``torch.load`` would load without complaint).

Whether a run may continue (or skip as done) what its run dir holds is decided here too, before anything is
written: :class:`ResumeRefused`, :func:`config_diff`, :func:`finished_run_changes`.
"""

import hashlib
import os
import random
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import OmegaConf

from model.config import ModelConfig
from model.transformer import EncoderDecoder
from runlog.atomic import atomic_write
from runlog.migrate import migrate_checkpoint
from runlog.renames import with_current_names

FORMAT = "normlab-checkpoint-v2"
LATEST, PREVIOUS = "checkpoint.pt", "checkpoint.prev.pt"
MODEL_SECTIONS = ("model", "norm")  # the config sections a run's model is built from


class ResumeRefused(ValueError):
    """This run cannot continue (or skip as done) the run in its run dir: another model, norm or task, or a
    checkpoint past ``trainer.max_steps``. Raised before anything is written, so the run dir stays as it was."""


def config_diff(old: dict, new: dict, prefix: str = "", was: str = "checkpoint") -> str:
    """``key: <was> A, this run B`` for each differing key (nested dicts joined with dots), ``; ``-joined."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            if nested := config_diff(a, b, f"{prefix}{key}.", was):
                out.append(nested)
        elif a != b:
            out.append(f"{prefix}{key}: {was} {a!r}, this run {b!r}")
    return "; ".join(out)


def finished_run_changes(run_dir: Path, config: dict[str, Any]) -> str:
    """How the resolved ``config`` differs from the finished run's in ``run_dir`` (its ``config.yaml``, read with
    today's key names) outside the model, as :func:`config_diff` text; "" when they agree or there is no
    ``config.yaml``. The models are compared as a resume compares them: as :class:`ModelConfig` (defaults filled in).

    Raises:
        ResumeRefused: the models differ: ``config`` describes another run than the one there.
    """
    path = run_dir / "config.yaml"
    if not path.is_file():
        return ""
    old = with_current_names(cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(path), resolve=True)))
    if model := config_diff(_model(old), _model(config), was="finished run"):
        raise ResumeRefused(
            f"{run_dir} holds a finished run of another model ({model}); nothing was changed there: "
            "give this run another hydra.run.dir, or train.resume=null to replace that run"
        )
    old_rest, new_rest = ({k: v for k, v in c.items() if k not in MODEL_SECTIONS} for c in (old, config))
    return config_diff(old_rest, new_rest, was="finished run")


def _model(config: dict[str, Any]) -> dict[str, Any]:
    """The model a resolved run config describes, in :meth:`ModelConfig.to_dict`'s form (vocabulary sizes aside)."""
    try:
        return ModelConfig.from_dict(
            {**config.get("model", {}), "norm": config.get("norm", {}), "src_vocab": 1, "tgt_vocab": 1}
        ).to_dict()
    except (TypeError, ValueError):  # a config no longer valid: compared as written
        return {k: config.get(k) for k in MODEL_SECTIONS}


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every RNG this process draws from, to restore on resume: torch's CPU generator, Python's
    ``random`` and, on CUDA, the generator of ``device`` only (reading every GPU's state would open
    a CUDA context on each of them from every rank)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(states: list[dict[str, Any]], rank: int, world: int, device: torch.device) -> None:
    """Restore rank ``rank``'s streams from a checkpoint's ``rng`` entry (one state per rank).

    A checkpoint written by another number of ranks (or before per-rank states: ``runlog.migrate`` makes its
    single dict a list of one) cannot continue every rank's stream: rank r then takes state ``r mod n`` and a
    warning says that the resumed run is not bit-exact (its data shards differ too)."""
    if len(states) != world and rank == 0:
        print(
            f"normlab: warning: the checkpoint holds RNG streams of {len(states)} rank(s), this run has {world}: "
            "training continues, but not exactly as the interrupted run would have"
        )
    state = states[rank % len(states)]
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        cuda = state["cuda"]  # older checkpoints hold every device's state
        torch.cuda.set_rng_state(cuda[device.index or 0] if isinstance(cuda, list) else cuda, device)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (``training.run.save_run``'s: every registered piece) as ``run_dir/checkpoint.pt``; the
    checkpoint it replaces becomes ``checkpoint.prev.pt``. Returns the path written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    latest, previous, staged = run_dir / LATEST, run_dir / PREVIOUS, run_dir / f".{LATEST}.new"
    atomic_write(staged, lambda f: torch.save({"format": FORMAT, **state}, f))
    digest = _sha256(staged)
    if latest.exists():  # keep the last good checkpoint until the new one is in place
        os.replace(latest, previous)
        if Path(f"{latest}.sha256").exists():
            os.replace(f"{latest}.sha256", f"{previous}.sha256")
    os.replace(staged, latest)
    atomic_write(Path(f"{latest}.sha256"), lambda f: f.write(f"{digest}  {LATEST}\n".encode()))
    return latest


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read and verify a checkpoint written by :func:`save_checkpoint` (or ``best.pt``), onto the CPU, as today's
    normlab writes it: older entries and config keys migrated (``runlog.migrate.migrate_checkpoint``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is truncated or corrupt (digest mismatch, unreadable) or not a
            normlab checkpoint of this format; the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {str(path)!r}")
    sidecar = Path(f"{path}.sha256")
    if sidecar.is_file() and sidecar.read_text().split()[0] != _sha256(path):
        raise ValueError(f"checkpoint {str(path)!r} is corrupt: its SHA-256 differs from {sidecar.name}")
    try:
        # weights_only=False: the file holds Python RNG state; only load checkpoints you trust.
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ValueError(f"checkpoint {str(path)!r} is truncated or corrupt ({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a normlab checkpoint (expected format {FORMAT!r})")
    return migrate_checkpoint(ckpt)


def load_latest_good(path: Path) -> tuple[dict[str, Any], Path]:
    """Load ``path``; if it is corrupt and a ``checkpoint.prev.pt`` sits next to it, warn (naming
    the bad file) and load that instead. Returns (checkpoint, the path it came from).

    Raises:
        FileNotFoundError / ValueError: as :func:`load_checkpoint`, when no good checkpoint is left.
    """
    try:
        return load_checkpoint(path), path
    except ValueError as e:
        fallback = path.with_name(PREVIOUS)
        if path.name != LATEST or not fallback.is_file():
            raise
        print(f"normlab: warning: {e}; using the previous checkpoint {fallback}")
        return load_checkpoint(fallback), fallback


def resolve_resume(resume: str | None, run_dir: Path) -> tuple[dict[str, Any], Path] | None:
    """The checkpoint a run starts from: ``train.resume`` = a path, ``auto`` (the latest good
    checkpoint in ``run_dir``, or a fresh start when there is none) or null (fresh start).

    Raises:
        FileNotFoundError: an explicit path that does not exist.
        ValueError: the checkpoint (and its fallback) is corrupt or of another format.
    """
    if resume is None:
        return None
    if resume == "auto":
        latest = run_dir / LATEST
        if not latest.exists() and not (run_dir / PREVIOUS).exists():
            return None
        return load_latest_good(latest if latest.exists() else run_dir / PREVIOUS)
    if not Path(resume).is_file():
        raise FileNotFoundError(f"train.resume={resume!r}: no checkpoint file there; valid: auto, null or a checkpoint.pt path")
    return load_latest_good(Path(resume))


def model_from(ckpt: dict) -> EncoderDecoder:
    """The model of a loaded checkpoint (``training.checkpoint.load_checkpoint``), its weights loaded, on the CPU."""
    model = EncoderDecoder(ModelConfig.from_dict(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model
