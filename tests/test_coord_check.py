"""The coordinate check (training.coord_check, scripts/coord_check.py): on a small case, the blocks' activations grow
with the width under sp after Adam's first updates and keep their size under mup."""

from dataclasses import replace
from statistics import mean

import pytest

from model.config import ModelConfig
from training.coord_check import LOGITS, coord_check, slopes, widened

CFG = ModelConfig(src_vocab=40, tgt_vocab=50, d_model=32, d_ff=128, n_heads=4, n_enc_layers=1, n_dec_layers=1)


@pytest.fixture(scope="module")
def measured() -> dict:
    return slopes(coord_check(CFG, [32, 64, 128], 32, steps=2, lr=1e-2))


def block_slopes(s: dict, parametrization: str, step: int) -> list[float]:
    """The slopes at ``step`` of the blocks' branch outputs and block outputs (``enc.0.ffn``, ``dec.0.out``; not the
    norms' inputs, which a norm holds at about 1 whatever the width, nor the embeddings or logits)."""
    ends = (".self_attn", ".cross_attn", ".ffn", ".out")
    return [v for (p, t, site), v in s.items() if p == parametrization and t == step and site.endswith(ends)]


def test_blocks_grow_with_the_width_under_sp_and_keep_their_size_under_mup(measured: dict) -> None:
    for step in (0, 1, 2):
        sp, mup = block_slopes(measured, "sp", step), block_slopes(measured, "mup", step)
        assert len(sp) == len(mup) == 3 + 4  # the encoder's two branches and output, the decoder's three and output
        if step == 0:  # at init both are width-free: the same model up to its multipliers (slope about 0)
            assert max(abs(v) for v in sp + mup) < 0.15
        else:  # after updates: doubling the width multiplies every sp size by 2^0.4 or more; mup's stay about put
            assert min(sp) > 0.4 and mean(sp) > 0.5, (step, sp)
            assert max(abs(v) for v in mup) < 0.3 and abs(mean(mup)) < 0.15, (step, mup)
    # the logits: shrinking with the width at init under mup (its 1 / sqrt(m) readout), less so once trained
    assert measured[("mup", 0, LOGITS)] < -0.2 and measured[("mup", 2, LOGITS)] > measured[("mup", 0, LOGITS)]


def test_a_width_that_cannot_be_widened_to_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"width 36: d_ff would be 112.5 \(model.d_ff \* width / model.d_model\)"):
        widened(replace(CFG, d_ff=100), 36, "mup", 32)
    with pytest.raises(ValueError, match="model.base_d_model=30 is not divisible by model.n_heads=4"):
        widened(CFG, 64, "mup", 30)
