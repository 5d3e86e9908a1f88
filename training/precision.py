"""``trainer.precision``: the floating-point precision a run trains in, and the autocast context that gives it.

``fp32``: no autocast. ``bf16``: ``torch.autocast(device.type, dtype=torch.bfloat16)`` around the forward pass,
on CUDA and on the CPU alike: matmuls, convolutions and SDPA run in bfloat16, while the parameters, their
gradients and AdamW's state stay float32 (the master weights; autocast casts a weight per op, never in place), the
loss is taken in float32 (``training.step.token_losses``), and the custom norms, hyper-connection mixing and
telemetry compute their statistics in float32 (``model/norms.py``, ``model/hyper_connections.py``,
``telemetry/activations.py``). Validation, decoding and the final test run without autocast, in float32.
"""

from contextlib import AbstractContextManager, nullcontext

import torch

# ``auto`` per device type: bf16 on CUDA (Tensor Cores; what normlab's GPU runs always used). On the CPU fp32, from
# ``python -m scripts.bench precision`` (docs/benchmarks.md#bf16-vs-fp32-on-the-cpu-measured): with AMX-bf16 a step of
# the default model takes ~0.7x the fp32 time, but its loss after 200 steps of G2P is worse than fp32's by more than
# seeds differ, so the default keeps the numbers every committed CPU result was measured in.
AUTO = {"cuda": "bf16", "cpu": "fp32"}


def resolve_precision(name: str, device: torch.device) -> str:
    """``fp32`` or ``bf16``: ``name`` itself, or for ``auto`` the device type's entry of ``AUTO`` (fp32 on a device
    type it does not list). ``name`` is checked by ``training.schema`` (one of ``schema.PRECISIONS``)."""
    return AUTO.get(device.type, "fp32") if name == "auto" else name


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """The context the forward pass runs in: bf16 autocast on ``device``'s type for ``bf16``, nothing for ``fp32``.
    One object, entered once per micro-batch (``training.step.StepOptions.autocast``)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
