"""The norm kinds as records: one :class:`NormKind` per kind holds every fact the rest of normlab reads about it
(its impls and the classes that build them, whether it learns a shift, is bounded, takes a per-site alpha, reads the
batch, where it may sit). Torch-free, so a run's config validates before torch loads (``training.schema``); the
classes are named, not imported (``model.norms.build_norm`` imports them). Every list of kinds (the tuples below,
README.md's and docs/norms.md's rows, ``--help``) is generated from :data:`NORM_KIND_RECORDS` or tested against it
(tests/test_kinds.py). A new kind is one record here and one class (docs/extending.md).
"""

import math
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class PowerNormKnobs:
    """Kind ``powernorm``'s own settings (``norm.knobs.powernorm.*``), named as the official ``MaskPowerNorm``'s
    constructor keywords (sIncerass/powernorm, ``fairseq/modules/norms/mask_powernorm.py`` line 104), to which
    ``model.norms.build_norm`` passes them.

    Attributes:
        warmup_iters: training iterations that normalize by the batch's own statistic before the running one takes
            over, >= 0; 10000, the class default (the config's is fairseq's choice, the LR warmup).
        group_num: groups of its per-token group scaling, >= 1, dividing the normalized width; 1, the class default
            (the config's is fairseq's choice, the attention heads).

    Raises:
        ValueError: a value not an integer in range, naming the key.
    """

    warmup_iters: int = 10000
    group_num: int = 1

    def __post_init__(self) -> None:
        for key, least in (("warmup_iters", 0), ("group_num", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"norm.knobs.powernorm.{key} must be an integer >= {least}, got {value!r}")

    def width_error(self, d_model: int) -> str | None:
        """Why these settings cannot normalize ``d_model`` channels (the official reshape splits them into
        ``group_num`` equal groups), else None."""
        if d_model % self.group_num == 0:
            return None
        valid = [g for g in range(1, d_model + 1) if d_model % g == 0]
        return f"norm.knobs.powernorm.group_num={self.group_num} does not divide model.d_model={d_model}; valid groups: {valid}"


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
        knobs: the dataclass of the kind's own settings (None: it has none): torch-free, frozen, its fields the
            ``norm.knobs.<name>.*`` keys and the constructor keywords they reach, its defaults the class's, its
            ``__post_init__`` checking each value; ``width_error(d_model)`` says why a width cannot take them.
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
    knobs: type[Any] | None = None

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
            knobs=PowerNormKnobs,
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
KNOB_KINDS = tuple(k.name for k in NORM_KIND_RECORDS.values() if k.knobs)  # norm.knobs' keys
NORM_PAIRS = tuple((k.name, i) for k in NORM_KIND_RECORDS.values() for i in k.impls)
NORM_IMPLS = ("custom", "native")
# How a norm's per-channel gain ``weight`` is stored (``model.gains``): ``plain`` (the gain itself) or ``unit_offset``
# (w, applied as 1 + w, Gemma 3's zero-centred gains).
NORM_GAINS = ("plain", "unit_offset")
# Where QK-norm acts (``model.attention``): ``head`` (over d_head after the head split: Gemma 3, Qwen3) or ``full``
# (over d_model = heads x d_head before it: OLMo 2).
QK_SCOPES = ("head", "full")
# Attention-logit controls (``model.attention``, docs/attention.md): the output gate's granularity
# (``model.attn_gate``, Qiu et al. 2025) and what turns logits into weights (``model.attn_softmax``).
ATTN_GATES = ("elementwise", "headwise")
ATTN_SOFTMAXES = ("softmax", "softpick")
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


def check_attention_controls(gate: Any, sink: Any, softmax: Any, **caps: Any) -> None:
    """Raise ``ValueError`` naming the ``model.*`` key, the bad value and the valid choices for an attention-logit
    control (docs/attention.md): ``gate`` not null or one of ``ATTN_GATES``, ``sink`` not a bool, ``softmax`` not one of
    ``ATTN_SOFTMAXES``, a sink with softpick (which has no softmax denominator to put it in), or a cap of ``caps``
    (``attn_softcap=...``, ``final_softcap=...``) neither None nor a finite positive number."""
    if gate is not None and gate not in ATTN_GATES:
        raise ValueError(f"unknown model.attn_gate {gate!r}; valid: null, {', '.join(ATTN_GATES)}")
    if not isinstance(sink, bool):
        raise ValueError(f"model.attn_sink must be true or false, got {sink!r}")
    if softmax not in ATTN_SOFTMAXES:
        raise ValueError(f"unknown model.attn_softmax {softmax!r}; valid: {', '.join(ATTN_SOFTMAXES)}")
    if sink and softmax != "softmax":
        raise ValueError(
            f"model.attn_sink=true adds a logit to the softmax's denominator; model.attn_softmax={softmax} "
            "has none: set one of them back (attn_sink=false or attn_softmax=softmax)"
        )
    for name, cap in caps.items():
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 < cap < math.inf):
            raise ValueError(f"model.{name} must be null (no cap) or a positive number, got {cap!r}")


def kind_knobs(kind: str, values: Any) -> Any:
    """``values`` (a mapping of some of the kind's knobs, or its knobs dataclass) as ``kind``'s knobs dataclass, the
    knobs it lacks at their defaults.

    Raises:
        ValueError: ``kind`` has no knobs, ``values`` is not a mapping, an unknown knob (the messages name the valid
            ones), or what the dataclass raises for a bad value."""
    cls = NORM_KIND_RECORDS[kind].knobs if kind in NORM_KIND_RECORDS else None
    if cls is None:
        raise ValueError(f"unknown norm.knobs key {kind!r}; valid: the kinds with their own settings, {', '.join(KNOB_KINDS)}")
    if isinstance(values, cls):
        return values
    valid = [f.name for f in fields(cls)]
    if not isinstance(values, dict):
        raise ValueError(f"norm.knobs.{kind}={values!r} is invalid; expected a mapping with keys from: {', '.join(valid)}")
    for key in values:
        if key not in valid:
            raise ValueError(f"norm.knobs.{kind}.{key} is not a knob of {kind}; valid: {', '.join(valid)}")
    return cls(**values)
