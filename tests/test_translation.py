"""Translation: local corpora in both layouts, byte-level BPE and its cache, BLEU/chrF, the hub
error offline, and a short training run on a fixture corpus."""

import json
import subprocess
import sys

import pytest
from datasets import Dataset, DatasetDict

import train as train_module
from data.bpe import cached_bpe, train_bpe
from data.metrics import bleu_chrf
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, detokenize
from data.translation import TranslationDataConfig, load_pairs
from tests.helpers.config import ROOT, make_cfg
from training.checkpoint import load_checkpoint

# A toy German-English corpus: numbers and colours in short sentences. No umlaut anywhere.
NUMBERS = {"eins": "one", "zwei": "two", "drei": "three", "vier": "four", "fuenf": "five", "sechs": "six"}
THINGS = {"Hund": "dog", "Haus": "house", "Baum": "tree", "Ball": "ball", "Tisch": "table"}
COLOURS = {"rot": "red", "blau": "blue", "gruen": "green", "gelb": "yellow"}


def corpus() -> list[tuple[str, str]]:
    pairs = []
    for de_n, en_n in NUMBERS.items():
        for de_t, en_t in THINGS.items():
            for de_c, en_c in COLOURS.items():
                pairs.append((f"{de_n} {de_t} ist {de_c} .", f"{en_n} {en_t} is {en_c} ."))
    return pairs  # 120 pairs


def splits() -> dict[str, list[tuple[str, str]]]:
    pairs = corpus()
    train = [p for i, p in enumerate(pairs) if i % 10 not in (3, 7)]  # valid and test sentences are unseen
    return {"train": train, "valid": pairs[3::10], "test": pairs[7::10]}


def write_corpus(directory, fmt: str, layout: str = "flat") -> None:
    """Write the fixture corpus as train/valid/test files (``jsonl``, ``tsv``, ``csv``) or ``save_to_disk``."""
    directory.mkdir(parents=True, exist_ok=True)
    data = splits()
    if fmt == "disk":
        rows = {s: ({"translation": [{"de": d, "en": e} for d, e in p]} if layout == "nested"
                    else {"de": [d for d, _ in p], "en": [e for _, e in p]}) for s, p in data.items()}  # fmt: skip
        saved = DatasetDict({("validation" if s == "valid" else s): Dataset.from_dict(r) for s, r in rows.items()})
        saved.save_to_disk(directory)
        return
    for split, pairs in data.items():
        path = directory / f"{'dev' if split == 'valid' and fmt == 'csv' else split}.{fmt}"
        if fmt == "jsonl":
            lines = [
                json.dumps({"translation": {"de": d, "en": e}} if layout == "nested" else {"de": d, "en": e}) for d, e in pairs
            ]
            path.write_text("\n".join(lines) + "\n")
        else:
            sep = "\t" if fmt == "tsv" else ","
            path.write_text("".join(f"{e}{sep}{d}\n" for d, e in [("de", "en"), *pairs]))  # en column first


def local_cfg(path, **kw) -> TranslationDataConfig:
    return TranslationDataConfig(name="local", source="local", src_lang="de", tgt_lang="en", path=str(path), **kw)


@pytest.mark.parametrize(("fmt", "layout"), [("jsonl", "flat"), ("jsonl", "nested"), ("tsv", "flat"), ("csv", "flat"),
                                             ("disk", "flat"), ("disk", "nested")])  # fmt: skip
def test_local_corpus_in_every_format_and_layout_reads_the_same_pairs(fmt, layout, tmp_path):
    write_corpus(tmp_path, fmt, layout)
    pairs = load_pairs(local_cfg(tmp_path))
    for split, expected in splits().items():
        assert list(zip(pairs[split].src, pairs[split].tgt, strict=True)) == expected
    reverse = load_pairs(TranslationDataConfig(name="local", source="local", src_lang="en", tgt_lang="de", path=str(tmp_path)))
    assert reverse["test"].src[0] == splits()["test"][0][1]


def test_tsv_keeps_quotes_and_words_pandas_would_call_missing(tmp_path):
    write_corpus(tmp_path, "tsv")
    (tmp_path / "train.tsv").write_text('de\ten\n"Hallo" sagt er .\t"hello" he says .\nNA\tnull\n')
    train = load_pairs(local_cfg(tmp_path))["train"]
    assert train.src == ['"Hallo" sagt er .', "NA"] and train.tgt == ['"hello" he says .', "null"]


def test_max_examples_caps_training_pairs_and_empty_pairs_are_dropped(tmp_path):
    write_corpus(tmp_path, "jsonl")
    assert len(load_pairs(local_cfg(tmp_path, max_examples=10))["train"].src) == 10
    (tmp_path / "train.jsonl").write_text('{"de": "ja", "en": "yes"}\n{"de": "", "en": "nothing"}\n')
    assert load_pairs(local_cfg(tmp_path))["train"].src == ["ja"]


def test_local_errors_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_pairs(local_cfg(tmp_path / "nowhere"))
    write_corpus(tmp_path, "jsonl")
    (tmp_path / "test.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"no file for the test split; expected one of test\{.jsonl"):
        load_pairs(local_cfg(tmp_path))
    write_corpus(tmp_path, "jsonl")
    with pytest.raises(ValueError, match=r"split 'train' has no \['fr'\] column; found \['de', 'en'\]"):
        load_pairs(TranslationDataConfig(name="local", source="local", src_lang="de", tgt_lang="fr", path=str(tmp_path)))
    with pytest.raises(ValueError, match="unknown data.source 'web'; valid: hub, local"):
        TranslationDataConfig(name="x", source="web", src_lang="de", tgt_lang="en")
    with pytest.raises(ValueError, match="data=local needs data.path"):
        TranslationDataConfig(name="local", source="local", src_lang="de", tgt_lang="en")


def test_bpe_round_trip_keeps_an_unseen_umlaut():
    tok = train_bpe([d for d, _ in corpus()] + [e for _, e in corpus()], vocab_size=300)
    assert [tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    text = "drei Bäume sind grün  und »gelb«!"  # ä, ü, guillemets never seen in training
    ids = tok.encode(text, add_special_tokens=False).ids
    assert UNK_ID not in ids  # spelled by its UTF-8 bytes instead
    assert detokenize(tok, [BOS_ID, *ids, EOS_ID, PAD_ID]) == text
    assert len(tok.encode("drei Hund ist rot .").ids) < len("drei Hund ist rot .")  # merges were learned


def test_bpe_is_cached_by_fingerprint(tmp_path):
    src, tgt = [d for d, _ in corpus()], [e for _, e in corpus()]
    joint_src, joint_tgt, path = cached_bpe(src, tgt, vocab_size=300, joint=True, cache_dir=tmp_path)
    assert joint_src is joint_tgt and path.is_file() and len(list(tmp_path.iterdir())) == 1
    mtime = path.stat().st_mtime_ns
    again, _, same_path = cached_bpe(src, tgt, vocab_size=300, joint=True, cache_dir=tmp_path)
    assert same_path == path and path.stat().st_mtime_ns == mtime and again.to_str() == joint_src.to_str()
    cached_bpe(src, tgt, vocab_size=320, joint=True, cache_dir=tmp_path)  # other settings: another entry
    cached_bpe(src[:-1], tgt, vocab_size=300, joint=True, cache_dir=tmp_path)  # other data: another entry
    s, t, _ = cached_bpe(src, tgt, vocab_size=300, joint=False, cache_dir=tmp_path)
    assert s.to_str() != t.to_str() and len(list(tmp_path.iterdir())) == 5
    with pytest.raises(ValueError, match="data.vocab_size=100 is invalid; it must be an integer >= 260"):
        train_bpe(src, vocab_size=100)


def test_bleu_of_a_reference_against_itself_is_100():
    refs = ["the dog is red .", "two houses are blue ."]
    assert bleu_chrf(refs, refs) == {"bleu": pytest.approx(100.0), "chrf": pytest.approx(100.0)}
    assert bleu_chrf(["a cat .", "nothing"], refs)["bleu"] < 10
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu_chrf(refs, refs[:1])


def test_hub_source_offline_without_cache_fails_with_one_message(tmp_path):
    code = (
        "from data.translation import TranslationDataConfig, load_pairs\n"
        "cfg = TranslationDataConfig(name='multi30k', source='hub', src_lang='de', tgt_lang='en',\n"
        "                            hub={'path': 'bentrevett/multi30k'})\n"
        "try:\n    load_pairs(cfg)\nexcept FileNotFoundError as e:\n    print('MESSAGE', e)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    message = proc.stdout
    assert (
        "MESSAGE data=multi30k: the Hugging Face dataset 'bentrevett/multi30k' is neither reachable nor in the cache" in message
    )
    assert "Run once on a machine with network access" in message and "data=local data.path=DIR" in message


def test_cli_hub_source_offline_prints_one_error_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HOME": str(tmp_path),
           "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}  # fmt: skip
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "data=multi30k", "model=tiny", "trainer=smoke", "logger=none",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("normlab: error: data=multi30k: the Hugging Face dataset") and "Traceback" not in proc.stderr


def translation_cfg(path, tmp_path, *overrides):
    return make_cfg("data=local", f"data.path={path}", f"data.cache_dir={tmp_path / 'bpe'}", "data.vocab_size=300",
                    "model.d_model=64", "model.d_ff=128", "trainer.max_steps=60", "trainer.eval_every=30",
                    "trainer.max_tokens=512", "optim.lr=3e-3", "schedule.warmup_steps=10", "telemetry.every=0",
                    *overrides)  # fmt: skip


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_training_on_a_local_corpus_lowers_the_loss_and_logs_bleu(tmp_path, capsys):
    write_corpus(tmp_path / "corpus", "tsv")
    run = tmp_path / "run"
    result = train_module.train(translation_cfg(tmp_path / "corpus", tmp_path, "decode.beam_size=3"), run)
    rows = read_metrics(run)
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert losses[-1] < losses[0] - 1.0
    bleu = [r["val/bleu"] for r in rows if "val/bleu" in r]
    assert len(bleu) == 2 and all(0 <= b <= 100 + 1e-9 for b in bleu) and [r for r in rows if "val/chrf" in r]
    assert set(result) == {"test/bleu", "test/chrf"} and result["test/chrf"] > 20
    out = capsys.readouterr().out
    assert "test BLEU (12 sentences)" in out and "joint BPE vocabulary of 300 tokens" in out
    ckpt = load_checkpoint(run / "checkpoint.pt")
    assert ckpt["task"] == "translation" and ckpt["vocab"]["src"] == ckpt["vocab"]["tgt"]
    assert ckpt["model_config"]["share_embeddings"] is True
    assert (run / "src_vocab.json").read_text() == (run / "tgt_vocab.json").read_text()
    # The predict script translates with the checkpoint's own vocabulary.
    command = [sys.executable, "-m", "scripts.predict", str(run / "checkpoint.pt"), "-", "--beam-size", "2"]
    proc = subprocess.run(command, input="zwei Hund ist rot .\ndrei Haus ist blau .\n", capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2


def test_separate_vocabularies_and_resume_take_the_checkpoint_vocabulary(tmp_path):
    write_corpus(tmp_path / "corpus", "jsonl", "nested")
    first = tmp_path / "first"
    train_module.train(translation_cfg(tmp_path / "corpus", tmp_path, "data.joint_vocab=false", "trainer.max_steps=30"), first)
    ckpt = load_checkpoint(first / "checkpoint.pt")
    assert ckpt["vocab"]["src"] != ckpt["vocab"]["tgt"] and ckpt["model_config"]["share_embeddings"] is False
    second = tmp_path / "second"
    train_module.train(translation_cfg(tmp_path / "corpus", tmp_path / "elsewhere", "data.joint_vocab=false",
                                       f"train.resume={first / 'checkpoint.pt'}"), second)  # fmt: skip
    assert (second / "src_vocab.json").read_text() == (first / "src_vocab.json").read_text()
    assert not (tmp_path / "elsewhere" / "bpe").exists()  # nothing trained on resume
    with pytest.raises(ValueError, match="the checkpoint is of task 'translation', this run of 'g2p'"):
        train_module.train(make_cfg("trainer.max_steps=30", f"train.resume={first / 'checkpoint.pt'}"), tmp_path / "third")


def test_data_max_len_drops_long_training_pairs_and_is_checked(tmp_path, capsys):
    write_corpus(tmp_path / "corpus", "jsonl")
    with pytest.raises(ValueError, match="data.max_len=100 is invalid; it must be <= model.max_len - 1 = 63"):
        train_module.train(translation_cfg(tmp_path / "corpus", tmp_path, "data.max_len=100"), tmp_path / "a")
    with pytest.raises(ValueError, match="data.max_len=1: every training pair has a side longer than that"):
        train_module.train(translation_cfg(tmp_path / "corpus", tmp_path, "data.max_len=1"), tmp_path / "b")
