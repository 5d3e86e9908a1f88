"""The report's LR-sensitivity charts (:mod:`analysis.lrs`) as plain data, beside :mod:`analysis.panels`' (same
records, same renderers); only for a sweep with an LR axis (:func:`analysis.lrs.lr_study` not None):

- ``lr_loss``: final validation loss vs peak LR (log x), one line per family: the mean over its seeds with an
  LRS of min(l(eta), l0), the quantity LRS averages, with a ± standard-error band; an ``x`` at each LR where
  any run of the family diverged;
- ``lrs``: each family's LRS, the mean over seeds with its 95 % confidence interval as error bars, one point
  per family at x = its row in the LR-sensitivity table;
- ``attn_max_logit_lr_<j>``: for the j-th highest LR of the sweep (j = 1, 2, 3), max attention logit vs step,
  one line per family: at each telemetry step the max over a run's attentions of ``attn/.../max_logit``, the
  mean over the family's seeds whose run at that LR recorded it, with a min-max band.

A chart with no data (no seed with an LRS; no max logits recorded at that LR) is left out, not drawn empty, unless
a family is missing from it because none of its seeds learned at any LR of the grid: ``lr_loss`` and ``lrs`` then
carry a note naming those families (:func:`not_learned_note`), drawn under their points, or alone on an empty chart.
"""

from analysis.lrs import NOT_LEARNED, Family, LRStudy
from analysis.panels import Line, Panel
from analysis.stats import curves_band

TOP_LRS = 3  # max-logit charts: the highest LRs, where instabilities show first
LR_AXIS = "peak learning rate (optim.lr)"
MAX_LOGIT_AXIS = "max logit q·k/√d_head (max over attentions)"


def lr_loss_lines(family: Family) -> list[Line]:
    """The family's mean capped loss vs LR with its ± stderr band (none for one seed), and an ``x`` (``diverged``)
    on the mean at each LR where any of the family's runs diverged; no lines without an averaged seed."""
    n = len(family.averaged)
    if not n:
        return []
    band = family.capped_band
    mean = [m for m, _ in band]
    lo = [None if m is None or e is None else m - e for m, e in band]
    hi = [None if m is None or e is None else m + e for m, e in band]
    hover = [f"n = {n} seed{'s' * (n > 1)}; {family.n_diverged(lr)} run(s) diverged" for lr in family.grid]
    lines = [Line(f"{family.label} (mean ± stderr of {n})", family.label, "mean", family.grid, mean, lo, hi, hover=hover)]
    marks = [(lr, m) for lr, m in zip(family.grid, mean, strict=True) if family.n_diverged(lr)]
    if marks:
        text = [f"lr {lr:g}: {family.n_diverged(lr)} run(s) diverged, counted as the loss at init" for lr, _ in marks]
        lines.append(
            Line(f"{family.label} diverged", family.label, "diverged", [x for x, _ in marks], [y for _, y in marks], hover=text)
        )
    return lines


def lrs_line(j: int, family: Family) -> Line | None:
    """The family's LRS at x = ``j``: the mean over seeds, its 95 % CI as ``lo``/``hi`` (None for one seed);
    None without an averaged seed."""
    mean, stderr = family.mean_stderr
    if mean is None:
        return None
    ci, n, k = family.ci95, len(family.values), len(family.not_learned)
    spread = "" if ci is None else f" ± {stderr:.4f}, 95% CI [{ci[0]:.4f}, {ci[1]:.4f}]"
    seeds = f"n = {n}" + (f"; {k} did not learn" if k else "")
    return Line(
        f"{family.label} ({seeds})",
        family.label,
        "interval",
        [j],
        [mean],
        None if ci is None else [ci[0]],
        None if ci is None else [ci[1]],
        hover=[f"{family.label}: LRS {mean:.4f}{spread} (n = {n})"],
    )


def max_logit_line(family: Family, lr: float) -> Line | None:
    """Max attention logit vs step of the family's runs at ``lr`` (one per seed) that recorded max logits: the
    mean over them of the max over each run's attentions, with a min-max band, drawn only at steps where each of
    them has a value (:func:`curves_band`); None when none recorded."""
    runs = [c.run for s in family.seeds for c in s.cells if c.lr == lr and c.run is not None and c.run.profile("max_logit")]
    if not runs:
        return None
    curves = [[(step, max(rec.values())) for step, rec in sorted(r.profile("max_logit").items()) if rec] for r in runs]
    steps, mean, lo, hi, n = curves_band(curves)
    return Line(
        f"{family.label} (mean of {len(runs)})",
        family.label,
        "mean",
        steps,
        mean,
        lo,
        hi,
        hover=[f"n = {k} of {len(runs)}" for k in n],
    )


def not_learned_note(study: LRStudy) -> str:
    """``left out, did not learn at any LR of the grid: FAMILY; ...`` for the families with a seed that did not learn
    (no LRS, no mean capped loss), or ""."""
    left = [f.label for f in study.families if f.not_learned]
    return f"left out, {NOT_LEARNED}: {'; '.join(left)}" if left else ""


def lr_panels(study: LRStudy | None) -> list[Panel]:
    """The LR-sensitivity charts with data or a note, in page order (see the module docstring); [] without an LR axis."""
    if study is None:
        return []
    panels, note = [], not_learned_note(study)
    if (lines := [line for f in study.families for line in lr_loss_lines(f)]) or note:
        title = "Final validation loss vs peak LR: min(loss, loss at init), the quantity LRS averages (mean ± stderr over seeds)"
        panels.append(
            Panel(
                "lr_loss",
                title,
                LR_AXIS,
                "min(final valid loss, loss at init) (nats/token)",
                lines,
                log_x=True,
                diverged_label="x: a run at this LR diverged (counted as the loss at init)",
                note=note,
            )
        )
    if (points := [line for j, f in enumerate(study.families, 1) if (line := lrs_line(j, f))]) or note:
        panels.append(
            Panel(
                "lrs",
                "LR sensitivity per family: mean over seeds, 95% CI (t, n - 1 dof)",
                "family (row of the LR sensitivity table; legend)",
                "LR sensitivity (nats/token)",
                points,
                integer_x=True,
                note=note,
            )
        )
    top = sorted({lr for f in study.families for lr in f.grid}, reverse=True)[:TOP_LRS]
    for j, lr in enumerate(top, 1):
        if lines := [line for f in study.families if (line := max_logit_line(f, lr))]:
            title = f"Max attention logit vs step at lr = {lr:g} (max over a run's attentions; mean over seeds, min-max band)"
            # log y: at a high LR one family's logits can be 1,000 times another's (pre-LN vs QK-norm)
            panels.append(Panel(f"attn_max_logit_lr_{j}", title, "training step", MAX_LOGIT_AXIS, lines, log_y=True))
    return panels
