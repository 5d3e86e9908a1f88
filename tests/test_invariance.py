"""Invariance of the normalized summed inputs under re-scaling and re-centering of weights and data: Ba et al.
2016, "Layer Normalization", arXiv 1607.06450, Table 1 (BatchNorm, WeightNorm, LayerNorm), and Zhang & Sennrich
2019, "Root Mean Square Layer Normalization", arXiv 1910.07467, Table 1 (the same columns, the RMSNorm row added).

The setting is Ba et al.'s sec. 5: the summed inputs ``a = W x`` of a linear layer (W (D, D_in), no bias) for each
of the N training cases x_n of a batch X (N, D_in), then the norm over a (N, D); WeightNorm is instead the linear
layer itself, ``w_i = g_i v_i / ||v_i||`` (Salimans & Kingma 2016; torch's ``nn.utils.parametrizations.weight_norm``
on an ``nn.Linear``), its weights being v. A norm is invariant to a transformation when the output is unchanged.
The columns (Ba et al. sec. 5.1), each a test id's second part:

- ``weight_matrix_rescaling``: W <- delta W (one scalar delta > 0);
- ``weight_matrix_recentering``: W <- W + 1 gamma^T (every row of W shifted by one vector gamma, so each case's
  summed inputs all move by gamma^T x_n);
- ``weight_vector_rescaling``: w_i <- delta w_i for one row i (one neuron's incoming weights);
- ``dataset_rescaling``: x_n <- delta x_n for every case;
- ``dataset_recentering``: x_n <- x_n + gamma for every case (one vector gamma);
- ``single_case_rescaling``: x_n <- delta x_n for one case n.

The cells (I invariant, - not), the test id's first part naming the row:

=================================  ======  ======  ======  ======  ======  ======  ===================================
row (normlab kind, impl)           W sc.   W cen.  w_i sc  X sc.   X cen.  x_n sc  source
=================================  ======  ======  ======  ======  ======  ======  ===================================
batchnorm custom / native          I       -       I       I       I       -       Ba et al. Table 1, "Batch norm"
weightnorm (torch)                 I       -       I       -       -       -       Ba et al. Table 1, "Weight norm"
layernorm custom / native          I       I       -       I       -       I       Ba et al. Table 1, "Layer norm"
rmsnorm custom / native            I       -       -       I       -       I       Zhang & Sennrich Table 1, "RMSNorm"
scalenorm                          I       -       -       I       -       I       from the formula: g a / ||a||
powernorm                          I       -       -       I       -       I       from the formula (see below)
dyt                                -       -       -       -       -       -       from the formula: a control
=================================  ======  ======  ======  ======  ======  ======  ===================================

BatchNorm runs in training mode (batch statistics over the N cases), the case Ba et al. tabulate. ScaleNorm (Nguyen
& Salazar 2019, arXiv 1910.05895) is g a / ||a|| = g a / (sqrt(D) RMS(a)), RMSNorm's row. normlab's PowerNorm
(``model/powernorm.py``, the official code's, in training mode during its warmup) first divides each case by its
RMS (``group_scale``, group_num 1), which removes any per-case scale, then each channel by its quadratic mean over
the batch, which alone is not shift-invariant: RMSNorm's row too. The paper's PowerNorm, without the group
scaling, would be invariant to weight-vector re-scaling and not to single-case re-scaling. DyT (Zhu et al. 2025,
arXiv 2503.10622), tanh(alpha a) with no statistics, is invariant to none: the control that a "not invariant" cell
fails for a plain element-wise map too; its alpha is set to 0.05 so that alpha a is of order 1 (a saturated tanh
is nearly sign(a), which no positive re-scaling changes).

W ~ N(0, 1) and X ~ 4 N(0, 1), so the summed inputs have a variance of about 16 D_in = 192. Each norm keeps its
default eps (1e-5), which breaks every scale invariance by O(eps / var); with that variance and every scale factor
> 1 it moves the outputs by at most 4e-7 (measured), and each invariant cell holds to ``INVARIANT`` = 1e-5
(float64). Each "not invariant" cell changes the output by more
than ``CHANGED`` (||y' - y|| / ||y||, L2 over the batch; measured 0.17 for DyT's weight-vector re-scaling, the
smallest, to 1.5).
"""

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from model.norms import BatchReadingNorm, build_norm

N, D_IN, D = 8, 12, 16  # training cases, inputs, neurons (summed inputs)
INVARIANT = 1e-5  # max |y' - y| where the table says invariant (the outputs are of order 1)
CHANGED = 0.1  # least ||y' - y|| / ||y|| where it says not
DATA_SCALE = 4.0  # X ~ DATA_SCALE * N(0, 1): summed inputs large enough that eps is negligible
DYT_ALPHA = 0.05  # about 1 / std(a): DyT's tanh out of saturation
COLUMNS = (
    "weight_matrix_rescaling",
    "weight_matrix_recentering",
    "weight_vector_rescaling",
    "dataset_rescaling",
    "dataset_recentering",
    "single_case_rescaling",
)
# Row -> the invariant cells, in COLUMNS order (module docstring's table).
ROWS = {
    "batchnorm-custom": (True, False, True, True, True, False),
    "batchnorm-native": (True, False, True, True, True, False),
    "weightnorm": (True, False, True, False, False, False),
    "layernorm-custom": (True, True, False, True, False, True),
    "layernorm-native": (True, True, False, True, False, True),
    "rmsnorm-custom": (True, False, False, True, False, True),
    "rmsnorm-native": (True, False, False, True, False, True),
    "scalenorm-custom": (True, False, False, True, False, True),
    "powernorm-custom": (True, False, False, True, False, True),
    "dyt-custom": (False,) * 6,
}
Transform = Callable[[torch.Tensor, torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def _shift(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _rescale_row(w: torch.Tensor) -> torch.Tensor:
    w = w.clone()
    w[3] *= 3.0
    return w


def _rescale_case(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[5] *= 3.0
    return x


# Column -> (W, X, generator) -> (W', X').
TRANSFORMS: dict[str, Transform] = {
    "weight_matrix_rescaling": lambda w, x, g: (2.5 * w, x),
    "weight_matrix_recentering": lambda w, x, g: (w + _shift((1, D_IN), g), x),  # W + 1 gamma^T
    "weight_vector_rescaling": lambda w, x, g: (_rescale_row(w), x),
    "dataset_rescaling": lambda w, x, g: (w, 2.5 * x),
    "dataset_recentering": lambda w, x, g: (w, x + _shift((1, D_IN), g)),
    "single_case_rescaling": lambda w, x, g: (w, _rescale_case(x)),
}


def layer(row: str, g: torch.Generator) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """(W (D, D_IN), X (N, D_IN)) -> the row's output (N, D), float64; its parameters drawn from ``g`` around their
    init (gains near 1, shifts near 0), so that no cell holds for the init's special values; DyT's alpha ``DYT_ALPHA``."""
    if row == "weightnorm":
        linear = weight_norm(nn.Linear(D_IN, D, bias=False).double())
        gain = 1 + 0.1 * _shift((D, 1), g)

        def weight_normed(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                linear.parametrizations.weight.original0.copy_(gain)  # g
                linear.parametrizations.weight.original1.copy_(w)  # v: the weights Ba et al. transform
            return linear(x)

        return weight_normed
    kind, impl = row.split("-")
    norm = build_norm(kind, D, impl=impl).double().train()
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(0.1 * _shift(tuple(p.shape), g))
        if kind == "dyt":
            norm.alpha.fill_(DYT_ALPHA)

    def normed(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        a = x @ w.T  # (N, D): the summed inputs
        if isinstance(norm, BatchReadingNorm):  # the N cases as the real tokens of one (1, N, D) stream
            return norm(a[None], torch.ones(1, N, dtype=torch.bool))[0]
        return norm(a)

    return normed


@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("row", ROWS)
def test_invariance_table_cell(row, column):
    g = torch.Generator().manual_seed(0)
    w, x = _shift((D, D_IN), g), DATA_SCALE * _shift((N, D_IN), g)
    f = layer(row, g)
    with torch.no_grad():
        y, y_new = f(w, x), f(*TRANSFORMS[column](w, x, g))
    if ROWS[row][COLUMNS.index(column)]:
        assert (y_new - y).abs().max().item() <= INVARIANT
    else:
        assert ((y_new - y).norm() / y.norm()).item() > CHANGED
