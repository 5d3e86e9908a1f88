"""``norm.kind=batchnorm`` (model/batchnorm.py): custom and native agree with each other and with
``nn.BatchNorm1d``'s constants, statistics read real tokens only, two gloo ranks equal one process on the
concatenated batch (with no FutureWarning from the collective), the decoder policy, presets, exact resume with
the running buffers, telemetry."""

import json
import math
import warnings
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import train as train_module
from data.batching import Seq2SeqData, collate, make_batches
from data.tokenizer import PAD_ID
from model.batchnorm import MOMENTUM, BatchNorm, NativeBatchNorm
from model.beam_search import beam_search
from model.config import ModelConfig, NormConfig
from model.norms import LayerNorm, build_norm
from model.transformer import DecoderCache, EncoderDecoder
from tests.helpers.batch_reading import PAD, V, batch, noisy_padding
from tests.helpers.config import make_cfg, model_config
from tests.helpers.resume import EXACT, losses, stop_by_sigterm
from training.checkpoint import load_checkpoint
from training.evaluate import evaluate_loss
from training.step import StepOptions, token_losses

D = 16


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to the scale of b."""
    return ((a - b).abs().max() / b.abs().max()).item()


def stream(seed: int, lengths: tuple[int, ...], width: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, width, D), off zero mean and unit scale, and keep (B, width): row b's first lengths[b] tokens real.
    The pad positions hold values too, which no output of a real token may read."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), width, D, generator=g) * 3 + torch.randn(D, generator=g)
    keep = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return x, keep


def pair(bias: bool = True) -> tuple[nn.Module, nn.Module]:
    """custom and native batchnorm with the same non-trivial weight and bias."""
    torch.manual_seed(0)
    custom, native = build_norm("batchnorm", D, bias=bias), build_norm("batchnorm", D, impl="native", bias=bias)
    with torch.no_grad():
        for p in custom.parameters():
            p.normal_()
    native.load_state_dict(custom.state_dict())
    return custom, native


STEPS = [(6, 5, 2, 1), (3, 6, 4, 4), (1, 1, 1, 6)]  # real tokens per row of each training step's batch


@pytest.mark.parametrize("bias", [True, False])
def test_custom_matches_native_forward_backward_and_buffers_in_train_and_eval(bias):
    custom, native = pair(bias)
    assert isinstance(native, nn.BatchNorm1d) and native.momentum == MOMENTUM == 0.1 and native.eps == custom.eps == 1e-5
    for seed, lengths in enumerate(STEPS):
        x, keep = stream(seed, lengths)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = custom(xa, keep), native(xb, keep)
        assert max_rel_diff(ya, yb) < 1e-6
        g = torch.randn_like(ya)
        (ya * g).sum().backward()
        (yb * g).sum().backward()
        assert max_rel_diff(xa.grad, xb.grad) < 1e-6
    # Parameter gradients accumulated over the three steps; the buffers after three updates.
    for (name, p), (name_native, p_native) in zip(custom.named_parameters(), native.named_parameters(), strict=True):
        assert name == name_native and max_rel_diff(p.grad, p_native.grad) < 1e-6
    custom_state, native_state = custom.state_dict(), native.state_dict()
    assert list(custom_state) == list(native_state) == list(nn.BatchNorm1d(D, bias=bias).state_dict())
    assert custom_state["num_batches_tracked"].item() == native_state["num_batches_tracked"].item() == 3
    for key in ("running_mean", "running_var"):
        assert max_rel_diff(custom_state[key], native_state[key]) < 1e-6
    custom.eval()
    native.eval()
    x, keep = stream(9, (6, 1, 3, 2))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = custom(xa, keep), native(xb, keep)
    assert max_rel_diff(ya, yb) < 1e-6
    ya.sum().backward()
    yb.sum().backward()
    assert max_rel_diff(xa.grad, xb.grad) < 1e-6


def test_the_formula_and_the_running_update_by_hand():
    custom = build_norm("batchnorm", D)
    x, keep = stream(0, (6, 2, 3))
    real = x[keep]  # (11, D)
    y = custom(x, keep)
    mean, var = real.mean(0), real.var(0, unbiased=False)
    torch.testing.assert_close(y[keep], (real - mean) / (var + 1e-5).sqrt(), atol=1e-5, rtol=0)
    assert torch.equal(y[~keep], torch.zeros_like(y[~keep]))  # pads: 0, as in native
    # running = (1 - 0.1) running + 0.1 batch, from 0 and 1; the running variance unbiased (N / (N - 1)).
    torch.testing.assert_close(custom.running_mean, 0.1 * mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(custom.running_var, 0.9 + 0.1 * real.var(0, unbiased=True), atol=1e-6, rtol=0)
    custom.eval()
    want = (real - custom.running_mean) / (custom.running_var + 1e-5).sqrt()
    torch.testing.assert_close(custom(x, keep)[keep], want, atol=1e-5, rtol=0)


def test_a_state_dict_moves_between_custom_and_native_and_bias_false_drops_the_shift():
    custom, native = pair()
    x, keep = stream(0, (6, 3))
    custom(x, keep)  # moves the running buffers
    native.load_state_dict(custom.state_dict())  # strict
    custom.eval()
    native.eval()
    torch.testing.assert_close(native(x, keep), custom(x, keep), atol=1e-6, rtol=0)
    for impl in ("custom", "native"):
        assert [n for n, _ in build_norm("batchnorm", D, impl=impl, bias=False).named_parameters()] == ["weight"]


@pytest.mark.parametrize("impl", ["custom", "native"])
def test_real_tokens_do_not_see_padding_or_its_amount(impl):
    norm = build_norm("batchnorm", D, impl=impl)
    x, keep = stream(0, (6, 2, 4))
    unpadded = norm(x[keep][None], torch.ones(1, int(keep.sum()), dtype=torch.bool))[0]  # one row, every token real
    padded = norm(x, keep)
    wider = torch.cat([x, 100 * torch.randn(3, 5, D)], 1)  # more padding, with other values at the pads
    more = norm(wider, torch.cat([keep, torch.zeros(3, 5, dtype=torch.bool)], 1))
    torch.testing.assert_close(padded[keep], unpadded, atol=1e-6, rtol=0)
    torch.testing.assert_close(more[:, :6][keep], unpadded, atol=1e-6, rtol=0)
    assert torch.equal(more[:, 6:], torch.zeros(3, 5, D)) and torch.equal(padded[~keep], torch.zeros_like(padded[~keep]))


@pytest.mark.parametrize("impl", ["custom", "native"])
def test_fewer_than_two_real_tokens_in_training_is_one_clear_error(impl):
    norm = build_norm("batchnorm", D, impl=impl)
    x, keep = stream(0, (1, 0))
    with pytest.raises(ValueError, match=r"^norm.kind=batchnorm needs at least 2 real tokens .*; got 1$"):
        norm(x, keep)
    with pytest.raises(ValueError, match=r"got 0$"):
        norm(x, torch.zeros_like(keep))
    norm.eval()
    assert torch.isfinite(norm(x, keep)).all()  # the running statistics need no batch


def test_statistics_in_float32_or_wider_and_the_output_in_the_input_dtype():
    norm = build_norm("batchnorm", D)
    x, keep = stream(0, (6, 4))
    ref = norm(300 * x, keep)  # fp32; bf16 squares of ~1000 lose every digit of a small variance
    low = norm((300 * x).bfloat16(), keep)
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), ref, atol=4 * 2**-7 * ref.abs().max().item(), rtol=0)
    norm64 = build_norm("batchnorm", D).double()
    y = norm64(x.double(), keep)
    real = x.double()[keep]
    assert y.dtype == torch.float64
    torch.testing.assert_close(y[keep], (real - real.mean(0)) / (real.var(0, unbiased=False) + 1e-5).sqrt(), atol=1e-12, rtol=0)


def bn_model(seed: int = 0, **norm: object) -> EncoderDecoder:
    """A 2+2-layer model with BatchNorm in every norm (the decoder's too), dropout 0, training mode."""
    torch.manual_seed(seed)
    sizes = {"d_model": D, "n_heads": 2, "d_ff": 32, "n_enc_layers": 2, "n_dec_layers": 2}
    cfg = NormConfig(**{"kind": "batchnorm", "decoder_batch_stats": True, **norm})
    return EncoderDecoder(ModelConfig(src_vocab=V, tgt_vocab=V, pad_id=PAD, dropout=0.0, norm=cfg, **sizes))


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_padding_reaches_neither_the_real_tokens_nor_the_loss_nor_the_gradients(placement):
    src, tgt = batch()
    real = tgt.ne(PAD)
    model = bn_model(placement=placement)
    options = StepOptions(world=1, label_smoothing=0.1, grad_clip=None, autocast=nullcontext())
    runs = []
    for seed in (0, 1):  # random values written into the embeddings at every pad position
        model.zero_grad()
        logits = noisy_padding(model, src, tgt, seed)
        loss, _ = token_losses(logits, torch.where(real, tgt, PAD), options)
        loss.backward()
        runs.append((logits[real], loss, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (a, loss_a, grads_a), (b, loss_b, grads_b) = runs
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss_a, loss_b, atol=1e-6, rtol=0)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=0, msg=name)
    # More padding columns change nothing either: the statistics count real tokens only.
    pad = torch.full((len(src), 3), PAD)
    wider = model(torch.cat([src, pad], 1), torch.cat([tgt, pad], 1))[:, : tgt.shape[1]]
    torch.testing.assert_close(wider[real], model(src, tgt)[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", ["custom", "native"])
def test_eval_mode_decodes_token_by_token_as_a_full_pass(impl):
    src, tgt = batch()
    model = bn_model(impl=impl)
    model(src, tgt)  # one training pass moves the running statistics
    model.eval()
    src_pad_mask = src.eq(PAD)
    memory = model.encode(src, src_pad_mask)
    cache = DecoderCache(len(model.decoder))
    steps = [model.decode(tgt[:, t : t + 1], memory, src_pad_mask, cache) for t in range(tgt.shape[1])]
    real = tgt.ne(PAD)
    torch.testing.assert_close(torch.cat(steps, 1)[real], model.decode(tgt, memory, src_pad_mask)[real], atol=1e-5, rtol=0)
    assert len(beam_search(model, src, bos_id=1, eos_id=2, beam_size=2, alpha=0.6, max_len=5)) == len(src)


# -- Under DDP: two gloo ranks with uneven real tokens equal one process on the concatenated batch. --

DDP_STEPS = [(6, 5, 2, 1), (3, 6, 0, 0), (4, 4, 4, 4)]  # rows 0-1 on rank 0, rows 2-3 on rank 1: 11 vs 3, 9 vs 0, 8 vs 8


def ddp_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (4, 6, D), keep (4, 6) and an output gradient (4, 6, D) of DDP step ``seed``."""
    x, keep = stream(seed, DDP_STEPS[seed])
    return x, keep, torch.randn(x.shape, generator=torch.Generator().manual_seed(100 + seed))


def run_steps(norm: BatchNorm, rows: slice) -> dict[str, torch.Tensor]:
    """The DDP steps on ``rows`` of each batch: outputs and input gradients per step, then the parameter
    gradients summed over the steps and the buffers."""
    out = {}
    for step in range(len(DDP_STEPS)):
        x, keep, g = ddp_batch(step)
        x = x[rows].clone().requires_grad_()
        y = norm(x, keep[rows])
        (y * g[rows]).sum().backward()
        out[f"y{step}"], out[f"dx{step}"] = y.detach(), x.grad
    return out | {f"d{n}": p.grad for n, p in norm.named_parameters()} | dict(norm.named_buffers())


def ddp_worker(rank: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    try:
        norm = pair()[0]
        norm.group = dist.group.WORLD
        with warnings.catch_warnings():  # torch's deprecated autograd all_reduce warns so: its return fails the test
            warnings.simplefilter("error", FutureWarning)
            out = run_steps(norm, slice(2 * rank, 2 * rank + 2))
        try:  # why native refuses a group: torch's cross-process BatchNorm on CPU input
            nn.SyncBatchNorm(D)(torch.randn(4, D))
        except ValueError as err:
            out["sync_error"] = str(err)
        torch.save(out, f"{tmp}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_two_ranks_with_uneven_real_tokens_equal_one_process_on_the_concatenated_batch(tmp_path):
    mp.spawn(ddp_worker, args=(str(tmp_path),), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    one = run_steps(pair()[0], slice(0, 4))
    for step in range(len(DDP_STEPS)):
        for key in (f"y{step}", f"dx{step}"):
            torch.testing.assert_close(torch.cat([r[key] for r in ranks]), one[key], atol=1e-5, rtol=1e-6, msg=key)
    for key in ("dweight", "dbias"):  # each rank's share of the gradient; DDP's all-reduce sums them
        torch.testing.assert_close(ranks[0][key] + ranks[1][key], one[key], atol=1e-5, rtol=1e-6, msg=key)
    for key in ("running_mean", "running_var", "num_batches_tracked"):
        for r in ranks:
            torch.testing.assert_close(r[key], one[key], atol=1e-6, rtol=1e-6, msg=key)
    assert one["num_batches_tracked"].item() == 3
    assert ranks[0]["sync_error"].startswith("SyncBatchNorm expected input tensor to be on GPU")


def test_native_refuses_a_process_group_naming_the_custom_impl():
    model = bn_model(impl="native")
    model.set_norm_group(None)  # a single process: fine
    with pytest.raises(ValueError, match=r"norm.impl=native .* under torchrun use norm.impl=custom$"):
        model.set_norm_group(object())  # stands for torch.distributed.group.WORLD
    custom = bn_model()
    group = object()
    custom.set_norm_group(group)
    assert all(m.group is group for m in custom.modules() if isinstance(m, BatchNorm))
    assert not any(isinstance(m, NativeBatchNorm) for m in custom.modules())


# -- The decoder policy (model.config.ModelConfig): batch statistics in the decoder only when asked. --


@pytest.mark.parametrize(
    ("norm", "block"),
    [
        ({"kind": "batchnorm"}, 0),
        ({"kind": "batchnorm", "impl": "native", "placement": "post"}, 0),
        ({"blocks": [{"stack": "dec", "layers": [1], "kind": "batchnorm"}]}, 1),  # the last block: the final norm too
    ],
)
def test_a_batch_reading_kind_in_the_decoder_is_a_config_error_naming_the_fix(norm, block):
    with pytest.raises(ValueError) as err:
        ModelConfig(src_vocab=V, tgt_vocab=V, n_dec_layers=2, norm=NormConfig(**norm))
    assert str(err.value) == (
        f"norm.kind=batchnorm in decoder block {block} reads future target positions in training (a causality leak): "
        "keep the decoder token-wise, e.g. 'norm.blocks=[{stack: dec, kind: layernorm}]', "
        "or allow it with norm.decoder_batch_stats=true"
    )
    allowed = ModelConfig(src_vocab=V, tgt_vocab=V, n_dec_layers=2, norm=NormConfig(**norm, decoder_batch_stats=True))
    assert allowed.norm.decoder_batch_stats is True


@pytest.mark.parametrize(("preset", "finals"), [("pre_bn", (BatchNorm, LayerNorm)), ("post_bn", (nn.Identity, nn.Identity))])
def test_presets_put_batchnorm_in_the_encoder_and_layernorm_in_the_decoder(preset, finals):
    cfg = make_cfg(f"norm={preset}")
    assert cfg.norm.decoder_batch_stats is False  # the default
    model = EncoderDecoder(model_config(cfg, V, V))
    for prefix, kind in (("encoder.", BatchNorm), ("decoder.", LayerNorm)):
        slots = {type(m) for name, m in model.named_modules() if name.startswith(prefix) and ".norm_" in name}
        assert slots == {kind, nn.Identity}, prefix
    assert (type(model.enc_final_norm), type(model.dec_final_norm)) == finals


# -- Runs: exact resume with the running buffers, and telemetry=full. --


def test_a_pre_bn_run_stopped_and_resumed_ends_with_the_same_weights_and_buffers(tmp_path, monkeypatch):
    cfg = [*EXACT, "norm=pre_bn"]
    train_module.train(make_cfg(*cfg), tmp_path / "straight")
    stop_by_sigterm(monkeypatch, make_cfg(*cfg), tmp_path / "stopped", 5)
    train_module.train(make_cfg(*cfg), tmp_path / "stopped")
    assert losses(tmp_path / "stopped") == losses(tmp_path / "straight")  # loss and lr, bit for bit, at every step
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.pt")["model"] for d in ("straight", "stopped"))
    buffers = [k for k in a if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert "enc_final_norm.running_var" in buffers and len(buffers) == 3 * (2 * 2 + 1)  # tiny: 2 encoder blocks
    assert a["enc_final_norm.num_batches_tracked"].item() == 12
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_telemetry_full_run_with_pre_bn_records_the_batchnorm_sites(tmp_path):
    metrics = train_module.train(make_cfg("norm=pre_bn", "telemetry=full", "trainer.max_steps=3"), tmp_path)
    rows = (tmp_path / "metrics.jsonl").read_text()
    for site in ("act/enc.0.self_attn.norm_in/rms", "act/enc.final_norm/rms", "act/dec.0.ffn.norm_in/rms",
                 "bstat/enc.0.self_attn.norm_in/mean_dist", "bstat/enc.final_norm/var_dist"):  # fmt: skip
        assert f'"{site}"' in rows, site
    assert '"bstat/dec.' not in rows  # the decoder's LayerNorms read no batch
    assert 0 <= metrics["test/wer"] <= 1
    # Every validation row of a model with a batch-reading norm has the loss with batch statistics too.
    val = [json.loads(r) for r in rows.splitlines() if '"val/loss"' in r]
    assert len(val) >= 2 and all(math.isfinite(r["val/loss_batch_stats"]) for r in val if r["step"] > 0)


def test_val_loss_with_batch_statistics_is_the_train_eval_gap_and_changes_nothing():
    model = bn_model()  # BatchNorm in both stacks; PAD_ID is the data's pad id
    assert PAD == PAD_ID
    data = Seq2SeqData([[5, 6, 7], [8, 9], [5, 9, 9, 6]] * 4, [[4, 5], [6, 7, 8], [9]] * 4)
    first = collate(data, list(range(len(data))))
    model(first.src, first.tgt_in)  # training mode: the running statistics move away from their init
    state = {k: v.clone() for k, v in model.state_dict().items()}
    running = evaluate_loss(model, data, 64, torch.device("cpu"))
    batch = evaluate_loss(model, data, 64, torch.device("cpu"), batch_stats=True)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # buffers restored
    assert model.training and all(m.training for m in model.modules())
    # By hand: each batch through the model with only the BatchNorms in training mode, buffers reset after each.
    model.eval()
    for m in model.modules():
        if isinstance(m, BatchNorm):
            m.train()
    total = count = 0
    for index in make_batches(data, 64):
        b = collate(data, index)
        with torch.no_grad():
            logits = model(b.src, b.tgt_in)
        total += F.cross_entropy(logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=PAD_ID, reduction="sum").item()
        count += b.n_tgt_tokens
        model.load_state_dict(state)
    assert batch == pytest.approx(total / count, rel=1e-6)
    assert abs(batch - running) > 1e-3  # batch statistics differ from the running ones: a gap to measure


@pytest.mark.parametrize("kind", ["batchnorm", "powernorm"])
@pytest.mark.parametrize("placement", ["rezero", "tfixup"])
def test_a_placement_without_norms_refuses_a_batch_reading_kind_in_one_line(kind, placement):
    with pytest.raises(ValueError, match=rf"^norm.kind='{kind}' cannot be used with norm.placement='{placement}'; valid "):
        NormConfig(kind=kind, placement=placement)
