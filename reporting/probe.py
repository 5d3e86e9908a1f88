"""The probes of a trained run (``python -m scripts.probe``): layer drop, the angles between a block's input and
output, the output's change under a small step, and batch dependence, computed and drawn as PNGs and a JSON."""

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import torch
from omegaconf import OmegaConf

from data.batching import Seq2SeqData
from model.config import NormConfig
from model.placements import PLACEMENTS
from runlog.metric_names import STACKS
from training.checkpoint import load_checkpoint, model_from
from training.evaluate import even_stride
from training.probes import batch_dependence, first_batch, init_output_change, layer_drop, stream_distances, two_batches
from training.schema import validate
from training.tasks import build_task

DEFAULT_PLACEMENTS = ("post", "pre", "admin", "deepnorm")  # Admin's comparison, and DeepNet's
CHANGE_EXAMPLES = 64  # pairs in the output-change batch (the first of the probed ones) and in each batch-dependence batch


def default_placements(norm: NormConfig) -> list[str]:
    """:data:`DEFAULT_PLACEMENTS` that take ``norm.kind``, then the run's own placement if not among them."""
    names = [p for p in DEFAULT_PLACEMENTS if PLACEMENTS[p].admits(norm.kind)]
    return names if norm.placement in names else [*names, norm.placement]


def probe(
    run_dir: Path, max_examples: int, placements: list[str] | None, depths: list[int], delta: float, device: torch.device
) -> dict:
    """The probes' results (the keys of ``probe.json``, values not yet made JSON-safe).

    Raises:
        FileNotFoundError: no ``RUN_DIR/checkpoint.pt``, or the run's data is missing.
        ValueError: ``max_examples`` < 1, fewer than 4 pairs probed, ``delta`` < 0, a depth < 1, a placement unknown or one
            the run's norm kind cannot take (the messages name the valid values); a saved config
            that today's schema refuses (``training.schema.validate``: one written before a key
            without a default existed).
    """
    if max_examples < 1:
        raise ValueError(f"--max-examples={max_examples} is invalid; it must be >= 1")
    if not delta >= 0:
        raise ValueError(f"--delta={delta} is invalid; it must be >= 0")
    if bad := [d for d in depths if d < 1]:  # else the model built at that depth would blame model.n_enc_layers
        raise ValueError(f"--depths {bad[0]} is invalid; each depth (blocks per stack) must be an integer >= 1")
    ckpt = load_checkpoint(run_dir / "checkpoint.pt")
    model = model_from(ckpt).to(device)
    cfg = validate(OmegaConf.create(ckpt["config"]))
    valid = build_task(cfg, None, ckpt).data["valid"]
    keep = even_stride(len(valid), max_examples)
    data = Seq2SeqData([valid.src[i] for i in keep], [valid.tgt[i] for i in keep])
    halves = two_batches(data, CHANGE_EXAMPLES, device)  # too few pairs: the error comes before the slow probes
    loss, drops = layer_drop(model, data, cfg.trainer.max_tokens, device)
    angles = stream_distances(model, data, cfg.trainer.max_tokens, device)
    batch = first_batch(data, CHANGE_EXAMPLES, device)
    names = placements or default_placements(model.cfg.norm)
    change = init_output_change(model.cfg, names, depths, batch, delta, seed=cfg.seed)
    dependence = batch_dependence(model, *halves)
    return {
        "loss": loss,
        "examples": len(data),
        "layer_drop": drops,
        "angular_distance": angles,
        "output_change": change,
        "delta": delta,
        "batch_dependence": dependence,
    }


def json_safe(value: object) -> object:
    """``value`` with every non-finite float as None (JSON has no inf or NaN)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def plot_layer_drop(result: dict, path: Path) -> None:
    """Bars of Δloss per block, encoder then decoder."""
    fig, ax = plt.subplots(figsize=(8, 4))
    labels: list[str] = []
    for stack, color in zip(STACKS, ("#1f77b4", "#ff7f0e"), strict=True):
        values = [math.nan if v is None else v for v in result["layer_drop"][stack]]  # a NaN bar is not drawn
        ax.bar(range(len(labels), len(labels) + len(values)), values, color=color, label=stack)
        labels += [f"{stack}.{i}" for i in range(len(values))]
    ax.axhline(0, color="#444", lw=0.8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set(
        title=f"Layer drop: valid loss with block i skipped − full ({result['loss']:.3f})",
        xlabel="block skipped",
        ylabel="Δ loss (nats per token)",
    )
    ax.legend()
    _save(fig, path)


def plot_angles(result: dict, path: Path) -> None:
    """One heatmap per stack of the mean angular distance between the streams entering blocks l and m."""
    fig, axes = plt.subplots(1, len(STACKS), figsize=(10, 4.5))
    for ax, stack in zip(axes, STACKS, strict=True):
        matrix = [[math.nan if v is None else v for v in row] for row in result["angular_distance"][stack]]
        image = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis", origin="lower")
        ticks = range(len(matrix))
        ax.set_xticks(ticks, [*map(str, ticks[:-1]), "out"])
        ax.set_yticks(ticks, [*map(str, ticks[:-1]), "out"])
        ax.set(title=f"{stack}: d(x_l, x_m)", xlabel="m (stream entering block m)", ylabel="l")
    fig.colorbar(image, ax=axes, label="angular distance (0: same direction, 1: opposite)")
    _save(fig, path)


def plot_output_change(result: dict, path: Path) -> None:
    """Output change vs depth, one line per placement (log y where every value is positive)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    values = []
    for placement, by_depth in result["output_change"].items():
        depths = sorted(by_depth, key=int)
        values += [by_depth[d] for d in depths]
        ax.plot([int(d) for d in depths], [by_depth[d] for d in depths], marker="o", label=placement)
    if values and all(v is not None and v > 0 for v in values):
        ax.set_yscale("log")
    ax.set_xticks(sorted({int(d) for by_depth in result["output_change"].values() for d in by_depth}))
    ax.set(
        title=f"Output change at init, δ = {result['delta']:g} · rms(w) · N(0, I)",
        xlabel="blocks per stack",
        ylabel="E |f(x, w) − f(x, w + δ)|²",
    )
    ax.legend()
    _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> None:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def write_probe(result: dict, out: Path) -> list[Path]:
    """``out/probe.json`` and the three PNGs; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    safe = json_safe(json.loads(json.dumps(result)))  # int depth keys become strings, as on reading back
    assert isinstance(safe, dict)  # json_safe keeps a dict a dict
    (out / "probe.json").write_text(json.dumps(safe, indent=1), encoding="utf-8")
    paths = [out / "probe.json"]
    for name, plot in (("layer_drop", plot_layer_drop), ("angular_distance", plot_angles), ("output_change", plot_output_change)):
        plot(safe, out / f"{name}.png")
        paths.append(out / f"{name}.png")
    return paths
