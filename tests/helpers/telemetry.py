"""A tiny model and batch under telemetry, its recorded steps, and the statistics' docs tables (docs/telemetry.md) read
for the tests that check values against them."""

import re
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils.parametrizations import spectral_norm

from data.batching import Batch
from model.config import ModelConfig, NormConfig
from model.transformer import EncoderDecoder
from runlog.metric_names import (
    ACT_STAT_SITES,
    ATTENTION_NORM_SITES,
    FAMILY_STATS,
    STATS,
    WEIGHT_SITES,
)
from telemetry.config import TelemetryConfig
from telemetry.parameters import POWER_SEED
from telemetry.recorder import Telemetry
from training.optim import build_optimizer, build_scheduler
from training.presets import default_optim
from training.schema import ScheduleConfig
from training.step import StepOptions, train_step

FULL = TelemetryConfig(every=1, updates=True, attn_entropy=True, attn_max_logit=True, logits=True)
EVERY_SITE_STATS = tuple(s for s in STATS if s not in ACT_STAT_SITES)  # the stats every act site has
DOC = Path(__file__).resolve().parents[2] / "docs" / "telemetry.md"


def make(placement="pre", kind="layernorm", n=2, d=32, seed=0, dropout=0.0, **attention_norms) -> EncoderDecoder:
    torch.manual_seed(seed)
    norm = NormConfig(kind=kind, placement=placement, **attention_norms)
    cfg = ModelConfig(src_vocab=30, tgt_vocab=40, d_model=d, n_heads=4, d_ff=2 * d, n_enc_layers=n, n_dec_layers=n,
                      dropout=dropout, norm=norm)  # fmt: skip
    return EncoderDecoder(cfg)


def batch(seed=0, pad=True):
    g = torch.Generator().manual_seed(seed)
    src, tgt_in, tgt_out = (torch.randint(4, 30, (6, 9), generator=g) for _ in range(3))
    if pad:  # right padding of different lengths
        for row, n in enumerate([0, 2, 4, 1, 3, 5]):
            if n:
                src[row, -n:] = 0
                tgt_in[row, -n:] = 0
                tgt_out[row, -n:] = 0
    return src, tgt_in, tgt_out


def record(model, src, tgt_in, tgt_out, cfg=FULL) -> dict[str, float]:
    tele = Telemetry(model, cfg)
    watch_backward(tele, model, src, tgt_in, tgt_out)
    return tele.collect()


def train_steps(model: EncoderDecoder, every: int, steps: int = 4) -> tuple[list[float], list[dict], list, torch.Tensor]:
    """``steps`` training steps from seed 0 as train.py runs them (``train_step``), telemetry
    recording when due; returns the losses, the statistics per step, the weights, the RNG state."""
    torch.manual_seed(0)
    src, tgt_in, tgt_out = batch()
    b = Batch(src, tgt_in, tgt_out, list(range(len(src))), int(tgt_out.ne(0).sum()))
    opt = build_optimizer(model, default_optim(lr=1e-3))
    sched = build_scheduler(opt, 1e-3, ScheduleConfig(0, "constant"), steps)
    tele = Telemetry(model, TelemetryConfig(every=every, attn_entropy=True, attn_max_logit=True, logits=True))
    losses, stats = [], []
    for step in range(1, steps + 1):
        options = StepOptions(world=1, label_smoothing=0.1, grad_clip=1.0, autocast=nullcontext(),
                              step_tokens=b.n_tgt_tokens, record=tele.due(step, steps))  # fmt: skip
        loss = train_step(model, [b], opt, sched, tele, options).loss
        losses.append(loss.item())
        stats.append(tele.collect())
    return losses, stats, [p.detach().clone() for p in model.parameters()], torch.get_rng_state()


def doc_pattern(pattern: str) -> re.Pattern:
    """A name pattern of the docs table (``act/{s}.{i}.in/{stat}``) as a regex."""
    fields = {"s": "enc|dec", "i": r"\d+", "r": "self_attn|cross_attn|ffn", "slot": "norm_in|norm_branch|norm_out",
              "a": "self_attn|cross_attn", "h": "q_norm|k_norm|v_norm", "k": r"\d+", "m": "|".join(map(re.escape, WEIGHT_SITES)),
              "stat": "|".join(stat for stats in FAMILY_STATS.values() for stat in stats)}  # fmt: skip
    return re.compile(re.sub(r"\\{(\w+)\\}", lambda m: f"({fields[m.group(1)]})", re.escape(pattern.strip("`"))))


def qkv_model_and_batch():
    """A pre-LN model with RMSNorm on q and k and LayerNorm on v (weights moved off their init), and
    a batch whose source and target are padded differently, so a statistic over the wrong side's
    padding comes out different."""
    model = make(qk="rmsnorm", v="layernorm").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(f"{site}." in name for site in ATTENTION_NORM_SITES):
                p.add_(0.3 * torch.randn_like(p))
    src, tgt_in, tgt_out = batch(pad=False)
    for row, (n_src, n_tgt) in enumerate([(0, 5), (2, 0), (4, 1), (1, 3), (3, 2), (5, 4)]):
        if n_src:
            src[row, -n_src:] = 0
        if n_tgt:
            tgt_in[row, -n_tgt:] = 0
            tgt_out[row, -n_tgt:] = 0
    return model, src, tgt_in, tgt_out


def mean_over_seeds(placement: str, key: str, n: int = 6) -> list[float]:
    """``key`` formatted with {s}.{i} for each block of a 6+6 model at init, averaged over seeds."""
    runs = []
    for seed in range(3):
        model = make(placement, n=n, d=64, seed=seed)
        cfg = TelemetryConfig(every=1, sites=("out",), stats=("rms",))
        runs.append(record(model, *batch(seed, pad=True), cfg=cfg))
    return [sum(r[key.format(i=i)] for r in runs) / len(runs) for i in range(n)]


def by_logits(attn, x: torch.Tensor, memory=None, key_pad_mask=None, cache=None) -> torch.Tensor:
    """``attn``'s output computed from ``attn.logits`` (softmax, values, output projection) instead of SDPA,
    with q, k and v read from the taps and the value norm of one forward pass."""
    seen = {}
    hooks = [
        attn.q_tap.register_forward_hook(lambda m, a, out: seen.__setitem__("q", out)),
        attn.k_tap.register_forward_hook(lambda m, a, out: seen.__setitem__("k", out)),
        attn.v_norm.register_forward_hook(lambda m, a, out: seen.__setitem__("v", out)),
    ]
    attn(x, memory, key_pad_mask, cache)
    for h in hooks:
        h.remove()
    v = seen["v"] if cache is None or memory is not None else cache.v  # a self-attention cache: every value
    y = torch.softmax(attn.logits(seen["q"], seen["k"], key_pad_mask), dim=-1) @ v  # (B, H, T, K)
    B, H, T, K = y.shape
    return attn.out_proj(y.transpose(1, 2).reshape(B, T, H * K))


def doc_table(first_header: str) -> list[list[str]]:
    """The cells of the docs table whose header row starts with ``first_header``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def torch_sigma(w: torch.Tensor, iters: int) -> float:
    """sigma_max of ``w`` after ``iters`` power iterations from telemetry's first vector, by
    ``torch.nn.utils.parametrizations.spectral_norm``: its forward (training mode) runs
    n_power_iterations from its buffer ``_v`` and divides W by sigma = u^T W v."""
    linear = torch.nn.Linear(w.shape[1], w.shape[0])
    linear.weight.data.copy_(w)
    spectral_norm(linear, n_power_iterations=iters)
    v0 = F.normalize(torch.randn(w.shape[1], generator=torch.Generator().manual_seed(POWER_SEED)), dim=0)
    linear.parametrizations.weight[0]._v.copy_(v0)
    return (w[0, 0] / linear.weight[0, 0]).item()


def watch_backward(tele: Telemetry, model, src, tgt_in, tgt_out) -> None:
    """One watched forward pass, its output logits and its backward pass, as a training step records them."""
    with tele.watch(src.eq(0), tgt_out.eq(0)):
        logits = model(src, tgt_in)
    tele.logits.record(logits, tgt_out.eq(0))
    F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=0).backward()
    tele.parameters.record_grad_norms()
