"""The residual stream's depth profile as numbers: the rows of the report's ``depth_profile.csv`` (every run's
telemetry by step and block) and ``depth_growth.csv`` (per variant, how much the stream's RMS grows from a stack's
first block to its last, at the first and the last telemetry record).

Growth of a stack in one record = RMS of the residual stream at its last block / at its first block, each block's
stream read where Xiong et al. 2020 (arXiv 2002.04745, Lemma 2) measure it, before any norm (:func:`stream_site`):

- a block whose last residual (the FFN) ends in a norm, ``x <- norm_out(alpha * x + F(.) [+ skip])`` (post, deepnorm,
  admin, keel, b2t, Mix-LN's post blocks): the sum entering that norm, ``act/{block}.ffn.norm_out.in/rms``. The
  block's ``out`` is that norm's output, RMS ~ its gain (1 at init) by construction, so it would show no growth
  whatever the stream does;
- any other block (pre, sandwich, lns, hybrid, res_post, ...): the stream leaving it, ``act/{block}.out/rms``, already
  un-normalized.

A block counts as the first kind when the run recorded its ``ffn.norm_out.in`` (the site exists only where
``norm_out`` is filled; telemetry group ``out``); runs written before that site existed read ``out`` everywhere. The
``site`` column of ``depth_growth.csv`` says which was read. With the default telemetry schedule the first record is
step 1, the forward pass before any update (the profile at initialization: docs/telemetry.md). It is the number
behind "pre-LN's residual stream grows with depth, post-LN's stays flat" (Xiong et al. 2020; Liu et al. 2020,
arXiv 2004.08249), read from a sweep's own runs.
"""

import json
from pathlib import Path

from analysis.csvs import write_csv
from analysis.runs import Run
from analysis.stats import mean_stderr
from analysis.variants import Variant
from runlog.metric_names import PRE_NORM_SITE, STACKS

PROFILE_COLUMNS = ("variant", "run", "seed", "step", "depth", "block", "rms", "grad", "kurtosis")
GROWTH_COLUMNS = ("variant", "stack", "site", "step_kind", "step", "n", "mean", "stderr", "per_run")
PRE_NORM = PRE_NORM_SITE["ffn"]  # the block's last residual's closing-norm input
STEP_KINDS = ("first", "last")  # the variant's earliest and latest telemetry record


def block_name(depth: int, n_enc: int) -> str:
    """The block at ``depth`` in the depth order (``metric_names.depth``'s inverse): ``enc.2``, or ``dec.0`` at ``n_enc``."""
    return f"enc.{depth}" if depth < n_enc else f"dec.{depth - n_enc}"


def profile_rows(variants: list[Variant]) -> list[dict[str, object]]:
    """One row per (run, telemetry step, depth) keyed by ``PROFILE_COLUMNS``, runs in the variants' order, then
    step and depth ascending: ``rms``, ``grad`` and ``kurtosis`` are the run's profiles of those names there
    (``Run.profile``), None where not recorded (or not finite). [] when no run recorded telemetry."""
    rows = []
    for variant in variants:
        for run in variant.runs:
            records = {name: run.profile(name) for name in ("rms", "grad", "kurtosis")}
            for step in sorted({s for rec in records.values() for s in rec}):
                for depth in sorted({d for rec in records.values() for d in rec.get(step, {})}):
                    rows.append(
                        {
                            "variant": variant.label,
                            "run": run.label,
                            "seed": run.seed,
                            "step": step,
                            "depth": depth,
                            "block": block_name(depth, run.n_enc),
                            **{k: rec.get(step, {}).get(depth) for k, rec in records.items()},
                        }
                    )
    return rows


def stack_ends(run: Run, stack: str) -> tuple[int, int] | None:
    """(depth of the first block, depth of the last block) of ``stack`` (``enc`` or ``dec``) among every block the run
    recorded an RMS of, at any step; None with fewer than two blocks (a one-block stack has no growth)."""
    depths = {d for rec in run.profile("rms").values() for d in rec if (d < run.n_enc) == (stack == "enc")}
    return (min(depths), max(depths)) if len(depths) > 1 else None


def stream_site(run: Run, depth: int) -> str:
    """Where :func:`growth` reads the residual stream of the block at ``depth``: ``ffn.norm_out.in`` (the sum entering
    its closing norm) when the run recorded that site there at any step, else ``out``."""
    return PRE_NORM if any(depth in record for record in run.profile("pre_norm_rms").values()) else "out"


def stream_rms(run: Run, depth: int, step: int) -> float | None:
    """The RMS of the block's residual stream at telemetry ``step``, read at :func:`stream_site`; None if not recorded."""
    source = "pre_norm_rms" if stream_site(run, depth) == PRE_NORM else "rms"
    return run.profile(source).get(step, {}).get(depth)


def growth_site(run: Run, stack: str) -> str | None:
    """The sites :func:`growth` reads at ``stack``'s first and last block: one name when they agree, else
    ``{first}->{last}`` (Mix-LN: ``ffn.norm_out.in->out``); None with fewer than two blocks."""
    ends = stack_ends(run, stack)
    if ends is None:
        return None
    first, last = (stream_site(run, d) for d in ends)
    return first if first == last else f"{first}->{last}"


def growth(run: Run, stack: str, step: int) -> float | None:
    """The run's ``stack`` growth at telemetry ``step``: the stream's RMS (:func:`stream_rms`) at its last block / at
    its first block; None when either was not recorded (finite) at that step, the first is 0, or the stack has fewer
    than two blocks."""
    ends = stack_ends(run, stack)
    if ends is None:
        return None
    first, last = (stream_rms(run, d, step) for d in ends)
    return None if first is None or last is None or first == 0 else last / first


def growth_rows(variants: list[Variant]) -> list[dict[str, object]]:
    """Per variant with RMS telemetry, stack (``enc``, ``dec``) and step kind (``first``, ``last``: the earliest and
    latest step any of its runs recorded), a row keyed by ``GROWTH_COLUMNS``: ``site``, where the stream was read
    (:func:`growth_site`; the runs' distinct answers joined by a space), the mean ± stderr
    (:func:`~analysis.stats.mean_stderr`) over the n runs with a :func:`growth` at that step, and ``per_run``, a JSON
    object run label -> growth. A run that stopped before the last step is left out of its ``last`` row."""
    rows = []
    for variant in variants:
        steps = sorted({s for run in variant.runs for s in run.profile("rms")})
        if not steps:
            continue
        for stack in STACKS:
            site = " ".join(sorted({s for run in variant.runs if (s := growth_site(run, stack)) is not None}))
            for kind, step in zip(STEP_KINDS, (steps[0], steps[-1]), strict=True):
                per_run = {run.label: g for run in variant.runs if (g := growth(run, stack, step)) is not None}
                mean, stderr = mean_stderr(list(per_run.values()))
                rows.append(
                    {
                        "variant": variant.label,
                        "stack": stack,
                        "site": site,
                        "step_kind": kind,
                        "step": step,
                        "n": len(per_run),
                        "mean": mean,
                        "stderr": stderr,
                        "per_run": json.dumps(per_run),
                    }
                )
    return rows


def write_depth_csvs(variants: list[Variant], out: Path) -> list[dict[str, object]]:
    """Write ``out/depth_profile.csv`` (:func:`profile_rows`) and ``out/depth_growth.csv`` (:func:`growth_rows`) when a
    run recorded block telemetry; nothing otherwise. Returns the growth rows ([] when nothing was written)."""
    profile = profile_rows(variants)
    if not profile:
        return []
    rows = growth_rows(variants)
    for name, columns, table in (("depth_profile.csv", PROFILE_COLUMNS, profile), ("depth_growth.csv", GROWTH_COLUMNS, rows)):
        write_csv(out / name, columns, ([row[c] for c in columns] for row in table))
    return rows
