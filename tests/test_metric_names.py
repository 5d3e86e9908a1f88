"""runlog/metric_names.py: the one place telemetry metric names are formatted and parsed, and the depth order."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from runlog.metric_names import (
    ATTENTIONS,
    BATCH_STATISTICS,
    BLOCK_SITES,
    FAMILIES,
    FAMILY_STATS,
    RESIDUAL_NORM_SITES,
    SCALE_SITE_STATS,
    STACK_SITES,
    STACKS,
    STATS,
    WEIGHT_SITES,
    WEIGHT_STATS,
    Metric,
    act,
    act_stats,
    adam_below_eps,
    adam_rms,
    attn_max_logit,
    attn_stat,
    batch_stat_dist,
    blocks,
    depth,
    derive_stats,
    grad_norm,
    hc_gain,
    learned_scale,
    matrix_role,
    matrix_site,
    matrix_update,
    n_enc_layers_seen,
    output_logits,
    parse,
    qk_clip_stat,
    site_name,
    update_ratio,
    weight_spectrum,
)


def every_metric() -> list[Metric]:
    """Every valid metric of a model with blocks 0 and 11 in each stack."""
    metrics = [*(output_logits(stat) for stat in FAMILY_STATS["out"]), adam_below_eps(), qk_clip_stat("count")]
    metrics.append(qk_clip_stat("min_factor"))
    for stack in STACKS:
        metrics += [act(stack, None, site, stat) for site in STACK_SITES for stat in act_stats(site)]
        metrics += [batch_stat_dist(stack, None, "final_norm", s) for s in BATCH_STATISTICS]
        metrics += [hc_gain(stack, stat) for stat in FAMILY_STATS["hc"]]
        for layer in (0, 11):
            metrics += [act(stack, layer, site, stat) for site in BLOCK_SITES for stat in act_stats(site)]
            metrics += [grad_norm(stack, layer), update_ratio(stack, layer), adam_rms(stack, layer)]
            metrics += [attn_stat(stack, layer, a, "entropy") for a in ATTENTIONS]
            metrics += [weight_spectrum(stack, layer, m, stat) for m in WEIGHT_SITES for stat in WEIGHT_STATS]
            metrics += [learned_scale(stack, layer, site, stat) for site, stats in SCALE_SITE_STATS.items() for stat in stats]
            metrics += [attn_max_logit(stack, layer, a, head) for a in ATTENTIONS for head in (None, 0, 3, 10)]
            metrics += [matrix_update(stack, layer, m, stat) for m in WEIGHT_SITES for stat in ("rms", "ratio")]
            metrics += [batch_stat_dist(stack, layer, site, s) for site in RESIDUAL_NORM_SITES for s in BATCH_STATISTICS]
    return metrics


def test_names_are_the_documented_strings():
    assert act("enc", None, "embed", "rms").name == "act/enc.embed/rms"
    assert act("dec", None, "final_norm", "crest").name == "act/dec.final_norm/crest"
    assert act("enc", 0, "in", "mean").name == "act/enc.0.in/mean"
    assert act("dec", 2, "cross_attn", "maxabs").name == "act/dec.2.cross_attn/maxabs"
    assert act("dec", 1, "ffn.norm_branch", "rms").name == "act/dec.1.ffn.norm_branch/rms"
    assert act("dec", 1, "cross_attn.k_norm", "rms").name == "act/dec.1.cross_attn.k_norm/rms"
    assert grad_norm("enc", 3).name == "grad/enc.3/norm"
    assert update_ratio("dec", 0).name == "update/dec.0/ratio"
    assert adam_rms("enc", 2).name == "update/enc.2/adam_rms"
    assert adam_below_eps().name == "optim/below_eps" and adam_below_eps().block is None
    assert attn_stat("dec", 1, "self_attn", "entropy").name == "attn/dec.1.self_attn/entropy"
    assert weight_spectrum("dec", 1, "cross_attn.v", "sigma_max").name == "weight/dec.1.cross_attn.v/sigma_max"
    assert weight_spectrum("enc", 0, "ffn.in", "stable_rank").name == "weight/enc.0.ffn.in/stable_rank"
    assert learned_scale("enc", 0, "ffn.norm_in", "gain_mean").name == "scale/enc.0.ffn.norm_in/gain_mean"
    assert learned_scale("enc", 1, "ffn.gate", "alpha").name == "scale/enc.1.ffn.gate/alpha"
    assert learned_scale("dec", 0, "self_attn", "temperature").name == "scale/dec.0.self_attn/temperature"
    assert attn_max_logit("enc", 0, "self_attn").name == "attn/enc.0.self_attn/max_logit"
    assert attn_max_logit("dec", 1, "cross_attn", 3).name == "attn/dec.1.cross_attn.h3/max_logit"
    assert attn_max_logit("dec", 1, "cross_attn", 3).where == "dec.1.cross_attn.h3"
    assert matrix_update("enc", 1, "self_attn.q", "rms").name == "update/enc.1.self_attn.q/rms"
    assert matrix_update("dec", 0, "ffn.out", "ratio").name == "update/dec.0.ffn.out/ratio"
    assert output_logits("logz").name == "out/logz" and output_logits("max_logit").name == "out/max_logit"
    assert site_name("enc", 0, "ffn.norm_in") == "enc.0.ffn.norm_in" and site_name("dec", None, "final_norm") == "dec.final_norm"
    assert act("dec", 1, "cross_attn.k_norm", "rms").where == "dec.1.cross_attn.k_norm" and output_logits("logz").where is None
    with pytest.raises(ValueError, match="unknown metric site 'ffn.norm_mid'"):
        site_name("enc", 0, "ffn.norm_mid")
    assert output_logits("logz").block is None
    assert grad_norm("enc", 3).block == "enc.3" and act("enc", None, "embed", "rms").block is None
    assert batch_stat_dist("enc", 1, "ffn.norm_in", "mean").name == "bstat/enc.1.ffn.norm_in/mean_dist"
    assert batch_stat_dist("dec", 0, "cross_attn.norm_out", "var").name == "bstat/dec.0.cross_attn.norm_out/var_dist"
    assert batch_stat_dist("enc", None, "final_norm", "phi").name == "bstat/enc.final_norm/phi_dist"
    assert hc_gain("dec", "fwd_gain").name == "hc/dec/fwd_gain" and hc_gain("enc", "bwd_gain").block is None


def test_every_name_of_every_family_parses_back_to_its_metric():
    metrics = every_metric()
    assert {m.family for m in metrics} == set(FAMILY_STATS)
    assert len({m.name for m in metrics}) == len(metrics)  # no two metrics share a name
    for m in metrics:
        assert parse(m.name) == m, m.name


@pytest.mark.parametrize(
    "name",
    [
        "train/loss",
        "act/rms_vs_depth",  # the wandb depth chart
        "act/enc.0.outt/rms",  # unknown site
        "act/enc.0.out/kurt",  # unknown stat
        "act/mid.0.out/rms",  # unknown stack
        "act/enc.out/rms",  # a block site without a block
        "act/enc.0.embed/rms",  # a stack site with a block
        "act/enc.01.out/rms",  # not how a layer is written
        "act/enc.0.ffn.q_norm/rms",  # q/k/v norms live in attentions only
        "grad/enc/norm",
        "grad/enc.0/ratio",
        "update/enc.0.out/ratio",
        "attn/enc.0.ffn/entropy",
        "wait/enc.0/norm",  # unknown family
        "weight/enc.0/sigma_max",  # a weight metric names its matrix
        "weight/enc.0.ffn.q/sigma_max",  # no such matrix
        "weight/enc.0.self_attn.q/entropy",
        "scale/enc.0.ffn/temperature",  # only an attention has a temperature
        "scale/enc.0.self_attn/gain_mean",  # an attention's only scale is its temperature
        "scale/enc.0.ffn.gate/beta",  # beta is DyISRU's, a norm's
        "scale/enc.0.ffn.norm_in/rms",
        "act/enc.0.out/rms/extra",
        "act/rms",  # a stack family without its stack
        "grad/norm",
        "out/enc/logz",  # the stack-less family with a stack
        "out/enc.0.self_attn/max_logit",
        "out/entropy",  # not a stat of out
        "out/",
        "train/z_loss",
        "optim/lr",  # the trainer's own optim/ metrics are not telemetry
        "optim/grad_norm",
        "optim/enc.0/below_eps",  # below_eps is the whole optimizer's
        "update/enc.0.ffn/adam_rms",
        "update/enc.0.ffn.in/adam_rms",  # Adam's RMS is a block's; a matrix has rms and ratio
        "update/enc.0/rms",
        "attn/enc.0.self_attn.h01/max_logit",  # not how a head is written
        "attn/enc.0.self_attn.h1/entropy",  # only the max logit is per head
        "attn/enc.0.h1/max_logit",  # a head belongs to an attention
        "act/enc.0.out.h1/rms",
        "act/enc.0.in/token_cos",  # token_cos: block outputs only
        "act/enc.embed/saturation",  # saturation: norm sites only
        "act/dec.1.ffn/saturation",
        "bstat/enc.0.ffn/mean_dist",  # bstat: norm slots and final norms only
        "bstat/enc.0.final_norm/var_dist",
        "bstat/enc.embed/mean_dist",
        "bstat/enc.ffn.norm_in/mean_dist",
        "bstat/enc.0.self_attn.q_norm/mean_dist",  # per-head norms are token-wise
        "bstat/enc.0.ffn.norm_in/mean",
        "bstat/dec.final_norm/rms",
    ],
)
def test_a_bad_name_parses_to_none(name):
    assert parse(name) is None


def test_a_bad_metric_is_a_one_line_error_naming_the_field():
    with pytest.raises(ValueError, match="unknown metric stat 'kurt'; valid: rms, mean, maxabs, crest, kurtosis, token_cos, "):
        act("enc", 0, "out", "kurt")
    with pytest.raises(ValueError, match="unknown metric site of token_cos 'in'; valid: out$"):
        act("enc", 0, "in", "token_cos")
    with pytest.raises(ValueError, match="unknown metric stack 'mid'; valid: enc, dec"):
        grad_norm("mid", 0)
    with pytest.raises(ValueError, match="unknown metric site 'out'; valid: embed, final_norm"):
        act("enc", None, "out", "rms")
    with pytest.raises(ValueError, match="unknown metric stat at ffn.gate 'beta'; valid: gain_mean, gain_max, alpha"):
        learned_scale("enc", 0, "ffn.gate", "beta")
    with pytest.raises(ValueError, match="unknown metric site 'ffn.q'; valid: self_attn.q, "):
        weight_spectrum("enc", 0, "ffn.q", "sigma_max")
    with pytest.raises(ValueError, match="layer must be an integer >= 0"):
        Metric("grad", "enc", -1, stat="norm")
    with pytest.raises(ValueError, match="a metric head must be an integer >= 0 of an attn max_logit, got 0 for entropy"):
        Metric("attn", "enc", 0, "self_attn", "entropy", 0)
    with pytest.raises(ValueError, match="metric head must be an integer >= 0 of an attn max_logit, got -1 for max_logit"):
        attn_max_logit("enc", 0, "self_attn", -1)
    with pytest.raises(ValueError, match="unknown metric stat at ffn.in 'adam_rms'; valid: rms, ratio$"):
        matrix_update("enc", 0, "ffn.in", "adam_rms")
    with pytest.raises(ValueError, match="unknown metric stat 'entropy'; valid: logz, max_logit"):
        output_logits("entropy")
    with pytest.raises(ValueError, match="unknown metric stack 'dec'; valid: None"):
        Metric("out", "dec", stat="logz")
    with pytest.raises(ValueError, match="unknown metric stack None; valid: enc, dec"):
        Metric("attn", None, 0, "self_attn", "max_logit")
    with pytest.raises(ValueError, match="unknown metric stat 'lr'; valid: below_eps"):
        Metric("optim", None, stat="lr")
    with pytest.raises(ValueError, match="unknown metric batch statistic 'std'; valid: mean, var, phi$"):
        batch_stat_dist("enc", 0, "ffn.norm_in", "std")
    with pytest.raises(ValueError, match="unknown metric site 'embed'; valid: final_norm$"):
        batch_stat_dist("enc", None, "embed", "mean")


def test_every_stat_is_derived_from_the_raw_sums():
    # x = (1, 3, -2, 2): sum x^2 = 18, sum x = 4, max |x| = 3, n = 4 -> rms = sqrt(18 / 4), mean = 1
    pooled = {"sumsq": 18.0, "sum": 4.0, "maxabs": 3.0, "n": 4.0}
    derived = derive_stats(pooled)
    assert derived == pytest.approx({"rms": 4.5**0.5, "mean": 1.0, "maxabs": 3.0, "crest": 3.0 / 4.5**0.5})
    assert derive_stats({"sumsq": 0.0, "sum": 0.0, "maxabs": 0.0, "n": 4.0})["crest"] == 0.0
    # as 2 tokens x 2 channels, (1, 3) and (-2, 2): s^2 = (5/2, 13/2), mean s^2 = 9/2, mean s^4 = 97/4;
    # 2 sequences' mean pairwise cosines 0.5 and 0.25; 1 of the 4 elements saturated; |x| = (1, 2, 2, 3): the lower
    # median 2, so massive = 3 / 2.
    extra = {"chan_m2": 4.5, "chan_m4": 24.25, "cos_sum": 0.75, "cos_seqs": 2.0, "saturated": 1.0, "median_abs": 2.0}
    derived = derive_stats(pooled | extra)
    assert list(derived) == list(STATS)
    assert derived["kurtosis"] == pytest.approx(24.25 / 4.5**2)
    assert derived["token_cos"] == pytest.approx(0.375) and derived["saturation"] == 0.25 and derived["massive"] == 1.5
    assert "token_cos" not in derive_stats(pooled | extra | {"cos_sum": 0.0, "cos_seqs": 0.0})  # no sequence of 2 tokens
    assert "massive" not in derive_stats(pooled | extra | {"median_abs": 0.0})  # half the elements 0: no ratio


def test_depth_order_is_encoder_blocks_then_decoder_blocks():
    assert list(blocks(2, 3)) == [("enc", 0), ("enc", 1), ("dec", 0), ("dec", 1), ("dec", 2)]
    assert [depth(s, i, 2) for s, i in blocks(2, 3)] == [0, 1, 2, 3, 4]
    assert n_enc_layers_seen([("dec", 5), ("enc", 0), ("enc", 2)]) == 3
    assert n_enc_layers_seen([("dec", 1)]) == 0
    with pytest.raises(ValueError, match="unknown metric stack 'mid'"):
        depth("mid", 0, 2)


def test_names_import_without_torch():
    # The report and the workspace script read metric names; they should not pay for importing torch.
    code = "import sys, runlog.metric_names, analysis.load, scripts.report; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def code_strings(path: Path) -> list[str]:
    """The string literals of a Python file, f-string pieces included, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


# Prefixes telemetry shares with the trainer's own metrics (training/window.py logs optim/lr, optim/grad_norm, ...).
SHARED_PREFIXES = ("optim/",)


def builds_a_metric_name(text: str) -> bool:
    """Whether a string literal is (a piece of) a telemetry name: it starts with a family's prefix; under a
    prefix shared with the trainer, it is that prefix alone (an f-string's head) or parses as a telemetry name."""
    if text.startswith(SHARED_PREFIXES):
        return text in SHARED_PREFIXES or parse(text) is not None
    return text.startswith(tuple(f"{family}/" for family in FAMILIES))


def test_the_name_check_tells_telemetry_from_the_trainers_metrics():
    assert [builds_a_metric_name(t) for t in ("act/", "out/logz", "optim/", "optim/below_eps")] == [True] * 4
    assert not any(builds_a_metric_name(t) for t in ("optim/lr", "optim/grad_norm_clipped", "train/loss"))


def test_no_other_source_file_builds_or_parses_a_metric_name():
    root = Path(__file__).resolve().parents[1]
    sources = [
        root / "train.py",
        *(p for d in ("model", "training", "analysis", "scripts", "data") for p in (root / d).rglob("*.py")),
    ]
    offenders = {
        f"{path.relative_to(root)}: {text!r}"
        for path in sources
        if path.name != "metric_names.py"
        for text in code_strings(path)
        if builds_a_metric_name(text)
    }
    assert not offenders


def test_matrix_role_inverts_matrix_site():
    assert matrix_role("cross_attn.q") == ("cross_attn", "attn.q") and matrix_role("ffn.out") == ("ffn", "ffn.out")
    assert all(matrix_site(*matrix_role(site)) == site for site in WEIGHT_SITES)
    with pytest.raises(ValueError, match=r"unknown metric matrix site 'ffn.q'; valid: self_attn.q, "):
        matrix_role("ffn.q")
