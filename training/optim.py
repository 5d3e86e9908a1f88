"""AdamW and a linear-warmup-then-decay learning rate, from torch's own schedulers."""

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR

DECAYS = ("linear", "cosine", "constant")


def build_optimizer(
    model: nn.Module, lr: float, betas: tuple[float, float], weight_decay: float, eps: float
) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) with the fused kernel on CUDA.

    Weight decay applies to matrices and embeddings (dim >= 2) only: decaying norm gains and
    biases would pull the norms being studied toward zero.
    """
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.is_cuda for p in model.parameters())
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def build_scheduler(opt: torch.optim.Optimizer, warmup_steps: int, max_steps: int, decay: str) -> LRScheduler:
    """Linear warmup from ~0 to the peak lr over ``warmup_steps``, then ``decay`` to 0 at ``max_steps``.

    A warmup longer than the run is cut at ``max_steps`` (short smoke runs keep the preset's warmup).

    Raises:
        ValueError: unknown decay (valid: linear, cosine, constant) or a negative warmup_steps.
    """
    if decay not in DECAYS:
        raise ValueError(f"unknown schedule.decay {decay!r}; valid: {', '.join(DECAYS)}")
    if warmup_steps < 0:
        raise ValueError(f"schedule.warmup_steps must be >= 0, got {warmup_steps}")
    warmup_steps = min(warmup_steps, max_steps)
    rest = max(max_steps - warmup_steps, 1)
    after = {
        "linear": lambda: LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=rest),
        "cosine": lambda: CosineAnnealingLR(opt, T_max=rest),
        "constant": lambda: LinearLR(opt, start_factor=1.0, end_factor=1.0, total_iters=rest),
    }[decay]
    if warmup_steps == 0:
        return after()
    warmup = LinearLR(opt, start_factor=1.0 / warmup_steps, end_factor=1.0, total_iters=warmup_steps)
    return SequentialLR(opt, [warmup, after()], milestones=[warmup_steps])
