"""AdamW (or Muon on the hidden matrices and AdamW on the rest) and a linear-warmup-then-decay learning rate, from
torch's own schedulers."""

import math
import warnings

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, LRScheduler, SequentialLR

from model.hyper_connections import HyperConnection
from model.transformer import EncoderDecoder
from model.weight_norm import weight_norm_gains
from training.muon import MuonAdamW, hidden_matrices
from training.mup import eps_factors, lr_factors
from training.schema import OptimConfig, ScheduleConfig


def hyper_connection_gains(model: nn.Module) -> list[nn.Parameter]:
    """The static [a_m | A] of every static or dynamic hyper-connection of ``model``."""
    return [m.static_alpha for m in model.modules() if isinstance(m, HyperConnection)]


def hyper_connection_projections(model: nn.Module) -> list[nn.Parameter]:
    """The W_b (D,) of every dynamic hyper-connection of ``model``: 1-D, yet a projection like W_a."""
    return [m.beta_fn for m in model.modules() if isinstance(m, HyperConnection) and m.dynamic]


def gains(model: nn.Module) -> list[nn.Parameter]:
    """The multiplicative gains of ``model``: every parameter under 2-D whose name ends in ``weight`` (norm gains,
    ReZero/LayerScale gates, ScaleNorm's g) or, zero-centred, in ``weight.original`` (``norm.gain=unit_offset``'s
    w), and WeightNorm's g; not the biases, scalar shapes (DyT's alpha) nor hyper-connections' weights."""
    named = [p for n, p in model.named_parameters() if p.dim() < 2 and n.split(".")[-1] == "weight"]
    offset = [p for n, p in model.named_parameters() if n.endswith("parametrizations.weight.original") and p.dim() < 2]
    return named + offset + weight_norm_gains(model)


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019) with ``optim``'s lr, betas, eps and weight decay (the run's ``optim`` keys;
    outside a run ``training.presets.default_optim()``, changed with ``dataclasses.replace``), fused on CUDA; with
    ``optim.muon`` set, ``torch.optim.Muon`` on the blocks' hidden matrices (``training.muon.hidden_matrices``: their
    lr ``optim.lr * optim.muon.lr_scale``, weight decay ``optim.weight_decay``) and that AdamW on every other
    parameter, as one ``training.muon.MuonAdamW``. The AdamW groups are [decay, no-decay], Muon's one group after.

    Weight decay applies to matrices and embeddings (dim >= 2) only: decaying norm gains and
    biases would pull the norms being studied toward zero. Zero-centred gains (``norm.gain=unit_offset``,
    ``model.gains``) store w of the gain 1 + w, 1-D too, so they get none either: AdamW's step on w is then the step
    the plain gain takes, and the two train alike up to float rounding (tests/test_gains.py). Decay would tell them
    apart, pulling a plain gain toward 0 and a zero-centred one toward 1, the identity. WeightNorm's g (``model.weight_norm``), a
    per-row gain of shape (out, 1), gets none either; its v, the direction, is decayed as a matrix: the
    output does not depend on ||v||, so decay only shrinks ||v||, which enlarges the step on the direction
    (under AdamW an update's size does not follow the gradient's scale, so the angle it turns v / ||v|| by
    grows as lr / ||v||; Salimans & Kingma 2016, arXiv 1602.07868, sec. 2.1, make the SGD form of the point).
    Hyper-connections' static weights [a_m | A] (``model.hyper_connections``), a matrix initialized at
    [e_k | I], get none either: decay would pull the residual path itself toward zero. Their projections are
    decayed, as every matrix is: dynamic HC's W_a (``alpha_fn``, (D, 1+n)) and its W_b (``beta_fn``), 1-D only
    because it makes one weight per stream (b) where W_a makes 1+n ([a_m | A]): the same role, LN(H) W through
    tanh, so the same decay; and mHC's phi (``fn``, of each sublayer and of the stack's head). What scales or
    shifts the mixing weights gets none, as norm gains and biases get none: dynamic HC's s_a, s_b (scalars) and
    static b, and mHC's ``base`` (b_pre, b_post, b_res: the biases of its logits) and ``scale`` (alpha_pre,
    alpha_post, alpha_res: their gains); decaying them would pull mHC's gates toward sigmoid(0) and A toward the
    uniform matrix whatever the data says.

    ``optim.decay_gains`` (default false) decays the gains too (:func:`gains`), never the biases: a plain gain is then
    pulled toward 0 and a zero-centred one toward 1 (tests/test_gains.py), for studying the recipes that decay every
    parameter.

    Under ``model.parametrization=mup`` (``completep``) each AdamW group is split by muP's LR factor f
    (``training.mup.lr_factors``) and CompleteP's eps factor e (``training.mup.eps_factors``): a group with
    ``lr_scale`` f peaks at ``optim.lr * f``, decays by ``optim.weight_decay / f`` and has eps ``optim.eps * e``.

    Raises:
        ValueError: ``optim.muon`` with ``model.parametrization=mup`` or ``completep`` (their rules are Adam's).
    """
    if optim.muon and isinstance(model, EncoderDecoder) and (param := model.cfg.parametrization) != "sp":
        raise ValueError(
            f"model.parametrization={param} scales Adam's LR per parameter; Muon has no such rule here: use optim=adamw"
        )
    muon = {id(p) for p in hidden_matrices(model)} if optim.muon else set()
    params = [p for p in model.parameters() if id(p) not in muon]
    adamw = _adamw(params, model, optim)
    if optim.muon is None:
        return adamw
    m = optim.muon
    group = {"params": [p for p in model.parameters() if id(p) in muon], "lr_scale": m.lr_scale}
    inner = torch.optim.Muon(
        [group],
        lr=optim.lr * m.lr_scale,
        weight_decay=optim.weight_decay,
        momentum=m.momentum,
        nesterov=m.nesterov,
        ns_coefficients=m.ns_coefficients,
        ns_steps=m.ns_steps,
        adjust_lr_fn=m.adjust_lr_fn,
    )
    return MuonAdamW(inner, adamw, m.ns_dtype)


def _adamw(params: list[nn.Parameter], model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW over ``params`` (of ``model``) in the groups [decay, no decay] that ``build_optimizer`` describes."""
    gain_ids = {id(p) for p in weight_norm_gains(model)} | {id(p) for p in hyper_connection_gains(model)}
    projections = {id(p) for p in hyper_connection_projections(model)}
    projections |= {id(p) for p in gains(model)} if optim.decay_gains else set()  # decayed whatever their shape
    decayed = [(p.dim() >= 2 and id(p) not in gain_ids) or id(p) in projections for p in params]
    decay = [p for p, d in zip(params, decayed, strict=True) if d]
    no_decay = [p for p, d in zip(params, decayed, strict=True) if not d]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if isinstance(model, EncoderDecoder) and model.cfg.parametrization != "sp":
        groups = _by_factor(groups, lr_factors(model), eps_factors(model), optim.eps)
    fused = all(p.is_cuda for p in model.parameters())
    return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps, fused=fused or None)


def _by_factor(groups: list[dict], lr: dict[int, float], eps: dict[int, float], base_eps: float) -> list[dict]:
    """``groups`` each split by the parameters' LR factor f and eps factor e (first-seen order): ``lr_scale`` f,
    weight decay / f, eps ``base_eps * e``; as they are where every factor is 1 (``sp``, or at the base model)."""
    if set(lr.values()) | set(eps.values()) == {1.0}:
        return groups
    split = []
    for group in groups:
        by: dict[tuple[float, float], list[nn.Parameter]] = {}
        for p in group["params"]:
            by.setdefault((lr[id(p)], eps[id(p)]), []).append(p)
        wd = group["weight_decay"]
        split += [{"params": ps, "weight_decay": wd / f, "lr_scale": f, "eps": base_eps * e} for (f, e), ps in by.items()]
    return split


def scheduled_lr(opt: torch.optim.Optimizer) -> float:
    """``optim.lr`` as the schedule sets it now: the first group's lr over its ``lr_scale`` (muP's factor on that
    group under ``model.parametrization=mup``; none under AdamW or Muon, whose first group is AdamW's)."""
    group = opt.param_groups[0]
    return float(group["lr"]) / group.get("lr_scale", 1.0)


def build_scheduler(
    opt: torch.optim.Optimizer, peak_lr: float, schedule: ScheduleConfig, max_steps: int, start_step: int = 0
) -> LRScheduler:
    """Linear warmup from ~0 to ``peak_lr`` over ``schedule.warmup_steps``, then ``schedule.decay``,
    advanced to ``start_step``; a group with an ``lr_scale`` (Muon's, ``training.muon.MuonAdamW``) peaks at
    ``peak_lr * lr_scale``, on the same schedule. The settings are checked by ``ScheduleConfig`` (``training.schema``).

    The lr of the update after ``s`` updates (``s`` = 0, 1, ...), with W = ``warmup_steps``:

    - warmup, ``s < W``: ``peak_lr * (1/W + (1 - 1/W) * s/W)`` (torch's ``LinearLR``);
    - ``linear`` / ``cosine``: to 0 at ``max_steps``; ``constant``: ``peak_lr``;
    - ``inverse_sqrt``: ``peak_lr * sqrt(W / s)``, whatever ``max_steps`` is: fairseq's
      ``inverse_sqrt`` scheduler (fairseq/optim/lr_scheduler/inverse_square_root_schedule.py),
      the shape of Vaswani et al. 2017, eq. 3. fairseq warms up from ``warmup_init_lr`` (0 by
      default): ``peak_lr * s/W``, at most ``peak_lr / W`` below the warmup here.

    The schedule is a function of (these settings, step) and is never loaded from a checkpoint:
    a resumed run replays it to its step, so it gets the same learning rates as an
    uninterrupted run, and a resume with another ``max_steps`` re-plans the decay. A warmup
    longer than the run is cut at ``max_steps`` (short smoke runs keep the preset's warmup).
    """
    for group in opt.param_groups:  # start from the configured peak, not a loaded optimizer's lr
        group["lr"] = peak_lr * group.get("lr_scale", 1.0)
        group.pop("initial_lr", None)
    warmup_steps = min(schedule.warmup_steps, max_steps)
    rest = max(max_steps - warmup_steps, 1)
    after = {
        "linear": lambda: LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=rest),
        "cosine": lambda: CosineAnnealingLR(opt, T_max=rest),
        "constant": lambda: LinearLR(opt, start_factor=1.0, end_factor=1.0, total_iters=rest),
        # i counts the steps since the warmup ended: the lr after s = W + i updates.
        "inverse_sqrt": lambda: LambdaLR(opt, lambda i: math.sqrt(warmup_steps / (warmup_steps + i))),
    }[schedule.decay]
    if warmup_steps == 0:
        sched = after()
    else:
        warmup = LinearLR(opt, start_factor=1.0 / warmup_steps, end_factor=1.0, total_iters=warmup_steps)
        sched = SequentialLR(opt, [warmup, after()], milestones=[warmup_steps])
    with warnings.catch_warnings():  # replaying without optimizer steps is the point here
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
        for _ in range(start_step):
            sched.step()
    return sched
