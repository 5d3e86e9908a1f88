"""Encoder and decoder layers: sublayers wrapped in ``Residual`` at the configured placement.

Shape legend: B batch, S src length, T tgt length, D d_model, F d_ff.
"""

import torch
from torch import nn

from model.attention import KVCache, MultiHeadAttention
from model.config import ModelConfig
from model.residual import Residual, deepnorm_constants


def residual_alpha(cfg: ModelConfig, stack: str) -> float:
    """The residual scale of ``stack`` (``enc`` or ``dec``): DeepNet's alpha, else 1."""
    if cfg.norm.placement != "deepnorm":
        return 1.0
    return deepnorm_constants(cfg.n_enc_layers, cfg.n_dec_layers)[stack][0]


class FeedForward(nn.Module):
    """Position-wise FFN ``linear2(dropout(relu(linear1(x))))`` (Vaswani et al. 2017, eq. 2), the
    dropout being ``cfg.act_dropout_p``.

    Shapes: (B, T, D) -> (B, T, F) -> (B, T, D).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.dropout = nn.Dropout(cfg.act_dropout_p)
        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each in a residual connection. (B, S, D) -> (B, S, D)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout_p)
        alpha = residual_alpha(cfg, "enc")
        self.self_attn = Residual(attn, cfg.norm, cfg.d_model, cfg.dropout, alpha)
        self.ffn = Residual(FeedForward(cfg), cfg.norm, cfg.d_model, cfg.dropout, alpha)

    def forward(self, x: torch.Tensor, src_pad_mask: torch.Tensor | None) -> torch.Tensor:
        """x: (B, S, D); src_pad_mask: (B, S) bool, True at padding."""
        x = self.self_attn(x, None, src_pad_mask)
        return self.ffn(x)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to memory, then FFN. (B, T, D) -> (B, T, D).

    Decoder self-attention uses only the causal mask: with right padding, a real target
    position never sees a padding position, and outputs at padding positions are ignored.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout_p, causal=True)
        cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout_p)
        alpha = residual_alpha(cfg, "dec")
        self.self_attn = Residual(self_attn, cfg.norm, cfg.d_model, cfg.dropout, alpha)
        self.cross_attn = Residual(cross_attn, cfg.norm, cfg.d_model, cfg.dropout, alpha)
        self.ffn = Residual(FeedForward(cfg), cfg.norm, cfg.d_model, cfg.dropout, alpha)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor | None,
        cache: tuple[KVCache, KVCache] | None = None,
    ) -> torch.Tensor:
        """x: (B, T, D); memory: (B, S, D); src_pad_mask: (B, S) bool, True at padding;
        cache: (self-attention, cross-attention) state for incremental decoding."""
        self_cache, cross_cache = cache or (None, None)
        x = self.self_attn(x, None, None, self_cache)
        x = self.cross_attn(x, memory, src_pad_mask, cross_cache)
        return self.ffn(x)
