"""Softpick as its official code writes it (zaydzuhri/softpick-attention, ``naive_softpick_attn.py``, function
``softpick``), restated for a side-by-side check of ``model.attn_weights.softpick``: the row max m, exp(x - m) -
exp(-m), its rectified value over the sum of its absolute values at the finite logits, plus eps. Rows whose logits
are all -inf give NaN here (m = -inf); normlab gives them zeros."""

import torch
import torch.nn.functional as F


def official_softpick(x: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    m = torch.max(x, dim=dim, keepdim=True).values
    e = torch.exp(x - m) - torch.exp(-m)
    return F.relu(e) / (torch.sum(torch.where(x.isfinite(), e.abs(), 0), dim=dim, keepdim=True) + eps)
