"""Typed, strict model configuration: validated at construction, saved in every checkpoint.

Imports without Hydra: ``train.py`` turns the Hydra config into these dataclasses.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

from model.norms import check_norm
from model.residual import check_placement

POSITIONS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class NormConfig:
    """The three normalization axes plus eps and bias (see DESIGN.md sec. 3).

    Attributes:
        kind: ``model.norms.NORM_KINDS``.
        impl: ``custom`` or ``native`` (layernorm and rmsnorm only).
        placement: ``model.residual.PLACEMENTS``.
        eps: numerical-stability constant of the norm.
        bias: layernorm and dyt learn a shift (beta); ignored by kinds without one.

    Raises:
        ValueError: unknown kind, impl or placement, or an impossible combination (native
            scalenorm, dyt after the residual addition): the message lists the valid ones;
            eps <= 0.
    """

    kind: str = "layernorm"
    impl: str = "custom"
    placement: str = "pre"
    eps: float = 1e-5
    bias: bool = True

    def __post_init__(self) -> None:
        check_norm(self.kind, self.impl)
        check_placement(self.placement, self.kind)
        if not self.eps > 0:
            raise ValueError(f"norm.eps must be > 0, got {self.eps!r}")


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
        norm: the normalization axes.

    Raises:
        ValueError: a size out of range, d_model not divisible by n_heads, an unknown
            positions kind (the message names the value and the valid range or choices).
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

    @property
    def attn_dropout_p(self) -> float:
        """The dropout probability on attention weights: ``attn_dropout``, else ``dropout``."""
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    @property
    def act_dropout_p(self) -> float:
        """The dropout probability on FFN activations: ``act_dropout``, else ``dropout``."""
        return self.dropout if self.act_dropout is None else self.act_dropout

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form, for checkpoints and logs."""
        return asdict(self)
