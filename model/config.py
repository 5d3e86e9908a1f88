"""Typed, strict model configuration: validated at construction, saved in every checkpoint.

Imports without Hydra or torch: ``training.schema`` turns the Hydra config into these dataclasses
before torch loads.

The norm is planned per block: ``NormConfig``'s keys set every block, ``NormConfig.blocks``
overrides chosen blocks, and ``ModelConfig.block_norm(stack, index)`` resolves one block's
:class:`NormSpec` (see docs/norms.md, "Placement records and per-layer plans"); the norm's dataclasses live in
``model.norm_config`` and are re-exported here, where the model's callers name them.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

from model.kinds import BATCH_READING_KINDS, HC_KINDS, check_attention_controls
from model.norm_config import BlockNorm as BlockNorm
from model.norm_config import NormConfig, NormSpec
from model.parametrization import COMPLETEP_PLACEMENTS, UNRULED_KINDS, depth_mult, width_mult
from model.parametrization import check as check_parametrization
from model.placements import PLACEMENTS
from runlog.metric_names import STACKS

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
class ModelConfig:
    """Sizes of the encoder-decoder Transformer (names as in Vaswani et al. 2017). The defaults of the ``model`` keys
    are the default run's (``conf/model_base.yaml``, which ``tests/test_defaults.py`` holds them equal to): for a model
    built without Hydra, and for the keys a checkpoint written before them lacks.

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
        attn_gate: every attention's output gate (``model.attention``, Qiu et al. 2025): None, ``elementwise`` or
            ``headwise``.
        attn_sink: a learned sink logit per head in every attention's softmax (gpt-oss).
        attn_softmax: ``softmax`` or ``softpick`` (Zuhri et al. 2025) in every attention.
        attn_softcap, final_softcap: c > 0 soft-caps every attention's logits / the output logits to
            c * tanh(x / c) (Gemma 2: 50.0 and 30.0); None: no cap.
        parametrization: ``sp`` (standard), ``mup`` (muP for Adam against a base model of width ``base_d_model``)
            or ``completep`` (muP and CompleteP's depth rule against ``base_depth``): ``model.parametrization`` gives
            the rules and sources.
        base_d_model: D_0, the base width of ``mup`` and ``completep`` (None under ``sp``).
        base_depth: L_0, the base model's blocks per stack under ``completep`` (None otherwise).

    Raises:
        ValueError: a size out of range, d_model not divisible by n_heads, an unknown
            positions kind, a ``norm.blocks`` layer index past its stack (the message names the
            value and the valid range or choices); ``weight_norm`` not a bool; a batch-reading norm kind in a decoder block
            (and so in the decoder's final norm, which takes the last block's kind) without
            ``norm.decoder_batch_stats`` (the message names both fixes); a block kind's knobs the width cannot
            take (``norm.knobs.powernorm.group_num`` not dividing d_model; the message lists the valid ones);
            ``residual_streams`` not null or
            an integer >= 1, > 1 without ``norm.hc``, or ``norm.hc`` with GPAS or with a block whose placement normalizes,
            scales or re-routes the stream (the message lists the placements that admit it); an attention control
            outside its choices, a cap that is not a positive number, or ``attn_sink`` with softpick; an unknown
            ``parametrization``, ``mup`` without a base width that divides into the heads and d_ff, ``mup`` with
            a width-to-fixed projection it has no rule for (``norm.hc``'s, ``attn_gate=headwise``'s) or a norm
            kind or embedding scale it has none for (``model.parametrization.UNRULED_KINDS``,
            ``norm.learned_embed_scale``), or a ``base_d_model`` under ``sp``; ``completep`` (which inherits ``mup``'s
            refusals) without a positive ``base_depth``, or with a placement outside
            ``model.parametrization.COMPLETEP_PLACEMENTS`` or GPAS; a ``base_depth`` under ``sp`` or ``mup``.
    """

    src_vocab: int
    tgt_vocab: int
    pad_id: int = 0
    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 512
    n_enc_layers: int = 3
    n_dec_layers: int = 3
    dropout: float = 0.0
    attn_dropout: float | None = None
    act_dropout: float | None = None
    max_len: int = 64
    positions: str = "sinusoidal"
    tie_embeddings: bool = True
    share_embeddings: bool = False
    norm: NormConfig = field(default_factory=NormConfig)
    weight_norm: bool = False
    residual_streams: int | None = None
    attn_gate: str | None = None
    attn_sink: bool = False
    attn_softmax: str = "softmax"
    attn_softcap: float | None = None
    final_softcap: float | None = None
    parametrization: str = "sp"
    base_d_model: int | None = None
    base_depth: int | None = None

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
        check_attention_controls(
            self.attn_gate, self.attn_sink, self.attn_softmax, attn_softcap=self.attn_softcap, final_softcap=self.final_softcap
        )
        self._check_block_layers()
        self._check_hyper_connections()
        self._check_decoder_batch_stats()
        self._check_knobs_width()
        self._check_parametrization()

    def _check_parametrization(self) -> None:
        param = self.parametrization
        if error := check_parametrization(param, self.d_model, self.d_ff, self.n_heads, self.base_d_model, self.base_depth):
            raise ValueError(error)
        if param == "sp":
            return
        # muP's rules (mup's assert_hidden_size_inf) cover no projection from the width to a fixed size but the output
        if self.norm.hc is not None or self.attn_gate == "headwise":
            what = f"norm.hc={self.norm.hc}" if self.norm.hc is not None else "model.attn_gate=headwise"
            raise ValueError(f"model.parametrization={param} has no rule for {what}'s width-to-fixed projection; use sp")
        stacks = (("enc", self.n_enc_layers), ("dec", self.n_dec_layers))
        specs = [self.block_norm(s, i) for s, n in stacks for i in range(n)]
        if kinds := sorted({spec.kind for spec in specs} & UNRULED_KINDS.keys()):
            reason = UNRULED_KINDS[kinds[0]]
            raise ValueError(f"model.parametrization={param} has no rule for norm.kind={kinds[0]}: {reason}; use sp")
        if self.norm.learned_embed_scale:
            raise ValueError(
                f"model.parametrization={param} has no rule for norm.learned_embed_scale=true: a scalar that starts at "
                "sqrt(d_model), whose size grows with the width; use sp"
            )
        if param == "completep" and (spec := next((s for s in specs if s.placement not in COMPLETEP_PLACEMENTS or s.gpas), None)):
            what = "norm.gpas=true" if spec.placement in COMPLETEP_PLACEMENTS else f"norm.placement={spec.placement}"
            raise ValueError(
                f"model.parametrization=completep has no rule for {what}: CompleteP's 1/L branch multiplier is derived for "
                f"the pre-LN stream x + F(N(x)) / m_L; valid placements: {', '.join(COMPLETEP_PLACEMENTS)}, without GPAS"
            )

    @property
    def width_mult(self) -> float:
        """m = d_model / base_d_model under ``mup`` and ``completep``, 1.0 under ``sp`` (``model.parametrization``)."""
        return width_mult(self.parametrization, self.d_model, self.base_d_model)

    def depth_mult(self, stack: str) -> float:
        """m_L = the blocks of ``stack`` (``enc`` or ``dec``) / base_depth under ``completep``, else 1.0."""
        return depth_mult(self.parametrization, self.n_enc_layers if stack == "enc" else self.n_dec_layers, self.base_depth)

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
                    raise ValueError(
                        f"norm.hc={self.norm.hc} cannot be used with norm.gpas=true ({stack} block {i}); turn one of them off"
                    )
                placement = spec.placement
                if placement not in HC_PLACEMENTS:
                    raise ValueError(
                        f"norm.hc={self.norm.hc} cannot be used with norm.placement={placement!r} ({stack} block "
                        f"{i}); valid placements: {', '.join(HC_PLACEMENTS)}"
                    )

    def _check_decoder_batch_stats(self) -> None:
        # A batch-reading norm's training statistics over a target stream include every position of every
        # sentence, so position t's output reads positions after t: teacher forcing then sees the future.
        # Checking the blocks covers the final norm, which takes the last block's kind (transformer.final_norm).
        if self.norm.decoder_batch_stats:
            return
        for i in range(self.n_dec_layers):
            kind = self.block_norm("dec", i).kind
            if kind in BATCH_READING_KINDS:
                raise ValueError(
                    f"norm.kind={kind} in decoder block {i} reads future target positions in training (a causality "
                    f"leak): keep the decoder token-wise, e.g. 'norm.blocks=[{{stack: dec, kind: layernorm}}]', "
                    f"or allow it with norm.decoder_batch_stats=true"
                )

    def _check_knobs_width(self) -> None:
        # A kind's own settings may not fit the width (PowerNorm's groups must split d_model into equal parts).
        for stack, n in (("enc", self.n_enc_layers), ("dec", self.n_dec_layers)):
            for i in range(n):
                spec = self.block_norm(stack, i)
                if (knobs := spec.knobs.get(spec.kind)) and (error := knobs.width_error(self.d_model)):
                    raise ValueError(f"{stack} block {i}: {error}")

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
        values = asdict(self)
        values["norm"]["blocks"] = None if self.norm.blocks is None else [b.to_entry() for b in self.norm.blocks]
        return values
