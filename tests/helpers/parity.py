"""Copying one model's weights into another for the parity tests against torch.nn.Transformer's layers (attention, FFN and
norms), and non-trivial values for a model's 1-D parameters (norm gains and biases start at 1 and 0)."""

import torch
from torch import nn


def copy_attention(dst, src: nn.MultiheadAttention) -> None:
    q, k, v = src.in_proj_weight.chunk(3)
    qb, kb, vb = src.in_proj_bias.chunk(3)
    for proj, w, b in (
        (dst.q_proj, q, qb),
        (dst.k_proj, k, kb),
        (dst.v_proj, v, vb),
        (dst.out_proj, src.out_proj.weight, src.out_proj.bias),
    ):
        proj.weight.data.copy_(w)
        proj.bias.data.copy_(b)


def copy_ffn_and_norms(dst, src, residuals: list, norms: list, slot: str) -> None:
    dst.ffn.branch.linear1.load_state_dict(src.linear1.state_dict())
    dst.ffn.branch.linear2.load_state_dict(src.linear2.state_dict())
    for residual, norm in zip(residuals, norms, strict=True):
        getattr(residual, slot).load_state_dict(norm.state_dict())


def randomize(module: nn.Module) -> None:
    """Non-trivial norm gains and biases (PyTorch initializes them to 1 and 0)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.3)
