"""Parallel corpora for translation: Hugging Face hub datasets or local files, as sentence pairs.

Two row layouts are read, found from the columns:
- nested, as WMT/IWSLT on the hub: ``{"translation": {"de": "...", "en": "..."}}``;
- flat, as Multi30k on the hub or a two-column TSV: ``{"de": "...", "en": "..."}``.

Sources (``data.source``):
- ``hub``: ``datasets.load_dataset(hub.path, hub.name, revision=hub.revision, data_dir=hub.data_dir)``,
  downloaded once into the Hugging Face cache (``$HF_HOME``); ``hub.splits`` maps normlab's
  train/valid/test to the dataset's split names.
- ``local``: ``data.path`` is a ``DatasetDict.save_to_disk`` directory, or a directory holding one
  file per split: ``train``, ``valid`` (or ``validation``, ``dev``) and ``test``, each ``.jsonl``,
  ``.json``, ``.tsv`` or ``.csv``; TSV/CSV files start with a header row naming the columns.
"""

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from datasets import Dataset, load_dataset, load_from_disk

from data.config import TranslationDataConfig

SPLITS = ("train", "valid", "test")
LOCAL_SPLIT_NAMES = {"train": ("train",), "valid": ("valid", "validation", "dev"), "test": ("test",)}
# TSV is read with quoting off: a '"' inside a sentence is text, not a field delimiter.
LOCAL_FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".tsv": ("csv", {"delimiter": "\t", "quoting": 3, "keep_default_na": False}),
    ".csv": ("csv", {"keep_default_na": False}),
}


@dataclass
class Pairs:
    """Sentence pairs of one split: ``src[i]`` translates to ``tgt[i]``."""

    src: list[str]
    tgt: list[str]


def load_pairs(cfg: TranslationDataConfig) -> dict[str, Pairs]:
    """Sentence pairs of train/valid/test; the training split capped at ``cfg.max_examples``
    and stripped of pairs with an empty side.

    Raises:
        FileNotFoundError: a hub dataset neither reachable nor cached; a missing local path or split file.
        ValueError: a split without the language columns (the message lists the columns found).
    """
    raw = _load_hub(cfg) if cfg.source == "hub" else _load_local(cfg)
    out = {}
    for split in SPLITS:
        ds = raw[split]
        if split == "train" and cfg.max_examples is not None:
            ds = ds.select(range(min(cfg.max_examples, len(ds))))
        out[split] = _pairs(ds, cfg, split)
    train = out["train"]
    keep = [i for i, (s, t) in enumerate(zip(train.src, train.tgt, strict=True)) if s.strip() and t.strip()]
    out["train"] = Pairs([train.src[i] for i in keep], [train.tgt[i] for i in keep])
    return out


def _pairs(ds: Dataset, cfg: TranslationDataConfig, split: str) -> Pairs:
    cols = ds.column_names
    if "translation" in cols:  # nested layout
        ds = ds.select_columns(["translation"]).flatten()
        cols = [c.removeprefix("translation.") for c in ds.column_names]
        names = {lang: f"translation.{lang}" for lang in (cfg.src_lang, cfg.tgt_lang)}
    else:
        names = {lang: lang for lang in (cfg.src_lang, cfg.tgt_lang)}
    missing = [lang for lang in (cfg.src_lang, cfg.tgt_lang) if lang not in cols]
    if missing:
        raise ValueError(
            f"data={cfg.name}: split {split!r} has no {missing} column; found {cols}. "
            "Set data.src_lang and data.tgt_lang to two of them"
        )
    src, tgt = ([x or "" for x in ds[names[lang]]] for lang in (cfg.src_lang, cfg.tgt_lang))
    return Pairs(src, tgt)


@contextmanager
def _offline_if_unreachable() -> Iterator[None]:
    """Use only the Hugging Face cache when the hub cannot be reached: without this, ``datasets``
    retries for ~25 s before failing (or before falling back to the cache)."""
    import datasets.config
    import huggingface_hub.constants

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=3).close()
        reachable = True
    except OSError:
        reachable = False
    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    if not reachable:
        datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def _load_hub(cfg: TranslationDataConfig) -> dict[str, Dataset]:
    hub = cfg.hub
    try:
        with _offline_if_unreachable():
            dd = load_dataset(hub.path, hub.name, revision=hub.revision, data_dir=hub.data_dir)
    except (ConnectionError, FileNotFoundError) as e:
        raise FileNotFoundError(
            f"data={cfg.name}: the Hugging Face dataset {hub.path!r} is neither reachable nor in the cache "
            f"({type(e).__name__}: {e}). Run once on a machine with network access (the download is cached "
            f"under $HF_HOME, default ~/.cache/huggingface), or train on local files: "
            f"data=local data.path=DIR (train/valid/test .jsonl/.tsv/.csv, or a save_to_disk directory)"
        ) from e
    splits = asdict(hub.splits)
    absent = [name for name in splits.values() if name not in dd]
    if absent:
        raise ValueError(
            f"data={cfg.name}: {hub.path!r} has no split {absent}; found {list(dd)}. Map train/valid/test with data.hub.splits"
        )
    return {split: dd[splits[split]] for split in SPLITS}


def _load_local(cfg: TranslationDataConfig) -> dict[str, Dataset]:
    assert cfg.path is not None  # source=local requires it (TranslationDataConfig)
    path = Path(cfg.path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"data.path={cfg.path!r} is not a directory; give a save_to_disk directory or a "
            "directory of train/valid/test .jsonl/.tsv/.csv files"
        )
    if (path / "dataset_dict.json").is_file():
        dd = load_from_disk(str(path))
        found = {}
        for split, names in LOCAL_SPLIT_NAMES.items():
            name = next((n for n in names if n in dd), None)
            if name is None:
                raise FileNotFoundError(
                    f"data.path={cfg.path!r}: the saved DatasetDict has no split named {' or '.join(names)}; found {list(dd)}"
                )
            found[split] = dd[name]
        return found
    found = {}
    for split, names in LOCAL_SPLIT_NAMES.items():
        files = [path / f"{n}{ext}" for n in names for ext in LOCAL_FORMATS if (path / f"{n}{ext}").is_file()]
        if len(files) != 1:
            wanted = ", ".join(f"{n}{{{','.join(LOCAL_FORMATS)}}}" for n in names)
            what = "no file" if not files else f"several files ({', '.join(f.name for f in files)})"
            raise FileNotFoundError(f"data.path={cfg.path!r}: {what} for the {split} split; expected one of {wanted}")
        builder, kwargs = LOCAL_FORMATS[files[0].suffix]
        found[split] = load_dataset(builder, data_files=str(files[0]), split="train", **kwargs)
    return found
