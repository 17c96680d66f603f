"""Dominance pruning of replica choices, checked choice by choice against its definition."""

from __future__ import annotations

import numpy as np
import pytest

from fleetopt.optimizer import api
from fleetopt.optimizer.plan.candidates import generate_candidates, prune_dominated


def _dominates(c, q: int, p: int, unlimited, protected) -> bool:
    """The rule of prune_dominated's docstring, written out for one pair of choices."""
    cp = c.choice_pool
    if q == p or cp[q] == cp[p]:
        return False
    if (c.from_node[cp[q]], c.to_node[cp[q]]) != (c.from_node[cp[p]], c.to_node[cp[p]]):
        return False
    mq = (c.choice_cost_per_hr[q], c.choice_power_w[q], float(c.choice_gpus[q]), c.choice_miss_rate[q])
    mp = (c.choice_cost_per_hr[p], c.choice_power_w[p], float(c.choice_gpus[p]), c.choice_miss_rate[p])
    if not all(a <= b for a, b in zip(mq, mp)):
        return False
    if not (any(a < b for a, b in zip(mq, mp)) or q < p):
        return False
    gq, gp = c.gpu[cp[q]], c.gpu[cp[p]]
    return bool((unlimited[gq] or gq == gp) and not protected[gp])


def _key(c, ch: int) -> tuple:
    p = c.choice_pool[ch]
    return (int(c.i[p]), int(c.j[p]), int(c.gpu[p]), int(c.state_in[p]), int(c.state_out[p]), int(c.cap[p]),
            int(c.choice_replicas[ch]))


@pytest.mark.parametrize("sets, unlimited, protected", [
    ([], [True, True], [False, False]),
    (["slo.scope=fleet"], [True, False], [False, False]),       # several counts per pool; one option limited
    (["slo.tpot_p99_ms=60"], [True, True], [False, True]),      # several batch caps; one option protected
])
def test_pruning_keeps_exactly_the_undominated_choices(repo_root, sets, unlimited, protected):
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml",
                    sets + ["pools.boundaries=[1024, 4096, 16384]"])
    c = generate_candidates(inst)
    unlimited, protected = np.array(unlimited), np.array(protected)
    pruned = prune_dominated(c, unlimited, protected)
    kept = {_key(pruned, ch) for ch in range(pruned.n_choices)}
    expected = {_key(c, p) for p in range(c.n_choices)
                if not any(_dominates(c, q, p, unlimited, protected) for q in range(c.n_choices))}
    assert c.n_choices > len(expected) > 0
    assert kept == expected
