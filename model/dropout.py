"""Dropout (Srivastava et al. 2014) with its mask drawn from ``torch.rand_like`` instead of ``bernoulli_``.

``nn.Dropout`` on the CPU draws its mask with ``bernoulli_``, whose MKL path current PyTorch builds leave out
(pytorch PR #146174; pytorch issue #138199, "aten::bernoulli_ taking 34 % of the runtime on cpu"): one slow
element at a time. ``rand_like`` then a comparison draws the same kind of mask faster
(``python -m scripts.bench dropout``, docs/benchmarks.md). It draws other numbers from the generator than
``bernoulli_``: a seed gives other masks than ``nn.Dropout``'s. The model still builds ``nn.Dropout``: the step
gain measured so far (docs/benchmarks.md) is under the 10 % that would make this its dropout.

Keep probability: the CPU generator's float ``uniform_`` is ``k * 2^-24`` for k uniform on 0 .. 2^24 - 1, so
``u >= p`` keeps with probability ``1 - ceil(p * 2^24) / 2^24``: 1 - p less under 2^-24 (6e-8) from rounding p
up to the grid, the draw made in float32 whatever the input's dtype (tests/test_dropout.py checks the grid).
"""

from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


class Dropout(nn.Dropout):
    """``nn.Dropout`` in training mode: zero each element with probability ``p``, scale the kept ones by
    1 / (1 - p); the identity in eval mode or at p = 0. The mask is ``rand_like(x) >= p`` (module docstring).

    Args:
        p: the drop probability, in [0, 1) (``model.config.ModelConfig`` checks the configured ones).

    Shapes: any input; output the same shape and dtype.
    """

    def __init__(self, p: float) -> None:
        super().__init__(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        # One float mask holding 0 or 1 / (1 - p), built in place, as ATen's CPU dropout builds its bernoulli_ mask
        # (noise.div_(1 - p)); autograd saves it for the backward's grad * mask.
        # Drawn in float32 whatever x's dtype: a bf16 draw would round u onto a coarser grid than the docstring's.
        mask = torch.rand_like(x, dtype=torch.float32).ge_(self.p).to(x.dtype).div_(1.0 - self.p)
        return x * mask


def with_dropout(model: M, kind: type[torch.nn.Dropout]) -> M:
    """``model`` with each of its dropouts (``nn.Dropout`` or normlab's ``Dropout``) replaced by a ``kind`` of the
    same p."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, torch.nn.Dropout):
                setattr(module, name, kind(child.p))
    return model
