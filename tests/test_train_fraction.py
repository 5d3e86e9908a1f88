"""data.train_fraction (DyT's data regime): a seeded subset of CMUdict's training words, nested across
fractions, every pronunciation of a chosen word kept; vocabularies, validation and test as with the whole split."""

import pytest
from omegaconf import OmegaConf

from data.cmudict_g2p import train_subset
from tests.helpers.config import make_cfg
from training import tasks
from training.schema import validate

WORDS = ["cat", "cat", "dog", "tact", "act", "god", "tag", "gat", "cog", "dot"]  # "cat": two pronunciations


def chosen(rows: list[int]) -> set[str]:
    return {WORDS[i] for i in rows}


def test_a_subset_keeps_whole_words_in_order_and_nests_across_fractions():
    for seed in (0, 1):
        small, large, whole = (train_subset(WORDS, f, seed) for f in (0.25, 0.5, 1.0))
        assert whole == list(range(len(WORDS)))
        assert len(chosen(small)) == 2 and len(chosen(large)) == 4  # round(0.25 * 9), round(0.5 * 9) distinct words
        assert chosen(small) < chosen(large) and small == sorted(small)
        assert all(i in small for i, w in enumerate(WORDS) if w in chosen(small))  # both "cat" rows, or none
    assert train_subset(WORDS, 0.01, 0) != [] and len(chosen(train_subset(WORDS, 0.01, 0))) == 1
    assert {frozenset(chosen(train_subset(WORDS, 0.5, s))) for s in range(6)} != {frozenset(chosen(large))}  # seeded


def test_the_subset_is_pinned():
    # MD5 of "<seed>:<word>", not Python's hash(): the same words in every process, on every machine.
    assert chosen(train_subset(WORDS, 0.25, 0)) == {"act", "cog"}
    assert chosen(train_subset(WORDS, 0.25, 1)) == {"cog", "tact"}


@pytest.mark.parametrize("fraction", ["0", "-0.5", "1.5"])
def test_a_fraction_outside_0_1_is_an_error_naming_it(fraction):
    with pytest.raises(ValueError, match=rf"data.train_fraction={fraction}: a fraction of the training words in \(0, 1\]"):
        validate(make_cfg(f"data.train_fraction={fraction}"))


def test_the_task_trains_on_the_subset_and_evaluates_on_the_whole_splits(capsys):
    whole = tasks.build_task(validate(make_cfg()), None, None)
    tenth = tasks.build_task(validate(make_cfg("data.train_fraction=0.1")), None, None)
    again = tasks.build_task(validate(make_cfg("data.train_fraction=0.1", "seed=1", "data.subset_seed=0")), None, None)
    other = tasks.build_task(validate(make_cfg("data.train_fraction=0.1", "seed=1")), None, None)
    assert capsys.readouterr().out == ""  # ranks other than 0 (run_dir None) print nothing
    n = len(whole.data["train"])
    assert 0.09 * n < len(tenth.data["train"]) < 0.11 * n
    assert again.data["train"] == tenth.data["train"] != other.data["train"]  # data.subset_seed, else the run's seed
    assert tenth.data["valid"] is whole.data["valid"] and tenth.eval_sets is whole.eval_sets
    assert tenth.src_vocab.to_str() == whole.src_vocab.to_str() and tenth.tgt_vocab.to_str() == whole.tgt_vocab.to_str()
    pairs = set(zip(map(tuple, whole.data["train"].src), map(tuple, whole.data["train"].tgt), strict=True))
    assert set(zip(map(tuple, tenth.data["train"].src), map(tuple, tenth.data["train"].tgt), strict=True)) <= pairs


def test_the_run_says_what_it_kept(tmp_path, capsys):
    tasks.build_task(validate(make_cfg("data.train_fraction=0.1")), tmp_path, None)
    line = capsys.readouterr().out
    assert line.startswith("normlab: data.train_fraction=0.1: ") and "of " in line and "target tokens; subset seed 0)" in line


def test_translation_data_has_no_train_fraction():
    cfg = make_cfg("data=multi30k")
    OmegaConf.set_struct(cfg, False)
    cfg.data.train_fraction = 0.5
    with pytest.raises(ValueError, match="train_fraction"):
        validate(cfg)
