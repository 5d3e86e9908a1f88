"""Per-layer activation-scale, gradient and update telemetry, reduced on the device.

Names (stable; DESIGN.md sec. 5) are formatted and parsed only by ``runlog/metric_names.py``.
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
different real tokens (rank collapse: 1); at a DyT or DyISRU norm only, ``saturation`` = the share of
its input's real elements beyond ``SATURATION`` of the bound. Exact definitions and Gaussian
baselines of every statistic: docs/telemetry.md.

Also: ``grad/{s}.{i}/norm`` (L2 norm of block i's parameter gradients, before clipping),
``update/{s}.{i}/ratio`` (||w_after - w_before|| / ||w_before|| of one optimizer step),
``attn/{s}.{i}.{self_attn|cross_attn}/entropy`` (attention entropy in nats, mean over heads and
non-padding queries) and ``.../max_logit`` (the largest pre-softmax logit q.k / sqrt(K) over heads,
real queries and the keys they see), both from one recomputation of the scores from q and k, and
``out/logz``, ``out/max_logit`` (log-partition and largest value of the output logits, over real
target tokens: :meth:`Telemetry.record_logits`), and from AdamW's state after the step
(:meth:`Telemetry.record_adam`) ``update/{s}.{i}/adam_rms`` (StableAdamW's RMS of g / sqrt(v_hat)
over block i) and ``optim/below_eps`` (the share of coordinates with sqrt(v_hat) < eps).
Parameters, read as they are before the step's update (:meth:`Telemetry.record_parameters`):
``weight/{s}.{i}.{m}/{sigma_max|stable_rank}`` (each block matrix's spectral norm by power iteration,
warm-started from the last record's vector, across resumes too: :meth:`Telemetry.state_dict`; and
||W||_F^2 / sigma_max^2) and ``scale/{s}.{i}.{site}/{stat}`` (norm gains, DyT's alpha, DyISRU's beta,
ReZero / LayerScale gates, the l2 QK-norm temperature).

Cost: hooks exist only inside :meth:`Telemetry.watch`, so steps that do not record pay nothing;
statistics stay on the device until :meth:`Telemetry.collect` moves them in one transfer.

Telemetry never changes a training trajectory, eager or compiled: losses and weights are
bit-identical with it on or off. Hooks only read tensors (under ``no_grad``), and with compiled
layers they run in a separate eager, no-grad forward pass with the RNG state restored after it,
so that the training pass stays compiled (:meth:`Telemetry.watch_forward`; docs/telemetry.md,
"Telemetry and torch.compile").
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import MultiHeadAttention
from model.norms import DyISRU, DyT
from model.residual import Gate
from model.transformer import EncoderDecoder
from runlog.metric_names import (
    ACT_STAT_SITES,
    ATTENTION_NORM_SITES,
    ATTENTIONS,
    NORM_SLOTS,
    PRE_NORM_SITE,
    RESIDUALS,
    SITE_GROUPS,
    STACKS,
    STATS,
    act,
    adam_below_eps,
    adam_rms,
    attn_entropy,
    attn_max_logit,
    derive_stats,
    grad_norm,
    learned_scale,
    matrix_site,
    output_logits,
    update_ratio,
    weight_spectrum,
)
from telemetry.config import TelemetryConfig  # re-exported until this module moves to telemetry/

__all__ = ["STATS", "SITE_GROUPS", "Telemetry", "TelemetryConfig", "first_nonfinite"]

POWER_ITERS = 3  # power iterations per record step and matrix, from the vector the last record left
POWER_ITERS_FIRST = 200  # on a matrix's first record, from a random vector: within 1.5 % on the hardest D = 64
# matrices found, where torch's spectral_norm's 15 at init read up to 12 % low (docs/telemetry.md, "Tolerance")
POWER_SEED = 0  # seeds each matrix's first vector on a generator of its own, never the global one
SATURATION = 0.99  # act/.../saturation: the share of elements whose bounded norm output is beyond this fraction of its bound
# Per-channel sums over positions, by a tap's ``features``: (B, L) weights times x^2 of (B, L, D) or (B, H, L, K).
_CHANNEL_SUMS = {(-1,): "bl,bld->d", (1, 3): "bl,bhlk->hk"}


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


class Telemetry:
    """Collects the configured statistics of one training step; see the module docstring."""

    def __init__(self, model: EncoderDecoder, cfg: TelemetryConfig) -> None:
        self.model = model
        self.cfg = cfg
        self._acts: dict[tuple[str, int | None, str], dict[str, torch.Tensor]] = {}  # site -> raw sums, see _activation_stats
        self._stats: dict[str, torch.Tensor] = {}  # metric name -> 0-dim tensor
        self._power: dict[tuple[str, int, str], torch.Tensor] = {}  # weight site -> right singular vector estimate

    def due(self, step: int, max_steps: int) -> bool:
        """Whether step ``step`` (1-based) records: the first step (the profile at
        initialization), every ``cfg.every`` steps, and the last; never when every = 0."""
        return self.cfg.every > 0 and (step == 1 or step % self.cfg.every == 0 or step == max_steps)

    def stacks(self) -> Iterator[tuple[str, nn.Module, nn.ModuleList, nn.Module]]:
        """(``enc``/``dec``, embedding, layers, final norm) in the depth order of ``STACKS``."""
        m = self.model
        parts = {"enc": (m.src_embed, m.encoder, m.enc_final_norm), "dec": (m.tgt_embed, m.decoder, m.dec_final_norm)}
        for stack in STACKS:
            yield stack, *parts[stack]

    def blocks(self) -> Iterator[tuple[str, int, nn.Module]]:
        """(stack, index, layer) of every block in depth order."""
        for stack, _, layers, _ in self.stacks():
            yield from ((stack, i, layer) for i, layer in enumerate(layers))

    def _taps(self) -> Iterator[_Tap]:
        """A :class:`_Tap` for every configured site of the model."""
        groups = self.cfg.sites
        for stack, embed, layers, final in self.stacks():
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
        this stack, keys and values of the source in cross-attention and of this stack otherwise."""
        keys = "enc" if r == "cross_attn" else stack
        for site in (s for s in ATTENTION_NORM_SITES if not isinstance(getattr(attn, s), nn.Identity)):
            positions = stack if site == "q_norm" else keys
            yield _Tap(stack, i, f"{r}.{site}", getattr(attn, site), positions, features=(1, 3))

    @contextmanager
    def watch(self, src_pad_mask: torch.Tensor, tgt_pad_mask: torch.Tensor) -> Iterator[None]:
        """Record activation statistics (and attention entropy and max logit) of the forward passes inside.

        Args:
            src_pad_mask: (B, S) bool, True at src padding; excluded from encoder statistics and
                from the keys/values of the decoder's cross-attention.
            tgt_pad_mask: (B, T) bool, True at tgt padding; excluded from decoder statistics.
        """
        keep = {"enc": (~src_pad_mask).float(), "dec": (~tgt_pad_mask).float()}  # (B, L), 1 at real tokens
        count = {s: k.sum() for s, k in keep.items()}
        handles = []
        for tap in self._taps():

            def hook(mod: nn.Module, args: tuple, out: torch.Tensor | None = None, tap: _Tap = tap) -> None:
                x = args[0] if out is None else out
                key, k = (tap.stack, tap.layer, tap.site), keep[tap.positions]
                # In float32 inside the training pass's autocast too, where einsum would sum in bf16.
                with torch.autocast(x.device.type, enabled=False):
                    self._activation_stats(key, x.detach(), k, count[tap.positions], tap.features)
                    if "token_cos" in self.cfg.stats and tap.site in ACT_STAT_SITES["token_cos"]:
                        self._acts[key] |= _token_cos_sums(x.detach(), k)
                    saturation = "saturation" in self.cfg.stats and tap.site in ACT_STAT_SITES["saturation"]
                    if saturation and isinstance(mod, DyT | DyISRU):
                        self._acts[key]["saturated"] = _saturated(mod, args[0].detach(), k, tap.features)

            register = tap.module.register_forward_pre_hook if tap.on_input else tap.module.register_forward_hook
            handles.append(register(hook))
        if self.cfg.attn_entropy or self.cfg.attn_max_logit:
            for stack, i, layer in self.blocks():
                queries = ~(tgt_pad_mask if stack == "dec" else src_pad_mask)
                for r in (r for r in ATTENTIONS if hasattr(layer, r)):
                    handles += self._score_hooks(stack, i, r, getattr(layer, r).branch, queries)
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def compiled(self) -> bool:
        """Whether any module of the model runs compiled code (``nn.Module.compile``, as
        :meth:`EncoderDecoder.compile_layers` does)."""
        # nn.Module.compile stores the compiled call here; there is no public accessor.
        return any(getattr(m, "_compiled_call_impl", None) is not None for m in self.model.modules())

    @contextmanager
    def watch_forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, src_pad_mask: torch.Tensor, tgt_pad_mask: torch.Tensor
    ) -> Iterator[None]:
        """Record the activation statistics of the training forward pass ``model(src, tgt_in)`` run inside.

        Eager model: hooks on that very pass (:meth:`watch`). Compiled model: on entry, one extra
        eager forward pass over the same inputs, under ``no_grad`` and with the CPU and device RNG
        states restored after it (``torch.random.fork_rng``), carries the hooks; the training pass
        inside then runs exactly as on a step without telemetry. It draws the training pass's
        dropout masks when compiled random ops use ATen's generator (``compile_layers`` does so).

        Args:
            src: (B, S) source ids; tgt_in: (B, T) decoder input ids.
            src_pad_mask: (B, S) bool, True at src padding; tgt_pad_mask: (B, T) bool, True at tgt padding.
        """
        if not self.compiled():
            with self.watch(src_pad_mask, tgt_pad_mask):
                yield
            return
        device = src.device  # fork_rng restores the CPU generator, and those of the devices listed
        forked = torch.random.fork_rng([] if device.type == "cpu" else [device], device_type=device.type)
        with forked, torch.no_grad(), torch.compiler.set_stance("force_eager"):
            with self.watch(src_pad_mask, tgt_pad_mask):
                self.model(src, tgt_in)
        yield

    @torch.no_grad()
    def _activation_stats(
        self, key: tuple, x: torch.Tensor, keep: torch.Tensor, count: torch.Tensor, features: tuple[int, ...]
    ) -> None:
        """Store the raw sums of x's real positions under ``key``; collect() derives the stats from them.

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
        self._acts[key] = raw

    def _score_hooks(self, stack: str, i: int, r: str, attn: MultiHeadAttention, keep_queries: torch.Tensor) -> list:
        """Hooks on the attention's q/k taps (to see its projections without recomputing them)
        and on the attention itself (to see its mask): one computation of the pre-softmax scores
        gives the configured ``attn/{stack}.{i}.{r}/entropy`` and ``.../max_logit``.

        Args:
            keep_queries: (B, T) bool, True at the real (non-padding) queries.
        """
        seen: dict[str, torch.Tensor] = {}

        def tap(key: str):
            def hook(mod: nn.Module, args: tuple, out: torch.Tensor) -> None:
                seen[key] = out.detach()

            return hook

        @torch.no_grad()
        def on_attention(mod: MultiHeadAttention, args: tuple, out: torch.Tensor) -> None:
            q, k = seen.pop("q"), seen.pop("k")  # (B, H, T, K), (B, H, S, K)
            key_pad = args[2] if len(args) > 2 else None  # (B, S) or None
            T, S = q.shape[2], k.shape[2]
            # The logits SDPA computes: q.k / sqrt(K) (with l2 QK-norm q already carries g * sqrt(K)).
            logit = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])  # (B, H, T, S)
            # Masked scores get a large finite negative, not -inf: exp() gives exactly 0 and
            # 0 * score stays 0 instead of NaN in the entropy sum below.
            if key_pad is not None:
                logit = logit.masked_fill(key_pad[:, None, None, :], -1e9)
            if mod.causal:
                logit = logit.masked_fill(torch.ones(T, S, dtype=torch.bool, device=q.device).triu(1), -1e9)
            top = logit.amax(-1, keepdim=True)  # (B, H, T, 1): each query sees a real key, so a real score
            if self.cfg.attn_max_logit:
                per_query = top.squeeze(-1).amax(1)  # (B, T), max over heads
                self._stats[attn_max_logit(stack, i, r).name] = per_query.masked_fill(~keep_queries, -math.inf).amax()
            if self.cfg.attn_entropy:
                self._stats[attn_entropy(stack, i, r).name] = _mean_entropy(logit - top, keep_queries)

        return [
            attn.q_tap.register_forward_hook(tap("q")),
            attn.k_tap.register_forward_hook(tap("k")),
            attn.register_forward_hook(on_attention),
        ]

    @torch.no_grad()
    def record_logits(self, logits: torch.Tensor, tgt_pad_mask: torch.Tensor) -> None:
        """Store ``out/logz`` (mean over real target tokens of log sum_v exp z_v) and ``out/max_logit``
        (max over real tokens and the vocabulary of z) of the output logits z, read in float32 as
        the loss reads them; nothing when ``cfg.logits`` is off.

        Args:
            logits: (B, T, V) output logits of the training forward pass.
            tgt_pad_mask: (B, T) bool, True at target padding (left out).
        """
        if not self.cfg.logits:
            return
        z = logits.detach().float()
        keep = (~tgt_pad_mask).float()  # (B, T)
        self._stats[output_logits("logz").name] = (z.logsumexp(-1) * keep).sum() / keep.sum()
        self._stats[output_logits("max_logit").name] = z.amax(-1).masked_fill(tgt_pad_mask, -math.inf).amax()

    def record_grad_norms(self) -> None:
        """Store each block's gradient norm; call after ``backward`` and before clipping."""
        if not self.cfg.grads:
            return
        for stack, i, layer in self.blocks():
            norms = [torch.linalg.vector_norm(p.grad) for p in layer.parameters() if p.grad is not None]
            if norms:
                self._stats[grad_norm(stack, i).name] = torch.linalg.vector_norm(torch.stack(norms))

    @contextmanager
    def watch_update(self) -> Iterator[None]:
        """Around ``optimizer.step()``: record ||w_after - w_before|| / ||w_before|| per block."""
        if not self.cfg.updates:
            yield
            return
        before = {(stack, i): [p.detach().clone() for p in layer.parameters()] for stack, i, layer in self.blocks()}
        yield
        with torch.no_grad():
            for stack, i, layer in self.blocks():
                pairs = zip(layer.parameters(), before[stack, i], strict=True)
                delta = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p - b) for p, b in pairs]))
                weight = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(b) for b in before[stack, i]]))
                self._stats[update_ratio(stack, i).name] = delta / weight

    @torch.no_grad()
    def record_adam(self, opt: torch.optim.Optimizer) -> None:
        """Store ``update/{s}.{i}/adam_rms`` per block and ``optim/below_eps`` from ``opt``'s state; call
        right after ``opt.step()`` (train_step does on record steps); nothing when ``cfg.adam`` is off.

        With v_hat = ``exp_avg_sq`` / (1 - beta2^t), t = ``state['step']``, the bias-corrected second
        moment that this step's update divided by (it already holds the step's gradient g_t, as StableAdamW's
        debiased u_t does), and g_t = ``p.grad`` (after clipping, as the step read it):

        - ``adam_rms`` = sqrt(mean over the coordinates of block i's parameters that have a gradient of
          g_t^2 / max(v_hat, eps^2)): RMS_t of StableAdamW (Wortsman et al. 2023, "Stable and low-precision
          training for large-scale vision-language models", arXiv 2304.13013, Algorithm 2), pooled over the
          block instead of per tensor. max(v_hat, eps^2) keeps a coordinate whose v is 0 (so is its g) at 0.
        - ``below_eps`` = the share of the coordinates of every parameter ``opt`` holds with
          sqrt(v_hat) < eps (taken as v_hat < eps^2), those where eps dominates Adam's denominator
          sqrt(v_hat) + eps; a parameter without state yet (never had a gradient) counts as v = 0.

        eps and beta2 are each parameter's group's. Everything stays on the device (no ``.item()``:
        the fused optimizer keeps ``step`` there).

        Raises:
            ValueError: ``opt`` is not ``torch.optim.AdamW``, or uses amsgrad (its denominator is another v).
        """
        if not self.cfg.adam:
            return
        if not isinstance(opt, torch.optim.AdamW) or any(g["amsgrad"] for g in opt.param_groups):
            raise ValueError(f"telemetry.adam reads torch.optim.AdamW without amsgrad, got {type(opt).__name__}; "
                             "valid: AdamW(amsgrad=False), or telemetry.adam=false")  # fmt: skip
        ratio: dict[torch.Tensor, torch.Tensor] = {}  # parameter -> sum of g^2 / max(v_hat, eps^2) over it
        below: list[torch.Tensor] = []
        never_stepped = total = 0
        for group in opt.param_groups:
            beta2, floor = group["betas"][1], group["eps"] ** 2
            for p in group["params"]:
                total += p.numel()
                state = opt.state.get(p)
                if not state:
                    never_stepped += p.numel()
                    continue
                # step as a float64 0-dim tensor: no host sync when the fused optimizer keeps it on the device.
                v_hat = state["exp_avg_sq"].float() / (1 - beta2 ** state["step"].double())
                below.append(v_hat.lt(floor).sum())
                if p.grad is not None:
                    ratio[p] = (p.grad.float().square() / v_hat.clamp_min(floor)).sum()
        if below:  # some parameter has state
            self._stats[adam_below_eps().name] = (torch.stack(below).sum() + never_stepped) / total
        for stack, i, layer in self.blocks():
            seen = [p for p in layer.parameters() if p in ratio]
            if seen:
                mean = torch.stack([ratio[p] for p in seen]).sum() / sum(p.numel() for p in seen)
                self._stats[adam_rms(stack, i).name] = mean.sqrt()

    @torch.no_grad()
    def record_parameters(self) -> None:
        """Store every block matrix's spectrum (``weights``) and every learned scale (``scales``) as the
        parameters are now, on the device; train_step calls it on record steps before ``optimizer.step()``."""
        if self.cfg.weights:
            for stack, i, layer in self.blocks():
                for r in (r for r in RESIDUALS if hasattr(layer, r)):
                    for role, linear in getattr(layer, r).branch.linear_roles().items():
                        self._record_spectrum((stack, i, matrix_site(r, role)), linear.weight)
        if self.cfg.scales:
            for stack, i, layer in self.blocks():
                for r in (r for r in RESIDUALS if hasattr(layer, r)):
                    self._record_scales(stack, i, r, getattr(layer, r))

    def _record_spectrum(self, key: tuple[str, int, str], weight: torch.Tensor) -> None:
        """sigma_max and stable rank of ``weight`` (out, in) by power iteration (Miyato et al. 2018,
        arXiv 1802.05957, Alg. 1; ``torch.nn.utils.parametrizations.spectral_norm``): u = normalize(W v),
        v = normalize(W^T u), sigma = u^T W v = ||W^T u||. The vector v persists per matrix across
        record steps and resumes (``POWER_ITERS`` iterations each; ``POWER_ITERS_FIRST`` from a ``POWER_SEED``
        vector on the first; :meth:`state_dict`), so the estimate, a lower bound, converges over records
        as the weights drift.
        Stable rank = ||W||_F^2 / sigma^2 (Rudelson & Vershynin 2007), 0 for W = 0."""
        w = weight.detach().float()
        v = self._power.get(key)
        iters = POWER_ITERS
        if v is None:
            # Drawn on the CPU from a generator of its own: the same start on every device, the global RNG untouched.
            v = F.normalize(torch.randn(w.shape[1], generator=torch.Generator().manual_seed(POWER_SEED)), dim=0)
            v, iters = v.to(w.device), POWER_ITERS_FIRST
        start = v
        for _ in range(iters):
            wtu = w.mT @ F.normalize(w @ v, dim=0)  # (in,)
            v = F.normalize(wtu, dim=0)
        sigma = torch.linalg.vector_norm(wtu)
        # A zero matrix sends v to 0 for good: keep the start, so a later record of a nonzero W still converges.
        self._power[key] = torch.where(sigma > 0, v, start)
        stack, i, site = key
        self._stats[weight_spectrum(stack, i, site, "sigma_max").name] = sigma
        stable_rank = w.square().sum() / sigma.square().clamp_min(torch.finfo(torch.float32).tiny)
        self._stats[weight_spectrum(stack, i, site, "stable_rank").name] = stable_rank

    def state_dict(self) -> dict[str, dict[tuple[str, int, str], torch.Tensor]]:
        """What a checkpoint carries so that a resumed run's ``weight/.../sigma_max`` series goes on as if
        never stopped: ``power``, each matrix's power-iteration vector v ((in,) float32, on the CPU), keyed
        by (stack, layer, site). No generator state is needed: a matrix's first vector comes from a
        generator seeded anew with ``POWER_SEED``."""
        return {"power": {key: v.cpu() for key, v in self._power.items()}}

    def load_state_dict(self, state: dict[str, dict[tuple[str, int, str], torch.Tensor]]) -> None:
        """Continue from :meth:`state_dict`'s vectors, moved to the model's device."""
        device = next(self.model.parameters()).device
        self._power = {tuple(key): v.to(device) for key, v in state["power"].items()}

    def _record_scales(self, stack: str, i: int, r: str, residual: nn.Module) -> None:
        """The learned scales of residual ``r`` of block ``i``: its norm slots, its gate, and, in an
        attention, its per-head norms and l2 QK-norm temperature."""
        modules = {f"{r}.{slot}": getattr(residual, slot) for slot in NORM_SLOTS} | {f"{r}.gate": residual.gate}
        if r in ATTENTIONS:
            attn = residual.branch
            modules |= {f"{r}.{h}": getattr(attn, h) for h in ATTENTION_NORM_SITES}
            if attn.temperature is not None:
                self._stats[learned_scale(stack, i, r, "temperature").name] = _scalar(attn.temperature)
        for site, module in modules.items():
            for stat, value in _scale_stats(module).items():
                self._stats[learned_scale(stack, i, site, stat).name] = value

    def collect(self) -> dict[str, float]:
        """All recorded statistics as Python floats (one device-to-host transfer), then reset.

        Activation metrics come first, in forward order (embeddings, block 0 in, ..., final
        norm), so the first non-finite one is where a diverging run first went wrong (see
        :func:`first_nonfinite`).
        """
        if not self._acts and not self._stats:
            return {}
        named = [*(((site, raw), t) for site, sums in self._acts.items() for raw, t in sums.items()), *self._stats.items()]
        values = torch.stack([t.float() for _, t in named]).tolist()  # the one transfer
        host = dict(zip((name for name, _ in named), values, strict=True))
        out: dict[str, float] = {}
        for site, sums in self._acts.items():
            derived = derive_stats({raw: host[site, raw] for raw in sums})
            out.update({act(*site, stat).name: derived[stat] for stat in self.cfg.stats if stat in derived})
        out.update({name: host[name] for name in self._stats})
        self._acts.clear()
        self._stats.clear()
        return out


def _scalar(p: torch.Tensor) -> torch.Tensor:
    """A one-element parameter as a 0-dim float32 copy (a view would show the value after the step)."""
    return p.detach().float().reshape(()).clone()


def _scale_stats(module: nn.Module) -> dict[str, torch.Tensor]:
    """The learned scales of a norm or residual gate, as 0-dim float32 tensors: ``gain_mean`` = mean and
    ``gain_max`` = max |.| of its ``weight`` (LayerNorm's / RMSNorm's gain, ScaleNorm's g, DyT's and
    DyISRU's weight, LayerScale's lambda), except a scalar gate's, ReZero's alpha, given as ``alpha``;
    DyT's ``alpha`` and DyISRU's ``beta``. None of them for ``nn.Identity`` or ``L2Norm`` (no parameters)."""
    weight = getattr(module, "weight", None)
    if isinstance(module, Gate) and weight.numel() == 1:
        return {"alpha": _scalar(weight)}
    stats = {}
    if isinstance(weight, torch.Tensor):
        w = weight.detach().float()
        stats = {"gain_mean": w.mean(), "gain_max": w.abs().amax()}
    for stat in ("alpha", "beta"):  # DyT's alpha, DyISRU's beta (parameters, unlike a Residual's float alpha)
        p = getattr(module, stat, None)
        if isinstance(p, nn.Parameter):
            stats[stat] = _scalar(p)
    return stats


def _mean_entropy(z: torch.Tensor, keep_queries: torch.Tensor) -> torch.Tensor:
    """Mean over heads and real queries of the softmax entropy (nats) of each row of z.

    Args:
        z: (B, H, T, S) scores minus their row max (masked keys at about -1e9).
        keep_queries: (B, T) bool, True at the real queries.
    """
    # H(p) = log Z - sum_j p_j z_j with p = exp(z) / Z; cheaper than softmax + entr on rows as short as these.
    e = z.exp()
    Z = e.sum(-1)  # (B, H, T)
    ent = (Z.log() - (e * z).sum(-1) / Z).mean(1)  # (B, T), mean over heads
    w = keep_queries.float()
    return (ent * w).sum() / w.sum()


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
def _saturated(norm: DyT | DyISRU, x: torch.Tensor, keep: torch.Tensor, features: tuple[int, ...]) -> torch.Tensor:
    """The count of real elements of the norm's input ``x`` at which its bounded function, before weight
    and bias, is beyond ``SATURATION`` of its bound 1: |tanh(alpha x)| (DyT, Zhu et al. 2025, arXiv
    2503.10622, eq. 1) or |x| / sqrt(beta + x^2) (DyISRU, Stollenwerk 2025, arXiv 2503.21708), in float32.
    ``x``: (B, L, D) or (B, H, L, K) with ``features`` (1, 3); ``keep``: (B, L) float, 1 at real positions."""
    # Thresholds on |x|, equivalent to the bounds and cheaper than the functions: |tanh(alpha x)| > c iff
    # |x| > atanh(c) / |alpha|; |x| / sqrt(beta + x^2) > c iff |x| > c sqrt(beta / (1 - c^2)) (beta > 0).
    if isinstance(norm, DyT):
        beyond = math.atanh(SATURATION) / norm.alpha.detach().float().abs()
    else:
        beyond = SATURATION * torch.sqrt(norm.beta.detach().float() / (1 - SATURATION**2))
    # gt_ writes 0/1 into abs()'s own new tensor: a third of the time of a bool mask and its sum.
    return (x.float().abs().gt_(beyond).sum(features) * keep).sum()


def first_nonfinite(stats: dict[str, float]) -> str | None:
    """The first metric name (in recording order) whose value is NaN or inf, or None."""
    return next((k for k, v in stats.items() if not math.isfinite(v)), None)
