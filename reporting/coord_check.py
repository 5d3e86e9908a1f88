"""The coordinate check's figure and CSVs (``python -m scripts.coord_check``; the measurement: ``training.coord_check``).

The figure of one family: a row per parametrization (sp, mup), a column per step (0: at init), and in each panel the
RMS of a few sites against the width, both axes logarithmic: the output logits, the source embedding and the last
encoder and decoder blocks' branch outputs. A flat line is a size that does not depend on the width."""

import csv
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from training.coord_check import LOGITS, Coord, coord_check, slopes
from training.match_params import model_config

ROWS_CSV = ("family", "parametrization", "width", "step", "site", "rms")
SLOPES_CSV = ("family", "parametrization", "step", "site", "slope")


def shown_sites(sites: set[str]) -> list[str]:
    """The logits, ``enc.embed`` and the last encoder and decoder blocks' branch outputs among ``sites``."""
    last = {stack: max(int(m.group(1)) for s in sites if (m := re.match(rf"{stack}\.(\d+)\.", s))) for stack in ("enc", "dec")}
    wanted = [LOGITS, "enc.embed"] + [f"enc.{last['enc']}.{b}" for b in ("self_attn", "ffn")]
    wanted += [f"dec.{last['dec']}.{b}" for b in ("self_attn", "cross_attn", "ffn")]
    return [s for s in wanted if s in sites]


def figure(rows: list[Coord], family: str, path: Path) -> Path:
    """Draw ``family``'s coordinate check (the module docstring) into ``path`` (PNG); returns it."""
    params = sorted({r.parametrization for r in rows}, key=["sp", "mup"].index)
    steps = sorted({r.step for r in rows})
    sites = shown_sites({r.site for r in rows})
    fig, axes = plt.subplots(len(params), len(steps), figsize=(3.2 * len(steps), 3.0 * len(params)), sharex=True, squeeze=False)
    for i, param in enumerate(params):
        for j, step in enumerate(steps):
            ax = axes[i][j]
            for site in sites:
                points = sorted((r.width, r.rms) for r in rows if (r.parametrization, r.step, r.site) == (param, step, site))
                ax.plot(*zip(*points, strict=True), marker="o", label=site)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{param}, step {step}", fontsize=9)
            if i == len(params) - 1:
                ax.set_xlabel("d_model")
            if j == 0:
                ax.set_ylabel("RMS")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"coordinate check: {family}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_rows(path: Path, family_rows: dict[str, list[Coord]]) -> None:
    """Every family's RMS rows into ``path`` (CSV, columns ``ROWS_CSV``)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(ROWS_CSV)
        for family, rows in family_rows.items():
            out.writerows((family, r.parametrization, r.width, r.step, r.site, repr(r.rms)) for r in rows)


def write_slopes(path: Path, family_slopes: dict[str, dict[tuple[str, int, str], float]]) -> None:
    """Every family's slopes into ``path`` (CSV, columns ``SLOPES_CSV``)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(SLOPES_CSV)
        for family, slopes in family_slopes.items():
            out.writerows((family, p, step, site, repr(s)) for (p, step, site), s in slopes.items())


def run_families(
    overrides: list[str], families: list[list[str]], widths: list[int], base: int, steps: int, lr: float, out: Path
) -> list[str]:
    """``scripts.coord_check``'s work: each family's check (``training.coord_check``) on the model the overrides and
    then the family's compose (``training.match_params.model_config``), its PNG, then both CSVs into ``out``; returns
    a line per family and parametrization: the largest slope at the last step over the activation sites, the logits'.

    Raises:
        ValueError, hydra.errors.HydraException: a bad override, key or width (the message names the family first).
    """
    out.mkdir(parents=True, exist_ok=True)
    family_rows, family_slopes, lines = {}, {}, []
    for family in families:
        name = " ".join(family)
        try:
            family_rows[name] = coord_check(model_config([*overrides, *family]), sorted(widths), base, steps, lr)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        family_slopes[name] = slopes(family_rows[name])
        figure(family_rows[name], name, out / f"coord_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.png")
        for param in ("sp", "mup"):
            last = {site: s for (p, step, site), s in family_slopes[name].items() if p == param and step == steps}
            top = max(s for site, s in last.items() if site != LOGITS)
            lines.append(f"{name} {param}: step {steps}, largest slope of a site {top:+.2f}, logits' {last[LOGITS]:+.2f}")
    write_rows(out / "coord_check.csv", family_rows)
    write_slopes(out / "slopes.csv", family_slopes)
    return lines
