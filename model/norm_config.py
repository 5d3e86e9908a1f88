"""The norm's configuration: :class:`NormSpec` (one block's norm), :class:`BlockNorm` (a ``norm.blocks`` entry) and
:class:`NormConfig` (the ``norm.*`` keys and their per-block overrides). Validated at construction; imports without
Hydra or torch (``training.schema`` builds these before torch loads). ``model.config.ModelConfig`` holds one
:class:`NormConfig` and resolves a block's spec (``ModelConfig.block_norm``).
"""

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from model.kinds import ATTENTION_NORM_KINDS, HC_KINDS, KNOB_KINDS, NORM_GAINS, NORM_SITES, QK_SCOPES, check_norm, kind_knobs
from model.placements import PLACEMENTS, check_placement
from runlog.metric_names import STACKS

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class NormSpec:
    """The norm of one block: the three normalization axes, eps and bias (README, "Choosing the norm"), and
    the norms inside its attention.

    Attributes:
        kind: ``model.kinds.NORM_KINDS``.
        impl: ``custom`` or ``native`` (layernorm, rmsnorm and batchnorm only).
        placement: ``model.placements.PLACEMENTS``.
        eps: numerical-stability constant of the norm.
        bias: learn the shift of the kinds that have one (their record's ``shift``); ignored by the others.
        qk: per-head norm on the queries and keys of every attention in the block, over d_head
            (``model.kinds.ATTENTION_NORM_KINDS``; ``l2`` adds a learned temperature); None: off.
            Uses this spec's impl, eps, bias.
        v: the same on the values; None: off.
        gain: how every norm of the block (its attention sites' too) stores its per-channel gain ``weight``:
            ``plain``, or ``unit_offset``, stored as w and applied as 1 + w (Gemma 3; ``model.gains``); ignored by
            kinds without a gain.
        qk_scope: where ``qk`` normalizes: ``head``, each head's q and k over d_head after the head split (Gemma 3,
            Qwen3), or ``full``, the projected q and k over d_model = heads x d_head before it (OLMo 2); the values'
            norm stays per head. ``full`` with ``qk: l2`` is refused (its temperature needs per-head unit vectors).
        mix_ln_alpha: the share of each stack's blocks Mix-LN makes post-LN (placement ``mix_ln``:
            the first floor(alpha * L) blocks), in [0, 1]; unused by other placements.
        knobs: the kinds' own settings, ``{kind: its knobs}`` for each kind whose record has a knobs dataclass
            (``model.kinds.KNOB_KINDS``; powernorm's ``warmup_iters`` and ``group_num``): a mapping of a kind to a
            mapping of some of its knobs is completed with the dataclass defaults; held as the dataclasses.
        gpas: GPAS (Chen et al. 2025, ``model.gpas.GPAS``) in the block: one learned gate g (init 0) scales the
            stream by 1 - SiLU(g) after each residual addition (on the skip where a norm closes the sublayer),
            leaving its gradient unscaled; with any placement.

        alpha_init_attn, alpha_init_ffn, alpha_init_final: the kinds whose record has ``alpha`` (``model.kinds.ALPHA_KINDS``):
            the initial alpha of a norm in an attention sublayer (self- or cross-, any slot), in the FFN sublayer,
            and of a stack's final norm (the official LLaMA DyT / GPT-2 Derf code's ``attn_``, ``ffn_`` and
            ``dec_alpha_init_value``), each > 0; 0.5 each (the kinds' own default) builds what normlab built before.

    Raises:
        ValueError: unknown kind, impl, placement or attention norm kind, or an impossible
            combination (a kind without a native impl given ``native``, a bounded kind after the residual addition,
            HybridNorm without q/k/v norms, ``qk_scope: full`` with ``qk: l2``): the message lists the valid ones;
            an unknown gain or qk_scope; eps not a number
            > 0; mix_ln_alpha outside [0, 1]; a bad ``knobs`` key or value (``model.kinds.kind_knobs``);
            gpas not a bool; an alpha_init_* not a finite number > 0.
    """

    kind: str = "layernorm"
    impl: str = "custom"
    placement: str = "pre"
    eps: float = 1e-5
    bias: bool = True
    qk: str | None = None
    v: str | None = None
    gain: str = "plain"
    qk_scope: str = "head"
    mix_ln_alpha: float = 0.25
    knobs: dict[str, Any] = field(default_factory=dict, hash=False)
    gpas: bool = False
    alpha_init_attn: float = 0.5
    alpha_init_ffn: float = 0.5
    alpha_init_final: float = 0.5

    def __post_init__(self) -> None:
        check_norm(self.kind, self.impl)
        check_placement(self.placement, self.kind)
        if isinstance(self.eps, bool) or not isinstance(self.eps, int | float) or not self.eps > 0:
            raise ValueError(f"norm.eps must be > 0, got {self.eps!r}")
        for key in ("qk", "v"):
            value = getattr(self, key)
            if value is not None and value not in ATTENTION_NORM_KINDS:
                raise ValueError(f"unknown norm.{key} {value!r}; valid: null (off), {', '.join(ATTENTION_NORM_KINDS)}")
            if value is not None:  # the site uses this spec's impl: none and l2 have no native one
                check_norm(value, self.impl, key=f"norm.{key}", kinds=ATTENTION_NORM_KINDS)
        for key, valid in (("gain", NORM_GAINS), ("qk_scope", QK_SCOPES)):
            if getattr(self, key) not in valid:
                raise ValueError(f"unknown norm.{key} {getattr(self, key)!r}; valid: {', '.join(valid)}")
        if self.qk_scope == "full" and self.qk == "l2":
            raise ValueError(
                "norm.qk=l2 needs per-head unit vectors (its temperature multiplies cos(q, k)): set "
                "norm.qk_scope=head, or another norm.qk with norm.qk_scope=full"
            )
        if PLACEMENTS[self.placement].needs_qkv_norm and None in (self.qk, self.v):
            raise ValueError(
                f"norm.placement={self.placement!r} normalizes q, k and v inside attention: set norm.qk and norm.v "
                f"(got qk={self.qk!r}, v={self.v!r}); valid: {', '.join(ATTENTION_NORM_KINDS)}"
            )
        alpha = self.mix_ln_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
            raise ValueError(f"norm.mix_ln_alpha must be in [0, 1], got {alpha!r}")
        if not isinstance(self.knobs, dict):
            raise ValueError(f"norm.knobs={self.knobs!r} is invalid; expected a mapping with keys from: {', '.join(KNOB_KINDS)}")
        given = {kind: kind_knobs(kind, values) for kind, values in self.knobs.items()}
        object.__setattr__(self, "knobs", {kind: given.get(kind) or kind_knobs(kind, {}) for kind in KNOB_KINDS})
        if not isinstance(self.gpas, bool):
            raise ValueError(f"norm.gpas must be true or false, got {self.gpas!r}")
        for site in NORM_SITES:
            value = getattr(self, f"alpha_init_{site}")
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ValueError(f"norm.alpha_init_{site} must be a finite number > 0, got {value!r}")

    def build(self, dim: int, kind: str | None = None, *, site: str | None = None) -> "nn.Module":
        """This spec's norm over a last dimension of size ``dim`` at ``site`` (``model.kinds.NORM_SITES``: ``attn``,
        ``ffn``, ``final``; it picks the initial alpha of dyt and derf), or the attention-site norm ``kind``
        (``self.qk``, ``self.v``: ``l2`` included; no site) with this spec's impl, eps, bias and gain; see
        ``model.norms.build_norm``.

        Raises:
            ValueError: a residual-stream norm (no ``kind``) without a valid ``site``."""
        from model.norms import build_norm  # torch: this module imports without it

        alpha = None
        if kind is None:
            if site not in NORM_SITES:
                raise ValueError(f"a residual-stream norm needs its site, got {site!r}; valid: {', '.join(NORM_SITES)}")
            alpha = getattr(self, f"alpha_init_{site}")
        return build_norm(
            kind or self.kind,
            dim,
            impl=self.impl,
            eps=self.eps,
            bias=self.bias,
            gain=self.gain,
            attention=kind is not None,
            alpha_init=alpha,
            knobs=self.knobs.get(kind or self.kind),
        )


_SPEC_KEYS = tuple(f.name for f in fields(NormSpec))


@dataclass(frozen=True)
class BlockNorm:
    """One entry of ``norm.blocks``: the :class:`NormSpec` keys it sets in the blocks it covers. In YAML an entry is
    one flat mapping, ``{stack: enc, layers: [0], placement: post}`` (:meth:`from_entry`, :meth:`to_entry`).

    Attributes:
        stack: ``enc`` or ``dec``; None: both.
        layers: 0-based layer indices in the stack; None: every layer.
        sets: :class:`NormSpec` key -> value; a ``knobs`` value sets only the knobs it names (to turn an attention
            norm off, give ``qk: none``).
    """

    stack: str | None = None
    layers: tuple[int, ...] | None = None
    sets: dict[str, Any] = field(default_factory=dict, hash=False)

    def covers(self, stack: str, index: int) -> bool:
        """Whether this entry applies to layer ``index`` of ``stack``."""
        return self.stack in (None, stack) and (self.layers is None or index in self.layers)

    def apply(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` (the :class:`NormSpec` keys) with this entry's keys set; its knobs are merged per kind."""
        knobs = {**values.get("knobs", {})}
        for kind, given in self.sets.get("knobs", {}).items():
            base = knobs.get(kind, {})
            knobs[kind] = {**(asdict(base) if not isinstance(base, dict) else base), **given}
        return {**values, **self.sets, "knobs": knobs}

    def to_entry(self) -> dict[str, Any]:
        """The flat mapping :meth:`from_entry` reads (a checkpoint's ``norm.blocks``)."""
        return {"stack": self.stack, "layers": None if self.layers is None else list(self.layers), **self.sets}

    @classmethod
    def from_entry(cls, i: int, entry: Any) -> "BlockNorm":
        """``norm.blocks[i]``, a flat mapping (or a BlockNorm); a key at None keeps the ``norm.*`` value, as
        checkpoints written before entries were flat hold every key.

        Raises:
            ValueError: not a mapping, an unknown key, stack or layer index, ``knobs`` not a mapping of mappings, or an
                entry that changes nothing."""
        key = f"norm.blocks[{i}]"
        valid = ["stack", "layers", *_SPEC_KEYS]
        if isinstance(entry, BlockNorm):
            return entry
        if not isinstance(entry, dict):
            raise ValueError(f"{key}={entry!r} is invalid; expected a mapping with keys from: {', '.join(valid)}")
        for name in entry:
            if name not in valid:
                raise ValueError(f"{key}.{name} is not a key of a norm.blocks entry; valid keys: {', '.join(valid)}")
        stack, layers = entry.get("stack"), entry.get("layers")
        if stack is not None and stack not in STACKS:
            raise ValueError(f"unknown {key}.stack {stack!r}; valid: null (both), {', '.join(STACKS)}")
        if layers is not None and not (
            isinstance(layers, list | tuple) and all(isinstance(j, int) and not isinstance(j, bool) and j >= 0 for j in layers)
        ):
            raise ValueError(f"{key}.layers={layers!r} is invalid; expected a list of layer indices >= 0 (null: every layer)")
        sets = {k: v for k, v in entry.items() if k not in ("stack", "layers") and v is not None}
        knobs = sets.get("knobs", {})
        if not (isinstance(knobs, dict) and all(isinstance(v, dict) for v in knobs.values())):
            raise ValueError(f"{key}.knobs={knobs!r} is invalid; expected a mapping of kinds to mappings of their knobs")
        if not sets:
            raise ValueError(f"{key} changes nothing; give at least one of: {', '.join(_SPEC_KEYS)}")
        return cls(stack, None if layers is None else tuple(layers), sets)


@dataclass(frozen=True)
class NormConfig(NormSpec):
    """The ``norm`` config: the :class:`NormSpec` keys set every block; ``blocks`` overrides some.

    Attributes:
        blocks: :class:`BlockNorm` entries (or their dicts, as from YAML), applied in order (a later
            entry wins where two cover a block); None: every block uses the ``norm.*`` keys.
        decoder_batch_stats: admit a batch-reading kind (``model.kinds.BATCH_READING_KINDS``) in the
            decoder's blocks and final norm, whose training statistics read future target positions
            (a causality leak; :class:`ModelConfig` checks it, knowing the decoder's depth).
        hc: hyper-connections over ``model.residual_streams`` streams around every sublayer
            (``model.hyper_connections.HC_KINDS``: static, dynamic, mhc); None: the plain residual.
        learned_embed_scale: the token embeddings' sqrt(d_model) factor is a learned scalar per stack,
            initialized to sqrt(d_model) (``model.transformer.Embedding``), as the official DyT (LLaMA) and Derf
            (GPT-2) language-model code scale the embeddings for their norm-free kinds; False: the fixed factor.

    Raises:
        ValueError: a bad ``norm.*`` value (see :class:`NormSpec`), or a bad ``norm.blocks``
            entry: not a mapping, an unknown key, stack or layer index, an entry that changes
            nothing, or a combination its blocks cannot take (the message names the entry);
            ``decoder_batch_stats`` or ``learned_embed_scale`` not a bool; an unknown ``hc``.
    """

    blocks: tuple[BlockNorm, ...] | None = None
    decoder_batch_stats: bool = False
    hc: str | None = None
    learned_embed_scale: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("decoder_batch_stats", "learned_embed_scale"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"norm.{key} must be true or false, got {getattr(self, key)!r}")
        if self.hc is not None and self.hc not in HC_KINDS:
            raise ValueError(f"unknown norm.hc {self.hc!r}; valid: null (off), {', '.join(HC_KINDS)}")
        if self.blocks is not None and not isinstance(self.blocks, list | tuple):
            raise ValueError(f"norm.blocks={self.blocks!r} is invalid; expected a list of mappings or null")
        if not self.blocks:  # an empty list is no override: None, so the saved config matches an old checkpoint's
            object.__setattr__(self, "blocks", None)
            return
        blocks = tuple(BlockNorm.from_entry(i, entry) for i, entry in enumerate(self.blocks))
        object.__setattr__(self, "blocks", blocks)
        base = {key: getattr(self, key) for key in _SPEC_KEYS}
        for i, block in enumerate(blocks):
            try:
                NormSpec(**block.apply(base))
            except ValueError as err:
                raise ValueError(f"norm.blocks[{i}]: {err}") from None

    def spec(self, stack: str, index: int, n_layers: int) -> NormSpec:
        """The resolved norm of layer ``index`` (0-based) of ``stack`` (``enc`` or ``dec``), a stack of
        ``n_layers`` blocks: a placement that is another one per depth (``Placement.by_depth``:
        Mix-LN, HybridNorm*) is replaced by that one."""
        values = {key: getattr(self, key) for key in _SPEC_KEYS}
        for block in self.blocks or ():
            if block.covers(stack, index):
                values = block.apply(values)
        spec = NormSpec(**values)
        by_depth = PLACEMENTS[spec.placement].by_depth
        return spec if by_depth is None else replace(spec, placement=by_depth(index, n_layers, spec))


def norm_label(norm: Any) -> list[str]:
    """The words that name a run's norm: placement, kind and impl, then each setting that changes the model beyond
    them (``qk_layernorm``, ``v_rmsnorm``, ``full``, ``unit_offset``, ``gpas``, ``hc_mhc``, ``alpha_0.8_0.2_0.2``,
    ``embed_scale``, and each ``norm.blocks`` entry as its stack, layers and values: ``enc_powernorm``), so presets
    that share the first three (``pre_ln``, ``pre_ln_gpas``, ``pre_ln_mhc``, ``pre_ln_qk``) read apart. ``norm`` is
    the ``norm`` mapping as composed (unchecked: a run dir is named before the config is validated) or a
    :class:`NormConfig`."""
    get = norm.get if isinstance(norm, Mapping) else lambda key, default=None: getattr(norm, key, default)
    words = [str(get("placement")), str(get("kind")), str(get("impl"))]
    words += [f"{key}_{get(key)}" for key in ("qk", "v") if get(key) is not None]
    words += [str(value) for key, plain in (("qk_scope", "head"), ("gain", "plain")) if (value := get(key, plain)) != plain]
    words += ["gpas"] * bool(get("gpas")) + ([f"hc_{get('hc')}"] if get("hc") else [])
    alphas = [get(f"alpha_init_{site}", 0.5) for site in NORM_SITES]
    words += [f"alpha_{'_'.join(map(str, alphas))}"] * (alphas != [0.5] * 3) + ["embed_scale"] * bool(get("learned_embed_scale"))
    for block in get("blocks") or ():
        entry = block.to_entry() if isinstance(block, BlockNorm) else dict(block)
        where = [entry.get("stack") or "both", *map(str, entry.get("layers") or ())]
        values = [str(v) for k, v in entry.items() if k not in ("stack", "layers", "knobs") and v is not None]
        words.append("_".join(where + values))
    return words


def norm_title(norm: Any) -> str:
    """:func:`norm_label` as a run prints it: ``pre/layernorm/custom``, ``pre/layernorm/custom + gpas``."""
    words = norm_label(norm)
    return "/".join(words[:3]) + (f" + {', '.join(words[3:])}" if words[3:] else "")
