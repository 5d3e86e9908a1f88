"""What the side-by-side tests against Hugging Face's modeling code share (tests/test_hf_reference.py,
tests/test_hf_attention_controls.py): every HF parameter moved off its init, the identity rotary embedding (normlab
adds positions to the embeddings), and HF's projections copied into a normlab attention."""

import torch
from torch import nn


def randomize(module: nn.Module) -> None:
    """Every parameter of ``module`` plus N(0, 0.3²) noise, seeded (norm gains too: Gemma's w starts at 0, OLMo's at 1)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)


def identity_rotary(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``position_embeddings`` (cos, sin), each (B, T, ``dim``) for ``x`` (B, T, ...): cos = 1 and sin = 0, so
    the rotation is the identity."""
    return torch.ones(*x.shape[:2], dim), torch.zeros(*x.shape[:2], dim)


def copy_projections(mine: nn.Module, theirs: nn.Module, query: bool = True) -> None:
    """HF's ``q_proj`` (unless not ``query``), ``k_proj``, ``v_proj`` and ``o_proj`` into normlab's attention's
    ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` (weights and biases)."""
    pairs = (("q_proj", "q_proj"),) if query else ()
    for m, t in (*pairs, ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("out_proj", "o_proj")):
        getattr(mine, m).load_state_dict(getattr(theirs, t).state_dict())
