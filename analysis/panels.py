"""The report's charts as plain data: :func:`build_panels` returns :class:`Panel` / :class:`Line` records
that ``scripts/report.py`` renders twice, once with plotly (the HTML page) and once with matplotlib (PNGs).

Nothing here draws. Each variant gets a mean curve drawn only where every run has a finite value
(:func:`analysis.stats.mean_band`), and each diverged run a marker at its last finite point
(:func:`divergence_marks`).
"""

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from analysis.stats import Values, mean_at, mean_band
from analysis.variants import Variant, averaged_runs
from runlog.tasks import TaskSpec

DASHES = ("dot", "dash", "solid")  # profile lines, earliest step first


@dataclass
class Line:
    """One curve of a panel. ``role``: ``run`` (one run), ``mean`` (a variant's mean over its runs, with
    ``lo``/``hi`` its band: min-max, or ± the standard error), ``diverged`` (one point: where a diverged run
    stopped), ``profile`` (a variant's value vs depth at one step), ``series`` (one of several curves vs step
    of one variant's panel, e.g. one per block) or ``interval`` (points with ``lo``/``hi`` as error bars, e.g. a
    confidence interval; no bars where they are None). ``hover``: a text per point (e.g. ``n = 2 of 3``), or None.
    ``shade``: for lines told apart by order rather than by variant (blocks by depth, matrices in forward
    order), the line's place on a sequential colour scale, 0 first to 1 last; None: the variant's colour."""

    name: str
    variant: str
    role: str
    x: Sequence[float]
    y: Sequence[float | None]
    lo: list[float | None] | None = None
    hi: list[float | None] | None = None
    dash: str = "solid"
    hover: list[str] | None = None
    shade: float | None = None

    @property
    def isolated(self) -> list[int]:
        """Indices of finite points with no finite neighbour: a line through them draws nothing, so the
        renderers put a marker there (one evaluation in a run, or a mean complete at a single step)."""
        present = [False, *(v is not None and math.isfinite(v) for v in self.y), False]  # padded: no neighbour off the ends
        return [i - 1 for i in range(1, len(present) - 1) if present[i] and not present[i - 1] and not present[i + 1]]

    def band_outline(self) -> tuple[list[float | None], list[float | None]]:
        """(x, y) of the band between ``lo`` and ``hi``: a closed outline per stretch of consecutive points where both
        are known, along ``hi`` forward, then back along ``lo``, the outlines separated by None (plotly's
        ``fill="toself"`` fills each on its own). No edge spans a gap: two traces filled ``tonexty`` draw a
        straight edge across one. ([], []) without a band."""
        lo, hi = self.lo or [], self.hi or []
        x: list[float | None] = []
        y: list[float | None] = []
        stretch: list[int] = []
        for i, known in enumerate([*(a is not None and b is not None for a, b in zip(lo, hi, strict=True)), False]):
            if known:
                stretch.append(i)
                continue
            if stretch:  # the sentinel False closes the last stretch
                x += [*([None] if x else []), *(self.x[j] for j in stretch), *(self.x[j] for j in reversed(stretch))]
                y += [*([None] if y else []), *(hi[j] for j in stretch), *(lo[j] for j in reversed(stretch))]
            stretch = []
        return x, y


@dataclass
class Heatmap:
    """A step x block chart of one variant's ``stat`` at ``site`` (``rms`` at ``out``), in the form
    ``reporting/scales.py`` draws one run's: ``profiles`` step -> site -> [(depth, value)]; ``n_enc`` the encoder's
    blocks (decoder block i at depth ``n_enc + i``)."""

    variant: str
    profiles: dict[int, dict[str, list[tuple[int, float]]]]
    site: str
    stat: str
    n_enc: int


@dataclass
class Panel:
    """A chart: ``key`` is its file stem (``loss`` -> loss.png); ``note`` explains an empty chart, or what a chart
    with lines leaves out (drawn at its centre without lines, at its bottom with them);
    ``integer_x``: x is a block index (integer ticks); ``log_x``, ``log_y``: log-scale axes; ``diverged_label``:
    what its ``diverged`` markers mean, for the PNG's legend (empty: a diverged run's last finite value);
    ``heatmap``: a step x block heatmap drawn instead of lines."""

    key: str
    title: str
    xlabel: str
    ylabel: str
    lines: list[Line]
    log_y: bool = False
    note: str = ""
    integer_x: bool = False
    log_x: bool = False
    diverged_label: str = ""
    heatmap: Heatmap | None = None


def pick_steps(steps: Iterable[int], n: int) -> list[int]:
    """Up to ``n`` of ``steps``: the first, the last and evenly spaced ones between (sorted, unique); the last
    alone for ``n = 1``."""
    ordered = sorted(set(steps))
    if len(ordered) <= n:
        return ordered
    if n == 1:
        return ordered[-1:]
    return sorted({ordered[round(j * (len(ordered) - 1) / (n - 1))] for j in range(n)})


def profile_lines(variant: Variant, profile: str, n_steps: int) -> Iterator[Line]:
    """One line per chosen telemetry step of ``variant``: value vs depth, the mean over the runs recorded
    at that step; its name ends in ``(n = k of N)`` when only k of the variant's N averaged runs were.
    ``profile`` names a by-depth profile of ``Run.profiles`` (``rms``, ``grad``, ...: ``analysis.load.PROFILES``)."""
    records = [r.profile(profile) for r in averaged_runs(variant.runs)]
    chosen = pick_steps((s for rec in records for s in rec), min(n_steps, len(DASHES)))
    for j, step in enumerate(chosen):
        mean = mean_at(records, step)
        depths = sorted(mean)
        dash = DASHES[len(DASHES) - len(chosen) + j]  # the last step solid, earlier ones dashed
        yield Line(
            f"{variant.shown} @ step {step}{runs_at(records, step)}",
            variant.label,
            "profile",
            depths,
            [mean[d] for d in depths],
            dash=dash,
        )


def runs_at(records: list[dict], step: int) -> str:
    """`` (n = k of N)`` when only k of the N per-run ``records`` (step -> ...) have ``step``, else empty."""
    k = sum(step in rec for rec in records)
    return f" (n = {k} of {len(records)})" if k < len(records) else ""


def mean_line(variant: Variant, metric: str, scale: float) -> Line:
    """The variant's mean curve with its min-max band (see :func:`mean_band`); each point's hover says ``n = k of N``."""
    runs = averaged_runs(variant.runs)
    steps, mean, lo, hi, n = mean_band(runs, metric)
    left_out = len(variant.runs) - len(runs)
    name = f"{variant.shown} (mean of {len(runs)}" + (f"; {left_out} logged nothing)" if left_out else ")")
    return Line(
        name,
        variant.label,
        "mean",
        steps,
        _scaled(mean, scale),
        _scaled(lo, scale),
        _scaled(hi, scale),
        hover=[f"n = {k} of {len(runs)}" for k in n],
    )


def divergence_marks(variant: Variant, metric: str, scale: float) -> Iterator[Line]:
    """A one-point ``diverged`` line per diverged run of ``variant``: its last finite value of ``metric`` at or
    before the divergence step (none when it has no such value)."""
    for run in variant.runs:
        if not run.diverged:
            continue
        at = run.diverged_at
        points = [(s, v) for s, v in run.series.get(metric, []) if v is not None and (at is None or s <= at)]
        if points:
            step, value = points[-1]
            text = f"{run.label}: diverged at step {at if at is not None else '?'}"
            yield Line(text, variant.label, "diverged", [step], [value * scale], hover=[text])


def _scaled(values: Values, scale: float) -> Values:
    return [None if v is None else v * scale for v in values]


def curve_panel(variants: list[Variant], key: str, metric: str, title: str, ylabel: str, scale: float = 1.0) -> Panel:
    """Metric vs step: one thin line per run (every run, even one with no values), per variant the mean over
    its runs with a min-max band (:func:`mean_line`), and a marker where each diverged run stopped.
    Values are multiplied by ``scale``."""
    lines = []
    for variant in variants:
        for run in variant.runs:
            points = run.series.get(metric, [])
            lines.append(Line(run.label, variant.label, "run", [s for s, _ in points], _scaled([v for _, v in points], scale)))
        lines.append(mean_line(variant, metric, scale))
        lines.extend(divergence_marks(variant, metric, scale))
    has_data = any(v is not None for line in lines for v in line.y)
    return Panel(key, title, "training step", ylabel, lines, note="" if has_data else f"no run logged {metric}")


def depth_panel(variants: list[Variant], key: str, profile: str, n_steps: int, title: str, ylabel: str) -> Panel:
    """The profile ``profile`` vs depth (encoder blocks, then decoder blocks) at ``n_steps`` steps per variant, log scale."""
    lines = [line for v in variants for line in profile_lines(v, profile, n_steps)]
    note = "" if lines else "no telemetry recorded (telemetry=off?)"
    return Panel(key, title, "block (encoder, then decoder)", ylabel, lines, log_y=True, note=note, integer_x=True)


def build_panels(variants: list[Variant], task: TaskSpec) -> list[Panel]:
    """The report's charts, in page order (see the module docstring of report.py); the third is ``task``'s headline metric."""
    m = task.metric(task.headline)
    return [
        curve_panel(variants, "loss", "train/loss", "Training loss", "train loss"),
        curve_panel(variants, "val_loss", "val/loss", "Validation loss", "valid loss"),
        curve_panel(variants, f"val_{m.key}", f"val/{m.key}", f"Validation {m.label}", f"valid {m.header}", m.scale),
        depth_panel(variants, "rms_vs_depth", "rms", 3, "Residual RMS vs depth (first, middle, last record)", "block output RMS"),
        depth_panel(variants, "grad_vs_depth", "grad", 2, "Gradient norm vs depth (first, last record)", "block gradient norm"),
    ]
