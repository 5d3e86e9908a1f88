"""Derf (Chen et al. 2025, arXiv 2512.10938; code zlab-princeton/Derf) and the per-site alpha init and
learned embedding scale of the official DyT / Derf language-model code, pinned to their constants and formulas."""

import math

import pytest
import torch
from torch import nn

from model.config import ModelConfig, NormConfig, NormSpec
from model.norms import DERF_ALPHA_INIT, DERF_SHIFT_INIT, DYT_ALPHA_INIT, Derf, DyT, build_norm
from model.transformer import EncoderDecoder
from tests.helpers.config import make_cfg, model_config
from training.optim import build_optimizer
from training.presets import default_optim

# ``python -m tests.reference.derf``: the official ``Dynamic_erf`` (zlab-princeton/Derf 8dd9ea3,
# ``DNA model/dynamic_erf.py``) in float64 on tests.reference.derf.case(): x = linspace(-3, 3, 16) as (2, 8),
# alpha 0.7, shift -0.3, weight linspace(0.5, 2, 8), bias linspace(-0.2, 0.2, 8); the gradient of (y * g).sum(),
# g = linspace(1, -0.5, 16) as (2, 8).
OFFICIAL_Y = [
    [-0.6996557430516774, -0.8552025762751148, -1.0056833798709794, -1.1401464251732571, -1.2332106905184275,
     -1.238529817492409, -1.09184486274777, -0.7324502305559148],
    [-0.2895059065990529, -0.046601177271485744, 0.31207861540047777, 0.7300368031329804, 1.1487892388023246,
     1.5322224324699036, 1.8721669587859342, 2.1781810032714612],
]  # fmt: skip
OFFICIAL_GRAD_X = [
    [0.001244477038307215, 0.005672499334773212, 0.01986602625129847, 0.0554298923513156, 0.12496311308884037,
     0.22830912358132718, 0.33595940562009735, 0.3905035065623984],
    [0.07699014908316815, 0.05561234689517386, 1.7347285947864892e-17, -0.05684958227413496, -0.08530271730020776,
     -0.08001986305922508, -0.05597976779376948, -0.030934206332407788],
]  # fmt: skip


def test_derf_constants_and_parameters_at_init():
    # The official Dynamic_erf defaults: alpha_init_value=0.5, shift_init_value=0.0; weight 1, bias 0; alpha and
    # shift one scalar each (torch.ones(1) * value), weight and bias per channel.
    assert (DERF_ALPHA_INIT, DERF_SHIFT_INIT, DYT_ALPHA_INIT) == (0.5, 0.0, 0.5)
    norm = build_norm("derf", 8)
    assert {n: tuple(p.shape) for n, p in norm.named_parameters()} == {"alpha": (1,), "shift": (1,), "weight": (8,), "bias": (8,)}
    assert norm.alpha.item() == 0.5 and norm.shift.item() == 0.0
    assert torch.equal(norm.weight, torch.ones(8)) and torch.equal(norm.bias, torch.zeros(8))
    assert [n for n, _ in build_norm("derf", 8, bias=False).named_parameters()] == ["alpha", "shift", "weight"]
    assert build_norm("derf", 8, alpha_init=0.2).alpha.item() == pytest.approx(0.2)


def test_derf_at_init_is_erf_of_half_x_by_hand():
    # erf(0.5) = 0.5204998778130465, erf(-1) = -0.8427007929497149, erf(2) = 0.9953222650189527 (tables / mpmath).
    y = build_norm("derf", 4)(torch.tensor([[1.0, -2.0, 0.0, 4.0]], dtype=torch.float64))
    torch.testing.assert_close(y, torch.tensor([[0.5204998778130465, -0.8427007929497149, 0.0, 0.9953222650189527]],
                                                dtype=torch.float64), atol=1e-15, rtol=0)  # fmt: skip


def test_derf_matches_the_official_module_forward_and_backward():
    norm = Derf(8).double()
    with torch.no_grad():
        norm.alpha.fill_(0.7)
        norm.shift.fill_(-0.3)
        norm.weight.copy_(torch.linspace(0.5, 2.0, 8, dtype=torch.float64))
        norm.bias.copy_(torch.linspace(-0.2, 0.2, 8, dtype=torch.float64))
    x = torch.linspace(-3.0, 3.0, 16, dtype=torch.float64).reshape(2, 8).requires_grad_()
    y = norm(x)
    (y * torch.linspace(1.0, -0.5, 16, dtype=torch.float64).reshape(2, 8)).sum().backward()
    torch.testing.assert_close(y.detach(), torch.tensor(OFFICIAL_Y, dtype=torch.float64), atol=1e-14, rtol=0)
    torch.testing.assert_close(x.grad, torch.tensor(OFFICIAL_GRAD_X, dtype=torch.float64), atol=1e-14, rtol=0)


def test_derf_computes_half_precision_in_float32_and_keeps_the_dtype():
    x = torch.linspace(-4.0, 4.0, 32).reshape(2, 16)
    norm = build_norm("derf", 16)
    y = norm(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), torch.erf(0.5 * x.bfloat16().float()).bfloat16().float(), atol=0, rtol=0)


def model(**norm) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=20, tgt_vocab=20, d_model=16, n_heads=2, d_ff=32, n_enc_layers=2, n_dec_layers=2,
                      dropout=0.0, norm=NormConfig(**norm))  # fmt: skip
    return EncoderDecoder(cfg)


def alphas(m: nn.Module) -> dict[str, float]:
    return {name: mod.alpha.item() for name, mod in m.named_modules() if isinstance(mod, DyT | Derf)}


@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_alpha_init_follows_the_site_attention_ffn_final(kind):
    # The official LLaMA DyT / GPT-2 Derf code: attn_alpha_init_value for the attention pre-norm, ffn_ for the FFN's,
    # dec_ for the final norm. Here a cross-attention is an attention site, and both stacks' final norms are final.
    found = alphas(model(kind=kind, alpha_init_attn=0.8, alpha_init_ffn=0.2, alpha_init_final=0.3))
    want = {"enc_final_norm": 0.3, "dec_final_norm": 0.3}
    for stack, residuals in (("encoder", ("self_attn", "ffn")), ("decoder", ("self_attn", "cross_attn", "ffn"))):
        for i in range(2):
            want |= {f"{stack}.{i}.{r}.norm_in": 0.2 if r == "ffn" else 0.8 for r in residuals}
    assert found == pytest.approx(want)
    assert set(alphas(model(kind=kind)).values()) == {0.5}  # the defaults: today's DyT


@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_an_integer_alpha_init_from_the_command_line_builds_and_trains(kind):
    # norm.alpha_init_attn=1 reaches the config as the int 1 (Hydra), which torch.tensor([1]) would make an int64
    # parameter: "Only Tensors of floating point ... can require gradients" (what a sweep over 1 and 2 hit)
    net = model(kind=kind, alpha_init_attn=1, alpha_init_ffn=2, alpha_init_final=1)
    assert {p.dtype for name, p in net.named_parameters() if name.endswith(".alpha")} == {torch.float32}
    assert set(alphas(net).values()) == {1.0, 2.0}
    src = torch.randint(3, 20, (2, 5))
    net(src, src).sum().backward()
    assert all(p.grad is not None for name, p in net.named_parameters() if name.endswith(".alpha"))


def test_alpha_init_can_be_set_per_block():
    found = alphas(model(kind="derf", blocks=[{"stack": "dec", "layers": [1], "alpha_init_attn": 0.9, "alpha_init_final": 0.1}]))
    assert found["decoder.1.cross_attn.norm_in"] == pytest.approx(0.9) and found["decoder.0.cross_attn.norm_in"] == 0.5
    assert found["dec_final_norm"] == pytest.approx(0.1) and found["enc_final_norm"] == 0.5  # the last block's spec


def test_alpha_init_reaches_every_slot_of_a_sandwich_block():
    found = alphas(model(kind="derf", placement="sandwich", alpha_init_attn=0.8, alpha_init_ffn=0.2))
    assert found["decoder.1.cross_attn.norm_branch"] == pytest.approx(0.8)
    assert found["encoder.0.ffn.norm_branch"] == pytest.approx(0.2)


def test_learned_embed_scale_starts_at_sqrt_d_model_and_learns_without_weight_decay():
    fixed, learned = model(kind="dyt"), model(kind="dyt", learned_embed_scale=True)
    assert not any(name.endswith("embed.scale") for name, _ in fixed.named_parameters())  # the default: a constant
    scales = {n: p for n, p in learned.named_parameters() if n.endswith("embed.scale")}
    assert list(scales) == ["src_embed.scale", "tgt_embed.scale"]  # one per stack
    assert all(p.shape == (1,) and p.item() == pytest.approx(math.sqrt(16)) for p in scales.values())
    src, tgt = torch.randint(1, 20, (3, 5), generator=torch.Generator().manual_seed(1)).split([3, 2], dim=1)
    torch.testing.assert_close(learned(src, tgt), fixed(src, tgt), atol=0, rtol=0)  # the same model at init
    learned(src, tgt).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().item() > 0 for p in scales.values())
    groups = build_optimizer(learned, default_optim(lr=1e-3)).param_groups
    assert all(any(p is q for q in groups[1]["params"]) for p in scales.values()) and groups[1]["weight_decay"] == 0.0


def test_pre_dyt_lm_decays_no_1d_parameter_unlike_the_official_lm_recipe():
    # DyT's LLaMA script decays every parameter (AdamW(model.parameters(), weight_decay=0.1)); normlab keeps its rule
    # (docs/norms.md): its alphas, gains, biases and learned embedding scales are in the no-decay group.
    model = EncoderDecoder(model_config(make_cfg("norm=pre_dyt_lm"), 20, 20))
    decay, no_decay = build_optimizer(model, default_optim(lr=1e-3, weight_decay=0.1)).param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    kept = [names[id(p)] for p in no_decay["params"]]
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    dyts = [n for n, m in model.named_modules() if isinstance(m, DyT)]
    assert len(dyts) == 2 * 2 + 3 * 2 + 2  # tiny: every sublayer's pre-norm and both final norms
    assert {f"{d}.{p}" for d in dyts for p in ("alpha", "weight", "bias")} | {"src_embed.scale", "tgt_embed.scale"} <= set(kept)


@pytest.mark.parametrize(
    ("norm", "message"),
    [
        ({"alpha_init_attn": 0}, r"^norm.alpha_init_attn must be a finite number > 0, got 0$"),
        ({"alpha_init_final": float("inf")}, r"^norm.alpha_init_final must be a finite number > 0, got inf$"),
        ({"alpha_init_ffn": True}, r"^norm.alpha_init_ffn must be a finite number > 0, got True$"),
        ({"learned_embed_scale": "yes"}, r"^norm.learned_embed_scale must be true or false, got 'yes'$"),
        ({"kind": "derf", "placement": "post"}, r"^norm.kind='derf' cannot be used with norm.placement='post'; valid"),
    ],
)
def test_bad_values_fail_at_config_time(norm, message):
    with pytest.raises(ValueError, match=message):
        NormConfig(**norm)


LM_KEYS = ("alpha_init_attn", "alpha_init_ffn", "alpha_init_final", "learned_embed_scale")


def test_a_residual_stream_norm_is_built_at_a_named_site():
    with pytest.raises(ValueError, match=r"^a residual-stream norm needs its site, got None; valid: attn, ffn, final$"):
        NormSpec(kind="derf").build(8)
    assert NormSpec(kind="derf", alpha_init_ffn=0.25).build(8, site="ffn").alpha.item() == 0.25


def test_presets_compose_to_the_official_constants():
    derf, lm, dyt = (make_cfg(f"norm={name}").norm for name in ("pre_derf", "pre_dyt_lm", "pre_dyt"))
    assert (derf.kind, derf.alpha_init_attn, derf.alpha_init_ffn, derf.alpha_init_final) == ("derf", 0.5, 0.5, 0.5)
    assert not derf.learned_embed_scale and not dyt.learned_embed_scale
    # jiachenzhu/DyT other_tasks/LLaMA/README.md, LLaMA2 7B: --attn_alpha_init_value=0.8 --ffn_alpha_init_value=0.2
    # --dec_alpha_init_value=0.2; llama.py: shared_scale = sqrt(emb_dim) on the embeddings.
    assert [lm[k] for k in ("kind", *LM_KEYS)] == ["dyt", 0.8, 0.2, 0.2, True]
    assert {k: v for k, v in lm.items() if k not in LM_KEYS} == {k: v for k, v in dyt.items() if k not in LM_KEYS}
