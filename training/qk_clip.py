"""QK-Clip (Kimi Team 2025, "Kimi K2: Open Agentic Intelligence", arXiv 2507.20534, sec. 2.1, eq. for MuonClip):
after each optimizer update, every attention head whose largest pre-softmax logit of the step exceeded tau has its
query and key projections scaled down by the factor that brings that logit to tau. The logit is read in the step's
forward pass, before the update, and the factor scales the updated weights (K2's Algorithm 1), so the same inputs give
tau exactly only where the update left the head's logits unchanged: the clip pulls a head back after the fact.

Per head h with S_h = (1 / sqrt(K)) max over the step's batch of q_i^h . k_j^h and gamma_h = tau / S_h when
S_h > tau, else 1: W_q^h <- gamma_h^alpha W_q^h and W_k^h <- gamma_h^(1 - alpha) W_k^h. Here W_q^h is the K rows of
``q_proj.weight`` that make head h (``MultiHeadAttention._heads`` splits the D outputs into H heads of K), and
the rows' biases are scaled with them, so that q^h and k^h, and hence every logit of the head, scale by exactly
gamma_h^alpha and gamma_h^(1 - alpha). The optimizer's state is left as it is (K2 rescales the weights only).

S_h is read during the step's own forward passes (every micro-batch; under DDP the maximum over the ranks, one
all-reduce, so every rank scales alike and the weights stay identical): :func:`telemetry.attention.logit_hooks`
writes out the logits SDPA computes (``MultiHeadAttention.logits``: q.k / sqrt(K), the scale included), and
:func:`telemetry.attention.head_max_logits` takes each head's maximum over the real queries and the keys they
see (key padding and the causal mask excluded), as ``attn/.../max_logit`` is taken. It costs one more q k^T per
attention and forward; nothing is read back to the host.

Differences from Megatron-Core (``megatron/core/optimizer/qk_clip.py`` ``clip_qk`` and ``Attention.clip_qk``):
every attention is clipped, encoder and decoder self-attention and cross-attention (Megatron: self-attention
only, its decoder layers'; cross-attention's q comes from the decoder, its k from the encoder's memory); the q and k biases are
scaled with their rows (Megatron's ``_clip_linear_qkv`` scales the weight only, so with biases its logit does not land on tau);
gamma_h is 1 unless S_h > tau (Megatron's clamp(tau / S_h, max=1) is negative for a head whose max logit is
negative, which pow turns into NaN, when another head of the layer exceeds tau); one all-reduce for all heads and
no host read (Megatron: one all-reduce and one ``.item()`` per layer); heads only (no GQA grouping, no MLA split of
K2's shared rotary key, neither of which this model has); S_h over real queries only (Megatron: what the fused
kernel sees). With QK-norm (``norm.qk``) scaling W_q and W_k would be undone by the norm, so it is refused, as
K2's QK-Clip is meant for attention without it; so is ``trainer.compile`` (the hooks need eager layers).
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import nn

from model.attention import MultiHeadAttention
from model.transformer import EncoderDecoder
from runlog.metric_names import ATTENTIONS, qk_clip_stat
from telemetry.attention import head_max_logits, logit_hooks
from telemetry.core import DeviceStats, blocks
from telemetry.recorder import ForwardInputs
from training import distributed
from training.qk_clip_config import QKClipConfig

QK_NORM_REFUSED = (
    "optim.qk_clip rescales W_q and W_k, which a QK-norm undoes ({where} normalizes q or k); QK-Clip (Kimi K2) is for "
    "attention without QK-norm: set optim.qk_clip=null or norm.qk=null"
)
COMPILE_REFUSED = "optim.qk_clip reads every forward's attention logits through hooks: set trainer.compile=false"


def attentions(model: EncoderDecoder) -> Iterator[tuple[str, MultiHeadAttention]]:
    """(``{stack}.{i}.{attention}``, the attention) of every block, in depth order."""
    for stack, i, layer in blocks(model):
        for r in (r for r in ATTENTIONS if hasattr(layer, r)):
            yield f"{stack}.{i}.{r}", getattr(layer, r).branch


class QKClip:
    """Reads each head's max logit over a step's forward passes (:meth:`watch`) and clips after the update (:meth:`clip`).

    Raises:
        ValueError: an attention with a q or k norm (``QK_NORM_REFUSED``).
    """

    def __init__(self, model: EncoderDecoder, cfg: QKClipConfig) -> None:
        self.cfg = cfg
        self.attentions = list(attentions(model))
        for where, attn in self.attentions:
            if not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)):
                raise ValueError(QK_NORM_REFUSED.format(where=where))
        self.max_logits: list[torch.Tensor | None] = [None] * len(self.attentions)  # (H,) each, this step's so far

    @contextmanager
    def watch(self, src_pad_mask: torch.Tensor, tgt_pad_mask: torch.Tensor) -> Iterator[None]:
        """Fold the per-head max logits of the forward passes inside into this step's.

        Args:
            src_pad_mask: (B, S) bool, True at src padding (the encoder's padding queries and the memory's keys).
            tgt_pad_mask: (B, T) bool, True at tgt padding (the decoder's padding queries).
        """
        handles = []
        for a, (where, attn) in enumerate(self.attentions):
            queries = ~(src_pad_mask if where.startswith("enc.") else tgt_pad_mask)

            def fold(logit: torch.Tensor, a: int = a, queries: torch.Tensor = queries) -> None:
                m = head_max_logits(logit.amax(-1), queries)  # (H,)
                seen = self.max_logits[a]
                self.max_logits[a] = m if seen is None else torch.maximum(seen, m)

            handles += logit_hooks(attn, fold)
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def clip(self, world: int = 1, stats: DeviceStats | None = None) -> torch.Tensor:
        """Scale the q and k rows of every head whose max logit of the step exceeded tau (module docstring), then
        forget the step's max logits.

        Args:
            world: ranks under DDP; > 1 takes each head's maximum over the ranks first (one all-reduce).
            stats: a telemetry record to write ``optim/qk_clip_count`` (heads clipped at this step) and
                ``optim/qk_clip_min_factor`` (the smallest gamma, 1 when none) into; None: no record.

        Returns:
            (A, H) the factors gamma, one row per attention in depth order (1 where not clipped).

        Raises:
            RuntimeError: no forward pass ran inside :meth:`watch` since the last clip.
        """
        if any(m is None for m in self.max_logits):
            raise RuntimeError("QKClip.clip: no forward pass was watched since the last clip")
        s = torch.stack([m for m in self.max_logits if m is not None])  # (A, H)
        self.max_logits = [None] * len(self.attentions)
        if world > 1:
            distributed.all_reduce(s, op="max")
        tau = self.cfg.tau
        gamma = torch.where(s > tau, tau / s, torch.ones_like(s))  # (A, H); S > tau > 0, so 0 < gamma < 1
        for (_, attn), g in zip(self.attentions, gamma, strict=True):
            _scale_heads(attn.q_proj, g.pow(self.cfg.alpha))
            _scale_heads(attn.k_proj, g.pow(1 - self.cfg.alpha))
        if stats is not None:
            stats[qk_clip_stat("count").name] = (gamma < 1).sum().float()
            stats[qk_clip_stat("min_factor").name] = gamma.amin()
        return gamma


def _scale_heads(proj: nn.Linear, factor: torch.Tensor) -> None:
    """Multiply head h's K output rows of ``proj`` (weight (D, D), bias (D,)) by ``factor[h]`` ((H,)), in place."""
    H = factor.shape[0]
    proj.weight.view(H, -1, proj.weight.shape[1]).mul_(factor.to(proj.weight.dtype)[:, None, None])
    if proj.bias is not None:
        proj.bias.view(H, -1).mul_(factor.to(proj.bias.dtype)[:, None])


def build_qk_clip(model: EncoderDecoder, cfg: QKClipConfig | None, compile: bool) -> QKClip | None:
    """The run's :class:`QKClip` (``optim.qk_clip``), or None when it is off.

    Raises:
        ValueError: QK-Clip with ``trainer.compile`` (``COMPILE_REFUSED``) or with a QK-norm (``QK_NORM_REFUSED``).
    """
    if cfg is None:
        return None
    if compile:
        raise ValueError(COMPILE_REFUSED)
    return QKClip(model, cfg)


def watched(qk_clip: QKClip | None, batch: ForwardInputs) -> AbstractContextManager[None]:
    """:meth:`QKClip.watch` of the forward pass over ``batch`` (src (B, S), tgt_in (B, T)); a null context when off."""
    return nullcontext() if qk_clip is None else qk_clip.watch(batch.src_pad_mask, batch.tgt_pad_mask)


def clip_after_update(qk_clip: QKClip | None, world: int, stats: DeviceStats | None) -> None:
    """:meth:`QKClip.clip` after the optimizer's update; nothing when off."""
    if qk_clip is not None:
        qk_clip.clip(world, stats)
