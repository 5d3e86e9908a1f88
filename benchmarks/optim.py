"""``python -m scripts.bench optim``: a training step under each optimizer, timed side by side: AdamW, and Muon
(``optim=muon``) with its Newton-Schulz iteration in bfloat16 (torch's) and in float32 (``optim.muon.ns_dtype``)."""

import statistics

import torch

from benchmarks.norms import default_model_and_batch, make_step
from benchmarks.timing import ratio_row, time_samples
from training.muon_config import MuonConfig
from training.presets import default_optim, group_keys

VARIANTS = ("adamw", "muon, bfloat16 NS", "muon, float32 NS")  # the first is the baseline


def bench_optim(size: str, rounds: int, clock: str) -> None:
    """One training step (forward, backward, optimizer, as train.py runs it) of model preset ``size`` on the 400-word
    batch under each of ``VARIANTS``, the same weights; printed with the ratio to AdamW (median of the per-round
    ratios, and their quartiles: ``ratio_row``)."""
    muon = group_keys("optim", "muon")["muon"]
    optims = {
        "adamw": default_optim(lr=1e-4),
        "muon, bfloat16 NS": default_optim(lr=1e-4, muon=MuonConfig(**{**muon, "ns_dtype": "bfloat16"})),
        "muon, float32 NS": default_optim(lr=1e-4, muon=MuonConfig(**{**muon, "ns_dtype": "float32"})),
    }
    fns = {}
    for name in VARIANTS:
        model, batch = default_model_and_batch(size=size)
        fns[name] = make_step(model, batch, telemetry=None, optim=optims[name])
    samples = time_samples(fns, rounds, inner=1, warmup=2, clock=clock)
    print(
        f"\nOne training step of model={size} on a 400-word batch, CPU, {torch.get_num_threads()} threads, {clock} clock, "
        f"{rounds} alternating rounds; ratio to AdamW (> 1: slower), median [quartiles] of the per-round ratios:"
    )
    for name in VARIANTS:
        row = ratio_row("optim", samples[name], samples["adamw"], variant=name)
        ms = 1000 * statistics.median(samples[name])
        print(f"  {name:<20} {row['ratio']:6.2f} [{row['ratio_q1']:.2f}, {row['ratio_q3']:.2f}]   ({ms:.0f} ms/step)")
