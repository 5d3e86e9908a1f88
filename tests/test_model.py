"""Model behaviour: causality, padding invariance, shapes, config errors."""

import pytest
import torch

from model.config import ModelConfig, NormConfig
from model.transformer import EncoderDecoder


def make_model(placement="pre", kind="layernorm", impl="custom", **sizes) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=20, tgt_vocab=24, d_model=32, n_heads=4, d_ff=64, n_enc_layers=2, n_dec_layers=2,
                      dropout=0.0, norm=NormConfig(kind=kind, impl=impl, placement=placement), **sizes)  # fmt: skip
    return EncoderDecoder(cfg).eval()


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_decoder_is_causal(placement):
    """Token-wise norms keep the decoder causal in every mode. A batch-reading norm (batchnorm) does not in
    training mode, so the config admits one in the decoder only with ``norm.decoder_batch_stats=true``
    (``ModelConfig``; the leak is measured by the test below)."""
    model = make_model(placement)
    src = torch.randint(4, 20, (3, 9))
    tgt = torch.randint(4, 24, (3, 8))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, 24, (3, 3))
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


LEAKS = [("batchnorm", True, True), ("batchnorm", False, False), ("layernorm", True, False)]  # (kind, training mode, leaks)


@pytest.mark.parametrize(("kind", "train", "leaks"), LEAKS)
def test_batch_statistics_in_the_decoder_read_later_positions_in_training_only(kind, train, leaks):
    """d(logits at target position 1) / d(decoder input at positions 2..) with ``norm.decoder_batch_stats=true``:
    nonzero for batchnorm in training mode, in the same sentence and the others; exactly zero in eval mode
    (running statistics) and for layernorm."""
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=20, tgt_vocab=24, d_model=32, n_heads=4, d_ff=64, n_enc_layers=2, n_dec_layers=2,
                      dropout=0.0, norm=NormConfig(kind=kind, decoder_batch_stats=True))  # fmt: skip
    model = EncoderDecoder(cfg)
    src, tgt = torch.randint(4, 20, (3, 9)), torch.randint(4, 24, (3, 8))
    model(src, tgt)  # one training pass moves the running statistics off their init
    model.train(train)
    inputs = []
    model.tgt_embed.register_forward_hook(lambda mod, args, out: inputs.append(out))
    logits = model(src, tgt)
    (grad,) = torch.autograd.grad(logits[:, 1].sum(), inputs[0])  # (3, 8, D)
    later = grad[:, 2:].abs().amax(-1)  # (3, 6): each sentence's positions after 1
    if leaks:
        assert (later > 1e-6).all()
    else:
        assert torch.equal(later, torch.zeros_like(later))


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_extra_src_padding_changes_no_output(placement):
    model = make_model(placement)
    src = torch.randint(4, 20, (2, 6))
    tgt = torch.randint(4, 24, (2, 5))
    padded = torch.cat([src, torch.zeros(2, 7, dtype=torch.long)], dim=1)  # pad_id = 0
    torch.testing.assert_close(model(src, tgt), model(padded, tgt), atol=1e-6, rtol=0)


def test_fully_padded_src_row_gives_finite_output():
    model = make_model()
    src = torch.zeros(2, 5, dtype=torch.long)
    src[0, :3] = 7
    assert torch.isfinite(model(src, torch.randint(4, 24, (2, 4)))).all()


def test_output_shape_and_tied_projection():
    model = make_model()
    logits = model(torch.randint(4, 20, (3, 9)), torch.randint(4, 24, (3, 6)))
    assert logits.shape == (3, 6, 24)
    assert model.output.weight is model.tgt_embed.tokens.weight


def test_final_norm_only_for_pre():
    assert isinstance(make_model("post").enc_final_norm, torch.nn.Identity)
    assert not isinstance(make_model("pre").enc_final_norm, torch.nn.Identity)


def test_joint_vocabulary_shares_one_embedding_matrix():
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=24, tgt_vocab=24, d_model=32, n_heads=4, d_ff=64, n_enc_layers=1, n_dec_layers=1,
                      share_embeddings=True)  # fmt: skip
    model = EncoderDecoder(cfg)
    assert model.src_embed.tokens.weight is model.tgt_embed.tokens.weight is model.output.weight
    with pytest.raises(ValueError, match="share_embeddings needs one vocabulary, got src_vocab=20, tgt_vocab=24"):
        ModelConfig(src_vocab=20, tgt_vocab=24, share_embeddings=True)


def test_custom_and_native_models_share_state_dicts():
    custom, native = make_model(impl="custom"), make_model(impl="native")
    native.load_state_dict(custom.state_dict())  # strict: same names and shapes
    src, tgt = torch.randint(4, 20, (2, 6)), torch.randint(4, 24, (2, 5))
    torch.testing.assert_close(custom(src, tgt), native(src, tgt), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, "d_model=30 is not divisible by model.n_heads=4"),
        ({"positions": "rotary"}, "valid: sinusoidal, learned"),
        ({"dropout": 1.5}, "dropout must be in"),
    ],
)
def test_bad_model_config_names_the_value(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(src_vocab=10, tgt_vocab=10, **change)


def test_unknown_placement_lists_valid_ones():
    with pytest.raises(ValueError, match="valid placements: post, pre"):
        NormConfig(placement="middle")


def test_sequence_longer_than_max_len_is_an_error():
    model = make_model(max_len=8)
    with pytest.raises(ValueError, match="exceeds model.max_len=8"):
        model(torch.randint(4, 20, (1, 9)), torch.randint(4, 24, (1, 3)))
