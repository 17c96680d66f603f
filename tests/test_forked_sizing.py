"""Candidate sizing with its GPU options on forked workers (:func:`fleetopt.optimizer.plan.candidates._size_forked`)
against the same options sized one after the other in this process.

Forking is meant to change nothing: every column of :class:`~fleetopt.optimizer.plan.candidates.Candidates` must be
equal bit for bit, with the same dtype, and the dropped candidates must carry the same reasons in the same order,
so neither side is an expected value produced by the code under test alone.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from fleetopt.optimizer import api, forked
from fleetopt.optimizer.plan import candidates as cand

CASES = {
    # two calibrated units, the reference scenarios' convention
    "units": ("ref_units_lmsys_a100_h100.yaml", ()),
    # six computed configurations (TP 4/8 and two precisions) with a TPOT SLO: batch-cap rows and dropped
    # candidates whose reasons are written on the worker
    "tp-tpot": ("llama70b_tp.yaml", ("slo.tpot_p99_ms=60", "slo.ttft_p99_ms=600")),
}


def _generate(inst, workers: int, monkeypatch) -> cand.Candidates:
    monkeypatch.setattr(cand, "_sizing_workers", lambda options, rows: min(workers, options))
    return cand.generate_candidates(inst)


@pytest.mark.skipif(not forked.forkable(), reason="workers fork only on Linux, from the main thread")
@pytest.mark.parametrize("case", sorted(CASES))
def test_forked_sizing_gives_the_same_candidates(case, repo_root, monkeypatch):
    name, overrides = CASES[case]
    inst = api.load(repo_root / "instances" / name, list(overrides))
    here = _generate(inst, 1, monkeypatch)
    there = _generate(inst, 3, monkeypatch)
    assert len(here) > 100 and here.dropped            # enough rows, and some dropped, to compare
    for f in dataclasses.fields(cand.Candidates):
        a, b = getattr(here, f.name), getattr(there, f.name)
        if f.name == "dropped":
            assert [(d.lo_tokens, d.hi_tokens, d.gpu, d.reason) for d in a] == \
                   [(d.lo_tokens, d.hi_tokens, d.gpu, d.reason) for d in b]
            assert all(isinstance(d.why, str) for d in b)   # written on the worker, sent back as text
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), f.name
        else:
            assert a == b, f.name


def test_sizing_workers_rules(monkeypatch):
    monkeypatch.setattr(forked, "forkable", lambda: True)
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)
    assert cand._sizing_workers(1, 10**6) == 1                                # one option: nothing to share
    assert cand._sizing_workers(4, cand.MIN_FORKED_ROWS // 4 - 1) == 1        # too little work to pay for workers
    assert cand._sizing_workers(16, cand.MIN_FORKED_ROWS) == 2                # one worker per usable core
    monkeypatch.setattr(forked, "usable_cpus", lambda: 64)
    assert cand._sizing_workers(3, cand.MIN_FORKED_ROWS) == 3                 # at most one per option
    monkeypatch.setattr(forked, "forkable", lambda: False)
    assert cand._sizing_workers(16, cand.MIN_FORKED_ROWS) == 1


def test_no_fork_from_another_thread():
    seen = []
    t = threading.Thread(target=lambda: seen.append(forked.forkable()))
    t.start()
    t.join()
    assert seen == [False]              # a fork copies only the calling thread
