"""optim.z_loss: the objective is CE + c * mean((log Z)^2) by hand, it accumulates over micro-batches like the
loss, c = 0 trains bit-identically to the step before the option existed, and train.py logs train/z_loss."""

import copy
import json
import math
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

import train as train_module
from data.batching import Batch
from data.tokenizer import PAD_ID
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.config import make_cfg
from tests.helpers.telemetry import batch, make
from training.optim import build_optimizer, build_scheduler
from training.presets import default_optim
from training.schema import ScheduleConfig
from training.step import StepOptions, train_step

OFF = TelemetryConfig(every=0)


def micro_batches(split: bool) -> list[Batch]:
    """The padded test batch whole, or as two micro-batches of 3 rows."""
    src, tgt_in, tgt_out = batch()
    parts = [slice(0, 3), slice(3, 6)] if split else [slice(0, 6)]
    return [Batch(src[p], tgt_in[p], tgt_out[p], list(range(6))[p], int(tgt_out[p].ne(0).sum())) for p in parts]


def options(z_loss: float, micro: list[Batch], clip: float | None = 1.0) -> StepOptions:
    tokens = sum(b.n_tgt_tokens for b in micro)
    return StepOptions(world=1, label_smoothing=0.1, grad_clip=clip, autocast=nullcontext(), z_loss=z_loss, step_tokens=tokens)


def sgd(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def test_objective_is_cross_entropy_plus_c_mean_log_z_squared_by_hand():
    c = 0.05
    model = make(n=1)
    hand = copy.deepcopy(model)
    (b,) = micro_batches(split=False)
    result = train_step(model, [b], *sgd(model), Telemetry(model, OFF), options(c, [b], clip=None))
    # By hand: log Z = log sum_v exp z_v per real target token; one SGD step of lr 0.1 on CE + c * mean(log Z^2).
    z = hand(b.src, b.tgt_in)
    real = b.tgt_out.ne(PAD_ID)
    ce = F.cross_entropy(z[real], b.tgt_out[real], label_smoothing=0.1)
    log_z = z[real].exp().sum(-1).log()
    z_term = c * log_z.pow(2).mean()
    (ce + z_term).backward()
    with torch.no_grad():
        for p in hand.parameters():
            p -= 0.1 * p.grad
    assert result.loss.item() == pytest.approx(ce.item(), rel=1e-6)  # the logged loss is the cross-entropy alone
    assert result.z_loss.item() == pytest.approx(z_term.item(), rel=1e-6)
    assert z_term.item() > 0.01  # large enough to matter: log Z ~ ln 40 at init
    for (name, p), q in zip(model.named_parameters(), hand.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-7), name
    plain = make(n=1)  # the same step without the z-loss lands elsewhere
    train_step(plain, [b], *sgd(plain), Telemetry(plain, OFF), options(0.0, [b], clip=None))
    assert not torch.allclose(plain.output.weight, model.output.weight, rtol=1e-5, atol=1e-7)


def test_z_loss_accumulates_over_micro_batches_like_one_batch():
    results, weights = [], []
    for split in (False, True):
        model = make(n=1)
        micro = micro_batches(split)
        results.append(train_step(model, micro, *sgd(model), Telemetry(model, OFF), options(0.05, micro)))
        weights.append([p.detach().clone() for p in model.parameters()])
    assert results[1].z_loss.item() == pytest.approx(results[0].z_loss.item(), rel=1e-6)
    assert results[1].loss.item() == pytest.approx(results[0].loss.item(), rel=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(*weights, strict=True))


def step_before_z_loss(model, micro, opt, sched) -> torch.Tensor:
    """training/step.py's train_step as it was before optim.z_loss (telemetry off, one rank)."""
    opt.zero_grad(set_to_none=True)
    total = torch.zeros(())
    step_tokens = sum(b.n_tgt_tokens for b in micro)
    for b in micro:
        logits = model(b.src, b.tgt_in)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), b.tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=0.1
        ) * (b.n_tgt_tokens / step_tokens * 1)  # fmt: skip
        loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return total


def test_z_loss_zero_trains_bit_identically_to_the_step_before_the_option():
    runs = []
    for new in (True, False):
        torch.manual_seed(0)
        model = make(n=1, dropout=0.1)
        opt = build_optimizer(model, default_optim(lr=1e-3))
        sched = build_scheduler(opt, 1e-3, ScheduleConfig(2, "linear"), 3)
        micro = micro_batches(split=True)
        losses = []
        for _ in range(3):
            if new:
                result = train_step(model, micro, opt, sched, Telemetry(model, OFF), options(0.0, micro))
                assert result.z_loss.item() == 0.0
                losses.append(result.loss)
            else:
                losses.append(step_before_z_loss(model, micro, opt, sched))
        runs.append((losses, [p.detach().clone() for p in model.parameters()], torch.get_rng_state()))
    (new_losses, new_weights, new_rng), (old_losses, old_weights, old_rng) = runs
    assert all(torch.equal(a, b) for a, b in zip(new_losses, old_losses, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(new_weights, old_weights, strict=True))
    assert torch.equal(new_rng, old_rng)


def test_train_logs_z_loss_at_the_logging_cadence_and_only_when_on(tmp_path):
    c = 1e-2
    train_module.train(make_cfg(f"optim.z_loss={c}", "trainer.max_steps=4", "trainer.log_every=2"), tmp_path / "on")
    rows = [json.loads(line) for line in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r for r in rows if "train/loss" in r}
    assert sorted(logged) == [1, 2, 4] and all("train/z_loss" in r for r in logged.values())  # telemetry.every=5: step 1
    first = logged[1]  # one step, recorded: out/logz is the mean of the same tokens' log Z
    assert first["train/z_loss"] / c >= first["out/logz"] ** 2  # mean(log Z^2) >= mean(log Z)^2
    assert first["train/z_loss"] / c == pytest.approx(first["out/logz"] ** 2, rel=0.05)  # log Z varies little at init
    assert first["out/logz"] > math.log(2) and "attn/dec.1.cross_attn/max_logit" in first  # the light preset has both
    train_module.train(make_cfg("trainer.max_steps=2"), tmp_path / "off")
    rows = [json.loads(line) for line in (tmp_path / "off" / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in r for r in rows) and not any("train/z_loss" in r for r in rows)
