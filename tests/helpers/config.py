"""The repository root and the composed configs of the tests: conf/config.yaml with the tiny settings, the model config
it describes, a schedule's learning rates replayed, a few optimizer steps on one batch."""

from dataclasses import replace
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from data.tokenizer import PAD_ID
from model.config import ModelConfig
from training.optim import build_optimizer, build_scheduler
from training.presets import default_optim
from training.schema import ScheduleConfig, validate
from training.tasks import g2p

ROOT = Path(__file__).resolve().parents[2]


TINY = ["model=tiny", "trainer=smoke", "logger=none", "telemetry.every=5"]
GROUPS = ("model", "norm", "attn", "data", "optim", "schedule", "trainer", "logger", "telemetry")  # the preset groups of conf/
NEEDS = {"data=local": ["data.path=/corpus"]}  # a preset with a required key left to the user


def presets() -> list[str]:
    """``group=name`` of every preset file of :data:`GROUPS`, sorted within each group."""
    return [f"{g}={p.stem}" for g in GROUPS for p in sorted((ROOT / "conf" / g).glob("*.yaml"))]


def compose_conf(*overrides: str, hydra: bool = False) -> DictConfig:
    """conf/config.yaml composed with ``overrides`` (later wins); ``hydra``: with the ``hydra`` node (a preset's
    ``hydra.sweeper.params``)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def make_cfg(*overrides: str) -> DictConfig:
    """conf/config.yaml composed with the tiny test settings and ``overrides`` (later wins)."""
    return compose_conf(*TINY, *overrides)


def default_g2p_data() -> tuple:
    """What a default run's G2P task builds (``training.tasks.g2p._g2p_data``: vocabularies, token ids per split,
    eval sets, training words), through the data cache as a run reads it."""
    cfg = validate(make_cfg())
    return g2p._g2p_data(cfg.data.keep_stress, None, cfg.data.cache_dir)


def model_config(cfg: DictConfig, src_vocab: int, tgt_vocab: int) -> ModelConfig:
    """The model ``cfg`` describes, with these vocabulary sizes (``training.run.start_run`` takes them from
    the data); raises ValueError on a bad config."""
    return replace(validate(cfg).model, src_vocab=src_vocab, tgt_vocab=tgt_vocab, pad_id=PAD_ID)


def fit_losses(
    model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor, opt: torch.optim.Optimizer, steps: int
) -> list[float]:
    """The teacher-forced cross-entropy of ``steps`` optimizer steps on one batch: src (B, S), tgt (B, T) whose
    first T - 1 positions are the decoder input and last T - 1 the targets (no padding)."""
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def scheduled_lrs(peak: float, warmup: int, max_steps: int, n: int, decay: str, start: int = 0,
                  loaded_lr: float | None = None) -> list[float]:  # fmt: skip
    """The lr of updates start + 1 .. start + n of a run's schedule, replayed to ``start`` as a resume
    replays it; ``loaded_lr``: the lr an optimizer state loaded from a checkpoint carries."""
    opt = build_optimizer(torch.nn.Linear(2, 2), default_optim(lr=peak))
    if loaded_lr is not None:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] = loaded_lr
    sched = build_scheduler(opt, peak, ScheduleConfig(warmup, decay), max_steps, start_step=start)
    out = []
    for _ in range(n):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out
