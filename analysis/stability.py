"""The report's stability charts (issue 14) as plain data, beside :mod:`analysis.panels`' (same records, same
renderers), from the telemetry in each run's metrics.jsonl:

- attention max logit vs step, one panel per variant: a line per attention of each block (colour by depth,
  self-attention solid, cross-attention dashed), the mean over the variant's runs that recorded it;
- ``out/logz`` vs step: a line per variant, the mean over its runs with a ± standard-error band;
- spectral norm (``sigma_max``) vs depth at the last record, one panel per variant: a line per matrix
  (colour by kind in forward order, q, k, v, out, ffn.in, ffn.out; cross-attention dashed);
- batch-statistics distance (``bstat/``) vs step, one panel per variant and statistic (``mean_dist``,
  ``var_dist``, ``phi_dist``) where its runs have batch-reading norms: a line per norm of each block, drawn
  as the max logits are;
- block-output kurtosis, massive-activation ratio (max |x| / median |x|) and self-attention sink mass (the share on
  the first key) vs depth at the last record: a line per variant each;
- GPAS's SiLU(g) vs depth (``norm.gpas``: the share of each block's output it removes), first, middle and last
  record, linear y (SiLU(g) starts at 0 and may go below it): a line per variant and record.

A chart (or a variant's panel) with no data, e.g. from runs recorded before these metrics existed, is
left out, not drawn empty. Per-variant panels are keyed by the variant's place in the page's variant
table (``attn_max_logit_2``: the second variant).
"""

from analysis.panels import Line, Panel, depth_panel, profile_lines, runs_at
from analysis.runs import BlockSite, Run
from analysis.stats import curves_band, mean_at
from analysis.variants import Variant, averaged_runs
from runlog.metric_names import ATTENTIONS, BSTAT_STATS, MATRIX_ROLES, NORM_SLOTS, RESIDUALS, matrix_role, output_logits

CROSS = ATTENTIONS[1]


def _dash(residual: str) -> str:
    """Cross-attention lines dashed, self-attention and FFN ones solid."""
    return "dash" if residual == CROSS else "solid"


def _recorded(variant: Variant, profile: str) -> list[Run]:
    """The variant's averaged runs that recorded the profile ``profile`` (``Run.profiles``) at least once."""
    return [r for r in averaged_runs(variant.runs) if r.profile(profile)]


def max_logit_lines(variant: Variant) -> list[Line]:
    """One ``series`` line per attention (BlockSite) of ``variant``: max logit vs step, the mean over the runs
    that recorded max logits, drawn only at steps where each of them has this attention's value
    (:func:`curves_band`). Lines in depth order, self- before cross-attention."""
    return site_lines(variant, "max_logit")


def site_lines(variant: Variant, profile: str) -> list[Line]:
    """:func:`max_logit_lines` for any per-site profile of ``Run.profiles`` (``mean_dist``: one line per
    batch-reading norm), sites in depth order, then residual order (self-attention, cross-attention, FFN);
    cross-attention's dashed."""
    runs = _recorded(variant, profile)
    seen = {site for r in runs for rec in r.profile(profile).values() for site in rec}
    sites = sorted(seen, key=lambda s: (s.depth, *_site_order(s.site)))
    deepest = max((s.depth for s in sites), default=0)
    lines = []
    for site in sites:
        curves = [[(step, rec.get(site)) for step, rec in sorted(r.profile(profile).items())] for r in runs]
        steps, mean, _, _, n = curves_band(curves)
        lines.append(
            Line(
                f"{site.block} {site.site}",
                variant.label,
                "series",
                steps,
                mean,
                dash=_dash(_residual(site.site)),
                hover=[f"n = {k} of {len(runs)}" for k in n],
                shade=site.depth / max(deepest, 1),
            )
        )
    return lines


def _residual(site: str) -> str:
    """The residual sublayer of an attention (``self_attn``) or a norm slot (``cross_attn.norm_in``)."""
    return site.partition(".")[0]


def _site_order(site: str) -> tuple[int, int]:
    """Forward order within a block: residual (self-attention, cross-attention, FFN), then norm slot."""
    slot = site.partition(".")[2]
    return RESIDUALS.index(_residual(site)), NORM_SLOTS.index(slot) if slot else -1


def logz_line(variant: Variant) -> Line | None:
    """``out/logz`` vs step of ``variant``: the mean over the runs that logged it with a ± standard-error
    band (:func:`curves_band`, ``stderr``); None when none did."""
    metric = output_logits("logz").name
    runs = [r for r in averaged_runs(variant.runs) if any(v is not None for _, v in r.series.get(metric, []))]
    if not runs:
        return None
    steps, mean, lo, hi, n = curves_band([r.series[metric] for r in runs], "stderr")
    return Line(
        f"{variant.shown} (mean ± stderr of {len(runs)})",
        variant.label,
        "mean",
        steps,
        mean,
        lo,
        hi,
        hover=[f"n = {k} of {len(runs)}" for k in n],
    )


def _matrix_order(site: str) -> tuple[int, int]:
    """Kind (forward order of ``MATRIX_ROLES``), then self- before cross-attention."""
    residual, role = matrix_role(site)
    return MATRIX_ROLES.index(role), int(residual == CROSS)


def sigma_max_lines(variant: Variant) -> tuple[int | None, str, list[Line]]:
    """(step, ``(n = k of N)`` or empty, lines) of ``variant``'s spectral norms vs depth at its last record step
    (the latest any of its runs recorded): one ``profile`` line per matrix site, the mean over the runs
    recorded at that step; step None and no lines when no run recorded any."""
    records = [r.profile("sigma_max") for r in _recorded(variant, "sigma_max")]
    step = max((s for rec in records for s in rec), default=None)
    if step is None:
        return None, "", []
    mean: dict[BlockSite, float] = mean_at(records, step)
    lines = []
    for matrix in sorted({s.site for s in mean}, key=_matrix_order):
        points = sorted((s.depth, v) for s, v in mean.items() if s.site == matrix)
        shade = _matrix_order(matrix)[0] / (len(MATRIX_ROLES) - 1)
        lines.append(
            Line(
                matrix,
                variant.label,
                "profile",
                [d for d, _ in points],
                [v for _, v in points],
                dash=_dash(matrix_role(matrix)[0]),
                shade=shade,
            )
        )
    return step, runs_at(records, step), lines


def stability_panels(variants: list[Variant]) -> list[Panel]:
    """The stability charts with data, in page order (see the module docstring)."""
    panels = []
    for j, variant in enumerate(variants, 1):
        if lines := max_logit_lines(variant):
            n = len(_recorded(variant, "max_logit"))
            panels.append(
                Panel(
                    f"attn_max_logit_{j}",
                    f"Attention max logit vs step: {variant.shown} (mean of {n})",
                    "training step",
                    "max logit q·k/√d_head",
                    lines,
                )
            )
    if logz := [line for v in variants if (line := logz_line(v))]:
        panels.append(Panel("out_logz", "Output log Z vs step", "training step", "mean log Z over target tokens", logz))
    for j, variant in enumerate(variants, 1):
        step, count, lines = sigma_max_lines(variant)
        if lines:
            title = f"Spectral norm vs depth at step {step}{count}: {variant.shown}"
            panels.append(
                Panel(
                    f"sigma_max_vs_depth_{j}",
                    title,
                    "block (encoder, then decoder)",
                    "sigma_max",
                    lines,
                    log_y=True,
                    integer_x=True,
                )
            )
    for j, variant in enumerate(variants, 1):
        for stat in BSTAT_STATS:
            if lines := site_lines(variant, stat):
                title = f"Batch vs running statistics, {stat} vs step: {variant.shown} (mean of {len(_recorded(variant, stat))})"
                ylabel = f"{stat} = ||batch - running|| / d_model"
                panels.append(Panel(f"bstat_{stat}_{j}", title, "training step", ylabel, lines, log_y=True))
    kurtosis = depth_panel(
        variants,
        "kurtosis_vs_depth",
        "kurtosis",
        1,
        "Block-output kurtosis vs depth (last record)",
        "kurtosis of the block output",
    )
    # the two diagnostics of attention sinks and massive activations (docs/telemetry.md), as kurtosis
    massive = depth_panel(
        variants,
        "massive_vs_depth",
        "massive",
        1,
        "Massive activations vs depth (last record)",
        "block output max |x| / median |x|",
    )
    sink = depth_panel(
        variants,
        "sink_vs_depth",
        "sink_mass",
        1,
        "Attention sink vs depth (last record)",
        "self-attention share on the first key",
    )
    gpas = [line for v in variants for line in profile_lines(v, "gpas_silu_g", 3)]
    gpas_panel = Panel(
        "gpas_vs_depth",
        "GPAS SiLU(g) vs depth (first, middle, last record)",
        "block (encoder, then decoder)",
        "SiLU(g): share of the block output removed",
        gpas,
        integer_x=True,
    )
    depth_charts = [p for p in (kurtosis, massive, sink) if p.lines]
    return [*panels, *depth_charts, *([gpas_panel] if gpas else [])]
