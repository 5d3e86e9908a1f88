"""Multi-head attention on ``torch.nn.functional.scaled_dot_product_attention``.

Shape legend: B batch, T query length, S key length, D d_model, H n_heads, K = D // H.
Masks follow PyTorch's ``key_padding_mask`` convention: True marks a padding key to ignore.
SDPA picks a flash / memory-efficient kernel on GPU; the attention matrix is never kept.
A query whose keys are all masked gets zeros from SDPA, never NaN.
"""

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention with H heads (Vaswani et al. 2017, sec. 3.2.2, eq. 1).

    Args:
        d_model: D.
        n_heads: H; D must be divisible by H (checked by ``ModelConfig``).
        dropout: dropout probability on the attention weights (training only).
        causal: mask future keys (decoder self-attention).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, *, causal: bool = False) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.causal = causal
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # Named identity taps: telemetry hooks read q and k here instead of recomputing them.
        self.q_tap = nn.Identity()
        self.k_tap = nn.Identity()

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor | None = None, key_pad_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attend from ``x`` to ``memory`` (or to ``x`` itself when memory is None).

        Args:
            x: queries (B, T, D).
            memory: keys and values (B, S, D); None for self-attention.
            key_pad_mask: (B, S) bool, True at padding keys; None attends to every key.

        Returns:
            (B, T, D).
        """
        kv = x if memory is None else memory
        B, T, D = x.shape
        S = kv.shape[1]
        H, K = self.n_heads, D // self.n_heads
        q = self.q_tap(self.q_proj(x).view(B, T, H, K).transpose(1, 2))  # (B, H, T, K)
        k = self.k_tap(self.k_proj(kv).view(B, S, H, K).transpose(1, 2))  # (B, H, S, K)
        v = self.v_proj(kv).view(B, S, H, K).transpose(1, 2)  # (B, H, S, K)
        attn_mask = None if key_pad_mask is None else ~key_pad_mask[:, None, None, :]  # (B, 1, 1, S), True = attend
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )  # (B, H, T, K)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))
