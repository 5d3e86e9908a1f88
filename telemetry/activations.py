"""Per-layer activation scale: statistics of each watched tensor's real (non-padding) elements.

Names (stable; docs/telemetry.md) are formatted and parsed only by ``runlog/metric_names.py``.
``{s}`` is ``enc`` or ``dec``, ``{i}`` the layer, ``{r}`` a residual sublayer (``self_attn``,
``cross_attn``, ``ffn``), ``{slot}`` a filled norm slot (``norm_in``, ``norm_branch``,
``norm_out``), ``{a}`` an attention (``self_attn``, ``cross_attn``), ``{h}`` a filled per-head
attention norm (``q_norm``, ``k_norm``, ``v_norm``; ``norm.qk``, ``norm.v``):

=============  ==========================================  ===============================
site group     metric                                      tensor
=============  ==========================================  ===============================
embed          ``act/{s}.embed/{stat}``                    embedding output (stack input)
in             ``act/{s}.{i}.in/{stat}``                   residual stream entering block i
branch         ``act/{s}.{i}.{r}/{stat}``                  branch output F(.) before dropout
norm           ``act/{s}.{i}.{r}.{slot}/{stat}``           each norm's output (gain applied)
norm           ``act/{s}.{i}.{a}.{h}/{stat}``              each per-head q/k/v norm's output
out            ``act/{s}.{i}.out/{stat}``                  residual stream leaving block i
out            ``act/{s}.{i}.{r}.norm_out.in/{stat}``      the sum entering a filled norm_out
final_norm     ``act/{s}.final_norm/{stat}``               the stack's final norm (pre, sandwich)
=============  ==========================================  ===============================

``out`` is the closing norm's output (gain applied) where the block's last residual fills
``norm_out`` (post, deepnorm, admin, ...), so its RMS sits near the gain by construction;
``{r}.norm_out.in`` is that norm's input, ``alpha * x + F(.) [+ skip]`` (``model/residual.py``),
the stream as Xiong et al. 2020 (arXiv 2002.04745, Lemma 2) measure it before post-LN's LayerNorm.
Before / after a norm and gain, site by site: docs/telemetry.md, "Metric names".

Stats pool all n = (non-padding positions) * D elements of x of shape (B, L, D), or the
n = (non-padding positions) * H * K elements of a per-head tensor (B, H, L, K) (queries: this
stack's positions; keys and values: the source's in cross-attention, this stack's otherwise):
``rms`` = sqrt(sum x^2 / n) (so high-norm tokens dominate it); ``mean`` = sum x / n; ``maxabs`` =
max |x|; ``crest`` = maxabs / rms (the crest factor: for i.i.d. Gaussian x about the expected
max of n |N(0, 1)|, 3.97 at n = 64 x 128 and 5.08 at 3000 x 512, growing with n; far above that
when a few "massive activations" stand out, Sun et al. 2024); ``kurtosis`` = mean_j s_j^4 /
(mean_j s_j^2)^2 of the per-channel RMS s_j over real positions (He et al. 2024, arXiv 2405.19279,
eq. 1); at ``out`` only, ``token_cos`` = the mean over sequences of the mean cosine between two
different real tokens (rank collapse: 1) and ``massive`` = maxabs / median |x| (Sun et al. 2024); at a
norm of a bounded kind only (``model.kinds``), ``saturation`` = the share of its input's real elements
beyond ``SATURATION`` of the bound. Exact definitions and Gaussian
baselines of every statistic: docs/telemetry.md.

Each site's raw sums (``sum``, ``sumsq``, ``maxabs``, ``n``, ...) stay on the device; ``derive_stats``
turns them into the stats once they are on the host. Hooks only read tensors, in float32 and under
``no_grad``, and exist only while :meth:`ActivationStats.hooks`' handles do.
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from model.attention import MultiHeadAttention
from model.norms import BoundedNorm
from model.transformer import EncoderDecoder
from runlog.metric_names import (
    ACT_STAT_SITES,
    ATTENTION_NORM_SITES,
    ATTENTIONS,
    NORM_SLOTS,
    PRE_NORM_SITE,
    RESIDUALS,
    act,
    derive_stats,
)
from telemetry.config import TelemetryConfig
from telemetry.core import stacks

SATURATION = 0.99  # act/.../saturation: the share of elements whose bounded norm output is beyond this fraction of its bound
# Per-channel sums over positions, by a tap's ``features``: (B, L) weights times x^2 of (B, L, D) or (B, H, L, K).
_CHANNEL_SUMS = {(-1,): "bl,bld->d", (1, 3): "bl,bhlk->hk"}

Site = tuple[str, int | None, str]  # (stack, layer or None, site) of ``act/{stack}[.{layer}].{site}/{stat}``


@dataclass(frozen=True)
class _Tap:
    """One watched tensor: ``act/{stack}[.{layer}].{site}/{stat}`` is read from ``module``'s output
    (its input when ``on_input``); its positions are real where ``positions``' tokens are (``enc``:
    the source, ``dec``: the target); ``features`` are the dims pooled within a position."""

    stack: str
    layer: int | None
    site: str
    module: nn.Module
    positions: str
    on_input: bool = False
    features: tuple[int, ...] = (-1,)  # (B, L, D); per-head attention tensors (B, H, L, K): (1, 3)


class ActivationStats:
    """The ``act/`` statistics of the forward passes run while :meth:`hooks`' handles exist."""

    def __init__(self, model: EncoderDecoder, cfg: TelemetryConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.sums: dict[Site, dict[str, torch.Tensor]] = {}  # site -> raw sums (0-dim, on the device), see _take

    def taps(self) -> Iterator[_Tap]:
        """A :class:`_Tap` for every configured site of the model, in forward order."""
        groups = self.cfg.sites
        for stack, embed, layers, final in stacks(self.model):
            if "embed" in groups:
                yield _Tap(stack, None, "embed", embed, stack)
            for i, layer in enumerate(layers):
                yield from self._block_taps(stack, i, layer)
            if "final_norm" in groups and not isinstance(final, nn.Identity):
                yield _Tap(stack, None, "final_norm", final, stack)

    def _block_taps(self, stack: str, i: int, layer: nn.Module) -> Iterator[_Tap]:
        """The taps of block ``i``: its input and output, each residual's branch and norms, the
        per-head norms inside each attention (group ``norm``), and the input of each filled
        ``norm_out`` (group ``out``: the stream before the closing norm)."""
        groups = self.cfg.sites
        if "in" in groups:
            yield _Tap(stack, i, "in", layer, stack, on_input=True)
        for r in (r for r in RESIDUALS if hasattr(layer, r)):
            residual = getattr(layer, r)
            if "branch" in groups:
                yield _Tap(stack, i, r, residual.branch, stack)
            if "out" in groups and not isinstance(residual.norm_out, nn.Identity):
                yield _Tap(stack, i, PRE_NORM_SITE[r], residual.norm_out, stack, on_input=True)
            if "norm" not in groups:
                continue
            for slot in (s for s in NORM_SLOTS if not isinstance(getattr(residual, s), nn.Identity)):
                yield _Tap(stack, i, f"{r}.{slot}", getattr(residual, slot), stack)
            if r in ATTENTIONS:
                yield from self._attention_norm_taps(stack, i, r, residual.branch)
        if "out" in groups:
            yield _Tap(stack, i, "out", layer, stack)

    @staticmethod
    def _attention_norm_taps(stack: str, i: int, r: str, attn: MultiHeadAttention) -> Iterator[_Tap]:
        """The filled ``q_norm``/``k_norm``/``v_norm`` of attention ``r``: queries are positions of
        this stack, keys and values of the source in cross-attention and of this stack otherwise. Their
        outputs are (B, H, L, K), except q_norm's and k_norm's under ``norm.qk_scope=full``, (B, L, D)."""
        keys = "enc" if r == "cross_attn" else stack
        for site in (s for s in ATTENTION_NORM_SITES if not isinstance(getattr(attn, s), nn.Identity)):
            positions = stack if site == "q_norm" else keys
            # norm.qk_scope=full: the q and k norms see (B, L, D) before the head split; the same elements
            full = attn.qk_full and site != "v_norm"
            yield _Tap(stack, i, f"{r}.{site}", getattr(attn, site), positions, features=(-1,) if full else (1, 3))

    def hooks(self, src_pad_mask: torch.Tensor, tgt_pad_mask: torch.Tensor) -> list[RemovableHandle]:
        """Register a hook on every tap; the caller removes them.

        Args:
            src_pad_mask: (B, S) bool, True at src padding; excluded from encoder statistics and
                from the keys/values of the decoder's cross-attention.
            tgt_pad_mask: (B, T) bool, True at tgt padding; excluded from decoder statistics.
        """
        keep = {"enc": (~src_pad_mask).float(), "dec": (~tgt_pad_mask).float()}  # (B, L), 1 at real tokens
        count = {s: k.sum() for s, k in keep.items()}
        handles = []
        for tap in self.taps():

            def hook(mod: nn.Module, args: tuple, out: torch.Tensor | None = None, tap: _Tap = tap) -> None:
                x = args[0] if out is None else out
                key, k = (tap.stack, tap.layer, tap.site), keep[tap.positions]
                # In float32 inside the training pass's autocast too, where einsum would sum in bf16.
                with torch.autocast(x.device.type, enabled=False):
                    self._take(key, x.detach(), k, count[tap.positions], tap.features)
                    if "token_cos" in self.cfg.stats and tap.site in ACT_STAT_SITES["token_cos"]:
                        self.sums[key] |= _token_cos_sums(x.detach(), k)
                    if "massive" in self.cfg.stats and tap.site in ACT_STAT_SITES["massive"]:
                        self.sums[key]["median_abs"] = _median_abs(x.detach(), k)
                    saturation = "saturation" in self.cfg.stats and tap.site in ACT_STAT_SITES["saturation"]
                    if saturation and isinstance(mod, BoundedNorm):
                        self.sums[key]["saturated"] = _saturated(mod, args[0].detach(), k, tap.features)

            register = tap.module.register_forward_pre_hook if tap.on_input else tap.module.register_forward_hook
            handles.append(register(hook))
        return handles

    @torch.no_grad()
    def _take(self, key: Site, x: torch.Tensor, keep: torch.Tensor, count: torch.Tensor, features: tuple[int, ...]) -> None:
        """Store the raw sums of x's real positions under ``key``; :meth:`derive` turns them into stats.

        Args:
            x: (B, L, D) with features (-1,), or (B, H, L, K) with features (1, 3).
            keep: (B, L) float, 1 at real positions; count: its sum.
        """
        # Row-wise passes over x, then masking on the small (B, L) results (masking x itself would
        # cost a full extra copy).
        xf = x.float()
        raw = {
            "sum": (xf.sum(features) * keep).sum(),
            "maxabs": (xf.abs().amax(features) * keep).amax(),
            "n": count * math.prod(x.shape[d] for d in features),
        }
        if "kurtosis" in self.cfg.stats:  # per-channel sums of x^2 over real positions (count * s_j^2); sumsq from them
            channels = torch.einsum(_CHANNEL_SUMS[features], keep, xf.square()).flatten()
            s2 = channels / count
            raw |= {"sumsq": channels.sum(), "chan_m2": s2.mean(), "chan_m4": s2.square().mean()}
        else:
            raw["sumsq"] = (torch.linalg.vector_norm(xf, dim=features).square() * keep).sum()
        self.sums[key] = raw

    def raw(self) -> list[tuple[tuple[Site, str], torch.Tensor]]:
        """Every raw sum taken, ((site, raw name), 0-dim tensor), sites in forward order."""
        return [((site, name), t) for site, sums in self.sums.items() for name, t in sums.items()]

    def derive(self, host: dict[tuple[Site, str], float]) -> dict[str, float]:
        """The configured ``act/`` stats from :meth:`raw`'s values on the host, sites in forward order
        (embeddings, block 0 in, ..., final norm); then forget the sums."""
        out: dict[str, float] = {}
        for site, sums in self.sums.items():
            derived = derive_stats({name: host[site, name] for name in sums})
            out.update({act(*site, stat).name: derived[stat] for stat in self.cfg.stats if stat in derived})
        self.sums.clear()
        return out


@torch.no_grad()
def _median_abs(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The median of |x| over the real positions' elements (the lower of the two middle values when their count is
    even, ``torch.median``'s), for ``massive`` = max |x| / median |x| (Sun et al. 2024, "Massive Activations in Large
    Language Models", arXiv 2402.17762, sec. 2: a massive activation is about 1000x the median magnitude).

    Args:
        x: (B, L, D); keep: (B, L) float, 1 at real positions.
    """
    return x.float().abs()[keep.bool()].median()


@torch.no_grad()
def _token_cos_sums(x: torch.Tensor, keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """Raw sums of ``token_cos`` (mean pairwise cosine between a sequence's tokens, rank collapse at 1;
    Dong et al. 2021, arXiv 2103.03404; Noci et al. 2022, arXiv 2206.03126) without the L x L matrix:
    with u_t = x_t / ||x_t|| over the real tokens of a sequence, sum_{i != j} u_i . u_j =
    ||sum_t u_t||^2 - sum_t ||u_t||^2 (a zero token has u = 0: cosine 0 with every other).

    Args:
        x: (B, L, D); keep: (B, L) float, 1 at real positions.

    Returns:
        ``cos_sum``: the sum over sequences with n >= 2 real tokens of the mean over their n (n - 1)
        ordered pairs i != j; ``cos_seqs``: the number of such sequences.
    """
    xf = x.float()
    norms = torch.linalg.vector_norm(xf, dim=-1)  # (B, L)
    w = keep / norms.clamp_min(1e-12)  # F.normalize's eps; weighting x avoids a normalized copy of it
    total = torch.einsum("bl,bld->bd", w, xf)  # (B, D): each sequence's sum of unit vectors u_t
    self_dots = (norms * w).square().sum(1)  # (B,): sum of ||u_t||^2 over real tokens
    n = keep.sum(1)
    pairs = n * (n - 1)
    mean_cos = (total.square().sum(-1) - self_dots) / pairs.clamp_min(1)
    return {"cos_sum": (mean_cos * (pairs > 0)).sum(), "cos_seqs": (pairs > 0).sum().float()}


@torch.no_grad()
def _saturated(norm: BoundedNorm, x: torch.Tensor, keep: torch.Tensor, features: tuple[int, ...]) -> torch.Tensor:
    """The count of real elements of the bounded norm's input ``x`` at which its bounded function, before weight
    and bias, is beyond ``SATURATION`` of its bound 1: |tanh(alpha x)| (DyT, Zhu et al. 2025, arXiv
    2503.10622, eq. 1), |erf(alpha x + shift)| (Derf, Chen et al. 2025, arXiv 2512.10938) or |x| / sqrt(beta + x^2)
    (DyISRU, Stollenwerk 2025, arXiv 2503.21708), in float32; each bounded kind's class gives the equivalent
    threshold (``saturation_input``; ``model.kinds.NormKind.bounded``).
    ``x``: (B, L, D) or (B, H, L, K) with ``features`` (1, 3); ``keep``: (B, L) float, 1 at real positions."""
    u, beyond = norm.saturation_input(x, SATURATION)
    # gt_ writes 0/1 into abs()'s own new tensor: a third of the time of a bool mask and its sum.
    return (u.abs().gt_(beyond).sum(features) * keep).sum()
