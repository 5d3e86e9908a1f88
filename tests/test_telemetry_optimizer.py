"""telemetry/optimizer.py: the update ratio of one step, and AdamW's state (``update/{s}.{i}/adam_rms`` and
``optim/below_eps``) equal to a hand computation of the second moment from the gradients the optimizer saw."""

import math

import pytest
import torch
import torch.nn.functional as F

from runlog.metric_names import adam_below_eps, adam_rms, parse
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.telemetry import FULL, batch, make
from training.optim import build_optimizer
from training.presets import default_optim

BETA2 = 0.98


def adamw_steps(model, steps: int, eps: float, zero_grads=None) -> tuple[dict[str, float], list[dict]]:
    """``steps`` steps of the project's AdamW, each on its own batch; the telemetry after the last
    one and, per step, every parameter's gradient as the step read it (float64)."""
    opt = build_optimizer(model, default_optim(lr=1e-2, betas=(0.9, BETA2), eps=eps))
    tele = Telemetry(model, TelemetryConfig(every=1, adam=True))
    grads = []
    for step in range(steps):
        src, tgt_in, tgt_out = batch(seed=step)
        opt.zero_grad()
        F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=0).backward()
        if zero_grads is not None:
            zero_grads(model)
        grads.append({p: p.grad.double().clone() for p in model.parameters()})
        opt.step()
    tele.optimizer.record_adam(opt)
    return tele.collect(), grads


def by_hand(model, grads: list[dict], eps: float) -> tuple[dict[str, torch.Tensor], float]:
    """Per block, g_t^2 / max(v_hat_t, eps^2) at every coordinate, and the share of all coordinates with
    sqrt(v_hat_t) < eps, v_t = sum_s (1 - beta2) beta2^(t - s) g_s^2, v_hat_t = v_t / (1 - beta2^t)."""
    t = len(grads)
    v_hat = {}
    for p in model.parameters():
        v = sum((1 - BETA2) * BETA2 ** (t - 1 - s) * g[p].square() for s, g in enumerate(grads))
        v_hat[p] = v / (1 - BETA2**t)
    ratios = {}
    for stack, layers in (("enc", model.encoder), ("dec", model.decoder)):
        for i, layer in enumerate(layers):
            ratios[adam_rms(stack, i).name] = torch.cat(
                [(grads[-1][p].square() / v_hat[p].clamp_min(eps**2)).flatten() for p in layer.parameters()]
            )
    below = sum(int((v.sqrt() < eps).sum()) for v in v_hat.values())
    return ratios, below / sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("eps", [1e-9, 3e-3])  # the project's eps, and one that dominates many coordinates
def test_adam_rms_and_below_eps_equal_hand_computation_after_three_steps(eps):
    model = make()
    stats, grads = adamw_steps(model, 3, eps)
    ratios, below = by_hand(model, grads, eps)
    assert set(stats) == {*ratios, adam_below_eps().name}
    assert all(parse(name).name == name for name in stats)
    for name, ratio in ratios.items():
        assert stats[name] == pytest.approx(ratio.mean().sqrt().item(), rel=1e-5), name
    n = sum(p.numel() for p in model.parameters())
    # float32 state against float64 by hand: allow one coordinate on the other side of eps.
    assert stats[adam_below_eps().name] == pytest.approx(below, abs=1.5 / n)
    if eps > 1e-6:  # the case exercises both sides of the floor
        assert 0.05 < below < 0.95


def test_a_coordinate_with_zero_v_contributes_zero_not_nan():
    model = make()

    def zero_row(m):  # a hidden unit that never gets a gradient: its 32 weights keep v = 0
        m.encoder[0].ffn.branch.linear1.weight.grad[0].zero_()

    stats, grads = adamw_steps(model, 3, 1e-9, zero_row)
    ratios, below = by_hand(model, grads, 1e-9)
    name = adam_rms("enc", 0).name
    assert math.isfinite(stats[name])
    assert stats[name] == pytest.approx(ratios[name].mean().sqrt().item(), rel=1e-5)
    w = model.encoder[0].ffn.branch.linear1.weight
    g = grads[-1][w][0]
    assert torch.isnan(g.square() / torch.zeros_like(g)).all()  # what g^2 / v would give there
    n = sum(p.numel() for p in model.parameters())
    assert stats[adam_below_eps().name] == pytest.approx(below, abs=1.5 / n)
    assert stats[adam_below_eps().name] * n >= 32 - 0.5


def test_adam_rms_is_one_at_the_first_step_where_the_gradient_exceeds_eps():
    # v_1 = (1 - beta2) g^2, v_hat_1 = g^2: each coordinate with |g| >= eps gives g^2 / g^2 = 1, one below
    # eps (a key bias: softmax ignores it, so its gradient is 0 up to rounding) g^2 / eps^2 < 1.
    model = make()
    eps = 1e-9
    stats, grads = adamw_steps(model, 1, eps)
    for stack, layers in (("enc", model.encoder), ("dec", model.decoder)):
        for i, layer in enumerate(layers):
            g = torch.cat([grads[0][p].flatten() for p in layer.parameters()])
            big = g.abs() >= eps
            assert big.float().mean() > 0.9  # the rest: key biases, dead ReLU units
            expected = torch.where(big, 1.0, g.square() / eps**2).mean().sqrt().item()
            assert stats[adam_rms(stack, i).name] == pytest.approx(expected, abs=1e-6)


def test_adam_off_records_nothing_and_another_optimizer_is_a_value_error():
    model = make()
    stats, _ = adamw_steps(model, 1, 1e-9)
    assert stats
    tele = Telemetry(model, TelemetryConfig(every=1, adam=False))
    tele.optimizer.record_adam(torch.optim.SGD(model.parameters(), lr=0.1))
    assert tele.collect() == {}
    with pytest.raises(ValueError, match="telemetry.adam reads torch.optim.AdamW without amsgrad, got SGD; valid: "):
        Telemetry(model, TelemetryConfig(every=1)).optimizer.record_adam(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="got AdamW"):
        Telemetry(model, TelemetryConfig(every=1)).optimizer.record_adam(torch.optim.AdamW(model.parameters(), amsgrad=True))


def test_update_ratio_equals_hand_computation():
    model = make()
    src, tgt_in, tgt_out = batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tele = Telemetry(model, FULL)
    F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=0).backward()
    before = [p.detach().clone() for p in model.encoder[0].parameters()]
    grads = [p.grad.clone() for p in model.encoder[0].parameters()]
    with tele.optimizer.watch_update():
        opt.step()
    expected = 0.1 * torch.cat([g.flatten() for g in grads]).norm() / torch.cat([b.flatten() for b in before]).norm()
    assert tele.collect()["update/enc.0/ratio"] == pytest.approx(expected.item(), rel=1e-4)
