"""The agreement harness (analytic vs simulated): its sampler, its statistics, and one closed-form fact."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fleetopt.optimizer.simulation.agreement import (
    WORKLOADS,
    MetricAgreement,
    PoolAgreement,
    agreement_options,
    measure_pool,
    pinned,
    run_agreement,
    sample_pools,
    summarize_agreement,
    summarize_ratios,
)


@pytest.fixture(scope="module")
def drawn():
    return sample_pools(np.random.default_rng(11), 3)


def test_sampler_is_reproducible_per_seed(drawn):
    again = sample_pools(np.random.default_rng(11), 3)
    assert [p.describe() for p in again] == [p.describe() for p in drawn]
    other = sample_pools(np.random.default_rng(12), 2)
    assert [p.describe() for p in other] != [p.describe() for p in drawn[:2]]


def test_sampled_pools_satisfy_the_stated_ranges(drawn):
    for p in drawn:
        assert 2048 <= p.hi_tokens <= 65536
        assert p.lo_tokens in (0, p.hi_tokens // 2, p.hi_tokens // 4, p.hi_tokens // 8)
        assert 0.2 <= p.utilization_analytic <= 0.85
        assert 1 <= p.replicas <= 16
        a = p.analytic
        # the analytic utilisation is lambda E[S] / (N c), recomputed from its parts (batched: E[S] is the
        # residence time and the batch cap c the places; Little's law)
        assert p.utilization_analytic == pytest.approx(
            p.arrival_rate_req_per_s * a.mean_service_s / (p.replicas * a.max_num_seqs), rel=1e-9)
        assert a.max_num_seqs >= 1 and np.isfinite(a.ttft_p99_ms)
        # the instance holds the window's traffic only: no request outside (lo, hi]
        lengths = p.instance.workload.lengths
        if hasattr(lengths, "total_tokens"):
            t = lengths.total_tokens
            assert t.min() > p.lo_tokens and t.max() <= p.hi_tokens
        else:
            assert float(lengths.cdf(p.lo_tokens)) == pytest.approx(0.0, abs=1e-12)
            assert float(lengths.cdf(p.hi_tokens)) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.slow
def test_every_workload_and_several_gpus_appear():
    pools = sample_pools(np.random.default_rng(5), 60)
    assert {p.workload for p in pools} == set(WORKLOADS)
    assert len({p.gpu for p in pools}) >= 5


def test_summary_statistics_by_hand():
    """Ten ratios; the empirical quantile min{r : F_n(r) >= q}: P10 is the 1st order statistic, the median the
    5th, P90 the 9th. Within 10 %: 0.95, 1.0, 1.05, 1.1 (4 of 10); below 0.8: 0.0, 0.5, 0.7 (3 of 10); the
    worst by |ln r| is 0.0 (a simulated +inf)."""
    r = [1.1, 0.5, 2.5, 0.95, 1.0, 0.7, 1.3, 1.05, 0.0, 1.6]
    s = summarize_ratios(r, band=0.10)
    assert (s.p10, s.median, s.p90) == (0.0, 1.0, 1.6)
    assert s.within_band_share == pytest.approx(0.4)
    assert s.optimistic_share == pytest.approx(0.3)
    assert s.worst == 0.0 and s.pools == 10
    t = summarize_ratios([1.0, 1.04, 0.9, 3.0], band=0.05)   # worst: |ln 3| > |ln 0.9|
    assert (t.worst, t.within_band_share, t.optimistic_share) == (3.0, 0.5, 0.0)
    with pytest.raises(ValueError):
        summarize_ratios([], band=0.1)
    with pytest.raises(ValueError):
        summarize_ratios([1.0, float("nan")], band=0.1)


def test_agreement_summary_subsets():
    """The pinned row keeps the pools whose interval is within +-10 % of the estimate, the within-cap row those
    of full-batch load at most the default cap 0.85 (here three pools by hand: pinned at 0.5 and 0.9 load, not
    pinned at 0.85, so the rows hold ratios [1.0, 0.7] and [1.0, 1.3])."""
    def rec(ratio, ci_half, load):
        ttft = MetricAgreement(100.0 * ratio, 100.0, (100.0 - ci_half, 100.0 + ci_half), ratio)
        other = MetricAgreement(1.0, 1.0, None, 1.0)
        return PoolAgreement(SimpleNamespace(analytic=SimpleNamespace(capacity_load=load)), ttft, other, other,
                             other, 0, 0.0)
    rows = {s.metric: s for s in summarize_agreement([rec(1.0, 5.0, 0.5), rec(1.3, 20.0, 0.85), rec(0.7, 9.0, 0.9)])}
    assert rows["ttft_p99"].pools == 3
    assert (rows["ttft_p99_pinned"].pools, rows["ttft_p99_pinned"].optimistic_share) == (2, 0.5)
    assert (rows["ttft_p99_within_cap"].pools, rows["ttft_p99_within_cap"].within_band_share) == (2, 0.5)
    assert rows["ttft_p99_within_cap"].optimistic_share == 0.0


@pytest.mark.slow
def test_slot_mode_utilisation_is_the_closed_form():
    """In slot mode the simulator is the M/G/c queue of the analytic model, whose utilisation is
    lambda E[S] / (N c) (the slot model ``tail``). Pools whose start-up scale E[S](1 + c_s^2) is short against the
    run (under 1/50 of the expected span n / lambda) are taken, so the warm-up transient does not bias the time
    average."""
    n = 30_000
    pools = [p for p in sample_pools(np.random.default_rng(3), 30, ttft_model="tail")
             if p.analytic.mean_service_s * (1 + p.analytic.cv2_service) * 50 < n / p.arrival_rate_req_per_s][:3]
    assert len(pools) == 3
    for p in pools:
        a = p.analytic
        expected = p.arrival_rate_req_per_s * a.mean_service_s / (p.replicas * a.max_num_seqs)
        rec = measure_pool(p, agreement_options(n, mode="slot"))
        assert rec.utilization.simulated == pytest.approx(expected, rel=0.05)


@pytest.mark.slow
def test_batched_model_agrees_with_the_simulator():
    """The acceptance yardstick on a fixed draw of 30 pools (the bench runs 200): the default model's P99 TTFT
    within 10 % of the simulated one for at least 90 % of the pools whose simulated P99 is itself pinned down
    (95 % interval within +-10 %), never optimistic by more than 20 % there; mean batch and power within 5 %
    for at least 90 % of all pools. Each pool runs at least 50,000 requests and 40 relaxation times."""
    records = [measure_pool(p, agreement_options(50_000)) for p in sample_pools(np.random.default_rng(2024), 30)]
    held = [r for r in records if pinned(r)]
    assert len(held) >= 20
    ttft = summarize_ratios([r.ttft_p99_ms.ratio for r in held], band=0.10)
    assert ttft.within_band_share >= 0.90 and ttft.optimistic_share == 0.0, ttft
    for metric in ("mean_batch", "power"):
        s = summarize_ratios([r.metric(metric).ratio for r in records], band=0.05)
        assert s.within_band_share >= 0.90, (metric, s)


@pytest.mark.slow
def test_pools_measured_in_processes_give_the_same_records():
    """Each pool's run has its own seed: two worker processes give the serial records, in order (all but the
    wall time)."""
    options = agreement_options(2_000)
    serial = run_agreement(3, np.random.default_rng(7), options)
    parallel = run_agreement(3, np.random.default_rng(7), options, workers=2)

    def record(r):
        return {k: v for k, v in r.to_json().items() if k != "wall_s"}

    assert [record(r) for r in parallel] == [record(r) for r in serial]


def test_a_precision_target_reaches_the_pool_runs():
    """``agreement_options(precision=...)`` sets the simulator's precision target with a cap of at least the run's
    requests, and ``bench --agreement-precision`` rejects a value that is not a percentage in one line (exit 2)."""
    from click.testing import CliRunner

    from fleetopt.optimizer.cli import main

    o = agreement_options(50_000, precision=0.1)
    assert (o.precision, o.max_requests, o.requests) == (0.1, 2_000_000, 50_000)
    assert agreement_options(3_000_000).max_requests == 3_000_000 and agreement_options().precision is None
    res = CliRunner().invoke(main, ["bench", "--quick", "--agreement-pools", "0", "--agreement-precision", "200"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and lines == ["error: --agreement-precision: '200' is not a percentage in (0, 100), "
                                            "e.g. 5%"], res.output
