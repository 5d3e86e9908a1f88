"""``model.weight_norm``: WeightNorm (Salimans & Kingma 2016, eq. 2, w = g v / ||v||) on the blocks' linear layers,
applied after the init (the model at step 0 is the same), g and v the parameters with the paper's gradients
(eq. 3), no weight decay on g, and the things that read weights by name: checkpoints, resume, telemetry."""

import json

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import train as train_module
from model.config import ModelConfig, NormConfig
from model.transformer import EncoderDecoder
from model.weight_norm import weight_norm_gains
from runlog.renames import with_current_names
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.config import make_cfg, model_config
from tests.helpers.resume import EXACT, losses, stop_by_sigterm
from training.checkpoint import load_checkpoint, model_from
from training.optim import build_optimizer
from training.presets import default_optim

V = 12
ROLES = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2")


def build(weight_norm: bool, seed: int = 0, **norm) -> EncoderDecoder:
    cfg = ModelConfig(src_vocab=V, tgt_vocab=V, d_model=32, n_heads=4, d_ff=64, n_enc_layers=2, n_dec_layers=2,
                      dropout=0.0, weight_norm=weight_norm, norm=NormConfig(**norm))  # fmt: skip
    torch.manual_seed(seed)
    return EncoderDecoder(cfg)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(4, V, (3, 7), generator=g), torch.randint(4, V, (3, 6), generator=g)


def block_linears(model: EncoderDecoder) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith(("encoder.", "decoder."))}


def test_every_block_linear_holds_g_and_v_and_nothing_else_is_reparametrized():
    model = build(True)
    linears = block_linears(model)
    assert len(linears) == 2 * 6 + 2 * 10 and {n.rsplit(".", 1)[1] for n in linears} == set(ROLES)
    for name, linear in linears.items():
        assert parametrize.is_parametrized(linear, "weight"), name
        params = dict(linear.named_parameters())
        assert set(params) == {"bias", "parametrizations.weight.original0", "parametrizations.weight.original1"}
        g, v = params["parametrizations.weight.original0"], params["parametrizations.weight.original1"]
        assert g.shape == (linear.out_features, 1) and v.shape == (linear.out_features, linear.in_features)
        torch.testing.assert_close(linear.weight, g * v / v.norm(dim=1, keepdim=True), atol=1e-7, rtol=1e-6)  # eq. 2, dim 0
        torch.testing.assert_close(g, v.norm(dim=1, keepdim=True), atol=0, rtol=0)  # at init g = ||v||, v = the init's w
    assert not any(parametrize.is_parametrized(m) for m in (model.output, model.src_embed.tokens, model.tgt_embed.tokens))
    assert model.output.weight is model.tgt_embed.tokens.weight  # still tied
    assert len(weight_norm_gains(model)) == len(linears) and weight_norm_gains(build(False)) == []


# Placements whose init rules write to the block matrices (DeepNorm redraws, T-Fixup and B2T scale), and two plain ones.
@pytest.mark.parametrize(
    "norm",
    [{}, {"kind": "none"}, {"placement": "deepnorm"}, {"placement": "tfixup", "kind": "none"}, {"placement": "b2t"}],
    ids=["pre_ln", "no_norm", "deepnorm", "tfixup", "b2t"],
)
def test_the_model_at_init_is_the_same_with_and_without_weight_norm(norm):
    plain, normed = build(False, **norm).eval(), build(True, **norm).eval()
    for (name, a), b in zip(block_linears(plain).items(), block_linears(normed).values(), strict=True):
        torch.testing.assert_close(b.weight, a.weight, atol=1e-6, rtol=0, msg=name)
    src, tgt = batch()
    with torch.no_grad():
        want = plain(src, tgt)
        # within 1e-6 of the logits' scale (measured: 1e-7 to 6e-7; no_norm's logits reach ~19 at init)
        torch.testing.assert_close(normed(src, tgt), want, atol=1e-6 * want.abs().max().item(), rtol=0)


def test_gradients_reach_g_and_v_as_the_papers_eq_3_gives_them():
    # grad_g = (grad_w . v) / ||v||, grad_v = g / ||v|| grad_w - g grad_g / ||v||^2 v (Salimans & Kingma 2016, eq. 3),
    # grad_w taken from the plain model, whose weights are the same w.
    plain, normed = build(False, kind="none"), build(True, kind="none")
    src, tgt = batch()
    plain(src, tgt).square().mean().backward()
    normed(src, tgt).square().mean().backward()
    for (name, a), b in zip(block_linears(plain).items(), block_linears(normed).values(), strict=True):
        g, v = b.parametrizations.weight.original0, b.parametrizations.weight.original1
        gw, norm = a.weight.grad, v.detach().norm(dim=1, keepdim=True)
        grad_g = (gw * v.detach()).sum(1, keepdim=True) / norm
        grad_v = g.detach() / norm * gw - g.detach() * grad_g / norm**2 * v.detach()
        scale = gw.abs().max().item()  # no norm: gradients of 0.4-10; float32 rounding measured up to 3e-5 of scale
        assert g.grad.abs().max() > 0.1 * scale and v.grad.abs().max() > 0.1 * scale, name
        torch.testing.assert_close(g.grad, grad_g, atol=1e-5 * scale, rtol=1e-4, msg=name)
        torch.testing.assert_close(v.grad, grad_v, atol=1e-5 * scale, rtol=1e-4, msg=name)


def test_g_gets_no_weight_decay_and_v_does():
    model = build(True)
    opt = build_optimizer(model, default_optim(lr=1e-3))
    decayed, free = ({id(p) for p in group["params"]} for group in opt.param_groups)
    assert [group["weight_decay"] for group in opt.param_groups] == [0.01, 0.0]
    for linear in block_linears(model).values():
        assert id(linear.parametrizations.weight.original0) in free and id(linear.parametrizations.weight.original1) in decayed
    assert id(model.tgt_embed.tokens.weight) in decayed and id(model.encoder[0].ffn.norm_in.weight) in free
    assert len(decayed) == 2 + 32  # the two embeddings (the output is tied) and every v
    plain = build_optimizer(build(False), default_optim(lr=1e-3))
    assert len(plain.param_groups[0]["params"]) == 2 + 32  # the same matrices, plain


def test_a_state_dict_round_trips_and_names_g_and_v():
    model = build(True).eval()
    state = model.state_dict()
    assert "encoder.0.self_attn.branch.q_proj.parametrizations.weight.original0" in state
    assert "encoder.0.self_attn.branch.q_proj.weight" not in state
    ckpt = {"model_config": model.cfg.to_dict(), "model": state}
    restored = model_from(ckpt).eval()  # built from the saved config (weight_norm true), another draw, then loaded
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(restored(src, tgt), model(src, tgt), atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="Missing key"):  # a plain model cannot take it silently
        build(False).load_state_dict(state)


def test_weight_spectra_read_the_computed_weight():
    cfg = TelemetryConfig(every=1, grads=False, scales=False)
    stats = []
    for weight_norm in (False, True):
        tele = Telemetry(build(weight_norm), cfg)
        tele.parameters.record()
        stats.append(tele.collect())
    assert stats[0].keys() == stats[1].keys() and "weight/dec.1.cross_attn.v/sigma_max" in stats[1]
    for key, value in stats[0].items():
        assert stats[1][key] == pytest.approx(value, rel=1e-5), key


def test_the_config_key():
    assert model_config(make_cfg(), V, V).weight_norm is False
    assert model_config(make_cfg("model.weight_norm=true"), V, V).weight_norm is True
    with pytest.raises(ValueError, match="^model.weight_norm must be true or false, got 'yes'$"):
        ModelConfig(src_vocab=V, tgt_vocab=V, weight_norm="yes")
    old = with_current_names({"model": {"d_model": 32}})["model"]
    keys = ("d_model", "weight_norm", "residual_streams")
    assert {k: old[k] for k in keys} == {"d_model": 32, "weight_norm": False, "residual_streams": 1}
    assert ModelConfig.from_dict({"src_vocab": V, "tgt_vocab": V}).weight_norm is False  # an old checkpoint's model_config


WN = ["model.weight_norm=true", "norm=no_norm", "telemetry.updates=true"]


def test_a_tiny_model_without_norms_trains_and_resumes_exactly_with_weight_norm(tmp_path, monkeypatch):
    train_module.train(make_cfg(*EXACT, *WN), tmp_path / "straight")
    straight = losses(tmp_path / "straight")
    first, last = straight[1][0], straight[max(straight)][0]
    assert last < first - 0.25, (first, last)  # from ln(vocab) ~ 3.8 toward the unigram entropy
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert any("weight/enc.0.ffn.in/sigma_max" in r and "update/enc.0/ratio" in r for r in rows)  # telemetry reads it
    ckpt = load_checkpoint(tmp_path / "straight" / "checkpoint.pt")
    assert ckpt["model_config"]["weight_norm"] is True
    assert "decoder.1.ffn.branch.linear2.parametrizations.weight.original1" in ckpt["model"]
    # Stopped by SIGTERM at step 5 and resumed: the same losses as the straight run (g, v and AdamW's state restored).
    stop_by_sigterm(monkeypatch, make_cfg(*EXACT, *WN), tmp_path / "stopped", 5)
    train_module.train(make_cfg(*EXACT, *WN), tmp_path / "stopped")
    assert losses(tmp_path / "stopped") == straight
    with pytest.raises(ValueError, match=r"was trained with another model \(weight_norm: checkpoint True, this run False\)"):
        train_module.train(make_cfg(*EXACT, "norm=no_norm", f"train.resume={tmp_path / 'straight' / 'checkpoint.pt'}"),
                           tmp_path / "plain")  # fmt: skip


@pytest.mark.slow  # compiling the two layers takes about 2 minutes on a CPU
def test_compiled_layers_compute_what_eager_ones_do():
    model = build(True)
    src, tgt = batch()
    model(src, tgt).square().mean().backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        want = model(src, tgt)
    model.zero_grad()
    model.compile_layers()
    out = model(src, tgt)
    out.square().mean().backward()
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    scale = max(g.abs().max() for g in eager.values())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager[name], atol=1e-5 * scale, rtol=1e-4, msg=name)
