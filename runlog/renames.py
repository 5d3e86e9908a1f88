"""Config keys that were renamed or added: the one-line error naming a renamed key's new name, and old
configs read with today's names and with each added key at the value that reproduces what they ran.

One name per setting: an old name is not an alias. A run that sets one (on the command line, in a
preset file) stops with ``trainer.eval_max_words was renamed to trainer.eval_max_examples``. Configs
saved before a rename (a checkpoint's ``config``, a run dir's ``config.yaml``) are read with the new
names, and a key added since is filled in with the value that behaves as the old code did
(:func:`with_current_names`), so resuming an old run and reporting old runs next to new ones work
unchanged. Plain data only (no torch, no Hydra): ``analysis/`` imports it.
"""

import copy
from typing import Any

RENAMED = {  # old dotted key -> new dotted key
    "trainer.eval_max_words": "trainer.eval_max_examples",
    "trainer.test_max_words": "trainer.test_max_examples",
    "norm.powernorm_warmup": "norm.knobs.powernorm.warmup_iters",  # a kind's own settings moved under norm.knobs
    "norm.powernorm_groups": "norm.knobs.powernorm.group_num",
}
ADDED = {  # dotted key added since the first release -> the value under which the old code ran
    "norm.mix_ln_alpha": 0.25,  # used by placement mix_ln only, which old runs could not select
    "optim.z_loss": 0.0,  # no z-loss
    "data.cache_dir": None,  # CMUdict parsed and encoded in every process (translation presets always had it)
    "norm.decoder_batch_stats": False,  # no batch-reading kind existed, so none sat in the decoder
    "norm.knobs.powernorm.warmup_iters": 10000,  # PowerNorm's official class defaults, which it built before
    "norm.knobs.powernorm.group_num": 1,
    "model.weight_norm": False,  # plain nn.Linear weights
    "norm.hc": None,  # the plain residual x + F(N(x)): no hyper-connections
    "model.residual_streams": 1,  # one residual stream
    "model.attn_gate": None,  # the attention-logit controls: none of them
    "model.attn_sink": False,
    "model.attn_softmax": "softmax",
    "model.attn_softcap": None,
    "model.final_softcap": None,
    "telemetry.attn_sink_mass": False,  # not recorded
    "telemetry.batch_stats": False,  # no bstat/ metrics were recorded
    "norm.gpas": False,  # no GPAS gate in any block
    "norm.gain": "plain",  # every gain was stored as itself
    "norm.qk_scope": "head",  # norm.qk acted per head
    "norm.alpha_init_attn": 0.5,  # DyT's alpha started at 0.5 at every site
    "norm.alpha_init_ffn": 0.5,
    "norm.alpha_init_final": 0.5,
    "norm.learned_embed_scale": False,  # the fixed sqrt(d_model) embedding factor
    "optim.decay_gains": False,  # weight decay on matrices only, never on a gain
    "optim.qk_clip": None,  # no QK-Clip
    "model.parametrization": "sp",  # the standard parametrization
    "model.base_d_model": None,
    "model.base_depth": None,
}


def renamed_message(key: str) -> str | None:
    """``<key> was renamed to <new key>`` for a renamed dotted ``key``, else None."""
    return f"{key} was renamed to {RENAMED[key]}" if key in RENAMED else None


def renamed_override(args: list[str]) -> str | None:
    """The rename message of the first command-line override in ``args`` that sets a renamed key
    (``trainer.eval_max_words=100``, also with ``+``/``++``/``~``), else None. Hydra would reject
    such an override itself (``Key 'eval_max_words' is not in struct``) without naming the new key."""
    for arg in args:
        if (message := renamed_message(arg.lstrip("+~").split("=", 1)[0])) is not None:
            return message
    return None


def with_current_names(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a nested dict, e.g. a checkpoint's resolved config, or its ``model_config`` whose ``norm`` is the
    same section) with each renamed key moved to its new name, in the ``norm`` section and in each ``norm.blocks``
    entry (a new key already present keeps its value: configs saved while both names existed held the same value
    under each), and each ``ADDED`` key that its section lacks set to its old value (the dicts on the way to a
    nested key are added). The input is not modified."""
    out = copy.deepcopy(config)
    norm = out.get("norm")
    blocks = norm.get("blocks") if isinstance(norm, dict) else None
    # A norm.blocks entry sets norm.* keys: it is read as a norm section of its own (moved in place), where None
    # means "keep the norm.* value" and is dropped.
    for tree in (out, *({"norm": entry} for entry in blocks or () if isinstance(entry, dict))):
        for old, new in RENAMED.items():
            parent, leaf = _parent(tree, old, create=False)
            if parent is not None and leaf in parent:
                value = parent.pop(leaf)
                if value is None and tree is not out:
                    continue
                new_parent, new_leaf = _parent(tree, new, create=True)
                assert new_parent is not None  # create=True adds every dict on the way
                new_parent.setdefault(new_leaf, value)
    for key, value in ADDED.items():
        section = key.split(".", 1)[0]
        parent, leaf = _parent(out, key, create=isinstance(out.get(section), dict))
        if parent is not None:  # a config without the section (a partial one) stays as it is
            parent.setdefault(leaf, value)
    return out


def _parent(tree: dict[str, Any], dotted: str, create: bool) -> tuple[dict[str, Any] | None, str]:
    """(the dict holding ``dotted``'s last part, that part); None when a dict on the way is missing
    and ``create`` is False (with ``create``, missing dicts are added)."""
    *path, leaf = dotted.split(".")
    for key in path:
        if not isinstance(tree.get(key), dict):
            if not create:
                return None, leaf
            tree[key] = {}
        tree = tree[key]
    return tree, leaf
