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

# ``auto`` per device type: bf16 on CUDA (Tensor Cores; what normlab's GPU runs always used). fp32 on the CPU, from
# ``python -m scripts.bench precision`` (docs/benchmarks.md#bf16-vs-fp32-on-the-cpu-measured; one thread of an AMD EPYC
# with AVX512-BF16): bf16 / fp32 step time 0.70 for the default model and 0.52 for model=base, with a loss gap after
# 200 steps of G2P (val loss -0.002) well inside the seed spread (0.022); but 1.35 for model=tiny (the tests' and smoke
# runs': its d=32 matmuls gain nothing, and CPU SDPA's flash kernel at head dim 16 is slower in bf16, its backward
# 2.2x in torch.profiler), and 1.56 / 7.6 for the default model where the CPU lacks bf16
# instructions (oneDNN held to AVX512_CORE / AVX2). bf16 is opt-in on the CPU, so that a run's numerics and speed do
# not turn on which CPU it landed on, and the committed CPU results (all fp32) stay reproducible.
AUTO = {"cuda": "bf16", "cpu": "fp32"}


def resolve_precision(name: str, device: torch.device) -> str:
    """``fp32`` or ``bf16``: ``name`` itself, or for ``auto`` the device type's entry of ``AUTO`` (fp32 on a device
    type it does not list). ``name`` is checked by ``training.schema`` (one of ``schema.PRECISIONS``)."""
    return AUTO.get(device.type, "fp32") if name == "auto" else name


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """The context the forward pass runs in: bf16 autocast on ``device``'s type for ``bf16``, nothing for ``fp32``.
    One object, entered once per micro-batch (``training.step.StepOptions.autocast``)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
