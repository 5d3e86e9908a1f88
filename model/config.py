"""Typed, strict model configuration: validated at construction, saved in every checkpoint.

Imports without Hydra or torch: ``training.schema`` turns the Hydra config into these dataclasses
before torch loads.

The norm is planned per block: ``NormConfig``'s keys set every block, ``NormConfig.blocks``
overrides chosen blocks, and ``ModelConfig.block_norm(stack, index)`` resolves one block's
:class:`NormSpec` (see docs/norms.md, "Placement records and per-layer plans").
"""

from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from model.kinds import ATTENTION_NORM_KINDS, BATCH_READING_KINDS, HC_KINDS, NORM_GAINS, NORM_SITES, QK_SCOPES, check_norm
from model.placements import PLACEMENTS, check_placement
from runlog.metric_names import STACKS

if TYPE_CHECKING:
    from torch import nn

POSITIONS = ("sinusoidal", "learned")
HC_DEFAULT_STREAMS = 4  # n of HC's LM runs (Zhu et al. 2025, "HC x4") and of mHC (Xie et al. 2025; DeepSeek-V4's hc_mult)
# Placements whose sublayers are x + update(x) (no norm_out, alpha 1, no normed or block skip): hyper-connections
# take the place of that sum.
HC_PLACEMENTS = tuple(
    name
    for name, p in PLACEMENTS.items()
    if p.final_norm
    and p.by_depth is None
    and not p.slots[2]
    and not p.normed_skip
    and not p.block_skip
    and p.residual_scale("enc", 1, 1) == 1.0
)


@dataclass(frozen=True)
class NormSpec:
    """The norm of one block: the three normalization axes, eps and bias (DESIGN.md sec. 3), and
    the norms inside its attention.

    Attributes:
        kind: ``model.kinds.NORM_KINDS``.
        impl: ``custom`` or ``native`` (layernorm, rmsnorm and batchnorm only).
        placement: ``model.placements.PLACEMENTS``.
        eps: numerical-stability constant of the norm.
        bias: layernorm, dyt, derf, dyisru and batchnorm learn a shift; ignored by kinds without one.
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
        powernorm_warmup: kind ``powernorm``: the training iterations that normalize by the batch's own statistic
            before the running one takes over (``MaskPowerNorm``'s ``warmup_iters``), >= 0; the dataclass default
            is the official class default (10000), the config's (conf/norm_base.yaml) fairseq's choice, the LR warmup.
        powernorm_groups: kind ``powernorm``: the groups of its per-token group scaling (``group_num``), >= 1,
            dividing the normalized width; the dataclass default is the official class default (1), the config's
            fairseq's choice, the attention heads.
        gpas: GPAS (Chen et al. 2025, ``model.residual.GPAS``) in the block: one learned gate g (init 0) scales the
            stream by 1 - SiLU(g) after each residual addition (on the skip where a norm closes the sublayer),
            leaving its gradient unscaled; with any placement.

        alpha_init_attn, alpha_init_ffn, alpha_init_final: kinds ``dyt`` and ``derf`` (``model.kinds.ALPHA_KINDS``):
            the initial alpha of a norm in an attention sublayer (self- or cross-, any slot), in the FFN sublayer,
            and of a stack's final norm (the official LLaMA DyT / GPT-2 Derf code's ``attn_``, ``ffn_`` and
            ``dec_alpha_init_value``), each > 0; 0.5 each (the kinds' own default) builds what normlab built before.

    Raises:
        ValueError: unknown kind, impl, placement or attention norm kind, or an impossible
            combination (native scalenorm or l2, dyt, derf or dyisru after the residual addition,
            HybridNorm without q/k/v norms, ``qk_scope: full`` with ``qk: l2``): the message lists the valid ones;
            an unknown gain or qk_scope; eps not a number
            > 0; mix_ln_alpha outside [0, 1]; powernorm_warmup not an integer >= 0, powernorm_groups not one >= 1;
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
    powernorm_warmup: int = 10000
    powernorm_groups: int = 1
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
            raise ValueError("norm.qk=l2 needs per-head unit vectors (its temperature multiplies cos(q, k)): set "
                             "norm.qk_scope=head, or another norm.qk with norm.qk_scope=full")  # fmt: skip
        if PLACEMENTS[self.placement].needs_qkv_norm and None in (self.qk, self.v):
            raise ValueError(f"norm.placement={self.placement!r} normalizes q, k and v inside attention: set norm.qk and norm.v "
                             f"(got qk={self.qk!r}, v={self.v!r}); valid: {', '.join(ATTENTION_NORM_KINDS)}")  # fmt: skip
        alpha = self.mix_ln_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
            raise ValueError(f"norm.mix_ln_alpha must be in [0, 1], got {alpha!r}")
        for key, least in (("powernorm_warmup", 0), ("powernorm_groups", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"norm.{key} must be an integer >= {least}, got {value!r}")
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
        return build_norm(kind or self.kind, dim, impl=self.impl, eps=self.eps, bias=self.bias, gain=self.gain,
                          attention=kind is not None, powernorm_warmup=self.powernorm_warmup,
                          powernorm_groups=self.powernorm_groups, alpha_init=alpha)  # fmt: skip


_SPEC_KEYS = tuple(f.name for f in fields(NormSpec))


@dataclass(frozen=True)
class BlockNorm:
    """One entry of ``norm.blocks``: the spec keys it sets (None: keep) in the blocks it covers.

    Attributes:
        stack: ``enc`` or ``dec``; None: both.
        layers: 0-based layer indices in the stack; None: every layer.
        kind, impl, placement, eps, bias, qk, v, gain, qk_scope, mix_ln_alpha: as in :class:`NormSpec`; None keeps the value
            set by the ``norm.*`` keys (to turn an attention norm off, give ``none``).
        powernorm_warmup, powernorm_groups, alpha_init_attn, alpha_init_ffn, alpha_init_final: as in
            :class:`NormSpec`; None keeps the value set by the ``norm.*`` keys.
        gpas: as in :class:`NormSpec`; None keeps the value set by ``norm.gpas``.
    """

    stack: str | None = None
    layers: tuple[int, ...] | None = None
    kind: str | None = None
    impl: str | None = None
    placement: str | None = None
    eps: float | None = None
    bias: bool | None = None
    qk: str | None = None
    v: str | None = None
    gain: str | None = None
    qk_scope: str | None = None
    mix_ln_alpha: float | None = None
    powernorm_warmup: int | None = None
    powernorm_groups: int | None = None
    gpas: bool | None = None
    alpha_init_attn: float | None = None
    alpha_init_ffn: float | None = None
    alpha_init_final: float | None = None

    def covers(self, stack: str, index: int) -> bool:
        """Whether this entry applies to layer ``index`` of ``stack``."""
        return self.stack in (None, stack) and (self.layers is None or index in self.layers)

    def changes(self) -> dict[str, Any]:
        """The spec keys this entry sets."""
        return {key: getattr(self, key) for key in _SPEC_KEYS if getattr(self, key) is not None}


def _block_entry(i: int, entry: Any) -> BlockNorm:
    """``norm.blocks[i]`` as a :class:`BlockNorm`; raises ValueError naming the bad key or value."""
    key = f"norm.blocks[{i}]"
    valid = [f.name for f in fields(BlockNorm)]
    if isinstance(entry, BlockNorm):
        entry = asdict(entry)
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
    block = BlockNorm(**{**entry, "layers": None if layers is None else tuple(layers)})
    if not block.changes():
        raise ValueError(f"{key} changes nothing; give at least one of: {', '.join(_SPEC_KEYS)}")
    return block


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
        blocks = tuple(_block_entry(i, entry) for i, entry in enumerate(self.blocks))
        object.__setattr__(self, "blocks", blocks)
        base = {key: getattr(self, key) for key in _SPEC_KEYS}
        for i, block in enumerate(blocks):
            try:
                NormSpec(**{**base, **block.changes()})
            except ValueError as err:
                raise ValueError(f"norm.blocks[{i}]: {err}") from None

    def spec(self, stack: str, index: int, n_layers: int) -> NormSpec:
        """The resolved norm of layer ``index`` (0-based) of ``stack`` (``enc`` or ``dec``), a stack of
        ``n_layers`` blocks: a placement that is another one per depth (``Placement.by_depth``:
        Mix-LN, HybridNorm*) is replaced by that one."""
        values = {key: getattr(self, key) for key in _SPEC_KEYS}
        for block in self.blocks or ():
            if block.covers(stack, index):
                values.update(block.changes())
        spec = NormSpec(**values)
        by_depth = PLACEMENTS[spec.placement].by_depth
        return spec if by_depth is None else replace(spec, placement=by_depth(index, n_layers, spec))


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the encoder-decoder Transformer (names as in Vaswani et al. 2017).

    Attributes:
        src_vocab, tgt_vocab: vocabulary sizes (tokens).
        pad_id: padding token id, the same in both vocabularies.
        d_model: width of the residual stream; must be divisible by n_heads.
        n_heads: attention heads; head size is d_model // n_heads.
        d_ff: hidden width of the position-wise FFN.
        n_enc_layers, n_dec_layers: layers in each stack (>= 1).
        dropout: dropout probability on embeddings and branch outputs, and on attention weights and
            FFN activations where ``attn_dropout`` / ``act_dropout`` are None.
        attn_dropout: dropout probability on the attention weights (fairseq's ``attention_dropout``);
            None: ``dropout``.
        act_dropout: dropout probability on the FFN's ReLU activations (fairseq's
            ``activation_dropout``); None: ``dropout``.
        max_len: longest src or tgt sequence (tokens) the position table covers.
        positions: ``sinusoidal`` (Vaswani et al. sec. 3.5) or ``learned``.
        tie_embeddings: tie the output projection to the target embedding.
        share_embeddings: one embedding matrix for source and target (a joint vocabulary;
            requires src_vocab == tgt_vocab). Set from the data, not a Hydra key.
        norm: the normalization axes, planned per block (``block_norm(stack, index)``).
        weight_norm: reparametrize every linear layer of the blocks as ``w = g * v / ||v||``
            (WeightNorm, Salimans & Kingma 2016; ``model.weight_norm``), after the init; with any norm kind.
        residual_streams: n, the residual streams of hyper-connections (``norm.hc``); None: 1 without
            them, ``HC_DEFAULT_STREAMS`` (4) with them; resolved here, so the saved config holds the number.

    Raises:
        ValueError: a size out of range, d_model not divisible by n_heads, an unknown
            positions kind, a ``norm.blocks`` layer index past its stack (the message names the
            value and the valid range or choices); ``weight_norm`` not a bool; a batch-reading norm kind in a decoder block
            (and so in the decoder's final norm, which takes the last block's kind) without
            ``norm.decoder_batch_stats`` (the message names both fixes); ``residual_streams`` not null or
            an integer >= 1, > 1 without ``norm.hc``, or ``norm.hc`` with GPAS or with a block whose placement normalizes,
            scales or re-routes the stream (the message lists the placements that admit it).
    """

    src_vocab: int
    tgt_vocab: int
    pad_id: int = 0
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_enc_layers: int = 3
    n_dec_layers: int = 3
    dropout: float = 0.1
    attn_dropout: float | None = None
    act_dropout: float | None = None
    max_len: int = 64
    positions: str = "sinusoidal"
    tie_embeddings: bool = True
    share_embeddings: bool = False
    norm: NormConfig = field(default_factory=NormConfig)
    weight_norm: bool = False
    residual_streams: int | None = None

    def __post_init__(self) -> None:
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "n_enc_layers", "n_dec_layers", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                f"valid n_heads for this d_model: {[h for h in range(1, self.d_model + 1) if self.d_model % h == 0]}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        for name in ("attn_dropout", "act_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"model.{name} must be null (= model.dropout) or in [0, 1), got {value!r}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"share_embeddings needs one vocabulary, got src_vocab={self.src_vocab}, tgt_vocab={self.tgt_vocab}")
        if self.positions not in POSITIONS:
            raise ValueError(f"unknown model.positions {self.positions!r}; valid: {', '.join(POSITIONS)}")
        if not isinstance(self.weight_norm, bool):
            raise ValueError(f"model.weight_norm must be true or false, got {self.weight_norm!r}")
        self._check_block_layers()
        self._check_hyper_connections()
        self._check_decoder_batch_stats()
        self._check_powernorm_groups()

    def _check_block_layers(self) -> None:
        n_layers = {"enc": ("n_enc_layers", self.n_enc_layers), "dec": ("n_dec_layers", self.n_dec_layers)}
        for i, block in enumerate(self.norm.blocks or ()):
            for stack in STACKS if block.stack is None else (block.stack,):
                key, n = n_layers[stack]
                past = [j for j in block.layers or () if j >= n]
                if past:
                    raise ValueError(f"norm.blocks[{i}].layers has {past[0]}, but model.{key}={n}; valid: 0..{n - 1}")

    def _check_hyper_connections(self) -> None:
        n = self.residual_streams
        if n is None:  # frozen: resolved once, so to_dict saves the number
            object.__setattr__(self, "residual_streams", 1 if self.norm.hc is None else HC_DEFAULT_STREAMS)
        elif isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"model.residual_streams must be null or an integer >= 1, got {n!r}")
        elif n > 1 and self.norm.hc is None:
            raise ValueError(f"model.residual_streams={n} needs hyper-connections: set norm.hc to one of {', '.join(HC_KINDS)}")
        if self.norm.hc is None:
            return
        # The streams replace the plain x + update: a block that normalizes, scales or re-routes x has no place for them.
        for stack, n_layers in (("enc", self.n_enc_layers), ("dec", self.n_dec_layers)):
            for i in range(n_layers):
                spec = self.block_norm(stack, i)
                if spec.gpas:  # GPAS scales the stream after x + update, which the hyper-connection replaces
                    raise ValueError(f"norm.hc={self.norm.hc} cannot be used with norm.gpas=true ({stack} block {i}); "
                                     "turn one of them off")  # fmt: skip
                placement = spec.placement
                if placement not in HC_PLACEMENTS:
                    raise ValueError(f"norm.hc={self.norm.hc} cannot be used with norm.placement={placement!r} ({stack} block "
                                     f"{i}); valid placements: {', '.join(HC_PLACEMENTS)}")  # fmt: skip

    def _check_decoder_batch_stats(self) -> None:
        # A batch-reading norm's training statistics over a target stream include every position of every
        # sentence, so position t's output reads positions after t: teacher forcing then sees the future.
        # Checking the blocks covers the final norm, which takes the last block's kind (transformer.final_norm).
        if self.norm.decoder_batch_stats:
            return
        for i in range(self.n_dec_layers):
            kind = self.block_norm("dec", i).kind
            if kind in BATCH_READING_KINDS:
                raise ValueError(f"norm.kind={kind} in decoder block {i} reads future target positions in training (a causality "
                                 f"leak): keep the decoder token-wise, e.g. 'norm.blocks=[{{stack: dec, kind: layernorm}}]', "
                                 f"or allow it with norm.decoder_batch_stats=true")  # fmt: skip

    def _check_powernorm_groups(self) -> None:
        # PowerNorm's group scaling splits d_model into equal groups (the official reshape fails otherwise).
        for stack, n in (("enc", self.n_enc_layers), ("dec", self.n_dec_layers)):
            for i in range(n):
                spec = self.block_norm(stack, i)
                if spec.kind == "powernorm" and self.d_model % spec.powernorm_groups:
                    valid = [g for g in range(1, self.d_model + 1) if self.d_model % g == 0]
                    raise ValueError(f"norm.powernorm_groups={spec.powernorm_groups} does not divide model.d_model="
                                     f"{self.d_model} ({stack} block {i}); valid groups: {valid}")  # fmt: skip

    def block_norm(self, stack: str, index: int) -> NormSpec:
        """The resolved norm of layer ``index`` (0-based) of ``stack``: ``norm.spec`` at this stack's depth."""
        return self.norm.spec(stack, index, self.n_enc_layers if stack == "enc" else self.n_dec_layers)

    @property
    def attn_dropout_p(self) -> float:
        """The dropout probability on attention weights: ``attn_dropout``, else ``dropout``."""
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    @property
    def act_dropout_p(self) -> float:
        """The dropout probability on FFN activations: ``act_dropout``, else ``dropout``."""
        return self.dropout if self.act_dropout is None else self.act_dropout

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        """The config ``values`` describe: the plain form of :meth:`to_dict` (a checkpoint's
        ``model_config``), or the ``model`` keys with the ``norm`` keys under ``norm`` (absent: the
        default norm); keys added since a checkpoint was written take their defaults.

        Raises:
            ValueError: a bad value (see the class and :class:`NormConfig`).
            TypeError: an unknown key.
        """
        return cls(**{**values, "norm": NormConfig(**values.get("norm", {}))})

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form, for checkpoints and logs (:meth:`from_dict` reads it back)."""
        return asdict(self)
