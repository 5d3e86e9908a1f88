"""The ``telemetry`` config group, typed: what to record and how often. Torch-free, so a run's config
validates before torch loads (``training.schema``)."""

from dataclasses import dataclass

from runlog.metric_names import SITE_GROUPS, STATS


@dataclass(frozen=True)
class TelemetryConfig:
    """What to record and how often.

    Attributes:
        every: steps between records; 0 turns telemetry off.
        sites: activation site groups, a subset of ``SITE_GROUPS``.
        stats: statistics per site, a subset of ``STATS``; ``token_cos``, ``massive`` and ``saturation`` are taken
            only at the sites that define them (``ACT_STAT_SITES``; saturation where the norm's kind is bounded,
            ``model.kinds``).
        grads: record ``grad/{s}.{i}/norm``.
        updates: record ``update/{s}.{i}/ratio`` (copies the weights before the step).
        weights: record ``weight/{s}.{i}.{m}/{sigma_max|stable_rank}`` of every block matrix.
        scales: record ``scale/{s}.{i}.{site}/{stat}``, every learned norm gain, gate and temperature.
        attn_entropy: record ``attn/.../entropy`` (from the attention logits, written out from q and k).
        attn_max_logit: record ``attn/.../max_logit`` (the same logits: computed once when both are on).
        attn_sink_mass: record ``attn/.../sink_mass``, the share of attention on the first key (from the weights
            the attention applies, written out from the same q and k).
        logits: record ``out/logz`` and ``out/max_logit`` from the training step's output logits.
        adam: record ``update/{s}.{i}/adam_rms`` and ``optim/below_eps`` from AdamW's state after the step.
        batch_stats: record ``bstat/.../{mean_dist|var_dist|phi_dist}`` at every batch-reading norm (BatchNorm,
            PowerNorm): the batch's statistics against the running ones; nothing where the model has none.

    Raises:
        ValueError: an unknown site or stat (the message lists the valid ones), or every < 0.
    """

    every: int = 50
    sites: tuple[str, ...] = SITE_GROUPS
    stats: tuple[str, ...] = tuple(s for s in STATS if s != "massive")  # telemetry=light's; full adds massive
    grads: bool = True
    updates: bool = False
    attn_entropy: bool = False
    weights: bool = True
    scales: bool = True
    attn_max_logit: bool = True
    attn_sink_mass: bool = False
    logits: bool = True
    adam: bool = True
    batch_stats: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"telemetry.every must be an integer >= 0, got {self.every!r}")
        for key, given, valid in (("sites", self.sites, SITE_GROUPS), ("stats", self.stats, STATS)):
            unknown = [v for v in given if v not in valid]
            if unknown:
                raise ValueError(f"unknown telemetry.{key} {unknown}; valid {key}: {', '.join(valid)}")
        object.__setattr__(self, "sites", tuple(self.sites))
        object.__setattr__(self, "stats", tuple(self.stats))
