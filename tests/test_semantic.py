"""Model-level semantic routing (``fleetopt.models.semantic``): each model class's exact length distribution.

Expected values are hand calculations on uniform pieces (the mean of U(a, b] is (a + b) / 2, its second
moment (a^2 + ab + b^2) / 3), never values read back from the code under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fleetopt.models.segments import raw_between, segment_basis
from fleetopt.models.semantic import ShareRule, large_model_share, split_by_model
from fleetopt.models.workload import LengthDistribution, RequestTrace
from fleetopt.optimizer.io.catalog import data_dir

TWO = LengthDistribution.from_cdf([(1000, 0.5), (3000, 1.0)])  # U(0, 1000] w.p. 0.5, U(1000, 3000] w.p. 0.5


def second_moment(d: LengthDistribution) -> float:
    lo, hi = d.lo_tokens, d.hi_tokens
    return float(np.sum(d.prob * (lo * lo + lo * hi + hi * hi) / 3.0))


def azure() -> LengthDistribution:
    data = json.loads((data_dir() / "workloads" / "azure_cdf.json").read_text())
    return LengthDistribution.from_cdf(data["cdf"] if isinstance(data, dict) else data)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_constant_share_keeps_the_shape(alpha):
    """A length-blind classifier: both classes keep the workload's distribution, at rates alpha and 1 - alpha.
    TWO: mean = 0.5 x 500 + 0.5 x 2000 = 1250; E[L^2] = 0.5 x 1e6/3 + 0.5 x (1e6 + 3e6 + 9e6)/3 = 2,333,333.3."""
    small, large = split_by_model(TWO, ShareRule.constant(alpha))
    assert small.rate_share == pytest.approx(alpha, abs=1e-15)
    assert large.rate_share == pytest.approx(1 - alpha, abs=1e-15)
    for cls in (small, large):
        if cls.rate_share == 0:
            assert cls.distribution is None
            continue
        assert cls.distribution.mean_tokens == pytest.approx(1250.0, rel=1e-12)
        assert second_moment(cls.distribution) == pytest.approx(7e6 / 3, rel=1e-12)


def test_step_share_inside_a_piece():
    """Edge at 2,000 tokens, inside the piece (1000, 3000]: 90 % of requests up to 2,000 go small, 10 % above.
    Parts: (0,1000] 0.5, (1000,2000] 0.25, (2000,3000] 0.25.
    small rate = 0.9 x 0.75 + 0.1 x 0.25 = 0.7; small mean = (0.45 x 500 + 0.225 x 1500 + 0.025 x 2500) / 0.7
    = 625 / 0.7; large rate = 0.3, large mean = (0.05 x 500 + 0.025 x 1500 + 0.225 x 2500) / 0.3 = 625 / 0.3."""
    small, large = split_by_model(TWO, ShareRule.step([2000], [0.9, 0.1]))
    assert small.rate_share == pytest.approx(0.7, rel=1e-12)
    assert large.rate_share == pytest.approx(0.3, rel=1e-12)
    assert small.distribution.mean_tokens == pytest.approx(625 / 0.7, rel=1e-12)
    assert large.distribution.mean_tokens == pytest.approx(625 / 0.3, rel=1e-12)
    # CDF of the small class at the edge: (0.45 + 0.225) / 0.7
    assert float(small.distribution.cdf(2000)) == pytest.approx(0.675 / 0.7, rel=1e-12)
    # the large class's E[L^2]: (0.05 x 1e6/3 + 0.025 x 7e6/3 + 0.225 x 19e6/3) / 0.3
    expected = (0.05 * 1e6 + 0.025 * 7e6 + 0.225 * 19e6) / 3 / 0.3
    assert second_moment(large.distribution) == pytest.approx(expected, rel=1e-12)


def test_length_routing_is_the_zero_one_step():
    """alpha = 1 up to B, 0 above: the classes are the workload's two segments, B's CDF their shares."""
    d = azure()
    small, large = split_by_model(d, ShareRule.step([4096], [1.0, 0.0]))
    assert small.rate_share == pytest.approx(float(d.cdf(4096)), rel=1e-12)
    assert small.distribution.max_tokens == 4096 and large.distribution.lo_tokens.min() == 4096
    assert large_model_share(d, ShareRule.step([4096], [1.0, 0.0])) == pytest.approx(1 - float(d.cdf(4096)))


@pytest.mark.parametrize("rule", [ShareRule.constant(0.4), ShareRule.step([700, 2500, 5000], [0.95, 0.6, 0.2, 0.0]),
                                  ShareRule.step([512.5], [0.0, 1.0])])
def test_mass_and_density_are_conserved(rule):
    """pi_small f_small + pi_large f_large = f at every length, and the two rates sum to 1."""
    d = azure()
    small, large = split_by_model(d, rule)
    assert small.rate_share + large.rate_share == pytest.approx(1.0, abs=1e-12)
    x = np.linspace(0, 12000, 2401)
    both = small.rate_share * small.distribution.cdf(x) + large.rate_share * large.distribution.cdf(x)
    np.testing.assert_allclose(both, d.cdf(x), atol=1e-12)
    # the small class's CDF increments are alpha(L) times the workload's, on a grid that avoids the edges
    grid = np.array([100.0, 600.0, 650.0, 1000.0, 2000.0, 2400.0, 3000.0, 4500.0, 6000.0])
    lo, hi = grid[:-1], grid[1:]
    alpha = rule.share_at(hi)
    ok = rule.share_at(lo + 1e-9) == alpha          # the edge is not inside (lo, hi]
    inc_small = small.rate_share * (small.distribution.cdf(hi) - small.distribution.cdf(lo))
    np.testing.assert_allclose(inc_small[ok], (alpha * (d.cdf(hi) - d.cdf(lo)))[ok], atol=1e-12)


def test_classes_tile_through_the_segment_machinery():
    """Each class goes through segment_basis like a whole workload; the rate-weighted raw sums of the two
    classes on any segment equal the workload's (every basis integral is linear in the density)."""
    d = azure()
    rule = ShareRule.step([1536, 4096], [0.9, 0.5, 0.1])
    small, large = split_by_model(d, rule)
    grid = np.array([0.0, 1024, 2048, 4096, 8192, 16384])
    bases = [segment_basis(x, grid, 512, 0.8) for x in (d, small.distribution, large.distribution)]
    for i, j in ((0, 1), (1, 2), (2, 3), (3, 4), (0, 5)):
        full, s, l_ = (raw_between(b, i, j) for b in bases)
        for field in ("mass", "A", "A2", "k", "out", "L", "X"):
            np.testing.assert_allclose(small.rate_share * getattr(s, field) + large.rate_share * getattr(l_, field),
                                       getattr(full, field), rtol=1e-10, atol=1e-12, err_msg=field)


def test_trace_enters_by_its_total_lengths():
    """Atoms: lengths 100, 100, 3000, 5000 (shares 0.5 / 0.25 / 0.25), rule 0.8 up to 4,096 and 0 above.
    small rate = 0.8 x 0.75 = 0.6, small mean = (0.4 x 100 + 0.2 x 3000) / 0.6; an atom at an edge is below it."""
    trace = RequestTrace(np.arange(4.0), np.array([80, 80, 2400, 4000]), np.array([20, 20, 600, 1000]))
    small, large = split_by_model(trace, ShareRule.step([4096], [0.8, 0.0]))
    assert small.rate_share == pytest.approx(0.6) and large.rate_share == pytest.approx(0.4)
    assert small.distribution.mean_tokens == pytest.approx((0.4 * 100 + 0.2 * 3000) / 0.6)
    assert large.distribution.mean_tokens == pytest.approx((0.1 * 100 + 0.05 * 3000 + 0.25 * 5000) / 0.4)
    at_edge = split_by_model(LengthDistribution(np.array([4096.0]), np.array([4096.0]), np.array([1.0])),
                             ShareRule.step([4096], [1.0, 0.0]))
    assert at_edge[0].rate_share == 1.0 and at_edge[1].distribution is None


def test_bad_rules_are_one_message():
    with pytest.raises(ValueError, match="needs 2 shares"):
        ShareRule.step([4096], [0.5])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ShareRule.constant(1.5)
    with pytest.raises(ValueError, match="strictly increasing"):
        ShareRule.step([4096, 2048], [0.1, 0.2, 0.3])


def test_truncation_atom_goes_with_its_length():
    """TWO cut at 2,000 tokens: (0,1000] 0.5, (1000,2000] 0.25, an atom at 2,000 of 0.25. Edge 1,500, all small
    below: small = 0.5 + 0.125, large = 0.125 + 0.25 with mean (0.125 x 1750 + 0.25 x 2000) / 0.375; with the
    edge at 2,000 the atom is in the lower segment and the large model gets nothing."""
    cut, share = TWO.truncated(2000)
    assert share == pytest.approx(0.25)
    small, large = split_by_model(cut, ShareRule.step([1500], [1.0, 0.0]))
    assert small.rate_share == pytest.approx(0.625) and large.rate_share == pytest.approx(0.375)
    assert large.distribution.mean_tokens == pytest.approx((0.125 * 1750 + 0.25 * 2000) / 0.375)
    small, large = split_by_model(cut, ShareRule.step([2000], [1.0, 0.0]))
    assert small.rate_share == pytest.approx(1.0) and large.distribution is None
    assert small.distribution.mean_tokens == pytest.approx(0.5 * 500 + 0.25 * 1500 + 0.25 * 2000)
