"""GPAS (Chen et al. 2025, arXiv 2506.22049; official code dandingsky/GPAS): ``x - SiLU(g) * stopgrad(x)``, one
gate g per block, init 0, a modifier of any placement (``norm.gpas``; model/gpas.py).

Where it sits, pinned to the official ``LlamaDecoderLayer.forward`` (peft_pretraining/modeling_llama.py): pre-LN,
sandwich, LNS and Mix-LN's pre-LN blocks call ``self.gpas_block`` after each residual addition; DeepNorm and Mix-LN's
post-LN blocks call it on the skip (``residual = self.gpas_block(hidden_states)``, then ``alpha * residual``), the
branch reading the unscaled stream; one ``GPASBlock`` per layer serves both sublayers. Its optimizer: Adam with
``weight_decay`` 0 in every script (normlab's AdamW puts the scalar gate in the no-decay group).
"""

import torch
import torch.nn.functional as F

from model.config import ModelConfig, NormConfig
from model.gpas import GPAS, GPASResidual
from model.transformer import EncoderDecoder
from training.optim import build_optimizer
from training.presets import default_optim

D = 16
PLACEMENTS = ("pre", "post", "sandwich", "deepnorm", "lns", "mix_ln", "keel", "rezero", "hybrid")

# The official GPASBlock run on the same input, float64: x = arange(-3, 3).reshape(2, 3) / 2, gate set to 0.7,
# loss = sum(y * W). Produced by a scratch script that imports ``GPASBlock`` from the official
# peft_pretraining/modeling_llama.py (commit 3198068, transformers 5.23.0) and prints y, x.grad and gate.grad.
REF_X = torch.arange(-3, 3, dtype=torch.float64).reshape(2, 3) / 2
REF_W = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], dtype=torch.float64)
REF_Y = [-0.7984028392234256, -0.5322685594822838, -0.2661342797411419, 0.0, 0.2661342797411419, 0.5322685594822838]
REF_X_GRAD = [0.5, -1.0, 2.0, 1.5, 0.25, -0.75]
REF_GATE_GRAD = 1.132156827275846


def build(gpas: bool, placement: str = "pre", seed: int = 0, **norm) -> EncoderDecoder:
    torch.manual_seed(seed)
    extra = {"qk": "layernorm", "v": "layernorm"} if placement == "hybrid" else {}
    kind = "none" if placement == "rezero" else "layernorm"
    cfg = ModelConfig(src_vocab=20, tgt_vocab=20, d_model=D, n_heads=2, d_ff=32, n_enc_layers=2, n_dec_layers=3,
                      dropout=0.1, norm=NormConfig(kind=kind, placement=placement, gpas=gpas, mix_ln_alpha=0.5,
                                                   **extra, **norm))  # fmt: skip
    return EncoderDecoder(cfg)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 20, (2, 7), generator=g), torch.randint(4, 20, (2, 5), generator=g)
    src[1, 5:], tgt[1, 3:] = 0, 0
    return src, tgt


def gates(model: EncoderDecoder) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if name.endswith("gpas.gate")}


def test_gpas_matches_the_official_block_forward_and_backward():
    block = GPAS().double()
    assert block.gate.item() == 0.0 and block.gate.requires_grad  # the official gate_init_value
    x = REF_X.clone().requires_grad_(True)
    assert torch.equal(block(x), REF_X)  # g = 0: bit-identical
    with torch.no_grad():
        block.gate.fill_(0.7)
    y = block(x)
    (y * REF_W).sum().backward()
    assert torch.allclose(y.detach().flatten(), torch.tensor(REF_Y, dtype=torch.float64), rtol=0, atol=1e-15)
    assert x.grad.flatten().tolist() == REF_X_GRAD  # the gradient passes unscaled: exactly the upstream one
    assert abs(block.gate.grad.item() - REF_GATE_GRAD) < 1e-14


def test_gpas_scales_the_forward_by_one_minus_silu_and_its_gate_learns_through_silu():
    block = GPAS()
    x = torch.randn(3, 4, D, requires_grad=True)
    up = torch.randn(3, 4, D)
    for g in (-2.0, 0.7, 3.0):
        x.grad, block.gate.grad = None, None
        with torch.no_grad():
            block.gate.fill_(g)
        y = block(x)
        (y * up).sum().backward()
        gt = torch.tensor(g)
        torch.testing.assert_close(y, (1 - F.silu(gt)) * x, rtol=1e-6, atol=1e-6)
        assert torch.equal(x.grad, up)  # d y / d x = identity whatever g
        dsilu = torch.sigmoid(gt) * (1 + gt * (1 - torch.sigmoid(gt)))  # SiLU'(g)
        torch.testing.assert_close(block.gate.grad, (-dsilu * (up * x).sum()).reshape(1), rtol=1e-5, atol=1e-5)


def test_gpas_at_zero_gate_leaves_the_whole_model_bit_identical():
    src, tgt = batch()
    for placement in PLACEMENTS:
        plain, gpas = build(False, placement), build(True, placement)
        shared = dict(plain.named_parameters())
        assert set(shared) == set(dict(gpas.named_parameters())) - set(gates(gpas)), placement
        for name, p in gpas.named_parameters():  # the gates draw nothing: every other parameter is the same
            assert name in gates(gpas) or torch.equal(p, shared[name]), (placement, name)
        for train in (False, True):  # train: dropout on, the same masks from the same seed
            plain.train(train), gpas.train(train)
            torch.manual_seed(5)
            a = plain(src, tgt)
            torch.manual_seed(5)
            b = gpas(src, tgt)
            assert torch.equal(a, b), (placement, train)


def test_one_gate_per_block_shared_by_its_sublayers_and_none_by_default():
    model = build(True)
    assert sorted(gates(model)) == [*(f"decoder.{i}.self_attn.gpas.gate" for i in range(3)),
                                    *(f"encoder.{i}.self_attn.gpas.gate" for i in range(2))]  # fmt: skip
    layer = model.decoder[1]
    assert layer.self_attn.gpas is layer.cross_attn.gpas is layer.ffn.gpas
    assert model.encoder[0].self_attn.gpas is not model.encoder[1].self_attn.gpas
    assert not gates(build(False)) and not any(isinstance(m, GPASResidual) for m in build(False).modules())


def test_gpas_follows_the_residual_add_in_pre_ln_and_scales_the_skip_in_deepnorm_and_b2t():
    src, _ = batch()
    mask = src.eq(0)
    for placement in ("pre", "deepnorm", "b2t"):
        model = build(True, placement).eval()
        for i, layer in enumerate(model.encoder):
            with torch.no_grad():
                layer.self_attn.gpas.gate.fill_(0.4 + i)
        with torch.no_grad():
            x = model.src_embed(src)
            for layer in model.encoder:
                s = 1 - F.silu(layer.self_attn.gpas.gate)  # one gate for both sublayers
                attn, ffn = layer.self_attn, layer.ffn
                if placement == "pre":  # x <- gpas(x + F(N(x)))
                    x = s * (x + attn.branch(attn.norm_in(x), None, mask))
                    x = s * (x + ffn.branch(ffn.norm_in(x)))
                else:  # x <- N(alpha * gpas(x) + F(x)), F reading the unscaled x; B2T's block skip unscaled
                    h = attn.norm_out(attn.alpha * s * x + attn.branch(x, None, mask))
                    x = ffn.norm_out(ffn.alpha * s * h + ffn.branch(h) + (x if placement == "b2t" else 0))
            torch.testing.assert_close(model.encode(src, mask), model.enc_final_norm(x), rtol=0, atol=1e-5)


def test_mix_ln_puts_gpas_on_the_skip_of_its_post_ln_blocks_and_after_the_add_of_its_pre_ln_ones():
    model = build(True, "mix_ln")  # mix_ln_alpha 0.5: encoder block 0 post-LN, block 1 pre-LN
    assert [layer.self_attn.on_skip for layer in model.encoder] == [True, False]
    assert [layer.ffn.on_skip for layer in model.decoder] == [True, False, False]  # floor(0.5 * 3) = 1 post block
    hybrid = build(True, "hybrid").encoder[0]  # HybridNorm: the FFN's norm_out is empty, so GPAS follows its addition
    assert not hybrid.ffn.on_skip and not hybrid.self_attn.on_skip


def test_the_gate_gets_no_weight_decay():
    model = build(True)
    decay, no_decay = build_optimizer(model, default_optim(lr=1e-3, weight_decay=0.1)).param_groups
    ids = {id(p) for p in gates(model).values()}
    assert ids <= {id(p) for p in no_decay["params"]} and not ids & {id(p) for p in decay["params"]}
    assert no_decay["weight_decay"] == 0.0


def test_gpas_is_a_block_key_and_must_be_a_bool():
    model = build(False, blocks=[{"stack": "dec", "layers": [2], "gpas": True}])
    assert list(gates(model)) == ["decoder.2.self_attn.gpas.gate"]
    try:
        NormConfig(gpas="yes")
    except ValueError as err:
        assert str(err) == "norm.gpas must be true or false, got 'yes'"
    else:
        raise AssertionError("norm.gpas='yes' was accepted")
