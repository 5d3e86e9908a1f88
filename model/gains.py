"""Zero-centred norm gains (``norm.gain=unit_offset``): a norm's per-channel gain stored as ``w`` and applied as
``1 + w``, for every kind whose gain is its ``weight`` parameter, custom and native alike.

Gemma 3's RMSNorm computes ``x_hat * (1 + w)`` with ``w`` initialized at 0 (Hugging Face transformers,
``models/gemma3/modeling_gemma3.py``, ``Gemma3RMSNorm.forward``: ``output * (1.0 + self.weight.float())``);
Qwen3-Next's (``Qwen3NextRMSNorm``) does the same. With ``plain`` gains the stored ``weight`` is the gain itself.

One mechanism for every kind: torch's parametrization (``torch.nn.utils.parametrize``) of the module's ``weight``,
so ``module.weight`` reads the effective gain ``1 + w`` wherever it is read (the custom norms' forward, ``nn.RMSNorm``
and ``nn.LayerNorm``, telemetry's ``scale/`` statistics) and the stored parameter is
``parametrizations.weight.original`` (w). The distinct name is deliberate: a plain checkpoint's gain (about 1)
loaded as w would double every gain, so ``load_state_dict`` refuses the swap (missing / unexpected keys) instead.
``w`` starts at ``gain_init - 1`` (0 for every gain that starts at 1; ScaleNorm's g starts at sqrt(D), so its w at
sqrt(D) - 1), so a model computes at step 0 what the plain one computes.

w is kept in the parameter's dtype (float32 in every normlab run; autocast leaves parameters float32), so
``1 + w`` is computed in float32 as Gemma's ``1.0 + self.weight.float()``.
"""

import torch
from torch import nn
from torch.nn.utils import parametrize


class UnitOffset(nn.Module):
    """The parametrization ``gain = 1 + w`` (``forward``) and its inverse ``w = gain - 1`` (``right_inverse``, which
    ``register_parametrization`` uses once to set w from the module's initial gain). Shapes: any -> the same."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 1 + w

    def right_inverse(self, gain: torch.Tensor) -> torch.Tensor:
        return gain - 1


def apply_unit_offset(norm: nn.Module) -> nn.Module:
    """Store ``norm``'s gain ``weight`` as ``w = weight - 1`` and apply ``1 + w``, in place; returns ``norm``.
    A module without a ``weight`` parameter (``none``'s ``nn.Identity``, ``l2``) has no gain and is returned
    unchanged, as ``norm.bias`` is ignored by kinds without a shift."""
    if isinstance(getattr(norm, "weight", None), nn.Parameter):
        parametrize.register_parametrization(norm, "weight", UnitOffset())
    return norm
