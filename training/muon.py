"""Muon on the blocks' hidden matrices, AdamW on everything else, as one optimizer (``optim=muon``).

Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/; torch's ``torch.optim.Muon``) replaces a
matrix's momentum update by the nearest semi-orthogonal matrix, approximated by 5 Newton-Schulz iterations in
bfloat16 (on a CPU normlab runs them in float32 by default: ``optim.muon.ns_dtype``, :func:`newton_schulz_in`). It
is meant for the hidden layers' 2-D weights only: Keller Jordan's KellerJordan/Muon (``muon.py``, ``MuonWithAuxAdam``'s
docstring) and Moonshot's MoonshotAI/Moonlight (Liu et al. 2025, "Muon is Scalable for LLM
Training", arXiv 2502.16982; the repository's ``examples/toy_train.py``, ``get_optimizer``) both train the
embeddings, the output head and every 1-D parameter with AdamW. normlab follows Keller Jordan's rule, the 2-D weights
inside the blocks (``hidden_matrix_params``): Moonlight's (every 2-D parameter but ``embed_tokens`` and ``lm_head``)
picks the same matrices in the default model, and would also give Muon the hyper-connections' matrices, which
normlab keeps on AdamW (:func:`hidden_matrices`).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.optim._muon as torch_muon
from torch import nn
from torch.nn.utils import parametrize


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The weight matrices (out, in) of the linear layers that the model's blocks list in ``linear_roles()``
    (attention q/k/v/out, FFN in/out, of every encoder and decoder block): what Muon trains.

    Everything else goes to AdamW: the token embeddings and the output projection (tied to the target embedding),
    as Keller Jordan's and Moonlight's recipes do (module docstring), every 1-D parameter (gains, biases, scalar
    gates), and the special matrices, which play the part of gains or mixing weights rather than of a hidden layer:
    hyper-connections' [a_m | A], W_a and mHC's phi, and WeightNorm's per-row g (out, 1). Under WeightNorm
    (``model.weight_norm``) the matrix is its direction v (``parametrizations.weight.original1``, (out, in)): Muon
    orthogonalizes v's update, g stays AdamW's.
    """
    found = []
    for module in model.modules():
        for linear in getattr(module, "linear_roles", dict)().values():
            if parametrize.is_parametrized(linear, "weight"):
                found.append(linear.parametrizations.weight.original1)
            else:
                found.append(linear.weight)
    return found


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` and ``torch.optim.AdamW`` stepped as one optimizer, so that the schedule, the
    checkpoint, gradient clipping and DDP see one.

    ``param_groups`` are the children's own group dicts (AdamW's first, so ``param_groups[0]`` holds ``optim.lr``),
    so an lr scheduler that sets them sets the children's; a Muon group carries ``lr_scale``, which
    ``training.optim.build_scheduler`` multiplies its peak lr by. The state lives in the children (``self.adamw``,
    ``self.muon``): :meth:`state_dict` is ``{"adamw": ..., "muon": ...}``.

    Args:
        muon: the Muon over the hidden matrices; each group has an ``lr_scale`` entry.
        adamw: the AdamW over every other parameter.
        ns_dtype: ``optim.muon.ns_dtype``: the Newton-Schulz iteration's dtype (``bfloat16``, ``float32``, ``auto``:
            float32 when the matrices are on a CPU), :func:`newton_schulz_in`.
    """

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW, ns_dtype: str = "auto") -> None:
        self.muon, self.adamw = muon, adamw
        on_cpu = all(p.device.type == "cpu" for g in muon.param_groups for p in g["params"])
        self.ns_dtype = {"auto": torch.float32 if on_cpu else torch.bfloat16, "bfloat16": torch.bfloat16}.get(
            ns_dtype, torch.float32
        )
        self.lr_scales = [g["lr_scale"] for g in muon.param_groups]
        super().__init__([*adamw.param_groups, *muon.param_groups], {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """One Muon step on the hidden matrices and one AdamW step on the rest; ``closure`` as torch's."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with newton_schulz_in(self.ns_dtype):
            self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """``{"adamw": AdamW's state_dict, "muon": Muon's}``: both the momenta and the groups' settings."""
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load both children's states; the Muon groups keep this run's ``lr_scale`` (the lr is the schedule's,
        never the checkpoint's: ``training.optim.build_scheduler``).

        Raises:
            ValueError: ``state_dict`` is not a :meth:`state_dict` of this class (an ``optim=adamw`` run's).
        """
        if not isinstance(state_dict, dict) or set(state_dict) != {"adamw", "muon"}:
            raise ValueError(
                f"optim=muon cannot load an optimizer state with the entries {sorted(state_dict)} (an AdamW's); "
                "resume with the optim it was trained with, or start afresh with train.resume=null"
            )
        self.adamw.load_state_dict(state_dict["adamw"])
        self.muon.load_state_dict(state_dict["muon"])
        for group, scale in zip(self.muon.param_groups, self.lr_scales, strict=True):
            group["lr_scale"] = scale
        self.param_groups = [*self.adamw.param_groups, *self.muon.param_groups]  # the children's new dicts


def newton_schulz_float32(
    grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> torch.Tensor:
    """torch's Newton-Schulz iteration (``torch.optim._muon._zeropower_via_newtonschulz``, after Keller Jordan's
    ``zeropower_via_newtonschulz5``) with the same steps in float32 instead of bfloat16: X <- G / ||G||_F on the wide
    side, then ``ns_steps`` times X <- a X + (b A + c A^2) X with A = X X^T.

    Args:
        grad: (A, B) the momentum update to orthogonalize.
        ns_coefficients: the quintic's (a, b, c); ns_steps: the iterations; eps: the floor of ||G||_F.

    Returns:
        (A, B) float32, approximately U S' V^T of G = U S V^T, S' near 1 (Keller's docstring).
    """
    a, b, c = ns_coefficients
    tall = grad.size(0) > grad.size(1)
    x = grad.float().T if tall else grad.float()
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


@contextmanager
def newton_schulz_in(dtype: torch.dtype) -> Iterator[None]:
    """While open, ``torch.optim.Muon`` orthogonalizes in ``dtype``: torch's own iteration for bfloat16, else
    :func:`newton_schulz_float32` in its place (torch 2.13's Muon has no dtype setting; its step calls the module's
    ``_zeropower_via_newtonschulz``, which this swaps and restores; tests/test_muon.py checks the swap takes).

    Raises:
        AttributeError: torch's Muon no longer has that function (a torch other than the pinned one).
    """
    if dtype == torch.bfloat16:
        yield
        return
    own = torch_muon._zeropower_via_newtonschulz
    torch_muon._zeropower_via_newtonschulz = newton_schulz_float32
    try:
        yield
    finally:
        torch_muon._zeropower_via_newtonschulz = own
