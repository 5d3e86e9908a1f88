"""The norm kinds and impls a config may name, and which (kind, impl) pairs exist: torch-free, so a
run's config validates before torch loads (``training.schema``). ``model/norms.py`` builds each pair
(its ``_REGISTRY`` has one row per pair of ``NORM_PAIRS``)."""

NORM_KINDS = ("layernorm", "rmsnorm", "scalenorm", "dyt", "dyisru", "none", "batchnorm", "powernorm", "annotated_ln",
              "seednorm", "derf")  # fmt: skip
# Kinds only the attention norm sites build (over d_head, ``ATTENTION_NORM_KINDS``): never a
# ``norm.kind``, since an l2-normalized residual stream has norm 1, not the RMS 1 the rest expects.
ATTENTION_ONLY_KINDS = ("l2",)
# Norm kinds offered at the attention norm sites (``norm.qk``, ``norm.v``), over d_head.
ATTENTION_NORM_KINDS = ("none", "layernorm", "rmsnorm", "l2")
NORM_IMPLS = ("custom", "native")
# How a norm's per-channel gain ``weight`` is stored (``model.gains``): ``plain`` (the gain itself) or ``unit_offset``
# (w, applied as 1 + w, Gemma 3's zero-centred gains).
NORM_GAINS = ("plain", "unit_offset")
# Where QK-norm acts (``model.attention``): ``head`` (over d_head after the head split: Gemma 3, Qwen3) or ``full``
# (over d_model = heads x d_head before it: OLMo 2).
QK_SCOPES = ("head", "full")
NATIVE_KINDS = ("layernorm", "rmsnorm", "batchnorm")  # the kinds torch has a module for: nn.LayerNorm, nn.RMSNorm, nn.BatchNorm1d
# Kinds whose statistics read the batch (``model.batch_reading.BatchReadingNorm``): in the decoder they see future
# target positions in training, so a config puts them there only with ``norm.decoder_batch_stats`` (``model.config``).
BATCH_READING_KINDS = ("batchnorm", "powernorm")
HC_KINDS = ("static", "dynamic", "mhc")  # norm.hc: hyper-connections' weights (``model.hyper_connections``)
# Point-wise kinds with one learned scalar alpha inside a bounded function (DyT's tanh, Derf's erf): their alpha starts at
# the ``norm.alpha_init_*`` of the site the norm sits at (``model.config.NormSpec``, ``NORM_SITES``).
ALPHA_KINDS = ("dyt", "derf")
# Where a residual-stream norm sits, for its alpha init: in an attention sublayer (self- or cross-), in the FFN's, or as
# a stack's final norm (the official LLaMA/GPT-2 DyT/Derf code's attn_/ffn_/dec_alpha_init_value).
NORM_SITES = ("attn", "ffn", "final")
NORM_PAIRS = tuple((k, i) for k in NORM_KINDS + ATTENTION_ONLY_KINDS for i in NORM_IMPLS if i == "custom" or k in NATIVE_KINDS)


def check_norm(kind: str, impl: str, *, key: str = "norm.kind", kinds: tuple[str, ...] = NORM_KINDS) -> None:
    """Raise ``ValueError`` naming the bad value and the valid choices if ``kind`` is not one of
    ``kinds`` (the residual stream's, by default), ``impl`` is unknown or ``kind`` has no ``impl``.
    ``key`` is the config key the message names (``norm.qk`` for an attention site)."""
    if kind not in kinds:
        raise ValueError(f"unknown {key} {kind!r}; valid kinds: {', '.join(kinds)}")
    if impl not in NORM_IMPLS:
        raise ValueError(f"unknown norm.impl {impl!r}; valid impls: {', '.join(NORM_IMPLS)}")
    if (kind, impl) not in NORM_PAIRS:
        valid = ", ".join(f"{k}/{i}" for k, i in NORM_PAIRS if k in kinds)
        raise ValueError(f"{key}={kind!r} has no impl {impl!r}; valid kind/impl pairs: {valid}")
