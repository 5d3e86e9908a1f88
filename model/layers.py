"""Encoder and decoder layers: sublayers wrapped in ``Residual`` at each block's planned norm (``GPASResidual`` with
``norm.gpas``, ``HyperResidual`` with ``norm.hc``).

Layer ``index`` of a stack takes its norm from ``cfg.block_norm(stack, index)`` (kind, impl,
placement, eps, bias, attention norms); the placement record supplies the rest (residual scale,
input-norm factor, gate, B2T's skip over the block).

Shape legend: B batch, S src length, T tgt length, D d_model, F d_ff.
"""

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from model.attention import QK_L2_TEMPERATURE, KVCache, MultiHeadAttention
from model.config import ModelConfig, NormSpec
from model.gpas import GPAS, GPASResidual
from model.hyper_connections import hyper_connection
from model.hyper_residual import HyperResidual
from model.parametrization import logit_factor
from model.placements import PLACEMENTS, residual_sublayers
from model.residual import Residual, Sublayer


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

    def linear_roles(self) -> dict[str, nn.Linear]:
        """The matrices by role, for init rules (``model.placements``)."""
        return {"ffn.in": self.linear1, "ffn.out": self.linear2}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


def attention(cfg: ModelConfig, spec: NormSpec, *, causal: bool = False) -> MultiHeadAttention:
    """A ``MultiHeadAttention`` with the norm sites ``spec.qk`` (over d_head, or over d_model with
    ``spec.qk_scope == "full"``) and ``spec.v`` (over d_head) (None: off), a learned temperature
    (init ``QK_L2_TEMPERATURE``) where q and k are l2-normalized, and the model's attention-logit controls
    (``cfg.attn_gate``, ``attn_sink``, ``attn_softmax``, ``attn_softcap``), the same in every attention. Under
    ``model.parametrization=mup`` the logits q.k / sqrt(K) get 1 / sqrt(m) (q.k / K up to the base's sqrt(K_0)), except
    cosine logits (l2 QK-norm), whose size does not grow with K."""
    d_head = cfg.d_model // cfg.n_heads
    d_qk = cfg.d_model if spec.qk_scope == "full" else d_head

    def site(kind: str | None, dim: int) -> nn.Module | None:
        return None if kind is None else spec.build(dim, kind)

    norms = {"q_norm": site(spec.qk, d_qk), "k_norm": site(spec.qk, d_qk), "v_norm": site(spec.v, d_head)}
    controls = {"gate": cfg.attn_gate, "sink": cfg.attn_sink, "softmax": cfg.attn_softmax, "softcap": cfg.attn_softcap}
    l2 = spec.qk == "l2"
    scale = {"temperature": QK_L2_TEMPERATURE if l2 else None, "qk_scope": spec.qk_scope}
    scale["logit_scale"] = 1.0 if l2 else logit_factor(cfg.width_mult)
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout_p, causal=causal, **scale, **norms, **controls)


def sublayers(cfg: ModelConfig, spec: NormSpec, stack: str, index: int) -> Callable[[nn.Module], Sublayer]:
    """A function wrapping each branch of block ``index`` of ``stack`` in its residual, planned by ``spec``'s
    placement record for that sublayer (attention or FFN) and depth, its norms built from ``spec``, at site ``attn``
    or ``ffn`` by the branch (every slot of the sublayer: the site only picks the initial alpha of dyt and derf). A
    gate the record shares across the block (ReZero) is built once, and so is the block's GPAS gate (``spec.gpas``:
    one per layer, as the official code's ``GPASBlock``). The residual is a ``HyperResidual`` with ``norm.hc``, over
    ``cfg.residual_streams`` streams, its hyper-connection told its index in the stack; else a ``GPASResidual`` with
    ``spec.gpas``; else the plain ``Residual`` (``ModelConfig`` rejects ``norm.hc`` with GPAS). Under
    ``model.parametrization=completep`` every branch output gets 1 / m_L, the stack's depth multiplier."""
    placement = PLACEMENTS[spec.placement]
    shared: list[Sublayer] = []
    built: list[Sublayer] = []
    per_block = residual_sublayers(stack, 1, 1)
    gpas = GPAS() if spec.gpas else None

    def wrap(branch: nn.Module) -> Sublayer:
        is_attention = isinstance(branch, MultiHeadAttention)
        plan = placement.plan(is_attention, stack, index, cfg.n_enc_layers, cfg.n_dec_layers)
        if (m_depth := cfg.depth_mult(stack)) != 1.0:  # CompleteP's 1 / m_L on the branch (model.parametrization)
            plan = dataclasses.replace(plan, branch_scale=1.0 / m_depth)
        site = "attn" if is_attention else "ffn"
        args = (
            branch,
            plan,
            lambda: spec.build(cfg.d_model, site=site),
            cfg.dropout,
            cfg.d_model,
            shared[0].gate if shared else None,
        )
        residual: Sublayer
        if cfg.norm.hc is not None:
            sublayer = index * per_block + len(built)
            hc = hyper_connection(cfg.norm.hc, cfg.residual_streams, cfg.d_model, sublayer, spec.eps)
            residual = HyperResidual(*args, hc=hc)
        elif gpas is not None:
            residual = GPASResidual(*args, gpas=gpas)
        else:
            residual = Residual(*args)
        if placement.gate is not None and placement.gate.shared:
            shared.append(residual)
        built.append(residual)
        return residual

    return wrap


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each in a residual connection; the norm is layer ``index``'s
    (0-based) of the encoder plan. (B, S, D) -> (B, S, D)."""

    def __init__(self, cfg: ModelConfig, index: int = 0) -> None:
        super().__init__()
        spec = cfg.block_norm("enc", index)
        wrap = sublayers(cfg, spec, "enc", index)
        self.self_attn = wrap(attention(cfg, spec))
        self.ffn = wrap(FeedForward(cfg))
        self.block_skip = PLACEMENTS[spec.placement].block_skip

    def forward(
        self,
        x: torch.Tensor,
        src_pad_mask: torch.Tensor | None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, S, D); src_pad_mask: (B, S) bool, True at padding; keep: (B, S) bool, True at real
        tokens, for the norms that read the batch (``model.norms.BatchReadingNorm``; None where none does)."""
        h = self.self_attn(x, None, src_pad_mask, keep=keep)
        return self.ffn(h, skip=x if self.block_skip else None, keep=keep)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to memory, then FFN; the norm is layer ``index``'s
    (0-based) of the decoder plan. (B, T, D) -> (B, T, D).

    Decoder self-attention uses only the causal mask: with right padding, a real target
    position never sees a padding position, and outputs at padding positions are ignored.
    """

    def __init__(self, cfg: ModelConfig, index: int = 0) -> None:
        super().__init__()
        spec = cfg.block_norm("dec", index)
        wrap = sublayers(cfg, spec, "dec", index)
        self.self_attn = wrap(attention(cfg, spec, causal=True))
        self.cross_attn = wrap(attention(cfg, spec))
        self.ffn = wrap(FeedForward(cfg))
        self.block_skip = PLACEMENTS[spec.placement].block_skip

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor | None,
        cache: tuple[KVCache, KVCache] | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, T, D); memory: (B, S, D); src_pad_mask: (B, S) bool, True at padding;
        cache: (self-attention, cross-attention) state for incremental decoding; keep: (B, T) bool,
        True at real target tokens, for the norms that read the batch (None where none does), in all
        three sublayers: each normalizes the target stream."""
        self_cache, cross_cache = cache or (None, None)
        h = self.self_attn(x, None, None, self_cache, keep=keep)
        h = self.cross_attn(h, memory, src_pad_mask, cross_cache, keep=keep)
        # B2T: the skip spans both attentions
        return self.ffn(h, skip=x if self.block_skip else None, keep=keep)
