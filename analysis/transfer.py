"""Does the best learning rate transfer across width (or depth)? From an LR study run at several widths: per seed, the
best LR at each width and its shift per doubling of the width, with a confidence interval over the seeds.

The best LR of one seed's grid (one family at one width) is taken in log2(LR), between grid points: the vertex
of the parabola through the capped final losses (``analysis.lrs``: min(l(eta), l0)) at the grid's argmin and
its two neighbours, kept within those neighbours' LRs. At an argmin on the grid's edge there is no parabola: the best
LR is that edge's, and ``at_edge`` says the true one may lie beyond it. A seed that did not learn at any LR of
its grid (``analysis.lrs``) has no best LR.

The shift per doubling of one seed is the least-squares slope of log2(best LR) over log2(width) across the
widths (``scipy.stats.linregress``): 0 where the best LR does not move, -1 where it halves each time the width
doubles. A seed gets one only when it has a best LR at every width of the study. Per family: the mean over
seeds, its 95 % interval (Student's t, ``analysis.stats.t_interval``), and the absolute shift per seed, which a
claim that one parametrization transfers better than another compares by seed (``abs_shift``).

A family here is an LR family of the study with its width keys left out (``WIDTH_KEYS``: ``model.d_model``,
``model.d_ff``; ``DEPTH_KEYS`` for a study across depth): the same norm and parametrization at every width.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scipy.stats import linregress

from analysis.lrs import SeedGrid, study_from_cells
from analysis.presets import stored_label, study_name
from analysis.stats import mean_stderr, t_interval
from analysis.variants import label_pairs

WIDTH_KEYS = ("model.d_model", "model.d_ff")  # the first is the axis: the value each point is at
DEPTH_KEYS = ("model.n_enc_layers", "model.n_dec_layers")
AXES = {"width": WIDTH_KEYS, "depth": DEPTH_KEYS}


@dataclass(frozen=True)
class BestLR:
    """One seed's best LR at one point of the axis: ``log2_lr`` (the parabola's vertex, or the argmin's LR), and
    whether the argmin was at the grid's edge."""

    log2_lr: float
    at_edge: bool


def best_lr(seed: SeedGrid, grid: list[float]) -> BestLR | None:
    """The best LR of one seed's grid (module docstring); None when the grid is incomplete or did not learn."""
    if seed.learned is not True:
        return None
    losses = [c.capped for c in seed.cells if c.capped is not None]
    assert len(losses) == len(grid)  # a complete grid that learned knows every capped loss
    i = losses.index(min(losses))
    if i in (0, len(grid) - 1):
        return BestLR(math.log2(grid[i]), at_edge=True)
    x = [math.log2(grid[j]) for j in (i - 1, i, i + 1)]
    y = losses[i - 1 : i + 2]
    # the vertex of the parabola through the three points (Lagrange form); y[1] is the least, so it opens upward
    num = (x[1] - x[0]) ** 2 * (y[1] - y[2]) - (x[1] - x[2]) ** 2 * (y[1] - y[0])
    den = (x[1] - x[0]) * (y[1] - y[2]) - (x[1] - x[2]) * (y[1] - y[0])
    vertex = x[1] if den == 0 else x[1] - num / (2 * den)
    return BestLR(min(max(vertex, x[0]), x[2]), at_edge=False)


@dataclass
class Transfer:
    """One family across the axis: ``points`` the axis values (ascending); ``grids[seed][point]`` each seed's grid
    there, ``best[seed][point]`` its best LR (None: none); ``shifts[seed]`` its shift per doubling (seeds with a best
    LR at every point)."""

    name: str
    points: list[int]
    grids: dict[object, dict[int, SeedGrid]]

    @property
    def best(self) -> dict[object, dict[int, BestLR | None]]:
        return {s: {p: best_lr(g, [c.lr for c in g.cells]) for p, g in at.items()} for s, at in self.grids.items()}

    @property
    def shifts(self) -> dict[object, float]:
        out = {}
        for seed, at in self.best.items():
            best = [b.log2_lr for p in self.points if (b := at.get(p)) is not None]
            if len(best) == len(self.points) > 1:
                out[seed] = float(linregress([math.log2(p) for p in self.points], best).slope)
        return out

    def summary(self) -> dict[str, object]:
        """The family's row: n, mean shift, its 95 % interval, the shift per seed, the seeds at an edge."""
        shifts = self.shifts  # a regression per seed: computed once
        values = list(shifts.values())
        mean, _ = mean_stderr(values)
        ci = t_interval(values)
        at_edge = sorted(str(s) for s, at in self.best.items() if any(b is not None and b.at_edge for b in at.values()))
        return {
            "family": self.name,
            "n": len(values),
            "shift_mean": mean,
            "ci95_lo": ci[0] if ci else None,
            "ci95_hi": ci[1] if ci else None,
            "per_seed_shift": " ".join(f"{s}={v!r}" for s, v in shifts.items()),
            "seeds_at_edge": " ".join(at_edge),
        }

    def point_rows(self) -> list[dict[str, object]]:
        """One row per point of the axis: the seeds with a best LR there (``n``), ``best_lr`` (2 to the mean over them
        of log2 best LR: a geometric mean), ``at_edge`` (how many of them sat on the grid's edge), and the means over
        the same seeds of l0 (``init_loss``, the loss at step 0) and of l* (``best_loss``, the lowest capped final
        loss on the grid: ``analysis.lrs``)."""
        rows, best = [], self.best
        for p in self.points:
            found = {s: b for s, at in best.items() if (b := at.get(p)) is not None}
            row: dict[str, object] = {"family": self.name, "point": p, "n": len(found)}
            row["best_lr"] = 2 ** (sum(b.log2_lr for b in found.values()) / len(found)) if found else None
            row["at_edge"] = sum(b.at_edge for b in found.values())
            for key in ("init_loss", "best_loss"):
                values = [getattr(self.grids[s][p], key) for s in found]
                row[key] = sum(values) / len(values) if values else None
            rows.append(row)
        return rows

    def grid_rows(self) -> list[dict[str, object]]:
        """One row per point of the axis and LR of its grid: ``n`` (seeds whose capped final loss is known there) and
        ``capped_loss``, its mean over them (``analysis.lrs``: min(final loss, l0), l0 for a diverged run)."""
        rows = []
        for p in self.points:
            by_lr: dict[float, list[float]] = {}
            for c in (c for at in self.grids.values() if p in at for c in at[p].cells):
                if c.capped is not None:
                    by_lr.setdefault(c.lr, []).append(c.capped)
            for lr, values in sorted(by_lr.items()):
                rows.append(
                    {"family": self.name, "point": p, "lr": lr, "n": len(values), "capped_loss": sum(values) / len(values)}
                )
        return rows


def transfers(rows: Iterable[dict[str, str]], axis: str, name_of: dict[str, str] | None = None) -> list[Transfer]:
    """The families of the report's ``lr_sensitivity.csv`` ``rows`` across ``axis`` (``width`` or ``depth``), each
    named by ``name_of`` of its label without the axis keys (the label itself where absent), in first-seen order.

    Raises:
        ValueError: an unknown axis, or a family label without the axis key (the study does not vary it)."""
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; valid: {', '.join(AXES)}")
    keys = AXES[axis]
    out: dict[str, Transfer] = {}
    for family in study_from_cells(rows).families:
        pairs = label_pairs(stored_label(family.label))
        if keys[0] not in pairs:
            raise ValueError(f"family {family.label!r} has no {keys[0]}: the study does not vary the {axis}")
        rest = _without(pairs, keys)
        name = (name_of or {}).get(rest, rest)
        point = int(pairs[keys[0]])
        transfer = out.setdefault(name, Transfer(name, [], {}))
        transfer.points = sorted({*transfer.points, point})
        for seed in family.seeds:
            transfer.grids.setdefault(seed.seed, {})[point] = seed
    return list(out.values())


def seed_rows(transfer: Transfer) -> list[dict[str, object]]:
    """One row per seed with a shift: family, seed, shift, abs_shift (what a claim compares by seed)."""
    return [{"family": transfer.name, "seed": s, "shift": v, "abs_shift": abs(v)} for s, v in transfer.shifts.items()]


def preset_names(labels: Iterable[str], norm: str | None = None) -> dict[str, str]:
    """Each family label without the axis keys -> its presets' name and parametrization (``pre_ln mup``; the
    preset's alone where the label has no ``model.parametrization``: the study does not vary it). A label holds only
    the keys a study varies, so a study of one norm preset has no ``norm.*`` key in any label: ``norm`` (a preset's
    name) names those, and only those.

    Raises:
        ValueError: a label names no single preset (``analysis.presets.study_name``), a label without ``norm.*``
            keys and no ``norm``, or two labels one name."""
    names: dict[str, str] = {}
    for label in dict.fromkeys(labels):
        pairs = label_pairs(label) if label else {}  # '': the study varies nothing but the axis
        one_preset = not any(k.startswith("norm.") for k in pairs)
        if one_preset and norm is None:
            raise ValueError(f"family {label!r} holds no norm.* key: the study ran one norm preset; name it (--norm)")
        preset = norm if one_preset else study_name(label)
        if preset is None:
            raise ValueError(f"family {label!r} names no single norm preset (none or several fit its keys)")
        param = pairs.get("model.parametrization")
        name = preset if param is None else f"{preset} {param}"
        if name in names.values():
            raise ValueError(f"families {label!r} and {next(k for k, v in names.items() if v == name)!r} are both {name}")
        names[label] = name
    return names


def stripped_labels(rows: Iterable[dict[str, str]], axis: str) -> list[str]:
    """The families' labels of ``rows`` without ``axis``' keys, as :func:`transfers` names them."""
    labels = dict.fromkeys(row["family"] for row in rows)
    return [_without(label_pairs(stored_label(label)), AXES[axis]) for label in labels]


def _without(pairs: dict[str, str], keys: tuple[str, ...]) -> str:
    """The label of ``pairs`` (``key=value``, space-separated) without ``keys``: a family across the axis."""
    return " ".join(f"{k}={v}" for k, v in pairs.items() if k not in keys)
