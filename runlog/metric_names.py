"""Every telemetry metric name, formatted and parsed here and nowhere else, and the depth order.

Names (stable; docs/telemetry.md), ``{s}`` a stack (``enc``, ``dec``), ``{i}`` a block index:

- ``act/{s}.{site}/{stat}`` (stack sites ``embed``, ``final_norm``) and ``act/{s}.{i}.{site}/{stat}``,
  ``{stat}`` in ``STATS`` (rms, mean, maxabs, crest, kurtosis at every site; token_cos and massive at ``out`` only and
  saturation at norm sites only: ``ACT_STAT_SITES``, :func:`act_stats`);
- ``grad/{s}.{i}/norm``, ``update/{s}.{i}/{ratio|adam_rms}``, ``update/{s}.{i}.{m}/{rms|ratio}`` (``{m}`` as in ``weight/``),
  ``attn/{s}.{i}.{self_attn|cross_attn}/{entropy|max_logit|sink_mass}``, head k's ``attn/{s}.{i}.{a}.h{k}/max_logit``
  (no other has a head);
- ``weight/{s}.{i}.{m}/{sigma_max|stable_rank}``, ``{m}`` a block matrix (``WEIGHT_SITES``: ``self_attn.q``,
  ``cross_attn.out``, ``ffn.in``, ... = :func:`matrix_site` of a residual and a ``linear_roles()`` role);
- ``scale/{s}.{i}.{site}/{stat}``, a learned scale: a norm's parameters at ``{r}.{slot}`` or ``{a}.{h}``
  (``gain_mean``, ``gain_max``, DyT's and Derf's ``alpha``, Derf's ``shift``, DyISRU's ``beta``), a residual gate ``{r}.gate``
  (ReZero's scalar: ``alpha``; LayerScale's per-channel: ``gain_mean``, ``gain_max``), an attention's
  l2 QK-norm ``temperature`` at ``{a}``, SeeDNorm's ``dyn_max`` and ``beta_norm`` at a norm, a block's GPAS
  gate at ``gpas`` (``g``, ``silu_g``) (``SCALE_SITE_STATS``);
- ``bstat/{s}.{i}.{r}.{slot}/{stat}`` and ``bstat/{s}.final_norm/{stat}``: a batch-reading norm's batch
  statistics against its running ones (``{stat}`` a ``BATCH_STATISTICS`` name + ``_dist``: ``mean_dist``,
  ``var_dist``, ``phi_dist``; :func:`batch_stat_dist`);
- ``hc/{s}/{fwd_gain|bwd_gain}``: with hyper-connections (``norm.hc``), stack ``{s}``'s composite residual gain (mHC's
  Amax Gain Magnitude: max row / column sum of |product of the mixing matrices|, max over real tokens; :func:`hc_gain`);
- ``out/{logz|max_logit}``: the output logits, and ``optim/below_eps``: the optimizer's state (and QK-Clip's
  ``optim/qk_clip_count``, ``optim/qk_clip_min_factor``), families of no stack (the name has no middle part; the
  trainer's own ``optim/lr``, ``optim/grad_norm``, ... are not telemetry and do not parse).

Block sites (``BLOCK_SITES``): ``in``, ``out``, a residual sublayer ``{r}`` (its branch output),
a filled norm slot of it ``{r}.{slot}`` (that norm's output), the input of a filled ``norm_out``
``{r}.norm_out.in`` (the residual sum before the closing norm: ``PRE_NORM_SITE``), and an attention
norm site ``{a}.{q_norm|k_norm|v_norm}``. Whether each is read before or after a norm, and with its
gain: docs/telemetry.md, "Metric names".
The depth order runs over every encoder block, then every decoder block (:func:`depth`).

A stat is defined here too: its name in ``STATS`` and its value from a site's raw sums (:func:`derive_stats`).
Imports nothing but the standard library, so the report and the scripts can use it anywhere.
"""

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

STACKS = ("enc", "dec")  # in depth order
STATS = ("rms", "mean", "maxabs", "crest", "kurtosis", "token_cos", "massive", "saturation")  # per act site (derive_stats)
SITE_GROUPS = ("embed", "in", "branch", "norm", "out", "final_norm")  # the ``telemetry.sites`` config values
RESIDUALS = ("self_attn", "cross_attn", "ffn")  # residual sublayers, in forward order
ATTENTIONS = ("self_attn", "cross_attn")
NORM_SLOTS = ("norm_in", "norm_branch", "norm_out")  # a residual's norms
ATTENTION_NORM_SITES = ("q_norm", "k_norm", "v_norm")  # per-head norms inside an attention
STACK_SITES = ("embed", "final_norm")  # act sites of a whole stack (no block index)
# The input of a residual's closing norm, x <- norm_out(alpha * x + F(.) [+ skip]): the stream before that norm.
PRE_NORM_SITE = {r: f"{r}.norm_out.in" for r in RESIDUALS}  # residual -> its site
PRE_NORM_SITES = tuple(PRE_NORM_SITE.values())
BLOCK_SITES = (
    "in",
    "out",
    *RESIDUALS,
    *(f"{r}.{slot}" for r in RESIDUALS for slot in NORM_SLOTS),
    *PRE_NORM_SITES,
    *(f"{a}.{site}" for a in ATTENTIONS for site in ATTENTION_NORM_SITES),
)
# act stats that exist at some sites only: token_cos and massive at block outputs, saturation at a norm's output
# (recorded where it is DyT, Derf or DyISRU).
_NORM_OUTPUT_SITES = (*(s for s in BLOCK_SITES if "norm" in s and s not in PRE_NORM_SITES), "final_norm")
ACT_STAT_SITES = {"token_cos": ("out",), "massive": ("out",), "saturation": _NORM_OUTPUT_SITES}
# weight/: the matrices of a block, by residual and ``linear_roles()`` role (model/attention.py, model/layers.py).
MATRIX_ROLES = ("attn.q", "attn.k", "attn.v", "attn.out", "attn.gate", "ffn.in", "ffn.out")
_MATRIX_SITES = {
    (r, role): f"{r}.{role.split('.')[1]}"
    for r in RESIDUALS
    for role in MATRIX_ROLES
    if role.startswith("ffn." if r == "ffn" else "attn.")
}
WEIGHT_SITES = tuple(_MATRIX_SITES.values())
WEIGHT_STATS = ("sigma_max", "stable_rank")
# scale/: each site's learned scales (a norm's, a residual gate's, an attention's temperature, a block's GPAS gate).
# Derf's scalar shift; SeeDNorm's vectors alpha and beta: ``dyn_max`` = max |alpha|, ``beta_norm`` = ||beta||_2.
_NORM_SCALES = ("gain_mean", "gain_max", "alpha", "beta", "dyn_max", "beta_norm", "shift")
GPAS_SITE = "gpas"  # a block's GPAS gate g (one per block): its value and SiLU(g), the share of the stream removed
SCALE_SITE_STATS = {
    **{f"{r}.{slot}": _NORM_SCALES for r in RESIDUALS for slot in NORM_SLOTS},
    **{f"{a}.{h}": _NORM_SCALES for a in ATTENTIONS for h in ATTENTION_NORM_SITES},
    **{f"{r}.gate": ("gain_mean", "gain_max", "alpha") for r in RESIDUALS},
    **{a: ("temperature",) for a in ATTENTIONS},
    GPAS_SITE: ("g", "silu_g"),
}
SCALE_STATS = (*_NORM_SCALES, "temperature", "g", "silu_g")
# bstat/: what a batch-reading norm's batch_vs_running() returns (model/batch_reading.py), each compared with its
# running buffer; recorded at the residual norm slots and the stack's final norm, where such a norm can sit.
BATCH_STATISTICS = ("mean", "var", "phi")
BSTAT_STATS = tuple(f"{s}_dist" for s in BATCH_STATISTICS)
RESIDUAL_NORM_SITES = tuple(f"{r}.{slot}" for r in RESIDUALS for slot in NORM_SLOTS)
FAMILY_STATS = {
    "act": STATS,
    "grad": ("norm",),
    "update": ("ratio", "adam_rms", "rms"),
    "attn": ("entropy", "max_logit", "sink_mass"),
    "weight": WEIGHT_STATS,
    "scale": SCALE_STATS,
    "out": ("logz", "max_logit"),
    "optim": ("below_eps", "qk_clip_count", "qk_clip_min_factor"),
    "bstat": BSTAT_STATS,
    "hc": ("fwd_gain", "bwd_gain"),
}
# the block sites of each family beside act; others: no site
_BLOCK_SITES_OF = {"attn": ATTENTIONS, "update": (None, *WEIGHT_SITES), "weight": WEIGHT_SITES}
_BLOCK_SITES_OF |= {"scale": tuple(SCALE_SITE_STATS), "bstat": RESIDUAL_NORM_SITES}
FAMILIES = tuple(FAMILY_STATS)
STACKLESS = ("out", "optim")  # families of the whole model: ``{family}/{stat}``, no stack, layer or site
DEPTH_CHART = "act/rms_vs_depth"  # the wandb chart of RMS vs depth (not a statistic: parses to None)

_MIDDLE = r"(?P<stack>[a-z]+)(?:\.(?P<layer>0|[1-9]\d*))?(?:\.(?P<site>[a-z_.]+))?(?:\.h(?P<head>0|[1-9]\d*))?"
_NAME = re.compile(rf"(?P<family>\w+)/(?:{_MIDDLE}/)?(?P<stat>\w+)")


@dataclass(frozen=True)
class Metric:
    """One telemetry metric; :attr:`name` is its string, :func:`parse` the inverse.

    Attributes:
        family: one of ``FAMILIES``.
        stack: ``enc`` or ``dec``; None for a ``STACKLESS`` family (``out``, ``optim``), and only there.
        layer: the block index; None for the stack sites ``embed`` and ``final_norm`` and for ``STACKLESS``.
        site: an act site (``STACK_SITES`` or ``BLOCK_SITES``), the attention of an ``attn``
            metric, a ``WEIGHT_SITES`` matrix, a ``SCALE_SITE_STATS`` site, a ``RESIDUAL_NORM_SITES`` slot
            or ``final_norm`` (``bstat``), a ``WEIGHT_SITES`` matrix or None (``update``), or None (``grad``,
            ``STACKLESS``).
        stat: one of ``FAMILY_STATS[family]``.
        head: the head index of an ``attn`` ``max_logit``, else None.

    Raises:
        ValueError: a field outside its valid values (the message names the field and the valid ones).
    """

    family: str
    stack: str | None
    layer: int | None = None
    site: str | None = None
    stat: str = ""  # always given (an empty stat is refused); the default only lets it follow the optional fields
    head: int | None = None

    def __post_init__(self) -> None:
        _check("family", self.family, FAMILIES)
        _check("stat", self.stat, FAMILY_STATS[self.family])
        if self.head is not None and not (self.family == "attn" and self.stat == "max_logit" and _index(self.head)):
            raise ValueError(f"a metric head must be an integer >= 0 of an attn max_logit, got {self.head!r} for {self.stat}")
        if self.family in STACKLESS:
            for field in ("stack", "layer", "site"):
                _check(field, getattr(self, field), (None,))
            return
        _check("stack", self.stack, STACKS)
        if self.layer is not None and not _index(self.layer):
            raise ValueError(f"metric layer must be an integer >= 0 or None, got {self.layer!r}")
        if self.family == "act":
            _check("site", self.site, STACK_SITES if self.layer is None else BLOCK_SITES)
            _check(f"site of {self.stat}", self.site, ACT_STAT_SITES.get(self.stat, (self.site,)))
            return
        if self.family == "hc":  # a whole stack's residual path
            _check("layer", self.layer, (None,))
            _check("site", self.site, (None,))
            return
        if self.family == "bstat" and self.layer is None:  # a stack's final norm
            _check("site", self.site, ("final_norm",))
            return
        if self.layer is None:
            raise ValueError(f"a {self.family} metric needs a layer, got None")
        _check("site", self.site, _BLOCK_SITES_OF.get(self.family, (None,)))
        if self.family == "update":  # a block's ratio and Adam RMS; a matrix's update RMS and ratio
            _check(f"stat at {self.site}", self.stat, ("ratio", "adam_rms") if self.site is None else ("rms", "ratio"))
        if self.family == "scale":  # a temperature belongs to an attention, a gain to a norm or a gate
            assert self.site is not None  # checked against the scale sites just above
            _check(f"stat at {self.site}", self.stat, SCALE_SITE_STATS[self.site])

    @property
    def where(self) -> str | None:
        """``{stack}[.{layer}][.{site}]``, the middle of :attr:`name` (``dec.1.cross_attn.k_norm``,
        ``enc.final_norm``); None for a stack-less family."""
        if self.stack is None:
            return None
        parts = [self.stack, *([] if self.layer is None else [str(self.layer)]), *([] if self.site is None else [self.site])]
        parts += [] if self.head is None else [f"h{self.head}"]
        return ".".join(parts)

    @property
    def name(self) -> str:
        """``{family}/{stack}[.{layer}][.{site}]/{stat}``, e.g. ``act/dec.1.cross_attn.k_norm/rms``;
        ``{family}/{stat}`` for a stack-less family, e.g. ``out/logz``."""
        return f"{self.family}/{self.stat}" if self.where is None else f"{self.family}/{self.where}/{self.stat}"

    @property
    def block(self) -> str | None:
        """``{stack}.{layer}`` (``enc.0``), or None for a stack site."""
        return None if self.layer is None else f"{self.stack}.{self.layer}"


def _index(value: object) -> bool:  # a layer or head index
    return isinstance(value, int) and value >= 0


def _check(field: str, value: object, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"unknown metric {field} {value!r}; valid: {', '.join(map(str, valid))}")


def parse(name: str) -> Metric | None:
    """The :class:`Metric` whose :attr:`~Metric.name` is ``name``, or None when ``name`` is not a
    telemetry metric (``train/loss``, ``act/rms_vs_depth``, an unknown site or stat)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    layer, head = (None if m[k] is None else int(m[k]) for k in ("layer", "head"))
    try:
        return Metric(m["family"], m["stack"], layer, m["site"], m["stat"], head)
    except ValueError:
        return None


def derive_stats(raw: dict[str, float]) -> dict[str, float]:
    """The stats of ``STATS`` that the raw sums ``telemetry/activations.py`` takes of one site's real
    elements on the device allow (definitions, sources and Gaussian baselines: docs/telemetry.md):

    - ``sumsq`` = sum x^2, ``sum`` = sum x, ``maxabs`` = max |x|, ``n`` = their count: rms, mean,
      maxabs, crest, always;
    - ``chan_m2``, ``chan_m4`` = the means over channels j of s_j^2 and s_j^4, s_j^2 = mean over real
      positions of x_j^2: kurtosis = chan_m4 / chan_m2^2 (He et al. 2024, arXiv 2405.19279, eq. 1; 0 when x = 0);
    - ``cos_sum`` = the sum over sequences of their mean pairwise token cosine, ``cos_seqs`` = the number
      of sequences with 2 or more real tokens: token_cos = cos_sum / cos_seqs (left out when cos_seqs = 0);
    - ``median_abs`` = the median of |x| (the lower middle value): massive = maxabs / median_abs (Sun et al. 2024);
    - ``saturated`` = the count of elements within 1 % of a bounded norm's bound: saturation = saturated / n.
    """
    rms = math.sqrt(raw["sumsq"] / raw["n"])
    out = {"rms": rms, "mean": raw["sum"] / raw["n"], "maxabs": raw["maxabs"], "crest": raw["maxabs"] / rms if rms else 0.0}
    if "chan_m4" in raw:
        out["kurtosis"] = raw["chan_m4"] / raw["chan_m2"] ** 2 if raw["chan_m2"] else 0.0
    if raw.get("cos_seqs"):
        out["token_cos"] = raw["cos_sum"] / raw["cos_seqs"]
    if raw.get("median_abs"):  # left out when half the elements are 0
        out["massive"] = raw["maxabs"] / raw["median_abs"]
    if "saturated" in raw:
        out["saturation"] = raw["saturated"] / raw["n"]
    return out


def act_stats(site: str) -> tuple[str, ...]:
    """The stats of ``STATS`` an ``act`` metric may have at ``site`` (``ACT_STAT_SITES``)."""
    return tuple(stat for stat in STATS if site in ACT_STAT_SITES.get(stat, (site,)))


def act(stack: str, layer: int | None, site: str, stat: str) -> Metric:
    """``act/{stack}.{layer}.{site}/{stat}``, or ``act/{stack}.{site}/{stat}`` for a stack site (layer None)."""
    return Metric("act", stack, layer, site, stat)


def site_name(stack: str, layer: int | None, site: str) -> str:
    """``{stack}.{layer}.{site}``, or ``{stack}.{site}`` for a stack site (layer None): the site part of every
    ``act`` metric there (``enc.0.ffn.norm_in``, ``dec.final_norm``), for results kept per site outside telemetry
    (``training.probes.batch_dependence``). Raises ValueError as :func:`act` does."""
    where = act(stack, layer, site, "rms").where
    assert where is not None  # an act metric has a stack
    return where


def grad_norm(stack: str, layer: int) -> Metric:
    """``grad/{stack}.{layer}/norm``."""
    return Metric("grad", stack, layer, stat="norm")


def update_ratio(stack: str, layer: int) -> Metric:
    """``update/{stack}.{layer}/ratio``."""
    return Metric("update", stack, layer, stat="ratio")


def matrix_update(stack: str, layer: int, matrix: str, stat: str) -> Metric:
    """``update/{stack}.{layer}.{matrix}/{stat}``, ``matrix`` in ``WEIGHT_SITES``, ``stat`` ``rms`` or ``ratio``."""
    return Metric("update", stack, layer, matrix, stat)


def adam_rms(stack: str, layer: int) -> Metric:
    """``update/{stack}.{layer}/adam_rms``."""
    return Metric("update", stack, layer, stat="adam_rms")


def attn_stat(stack: str, layer: int, attention: str, stat: str) -> Metric:
    """``attn/{stack}.{layer}.{attention}/{stat}``, ``stat`` ``entropy`` or ``sink_mass`` (max_logit: :func:`attn_max_logit`)."""
    return Metric("attn", stack, layer, attention, stat)


def matrix_site(residual: str, role: str) -> str:
    """The ``weight`` site of the matrix playing ``role`` (a ``linear_roles()`` key, ``MATRIX_ROLES``) in
    residual sublayer ``residual``: the residual, then the role's name inside its module
    (``self_attn``, ``attn.q`` -> ``self_attn.q``; ``ffn``, ``ffn.in`` -> ``ffn.in``).

    Raises:
        ValueError: a (residual, role) pair that is not a block matrix (the message lists the valid ones).
    """
    _check("(residual, role)", (residual, role), tuple(_MATRIX_SITES))
    return _MATRIX_SITES[residual, role]


def matrix_role(site: str) -> tuple[str, str]:
    """The (residual, ``linear_roles()`` role) of the ``WEIGHT_SITES`` matrix ``site``, the inverse of
    :func:`matrix_site` (``cross_attn.q`` -> ``cross_attn``, ``attn.q``; ``ffn.in`` -> ``ffn``, ``ffn.in``).

    Raises:
        ValueError: a site outside ``WEIGHT_SITES`` (the message lists the valid ones).
    """
    _check("matrix site", site, WEIGHT_SITES)
    return next(pair for pair, name in _MATRIX_SITES.items() if name == site)


def weight_spectrum(stack: str, layer: int, matrix: str, stat: str) -> Metric:
    """``weight/{stack}.{layer}.{matrix}/{stat}``, ``matrix`` in ``WEIGHT_SITES``, ``stat`` in ``WEIGHT_STATS``."""
    return Metric("weight", stack, layer, matrix, stat)


def learned_scale(stack: str, layer: int, site: str, stat: str) -> Metric:
    """``scale/{stack}.{layer}.{site}/{stat}``, ``stat`` in ``SCALE_SITE_STATS[site]``."""
    return Metric("scale", stack, layer, site, stat)


def attn_max_logit(stack: str, layer: int, attention: str, head: int | None = None) -> Metric:
    """``attn/{stack}.{layer}.{attention}/max_logit``, or with ``head`` that head's ``attn/.../{attention}.h{head}/max_logit``."""
    return Metric("attn", stack, layer, attention, "max_logit", head)


def batch_stat_dist(stack: str, layer: int | None, site: str, statistic: str) -> Metric:
    """``bstat/{stack}.{layer}.{site}/{statistic}_dist`` at a residual norm slot (``RESIDUAL_NORM_SITES``), or
    ``bstat/{stack}.final_norm/{statistic}_dist`` (layer None, site ``final_norm``): the distance between the
    batch's and the running value of ``statistic``, one of ``BATCH_STATISTICS``.

    Raises:
        ValueError: an unknown statistic or site (the message lists the valid ones).
    """
    _check("batch statistic", statistic, BATCH_STATISTICS)
    return Metric("bstat", stack, layer, site, f"{statistic}_dist")


def hc_gain(stack: str, stat: str) -> Metric:
    """``hc/{stack}/{stat}``: the composite residual gain of a stack's hyper-connections (``fwd_gain``, ``bwd_gain``)."""
    return Metric("hc", stack, stat=stat)


def output_logits(stat: str) -> Metric:
    """``out/{stat}``, ``stat`` in ``FAMILY_STATS["out"]`` (``logz``, ``max_logit``): the output logits."""
    return Metric("out", None, stat=stat)


def adam_below_eps() -> Metric:
    """``optim/below_eps``: the optimizer state's share of coordinates where eps dominates Adam's denominator."""
    return Metric("optim", None, stat="below_eps")


def qk_clip_stat(stat: str) -> Metric:
    """``optim/qk_clip_{stat}``, ``stat`` ``count`` or ``min_factor``: the heads QK-Clip scaled at the recorded step
    and the smallest factor (``training.qk_clip``).

    Raises:
        ValueError: another stat.
    """
    return Metric("optim", None, stat=f"qk_clip_{stat}")


def depth(stack: str, layer: int, n_enc_layers: int) -> int:
    """The block's position in the depth order: encoder block i at i, decoder block i at n_enc_layers + i.

    Raises:
        ValueError: an unknown stack.
    """
    _check("stack", stack, STACKS)
    return layer + (n_enc_layers if stack == "dec" else 0)


def blocks(n_enc_layers: int, n_dec_layers: int) -> Iterator[tuple[str, int]]:
    """(stack, layer) of every block in depth order."""
    for stack, n in zip(STACKS, (n_enc_layers, n_dec_layers), strict=True):
        yield from ((stack, i) for i in range(n))


def n_enc_layers_seen(seen: Iterable[tuple[str | None, int | None]]) -> int:
    """1 + the largest encoder block index among the (stack, layer) pairs ``seen`` (0 when none; a pair without a
    layer, a stack site's, counts for nothing): the encoder's depth as far as the data shows, for :func:`depth` when
    the model config is not at hand."""
    return 1 + max((layer for stack, layer in seen if stack == "enc" and layer is not None), default=-1)


def depth_profile(stats: dict[str, float], stat: str = "rms") -> dict[str, list[tuple[int, float]]]:
    """Per-block metrics ``act/{enc|dec}.{i}.{site}/{stat}`` as lines of (depth, value) per site.

    Depth runs over the encoder, then the decoder (decoder block i sits at n_enc_layers + i, with n_enc_layers taken
    from the metrics), so one axis spans the whole model. Sites outside blocks (embed, final_norm) are left out.
    """
    parsed = ((parse(k), v) for k, v in stats.items())
    # (stack, layer, site, value); a block's act metric has all three
    found = [(m.stack, m.layer, m.site, v) for m, v in parsed if m and m.family == "act" and m.stat == stat]
    blocks = [(stack, layer, site, v) for stack, layer, site, v in found if stack and layer is not None and site]
    n_enc = n_enc_layers_seen((stack, layer) for stack, layer, _, _ in blocks)
    lines: dict[str, list[tuple[int, float]]] = {}
    for stack, layer, site, value in blocks:
        lines.setdefault(site, []).append((depth(stack, layer, n_enc), value))
    return lines
