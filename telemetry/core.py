"""What every telemetry module shares: the configuration, the model's blocks in depth order, and the
first non-finite value of a record.

A record in the making is one dict, metric name -> 0-dim tensor on the device (:data:`DeviceStats`):
each module writes its statistics into the one the :class:`telemetry.Telemetry` of the run holds, in
the order the step takes them, and ``Telemetry.collect`` moves them to the host in one transfer.
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from model.transformer import EncoderDecoder
from runlog.metric_names import SITE_GROUPS, STACKS, STATS

DeviceStats = dict[str, torch.Tensor]  # metric name -> 0-dim tensor, in recording order


@dataclass(frozen=True)
class TelemetryConfig:
    """What to record and how often.

    Attributes:
        every: steps between records; 0 turns telemetry off.
        sites: activation site groups, a subset of ``SITE_GROUPS``.
        stats: statistics per site, a subset of ``STATS``; ``token_cos`` and ``saturation`` are taken
            only at the sites that define them (``ACT_STAT_SITES``; saturation where the norm is DyT or DyISRU).
        grads: record ``grad/{s}.{i}/norm``.
        updates: record ``update/{s}.{i}/ratio`` (copies the weights before the step).
        weights: record ``weight/{s}.{i}.{m}/{sigma_max|stable_rank}`` of every block matrix.
        scales: record ``scale/{s}.{i}.{site}/{stat}``, every learned norm gain, gate and temperature.
        attn_entropy: record ``attn/.../entropy`` (from the attention logits, written out from q and k).
        attn_max_logit: record ``attn/.../max_logit`` (the same logits: computed once when both are on).
        logits: record ``out/logz`` and ``out/max_logit`` from the training step's output logits.
        adam: record ``update/{s}.{i}/adam_rms`` and ``optim/below_eps`` from AdamW's state after the step.

    Raises:
        ValueError: an unknown site or stat (the message lists the valid ones), or every < 0.
    """

    every: int = 50
    sites: tuple[str, ...] = SITE_GROUPS
    stats: tuple[str, ...] = STATS
    grads: bool = True
    updates: bool = False
    attn_entropy: bool = False
    weights: bool = True
    scales: bool = True
    attn_max_logit: bool = True
    logits: bool = True
    adam: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"telemetry.every must be an integer >= 0, got {self.every!r}")
        for key, given, valid in (("sites", self.sites, SITE_GROUPS), ("stats", self.stats, STATS)):
            unknown = [v for v in given if v not in valid]
            if unknown:
                raise ValueError(f"unknown telemetry.{key} {unknown}; valid {key}: {', '.join(valid)}")
        object.__setattr__(self, "sites", tuple(self.sites))
        object.__setattr__(self, "stats", tuple(self.stats))


def stacks(model: EncoderDecoder) -> Iterator[tuple[str, nn.Module, nn.ModuleList, nn.Module]]:
    """(``enc``/``dec``, embedding, layers, final norm) in the depth order of ``STACKS``."""
    parts = {
        "enc": (model.src_embed, model.encoder, model.enc_final_norm),
        "dec": (model.tgt_embed, model.decoder, model.dec_final_norm),
    }
    for stack in STACKS:
        yield stack, *parts[stack]


def blocks(model: EncoderDecoder) -> Iterator[tuple[str, int, nn.Module]]:
    """(stack, index, layer) of every block in depth order."""
    for stack, _, layers, _ in stacks(model):
        yield from ((stack, i, layer) for i, layer in enumerate(layers))


def first_nonfinite(stats: dict[str, float]) -> str | None:
    """The first metric name (in recording order) whose value is NaN or inf, or None."""
    return next((k for k, v in stats.items() if not math.isfinite(v)), None)
