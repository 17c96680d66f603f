"""The promise: a plan `fleetopt solve` calls optimal is one its own simulator accepts.

The procedure of the README ("The seeds, analytic and re-checked in simulation"): plain `solve` on every bundled
instance, then `simulate --plan` of its plan with another seed (7) and three times the default requests
(150,000), judged on the upper end of each pool's 95 % interval. Two instances are named in the README as
exceptions, for a statistical reason: `ref_puzzle1_lmsys_a100`'s long pool (eight A100 units), whose P99 rests on rare
sequences of tens of thousands of tokens, reads 409 ms [258, 650] in such a run (424 ms [420, 430] over 2 million
requests of that pool alone), so its interval straddles the 500 ms SLO and the verdict is not `met`.
The other is `agent_split` (split routing fills its 8,192-65,536 pool of four H100 servers to
the sizing target, 2,910 ms analytic): 2,970 ms [2,824, 3,085] in such a run, 2,975 ms [2,954, 3,000] over 800,000
requests (``--precision 1``).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main

EXCEPTIONS = {"ref_puzzle1_lmsys_a100": "500 ms", "agent_split": "3,000 ms"}
"""Instances whose verdict is not `met` only as undecided (the SLO their interval straddles)."""
REFERENCE_SIZED = "ref_puzzle7_azure_pd"
"""Its pair is sized by the reference tool's convention (``pools.pd_sizing: reference``, to reproduce Puzzle 7's
1+3); fleetopt's own analytic evaluation of that plan already says it misses, so it is no promise of fleetopt's."""


@pytest.mark.slow
def test_plain_solve_plans_pass_their_simulator(repo_root, tmp_path):
    instances = sorted((repo_root / "instances").glob("*.yaml"))
    assert len(instances) == 21
    instances = [p for p in instances if p.stem != REFERENCE_SIZED]   # semantic_8b_70b: with its classifier
    verdicts = {}
    for path in instances:
        plan = tmp_path / f"{path.stem}.json"
        res = CliRunner().invoke(main, ["solve", str(path), "--json", str(plan)])
        assert res.exit_code == 0, (path.stem, res.output)
        sim = tmp_path / f"{path.stem}.sim.json"
        res = CliRunner().invoke(main, ["simulate", str(path), "--plan", str(plan), "--seed", "7", "--requests",
                                        "150000", "--json", str(sim)])
        assert res.exit_code in (0, 5) and "Traceback" not in res.output, (path.stem, res.output)
        doc = json.loads(sim.read_text())
        verdicts[path.stem] = doc["simulated"]["slo_met"]
        if path.stem in EXCEPTIONS:     # missed only as undecided: its interval straddles the SLO
            assert any(f"straddles the {EXCEPTIONS[path.stem]} SLO" in n for n in doc["notes"]), doc["notes"]
    assert sorted(k for k, met in verdicts.items() if not met) == sorted(EXCEPTIONS), verdicts
