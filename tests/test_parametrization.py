"""model.parametrization=mup: the factors against microsoft/mup's own (tests/expected/mup_official.json, written by
tests/reference/mup.py), the multipliers on the attention and output logits, equality with sp at the base width for
every norm kind and placement, and the refusals."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model.kinds import NORM_KINDS
from model.norm_config import NormConfig
from model.parametrization import UNRULED_KINDS
from model.transformer import EncoderDecoder
from tests.helpers.parametrization import NORM_PRESETS, init_logits, norm_of, step, vocab
from tests.reference.mup import CASES
from training.muon_config import MuonConfig
from training.mup import lr_factors
from training.optim import build_optimizer, build_scheduler, scheduled_lr
from training.presets import default_optim
from training.schema import ScheduleConfig

OFFICIAL = json.loads((Path(__file__).parent / "expected" / "mup_official.json").read_text())
READOUT = {"src_embed.tokens.weight", "tgt_embed.tokens.weight", "output.weight"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hidden_matrices_get_muadamw_s_factors_and_only_the_embeddings_differ_from_mup(case: str) -> None:
    cfg = CASES[case]
    official = OFFICIAL[case]["params"]
    assert (OFFICIAL[case]["d_model"], OFFICIAL[case]["base_d_model"]) == (cfg.d_model, cfg.base_d_model)
    model = EncoderDecoder(cfg)
    factors = lr_factors(model)
    opt = build_optimizer(model, default_optim(lr=1.0, weight_decay=1.0))
    group = {id(p): g for g in opt.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert names.keys() == official.keys()
    hidden = 0
    for name, p in names.items():
        mine, theirs = factors[id(p)], official[name]
        assert group[id(p)]["lr_scale"] == mine
        if theirs["ninf"] == 2:  # a hidden matrix: MuAdamW's lr and weight decay, exactly
            hidden += 1
            assert (mine, group[id(p)]["weight_decay"]) == (theirs["lr"], theirs["weight_decay"]), name
        elif name in READOUT:  # the stated difference: 1 / sqrt(m) for normlab's sqrt(D)-scaled embeddings
            assert theirs["lr"] == 1.0 and mine == pytest.approx(1 / math.sqrt(cfg.width_mult), abs=0), name
        else:
            assert mine == theirs["lr"] == 1.0, name
    attentions = cfg.n_enc_layers + 2 * cfg.n_dec_layers  # q, k, v, out (and the gate) each; two FFN matrices a block
    assert hidden == attentions * (4 + (cfg.attn_gate is not None)) + 2 * (cfg.n_enc_layers + cfg.n_dec_layers)


@pytest.mark.parametrize("case", NORM_PRESETS + list(NORM_KINDS))
def test_mup_at_its_base_width_is_sp_bit_for_bit_and_composes_with_the_norm_at_twice_it(case: str) -> None:
    small = {"d_model": 32, "d_ff": 64, "n_heads": 2, "n_enc_layers": 2, "n_dec_layers": 2, "norm": norm_of(case)}
    wide = {**small, "d_model": 64, "d_ff": 128, "parametrization": "mup", "base_d_model": 32}
    norm = small["norm"]
    kinds = {s.kind for s in (norm.spec(stack, i, 2) for stack in ("enc", "dec") for i in range(2))}
    refused = "norm.hc=" if norm.hc is not None else next((f"norm.kind={k}" for k in sorted(kinds & UNRULED_KINDS.keys())), None)
    refused = refused or ("norm.learned_embed_scale=true" if norm.learned_embed_scale else None)
    if refused:  # what muP's rules do not cover: refused in one line, naming it
        with pytest.raises(ValueError, match=f"model.parametrization=mup has no rule for {refused}"):
            vocab(**wide)
        return
    sp_logits, sp_weights = step(vocab(**small))
    mup_logits, mup_weights = step(vocab(**small, parametrization="mup", base_d_model=32))
    assert torch.equal(sp_logits, mup_logits)
    assert sp_weights.keys() == mup_weights.keys() and all(torch.equal(sp_weights[k], mup_weights[k]) for k in sp_weights)
    # at twice the base width: it builds, trains a step to finite weights, and every hidden matrix gets 1 / m
    logits, weights = step(vocab(**wide))
    assert torch.isfinite(logits).all() and all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())
    model = EncoderDecoder(vocab(**wide))
    factors = lr_factors(model)
    for module in model.modules():
        for linear in getattr(module, "linear_roles", dict)().values():
            weight = linear.parametrizations.weight.original1 if hasattr(linear, "parametrizations") else linear.weight
            assert factors[id(weight)] == 0.5
    assert all(factors[id(p)] == 1.0 for p in model.parameters() if p.dim() < 2)  # gains, biases, scalars: mup's rule


def test_the_attention_logits_are_q_k_over_k_times_sqrt_k0_and_cosine_logits_keep_theirs() -> None:
    model = EncoderDecoder(vocab(d_model=256, d_ff=1024, parametrization="mup", base_d_model=64))  # m 4, K 64, K_0 16
    attn = model.encoder[0].self_attn.branch
    assert attn.logit_scale == 0.5  # sqrt(K_0 / K)
    x = torch.randn(2, 5, 256)
    B, T, D, H = 2, 5, 256, model.cfg.n_heads
    q, k, v = (proj(x).view(B, T, H, -1).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    weights = torch.softmax(q @ k.transpose(-1, -2) * math.sqrt(16) / 64, dim=-1)  # q.k sqrt(K_0) / K
    expected = attn.out_proj((weights @ v).transpose(1, 2).reshape(B, T, D))
    torch.testing.assert_close(attn(x), expected)
    l2 = EncoderDecoder(vocab(d_model=256, d_ff=1024, norm=NormConfig(qk="l2"), parametrization="mup", base_d_model=64))
    assert l2.encoder[0].self_attn.branch.logit_scale == 1.0


def test_the_output_logits_get_one_over_sqrt_m_and_learned_positions_the_base_std() -> None:
    torch.manual_seed(0)
    cfg = vocab(d_model=256, d_ff=1024, positions="learned", parametrization="mup", base_d_model=64)
    model = EncoderDecoder(cfg)
    raw = []
    model.output.register_forward_hook(lambda _m, _i, out: raw.append(out))
    logits = model(torch.randint(1, 30, (2, 5)), torch.randint(1, 40, (2, 4)))
    torch.testing.assert_close(logits, raw[0] * 0.5, rtol=0, atol=0)
    # drawn N(0, 1/D) then times sqrt(m): the base model's std, 1/8; 64 x 256 draws put the sample std within 2 %
    assert model.src_embed.positions.weight.std().item() == pytest.approx(1 / 8, rel=0.02)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"parametrization": "ntk"}, "unknown model.parametrization 'ntk'; valid: sp, mup, completep"),
        ({"parametrization": "mup"}, "model.parametrization=mup needs model.base_d_model"),
        (
            {"parametrization": "mup", "base_d_model": 66},
            "model.base_d_model=66 is not divisible by model.n_heads=4 (the base model's heads); valid: multiples of 4",
        ),
        ({"base_d_model": 64}, "model.base_d_model=64 is muP's base width: set model.parametrization=mup, or base_d_model=null"),
        ({"parametrization": "mup", "base_d_model": 48, "d_ff": 500}, "model.d_ff=500 does not scale to the base width"),
        ({"parametrization": "mup", "base_d_model": 64, "attn_gate": "headwise"}, "no rule for model.attn_gate=headwise"),
        ({"parametrization": "mup", "base_d_model": 64, "norm": NormConfig(hc="static")}, "no rule for norm.hc=static"),
    ],
)
def test_a_config_muP_cannot_take_is_refused_naming_the_value(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        vocab(**kw)


def test_muon_is_refused_beside_mup() -> None:
    model = EncoderDecoder(vocab(parametrization="mup", base_d_model=64))
    with pytest.raises(ValueError, match="model.parametrization=mup scales Adam's LR per parameter"):
        build_optimizer(model, default_optim(lr=1e-3, muon=MuonConfig()))


def test_normlab_s_readout_trains_as_mup_s_muReadout() -> None:
    # mup's MuReadout: W' = sqrt(m) W at init, logits W' h / m, W' at Adam's plain lr and decay. normlab's: W, logits
    # W h / sqrt(m), lr / sqrt(m), decay * sqrt(m). The same function, and Adam (scale-free but for eps) takes the same
    # steps in W', so after a few steps the two models' logits agree.
    cfg = vocab(d_model=256, d_ff=1024, tie_embeddings=False, parametrization="mup", base_d_model=64)
    m = cfg.width_mult
    torch.manual_seed(0)
    ours = EncoderDecoder(cfg)
    theirs = EncoderDecoder(cfg)
    theirs.load_state_dict(ours.state_dict())
    with torch.no_grad():
        theirs.output.weight.mul_(math.sqrt(m))
    theirs.output.register_forward_hook(lambda _m, _i, out: out / math.sqrt(m))  # with the model's 1 / sqrt(m): 1 / m
    factors = lr_factors(ours)
    factors_theirs = {**lr_factors(theirs), id(theirs.output.weight): 1.0}

    def adamw(model: EncoderDecoder, f: dict[int, float]) -> torch.optim.AdamW:
        groups = [{"params": [p], "lr": 1e-2 * f[id(p)], "weight_decay": 0.1 / f[id(p)]} for p in model.parameters()]
        return torch.optim.AdamW(groups, eps=1e-12)

    src, tgt = torch.randint(1, 30, (4, 7)), torch.randint(1, 40, (4, 6))
    for model, f in ((ours, factors), (theirs, factors_theirs)):
        opt = adamw(model, f)
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(src, tgt).flatten(0, 1), tgt.flatten()).backward()
            opt.step()
    torch.testing.assert_close(ours(src, tgt), theirs(src, tgt), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.output.weight * math.sqrt(m), theirs.output.weight, rtol=1e-4, atol=1e-6)


def test_the_logged_lr_is_optim_lr_s_schedule_whatever_factor_the_first_group_carries() -> None:
    # train.py logs scheduled_lr(opt) as optim/lr: under mup the first AdamW group is the embeddings' (lr / sqrt(m))
    peak, warmup = 2e-3, 4
    lrs = {}
    for kw in ({}, {"parametrization": "mup", "base_d_model": 64}):
        opt = build_optimizer(EncoderDecoder(vocab(**kw)), default_optim(lr=peak))
        sched = build_scheduler(opt, peak, ScheduleConfig(warmup, "linear"), 20)
        lrs[bool(kw)] = []
        for _ in range(6):
            lrs[bool(kw)].append(scheduled_lr(opt))
            opt.step()
            sched.step()
    assert opt.param_groups[0]["lr_scale"] == pytest.approx(2**-0.5)
    assert lrs[True] == pytest.approx(lrs[False]) and lrs[False][warmup] == pytest.approx(peak)


def test_a_model_narrower_than_its_base_takes_the_same_rules() -> None:
    model = EncoderDecoder(vocab(d_model=64, d_ff=256, parametrization="mup", base_d_model=128))  # m = 1/2
    factors = lr_factors(model)
    assert factors[id(model.encoder[0].ffn.branch.linear1.weight)] == 2.0
    assert factors[id(model.tgt_embed.tokens.weight)] == pytest.approx(math.sqrt(2))
    assert model.encoder[0].self_attn.branch.logit_scale == pytest.approx(math.sqrt(2))


def test_at_init_sp_s_tied_output_layer_favours_the_input_token_more_as_the_model_widens_and_mup_s_does_not() -> None:
    # docs/results.md (k), why sp's loss at step 0 rises with width: the output layer tied to the sqrt(D)-scaled token
    # embedding gives the decoder's input token a logit above the mean that grows about as sqrt(D) (1.9x from 64 to 256);
    # mup's readout multiplier 1 / sqrt(m) holds it where the base width has it
    margin = {}
    for parametrization in ("sp", "mup"):
        for d_model in (64, 256):
            base = {"base_d_model": 64} if parametrization == "mup" else {}
            logits, tgt_in = init_logits(vocab(d_model=d_model, d_ff=4 * d_model, parametrization=parametrization, **base))
            own = logits.gather(-1, tgt_in.unsqueeze(-1)).squeeze(-1)
            margin[parametrization, d_model] = (own - logits.mean(-1)).mean().item()
    assert margin["sp", 64] == margin["mup", 64] > 2
    assert margin["sp", 256] / margin["sp", 64] > 1.7
    assert 0.9 < margin["mup", 256] / margin["mup", 64] < 1.1
