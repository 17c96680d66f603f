"""``fleetopt simulate --routers`` (issue 13, command 7): one run per router on one request stream.

The stream is checked against one drawn here from the same seed with the simulator's own primitives (Poisson
instants, then lengths, per child of ``SeedSequence(seed)``), and against the engine's record of it
(``simulated_seconds``: the sum of the replications' last arrival instants); the ``length`` run against a plain
``simulate_plan`` of the same fleet.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan
from fleetopt.optimizer.workflows.routers import compare_routers
from fleetopt.solvers.des.routing import poisson_arrivals, sample_lengths

H100_AZURE = ["gpus=[{name: h100, profile: H100-80GB}]", "workload.arrival_rate=100"]
FLEET = "0-4096:h100x3,4096-8192:h100x4"
OPTIONS = SimOptions(requests=3000, replications=3, seed=7)


@pytest.fixture(scope="module")
def inst(repo_root):
    return api.load(repo_root / "instances" / "ref_puzzle3_azure_mixed.yaml", H100_AZURE)


@pytest.fixture(scope="module")
def comparison(inst):
    return compare_routers(inst, FLEET, ["length", "compress", "random", "spillover"], OPTIONS)


def _independent_digest(inst, options: SimOptions) -> tuple[str, float]:
    """The streams drawn here (instants, then lengths, as the simulator draws them) and their summed span."""
    h, span = hashlib.sha256(), 0.0
    n = options.requests // options.replications
    w = inst.workload
    for child in np.random.SeedSequence(options.seed).spawn(options.replications):
        rng = np.random.default_rng(child)
        at = poisson_arrivals(w.arrival_rate_req_per_s, n, rng)
        prompt, output = sample_lengths(w.lengths, n, rng, w.input_fraction)
        for a in (at, prompt, output):
            h.update(np.ascontiguousarray(a).tobytes())
        span += float(at[-1])
    return h.hexdigest(), span


def test_every_router_sees_the_same_requests(inst, comparison):
    digest, span = _independent_digest(inst, OPTIONS)
    assert comparison.stream_sha256 == digest
    assert [r.router for r in comparison.runs] == ["length", "compress", "random", "spillover"]
    for r in comparison.runs:
        assert r.report.simulated_seconds == span          # the engine's horizons: the same last arrivals
        assert r.report.requests_simulated == OPTIONS.requests
        assert r.report.router == r.router


def test_length_matches_a_plain_simulate(inst, comparison):
    plain = simulate_plan(inst, plans_from_spec(inst, FLEET), OPTIONS)
    ours = comparison.runs[0].report.to_json()
    theirs = plain.to_json()
    ours.pop("wall_seconds"), theirs.pop("wall_seconds")
    assert json.dumps(ours, sort_keys=True, default=str) == json.dumps(theirs, sort_keys=True, default=str)


def test_routers_differ_only_where_routing_does(comparison):
    length, compress, rand, _ = comparison.runs
    # no @GAMMA pool: compress-and-route has nothing to compress and routes exactly as length
    assert compress.note and json.dumps(compress.report.to_json()["pools"], default=str) == \
        json.dumps(length.report.to_json()["pools"], default=str)
    # random sends some long requests to the short pool, whose window rejects them: SLO misses
    assert rand.report.slo_attainment < length.report.slo_attainment


def test_cli_routers_json(repo_root):
    args = ["simulate", str(repo_root / "instances" / "ref_puzzle3_azure_mixed.yaml"), "--fleet", FLEET, "--routers",
            "length,spillover", "--requests", "1000", "--replications", "2", "--json", "-"]
    for s in H100_AZURE:
        args += ["--set", s]
    res = CliRunner().invoke(main, args)
    assert res.exit_code in (0, 5), res.output
    data = json.loads(res.output)
    assert [r["router"] for r in data["routers"]] == ["length", "spillover"]
    for r in data["routers"]:
        assert {"ttft_p99_ms", "slo_attainment", "utilization", "pools"} <= set(r)
        assert len(r["pools"]) == 2 and {"ttft_p99_ms", "slo_attainment", "utilization"} <= set(r["pools"][0])
    bad = CliRunner().invoke(main, args[:-2] + ["--router", "length"])
    assert bad.exit_code == 2 and "--routers" in bad.output
