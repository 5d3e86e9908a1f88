"""``optim=muon``: torch's Muon against Keller Jordan's official one (tests/expected/muon_official.pt, written by
``python -m tests.reference.muon``), which parameters each optimizer gets, the learning rates, training under it
(fp32 and bf16), and exact resume of its state."""

import math
from dataclasses import replace

import pytest
import torch
import torch.optim._muon as torch_muon
from torch import nn

import train as train_module
from model.transformer import EncoderDecoder
from tests.helpers.config import ROOT, compose_conf, make_cfg, model_config
from tests.helpers.resume import EXACT, losses, rows, stop_by_sigterm
from training.checkpoint import load_checkpoint
from training.muon import MuonAdamW, newton_schulz_float32
from training.muon_config import NS_DTYPES, MuonConfig
from training.optim import build_optimizer, build_scheduler
from training.presets import default_optim
from training.schema import OptimConfig, ScheduleConfig, validate

OFFICIAL = torch.load(ROOT / "tests" / "expected" / "muon_official.pt")
LR, WEIGHT_DECAY = 0.02, 0.1  # tests.reference.muon's SingleDeviceMuon settings
KELLER = (3.4445, -4.775, 2.0315)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


class Hidden(nn.Module):
    """One hidden matrix (out, in) as the blocks list theirs (``linear_roles``), no bias."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(weight)

    def linear_roles(self) -> dict[str, nn.Linear]:
        return {"ffn.in": self.linear}


@pytest.mark.parametrize("case", ["wide", "tall"])
def test_newton_schulz_matches_the_official_iteration_to_its_own_bf16_rounding(case):
    from torch.optim._muon import _zeropower_via_newtonschulz

    inputs, official = OFFICIAL["cases"][case]["inputs"], OFFICIAL["cases"][case]["official"]
    ours = _zeropower_via_newtonschulz(inputs["grad1"], KELLER, 5, 1e-7).float()
    assert ours.shape == official["ns"].shape
    # The official iteration on G and on 3 G (equal in exact arithmetic) differ by 4-5 % (Frobenius): its bf16 rounding.
    own = rel(official["ns_times3"], official["ns"])
    assert 0.02 < own < 0.06
    assert rel(ours, official["ns"]) < 1.5 * own  # torch's addmm order rounds differently, no more than that
    # Both are the US'V^T of Keller's docstring: singular values in [0.5, 1.5], not 1.
    for out in (ours, official["ns"]):
        s = torch.linalg.svdvals(out)
        assert 0.6 < s.min() and s.max() < 1.2


@pytest.mark.parametrize("case", ["wide", "tall"])
def test_the_float32_iteration_is_torchs_without_its_bf16_rounding(case):
    from torch.optim._muon import _zeropower_via_newtonschulz

    inputs, official = OFFICIAL["cases"][case]["inputs"], OFFICIAL["cases"][case]["official"]
    ours = newton_schulz_float32(inputs["grad1"], KELLER, 5, 1e-7)
    assert ours.dtype == torch.float32 and ours.shape == official["ns"].shape
    own = rel(official["ns_times3"], official["ns"])  # the official bf16 iteration's own rounding, 4-5 %
    assert (
        rel(ours, official["ns"]) < 1.5 * own  # the bf16 roundings' share, as torch's own iteration's test allows
        and rel(ours, _zeropower_via_newtonschulz(inputs["grad1"], KELLER, 5, 1e-7).float()) < 1.5 * own
    )
    # in float32, G and 3 G give the same result but for float32 rounding
    assert rel(newton_schulz_float32(3 * inputs["grad1"], KELLER, 5, 1e-7), ours) < 1e-5


@pytest.mark.parametrize("ns_dtype", NS_DTYPES)
def test_ns_dtype_picks_the_iteration_that_muons_step_runs(ns_dtype):
    from torch.optim._muon import _zeropower_via_newtonschulz

    inputs = OFFICIAL["cases"]["wide"]["inputs"]
    model = Hidden(inputs["weight"])
    opt = build_optimizer(
        model, default_optim(lr=LR, weight_decay=0.0, muon=MuonConfig(adjust_lr_fn="original", ns_dtype=ns_dtype))
    )
    model.linear.weight.grad = inputs["grad1"].clone()
    opt.step()
    g = inputs["grad1"].lerp(inputs["grad1"] * (1 - 0.95), 0.95)  # the first step's Nesterov update
    iteration = _zeropower_via_newtonschulz if ns_dtype == "bfloat16" else newton_schulz_float32  # auto: a CPU's
    expected = inputs["weight"] - LR * iteration(g, KELLER, 5, 1e-7).float()  # A < B: Keller's adjustment is 1
    assert torch.allclose(model.linear.weight.detach(), expected, rtol=0, atol=1e-7)
    assert torch_muon._zeropower_via_newtonschulz is _zeropower_via_newtonschulz  # restored after the step


def test_an_unknown_ns_dtype_is_a_one_line_error_naming_the_choices():
    with pytest.raises(ValueError, match=r"optim.muon.ns_dtype='float16' is invalid; valid: auto, bfloat16, float32$"):
        MuonConfig(ns_dtype="float16")


@pytest.mark.parametrize("case", ["wide", "tall"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("ns_dtype", ["bfloat16", "float32"])
def test_two_updates_match_the_official_muon_update(case, nesterov, ns_dtype):
    # normlab's optimizer with Keller's lr adjustment (original: sqrt(max(1, A / B)), which muon_update applies to
    # its update) against the official muon_update: the momentum exactly, the update to NS's bf16 rounding.
    inputs, official = OFFICIAL["cases"][case]["inputs"], OFFICIAL["cases"][case]["official"]
    model = Hidden(inputs["weight"])
    muon = MuonConfig(adjust_lr_fn="original", nesterov=nesterov, ns_dtype=ns_dtype)
    opt = build_optimizer(model, default_optim(lr=LR, weight_decay=WEIGHT_DECAY, muon=muon))
    assert isinstance(opt, MuonAdamW) and not opt.adamw.param_groups[0]["params"] + opt.adamw.param_groups[1]["params"]
    w = model.linear.weight
    for i in (1, 2):
        before = w.detach().clone()
        w.grad = inputs[f"grad{i}"].clone()
        opt.step()
        assert torch.equal(opt.muon.state[w]["momentum_buffer"], official[f"momentum{i}_nesterov={nesterov}"])
        update = (before * (1 - LR * WEIGHT_DECAY) - w.detach()) / LR
        assert rel(update, official[f"update{i}_nesterov={nesterov}"]) < 0.08
    if nesterov:  # SingleDeviceMuon: Nesterov only
        assert rel(w.detach() - inputs["weight"], official["weight2"] - inputs["weight"]) < 0.08


@pytest.mark.parametrize("case", ["wide", "tall"])
def test_match_rms_adamw_scales_the_update_to_rms_about_0_2_times_lr(case):
    # Moonlight: lr * 0.2 sqrt(max(A, B)) times NS's output (RMS about 1 / sqrt(max(A, B))), so an update of RMS
    # about 0.2 lr, AdamW's typical one.
    inputs = OFFICIAL["cases"][case]["inputs"]
    model = Hidden(inputs["weight"])
    opt = build_optimizer(model, default_optim(lr=LR, weight_decay=0.0, muon=MuonConfig()))
    model.linear.weight.grad = inputs["grad1"].clone()
    opt.step()
    update = (inputs["weight"] - model.linear.weight.detach()) / LR
    official = OFFICIAL["cases"][case]["official"]["update1_nesterov=True"]  # NS * sqrt(max(1, A / B))
    a, b = inputs["weight"].shape
    assert rel(update, official * 0.2 * math.sqrt(max(a, b)) / math.sqrt(max(1, a / b))) < 0.08
    assert 0.15 < update.square().mean().sqrt().item() < 0.2


def default_model() -> tuple[EncoderDecoder, OptimConfig]:
    """The default model (model=small, not the tests' tiny one) and ``optim=muon``'s keys."""
    cfg = compose_conf("optim=muon")
    return EncoderDecoder(model_config(cfg, 40, 40)), validate(cfg).optim


def test_muon_gets_the_blocks_attention_and_ffn_matrices_and_adamw_the_rest():
    model, optim = default_model()
    opt = build_optimizer(model, optim)
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay, muon = ([names[id(p)] for p in g["params"]] for g in opt.param_groups)
    attn = [f"{s}.branch.{a}_proj.weight" for s in ("self_attn", "cross_attn") for a in ("q", "k", "v", "out")]
    sub = {"encoder": attn[:4] + ["ffn.branch.linear1.weight", "ffn.branch.linear2.weight"]}
    sub["decoder"] = attn + ["ffn.branch.linear1.weight", "ffn.branch.linear2.weight"]
    layers = {"encoder": model.cfg.n_enc_layers, "decoder": model.cfg.n_dec_layers}
    assert sorted(muon) == sorted(f"{st}.{i}.{n}" for st, ns in sub.items() for i in range(layers[st]) for n in ns)
    assert decay == ["src_embed.tokens.weight", "tgt_embed.tokens.weight"]  # the output projection is tgt's (tied)
    assert model.cfg.tie_embeddings and sorted(names.values()) == sorted(decay + no_decay + muon)
    assert all(model.get_parameter(n).dim() == 1 for n in no_decay)  # gains and biases
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0, 0.01]
    assert opt.muon.defaults["adjust_lr_fn"] == "match_rms_adamw" and opt.muon.defaults["nesterov"]
    assert (opt.muon.defaults["momentum"], opt.muon.defaults["ns_steps"]) == (0.95, 5)
    assert opt.muon.defaults["ns_coefficients"] == KELLER and opt.adamw.defaults["eps"] == 1e-9


def test_the_schedule_gives_the_muon_group_lr_times_lr_scale_and_a_load_keeps_this_runs_scale():
    model, optim = default_model()
    scaled = replace(optim, muon=replace(optim.muon, lr_scale=10.0))
    opt = build_optimizer(model, scaled)
    sched = build_scheduler(opt, 2e-3, ScheduleConfig(4, "linear"), 8)
    assert sched.get_last_lr() == pytest.approx([5e-4, 5e-4, 5e-3])  # warmup step 0: peak / 4
    state = opt.state_dict()
    fresh = build_optimizer(model, optim)  # lr_scale 1 loads a checkpoint written with 10
    fresh.load_state_dict(state)
    assert fresh.param_groups[2]["lr_scale"] == 1.0 and fresh.param_groups[2] is fresh.muon.param_groups[0]
    assert build_scheduler(fresh, 2e-3, ScheduleConfig(0, "constant"), 8).get_last_lr() == pytest.approx([2e-3] * 3)
    adamw_state = build_optimizer(model, replace(optim, muon=None)).state_dict()
    with pytest.raises(ValueError, match=r"optim=muon cannot load an optimizer state with the entries \['param_groups', "):
        fresh.load_state_dict(adamw_state)


def test_an_optim_muon_checkpoint_resumed_under_adamw_is_an_error_naming_the_entry(tmp_path):
    small = ["telemetry.every=0", "trainer.eval_max_examples=5", "trainer.test_max_examples=5"]
    train_module.train(make_cfg("optim=muon", "trainer.max_steps=2", *small), tmp_path)
    message = r"^train.resume: the optimizer entry of .*checkpoint.pt does not fit this run's optimizer \(KeyError: "
    with pytest.raises(ValueError, match=message + r"'param_groups'\); resume with the settings it was saved with, or "):
        train_module.train(make_cfg("trainer.max_steps=3", *small), tmp_path)
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 2  # the checkpoint is kept as it was


@pytest.mark.parametrize(("override", "message"), [
    ("optim.muon.adjust_lr_fn=rms", "optim.muon.adjust_lr_fn='rms' is invalid; valid: original, match_rms_adamw"),
    ("optim.muon.momentum=1.0", "optim.muon.momentum=1.0 is invalid; it must be a number in [0, 1)"),
    ("optim.muon.lr_scale=0", "optim.muon.lr_scale=0 is invalid; it must be a finite number > 0"),
    ("+optim.muon.beta=0.9", "optim.muon.beta is not a key of optim.muon; valid keys: momentum, nesterov, ns_steps, "
                             "ns_coefficients, adjust_lr_fn, lr_scale, ns_dtype"),
])  # fmt: skip
def test_a_bad_muon_key_is_a_value_error_naming_it(override, message):
    with pytest.raises(ValueError) as error:
        validate(make_cfg("optim=muon", override))
    assert str(error.value) == message


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_optim_muon_trains_the_tiny_model_and_telemetry_reads_its_adamw_part(tmp_path, precision):
    cfg = make_cfg("optim=muon", f"trainer.precision={precision}", "schedule.warmup_steps=5")  # 20 steps
    train_module.train(cfg, tmp_path)
    logged = rows(tmp_path)
    loss = [r["train/loss"] for r in logged if "train/loss" in r]
    assert all(math.isfinite(x) for x in loss) and loss[-1] < loss[0] - 0.5
    record = next(r for r in logged if "optim/below_eps" in r)
    # A share of AdamW's coordinates only (Muon's matrices have no v): mostly embedding rows of absent tokens.
    assert 0 < record["optim/below_eps"] < 0.2 and "update/enc.0/adam_rms" in record
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert set(ckpt["optimizer"]) == {"adamw", "muon"} and len(ckpt["optimizer"]["muon"]["state"]) == 2 * 6 + 2 * 10


def test_an_optim_muon_run_stopped_by_sigterm_and_resumed_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    args = ["optim=muon", *EXACT]
    train_module.train(make_cfg(*args), tmp_path / "straight")
    stop_by_sigterm(monkeypatch, make_cfg(*args), tmp_path / "stopped", 5)
    assert load_checkpoint(tmp_path / "stopped" / "checkpoint.pt")["step"] == 5
    train_module.train(make_cfg(*args), tmp_path / "stopped")
    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "stopped")
    assert sorted(resumed) == list(range(1, 13)) and resumed == straight  # loss and lr, bit for bit
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.pt") for d in ("straight", "stopped"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for part in ("muon", "adamw"):
        sa, sb = a["optimizer"][part]["state"], b["optimizer"][part]["state"]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
