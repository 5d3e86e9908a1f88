"""Muon on the blocks' hidden matrices, AdamW on everything else, as one optimizer (``optim=muon``).

Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/; torch's ``torch.optim.Muon``) replaces a
matrix's momentum update by the nearest semi-orthogonal matrix, approximated by 5 Newton-Schulz iterations in
bfloat16. It is meant for the hidden layers' 2-D weights only: Keller Jordan's KellerJordan/Muon (``muon.py``,
``MuonWithAuxAdam``'s docstring) and Moonshot's MoonshotAI/Moonlight (Liu et al. 2025, "Muon is Scalable for LLM
Training", arXiv 2502.16982; the repository's ``examples/toy_train.py``, ``get_optimizer``) both train the
embeddings, the output head and every 1-D parameter with AdamW. normlab follows Keller Jordan's rule, the 2-D weights
inside the blocks (``hidden_matrix_params``): Moonlight's (every 2-D parameter but ``embed_tokens`` and ``lm_head``)
picks the same matrices in the default model, and would also give Muon the hyper-connections' matrices, which
normlab keeps on AdamW (:func:`hidden_matrices`).
"""

from typing import Any

import torch
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
    """

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw
        self.lr_scales = [g["lr_scale"] for g in muon.param_groups]
        super().__init__([*adamw.param_groups, *muon.param_groups], {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """One Muon step on the hidden matrices and one AdamW step on the rest; ``closure`` as torch's."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
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
