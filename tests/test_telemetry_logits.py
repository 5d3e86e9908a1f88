"""telemetry/logits.py: ``out/logz`` and ``out/max_logit`` equal hand computations over real target tokens,
and a training step records them from its own logits on record steps only."""

import math
from contextlib import nullcontext

import pytest
import torch

from data.batching import Batch
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.telemetry import batch, make
from training.step import StepOptions, train_step

LOGITS = TelemetryConfig(every=1, sites=(), grads=False, logits=True)


def test_out_logz_and_max_logit_equal_hand_computation_over_real_tokens():
    z = torch.tensor(
        [
            [[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0], [-1.0, 5.0, 0.0, 0.0]],
            [[2.0, 2.0, 2.0, 2.0], [100.0, 0.0, 0.0, 0.0], [-100.0, 200.0, 0.0, 0.0]],  # the last two are padding
        ]
    )  # (B, T, V)
    pad = torch.tensor([[False, False, False], [False, True, True]])
    tele = Telemetry(make(), LOGITS)
    tele.logits.record(z.to(torch.bfloat16), pad)  # bf16 logits (autocast) are read in float32
    got = tele.collect()
    log_z = [math.log(sum(math.exp(v) for v in row)) for row in ([0, 0, 0, 0], [1, 2, 3, 4], [-1, 5, 0, 0], [2, 2, 2, 2])]
    assert log_z[0] == pytest.approx(math.log(4)) and log_z[3] == pytest.approx(2 + math.log(4))
    assert got == pytest.approx({"out/logz": sum(log_z) / 4, "out/max_logit": 5.0}, rel=1e-6)
    off = Telemetry(make(), TelemetryConfig(every=1, sites=(), grads=False, logits=False))
    off.logits.record(z, pad)
    assert off.collect() == {}


def test_training_step_records_out_stats_of_its_own_logits_on_record_steps_only():
    model = make(n=1)
    src, tgt_in, tgt_out = batch()
    with torch.no_grad():
        z = model(src, tgt_in).double()  # the first step's forward pass, before its update
    real = tgt_out.ne(0)
    cfg = TelemetryConfig(every=2, sites=(), grads=False, weights=False, scales=False, attn_max_logit=False, adam=False)
    tele = Telemetry(model, cfg)
    b = Batch(src, tgt_in, tgt_out, list(range(len(src))), int(real.sum()))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    records = []
    for step in (1, 2, 3):
        options = StepOptions(world=1, label_smoothing=0.1, grad_clip=None, autocast=nullcontext(),
                              step_tokens=b.n_tgt_tokens, record=tele.due(step, 4))  # fmt: skip
        train_step(model, [b], opt, sched, tele, options)
        records.append(tele.collect())
    assert records[0] == pytest.approx(
        {"out/logz": z.logsumexp(-1)[real].mean().item(), "out/max_logit": z.amax(-1)[real].max().item()}, rel=1e-6
    )
    assert records[1].keys() == records[0].keys() and records[2] == {}  # step 2 records, step 3 does not
