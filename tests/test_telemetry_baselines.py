"""Every telemetry statistic on Gaussian input equals the baseline docs/telemetry.md states for it,
measured through the real hooks (Telemetry.watch, the parameters' record_grad_norms, the optimizer's watch_update)."""

import math
import re
from fractions import Fraction

import pytest
import torch

from model.config import ModelConfig, NormConfig
from model.transformer import EncoderDecoder
from runlog.metric_names import attn_max_logit, parse
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.telemetry import doc_table
from training.optim import build_optimizer
from training.presets import default_optim

GAMMA = 0.5772156649015329  # Euler-Mascheroni constant: the mean of a standard Gumbel variable


def max_abs_moments(n: int, h: float = 1e-3, upper: float = 10.0) -> tuple[float, float]:
    """Mean and sd of max |z| over n i.i.d. N(0, 1): E[M^k] = int_0^inf k t^(k-1) (1 - erf(t/sqrt 2)^n) dt,
    by Simpson's rule (the integrand is ~1e-22 beyond t = 10 for n <= 1e7)."""
    m = int(upper / h)
    e1 = e2 = 0.0
    for i in range(m + 1):
        t = i * h
        tail = 1.0 - math.exp(n * math.log1p(-math.erfc(t / math.sqrt(2)))) if t else 1.0
        w = 1 if i in (0, m) else 4 if i % 2 else 2
        e1 += w * tail
        e2 += w * 2 * t * tail
    e1, e2 = e1 * h / 3, e2 * h / 3
    return e1, math.sqrt(e2 - e1 * e1)


def make(d: int, heads: int = 1, d_ff: int = 8, seed: int = 0, max_len: int = 64, kind: str = "layernorm") -> EncoderDecoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(src_vocab=30, tgt_vocab=30, d_model=d, n_heads=heads, d_ff=d_ff, n_enc_layers=1, n_dec_layers=1,
                      max_len=max_len, dropout=0.0, norm=NormConfig(kind=kind, placement="pre"))  # fmt: skip
    return EncoderDecoder(cfg).eval()


def site_stats(model: EncoderDecoder, x: torch.Tensor, pad: torch.Tensor, site: str = "in") -> dict[str, float]:
    """The stats of ``x`` (B, L, D) at ``act/enc.0.{site}``, ``pad`` (B, L) True at padding: ``in`` (block 0's
    input), ``out`` (x replaces block 0's output) or ``self_attn.norm_in`` (pre-LN: the norm reads x)."""
    block = model.encoder[0]
    replace = [block.register_forward_hook(lambda m, a, o: x)] if site == "out" else []  # before telemetry's hook
    group = "norm" if "norm" in site else site
    tele = Telemetry(model, TelemetryConfig(every=1, sites=(group,), grads=False, weights=False, scales=False))
    with tele.watch(pad, pad), torch.no_grad():
        block(x, pad)
    for h in replace:
        h.remove()
    prefix = f"act/enc.0.{site}/"
    return {k.removeprefix(prefix): v for k, v in tele.collect().items() if k.startswith(prefix)}


def gaussian_batch(tokens: int, d: int, sigma: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L, D) N(0, sigma^2) activations holding ``tokens`` real positions in rows of 32 (the last row
    part-filled, as a batch of uneven lengths), with 1e4 at the padding positions, which must not count."""
    rows, L = -(-tokens // 32), 32
    pad = (torch.arange(rows * L) >= tokens).view(rows, L)
    x = sigma * torch.randn(rows, L, d, generator=gen)
    x[pad] = 1e4
    return x, pad


def test_docs_max_table_is_the_exact_expectation_and_the_gumbel_approximation_holds():
    rows = doc_table("tokens")
    assert len(rows) >= 5
    for tokens, d, n, mean, sd, gumbel, crude in ([c.replace(",", "") for c in r] for r in rows):
        n = int(n)
        assert n == int(tokens) * int(d)
        exact_mean, exact_sd = max_abs_moments(n)
        assert float(mean) == pytest.approx(exact_mean, abs=0.005)
        assert float(sd) == pytest.approx(exact_sd, abs=0.005)
        # Gumbel: b = the (1 - 1/(2n)) quantile of |z|, a = n * density of |z| at b; E ~ b + gamma / a.
        b = -torch.special.ndtri(torch.tensor(1 / (2 * n), dtype=torch.float64)).item()
        a = 2 * n * math.exp(-b * b / 2) / math.sqrt(2 * math.pi)
        assert float(gumbel) == pytest.approx(b + GAMMA / a, abs=0.005)
        assert abs(b + GAMMA / a - exact_mean) < 0.02
        assert float(crude) == pytest.approx(math.sqrt(2 * math.log(n)), abs=0.005)
        assert 0.255 <= math.sqrt(2 * math.log(n)) - exact_mean < 0.275  # docs: "0.26-0.27 too high here"


def test_module_docstring_quotes_the_docs_table():
    import telemetry.activations

    table = {(int(r[0]), int(r[1])): r[3] for r in doc_table("tokens")}
    quoted = re.findall(r"(\d\.\d\d) at (?:n = )?(\d+) x (\d+)", " ".join(telemetry.activations.__doc__.split()))
    assert len(quoted) == 2
    for value, tokens, d in quoted:
        assert table[(int(tokens), int(d))] == value


@pytest.mark.parametrize("tokens,d,draws", [(64, 128, 40), (512, 128, 20), (3000, 512, 6)])
def test_activation_stats_of_gaussian_input_match_the_docs(tokens, d, draws):
    sigma, n = 0.7, tokens * d
    model, gen = make(d), torch.Generator().manual_seed(tokens)
    stats = [site_stats(model, *gaussian_batch(tokens, d, sigma, gen)) for _ in range(draws)]
    rms, mean, maxabs, crest = (torch.tensor([s[k] for s in stats]).double() for k in ("rms", "mean", "maxabs", "crest"))
    # rms = sigma (1 +- 1/sqrt(2n)) and mean = 0 +- sigma/sqrt(n): every draw within 4 sd.
    assert ((rms / sigma - 1).abs() < 4 / math.sqrt(2 * n)).all()
    assert ((mean / sigma).abs() < 4 / math.sqrt(n)).all()
    # maxabs / sigma and crest: the documented mean, within 3 standard errors of the mean of the draws.
    expected, sd = max_abs_moments(n)
    table = {(int(r[0]), int(r[1])): float(r[3]) for r in doc_table("tokens")}
    assert table[(tokens, d)] == pytest.approx(expected, abs=0.005)
    assert (maxabs / sigma).mean().item() == pytest.approx(expected, abs=3 * sd / math.sqrt(draws))
    assert crest.mean().item() == pytest.approx(expected, abs=3 * sd / math.sqrt(draws) + 0.01)
    assert torch.allclose(crest, maxabs / rms, rtol=1e-6)
    # kurtosis: the documented Dirichlet mean D (N + 2) / (D N + 2), within 3 standard errors.
    kurtosis = torch.tensor([s["kurtosis"] for s in stats]).double()
    k_mean, k_sd = doc_kurtosis()[(tokens, d)]
    assert kurtosis.mean().item() == pytest.approx(k_mean, abs=3 * k_sd / math.sqrt(draws))
    if draws >= 20:  # enough draws to check the spreads: sd of mean = sigma/sqrt(n), sd of maxabs as documented
        assert (mean * math.sqrt(n) / sigma).pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=0.4)
        assert (maxabs / sigma).std().item() == pytest.approx(sd, rel=0.4)
        assert kurtosis.std().item() == pytest.approx(k_sd, rel=0.4)


def kurtosis_moments(N: int, D: int) -> tuple[float, float]:
    """Mean and sd of kurtosis = D sum_j p_j^2 for Gaussian x: p = the shares s_j^2 / sum s^2 are
    Dirichlet(a, ..., a), a = N/2, A = D a, with E[p_j^2] = a(a+1) / (A(A+1)), E[p_j^4] =
    a(a+1)(a+2)(a+3) / (A(A+1)(A+2)(A+3)) and E[p_i^2 p_j^2] = a^2 (a+1)^2 / (A(A+1)(A+2)(A+3)), i != j."""
    a = Fraction(N, 2)
    A = D * a
    rising = A * (A + 1) * (A + 2) * (A + 3)
    mean = D * D * a * (a + 1) / (A * (A + 1))
    second = D * D * (D * a * (a + 1) * (a + 2) * (a + 3) + D * (D - 1) * a * a * (a + 1) ** 2) / rising
    return float(mean), math.sqrt(float(second - mean * mean))


def doc_kurtosis() -> dict[tuple[int, int], tuple[float, float]]:
    """The docs' kurtosis table: (N, D) -> (E[kurtosis], sd)."""
    return {(int(r[0]), int(r[1])): (float(r[2]), float(r[3])) for r in doc_table("real tokens N")}


def test_docs_kurtosis_table_is_the_exact_dirichlet_mean_and_sd():
    table = doc_kurtosis()
    assert len(table) >= 4
    for (N, D), (mean, sd) in table.items():
        exact_mean, exact_sd = kurtosis_moments(N, D)
        assert exact_mean == pytest.approx(D * (N + 2) / (D * N + 2), rel=1e-12)  # the closed form the docs give
        assert mean == pytest.approx(exact_mean, abs=5e-6)
        assert sd == pytest.approx(exact_sd, rel=5e-3)
        assert sd == pytest.approx(2 / N * math.sqrt(2 / D), rel=0.1)  # docs: "about (2/N) sqrt(2/D)"


def test_kurtosis_of_one_outlier_channel_among_gaussian_ones_stands_out():
    # 63 channels of N(0, 1) and one at 8x their RMS: kurtosis ~ D (8^4 + 63) / (8^2 + 63)^2 = 16.5, far above 1 + 2/N.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 32, 64, generator=gen)
    x[..., 5] *= 8
    kurtosis = site_stats(make(64), x, torch.zeros(4, 32, dtype=torch.bool))["kurtosis"]
    assert kurtosis == pytest.approx(64 * (8**4 + 63) / (8**2 + 63) ** 2, rel=0.15)


def test_gaussian_token_cos_is_0_with_the_documented_spread():
    # docs: c_b of n i.i.d. Gaussian tokens has mean 0 and sd sqrt(2 / (n (n - 1) D)); over B sequences / sqrt(B).
    n, d, rows, draws = 16, 64, 8, 200
    assert math.sqrt(2 / (n * (n - 1) * d)) == pytest.approx(0.0114, abs=5e-5)  # the docs' example
    assert math.sqrt(2 / (n * (n - 1) * d * rows)) == pytest.approx(0.0040, abs=5e-5)
    model, gen = make(d), torch.Generator().manual_seed(0)
    values = []
    for _ in range(draws):
        x = 0.7 * torch.randn(rows, n + 3, d, generator=gen)
        pad = torch.arange(n + 3)[None, :] >= torch.tensor([n] * (rows - 1) + [1])[:, None]  # last row: 1 token, no pair
        x[pad] = 1e4
        values.append(site_stats(model, x, pad, "out")["token_cos"])
    v = torch.tensor(values).double()
    sd = math.sqrt(2 / (n * (n - 1) * d * (rows - 1)))
    assert v.mean().item() == pytest.approx(0.0, abs=3 * sd / math.sqrt(draws))
    assert v.std().item() == pytest.approx(sd, rel=0.15)


def saturation_rows() -> list[tuple[str, float, float, float]]:
    """The docs' saturation table: (norm, the setting's value alpha sigma or beta / sigma^2, t, saturation)."""
    rows = []
    for norm, setting, t, share in doc_table("norm"):
        rows.append((norm, float(setting.split("= ")[1].split()[0]), float(t), float(share)))
    return rows


def test_gaussian_saturation_matches_the_docs():
    rows = saturation_rows()
    assert {r[0] for r in rows} == {"DyT", "Derf", "DyISRU"}
    gen = torch.Generator().manual_seed(0)
    sigma, tokens, d = 0.5, 2048, 64
    for norm, setting, t, share in rows:
        exact_t = {
            "DyT": math.atanh(0.99) / setting,
            "Derf": torch.erfinv(torch.tensor(0.99, dtype=torch.float64)).item() / setting,  # shift 0, its init
            "DyISRU": 0.99 * math.sqrt(setting / (1 - 0.99**2)),
        }[norm]
        assert t == pytest.approx(exact_t, abs=5e-3)
        assert share == pytest.approx(math.erfc(exact_t / math.sqrt(2)), rel=5e-3, abs=1e-300)
        model = make(d, kind=norm.lower())
        with torch.no_grad():  # alpha sigma = setting, or beta / sigma^2 = setting
            norm_in = model.encoder[0].self_attn.norm_in
            if norm == "DyISRU":
                norm_in.beta.fill_(setting * sigma**2)
            else:
                norm_in.alpha.fill_(setting / sigma)
        x, pad = gaussian_batch(tokens, d, sigma, gen)
        got = site_stats(model, x, pad, "self_attn.norm_in")["saturation"]
        se = math.sqrt(share * (1 - share) / (tokens * d))  # binomial
        assert got == pytest.approx(share, abs=4 * se + 1e-6), (norm, setting)


def test_rms_is_pooled_so_one_high_norm_token_dominates():
    # docs: 63 tokens of N(0, 1) and one at 8x their RMS give rms ~ sqrt((63 + 64) / 64) = 1.41.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, 128, generator=gen)
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()  # every token at RMS exactly 1
    x[0, 5] *= 8
    stats = site_stats(make(128), x, torch.zeros(1, 64, dtype=torch.bool))
    assert stats["rms"] == pytest.approx(math.sqrt((63 + 64) / 64), rel=1e-6)  # float32 statistics
    assert stats["maxabs"] > 8 * 2  # the outlier token's largest element


def entropies(model: EncoderDecoder, src_len: list[int], tgt_len: list[int], gaussian: bool = False) -> dict[str, float]:
    """``attn/.../entropy`` of one forward pass; ``gaussian`` replaces every q and k by i.i.d. N(0, 1) entries."""
    S, T = max(src_len), max(tgt_len)
    src_pad = torch.arange(S)[None, :] >= torch.tensor(src_len)[:, None]  # (B, S)
    tgt_pad = torch.arange(T)[None, :] >= torch.tensor(tgt_len)[:, None]  # (B, T)
    src = torch.randint(4, 30, src_pad.shape).masked_fill(src_pad, 0)
    tgt = torch.randint(4, 30, tgt_pad.shape).masked_fill(tgt_pad, 0)
    handles = []
    if gaussian:  # registered before Telemetry's own hooks, so they see (and attention uses) the replaced q and k
        for attn in (m for m in model.modules() if hasattr(m, "q_tap")):
            handles += [t.register_forward_hook(lambda mod, args, out: torch.randn_like(out)) for t in (attn.q_tap, attn.k_tap)]
    tele = Telemetry(model, TelemetryConfig(every=1, sites=(), grads=False, attn_entropy=True))
    with tele.watch(src_pad, tgt_pad), torch.no_grad():
        model(src, tgt)
    for h in handles:
        h.remove()
    return tele.collect()


def test_uniform_attention_has_entropy_log_of_the_visible_keys():
    model = make(32, heads=4)
    for attn in (m for m in model.modules() if hasattr(m, "q_tap")):
        torch.nn.init.zeros_(attn.q_proj.weight)  # q = 0: every score 0, every visible key weighted alike
        torch.nn.init.zeros_(attn.q_proj.bias)
    src_len, tgt_len = [9, 5, 7], [6, 3, 6]
    ent = entropies(model, src_len, tgt_len)
    per_query = lambda keys: sum(keys) / len(keys)  # noqa: E731 - the metric's mean over non-padding queries
    enc = per_query([math.log(s) for s in src_len for _ in range(s)])
    cross = per_query([math.log(s) for s, t in zip(src_len, tgt_len, strict=True) for _ in range(t)])
    causal = per_query([math.log(i + 1) for t in tgt_len for i in range(t)])  # query i sees keys 0..i
    assert ent["attn/enc.0.self_attn/entropy"] == pytest.approx(enc, rel=1e-5)
    assert ent["attn/dec.0.cross_attn/entropy"] == pytest.approx(cross, rel=1e-5)
    assert ent["attn/dec.0.self_attn/entropy"] == pytest.approx(causal, rel=1e-5)


def test_gaussian_query_key_entropy_matches_the_docs():
    # docs table: E[entropy] - ln S for q, k of i.i.d. N(0, 1) entries (scores of variance 1).
    table = {int(r[0]): float(r[1]) for r in doc_table("keys S")}
    assert table[max(table)] > -0.5  # approaches -1/2 from above as S grows
    model = make(128, heads=4, max_len=max(table))  # head size 32
    torch.manual_seed(0)
    for S, gap in table.items():
        rows = max(16, 8192 // S)  # ~8k queries (x 4 heads) per size: standard error < 0.005
        ent = entropies(model, [S] * rows, [2] * rows, gaussian=True)["attn/enc.0.self_attn/entropy"]
        assert ent - math.log(S) == pytest.approx(gap, abs=0.02), S


def test_grad_norm_of_gaussian_gradients_is_sigma_sqrt_p():
    model, sigma = make(64), 0.3
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = sigma * torch.randn(p.shape, generator=gen)
    tele = Telemetry(model, TelemetryConfig(every=1))
    tele.parameters.record_grad_norms()
    stats = tele.collect()
    for name, block in (("enc.0", model.encoder[0]), ("dec.0", model.decoder[0])):
        P = sum(p.numel() for p in block.parameters())
        assert stats[f"grad/{name}/norm"] == pytest.approx(sigma * math.sqrt(P), rel=4 / math.sqrt(2 * P))


def first_adamw_ratio(model: EncoderDecoder, lr: float, grad_scale: float) -> float:
    """``update/enc.0/ratio`` of one step of the project's AdamW (conf/optim/adamw.yaml) with N(0, grad_scale^2) gradients."""
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = grad_scale * torch.randn(p.shape, generator=gen)
    opt = build_optimizer(model, default_optim(lr=lr))
    tele = Telemetry(model, TelemetryConfig(every=1, updates=True))
    with tele.optimizer.watch_update():
        opt.step()
    return tele.collect()["update/enc.0/ratio"]


def test_first_adamw_update_ratio_is_lr_over_weight_rms():
    # docs: at the first AdamW step every element with a gradient moves by lr (plus lr * wd * w on
    # matrices), whatever the gradient's scale, so ratio = lr * sqrt(P) / ||w|| = lr / rms(w),
    # ~ lr / sigma for N(0, sigma^2) weights.
    sigma, lr = 0.05, 2e-3
    for grad_scale in (1.0, 1e-4):
        model = make(64, d_ff=128)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(sigma * torch.randn(p.shape, generator=gen))
        w = torch.cat([p.detach().flatten().clone() for p in model.encoder[0].parameters()])
        ratio = first_adamw_ratio(model, lr, grad_scale)
        assert ratio == pytest.approx(lr * math.sqrt(w.numel()) / w.norm().item(), rel=1e-3)
        assert ratio == pytest.approx(lr / sigma, rel=0.01)


def gaussian_max_logit(rows: int, S: int, draws: int) -> list[float]:
    """``attn/enc.0.self_attn/max_logit`` of ``draws`` forward passes whose q and k are i.i.d. N(0, 1) (head size 32)."""
    model = make(128, heads=4, max_len=S)
    src, tgt = torch.randint(4, 30, (rows, S)), torch.randint(4, 30, (rows, 2))
    attn = model.encoder[0].self_attn.branch
    handles = [t.register_forward_hook(lambda mod, args, out: torch.randn_like(out)) for t in (attn.q_tap, attn.k_tap)]
    tele = Telemetry(model, TelemetryConfig(every=1, sites=(), grads=False, attn_max_logit=True))
    values = []
    for _ in range(draws):
        with tele.watch(src.eq(0), tgt.eq(0)), torch.no_grad():
            model(src, tgt)
        values.append(tele.collect()["attn/enc.0.self_attn/max_logit"])
    for h in handles:
        h.remove()
    return values


def max_of_gaussians(n: int, h: float = 1e-3) -> float:
    """E[max of n i.i.d. N(0, 1)] = int_0^inf (1 - Phi^n) dt - int_0^inf Phi(-t)^n dt, by Simpson's rule."""
    m, total = int(10 / h), 0.0
    for i in range(m + 1):
        t, w = i * h, 1 if i in (0, m) else 4 if i % 2 else 2
        total += w * (1 - (0.5 * math.erfc(-t / math.sqrt(2))) ** n - (0.5 * math.erfc(t / math.sqrt(2))) ** n)
    return total * h / 3


def test_gaussian_query_key_max_logit_matches_the_docs():
    torch.manual_seed(0)
    for rows_keys, n, median, sd, iid in doc_table("rows x keys S"):
        rows, S = (int(v) for v in rows_keys.split(" x "))
        assert int(n.replace(",", "")) == rows * 4 * S * S
        assert float(iid) == pytest.approx(max_of_gaussians(rows * 4 * S * S), abs=0.005)
        values = torch.tensor(gaussian_max_logit(rows, S, draws=9))
        assert values.median().item() == pytest.approx(float(median), abs=float(sd))  # ~2.5 standard errors of a median of 9
        assert values.median().item() > float(iid)  # heavier tails than a Gaussian


def test_gaussian_logits_log_z_matches_the_docs():
    gen = torch.Generator().manual_seed(0)
    tele = Telemetry(make(8), TelemetryConfig(every=1, sites=(), grads=False, logits=True))
    for V, ln_v, log_z in ([int(c.replace(",", "")) for c in r[:1]] + [float(c) for c in r[1:]] for r in doc_table("V")):
        assert ln_v == pytest.approx(math.log(V), abs=0.005)
        assert log_z == pytest.approx(math.log(V) + 0.5 - (math.e - 1) / (2 * V), abs=0.005)
        tokens = 4096 if V < 1000 else 128  # sd of log Z per token ~ sqrt((e - 1) / V): the mean within ~0.003
        z = torch.randn(2, tokens // 2 + 16, V, generator=gen)
        pad = torch.arange(tokens // 2 + 16) >= tokens // 2  # 16 padding positions per row, at 1e4: must not count
        z[:, pad] = 1e4
        tele.logits.record(z, pad.expand(2, -1))
        assert tele.collect()["out/logz"] == pytest.approx(log_z, abs=0.012)


# docs/telemetry.md, "At initialization": ranges over seeds 0-2 of model=small on 400 x 10 random tokens, V = 43.
AT_INIT = {
    "pre_ln": {"out/logz": (5.2, 5.4), "out/max_logit": (7.3, 8.0), "attn": (4.0, 6.6)},
    "post_ln": {"out/logz": (4.1, 4.4), "out/max_logit": (3.2, 3.8), "attn": (2.6, 4.9),
                "attn/enc.0.self_attn/max_logit": (6.5, 7.9), "attn/dec.0.self_attn/max_logit": (5.8, 6.5)},
}  # fmt: skip


@pytest.mark.parametrize("preset", AT_INIT)
def test_max_logits_of_model_small_at_init_match_the_docs(preset):
    from benchmarks.norms import default_model_and_batch, norm_preset

    cfg = default_model_and_batch(norm_preset(preset))[0].cfg
    ranges = AT_INIT[preset]
    for seed in range(3):
        torch.manual_seed(seed)
        model = EncoderDecoder(cfg).eval()
        g = torch.Generator().manual_seed(100 + seed)
        src, tgt = torch.randint(4, 31, (400, 10), generator=g), torch.randint(4, 43, (400, 10), generator=g)
        tele = Telemetry(model, TelemetryConfig(every=1, sites=(), grads=False, attn_max_logit=True, logits=True))
        with tele.watch(src.eq(0), tgt.eq(0)), torch.no_grad():
            tele.logits.record(model(src, tgt), tgt.eq(0))
        stats, heads = tele.collect(), {}
        for name, value in stats.items():
            if (m := parse(name)) is not None and m.head is not None:  # one head's: the docs give the attention's
                heads.setdefault(attn_max_logit(m.stack, m.layer, m.site).name, []).append(value)
                continue
            low, high = ranges.get(name, ranges["attn"])
            assert low - 0.05 <= value <= high + 0.05, (seed, name, value)  # the docs round to 0.1
        assert heads and all(max(values) == stats[name] and len(values) == cfg.n_heads for name, values in heads.items())
