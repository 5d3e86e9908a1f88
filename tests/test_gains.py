"""Zero-centred gains (``norm.gain=unit_offset``, ``model.gains``): the gain stored as w and applied
as 1 + w. The model computes at init exactly what plain gains compute, its gradients are the same numbers, the
stored parameter has its own name, the native norms take it, telemetry reports the effective gain, and under
normlab's optimizer (no weight decay on gains) both train alike; with decay they would not."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig, NormConfig
from model.kinds import NORM_PAIRS
from model.norms import build_norm
from model.transformer import EncoderDecoder
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from training.optim import build_optimizer
from training.presets import default_optim

D = 16  # sqrt(16) = 4: ScaleNorm's w = sqrt(D) - 1 = 3 is exact, so its gain 1 + w is too
GAINED = [
    (k, i) for k, i in NORM_PAIRS if isinstance(getattr(build_norm(k, D, impl=i, attention=True), "weight", None), nn.Parameter)
]
READS_BATCH = ("batchnorm", "powernorm")


def run(norm: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    return norm(x, torch.ones(x.shape[:2], dtype=torch.bool)) if kind in READS_BATCH else norm(x)


def test_every_kind_with_a_gain_is_covered():
    assert {k for k, _ in GAINED} == {"layernorm", "annotated_ln", "rmsnorm", "scalenorm", "dyt", "dyisru", "seednorm", "derf",
                                      "batchnorm", "powernorm"}  # fmt: skip
    assert ("rmsnorm", "native") in GAINED and ("layernorm", "native") in GAINED and ("batchnorm", "native") in GAINED


@pytest.mark.parametrize(("kind", "impl"), GAINED, ids=lambda v: str(v))
def test_unit_offset_equals_plain_at_init_bitwise_forward_and_backward(kind, impl):
    x = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(0)) * 2
    outs = {}
    for gain in ("plain", "unit_offset"):
        norm = build_norm(kind, D, impl=impl, gain=gain)
        xg = x.clone().requires_grad_()
        y = run(norm, kind, xg)
        (y * torch.linspace(-1, 1, D)).sum().backward()  # a non-uniform upstream gradient
        stored = dict(norm.named_parameters())["weight" if gain == "plain" else "parametrizations.weight.original"]
        outs[gain] = (y.detach(), xg.grad, stored.grad, stored.detach().clone())
    (y0, gx0, gw0, w0), (y1, gx1, gw1, w1) = outs["plain"], outs["unit_offset"]
    assert torch.equal(y0, y1) and torch.equal(gx0, gx1)
    assert torch.equal(gw0, gw1)  # d(1 + w)/dw = 1: the gain's gradient is w's, to the bit
    assert torch.equal(w1, w0 - 1)  # 0 for every gain that starts at 1 (ScaleNorm: sqrt(D) - 1)


def test_state_dict_names_the_stored_w_so_a_plain_checkpoint_cannot_load_as_w():
    plain, zc = (build_norm("rmsnorm", D, gain=g) for g in ("plain", "unit_offset"))
    assert list(plain.state_dict()) == ["weight"]
    assert list(zc.state_dict()) == ["parametrizations.weight.original"]
    assert torch.equal(zc.state_dict()["parametrizations.weight.original"], torch.zeros(D))
    with pytest.raises(RuntimeError, match="Missing key"):
        zc.load_state_dict(plain.state_dict())
    zc.load_state_dict({"parametrizations.weight.original": torch.full((D,), 0.5)})
    assert torch.equal(zc.weight, torch.full((D,), 1.5))  # .weight reads the effective gain 1 + w


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_native_takes_unit_offset_and_equals_custom_and_the_formula(kind):
    x = torch.randn(4, 7, D, generator=torch.Generator().manual_seed(1))
    w = torch.randn(D, generator=torch.Generator().manual_seed(2)) * 0.3
    ys = []
    for impl in ("custom", "native"):
        norm = build_norm(kind, D, impl=impl, eps=1e-6, gain="unit_offset")
        with torch.no_grad():
            norm.parametrizations.weight.original.copy_(w)
        ys.append(norm(x))
    formula = F.rms_norm(x, (D,), 1 + w, 1e-6) if kind == "rmsnorm" else F.layer_norm(x, (D,), 1 + w, torch.zeros(D), 1e-6)
    torch.testing.assert_close(ys[0], ys[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(ys[0], formula, atol=1e-6, rtol=0)
    assert not torch.allclose(ys[0], F.rms_norm(x, (D,), w, 1e-6), atol=1e-3)  # w alone is not the gain


def test_kinds_without_a_gain_ignore_it_and_a_bad_value_is_one_line():
    assert isinstance(build_norm("none", D, gain="unit_offset"), nn.Identity)
    assert list(build_norm("l2", D, gain="unit_offset", attention=True).parameters()) == []
    with pytest.raises(ValueError, match=r"^unknown norm.gain 'zero'; valid: plain, unit_offset$"):
        build_norm("rmsnorm", D, gain="zero")
    with pytest.raises(ValueError, match=r"^unknown norm.gain 'zero'; valid: plain, unit_offset$"):
        NormConfig(gain="zero")


def model(gain: str, **norm) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=20, tgt_vocab=20, d_model=D, n_heads=2, d_ff=32, n_enc_layers=2, n_dec_layers=2,
                      dropout=0.0, norm=NormConfig(kind="rmsnorm", gain=gain, **norm))  # fmt: skip
    return EncoderDecoder(cfg)


def effective_gains(m: EncoderDecoder) -> dict[str, torch.Tensor]:
    """Module path -> the gain every norm of ``m`` applies (``weight``: 1 + w under unit_offset)."""
    slots = ("norm", "norm_in", "norm_branch", "norm_out")
    return {
        name: mod.weight.detach().clone() for name, mod in m.named_modules() if name.endswith(slots) and hasattr(mod, "weight")
    }


def test_every_norm_of_the_model_takes_the_gain_and_the_init_is_the_plain_models():
    plain, zc = model("plain", qk="rmsnorm", placement="sandwich"), model("unit_offset", qk="rmsnorm", placement="sandwich")
    # 2 x 2 + 2 x 3 sandwich sublayers with 2 norms each, 2 + 2 x 2 attentions with q and k norms, 2 final norms
    assert len(effective_gains(zc)) == 2 * (2 * 2 + 2 * 3) + 2 * (2 + 2 * 2) + 2
    sd_plain, sd_zc = plain.state_dict(), zc.state_dict()
    gains = {f"{name}.weight" for name in effective_gains(plain)}
    assert len(sd_zc) == len(sd_plain)
    for name, value in sd_plain.items():  # the same init, bit for bit; each gain stored as w = gain - 1
        if name in gains:
            assert torch.equal(sd_zc[name.removesuffix("weight") + "parametrizations.weight.original"], value - 1), name
        else:
            assert torch.equal(sd_zc[name], value), name
    src, tgt = torch.randint(1, 20, (3, 6)), torch.randint(1, 20, (3, 5))
    assert torch.equal(plain(src, tgt), zc(src, tgt))


def test_normlab_decays_no_gain_so_plain_and_unit_offset_train_alike():
    """``training.optim``: weight decay on dim >= 2 parameters only. w is 1-D, so it is not decayed, and AdamW's step
    on w is the step on the gain: the effective gains and the losses agree to float rounding after 5 steps."""
    src, tgt = torch.randint(1, 20, (4, 6), generator=torch.Generator().manual_seed(3)), torch.randint(1, 20, (4, 6))
    trained = {}
    for gain in ("plain", "unit_offset"):
        m = model(gain, placement="sandwich", qk="rmsnorm")
        opt = build_optimizer(m, default_optim(lr=1e-2, weight_decay=0.1))
        decayed = {id(p) for p in opt.param_groups[0]["params"]}
        assert all(id(p) not in decayed for name, p in m.named_parameters() if "norm" in name)
        losses = []
        for _ in range(5):
            loss = F.cross_entropy(m(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        trained[gain] = (losses, effective_gains(m))
    (l0, g0), (l1, g1) = trained["plain"], trained["unit_offset"]
    assert l0 == pytest.approx(l1, abs=1e-5)
    assert max((g0[k] - g1[k]).abs().max().item() for k in g0) < 1e-5
    assert max((g0[k] - 1).abs().max().item() for k in g0) > 1e-2  # the gains did move


def test_with_decay_on_gains_plain_decays_toward_zero_and_unit_offset_toward_identity():
    """Why the two differ elsewhere: AdamW's decoupled decay p <- p - lr * lambda * p, with a zero gradient,
    shrinks a plain gain 1 to 1 - lr * lambda and leaves w = 0, the gain 1, where it is."""
    lr, wd = 0.1, 0.5
    for gain, expected in (("plain", 1 - lr * wd), ("unit_offset", 1.0)):
        norm = build_norm("rmsnorm", D, gain=gain)
        opt = torch.optim.AdamW(norm.parameters(), lr=lr, weight_decay=wd)
        for p in norm.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        assert torch.allclose(norm.weight, torch.full((D,), expected)), gain


def test_telemetry_reports_the_effective_gain():
    m = model("unit_offset", qk="rmsnorm")
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) - 0.75)  # w in [-0.75, 0.25): |1 + w| differs from |w|
    tele = Telemetry(m, TelemetryConfig(every=1, grads=False, weights=False))
    tele.parameters.record()
    stats = tele.collect()
    sites = {"enc.0.ffn.norm_in": m.encoder[0].ffn.norm_in, "dec.1.cross_attn.k_norm": m.decoder[1].cross_attn.branch.k_norm}
    for key, module in sites.items():
        gain = 1 + module.parametrizations.weight.original.detach()
        assert stats[f"scale/{key}/gain_mean"] == pytest.approx(gain.mean().item(), rel=1e-6)
        assert stats[f"scale/{key}/gain_max"] == pytest.approx(gain.abs().max().item(), rel=1e-6)
