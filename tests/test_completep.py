"""model.parametrization=completep: the factors against EleutherAI/nanoGPT-mup's own CompleteP code
(tests/expected/completep_official.json, written by tests/reference/completep.py), the branch multiplier per stack,
equality with sp at the base width and depth for every norm preset and kind, and the refusals."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

import train as train_module
from model.config import ModelConfig
from model.kinds import NORM_KINDS
from model.norm_config import NormConfig
from model.parametrization import COMPLETEP_PLACEMENTS, UNRULED_KINDS
from model.residual import Sublayer
from model.transformer import EncoderDecoder
from tests.helpers.config import make_cfg
from tests.helpers.parametrization import NORM_PRESETS, init_logits, norm_of, step, vocab
from tests.helpers.resume import EXACT, losses, stop_by_sigterm
from tests.reference.completep import CASES
from training.checkpoint import load_checkpoint
from training.muon_config import MuonConfig
from training.optim import build_optimizer
from training.presets import default_optim

OFFICIAL = json.loads((Path(__file__).parent / "expected" / "completep_official.json").read_text())
BASE_WIDTH, BASE_DEPTH = 64, 2


def _completep(m: float, m_depth: float, **kw) -> ModelConfig:
    d_model, layers = int(BASE_WIDTH * m), int(BASE_DEPTH * m_depth)
    depth = {"n_enc_layers": layers, "n_dec_layers": layers}
    return vocab(d_model=d_model, d_ff=4 * d_model, **depth, parametrization="completep", base_d_model=BASE_WIDTH, **kw)


def _role(model: EncoderDecoder, p: torch.nn.Parameter, in_blocks: set[int]) -> str:
    """The official code's group of ``p``: its blocks' matrices, biases and norms, the embeddings, the final norms."""
    if id(p) not in in_blocks:
        return "embeddings" if p.dim() == 2 else "final_norm"
    matrices = {id(lin.weight) for mod in model.modules() for lin in getattr(mod, "linear_roles", dict)().values()}
    biases = {id(lin.bias) for mod in model.modules() for lin in getattr(mod, "linear_roles", dict)().values()}
    return "hidden_matrices" if id(p) in matrices else "hidden_biases" if id(p) in biases else "hidden_norms"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_blocks_get_the_official_code_s_factors_and_the_rest_the_stated_differences(case: str) -> None:
    m, m_depth = CASES[case]
    official = OFFICIAL[case]
    assert (official["width_mult"], official["depth_mult"]) == (m, m_depth)
    model = EncoderDecoder(_completep(m, m_depth, base_depth=BASE_DEPTH))
    opt = build_optimizer(model, default_optim(lr=1.0, weight_decay=1.0, eps=1.0))
    group = {id(p): g for g in opt.param_groups for p in g["params"]}
    in_blocks = {id(p) for stack in (model.encoder, model.decoder) for p in stack.parameters()}
    seen = set()
    for name, p in model.named_parameters():
        role = _role(model, p, in_blocks)
        seen.add(role)
        theirs, mine = official["groups"][role], group[id(p)]
        if role.startswith("hidden_"):  # the blocks: CompleteP's LR, decay and eps, exactly
            assert (mine["lr_scale"], mine["weight_decay"], mine["eps"]) == pytest.approx(
                (theirs["lr_scale"], theirs["weight_decay"], theirs["eps"]), abs=0, rel=1e-15
            ), name
        else:  # the stated differences: Table 1's eps (the blocks' only); muP's 1 / sqrt(m) on normlab's embeddings
            assert mine["eps"] == 1.0 and theirs["eps"] == pytest.approx(1 / (m * m_depth)), name
            scale = 1 / math.sqrt(m) if role == "embeddings" else 1.0
            assert theirs["lr_scale"] == 1.0 and mine["lr_scale"] == pytest.approx(scale, abs=0), name
    assert seen == set(official["groups"])
    scales = [s.branch_scale for s in model.modules() if isinstance(s, Sublayer)]
    assert scales == [pytest.approx(official["branch_scale"], abs=0, rel=1e-15)] * len(scales)


def test_each_stack_has_its_own_depth_multiplier() -> None:
    cfg = vocab(n_enc_layers=6, n_dec_layers=2, parametrization="completep", base_d_model=64, base_depth=2)
    model = EncoderDecoder(cfg)
    assert (cfg.depth_mult("enc"), cfg.depth_mult("dec"), cfg.width_mult) == (3.0, 1.0, 2.0)
    assert {s.branch_scale for s in model.encoder.modules() if isinstance(s, Sublayer)} == {1 / 3}
    assert {s.branch_scale for s in model.decoder.modules() if isinstance(s, Sublayer)} == {1.0}
    opt = build_optimizer(model, default_optim(lr=1e-3, eps=1e-8))
    eps = {id(p): g["eps"] for g in opt.param_groups for p in g["params"]}
    assert {eps[id(p)] for p in model.encoder.parameters()} == {1e-8 / (2 * 3)}
    assert {eps[id(p)] for p in model.decoder.parameters()} == {1e-8 / (2 * 1)}
    assert eps[id(model.tgt_embed.tokens.weight)] == 1e-8


def test_a_deeper_model_s_branches_add_one_over_m_l_of_what_sp_s_add() -> None:
    # the same weights under sp and completep at 2x the base depth: each block's update to the stream is halved
    kw = {"n_enc_layers": 4, "n_dec_layers": 4, "base_d_model": 128, "base_depth": 2}
    sp_sub = EncoderDecoder(vocab(n_enc_layers=4, n_dec_layers=4)).encoder[1].ffn
    torch.manual_seed(0)
    deep = EncoderDecoder(vocab(parametrization="completep", **kw)).encoder[1].ffn
    sp_sub.load_state_dict(deep.state_dict())
    h = deep.normalize_in(torch.randn(2, 5, 128), None)
    assert torch.equal(deep.update(h, (), None), sp_sub.update(h, (), None) / 2)  # what Residual adds to x


@pytest.mark.parametrize("case", NORM_PRESETS + list(NORM_KINDS))
def test_completep_at_its_base_is_sp_bit_for_bit_and_at_twice_the_depth_halves_every_branch(case: str) -> None:
    small = {"d_model": 32, "d_ff": 64, "n_heads": 2, "n_enc_layers": 2, "n_dec_layers": 2, "norm": norm_of(case)}
    base = {"parametrization": "completep", "base_d_model": 32, "base_depth": 2}
    deep = {**small, **base, "n_enc_layers": 4, "n_dec_layers": 4}
    norm = small["norm"]
    specs = [norm.spec(stack, i, 4) for stack in ("enc", "dec") for i in range(4)]
    kinds = sorted({s.kind for s in specs} & UNRULED_KINDS.keys())
    placement = next((s.placement for s in specs if s.placement not in COMPLETEP_PLACEMENTS), None)
    refused = "norm.hc=" if norm.hc is not None else f"norm.kind={kinds[0]}" if kinds else None
    refused = refused or ("norm.learned_embed_scale=true" if norm.learned_embed_scale else None)
    refused = refused or (f"norm.placement={placement}" if placement else None)
    refused = refused or ("norm.gpas=true" if any(s.gpas for s in specs) else None)
    if refused:  # in one line, naming it
        with pytest.raises(ValueError, match=f"model.parametrization=completep has no rule for {refused}"):
            vocab(**deep)
        return
    sp_logits, sp_weights = step(vocab(**small))
    cp_logits, cp_weights = step(vocab(**small, **base))
    assert torch.equal(sp_logits, cp_logits)
    assert sp_weights.keys() == cp_weights.keys() and all(torch.equal(sp_weights[k], cp_weights[k]) for k in sp_weights)
    logits, weights = step(vocab(**deep))
    assert torch.isfinite(logits).all() and all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())
    model = EncoderDecoder(vocab(**deep))
    assert {s.branch_scale for s in model.modules() if isinstance(s, Sublayer)} == {0.5}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"base_d_model": 64}, "model.parametrization=completep needs model.base_depth, a positive integer"),
        ({"base_depth": 2}, "model.parametrization=completep needs model.base_d_model, a positive integer"),
        ({"base_d_model": 64, "base_depth": 0}, "needs model.base_depth, a positive integer (the base model's blocks per stack)"),
        (
            {"base_d_model": 64, "base_depth": 1, "norm": NormConfig(placement="post")},
            "model.parametrization=completep has no rule for norm.placement=post: CompleteP's 1/L branch multiplier is "
            "derived for the pre-LN stream x + F(N(x)) / m_L; valid placements: pre, sandwich, res_post, without GPAS",
        ),
        ({"base_d_model": 64, "base_depth": 1, "norm": NormConfig(placement="deepnorm")}, "no rule for norm.placement=deepnorm"),
        ({"base_d_model": 64, "base_depth": 1, "norm": NormConfig(gpas=True)}, "no rule for norm.gpas=true"),
        ({"parametrization": "mup", "base_d_model": 64, "base_depth": 2}, "model.base_depth=2 is CompleteP's base depth"),
        ({"parametrization": "sp", "base_depth": 2}, "model.base_depth=2 is CompleteP's base depth"),
    ],
)
def test_a_config_completep_cannot_take_is_refused_naming_the_value(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        vocab(**{"parametrization": "completep", **kw})


def test_muon_is_refused_beside_completep() -> None:
    model = EncoderDecoder(vocab(parametrization="completep", base_d_model=64, base_depth=3))
    with pytest.raises(ValueError, match="model.parametrization=completep scales Adam's LR per parameter"):
        build_optimizer(model, default_optim(lr=1e-3, muon=MuonConfig()))


def test_a_completep_run_trains_from_the_command_line_s_keys_and_resumes_exactly(tmp_path, monkeypatch) -> None:
    # model=tiny (d_model 32, 2+2 blocks) as a CompleteP model of a base half as wide and half as deep: the config's keys
    # reach the model and the optimizer, and the checkpoint carries the groups' eps and lr_scale through a resume
    keys = ["model.parametrization=completep", "model.base_d_model=16", "model.base_depth=1", *EXACT, "trainer.max_steps=6"]
    train_module.train(make_cfg(*keys), tmp_path / "straight")
    stop_by_sigterm(monkeypatch, make_cfg(*keys), tmp_path / "stopped", 3)
    train_module.train(make_cfg(*keys), tmp_path / "stopped")
    assert losses(tmp_path / "stopped") == losses(tmp_path / "straight")
    state = load_checkpoint(tmp_path / "stopped" / "checkpoint.pt")
    eps = sorted({g["eps"] for g in state["optimizer"]["param_groups"]})
    assert eps == [1e-9 / 4, 1e-9] and len(losses(tmp_path / "straight")) == 6  # optim.eps 1e-9; m * m_L = 4


def test_at_init_a_deep_completep_decoder_predicts_its_input_token_where_sp_s_does_not_and_untied_neither_does() -> None:
    # docs/results.md (k), why CompleteP's loss at step 0 rises with depth: with 1/m_L on every branch the stream
    # stays the sqrt(D)-scaled token embedding, which the tied output layer scores highest for the input token itself;
    # the control of (k) unties the output layer, and then no model favours it
    share = {}
    for tie in (True, False):
        for parametrization, layers in (("sp", 2), ("sp", 8), ("completep", 8)):
            base = {"base_d_model": BASE_WIDTH, "base_depth": BASE_DEPTH} if parametrization == "completep" else {}
            depth = {"n_enc_layers": layers, "n_dec_layers": layers}
            cfg = vocab(
                d_model=BASE_WIDTH, d_ff=4 * BASE_WIDTH, **depth, parametrization=parametrization, tie_embeddings=tie, **base
            )
            logits, tgt_in = init_logits(cfg)
            share[tie, parametrization, layers] = logits.argmax(-1).eq(tgt_in).float().mean().item()
    assert share[True, "completep", 8] > 0.95 > share[True, "sp", 2] > 0.8 > 0.6 > share[True, "sp", 8]
    assert max(v for (tie, *_), v in share.items() if not tie) < 0.1  # chance: 1 in 37 target ids


def test_docs_name_the_presets_that_compose_with_completep() -> None:
    text = " ".join((Path(__file__).parents[1] / "docs" / "parametrization.md").read_text().split())
    listed = re.search(r"Of the norm presets, (.+?) compose; the rest are refused", text)
    assert listed is not None
    composing = set()
    for case in NORM_PRESETS:
        small = {"d_model": 32, "d_ff": 64, "n_heads": 2, "n_enc_layers": 4, "n_dec_layers": 4, "norm": norm_of(case)}
        try:
            vocab(**small, parametrization="completep", base_d_model=32, base_depth=2)
        except ValueError:
            continue
        composing.add(case.removeprefix("norm="))
    assert set(re.findall(r"`(\w+)`", listed[1])) == composing
