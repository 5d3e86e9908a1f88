"""The norm kinds as records: one :class:`NormKind` per kind holds every fact the rest of normlab reads about it
(its impls and the classes that build them, whether it learns a shift, is bounded, takes a per-site alpha, reads the
batch, where it may sit). Torch-free, so a run's config validates before torch loads (``training.schema``); the
classes are named, not imported (``model.norms.build_norm`` imports them). Every list of kinds (the tuples below,
README.md's and docs/norms.md's rows, ``--help``) is generated from :data:`NORM_KIND_RECORDS` or tested against it
(tests/test_kinds.py). A new kind is one record here and one class (docs/extending.md).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class NormKind:
    """What normlab knows of one norm kind.

    Attributes:
        name: the config value (``norm.kind=<name>``, ``norm.qk=<name>``).
        custom: the class written from the formula, as ``module:Class``; it is called as
            ``Class(dim, **kwargs)`` with ``eps=`` if :attr:`eps`, ``bias=`` if :attr:`shift`, ``alpha_init=``
            if :attr:`alpha` and each keyword of :attr:`knobs`.
        native: torch's module for the kind, called the same way (None: the kind has no native impl).
        eps: the constructors take ``norm.eps``.
        shift: the kind learns a shift ``bias``; ``norm.bias=false`` drops it.
        gain: the kind has a per-channel gain ``weight`` (``norm.gain`` applies).
        bounded: the output is bounded (|y| <= |weight| c + |bias|): the placements that end a block with the norm
            reject the kind, and telemetry measures its saturation (the class then has ``saturation_input``).
        alpha: the kind takes ``alpha_init=``, the ``norm.alpha_init_{attn,ffn,final}`` of the norm's site.
        reads_batch: statistics over the batch's tokens (``model.batch_reading.BatchReadingNorm``): in the decoder only
            with ``norm.decoder_batch_stats``.
        residual: valid as ``norm.kind`` (a residual-stream norm over d_model).
        attention: offered at the attention norm sites (``norm.qk``, ``norm.v``, over d_head).
        knobs: (``norm.*`` key, constructor keyword) pairs of the kind's own settings.
    """

    name: str
    custom: str
    native: str | None = None
    eps: bool = True
    shift: bool = False
    gain: bool = True
    bounded: bool = False
    alpha: bool = False
    reads_batch: bool = False
    residual: bool = True
    attention: bool = False
    knobs: tuple[tuple[str, str], ...] = ()

    @property
    def impls(self) -> tuple[str, ...]:
        """``custom``, and ``native`` where torch has the module."""
        return ("custom", "native") if self.native else ("custom",)


# In the order error messages and docs list them.
NORM_KIND_RECORDS: dict[str, NormKind] = {
    k.name: k
    for k in (
        NormKind("layernorm", "model.norms:LayerNorm", "torch.nn:LayerNorm", shift=True, attention=True),
        NormKind("rmsnorm", "model.norms:RMSNorm", "torch.nn:RMSNorm", attention=True),
        NormKind("scalenorm", "model.norms:ScaleNorm"),
        NormKind("dyt", "model.norms:DyT", eps=False, shift=True, bounded=True, alpha=True),
        NormKind("dyisru", "model.norms:DyISRU", eps=False, shift=True, bounded=True),
        NormKind("none", "torch.nn:Identity", eps=False, gain=False, attention=True),
        NormKind("batchnorm", "model.batchnorm:BatchNorm", "model.batchnorm:NativeBatchNorm", shift=True, reads_batch=True),
        NormKind(
            "powernorm",
            "model.powernorm:PowerNorm",
            shift=True,
            reads_batch=True,
            knobs=(("powernorm_warmup", "warmup_iters"), ("powernorm_groups", "group_num")),
        ),
        NormKind("annotated_ln", "model.norms:AnnotatedLayerNorm", shift=True),
        NormKind("seednorm", "model.norms:SeeDNorm"),
        NormKind("derf", "model.norms:Derf", eps=False, shift=True, bounded=True, alpha=True),
        # Never a norm.kind: an l2-normalized residual stream has norm 1, not the RMS 1 the rest expects.
        NormKind("l2", "model.norms:L2Norm", gain=False, residual=False, attention=True),
    )
}


def kinds_where(**facts: bool) -> tuple[str, ...]:
    """The names of the kinds whose record has every given fact, in record order
    (``kinds_where(shift=True)``: the kinds that learn a shift).

    Raises:
        ValueError: a fact that is not a boolean field of :class:`NormKind`."""
    valid = [n for n, v in vars(NormKind).items() if isinstance(v, bool)]
    if unknown := [f for f in facts if f not in valid]:
        raise ValueError(f"unknown kind facts {unknown}; valid: {', '.join(valid)}")
    return tuple(k.name for k in NORM_KIND_RECORDS.values() if all(getattr(k, f) == v for f, v in facts.items()))


NORM_KINDS = kinds_where(residual=True)  # norm.kind's choices
ATTENTION_NORM_KINDS = kinds_where(attention=True)  # norm.qk's and norm.v's choices, over d_head
ATTENTION_ONLY_KINDS = kinds_where(residual=False)  # attention-site kinds that are never a norm.kind
NATIVE_KINDS = tuple(k.name for k in NORM_KIND_RECORDS.values() if k.native)
BATCH_READING_KINDS = kinds_where(reads_batch=True)
ALPHA_KINDS = kinds_where(alpha=True)  # their alpha starts at the norm.alpha_init_* of the norm's site
NORM_PAIRS = tuple((k.name, i) for k in NORM_KIND_RECORDS.values() for i in k.impls)
NORM_IMPLS = ("custom", "native")
# How a norm's per-channel gain ``weight`` is stored (``model.gains``): ``plain`` (the gain itself) or ``unit_offset``
# (w, applied as 1 + w, Gemma 3's zero-centred gains).
NORM_GAINS = ("plain", "unit_offset")
# Where QK-norm acts (``model.attention``): ``head`` (over d_head after the head split: Gemma 3, Qwen3) or ``full``
# (over d_model = heads x d_head before it: OLMo 2).
QK_SCOPES = ("head", "full")
HC_KINDS = ("static", "dynamic", "mhc")  # norm.hc: hyper-connections' weights (``model.hyper_connections``)
# Where a residual-stream norm sits, for its alpha init: in an attention sublayer (self- or cross-), in the FFN's, or as
# a stack's final norm (the official LLaMA/GPT-2 DyT/Derf code's attn_/ffn_/dec_alpha_init_value).
NORM_SITES = ("attn", "ffn", "final")


def check_norm(kind: str, impl: str, *, key: str = "norm.kind", kinds: tuple[str, ...] = NORM_KINDS) -> None:
    """Raise ``ValueError`` naming the bad value and the valid choices if ``kind`` is not one of
    ``kinds`` (the residual stream's, by default), ``impl`` is unknown or ``kind`` has no ``impl``.
    ``key`` is the config key the message names (``norm.qk`` for an attention site)."""
    if kind not in kinds:
        raise ValueError(f"unknown {key} {kind!r}; valid kinds: {', '.join(kinds)}")
    if impl not in NORM_IMPLS:
        raise ValueError(f"unknown norm.impl {impl!r}; valid impls: {', '.join(NORM_IMPLS)}")
    if impl not in NORM_KIND_RECORDS[kind].impls:
        valid = ", ".join(f"{k}/{i}" for k, i in NORM_PAIRS if k in kinds)
        raise ValueError(f"{key}={kind!r} has no impl {impl!r}; valid kind/impl pairs: {valid}")
