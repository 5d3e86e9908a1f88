"""PowerNorm (``norm.kind=powernorm``, model/powernorm.py) against the official code and its own formulas.

``tests/expected/powernorm_official.pt`` holds the official ``MaskPowerNorm``'s results (sIncerass/powernorm,
``fairseq/modules/norms/mask_powernorm.py``), written by ``python -m tests.reference.powernorm`` from a
snapshot of that repository: no network here. Tolerances: float64 cases to 1e-12 absolute (the differences
are summation order, 2e-15 at most); float32 to 1e-6 absolute and relative (1.4e-6 at most, on a bias gradient
of about 4).
"""

import inspect

import pytest
import torch
import torch.nn.functional as F

from data.batching import Seq2SeqData, collate
from model.config import ModelConfig, NormConfig
from model.kinds import BATCH_READING_KINDS, NORM_KINDS
from model.norms import BatchReadingNorm, LayerNorm, build_norm
from model.powernorm import GROUP_SCALING_EPS, PowerNorm, group_scale
from model.transformer import EncoderDecoder
from runlog.renames import with_current_names
from tests.helpers.config import ROOT, make_cfg, model_config
from training.evaluate import evaluate_loss
from training.schema import validate

EXPECTED = torch.load(ROOT / "tests" / "expected" / "powernorm_official.pt")
TOLERANCE = {torch.float64: {"atol": 1e-12, "rtol": 0.0}, torch.float32: {"atol": 1e-6, "rtol": 1e-6}}


@pytest.mark.parametrize("name", sorted(EXPECTED["cases"]))
def test_reproduces_the_official_outputs_gradients_and_buffers(name):
    case = EXPECTED["cases"][name]
    tol = TOLERANCE[case["dtype"]]
    norm = PowerNorm(case["weight"].shape[0], **case["overrides"]).to(case["dtype"])
    with torch.no_grad():
        norm.weight.copy_(case["weight"])
        norm.bias.copy_(case["bias"])
    warmup = case["overrides"]["warmup_iters"]
    assert len(case["steps"]) > warmup + 1  # iterations before, at and after the warmup
    for step, (inputs, official) in enumerate(zip(case["inputs"], case["steps"], strict=True), start=1):
        x = inputs["x"].clone().requires_grad_(True)
        norm.weight.grad = norm.bias.grad = None
        y = norm(x, inputs["keep"])
        y.backward(inputs["grad_out"])
        got = {"y": y, "grad_x": x.grad, "grad_weight": norm.weight.grad, "grad_bias": norm.bias.grad,
               "running_phi": norm.running_phi, "ema_gz": norm.ema_gz}  # fmt: skip
        for key, value in got.items():
            torch.testing.assert_close(value.detach(), official[key], **tol, msg=lambda m, k=key, s=step: f"{k} at {s}: {m}")
        assert int(norm.iters) == official["iters"] == step
    norm.eval()
    eval_x = case["eval_x"]
    torch.testing.assert_close(norm(eval_x, torch.ones(eval_x.shape[:2], dtype=torch.bool)), case["eval_y"], **tol)


def test_every_constant_is_the_official_default():
    official = EXPECTED["defaults"]  # read from MaskPowerNorm.__init__ and GroupScaling1D.__init__ by the script
    assert official == {"eps": 1e-5, "alpha_fwd": 0.9, "alpha_bkw": 0.9, "affine": True, "warmup_iters": 10000,
                        "group_num": 1, "group_eps": 1e-5}  # fmt: skip
    ours = {k: p.default for k, p in inspect.signature(PowerNorm.__init__).parameters.items() if p.default is not p.empty}
    # ``affine`` is stored and never read by the official code (weight and bias always apply): normlab has no such
    # argument; ``bias`` (True) is normlab's norm.bias, the official code always has one.
    assert ours == {"eps": 1e-5, "bias": True, "alpha_fwd": 0.9, "alpha_bkw": 0.9, "warmup_iters": 10000, "group_num": 1}
    assert GROUP_SCALING_EPS == official["group_eps"]
    norm = build_norm("powernorm", 16, eps=3e-5)  # norm.kind=powernorm: the official defaults, eps from norm.eps
    assert isinstance(norm, PowerNorm) and isinstance(norm, BatchReadingNorm)
    assert (norm.eps, norm.alpha_fwd, norm.alpha_bkw, norm.warmup_iters, norm.group_num) == (3e-5, 0.9, 0.9, 10000, 1)
    assert "powernorm" in NORM_KINDS and "powernorm" in BATCH_READING_KINDS
    with pytest.raises(ValueError, match="no impl 'native'"):
        build_norm("powernorm", 16, impl="native")
    with pytest.raises(ValueError, match="dim=10 is not divisible by group_num=4"):
        PowerNorm(10, group_num=4)


def _masked(seed: int = 0, D: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """x (3, 5, D) float64 and keep (3, 5), rows of 5, 2 and 4 real tokens."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, D, generator=g, dtype=torch.float64) * 3
    return x, torch.arange(5)[None, :] < torch.tensor([5, 2, 4])[:, None]


def test_training_forward_is_the_quadratic_mean_over_real_tokens_then_the_running_one_after_warmup():
    x, keep = _masked()
    norm = PowerNorm(8, warmup_iters=2, group_num=2).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    xs = group_scale(x, 2)
    # group scaling: every group of 4 channels of every token has mean square 1 (up to eps 1e-5)
    torch.testing.assert_close(
        xs.unflatten(-1, (2, 4)).pow(2).mean(-1), torch.ones(3, 5, 2, dtype=torch.float64), atol=1e-5, rtol=0
    )
    v1 = xs[keep].pow(2).mean(0)  # (D,): over the 11 real tokens, no mean subtracted
    y1 = norm(x, keep)
    torch.testing.assert_close(y1, norm.weight * xs / (v1 + 1e-5).sqrt() + norm.bias, atol=1e-12, rtol=0)
    torch.testing.assert_close(norm.running_phi, v1, atol=1e-12, rtol=0)  # step 1: the cumulative mean is v1 itself
    x2 = x.flip(0) * 2  # another batch: rows of 4, 2 and 5 real tokens after the flip
    v2 = group_scale(x2, 2)[keep.flip(0)].pow(2).mean(0)
    norm(x2, keep.flip(0))  # step 2 = warmup_iters: the batch statistic, no cumulative mean, then the EMA
    torch.testing.assert_close(norm.running_phi, 0.9 * v1 + 0.1 * v2, atol=1e-12, rtol=0)
    phi = norm.running_phi.clone()
    y3 = norm(x, keep)  # step 3 > warmup_iters: normalized by the running statistic from before this step
    torch.testing.assert_close(y3, norm.weight * xs / (phi + 1e-5).sqrt() + norm.bias, atol=1e-12, rtol=0)
    torch.testing.assert_close(norm.running_phi, 0.9 * phi + 0.1 * v1, atol=1e-12, rtol=0)
    assert int(norm.iters) == 3


def test_the_cumulative_mean_runs_before_warmup_iters():
    x, keep = _masked()
    norm = PowerNorm(8).double()  # warmup_iters 10000
    v = []
    for scale in (1.0, 3.0):
        v.append(group_scale(x * scale + scale, 1)[keep].pow(2).mean(0))
        norm(x * scale + scale, keep)
    torch.testing.assert_close(norm.running_phi, 0.9 * (v[0] + v[1]) / 2 + 0.1 * v[1], atol=1e-12, rtol=0)


def test_the_backward_is_the_approximate_one_with_its_ema():
    x, keep = _masked()
    x.requires_grad_(True)
    norm = PowerNorm(8, group_num=1, bias=False).double()
    assert norm.bias is None and "bias" not in dict(norm.named_parameters())
    xs = group_scale(x, 1)
    var = xs[keep].pow(2).mean(0)
    z = xs / (var + 1e-5).sqrt()
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    norm(x, keep).backward(upstream)
    # ema_gz starts at 0, so the gradient through the batch statistic is dropped: the gradient is that of
    # weight * xs / sqrt(var + eps) with var held fixed, chained through the group scaling by autograd.
    (expected_x,) = torch.autograd.grad(xs, x, upstream / (var + 1e-5).sqrt(), retain_graph=True)
    torch.testing.assert_close(x.grad, expected_x, atol=1e-12, rtol=0)
    torch.testing.assert_close(norm.weight.grad, (upstream * z).sum((0, 1)), atol=1e-12, rtol=0)
    # ema_gz moved by the mean of g * z over all 15 positions, the 4 pads included (the official line 91)
    torch.testing.assert_close(norm.ema_gz, (upstream * z).mean((0, 1)), atol=1e-12, rtol=0)
    assert not torch.allclose(norm.ema_gz, (upstream * z)[keep].mean(0))
    # Second step: the estimated gradient g - (1 - alpha_bkw) * ema_gz * z, divided by the batch statistic.
    ema = norm.ema_gz.clone()
    x.grad = None
    norm(x, keep).backward(upstream)
    approx = upstream - 0.1 * ema * z
    (expected_x,) = torch.autograd.grad(xs, x, approx / (var + 1e-5).sqrt())
    torch.testing.assert_close(x.grad, expected_x, atol=1e-12, rtol=0)
    torch.testing.assert_close(norm.ema_gz, ema + (approx * z).mean((0, 1)), atol=1e-12, rtol=0)


def test_padding_content_does_not_reach_real_tokens_outputs():
    x, keep = _masked()
    noisy = torch.where(keep[..., None], x, 100 * torch.randn(x.shape, dtype=torch.float64))
    a, b = PowerNorm(8, warmup_iters=2), PowerNorm(8, warmup_iters=2)
    for _ in range(4):  # before, at and after the warmup
        torch.testing.assert_close(a.double()(x, keep)[keep], b.double()(noisy, keep)[keep], atol=1e-12, rtol=0)
    torch.testing.assert_close(a.running_phi, b.running_phi, atol=1e-12, rtol=0)
    # The control: a statistic over every token, pads included, moves the real tokens' outputs.
    leaky = PowerNorm(8).double()
    assert (leaky(noisy, torch.ones_like(keep))[keep] - a.train()(x, keep)[keep]).abs().max() > 1e-2


def test_buffers_are_in_the_state_dict_and_restore_the_norm_exactly():
    x, keep = _masked()
    norm = PowerNorm(8, warmup_iters=2).double()
    for step in range(3):
        (norm(x * (step + 1), keep) * x).sum().backward()
    state = norm.state_dict()
    assert set(state) == {"weight", "bias", "running_phi", "ema_gz", "iters"}
    assert int(state["iters"]) == 3 and state["ema_gz"].abs().sum() > 0 and not torch.equal(state["running_phi"], torch.ones(8))
    resumed = PowerNorm(8, warmup_iters=2).double()
    resumed.load_state_dict(state)
    y, y_resumed = norm(x, keep), resumed(x, keep)  # step 4: the running statistic of both
    torch.testing.assert_close(y_resumed, y, atol=0, rtol=0)
    for key in ("running_phi", "ema_gz", "iters"):
        assert torch.equal(getattr(resumed, key), getattr(norm, key))


def test_eval_normalizes_by_the_running_statistic_and_leaves_the_buffers_alone():
    x, keep = _masked()
    norm = PowerNorm(8, warmup_iters=2, group_num=4).double()
    for step in range(3):
        norm(x + step, keep)
    norm.eval()
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    y = norm(x, keep)
    expected = norm.weight * group_scale(x, 4) / (norm.running_phi + 1e-5).sqrt() + norm.bias
    torch.testing.assert_close(y, expected, atol=1e-12, rtol=0)
    assert all(torch.equal(before[k], v) for k, v in norm.state_dict().items())
    torch.testing.assert_close(norm(x[1:2, :1], keep[1:2, :1]), y[1:2, :1], atol=0, rtol=0)  # a token alone
    torch.testing.assert_close(norm(x, torch.zeros_like(keep)), y, atol=0, rtol=0)  # keep unread in eval


def test_low_precision_input_is_normalized_in_float32():
    x, keep = _masked()
    big = (x * 300).float()
    ref = PowerNorm(8)(big, keep)
    y = PowerNorm(8)(big.to(torch.bfloat16), keep)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), ref, atol=4 * 2**-7 * ref.abs().max().item(), rtol=0)


def test_a_tiny_model_with_powernorm_in_the_encoder_trains_and_decodes():
    torch.manual_seed(0)
    norm = NormConfig(blocks=[{"stack": "enc", "kind": "powernorm"}])
    sizes = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_enc_layers": 2, "n_dec_layers": 2}
    model = EncoderDecoder(ModelConfig(src_vocab=12, tgt_vocab=12, pad_id=0, dropout=0.0, norm=norm, **sizes))
    pns = {name: m for name, m in model.named_modules() if isinstance(m, PowerNorm)}
    assert set(pns) == {f"encoder.{i}.{s}.norm_in" for i in range(2) for s in ("self_attn", "ffn")} | {"enc_final_norm"}
    assert isinstance(model.dec_final_norm, LayerNorm) and model.reads_batch
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(3, 12, (4, 7), generator=g), torch.randint(3, 12, (4, 6), generator=g)
    src[1, 3:] = src[3, 2:] = tgt[2, 4:] = 0
    logits = model(src, tgt[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert torch.isfinite(loss) and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(int(m.iters) == 1 and m.ema_gz.abs().sum() > 0 and m.weight.grad.abs().sum() > 0 for m in pns.values())
    model.eval()
    with torch.no_grad():  # eval: running statistics, each sentence alone gives what the batch gives
        torch.testing.assert_close(model(src[1:2], tgt[1:2, :-1]), model(src, tgt[:, :-1])[1:2], atol=2e-5, rtol=0)


def test_val_loss_with_batch_statistics_uses_the_running_statistic_after_the_warmup():
    # val/loss_batch_stats runs PowerNorm in training mode: one more iteration (its buffers put back after). While that
    # iteration is within warmup_iters it divides by the batch's statistic; after, by running_phi, as eval mode does.
    torch.manual_seed(0)
    norm = NormConfig(blocks=[{"stack": "enc", "kind": "powernorm"}], knobs={"powernorm": {"warmup_iters": 2}})
    sizes = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_enc_layers": 1, "n_dec_layers": 1}
    model = EncoderDecoder(ModelConfig(src_vocab=12, tgt_vocab=12, pad_id=0, dropout=0.0, norm=norm, **sizes))
    data = Seq2SeqData([[5, 6, 7], [8, 9], [5, 9, 9, 6]] * 4, [[4, 5], [6, 7, 8], [9]] * 4)
    other = Seq2SeqData([[7, 7, 3, 11], [10, 4]] * 3, [[4, 5], [6]] * 3)  # not the validation words: another statistic
    first = collate(other, list(range(len(other))))
    cpu = torch.device("cpu")
    gaps = []
    for _ in range(2):
        with torch.no_grad():
            model(first.src, first.tgt_in)  # a training-mode iteration: iters 1, then 2 (= warmup_iters)
        gaps.append(evaluate_loss(model, data, 64, cpu, batch_stats=True) - evaluate_loss(model, data, 64, cpu))
    assert abs(gaps[0]) > 1e-4  # iteration 2 <= warmup_iters: the batch's statistic
    assert gaps[1] == 0.0  # iteration 3 > warmup_iters: running_phi, the eval-mode loss exactly


def test_the_pre_pn_preset_is_powernorm_in_the_encoder_and_layernorm_in_the_whole_decoder():
    cfg = model_config(make_cfg("norm=pre_pn"), 12, 12)
    torch.manual_seed(0)
    model = EncoderDecoder(cfg)
    enc = [m for n, m in model.named_modules() if n.startswith("enc") and n.endswith(("norm_in", "final_norm"))]
    dec = [m for n, m in model.named_modules() if n.startswith("dec") and n.endswith(("norm_in", "final_norm"))]
    assert len(enc) == 2 * cfg.n_enc_layers + 1 and all(isinstance(m, PowerNorm) for m in enc)
    assert len(dec) == 3 * cfg.n_dec_layers + 1 and all(type(m) is LayerNorm for m in dec)
    assert all(cfg.block_norm("dec", i).kind == "layernorm" for i in range(cfg.n_dec_layers))


def test_the_config_passes_fairseqs_warmup_and_groups():
    # fairseq's NormSelect (norm_select.py line 19) passes --warmup-updates and the attention heads; so does the config.
    def powernorms(*overrides):
        model = EncoderDecoder(validate(make_cfg("norm=pre_pn", *overrides)).model)
        return [m for m in model.modules() if isinstance(m, PowerNorm)]

    built = powernorms("schedule.warmup_steps=7", "model.n_heads=4")
    assert built and {(m.warmup_iters, m.group_num) for m in built} == {(7, 4)}
    knobs = ("norm.knobs.powernorm.warmup_iters=0", "norm.knobs.powernorm.group_num=1")
    assert {(m.warmup_iters, m.group_num) for m in powernorms(*knobs)} == {(0, 1)}
    groups = (
        r"enc block 0: norm.knobs.powernorm.group_num=3 does not divide model.d_model=32; valid groups: \[1, 2, 4, 8, 16, 32\]"
    )
    for bad, message in (
        ("norm.knobs.powernorm.group_num=3", groups),
        ("norm.knobs.powernorm.warmup_iters=-1", "norm.knobs.powernorm.warmup_iters must be an integer >= 0, got -1"),
        ("norm.knobs.powernorm.warmup_iters=true", "norm.knobs.powernorm.warmup_iters must be an integer >= 0, got True"),
        (
            "+norm.knobs.powernorm.warmup=5",
            "norm.knobs.powernorm.warmup is not a knob of powernorm; valid: warmup_iters, group_num",
        ),
        ("+norm.knobs.layernorm={}", "unknown norm.knobs key 'layernorm'; valid: the kinds with their own settings, powernorm"),
    ):
        with pytest.raises(ValueError, match=message):
            validate(make_cfg("norm=pre_pn", bad))
    # A norm.blocks entry sets only the knobs it names.
    per_block = "norm.blocks=[{stack: enc, kind: powernorm}, {stack: enc, layers: [1], knobs: {powernorm: {warmup_iters: 3}}}]"
    built = EncoderDecoder(validate(make_cfg("norm=pre_pn", "schedule.warmup_steps=7", "model.n_heads=4", per_block)).model)
    assert [(m.warmup_iters, m.group_num) for m in built.encoder[1].modules() if isinstance(m, PowerNorm)] == [(3, 4)] * 2
    assert [(m.warmup_iters, m.group_num) for m in built.encoder[0].modules() if isinstance(m, PowerNorm)] == [(7, 4)] * 2
    # A config or checkpoint saved with the old flat keys reads with the knobs, a block entry's too.
    saved = {"norm": {"powernorm_warmup": 60, "powernorm_groups": 2, "blocks": [{"layers": [0], "powernorm_warmup": 5}]}}
    norm = with_current_names(saved)["norm"]
    assert norm["knobs"] == {"powernorm": {"warmup_iters": 60, "group_num": 2}}
    assert norm["blocks"] == [{"layers": [0], "knobs": {"powernorm": {"warmup_iters": 5}}}]
    # A config saved before the keys existed reads as the class defaults, which is what it built.
    old = with_current_names({"norm": {"kind": "powernorm"}})["norm"]
    assert old["knobs"]["powernorm"] == {"warmup_iters": 10000, "group_num": 1}
