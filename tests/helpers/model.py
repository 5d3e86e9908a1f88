"""Model set-ups shared by the norm tests: every norm's parameters randomized away from their initial values."""

import torch
from torch import nn


def randomize_norms(module: nn.Module) -> None:
    """Move every norm weight/bias off its init, so a hand computation that ignores them would differ."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "_norm." in name:
                p.add_(torch.randn_like(p) * 0.3)
