"""Weight normalization of the blocks' linear layers (``model.weight_norm``).

WeightNorm (Salimans & Kingma 2016, arXiv 1602.07868, eq. 2) reparametrizes a weight matrix as
``w = g * v / ||v||``: here one g per output unit (row of the (out, in) matrix, ``dim=0``), so each
row's norm is g and its direction v / ||v||. It is the third method of Ba et al. 2016's comparison
(BatchNorm, WeightNorm, LayerNorm; arXiv 1607.06450, sec. 5.1, Table 1) and combines with every ``norm.kind``,
``none`` included. torch computes it (``torch.nn.utils.parametrizations.weight_norm``): g is the
parameter ``parametrizations.weight.original0``, shape (out, 1); v is ``original1``, shape (out, in);
``linear.weight`` reads the computed w.

Which layers: every ``nn.Linear`` of the encoder and decoder blocks, found by role (``linear_roles()``:
attention q/k/v/out, FFN in/out). Not the token embeddings nor the output projection: the output is
tied to the target embedding (``model.tie_embeddings``, every preset), so normalizing it would
normalize the embedding rows too, and normlab's norms act on the blocks only. Applied after the
model's init (placement init rules included), with g = ||w|| per row and v = w, so the model computes
at step 0 exactly what it computes without it; the paper's data-dependent init of g and the bias
(sec. 3) is not reproduced.
"""

from collections.abc import Iterable

from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm


def apply_weight_norm(blocks: Iterable[nn.Module]) -> None:
    """Reparametrize every linear layer that a module of ``blocks`` lists in ``linear_roles()`` as
    ``w = g * v / ||v||`` (dim 0, one g per output unit), in place; the computed w equals the old one
    (up to float rounding)."""
    for block in blocks:
        for module in block.modules():
            for linear in getattr(module, "linear_roles", dict)().values():
                weight_norm(linear, name="weight", dim=0)


def weight_norm_gains(model: nn.Module) -> list[nn.Parameter]:
    """The g (``parametrizations.weight.original0``, (out, 1)) of every weight-normalized layer of
    ``model``: gains, which ``training.optim`` keeps out of weight decay; empty without weight_norm."""
    return [
        m.parametrizations.weight.original0
        for m in model.modules()
        if parametrize.is_parametrized(m, "weight") and hasattr(m.parametrizations.weight, "original0")
    ]
