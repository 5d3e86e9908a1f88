"""Multi-head attention on ``torch.nn.functional.scaled_dot_product_attention``.

Shape legend: B batch, T query length, S key length, D d_model, H n_heads, K = D // H.
Masks follow PyTorch's ``key_padding_mask`` convention: True marks a padding key to ignore.
SDPA picks a flash / memory-efficient kernel on GPU; the attention matrix is never kept. What it
computes inside, the masked pre-softmax logits, is written out in one place for statistics,
:meth:`MultiHeadAttention.logits`, from the :meth:`MultiHeadAttention.mask` that ``forward`` hands SDPA.
A query whose keys are all masked gets zeros from SDPA, never NaN.

Incremental decoding passes a :class:`KVCache`: self-attention appends the new keys/values to
it, so step t projects one token and attends over t keys (O(t) per step instead of
recomputing the whole prefix, O(t^2)); cross-attention fills it from the memory on the first
call and reuses it after.

Norm sites: optional per-head norms over K on the queries, keys and values (``q_norm``,
``k_norm``, ``v_norm``; ``nn.Identity`` when off), applied after the head split and before the
scores, as QK-norm (Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters",
arXiv 2302.05442, paragraph "QK Normalization": LayerNorm on q and k). With ``qk_scope="full"`` the
q and k norms act over D on the projections before the head split instead, as OLMo 2's
(Hugging Face transformers, ``models/olmo2/modeling_olmo2.py``, ``Olmo2Attention``:
``self.q_norm(self.q_proj(hidden_states))``, then ``view``); Gemma 3's and Qwen3's are per head. Keys
and values are normalized before they enter the cache, so the cross-attention's are normalized once per source.

With l2-normalized q and k (``l2``), q.k is the cosine similarity, at most 1, too flat for a
softmax; a learned scalar ``temperature`` g makes the logits ``g * cos(q, k)`` (Henry et al. 2020,
"Query-Key Normalization for Transformers", Findings of EMNLP: the learned g, ``ScaleUp`` in the
official code CyndxAI/QKNorm; x-transformers' ``qk_norm_scale`` keeps it fixed at 10).

Attention-logit controls (docs/attention.md): soft-capping of the logits, a learned sink per head and softpick
(``model.attn_weights``) replace SDPA by the same logits written out (:meth:`MultiHeadAttention.weights`); an output
gate (Qiu et al. 2025) multiplies the attention's output by sigmoid(x W_g + b_g) before the output projection, with
either path.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attn_weights import soft_cap, softmax, softmax_with_sink, softpick
from model.kinds import QK_SCOPES, check_attention_controls

# Initial temperature g of l2 QK-norm: x-transformers' default ``qk_norm_scale = 10``.
QK_L2_TEMPERATURE = 10.0
# The sinks' init std: gpt-oss's ``initializer_range`` (Hugging Face GptOssConfig, ``_init_weights``: normal_(0, std)).
SINK_INIT_STD = 0.02


@dataclass
class KVCache:
    """Keys and values one attention module has computed so far, each (B, H, L, K); None before
    the first call."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def select(self, rows: torch.Tensor) -> None:
        """Keep (and reorder to) batch rows ``rows`` (1-D long), e.g. the surviving beams."""
        if self.k is not None:
            self.k, self.v = self.k[rows], self.v[rows]


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention with H heads (Vaswani et al. 2017, sec. 3.2.2, eq. 1).

    Args:
        d_model: D.
        n_heads: H; D must be divisible by H (checked by ``ModelConfig``).
        dropout: dropout probability on the attention weights (training only).
        causal: mask future keys (decoder self-attention).
        q_norm, k_norm, v_norm: per-head norms over K = D // H on the queries, keys and values
            (weights shared by the heads); None: ``nn.Identity``.
        qk_scope: ``head``: q_norm and k_norm act over K after the head split; ``full``: over D on the
            q and k projections before it (then they are norms over D). v_norm is per head either way.
        temperature: initial value of a learned scalar g (parameter ``temperature``, shape (1,),
            shared by the heads) for l2-normalized q and k: the logits become ``g * q.k``, the
            cosine similarity times g, instead of ``q.k / sqrt(K)``; None: no such parameter.
        gate: the output gate of Qiu et al. 2025 ("Gated Attention for Large Language Models", arXiv 2505.06708,
            position G1; code qiuzh20/gated_attention): ``elementwise`` (``gate_proj``: D -> D, one gate per head
            channel) or ``headwise`` (D -> H, one per head); the head outputs (B, H, T, K) are multiplied by
            sigmoid(gate_proj(x)) before ``out_proj``, x the query-side input. None: no gate.
        sink: a learned logit per head (parameter ``sinks``, (H,), init N(0, ``SINK_INIT_STD``^2)) in the softmax's
            denominator (gpt-oss; :func:`model.attn_weights.softmax_with_sink`).
        softmax: ``softmax``, or ``softpick`` (:func:`model.attn_weights.softpick`).
        softcap: c > 0: the logits become c * tanh(logit / c) before the mask (Gemma 2); None: no cap.
        logit_scale: a constant factor on the logits q.k / sqrt(K), applied to q (muP's sqrt(K_0 / K):
            ``model.parametrization``); 1.0: none.

    Raises:
        ValueError: an unknown ``qk_scope`` (valid: ``model.kinds.QK_SCOPES``); a bad ``gate``, ``sink``, ``softmax`` or
            ``softcap``, or a sink with softpick (``model.kinds.check_attention_controls``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float,
        *,
        causal: bool = False,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        v_norm: nn.Module | None = None,
        temperature: float | None = None,
        qk_scope: str = "head",
        gate: str | None = None,
        sink: bool = False,
        softmax: str = "softmax",
        softcap: float | None = None,
        logit_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if qk_scope not in QK_SCOPES:
            raise ValueError(f"unknown norm.qk_scope {qk_scope!r}; valid: {', '.join(QK_SCOPES)}")
        check_attention_controls(gate, sink, softmax, attn_softcap=softcap)
        self.n_heads = n_heads
        self.qk_full = qk_scope == "full"
        self.logit_scale = logit_scale
        self.dropout = dropout
        self.causal = causal
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.q_norm = nn.Identity() if q_norm is None else q_norm
        self.k_norm = nn.Identity() if k_norm is None else k_norm
        self.v_norm = nn.Identity() if v_norm is None else v_norm
        # A plain None attribute when off: models without it keep exactly their state dict.
        self.temperature = None if temperature is None else nn.Parameter(torch.tensor([float(temperature)]))
        # Named identity taps on q and k as SDPA receives them: hooks read them here and pass them to
        # ``logits`` instead of projecting again.
        self.q_tap = nn.Identity()
        self.k_tap = nn.Identity()
        # Off, each is a plain None attribute, so a model without the controls keeps exactly its state dict.
        self.gate_proj = None if gate is None else nn.Linear(d_model, d_model if gate == "elementwise" else n_heads)
        self.sinks = nn.Parameter(torch.empty(n_heads).normal_(0.0, SINK_INIT_STD)) if sink else None
        self.softpick = softmax == "softpick"
        self.softcap = softcap
        # SDPA computes the plain softmax only: the other controls take the logits written out (``weights``).
        self.eager = sink or self.softpick or softcap is not None

    def linear_roles(self) -> dict[str, nn.Linear]:
        """The projections by role, for init rules (``model.placements``), the gate's (``attn.gate``) among them."""
        roles = {"attn.q": self.q_proj, "attn.k": self.k_proj, "attn.v": self.v_proj, "attn.out": self.out_proj}
        return roles if self.gate_proj is None else roles | {"attn.gate": self.gate_proj}

    def mask(self, q: torch.Tensor, k: torch.Tensor, key_pad_mask: torch.Tensor | None) -> tuple[torch.Tensor | None, bool]:
        """Which keys each query sees, as ``forward`` hands it to SDPA: ``(attn_mask, is_causal)``.

        Args:
            q: (B, H, T, K) queries; k: (B, H, S, K) keys, a cache's included. A causal attention's T
                queries are the last of its S positions, after the S - T = P a :class:`KVCache` holds.
            key_pad_mask: (B, S) bool, True at padding keys; None: none.

        Returns:
            ``attn_mask``: (B, 1, 1, S) or (T, S) bool, True = attend, or None (every key); ``is_causal``:
            SDPA's causal mask on top, aligned top-left.
        """
        T, S = q.shape[2], k.shape[2]
        attn_mask = None if key_pad_mask is None else ~key_pad_mask[:, None, None, :]  # (B, 1, 1, S)
        # One new query sees every cached key: no causal mask. Several new queries after a cached
        # prefix need the causal mask shifted by P (SDPA's is_causal aligns it top-left).
        is_causal = self.causal and T > 1
        past = S - T
        if is_causal and past:
            attn_mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(past)  # (T, P + T)
            is_causal = False
        return attn_mask, is_causal

    def logits(self, q: torch.Tensor, k: torch.Tensor, key_pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The pre-softmax logits that ``forward``'s SDPA call computes in its kernel, written out:
        q.k / sqrt(K) (SDPA's default scale; with l2 QK-norm, q already carries g * sqrt(K), so this is
        g * cos(q, k)), soft-capped with ``softcap`` (then in (-c, c)), and -inf, what the softmax sees, at every key
        :meth:`mask` hides.

        Args:
            q: (B, H, T, K) queries as SDPA receives them (``q_tap``'s output).
            k: (B, H, S, K) keys as SDPA receives them (``k_tap``'s output, a cache's keys included).
            key_pad_mask: (B, S) bool, True at padding keys, as ``forward`` got it; None: none.

        Returns:
            (B, H, T, S) float32.
        """
        T, S = q.shape[2], k.shape[2]
        attn_mask, is_causal = self.mask(q, k, key_pad_mask)
        logit = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])  # (B, H, T, S)
        if self.softcap is not None:  # before the mask: the cap would turn a hidden key's -inf into -c
            logit = soft_cap(logit, self.softcap)
        if is_causal:
            causal = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()  # (T, S), SDPA's is_causal
            attn_mask = causal if attn_mask is None else attn_mask & causal
        return logit if attn_mask is None else logit.masked_fill(~attn_mask, -math.inf)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        key_pad_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Attend from ``x`` to ``memory`` (or to ``x`` itself when memory is None).

        Args:
            x: queries (B, T, D).
            memory: keys and values (B, S, D); None for self-attention.
            key_pad_mask: (B, S) bool, True at padding keys; None attends to every key.
            cache: incremental decoding state, updated in place. Self-attention: ``x`` holds the
                T positions after the P cached ones and attends to all P + T. Cross-attention:
                the memory's keys/values are projected (and normalized) on the first call only.

        Returns:
            (B, T, D).
        """
        kv = x if memory is None else memory
        B, T, D = x.shape
        K = D // self.n_heads
        q = self._heads(self.q_proj(x), self.q_norm, self.qk_full)  # (B, H, T, K)
        if self.temperature is not None:
            # SDPA divides q.k by sqrt(K): g * sqrt(K) on q leaves g * q.k.
            q = q * (self.temperature.to(q.dtype) * math.sqrt(K))
        if self.logit_scale != 1.0:  # on q, so that SDPA, the written-out logits and QK-Clip all see it
            q = q * self.logit_scale
        q = self.q_tap(q)
        if cache is not None and memory is not None and cache.k is not None:
            k, v = cache.k, cache.v  # (B, H, S, K), projected (and normalized) from the memory at the first step
        else:
            k = self._heads(self.k_proj(kv), self.k_norm, self.qk_full)  # (B, H, S, K)
            v = self._heads(self.v_proj(kv), self.v_norm, False)  # (B, H, S, K)
            if cache is not None:
                if cache.k is not None:  # self-attention after P cached positions
                    k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)  # (B, H, P + T, K)
                cache.k, cache.v = k, v
        k = self.k_tap(k)
        dropout = self.dropout if self.training else 0.0
        if self.eager:
            y = F.dropout(self.weights(q, k, key_pad_mask), dropout).to(v.dtype) @ v  # (B, H, T, K)
        else:
            attn_mask, is_causal = self.mask(q, k, key_pad_mask)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal)
        if self.gate_proj is not None:  # G1: each head's output times a sigmoid gate of the query-side input
            y = y * torch.sigmoid(self.gate_proj(x).view(B, T, self.n_heads, -1).transpose(1, 2))  # (B, H, T, K or 1)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))

    def weights(self, q: torch.Tensor, k: torch.Tensor, key_pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The attention weights ``forward`` multiplies the values by (before dropout): the softmax of
        :meth:`logits`, with the learned sink (``sinks``) in its denominator, or softpick.

        Args:
            q: (B, H, T, K) and k: (B, H, S, K), as SDPA receives them; key_pad_mask: (B, S) bool or None.

        Returns:
            (B, H, T, S) float32; a row sums to 1 under the plain softmax, to at most 1 with a sink or softpick.
        """
        return self.normalize(self.logits(q, k, key_pad_mask))

    def normalize(self, logit: torch.Tensor) -> torch.Tensor:
        """The attention weights of :meth:`logits`' output ``logit`` (B, H, T, S), hidden keys at -inf: softpick
        (:func:`model.attn_weights.softpick`), or the softmax with the learned sink in its denominator
        (:func:`~model.attn_weights.softmax_with_sink`) or without one. Returns (B, H, T, S) float32."""
        if self.softpick:
            return softpick(logit)
        return softmax(logit) if self.sinks is None else softmax_with_sink(logit, self.sinks)

    def _heads(self, x: torch.Tensor, norm: nn.Module, before: bool) -> torch.Tensor:
        """A projection (B, L, D) split into heads (B, H, L, K), ``norm`` applied over D before the split
        (``before``: OLMo 2's QK-norm) or over K after it."""
        B, L, _ = x.shape
        if before:
            return norm(x).view(B, L, self.n_heads, -1).transpose(1, 2)
        return norm(x.view(B, L, self.n_heads, -1).transpose(1, 2))
