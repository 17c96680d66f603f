"""1/W paper, Table 4 (section 5.1): context pools against semantic pools, per pool, at 85 % utilisation.

Quoted from the seed paper (seeds/000_09ee93d41337e3d4.txt, section 5.1):

=========================  ==============  =======  =====  =====  =====
Pool type                  Model           Context  n      P (W)  tok/W
=========================  ==============  =======  =====  =====  =====
Context short (70B@8K)     Llama-3.1-70B   8K       109    578    8.77
Context long (70B@64K)     Llama-3.1-70B   64K      14     413    1.52
Semantic small (8B@8K)     Llama-3.1-8B    8K       49     506    6.24
Semantic large (70B@64K)   Llama-3.1-70B   64K      14     413    1.52
=========================  ==============  =======  =====  =====  =====

The utilisation's symbol was lost from the paper's text. **It is 85 %, not 60 %**: every cell reproduces
within 3 % (power and tok/W within 2 %) with n = 0.85 n_max (n_max = n_slots at the pool's context), and none
of the n cells does at 60 % (77 / 10 / 34 sequences, 30 % low; ``test_sixty_percent_does_not_reproduce``).
0.85 is the reference tool's default utilisation cap (``rho_max`` of its analytic sizing). The n column is the
mean in-flight batch n = rho n_max (108.8 -> 109, 13.6 -> 14 printed), mean sequence = half the window (the
paper's Table-1 convention), and:

* **70B pools**: the calibrated H100 unit (``H100-80GB``, the "empirically calibrated profile with TP-sharded
  KV" of section 4.1: 128 sequences at 8K, 16 at 64K), its logistic power curve. Its power is **one GPU's**
  (the unit convention, ``data/catalog/README.md``): "per TP=8 group" in the paper means one TP=8 group
  (8 H100s) counted and powered as one GPU. The group's tok/s over that one GPU's power is 8 times the
  physical tok/W of its 8 GPUs.
* **8B pool**: the roofline of Llama-3.1-8B on one H100 (TP=1) under the seeds' convention with the
  paper's activity power rule, exactly as its Table 2 (n_max 57 here, 58 in the paper). "Per group" cannot
  mean a TP=8 group for an 8B model: one 8B replica is one GPU, and 8 GPUs hold 8 independent TP=1 replicas
  (8 x 48.45 sequences, 8 x 501 W) with the same tok/W. The row's 506 W and 6.24 tok/W are one GPU's.

Hence the paper's "8.77 vs 6.24 per group" compares a TP=8 group's throughput over one GPU's power with one
GPU's throughput over its own power; per physical GPU the 70B@8K pool gives 8.78 / 8 = 1.10 tok/W against the
8B pool's 6.12 (``test_per_physical_gpu``), which is the paper's own conclusion ("on a per-physical-GPU basis,
the 8B semantic pool wins").

Two cells are off by more than rounding, each explained, none beyond 10 %:

* 70B@64K power: 417.9 W against 413 (+1.2 %). The reference tool evaluates its power curve at the
  *integer* batch ``int(13.6) = 13``: P(13) = 413.3 W. fleetopt keeps the mean batch continuous.
* 8B@8K: n 48.45 against 49 (-1.1 %), 501 W against 506 (-1.0 %), 6.12 tok/W against 6.24 (-1.9 %): the
  roofline holds 57 sequences at 8K with the official parameter count where the paper had 58 (Table 2,
  ``tests/test_roofline.py``), and 0.85 x 58 = 49.3.
"""

from __future__ import annotations

import pytest

from fleetopt.models.roofline import activity_power_per_gpu_w, computed_profile
from fleetopt.models.service import decode_power_curve, iteration_latency_s
from fleetopt.optimizer.io.catalog import load_catalog

RHO = 0.85
H100_UNIT, H100 = "H100-80GB", "H100-SXM-80GB"
# pool: (context tokens, n, P W, tok/W) as printed in Table 4
TABLE4 = {
    "context-short-70B@8K": (8192, 109, 578, 8.77),
    "context-long-70B@64K": (65536, 14, 413, 1.52),
    "semantic-small-8B@8K": (8192, 49, 506, 6.24),
    "semantic-large-70B@64K": (65536, 14, 413, 1.52),
}


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def pool_point(cat, pool: str, rho: float = RHO):
    """(n_max, n, one GPU's power W, tok/s of one replica, tok/W) of a Table-4 pool at utilisation ``rho``."""
    ctx = TABLE4[pool][0]
    seq = ctx / 2
    if "8B" in pool:
        profile = computed_profile(cat.hardware[H100], cat.models["Llama-3.1-8B"], tp=1, kv_layout="replicated",
                                   defaults=cat.defaults.seeds_convention())
    else:
        profile = cat.profiles[H100_UNIT]
    n_max = int(profile.n_slots(ctx))
    n = rho * n_max
    tok_s = n / float(iteration_latency_s(profile, n, seq))
    if "8B" in pool:
        power_w = float(activity_power_per_gpu_w(profile, n, seq))
    else:
        power_w = float(decode_power_curve(profile, seq).power_w(n))
    return n_max, n, power_w, tok_s, tok_s / power_w


def rel_err(ours: float, paper: float) -> float:
    return abs(ours - paper) / paper


@pytest.mark.parametrize("pool", TABLE4)
def test_table4_cells_within_ten_percent(cat, pool):
    _, paper_n, paper_p_w, paper_tok_w = TABLE4[pool]
    _, n, power_w, _, tok_w = pool_point(cat, pool)
    assert rel_err(n, paper_n) <= 0.03  # the printed n is rounded: 13.6 -> 14
    if "70B" in pool:
        assert round(n) == paper_n
    assert rel_err(power_w, paper_p_w) <= 0.02
    assert rel_err(tok_w, paper_tok_w) <= 0.02


def test_70b_pools_by_hand(cat):
    """The calibrated unit: W 4 ms, H 0.32 ms at 8K, power 300 + 300 / (1 + exp(-(log2 n - 4.2))).
    8K: n = 0.85 x 128 = 108.8, t = 4 + 0.32 x 0.5 x 108.8 = 21.408 ms, 5,082 tok/s, P = 578.6 W, 8.78 tok/W.
    64K: n = 0.85 x 16 = 13.6, t = 4 + 0.32 x 4 x 13.6 = 21.408 ms, 635.3 tok/s, P = 417.9 W, 1.52 tok/W."""
    import math

    for pool, n_max, t_s in (("context-short-70B@8K", 128, 0.021408), ("context-long-70B@64K", 16, 0.021408)):
        n = 0.85 * n_max
        p_w = 300 + 300 / (1 + math.exp(-(math.log2(n) - 4.2)))
        assert pool_point(cat, pool)[:3] == (n_max, pytest.approx(n), pytest.approx(p_w, rel=1e-12))
        assert pool_point(cat, pool)[4] == pytest.approx(n / t_s / p_w, rel=1e-12)
    # the reference tool's integer batch in the power curve: P(13) = 413.3 W, the printed 413
    assert 300 + 300 / (1 + math.exp(-(math.log2(13) - 4.2))) == pytest.approx(413, abs=0.5)


def test_the_long_pool_is_the_same_in_both_schemes(cat):
    assert pool_point(cat, "context-long-70B@64K") == pool_point(cat, "semantic-large-70B@64K")


def test_sixty_percent_does_not_reproduce(cat):
    """At 60 % the batch column is 30 % low in every pool (77 / 9.6 / 34 sequences against 109 / 14 / 49)."""
    for pool in ("context-short-70B@8K", "context-long-70B@64K", "semantic-small-8B@8K"):
        _, n, *_ = pool_point(cat, pool, rho=0.60)
        assert rel_err(n, TABLE4[pool][1]) > 0.25


def test_per_physical_gpu(cat):
    """Per TP=8 group the 70B@8K pool looks better (8.78 against 6.12); per physical GPU the 8B pool wins:
    the 70B unit's tok/s is 8 GPUs' output, its power one GPU's. 8 TP=1 replicas of the 8B model on 8 GPUs
    have 8 times the sequences and the power of one, the same tok/W."""
    cal = cat.profiles[H100_UNIT]
    _, _, _, _, group_tok_w = pool_point(cat, "context-short-70B@8K")
    _, n_8b, p_8b_w, tok_s_8b, small_tok_w = pool_point(cat, "semantic-small-8B@8K")
    assert cal.physical_gpus_per_replica == 8 and cal.gpus_per_replica == 1
    assert group_tok_w > small_tok_w
    assert group_tok_w / 8 == pytest.approx(8.784 / 8, abs=0.001)  # 1.098 tok/W per physical GPU
    assert small_tok_w > 5 * group_tok_w / 8
    assert (8 * tok_s_8b) / (8 * p_8b_w) == pytest.approx(small_tok_w, rel=1e-12)
