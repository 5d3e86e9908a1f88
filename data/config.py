"""The ``data`` keys of each data preset, typed (``conf/data/*.yaml``): CMUdict (``data/cmudict_g2p.py``
loads it) and a translation corpus (``data/translation.py``). Free of ``datasets`` and torch, so a run's
config validates before they load (``training.schema``)."""

from dataclasses import dataclass, field

SOURCES = ("hub", "local")


def check_cache_dir(value: str | None, default: str, alternative: str) -> None:
    """Refuse an empty ``data.cache_dir`` (``''`` or spaces): it reads as the current directory, where the
    cache would land unnoticed, so it is taken for a typo. ``alternative`` names what else is valid.

    Raises:
        ValueError: naming the key, the value and what is valid.
    """
    if value is not None and not value.strip():
        other = f", or {alternative}" if alternative else ""
        raise ValueError(f"data.cache_dir={value!r} is empty; give a directory (default {default}){other}")


@dataclass(frozen=True)
class CmudictDataConfig:
    """The ``data`` keys of CMUdict (``conf/data/cmudict.yaml``): ``task`` (``g2p``), ``keep_stress``
    keeps ARPAbet stress digits, ``cache_dir`` holds the parsed and encoded splits (``data/cache.py``;
    null: parse and encode in every process). ``train_fraction`` in (0, 1] trains on that fraction of the
    training words (every pronunciation of a chosen word), chosen by ``subset_seed`` (null: the run's ``seed``);
    the vocabularies, validation and test are those of the whole split (``training/tasks/g2p.py``).

    Raises:
        ValueError: ``train_fraction`` outside (0, 1]; an empty ``cache_dir`` (``''``).
    """

    name: str
    task: str
    keep_stress: bool
    cache_dir: str | None = "~/.cache/normlab/cmudict"
    train_fraction: float = 1.0
    subset_seed: int | None = None

    def __post_init__(self) -> None:
        check_cache_dir(self.cache_dir, "~/.cache/normlab/cmudict", "null to parse and encode in every process")
        if not 0 < self.train_fraction <= 1:
            raise ValueError(f"data.train_fraction={self.train_fraction}: a fraction of the training words in (0, 1]")


@dataclass(frozen=True)
class SplitNames:
    """The ``data.hub.splits`` keys: the dataset's split read as normlab's train, valid and test."""

    train: str = "train"
    valid: str = "valid"
    test: str = "test"


@dataclass(frozen=True)
class HubConfig:
    """The ``data.hub`` keys: ``datasets.load_dataset(path, name, revision=revision, data_dir=data_dir)``
    and the split names (``splits``, a ``SplitNames`` or a dict of its keys). Empty for ``source=local``."""

    path: str | None = None
    name: str | None = None
    revision: str | None = None
    data_dir: str | None = None
    splits: SplitNames = field(default_factory=SplitNames)

    def __post_init__(self) -> None:
        if isinstance(self.splits, dict):
            object.__setattr__(self, "splits", SplitNames(**self.splits))


@dataclass(frozen=True)
class TranslationDataConfig:
    """The ``data`` config keys of a translation corpus (``conf/data/*.yaml``).

    Attributes:
        name: preset name (``multi30k``, ``wmt14_de_en``, ``iwslt2017_de_en``, ``local``).
        task: ``translation`` (the ``data.task`` of every translation preset).
        source: ``hub`` or ``local``.
        src_lang, tgt_lang: column (flat) or key (nested) of each side, e.g. ``de`` and ``en``.
        hub: a ``HubConfig`` (or a dict of its keys) for ``source=hub``.
        path: the local directory (``source=local``).
        max_len: training pairs with a side longer than this many BPE tokens are dropped (null:
            ``model.max_len - 1``); valid and test are never filtered.
        max_examples: keep the first this many training pairs (null: all).
        vocab_size: BPE tokens (the joint vocabulary, or each of the two).
        joint_vocab: one BPE vocabulary (and embedding matrix) for both languages.
        cache_dir: where trained BPE vocabularies are cached.

    Raises:
        ValueError: an unknown source, equal languages, a missing path or hub path, a bad size, an empty
            ``cache_dir``.
    """

    name: str
    source: str
    src_lang: str
    tgt_lang: str
    hub: HubConfig = field(default_factory=HubConfig)
    path: str | None = None
    max_len: int | None = None
    max_examples: int | None = None
    vocab_size: int = 8000
    joint_vocab: bool = True
    cache_dir: str = "~/.cache/normlab/bpe"
    task: str = "translation"

    def __post_init__(self) -> None:
        if isinstance(self.hub, dict):
            object.__setattr__(self, "hub", HubConfig(**self.hub))
        check_cache_dir(self.cache_dir, "~/.cache/normlab/bpe", "")
        if self.source not in SOURCES:
            raise ValueError(f"unknown data.source {self.source!r}; valid: {', '.join(SOURCES)}")
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}; give two languages")
        if self.source == "local" and not self.path:
            raise ValueError(
                "data=local needs data.path: a save_to_disk directory or a directory of train/valid/test .jsonl/.tsv/.csv files"
            )
        if self.source == "hub" and not self.hub.path:
            raise ValueError(f"data={self.name}: data.hub.path is empty; give a Hugging Face dataset id")
        for key in ("max_len", "max_examples"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"data.{key}={value!r} is invalid; it must be null or an integer >= 1")
