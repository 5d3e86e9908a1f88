"""``python -m scripts.bench model``: a full training step of normlab vs ``torch.nn.Transformer``.

Both models get the same sizes, the same embeddings (normlab's ``Embedding``, one per stack),
the same tied output layer, the same batch and the same step (``training/step.py``: forward,
label-smoothed cross-entropy, backward, clipping, AdamW). The reference is pre-LN
(``norm_first=True``), the placement both can express exactly; normlab runs it with
``nn.LayerNorm`` (native, the same kernel as the reference) and with its formula-written
LayerNorm (custom, the default). Steps alternate between the models within every round, and the
speed ratio (reference step time / normlab step time: > 1 means normlab is faster) is taken
per round, so a slow moment of a shared machine hits both sides of a ratio alike.
"""

import multiprocessing
import statistics
import time
from pathlib import Path
from typing import cast

import torch
from torch import nn

from data.batching import Batch
from data.tokenizer import PAD_ID
from model.config import ModelConfig, NormConfig
from model.transformer import Embedding, EncoderDecoder
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from training.optim import build_optimizer, build_scheduler
from training.precision import autocast, resolve_precision
from training.presets import default_optim, group_keys
from training.schema import ScheduleConfig
from training.step import StepOptions, train_step

SIZES = ("small", "base")  # the model presets compared: the default model and Transformer-base (conf/model/)
SHAPE_KEYS = ("d_model", "n_heads", "d_ff", "n_enc_layers", "n_dec_layers")  # a size's shape, printed with its results
VOCAB = 1000  # a subword-sized vocabulary, so the output layer weighs as in translation


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` (pre-LN) between normlab's embeddings and a tied output layer;
    same ``forward(src (B, S), tgt_in (B, T)) -> logits (B, T, V)`` as ``EncoderDecoder``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.src_embed, self.tgt_embed = Embedding(cfg.src_vocab, cfg), Embedding(cfg.tgt_vocab, cfg)
        self.transformer = nn.Transformer(
            cfg.d_model,
            cfg.n_heads,
            cfg.n_enc_layers,
            cfg.n_dec_layers,
            cfg.d_ff,
            cfg.dropout,
            batch_first=True,
            norm_first=True,
        )
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)
        self.output.weight = self.tgt_embed.tokens.weight

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        src_pad = src.eq(PAD_ID)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=src.device)
        h = self.transformer(
            self.src_embed(src),
            self.tgt_embed(tgt_in),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
        )
        return self.output(h)

    def layers(self) -> list[nn.Module]:
        return [*self.transformer.encoder.layers, *self.transformer.decoder.layers]


def build(variant: str, size: str, device: torch.device, compile_layers: bool) -> nn.Module:
    """``variant`` in torch / native / custom; the same seed gives both models the same embeddings."""
    torch.manual_seed(0)
    impl = "custom" if variant == "custom" else "native"
    keys = {**group_keys("model", size), "dropout": 0.0, "max_len": 256}
    cfg = ModelConfig(src_vocab=VOCAB, tgt_vocab=VOCAB, norm=NormConfig(impl=impl), **keys)
    model = TorchTransformer(cfg) if variant == "torch" else EncoderDecoder(cfg)
    model.to(device)
    if compile_layers:  # per layer on both sides, as train.py does
        for layer in model.layers() if isinstance(model, TorchTransformer) else [*model.encoder, *model.decoder]:
            layer.compile()
    return model


def make_batch(rows: int, src_len: int, tgt_len: int, device: torch.device) -> Batch:
    """Random ids, right-padded: each row keeps between half and all of its length."""
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (rows, src_len), generator=gen)
    tgt = torch.randint(4, VOCAB, (rows, tgt_len + 1), generator=gen)
    for t, n in ((src, src_len), (tgt, tgt_len + 1)):
        keep = torch.randint(n // 2, n + 1, (rows, 1), generator=gen)
        t.masked_fill_(torch.arange(n) >= keep, PAD_ID)
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], list(range(rows)), int(tgt[:, 1:].ne(PAD_ID).sum()))
    return batch.to(device)


def stepper(model: nn.Module, batch: Batch, device: torch.device, precision: str):
    optim = default_optim(lr=1e-4)
    opt = build_optimizer(model, optim)
    sched = build_scheduler(opt, optim.lr, ScheduleConfig(0, "constant"), 10**9)
    tele = Telemetry(cast(EncoderDecoder, model), TelemetryConfig(every=0))  # records nothing: any model will do
    context = autocast(precision, device)  # precision: fp32 or bf16 (trainer.precision, resolved)

    def step() -> None:
        train_step(
            model,
            [batch],
            opt,
            sched,
            tele,
            StepOptions(world=1, label_smoothing=0.1, grad_clip=1.0, autocast=context, step_tokens=batch.n_tgt_tokens),
        )

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rss_bytes(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of this process, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def peak_memory_mib(
    variant: str, size: str, batch_shape: tuple[int, int, int], device: str, compile_layers: bool, precision: str
) -> float:
    """Peak memory of 3 training steps above what the process held before them, in MiB: CUDA
    max allocated, or on CPU the peak resident set (reset through /proc/self/clear_refs) minus
    the resident set before the steps. Run it in a fresh process per variant: freed memory
    stays resident, so a second model in the same process would reuse the first one's."""
    dev = torch.device(device)
    model = build(variant, size, dev, compile_layers)
    batch = make_batch(*batch_shape, dev)
    step = stepper(model, batch, dev, precision)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        before = rss_bytes("VmRSS")
    for _ in range(3):
        step()
    sync(dev)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else rss_bytes("VmHWM")
    return (peak - before) / 2**20


def bench_model(
    sizes: list[str], device: torch.device, rounds: int, compile_layers: bool, rows: int, length: int, precision: str = "auto"
) -> None:
    """Print, per size, tokens/s of each model and normlab's speed ratio to the reference
    (min / median / max over rounds), then peak memory side by side; ``precision`` as ``trainer.precision``."""
    variants = ("torch", "native", "custom")
    precision = resolve_precision(precision, device)
    for size in sizes:
        batch = make_batch(rows, length, length, device)
        steps = {v: stepper(build(v, size, device, compile_layers), batch, device, precision) for v in variants}
        for step in steps.values():  # warm-up, compilation, allocator caches
            for _ in range(3):
                step()
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            for v, step in steps.items():
                sync(device)
                t = time.perf_counter()
                step()
                sync(device)
                times[v].append(time.perf_counter() - t)
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1, maxtasksperchild=1) as pool:
            memory = {
                v: pool.apply(peak_memory_mib, (v, size, (rows, length, length), str(device), compile_layers, precision))
                for v in variants
            }
        kind = "bf16 autocast" if precision == "bf16" else "fp32"
        what = f"{device.type}, {kind}{', compiled layers' if compile_layers else ''}"
        shape = {k: group_keys("model", size)[k] for k in SHAPE_KEYS}
        print(
            f"\n{size} ({shape}), batch {rows} x {length} src/tgt ({batch.n_tgt_tokens} tgt tokens), {what}, "
            f"{rounds} alternating rounds:"
        )
        print(f"  {'model':<28} {'tok/s (median)':>15} {'speed vs torch: min':>20} {'median':>7} {'max':>6} {'peak MiB':>9}")
        for v in variants:
            ratios = [r / n for r, n in zip(times["torch"], times[v], strict=True)]
            name = {
                "torch": "torch.nn.Transformer (pre-LN)",
                "native": "normlab pre-LN native",
                "custom": "normlab pre-LN custom",
            }[v]
            print(
                f"  {name:<28} {batch.n_tgt_tokens / statistics.median(times[v]):>15.0f} {min(ratios):>20.2f} "
                f"{statistics.median(ratios):>7.2f} {max(ratios):>6.2f} {memory[v]:>9.0f}"
            )
