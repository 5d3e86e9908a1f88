"""telemetry/optimizer.py's per-matrix update: ``update/{s}.{i}.{m}/rms`` and ``.../ratio`` equal the weight change of
one step, and sit at the scale each optimizer's rule gives: lr at AdamW's first step (lr g / (|g| + eps)), and under
Muon with match_rms_adamw 0.2 lr times the quadratic mean of the orthogonalized update's singular values (Moonlight,
arXiv 2502.16982, sec. 2.2), recomputed here from the gradient with the Newton-Schulz iteration the default
``optim.muon.ns_dtype`` runs on a CPU (float32: ``training.muon.newton_schulz_float32``)."""

import pytest
import torch
import torch.nn.functional as F

from runlog.metric_names import RESIDUALS, matrix_site, matrix_update, parse
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.telemetry import batch, make
from training.muon import newton_schulz_float32
from training.muon_config import MuonConfig
from training.optim import build_optimizer
from training.presets import default_optim, group_keys

LR, WEIGHT_DECAY = 1e-2, 0.01


def matrices(model) -> dict[str, torch.nn.Linear]:
    """``update/{s}.{i}.{m}`` -> that block matrix's linear layer."""
    out = {}
    for stack, layers in (("enc", model.encoder), ("dec", model.decoder)):
        for i, layer in enumerate(layers):
            for r in (r for r in RESIDUALS if hasattr(layer, r)):
                for role, linear in getattr(layer, r).branch.linear_roles().items():
                    out[matrix_update(stack, i, matrix_site(r, role), "rms").where] = linear
    return out


def one_step(model, optim) -> tuple[dict[str, float], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """One recorded step of ``build_optimizer(model, optim)``: the telemetry, and per matrix (W before, its gradient)."""
    opt = build_optimizer(model, optim)
    tele = Telemetry(model, TelemetryConfig(every=1, updates=True, adam=False))
    src, tgt_in, tgt_out = batch()
    F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=0).backward()
    seen = {where: (lin.weight.detach().clone(), lin.weight.grad.clone()) for where, lin in matrices(model).items()}
    with tele.optimizer.watch_update():
        opt.step()
    return tele.collect(), seen


def test_a_matrix_update_is_the_weight_change_and_adamws_first_is_lr():
    model = make()
    stats, seen = one_step(model, default_optim(lr=LR, weight_decay=WEIGHT_DECAY))
    assert len(seen) == 2 * 6 + 2 * 10  # per encoder block q, k, v, out, ffn in and out; a decoder block's 4 more
    for where, lin in matrices(model).items():
        change = lin.weight.detach() - seen[where][0]
        rms, ratio = stats[f"update/{where}/rms"], stats[f"update/{where}/ratio"]
        assert parse(f"update/{where}/rms").where == where and parse(f"update/{where}/ratio").stat == "ratio"
        assert rms == pytest.approx(change.square().mean().sqrt().item(), rel=1e-5)
        assert ratio == pytest.approx((change.norm() / seen[where][0].norm()).item(), rel=1e-5)
        # step 1: m_hat = g, v_hat = g^2, so each coordinate with |g| >> eps moves by lr, plus decay lr * wd * w
        g, w = seen[where][1], seen[where][0]
        expected = (LR * g / (g.abs() + 1e-9) + LR * WEIGHT_DECAY * w).square().mean().sqrt().item()
        assert rms == pytest.approx(expected, rel=1e-4)
        assert 0.95 * LR < rms < 1.01 * LR  # a dead ReLU unit's rows (g = 0) move by the decay only


def test_muons_update_rms_is_02_lr_times_the_singular_values_quadratic_mean():
    muon = MuonConfig(**group_keys("optim", "muon")["muon"])
    assert muon.adjust_lr_fn == "match_rms_adamw"  # the default Muon preset's rule, the one with a known scale
    assert muon.ns_dtype == "auto"  # float32 on a CPU
    model = make()
    stats, seen = one_step(model, default_optim(lr=LR, weight_decay=WEIGHT_DECAY, muon=muon))
    for where, (w, g) in seen.items():
        buf = torch.zeros_like(g).lerp_(g, 1 - muon.momentum)  # torch.optim.Muon's first step, nesterov
        o = newton_schulz_float32(g.lerp(buf, muon.momentum), muon.ns_coefficients, muon.ns_steps, 1e-7)
        step = 0.2 * max(w.shape) ** 0.5 * LR
        expected = (LR * WEIGHT_DECAY * w + step * o).square().mean().sqrt().item()
        assert stats[f"update/{where}/rms"] == pytest.approx(expected, rel=1e-3), where  # float32 rounding of w - w_new
        sigma = torch.linalg.svdvals(o.float())
        scale = sigma.square().mean().sqrt().item()  # RMS(o) sqrt(max(A, B)) of a (A, B) matrix, for min(A, B) values
        assert stats[f"update/{where}/rms"] == pytest.approx(0.2 * LR * scale, rel=0.01), where  # the decay: < 1 %
        assert 0.3 < scale < 1.0 and sigma.max() < 1.25  # Newton-Schulz's approximate orthogonalization
