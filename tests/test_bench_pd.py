"""The bench's stress + P/D + TP list instance: what its row claims to solve."""

from __future__ import annotations

from fleetopt.optimizer.bench import stress_pd_tp_data
from fleetopt.optimizer.io.instance import instance_from_dict


def test_stress_pd_tp_instance_has_pairs_and_a_tp_list():
    inst = instance_from_dict(stress_pd_tp_data())
    names = [g.name for g in inst.gpus]
    assert len(names) == 10 and names[:8] == ["a10g", "a100", "h100", "b200", "a10g-8b", "l40s-8b", "a100-8b",
                                              "h100-8b"]
    tp = [n for n in names if n.startswith("h100-70b/")]
    assert [inst.gpu(n).profile.tp for n in tp] == [4, 8]                 # one configuration per TP degree
    assert inst.pools.disaggregation == "allow" and len(inst.pools.boundaries) == 62   # 0, 60 cuts, 65,536
    assert inst.pools.transfer("h100-70b/tp4/fp16", "h100-70b/tp8/fp16").model == "seed-factor"
    assert inst.pools.transfer("a100", "h100-8b") is None                 # two models: no pair
