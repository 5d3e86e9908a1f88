"""The coordinate check of muP (Yang et al. 2021, "Tensor Programs V", arXiv 2203.03466, sec. 6 and Fig. 5;
microsoft/mup's ``mup.coord_check``): the same model trained for a few Adam steps at several widths, each activation
site's RMS read at every step from normlab's own telemetry (``act/<site>/rms``, docs/telemetry.md) and the output
logits' RMS from a forward pass on the same batch. Under muP (``model.parametrization=mup``) an activation's
coordinates keep their size as the width grows; under the standard parametrization they grow with it once Adam has
updated the weights (the paper's Fig. 5). The attention logits are not read here: their 1 / sqrt(m) is a unit test's
(tests/test_parametrization.py). The summary is the slope of
log2 RMS over log2 width at each step and site (least squares): about 0 where the size does not depend on the width,
1 where it doubles with it.

The batch is a fixed one of random token ids (seeded): the check is about how sizes scale with the width, which the
task does not change; every width sees the same batch, the same LR and no weight decay, gradient clipping or warmup.
"""

import math
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
from scipy.stats import linregress

from data.batching import Batch
from model.config import ModelConfig
from model.transformer import EncoderDecoder
from runlog.metric_names import parse
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from training.optim import build_optimizer, build_scheduler
from training.presets import default_optim
from training.schema import ScheduleConfig
from training.step import StepOptions, train_step

LOGITS = "logits"  # the site name of the output logits' RMS


@dataclass(frozen=True)
class Coord:
    """One site's RMS at one width and step (``step`` updates done; 0: at init)."""

    parametrization: str
    width: int
    step: int
    site: str
    rms: float


def widened(cfg: ModelConfig, width: int, parametrization: str, base_width: int) -> ModelConfig:
    """``cfg`` at d_model ``width`` (d_ff in proportion) under ``parametrization``, its muP base width ``base_width``.

    Raises:
        ValueError: a width the heads do not divide, or at which d_ff is not a whole number."""
    d_ff = cfg.d_ff * width / cfg.d_model
    if d_ff != int(d_ff):
        raise ValueError(f"width {width}: d_ff would be {d_ff:g} (model.d_ff * width / model.d_model); choose another")
    base = base_width if parametrization == "mup" else None
    return replace(cfg, d_model=width, d_ff=int(d_ff), parametrization=parametrization, base_d_model=base)


def fixed_batch(cfg: ModelConfig, seed: int, rows: int = 32, length: int = 12) -> Batch:
    """``rows`` random source and target sequences of ``length`` ids (no padding), from a generator seeded ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(cfg.pad_id + 1, cfg.src_vocab, (rows, length), generator=gen)
    tgt = torch.randint(cfg.pad_id + 1, cfg.tgt_vocab, (rows, length + 1), generator=gen)
    return Batch(src, tgt[:, :-1], tgt[:, 1:], list(range(rows)), rows * length)


def run_width(cfg: ModelConfig, batch: Batch, steps: int, lr: float, seed: int) -> list[tuple[int, str, float]]:
    """(step, site, RMS) of ``cfg``'s model at init and after each of ``steps`` Adam updates at ``lr``."""
    torch.manual_seed(seed)
    model = EncoderDecoder(cfg)
    opt = build_optimizer(model, replace(default_optim(lr=lr), weight_decay=0.0))
    sched = build_scheduler(opt, lr, ScheduleConfig(0, "constant"), steps + 1)
    tele = Telemetry(model, TelemetryConfig(every=1, stats=("rms",)))
    options = StepOptions(world=1, label_smoothing=0.0, grad_clip=None, autocast=nullcontext(), record=True)
    out = []
    for step in range(steps + 1):
        with torch.no_grad():  # the logits the step's forward will see (train_step records only activations)
            logits = model(batch.src, batch.tgt_in)
        out.append((step, LOGITS, logits.float().pow(2).mean().sqrt().item()))
        train_step(model, [batch], opt, sched, tele, replace(options, step_tokens=batch.n_tgt_tokens))
        stats = tele.collect()
        acts = [(m, v) for m, v in ((parse(key), v) for key, v in stats.items()) if m and m.family == "act"]
        out += [(step, m.where, v) for m, v in acts if m.where is not None and m.stat == "rms"]  # act/{where}/rms
    return out


def coord_check(cfg: ModelConfig, widths: list[int], base_width: int, steps: int, lr: float, seed: int = 0) -> list[Coord]:
    """Every site's RMS at every width of ``widths`` and step 0..``steps``, under ``sp`` and under ``mup`` against
    ``base_width``; the same batch (:func:`fixed_batch`) and the same seed at every width."""
    batch = fixed_batch(cfg, seed)
    # every config first, so that a width or base muP cannot take stops the check before any training
    configs = [(p, w, widened(cfg, w, p, base_width)) for p in ("sp", "mup") for w in widths]
    return [Coord(p, w, step, site, rms) for p, w, wide in configs for step, site, rms in run_width(wide, batch, steps, lr, seed)]


def slopes(rows: list[Coord]) -> dict[tuple[str, int, str], float]:
    """(parametrization, step, site) -> the least-squares slope of log2 RMS over log2 width (``scipy.stats.linregress``)."""
    groups: dict[tuple[str, int, str], list[Coord]] = {}
    for r in rows:
        groups.setdefault((r.parametrization, r.step, r.site), []).append(r)
    return {
        key: float(linregress([math.log2(r.width) for r in g], [math.log2(r.rms) for r in g]).slope) for key, g in groups.items()
    }
