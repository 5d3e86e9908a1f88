"""What every telemetry module shares: the configuration, the model's blocks in depth order, and the
first non-finite value of a record.

A record in the making is one dict, metric name -> 0-dim tensor on the device (:data:`DeviceStats`):
each module writes its statistics into the one the :class:`telemetry.Telemetry` of the run holds, in
the order the step takes them, and ``Telemetry.collect`` moves them to the host in one transfer.
"""

import math
from collections.abc import Iterator

import torch
from torch import nn

from model.transformer import EncoderDecoder
from runlog.metric_names import STACKS

DeviceStats = dict[str, torch.Tensor]  # metric name -> 0-dim tensor, in recording order


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
