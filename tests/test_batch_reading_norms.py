"""The door for norms that read the batch (``model.norms.BatchReadingNorm``): the keep mask reaches
every slot and final norm of both stacks, padding never leaks into real tokens, running buffers
live in the state dict and follow ``train()`` / ``eval()``, and token-wise norms are called as before.

The norm here is a throw-away, test-only one: ``MaskedMeanNorm`` subtracts the mean over real tokens.
"""

import pytest
import torch
from torch import nn

from model import norms as norms_module
from model.beam_search import beam_search
from model.config import ModelConfig, NormConfig
from model.norms import BatchReadingNorm
from model.transformer import DecoderCache, EncoderDecoder
from tests.helpers.batch_reading import BOS, EOS, PAD, D, V, batch, noisy_padding


class MaskedMeanNorm(BatchReadingNorm):
    """``y = x - mu``: training mode, mu (D,) is the mean of x over the tokens where ``keep`` is True
    (over every token with ``real_only=False``, the leaky control), blended into the buffer
    ``running_mean``; eval mode, mu = ``running_mean``. Shapes: x (B, L, D), keep (B, L) -> (B, L, D)."""

    def __init__(self, dim: int, real_only: bool = True) -> None:
        super().__init__()
        self.real_only = real_only
        self.register_buffer("running_mean", torch.zeros(dim))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x - self.running_mean
        mu = x[keep].mean(0) if self.real_only else x.flatten(0, -2).mean(0)
        with torch.no_grad():
            self.running_mean.lerp_(mu, 0.5)
        return x - mu


@pytest.fixture
def masked_mean(monkeypatch):
    """``norm.kind=rmsnorm`` builds a ``MaskedMeanNorm`` while the test runs; the returned dict's
    ``real_only`` is read at build time."""
    options = {"real_only": True}
    classes = norms_module._norm_class

    def factory(dim: int, eps: float) -> MaskedMeanNorm:
        return MaskedMeanNorm(dim, options["real_only"])

    monkeypatch.setattr(norms_module, "_norm_class", lambda path: factory if path == "model.norms:RMSNorm" else classes(path))
    return options


def make_model(placement: str = "pre", kind: str = "rmsnorm", impl: str = "custom", seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    norm = NormConfig(kind=kind, placement=placement, impl=impl)
    sizes = {"d_model": D, "n_heads": 2, "d_ff": 32, "n_enc_layers": 2, "n_dec_layers": 2}
    return EncoderDecoder(ModelConfig(src_vocab=V, tgt_vocab=V, pad_id=PAD, dropout=0.0, norm=norm, **sizes))


def reading_norms(model: nn.Module) -> dict[str, BatchReadingNorm]:
    return {name: m for name, m in model.named_modules() if isinstance(m, BatchReadingNorm)}


# Slots each placement fills: norm_in (pre), norm_in + norm_branch (sandwich), norm_out (post),
# norm_in + norm_out (keel); the final norms with pre and sandwich.
SLOTS = [
    ("pre", {"norm_in"}, True),
    ("sandwich", {"norm_in", "norm_branch"}, True),
    ("post", {"norm_out"}, False),
    ("keel", {"norm_in", "norm_out"}, False),
]


@pytest.mark.parametrize(("placement", "slots", "finals"), SLOTS)
def test_every_slot_and_final_norm_gets_its_streams_keep_mask(masked_mean, placement, slots, finals):
    model = make_model(placement)
    src, tgt = batch()
    expected = {"enc": src.ne(PAD), "dec": tgt.ne(PAD)}
    seen: dict[str, torch.Tensor] = {}
    for name, norm in reading_norms(model).items():
        norm.register_forward_pre_hook(lambda mod, args, name=name: seen.__setitem__(name, args[1]))
    model(src, tgt)
    sublayers = {"enc": ("self_attn", "ffn"), "dec": ("self_attn", "cross_attn", "ffn")}
    stacks = {"enc": "encoder", "dec": "decoder"}
    wanted = {f"{stacks[s]}.{i}.{r}.{n}" for s in stacks for i in range(2) for r in sublayers[s] for n in slots}
    wanted |= {"enc_final_norm", "dec_final_norm"} if finals else set()
    assert set(seen) == wanted == set(reading_norms(model))
    for name, keep in seen.items():
        torch.testing.assert_close(keep, expected["enc" if name.startswith("enc") else "dec"], rtol=0, atol=0)


@pytest.mark.parametrize("placement", ["pre", "sandwich", "post"])
def test_padding_content_does_not_reach_real_tokens(masked_mean, placement):
    src, tgt = batch()
    real = tgt.ne(PAD)
    model = make_model(placement)
    a, b = (noisy_padding(model, src, tgt, seed)[real] for seed in (0, 1))
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # The control: a mean over every token, pads included, lets the padding in.
    masked_mean["real_only"] = False
    leaky = make_model(placement)
    a, b = (noisy_padding(leaky, src, tgt, seed)[real] for seed in (0, 1))
    assert (a - b).abs().max() > 1e-2


def test_running_buffers_are_saved_resumed_and_switched_by_train_eval(masked_mean):
    src, tgt = batch()
    model = make_model("pre")
    for seed in range(3):  # training passes move the running means
        model(*batch(seed))
    state = model.state_dict()
    for name in ("encoder.0.self_attn.norm_in", "decoder.1.ffn.norm_in", "enc_final_norm", "dec_final_norm"):
        assert state[f"{name}.running_mean"].abs().sum() > 0
    resumed = make_model("pre", seed=1)
    resumed.load_state_dict(state)
    model.eval()
    resumed.eval()
    torch.testing.assert_close(resumed(src, tgt), model(src, tgt), rtol=0, atol=0)
    # Eval mode reads the running means only: a row's logits do not depend on the rest of the batch
    # (up to float32 matmul blocking, which differs with batch size and thread count: ~3e-6 seen on 2 threads;
    # training-mode statistics over the batch move them by orders of magnitude more).
    torch.testing.assert_close(model(src[:1], tgt[:1]), model(src, tgt)[:1], atol=2e-5, rtol=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    evaluated = model(src, tgt)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # eval left the buffers alone
    model.train()
    assert (model(src, tgt) - evaluated).abs().max() > 1e-3  # training mode: this batch's statistics


def test_incremental_decoding_uses_running_statistics_in_eval_mode_only(masked_mean):
    src, tgt = batch()
    model = make_model("pre")
    model(src, tgt)  # one training pass, so the running means are not zero
    src_pad_mask = src.eq(PAD)
    memory = model.encode(src, src_pad_mask)
    with pytest.raises(RuntimeError, match="model.eval"):
        model.decode(tgt[:, :1], memory, src_pad_mask, DecoderCache(len(model.decoder)))
    model.eval()
    memory = model.encode(src, src_pad_mask)
    cache = DecoderCache(len(model.decoder))
    steps = [model.decode(tgt[:, t : t + 1], memory, src_pad_mask, cache) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), model.decode(tgt, memory, src_pad_mask), atol=1e-5, rtol=0)
    assert len(beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=2, alpha=0.6, max_len=5)) == len(src)


def test_set_norm_group_reaches_every_batch_reading_norm(masked_mean):
    model = make_model("sandwich")
    assert model.reads_batch and all(norm.group is None for norm in reading_norms(model).values())
    group = object()  # stands for a torch.distributed.ProcessGroup: the model only hands it on
    model.set_norm_group(group)
    assert len(reading_norms(model)) == 4 * 2 + 6 * 2 + 2
    assert all(norm.group is group for norm in reading_norms(model).values())


TOKEN_WISE = [
    ("pre", "layernorm", "custom"),
    ("post", "rmsnorm", "native"),
    ("sandwich", "dyt", "custom"),
    ("keel", "scalenorm", "custom"),
]


@pytest.mark.parametrize(("placement", "kind", "impl"), TOKEN_WISE)
def test_token_wise_norms_are_called_with_the_stream_alone(placement, kind, impl):
    model = make_model(placement, kind, impl=impl)
    assert not model.reads_batch and not reading_norms(model)
    calls: list[tuple[tuple, dict]] = []
    slots = ("norm_in", "norm_branch", "norm_out", "final_norm")
    norms = [m for name, m in model.named_modules() if name.endswith(slots) and not isinstance(m, nn.Identity)]
    for norm in norms:
        norm.register_forward_pre_hook(lambda _, args, kwargs: calls.append((args, kwargs)), with_kwargs=True)
    model(*batch())
    assert len(calls) == len(norms) > 0 and all(len(args) == 1 and not kwargs for args, kwargs in calls)
