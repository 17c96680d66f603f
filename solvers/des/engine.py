"""A discrete-event simulator of LLM serving pools, in two service modes.

A run takes plain data: pools (:class:`SimPool`), a request stream
(:class:`fleetopt.solvers.des.routing.Requests`), a router between pools and a dispatch
policy within a pool (:mod:`fleetopt.solvers.des.routing`). It returns one record per
request, as the columns of a frozen :class:`SimResult`. The engine is
deterministic; randomness enters only through the request stream and the
routers, which take an explicit ``numpy.random.Generator``.

Modes
-----
``mode="slot"`` - the analytic model's own view (:mod:`fleetopt.models.queueing.erlang`).
Every request holds one KV slot (a server) for its service time

.. math:: S = \\left(\\lceil l_{in}/c \\rceil + l_{out}\\right) t(n, l_{in} + l_{out})

(:mod:`fleetopt.models.service` with :math:`n` the pool's batch cap ``max_num_seqs``,
as :mod:`fleetopt.models.fleet` does), or for a time given per request. With
``queue="pool"`` (the default) one FCFS queue feeds any free slot of the pool:
an M/G/c queue with :math:`c` = replicas x slots, which is what Erlang-C
models. With ``queue="replica"`` a dispatch policy picks the replica on arrival
and each replica has its own FCFS queue. The first token comes
:math:`T_{pf} = \\lceil l_{in}/c \\rceil (W + H)` after the start
(:func:`fleetopt.models.service.prefill_time_s`), or at the end if a given service
time is shorter.

``mode="iteration"`` - continuous batching as in vLLM, per replica. A request
joins its replica's FCFS waiting queue and is admitted while fewer than
``max_num_seqs`` sequences run (and, on an overcommitted pool, while its KV
blocks fit: "KV blocks and preemption" below; with a token budget, while
tokens are left: "Token budget"). Every iteration advances each running
sequence one step: a prefill chunk of :math:`c` tokens
(``profile.chunk_tokens``) while its prompt lasts, then one output token. The
first token comes at the end of the last of :math:`k = \\lceil l_{in}/c \\rceil`
prefill iterations, and the request completes :math:`l_{out}` decode
iterations later (:math:`k + l_{out}` iterations, as in :math:`S` above). An
iteration over sequences with contexts :math:`x_1, \\dots, x_n` takes

.. math:: t = t(n, \\bar x) = W + h \\sum_s x_s, \\qquad h = H / B_{cal}

(:func:`fleetopt.models.service.iteration_latency_s` with the batch's mean context,
which is affine in :math:`n \\bar x`), where the context :math:`x_s` of a
sequence is the number of tokens in its KV cache at the *start* of the
iteration: :math:`0, c, 2c, \\dots, (k-1)c` over its prefill chunks and
:math:`l_{in}, l_{in}+1, \\dots, l_{in}+l_{out}-1` over its decode steps.

Between two events of a replica (an admission, a prefill end, a completion)
every iteration has the same sequences and the total context grows by
:math:`g = c\\, n_{pf} + n_{dec}` per iteration, so :math:`m` iterations from
an anchor of total context :math:`C_0` take exactly

.. math:: T(m) = \\sum_{j=0}^{m-1} \\left(W + h (C_0 + j g)\\right)
          = m (W + h C_0) + h g \\frac{m (m - 1)}{2}

(integrated exactly, no frozen mean). The engine therefore jumps from event to
event: each replica keeps its sequences' event *iteration indices* in a heap
(every running sequence advances one step per iteration, whatever the batch),
and only the replica's next event goes onto the global event heap. Context
sums are kept in integer tokens, so they never drift.

KV blocks and preemption
------------------------
A pool built with ``allow_overcommit=True`` and ``max_num_seqs`` above
:math:`n_{slots}(B)` (:attr:`SimPool.overcommitted`) tracks each replica's KV
blocks and preempts sequences when they run out, as vLLM's scheduler with the
recompute policy [1]_. The semantics and the handlers are in
:mod:`fleetopt.solvers.des.kv`; other pools can never run out of blocks and skip the
bookkeeping entirely. :attr:`SimResult.preemptions` counts preemptions per pool
(:attr:`SimResult.replica_preemptions` per replica); slot mode has no KV
blocks and refuses overcommitted pools.

Token budget
------------
A pool with ``max_batched_tokens`` :math:`K` (vLLM's
``max_num_batched_tokens``) shares :math:`K` tokens per iteration among the
sequences of each replica, as vLLM's scheduler does with chunked prefill
[3]_. In every iteration each decoding sequence takes its one token
(:math:`K \\ge` ``max_num_seqs``, so decodes never stall); the rest goes to the
prefilling sequences, oldest admission first, each taking

.. math:: a_s = \\min\\Big(c,\\; l_{in} - p_s,\\; K - n_{dec} - \\sum_{s' \\prec s} a_{s'}\\Big)

tokens, where :math:`p_s` is the number of its prompt tokens already in its KV
cache (its context), :math:`n_{dec}` the number of decoding sequences and
:math:`s' \\prec s` the prefills admitted before :math:`s`. A running prefill
given :math:`a_s = 0` sits the iteration out: it adds nothing to the
iteration's context sum. A waiting request is admitted at a boundary only while
fewer than ``max_num_seqs`` sequences run *and* tokens are left after the
running sequences' allocation; it takes :math:`\\min(c, l_{in}, \\text{left})`
(a request without a prompt takes its one decode token). Its first token comes
at the end of the iteration that writes its last prompt token, and
:math:`l_{out}` decode iterations follow, as without a budget.

The allocation changes only at events, so the jump :math:`T(m)` stays exact with

.. math:: C_0 = \\sum_{s \\in dec} x_s + \\sum_{s \\in pf,\\, a_s > 0} p_s, \\qquad
          g = n_{dec} + \\sum_{s \\in pf} a_s .

The events of a budgeted replica are decode completions, prefill ends and the
start of a prefill's short last piece: with allocation :math:`a` and
:math:`r` prompt tokens left, a prefill's allocation next changes after
:math:`\\lfloor r / a \\rfloor` iterations (and it ends there when :math:`a`
divides :math:`r`). Every event recomputes the allocation (prefills are few).
An arrival joining at a boundary that is not an event takes what the constant
allocation leaves; one joining at an event boundary waits for that event's
admissions, so the running sequences are served first.

A budget of at least ``max_num_seqs`` :math:`\\times c` never binds
(:attr:`SimPool.budget_binds`): such pools run the plain path, bit for bit as
without a budget. The budgeted handlers live in :mod:`fleetopt.solvers.des.budget`.
Slot mode has no iterations and refuses a budget. An overcommitted pool with a
budget is refused as well: its block events are computed from steps of
:math:`c` tokens, which a budget breaks.

Live routing (spillover)
------------------------
A router that is also a :class:`fleetopt.solvers.des.routing.LiveRouter` (it has
``spill_to`` and ``spill_bound``) routes before the run like any other; then,
at each accepted request's arrival (after the heap events at that instant and
the earlier arrivals, rule 1 below), the engine reads the primary pool's
waiting queue: the requests in that pool not yet admitted to a slot or batch,
summed over its replicas (slot mode: the pool's FCFS queue or its replicas'
queues; an overcommitted pool's preempted sequences waiting for readmission
count too). When that number exceeds ``spill_bound`` and the request fits the
window of the pool ``spill_to`` names, the request goes there instead. One hop
only: the second pool's queue is not consulted, and a request never spills
twice. The per-request columns that depend on the pool (its pool index, its
prefill chunks, its slot service and prefill times) are recomputed for a
spilled request, and :attr:`SimResult.spilled` counts the requests spilled out
of each pool. Runs without a live router do not pay for any of this
(:mod:`fleetopt.solvers.des.spill`).

Dispatch within a pool
----------------------
With per-replica queues (iteration mode; slot mode with ``queue="replica"``)
a :class:`fleetopt.solvers.des.routing.Dispatch` picks the replica at each
arrival, before the request is counted, from two live per-replica counts:
*outstanding* (running plus waiting; join-shortest-queue) and *waiting* (the
requests queued and not yet admitted; least-queue, the reference tool's
rule). Waiting means, per path:

* plain iteration replicas: the replica's FCFS queue (requests held back by a
  full batch);
* overcommitted replicas (KV blocks): the queue, which also holds the
  preempted sequences waiting for readmission and requests held back for
  lack of blocks;
* budgeted replicas: the queue, which also holds requests held back because
  no tokens are left;
* slot mode: the replica's FCFS queue (requests held back by full slots).

On overcommitted and budgeted replicas a request that arrives at a free
replica but whose joining boundary is an event waits in the queue only for
that event's admissions (``deferred``); the plain path would admit it at that
boundary, so it does not count as waiting, as for the live router's queue
below.

Cap changes
-----------
A run may change a pool's batch cap at given instants (``cap_changes``, a sequence of
:class:`fleetopt.solvers.des.state.CapChange`): a demand-response event lowers ``max_num_seqs``
while the fleet is loaded, and may restore it later. The cap only gates admission, as in vLLM's
scheduler, which admits a waiting request only while fewer than ``max_num_seqs`` requests run and
never preempts a running one for the cap [4]_:

* *lowered*: no running sequence is preempted; the replica admits nothing until its batch is below the
  new cap, so the batch drains to it as sequences complete (the power follows the batch it actually runs);
* *raised*: the requests waiting at a replica join at its first iteration boundary at or after the change
  (at once on an idle replica), as an arrival to a replica with free places does, up to the new cap.

A change is a heap event scheduled before the run starts, so it comes before every other event and arrival
at its instant; simultaneous changes apply in the order given. Iteration mode, plain replicas only (not
overcommitted, no binding token budget), and at most the pool's configured ``max_num_seqs``, which sizes
its power table and its slot count (utilisation stays busy slot-seconds over the configured slots). A
change after the last completion of a run without a horizon extends the run's end to it.

Order of simultaneous events
----------------------------
1. Events on the heap (a slot freed, a replica boundary) come before arrivals
   at the same instant; among themselves, in the order they were scheduled
   (the heap's sequence number). Without a live router either order of an
   arrival and a departure at one instant gives the same waits: a freed slot
   or batch place goes to the queue head, and an arrival joins the back of the
   queue. A live router's decision does depend on it: it sees the queue after
   the departure.
2. At a replica boundary, every sequence whose prefill ends or which completes
   there is handled first (in request order), then (overcommitted pools)
   block needs and preemptions, or (budgeted pools) the token allocation,
   then waiting requests are admitted FCFS into the freed places, then the
   replica's next boundary is scheduled. On an overcommitted or budgeted pool
   an arrival whose joining boundary is an event boundary waits for that
   event's admissions.
3. A request arriving at a busy replica joins at the first iteration boundary
   at or after its arrival; an iteration in progress is never joined. An idle
   replica starts an iteration at once.

Arrivals are exogenous and sorted, so they are merged into the loop from their
array instead of being pushed onto the heap.

The plain loop
--------------
When every replica of an iteration-mode run is plain (no KV overcommit, no binding token budget) and no live
router moves requests, the loop runs as one function with the plain handlers inlined (:func:`_plain_loop`):
arrivals and boundaries of the long runs of ``fleetopt simulate`` spent most of their time calling the small
closures (``after``, ``advance``, ``admit``, ``reschedule``, ``batch_to``, ``system_to``) rather than in them,
and the inlined loop takes about a quarter less CPU time for the same records, bit for bit
(``tests/test_des_fused.py`` runs every case both ways; ``tests/test_des_regression.py`` pins the figures).
The closures stay the reference, and serve the other paths, cap changes and live routing.

The compiled loop
-----------------
Where the optional extension :mod:`fleetopt.solvers.des._cloop` was built (``solvers/des/_cloop.c``; ``pip
install`` compiles it where a C compiler is found and installs without it where none is), a plain run dispatched
by :class:`~fleetopt.solvers.des.routing.JoinShortestQueue`, with no cap change and no activity-metered profile,
runs the same loop compiled: the station's state as C arrays, the same events in the same order and the same
floating-point operations in the same order (compiled without fused multiply-adds), so the records are the same bit
for bit (``tests/test_des_compiled.py`` runs fixed and random fleets and a whole ``simulate`` report both ways).
It takes a tenth to a sixteenth of the Python loop's time. :func:`_plain_loop` stays the reference and serves
every other plain run.

Records
-------
Every request leaves exactly one record: ``COMPLETED`` (all times known),
``UNFINISHED`` (in the system or not yet arrived at the horizon; times after
the horizon are NaN) or ``REJECTED`` (no pool takes it, or it is longer than
its pool's context window; never served, times NaN). Per pool the run also
integrates the number in system (for Little's law), busy slot-seconds
(utilisation), and per replica the batch and the power
:math:`\\int P(b(t))\\,dt` exactly over the piecewise-constant batch
:math:`b(t)` (:class:`fleetopt.models.power.PowerCurve`), all over the observation
window ``[warmup_s, end]``.

Power
-----
A profile whose power follows activity (:class:`fleetopt.models.power.ActivityPower`, fitted to measured board
power) draws per iteration the time-weighted mean of a weights, a KV-scan and a compute power, capped at the
board limit. Between two events of a replica its :math:`m` iterations take :math:`mW` of weight streaming,
:math:`h(mC_0 + G m(m-1)/2)` of KV scan and :math:`m D_0 + D_1 m(m-1)/2` of compute (the jump's terms), so
their energy is summed in closed form; the board limit caps the mean over those :math:`m` iterations (exact
while it does not bind; when it binds within a span of changing composition, the per-iteration cap would
give at most as much). Idle time draws ``idle_w``. Every iteration-mode path credits it (plain, KV overcommit,
token budget); slot mode has no iterations and refuses such profiles.

Compute terms (a profile's per-sequence decode compute :math:`g` and prefill compute :math:`aP + bP^2`) enter
every iteration-mode path: the plain and KV paths split a prompt's compute evenly over its chunks
(:func:`fleetopt.models.service.prefill_compute_terms`; a recomputed prefill after a preemption pays for its
longer prompt), the budget path charges each piece its exact causal compute (:mod:`fleetopt.solvers.des.budget`).

References
----------
.. [1] W. Kwon et al., "Efficient Memory Management for Large Language Model
       Serving with PagedAttention", SOSP 2023 (continuous batching in vLLM).
.. [2] L. Kleinrock, *Queueing Systems Vol. 1*, Wiley 1975 (M/G/c, Little's law).
.. [3] vLLM's chunked-prefill scheduling as in its V0 scheduler (``vllm/core/scheduler.py``,
       ``_schedule_chunked_prefill``: decodes first, then prefill chunks, then new requests, within
       ``max_num_batched_tokens``). The V1 scheduler (``vllm/v1/core/sched/scheduler.py``) walks the
       running requests in admission order instead, so under a tight budget its decodes can stall; the
       decode-first rule here is the V0 one.
.. [4] vLLM's V1 scheduler (``vllm/v1/core/sched/scheduler.py``, ``schedule``): running requests are
       scheduled first; waiting ones only while ``len(self.running) < self.max_num_running_reqs``.
"""

from __future__ import annotations

import functools
import heapq
import importlib
import math
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

from fleetopt.models.power import ActivityPower
from fleetopt.models.service import compute_coefficients, iteration_coefficients, prefill_chunks, prefill_compute_terms
from fleetopt.solvers.des.records import SimResult
from fleetopt.solvers.des.routing import Dispatch, JoinShortestQueue, LiveRouter, Requests, Router
from fleetopt.solvers.des.spill import live_targets, spill_arrivals
from fleetopt.solvers.des.state import MODES, QUEUES, CapChange, EventKind, SimPool, _State

__all__ = ["simulate", "CapChange"]

def simulate(pools: Sequence[SimPool], requests: Requests, router: Router, *, mode: str = "iteration",
             queue: str | None = None, dispatch: Dispatch | None = None, horizon_s: float | None = None,
             warmup_s: float = 0.0, cap_changes: Sequence[CapChange] = ()) -> SimResult:
    """Simulate ``requests`` through ``pools``; every request gets exactly one record.

    Parameters
    ----------
    pools : sequence of SimPool
        The pools, with unique names.
    requests : Requests
        Arrival instants and lengths (and, for slot mode, optional service times).
    router : Router
        Picks each request's pool by name before the run (:mod:`fleetopt.solvers.des.routing`);
        a :class:`~fleetopt.solvers.des.routing.LiveRouter` may then move a request at its
        arrival (module docstring, "Live routing").
    mode : {"iteration", "slot"}
        Service model (see the module docstring).
    queue : {"pool", "replica"} or None
        Slot mode: one FCFS queue per pool (default; M/G/c) or per replica.
        Iteration mode always queues per replica (None or "replica").
    dispatch : Dispatch or None
        Replica choice on arrival when queueing per replica (default
        :class:`~fleetopt.solvers.des.routing.JoinShortestQueue`; also
        :class:`~fleetopt.solvers.des.routing.LeastQueue` and
        :class:`~fleetopt.solvers.des.routing.RoundRobin`; module docstring,
        "Dispatch within a pool").
    horizon_s : float or None
        Stop at this instant (requests still in flight are ``UNFINISHED``);
        None runs until every accepted request completes.
    warmup_s : float
        Start of the window of the time integrals (per-request columns are unaffected).
    cap_changes : sequence of CapChange
        Batch caps that change during the run (module docstring, "Cap changes"); iteration mode, plain pools.

    Returns
    -------
    SimResult

    Raises
    ------
    ValueError
        For an unknown ``mode`` or ``queue``, a router naming an unknown pool,
        duplicate pool names, service times outside slot mode, a pool with a
        token budget or overcommitted in slot mode, a bad horizon, or a cap
        change outside iteration mode, of an unknown, overcommitted or
        budget-bound pool, or above the pool's ``max_num_seqs``.

    Notes
    -----
    Time averages (number in system, batch, power, utilisation) cover
    ``[warmup_s, end]``; without a horizon the end is the last completion, so
    the window includes the drain after the last arrival. For steady-state
    averages pass a horizon (e.g. the last arrival instant) and a warm-up.

    Examples
    --------
    >>> from fleetopt.models.power import PowerCurve
    >>> from fleetopt.models.profiles import CalibratedProfile
    >>> from fleetopt.solvers.des.records import Outcome
    >>> from fleetopt.solvers.des.routing import LengthRouter, Requests
    >>> gpu = CalibratedProfile("g", "m", 0.004, 0.00032, 8192, 1024, 16, 65536, 256, 1.0, 1,
    ...     PowerCurve(300.0, 600.0, 1.0, 4.2, "measured"))
    >>> req = Requests(np.array([0.0, 0.001]), np.array([1500, 200]), np.array([20, 5]))
    >>> res = simulate([SimPool("p", gpu, 1, None, 4096)], req, LengthRouter([0, 4096], ["p"]))
    >>> [Outcome(int(k)).name for k in res.outcome]
    ['COMPLETED', 'COMPLETED']
    >>> float(res.start_at_s[1])      # joins when the first 4 ms iteration (context 0) ends
    0.004
    """
    if not isinstance(requests, Requests):
        raise ValueError(f"requests must be a Requests stream; got {type(requests).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    queue = queue if queue is not None else ("pool" if mode == "slot" else "replica")
    if queue not in QUEUES:
        raise ValueError(f"queue must be one of {QUEUES}; got {queue!r}")
    if mode == "iteration" and queue != "replica":
        raise ValueError("mode='iteration' queues per replica (vLLM schedules each replica); use queue='replica'")
    if mode == "iteration" and requests.service_s is not None:
        raise ValueError("requests.service_s applies to mode='slot' only; "
                         "iteration mode derives service from the profile")
    pools = list(pools)
    if not pools:
        raise ValueError("simulate needs at least one pool")
    if mode == "slot" and any(p.overcommitted for p in pools):
        raise ValueError("mode='slot' has no KV blocks: max_num_seqs above n_slots(window) needs mode='iteration'")
    budgeted = [p.name for p in pools if p.max_batched_tokens is not None]
    if mode == "slot" and budgeted:
        raise ValueError(f"pools {budgeted}: max_batched_tokens needs mode='iteration' (slot mode has no iterations)")
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pool names must be unique; got {names}")
    unknown = [x for x in router.pool_names if x not in names]
    if unknown:
        raise ValueError(f"router {router!r} names unknown pools {unknown}; known: {', '.join(names)}")
    hi_s = math.inf if horizon_s is None else float(horizon_s)
    if not (0 < hi_s < math.inf or horizon_s is None):
        raise ValueError(f"horizon_s must be finite and > 0, or None; got {horizon_s}")
    if not 0.0 <= warmup_s < hi_s:
        raise ValueError(f"warmup_s must lie in [0, horizon_s); got {warmup_s}")
    dispatch = JoinShortestQueue() if dispatch is None else dispatch
    if not isinstance(dispatch, Dispatch):
        raise ValueError(f"dispatch must be a Dispatch policy; got {dispatch!r}")

    n = len(requests)
    routed = np.asarray(router.route(requests.prompt_tokens, requests.output_tokens), dtype=np.int64)
    if routed.shape != (n,) or np.any((routed < -1) | (routed >= len(router.pool_names))):
        raise ValueError(f"router {router!r} returned pool indices outside [-1, {len(router.pool_names)})")
    to_pool = np.array([names.index(x) for x in router.pool_names] + [-1], dtype=np.int64)
    pool_of = to_pool[routed]                      # routed == -1 picks the trailing -1
    window = np.array([p.window_tokens for p in pools] + [0])
    accepted = (pool_of >= 0) & (requests.total_tokens <= window[pool_of])

    del routed
    state = _State(pools, n, float(warmup_s), hi_s)
    if mode == "slot" and any(isinstance(p.profile.power, ActivityPower) for p in pools):
        raise ValueError("slot mode has no iterations: a profile with activity power needs mode='iteration'")
    if mode == "slot":
        if cap_changes:
            raise ValueError("cap changes need mode='iteration' (slot mode has one fixed cap per pool)")
        from fleetopt.solvers.des.slot import slot_station      # each path's handlers load with its first run

        arrive, serve, queued, reroute = slot_station(state, pools, requests, pool_of, accepted, queue, dispatch,
                                                      EventKind.SLOT_FREED)
        set_cap = fused = None
    else:
        station = IterationStation(state, pools, requests, pool_of, dispatch)
        arrive, serve, queued, reroute, set_cap = (station.arrive, station.serve, station.queued, station.reroute,
                                                   station.set_cap)
        fused = station if _FUSED and not any(station.path) else None
        del station
    if cap_changes:
        serve = _with_cap_changes(state, serve, set_cap, pools, tuple(cap_changes))
    if isinstance(router, LiveRouter):
        spill_to = live_targets(router, names)
        arrive = spill_arrivals(arrive, queued, reroute, pool_of, spill_to, router.spill_bound,
                                requests.total_tokens, [p.window_tokens for p in pools], state.spilled)
    if isinstance(router, LiveRouter):
        fused = None                        # a live router moves requests: the closures
    jsq = type(dispatch) is JoinShortestQueue
    # the compiled plain loop where it applies (module docstring): JSQ, nothing metered, no cap change on the heap
    compiled = _compiled_loop() if fused is not None and jsq and not fused.metered and not state.heap else None
    if compiled is not None:
        order = np.flatnonzero(accepted).astype(np.int64)
        last_at, events = compiled.run(fused, state, np.ascontiguousarray(requests.arrival_at_s[order], dtype=float),
                                       order, hi_s)
    elif fused is not None:                 # every replica plain: the inlined loop
        last_at, events = _plain_loop(fused, state, serve, jsq, _arrival_chunks(requests.arrival_at_s, accepted), hi_s)
    else:
        last_at, events = _run(state.heap, arrive, serve, _arrival_chunks(requests.arrival_at_s, accepted), hi_s)
    del fused
    del arrive, serve, queued, reroute, set_cap
    end_s = hi_s if horizon_s is not None else max(last_at, float(warmup_s))
    for hook in state.finish:
        hook(end_s)
    return state.result(mode, tuple(names), requests, pool_of, accepted, end_s, events)


def _with_cap_changes(state: _State, serve, set_cap, pools: list[SimPool], changes: tuple[CapChange, ...]):
    """Check ``changes``, push them onto the heap (before any other event, so they come first at their instant)
    and return ``serve`` extended with their handler (module docstring, "Cap changes")."""
    names = [p.name for p in pools]
    for c in changes:
        if not isinstance(c, CapChange):
            raise ValueError(f"cap_changes must hold CapChange records; got {c!r}")
        if c.pool not in names:
            raise ValueError(f"cap change names unknown pool {c.pool!r}; known: {', '.join(names)}")
        p = pools[names.index(c.pool)]
        if p.overcommitted or p.budget_binds:
            raise ValueError(f"cap change of pool {p.name}: caps change on plain pools only (not overcommitted, "
                             "no binding token budget)")
        if c.max_num_seqs > cast(int, p.max_num_seqs):      # an int once the pool is built
            raise ValueError(f"cap change of pool {p.name}: max_num_seqs {c.max_num_seqs} is above the pool's "
                             f"configured {p.max_num_seqs}, which sizes its power table and slots")
    for k, c in enumerate(changes):
        heapq.heappush(state.heap, (c.at_s, next(state.counter), EventKind.CAP_CHANGE, k))
    pool_index = {x: k for k, x in enumerate(names)}
    CAP = EventKind.CAP_CHANGE

    def serve_or_change(at: float, seq: int, kind, target: int) -> None:
        if kind == CAP:
            c = changes[target]
            set_cap(pool_index[c.pool], c.max_num_seqs, at)
        else:
            serve(at, seq, kind, target)

    return serve_or_change


_FUSED = True
"""Run :func:`_plain_loop` where every replica is plain and no live router moves requests (the same records; tests
switch it off to compare the two loops)."""

_COMPILED = True
"""Run the compiled plain loop (:mod:`fleetopt.solvers.des._cloop`) where it is built and applies (module docstring,
"The compiled loop"); tests switch it off to compare it with :func:`_plain_loop`."""


@functools.cache
def _compiled_module() -> Any:
    """The compiled plain loop's module, or None where the optional extension was not built (no C compiler at
    install): the Python loop then runs, with the same records."""
    try:
        return importlib.import_module("fleetopt.solvers.des._cloop")
    except ImportError:
        return None


def _compiled_loop() -> Any:
    """The compiled loop's module when :data:`_COMPILED` is on and it is built, else None."""
    return _compiled_module() if _COMPILED else None


_CHUNK = 1 << 16

def _arrival_chunks(arrival_at_s: np.ndarray, accepted: np.ndarray) -> Iterator[tuple[list, list]]:
    """The accepted requests' arrival instants and indices as Python lists, ``_CHUNK`` requests at a time.

    Only one chunk is materialised at once, so the engine's memory does not grow
    with Python objects per request of the whole run.
    """
    n = len(arrival_at_s)
    for lo in range(0, n, _CHUNK):
        idx = np.flatnonzero(accepted[lo:lo + _CHUNK])
        if idx.size:
            idx += lo
            yield arrival_at_s[idx].tolist(), idx.tolist()


def _run(heap: list, arrive, serve, chunks: Iterator[tuple[list, list]], horizon_s: float) -> tuple[float, int]:
    """The engine loop: merge the sorted arrivals with the event heap until both run dry or the horizon.

    Heap entries are ``(at_s, sequence number, EventKind, target)``; the
    sequence number (an ``itertools.count``) breaks ties, so kinds and targets
    are never compared. A heap event at the same instant as an arrival is
    handled first (module docstring, "Order of simultaneous events").
    Arrivals come in chunks (:func:`_arrival_chunks`); each chunk's list of
    instants ends with ``inf`` as a sentinel, so a chunk's end is noticed only
    when its sentinel is reached.
    Returns the instant of the last event handled and the number of events.
    """
    pop = heapq.heappop
    inf = math.inf
    times, order = next(chunks, ([], []))
    times.append(inf)
    j, events, last_at = 0, 0, 0.0
    next_arrival = times[0]
    while True:
        service_at = heap[0][0] if heap else inf
        if service_at <= next_arrival:
            if service_at > horizon_s or service_at == inf:
                break
            at, seq, kind, target = pop(heap)
            serve(at, seq, kind, target)
        else:
            at = next_arrival
            if at > horizon_s:
                break
            arrive(at, order[j])
            j += 1
            next_arrival = times[j]
            if next_arrival == inf:               # the chunk's sentinel (arrival instants are finite)
                nxt = next(chunks, None)
                if nxt is not None:
                    times, order = nxt
                    times.append(inf)
                    j = 0
                    next_arrival = times[0]
        events += 1
        last_at = at
    return last_at, events


_PLAIN, _TRACKED, _BUDGETED = 0, 1, 2
"""Paths of an iteration-mode replica: plain, KV blocks tracked (overcommitted), token budget (binding)."""


class IterationStation:
    r"""The replicas of iteration mode and their event handlers (module docstring: the closed-form jump
    :math:`T(m)`).

    :func:`simulate` calls ``arrive(now, i)`` for each accepted request, ``serve(at, seq, kind, r)`` for each
    replica boundary popped from the heap, :meth:`set_cap` for a cap change, and, with a live router,
    :meth:`queued` and :meth:`reroute`. Each replica follows one of three paths (``path[r]``): the plain one
    (:data:`_PLAIN`, :func:`_plain_handlers`), that of :mod:`fleetopt.solvers.des.kv` (:data:`_TRACKED`,
    overcommitted pools) or that of :mod:`fleetopt.solvers.des.budget` (:data:`_BUDGETED`, a binding token
    budget). The station owns the state below; each path's handlers are built from it by a factory
    (:func:`_anchor_functions`, :func:`_plain_handlers`, ``kv_handlers``, ``budget_handlers``) and read and
    mutate it in place: they keep references to its lists, and the station never rebinds one.

    The handlers that run at every arrival and event are closures over the station's lists, not methods: on
    the engine benchmark's workload (``fleetopt bench``, 12 H100 replicas) methods reading the same state
    through ``self`` took 7 to 18 % more CPU time, the closures the same as before. The rarely run handlers
    are methods.

    A replica is described between its events by an *anchor*: ``it[r]`` iterations done at instant
    ``ref[r]``, where the iteration starting then has total context ``c0[r]`` and compute ``d0[r]``, and each
    later iteration adds ``g[r]`` tokens and ``d1[r]`` seconds of compute, so boundary ``it + m`` comes at
    :meth:`after` ``(r, m)`` :math:`= ref + T(m)`. Its sequences' next events are integer keys on its heap
    ``seqs[r]``: ``index * M + 4 i + kind`` for request ``i`` at iteration ``index``, kind 0 its prefill ends,
    1 it completes (kinds 2 and 3 are the KV path's block crossings and wake-ups; a budgeted replica keeps
    kind 1 only). Only the replica's next event sits on the global heap, tagged with ``token[r]``, the
    sequence number of its latest schedule; an entry with another number is stale and ignored.

    State (``r`` a global replica index, ``i`` a request index, ``p`` a pool index). *Written by*: ``init``
    is fixed at construction; ``plain`` the handlers here; ``kv`` and ``budget`` the other paths' handlers;
    ``reroute`` a live router's move of a request.

    =================  =========================================================  ==========  ==================
    Attribute          Meaning                                                    Units       Written by
    =================  =========================================================  ==========  ==================
    *Per request (memoryviews of numpy columns, Python numbers in and out)*
    ------------------------------------------------------------------------------------------------------------
    ``start``          admission instant (the record column; NaN until then)      s           plain, kv, budget
    ``first``          first-token instant (record column)                        s           plain, kv, budget
    ``end``            completion instant (record column)                         s           plain, kv, budget
    ``rep``            replica the request was dispatched to (record column)      index       plain
    ``lin``            prompt length :math:`l_{in}` (KV: grows by a preemption)   tokens      init, kv
    ``kch``            prefill chunks :math:`\lceil l_{in}/c \rceil`              iterations  init, kv, reroute
    ``lout``           decode steps left :math:`l_{out}`                          iterations  init, kv
    ``rpool``          the request's pool                                         index       init, reroute
    ``alpha``          compute of its first prefill chunk                         s           init, kv, reroute
    ``beta``           growth of that compute per further chunk                   s           init, kv, reroute
    *Per replica, configuration (lists, fixed)*
    ------------------------------------------------------------------------------------------------------------
    ``W``, ``h``       iteration time :math:`W + h \sum_s x_s`                    s, s/token  init
    ``gd``             compute of one decode step of one sequence                 s           init
    ``chunk``          prefill chunk :math:`c`                                    tokens      init
    ``path``           :data:`_PLAIN`, :data:`_TRACKED` or :data:`_BUDGETED`      code        init
    ``tokens``         token budget :math:`K` (0 off the budget path)             tokens      init
    ``blk``            KV block size                                              tokens      init
    ``blocks``         KV blocks (0 off the KV path)                              blocks      init
    ``act``            activity power ``(weights, kv, compute, limit)`` or None   W           init
    ``prefill_ab``     profile's prefill compute :math:`(a, b)`                   s/token...  init
    ``profiles``       the replica's serving profile                              -           init
    ``replica_pool``   the replica's pool (the run's list)                        index       init
    *Per replica, live (lists mutated in place)*
    ------------------------------------------------------------------------------------------------------------
    ``it``             iterations done at the anchor                              iterations  plain, kv, budget
    ``ref``            anchor instant (an iteration boundary)                     s           plain, kv, budget
    ``c0``             total start-of-iteration context at the anchor             tokens      plain, kv, budget
    ``g``              growth of that context per iteration                       tokens      plain, kv, budget
    ``d0``             compute of the anchor iteration (0.0 without compute)      s           plain, kv, budget
    ``d1``             growth of that compute per iteration                       s           plain, kv, budget
    ``seqs``           heap of event keys ``index * M + 4 i + kind``              key         plain, kv, budget
    ``waiting``        FCFS queue of requests not admitted (deque)                index       plain, kv, budget
    ``deferred``       head of ``waiting`` only waiting for this boundary's       requests    kv, budget
                       admissions (the plain path would admit them)
    ``token``          sequence number of the replica's live heap entry, -1 none  count       plain, kv, budget
    ``run``            running sequences (the run's ``batch``)                    sequences   plain, kv, budget
    ``cap``            batch cap ``max_num_seqs`` now (the run's list)            sequences   init, set_cap
    ``outstanding``    running plus waiting, for dispatch (the run's list)        requests    plain, kv, budget
    ``preemptions``    KV preemptions (the run's list)                            count       kv
    ``energy``         activity-power energy credited (the run's list)            J           credit
    *Shared with the run (:class:`~fleetopt.solvers.des.state._State`)*
    ------------------------------------------------------------------------------------------------------------
    ``heap``           global event heap ``(at_s, seq, kind, r)``                 -           plain, kv, budget
    ``counter``        heap sequence numbers                                      -           plain, kv, budget
    ``batch_to``       integrate replica ``r``'s batch and power up to ``t``      -           -
    ``system_to``      integrate pool ``p``'s number in system, then change it    -           -
    ``choose``         the dispatch policy bound to the live counts               -           init
    ``lo_s``           start of the observation window (``warmup_s``)             s           init
    ``hi_s``           its end (the horizon, or infinity)                         s           init
    ``ranges``         the replicas of each pool (``range`` per pool)             index       init
    ``pools``          the run's pools (:class:`SimPool`)                         -           init
    ``M``              key stride: ``4 * max(n, 1)``                              -           init
    ``metered``        any replica with activity power (then ``credit`` counts)   bool        init
    *Handlers (closures bound at construction; see the factories)*
    ------------------------------------------------------------------------------------------------------------
    ``after``          ``(r, m)``: instant of boundary ``it + m``                 s           -
    ``boundary_at``    ``(r, now)``: iterations to the first boundary >= ``now``  iterations  -
    ``credit``         ``(r, m)``: energy of the next ``m`` iterations            -           -
    ``advance``        ``(r, now)``: move the anchor to that boundary             -           -
    ``arrive``         ``(now, i)``: dispatch and admit or queue request ``i``    -           -
    ``serve``          ``(at, seq, kind, r)``: a replica boundary                 -           -
    ``admit``          ``(r, i, b)``: request ``i`` joins at the anchor ``b``     -           -
    ``reschedule``     ``(r)``: push the replica's next boundary                  -           -
    ``arrive_*``,      the KV and budget paths' handlers (:data:`_TRACKED`,       -           -
    ``serve_*``        :data:`_BUDGETED` replicas only)
    =================  =========================================================  ==========  ==================
    """

    __slots__ = (
        "start", "first", "end", "rep", "lin", "kch", "lout", "rpool", "alpha", "beta",
        "W", "h", "gd", "chunk", "path", "tokens", "blk", "blocks", "act", "prefill_ab", "profiles", "replica_pool",
        "it", "ref", "c0", "g", "d0", "d1", "seqs", "waiting", "deferred", "token", "run", "cap", "outstanding",
        "preemptions", "energy", "lo_s", "hi_s",
        "heap", "counter", "batch_to", "system_to", "choose", "M", "metered", "boundary_kind", "ranges", "pools",
        "after", "boundary_at", "credit", "advance", "arrive", "serve", "admit", "reschedule",
        "arrive_tracked", "serve_tracked", "arrive_budget", "serve_budget",
    )

    def __init__(self, st: _State, pools: list[SimPool], requests: Requests, pool_of: np.ndarray,
                 dispatch: Dispatch) -> None:
        n = len(requests)
        chunks = np.zeros(n, dtype=np.int32)
        alpha = np.zeros(n)
        beta = np.zeros(n)
        for k, p in enumerate(pools):
            sel = pool_of == k
            chunks[sel] = prefill_chunks(p.profile, requests.prompt_tokens[sel])
            if any(compute_coefficients(p.profile)[1:]):
                alpha[sel], beta[sel] = prefill_compute_terms(p.profile, requests.prompt_tokens[sel])
        # Per-request inputs read through memoryviews of the arrays (Python numbers out, no per-request lists).
        # Overcommitted pools track KV blocks; a preempted request's prefill length, chunks and remaining
        # decode steps change, so those columns are then private copies.
        any_trk = any(p.overcommitted for p in pools)
        self.lin, self.kch, self.lout, self.rpool = (
            (np.array(a) if any_trk else np.ascontiguousarray(a)).data
            for a in (requests.prompt_tokens, chunks, requests.output_tokens, pool_of))
        self.alpha: Any = alpha.data
        self.beta: Any = beta.data
        self.start: Any = st.start
        self.first: Any = st.first
        self.end: Any = st.end
        self.rep: Any = st.rep
        self.M = 4 * max(n, 1)

        self.W, self.h, self.gd, self.chunk, self.path = [], [], [], [], []
        self.tokens, self.blk, self.blocks, self.act, self.prefill_ab, self.profiles = [], [], [], [], [], []
        for p in pools:
            prof, k = p.profile, p.replicas
            pw = prof.power
            self.act += [(pw.weights_w, pw.kv_w, pw.compute_w, pw.limit_w) if isinstance(pw, ActivityPower)
                         else None] * k
            w0, h0 = iteration_coefficients(prof)
            self.W += [w0] * k
            self.h += [h0] * k
            self.gd += [compute_coefficients(prof)[0]] * k
            self.chunk += [int(prof.chunk_tokens)] * k
            self.path += [_TRACKED if p.overcommitted else _BUDGETED if p.budget_binds else _PLAIN] * k
            self.tokens += [p.max_batched_tokens or 0] * k
            self.blk += [int(prof.blk_size_tokens)] * k
            self.blocks += [int(getattr(prof, "total_kv_blocks", 0)) if p.overcommitted else 0] * k
            self.prefill_ab += [(float(prof.prefill_a_s), float(prof.prefill_b_s))] * k
            self.profiles += [prof] * k
        R = len(self.W)
        self.it, self.ref, self.c0, self.g = [0] * R, [0.0] * R, [0] * R, [0] * R
        # Both stay 0.0 for profiles without compute terms, so their arithmetic is exactly the context-only jump.
        self.d0, self.d1 = [0.0] * R, [0.0] * R
        self.seqs: list[list[int]] = [[] for _ in range(R)]
        self.waiting: list[deque[int]] = [deque() for _ in range(R)]
        self.deferred = [0] * R
        self.token = [-1] * R
        self.run, self.cap, self.outstanding, self.replica_pool = st.batch, st.cap, st.outstanding, st.replica_pool
        self.preemptions, self.energy, self.lo_s, self.hi_s = st.preempt, st.energy, st.lo_s, st.hi_s
        self.heap, self.counter, self.batch_to, self.system_to = st.heap, st.counter, st.batch_to, st.system_to
        self.ranges, self.pools = st.ranges, pools
        self.boundary_kind = EventKind.BOUNDARY
        self.metered = any(a is not None for a in self.act)
        self.choose = dispatch.bind(st.ranges, self.outstanding, self.waiting_at)
        st.finish.append(self.finish)
        # The handlers last, in this order: each factory binds the state and the functions built before it.
        self.after, self.boundary_at, self.credit, self.advance = _anchor_functions(self)
        self.arrive_tracked = self.serve_tracked = self.arrive_budget = self.serve_budget = _unused
        if _TRACKED in self.path:
            from fleetopt.solvers.des.kv import kv_handlers

            self.arrive_tracked, self.serve_tracked = kv_handlers(self)
        if _BUDGETED in self.path:
            from fleetopt.solvers.des.budget import budget_handlers

            self.arrive_budget, self.serve_budget = budget_handlers(self)
        self.arrive, self.serve, self.admit, self.reschedule = _plain_handlers(self)

    def set_cap(self, p: int, n: int, now: float) -> None:
        """Pool ``p``'s replicas get batch cap ``n`` at ``now`` (module docstring, "Cap changes"): a lower cap
        only stops admissions; a higher one admits the waiting requests at each replica's next boundary."""
        run, ref = self.run, self.ref
        for r in self.ranges[p]:
            self.cap[r] = n
            q = self.waiting[r]
            if not q or run[r] >= n:
                continue
            if not run[r]:
                ref[r] = now
            elif now > ref[r]:
                self.advance(r, now)
            self.batch_to(r, ref[r])
            while q and run[r] < n:
                self.admit(r, q.popleft(), ref[r])
            self.reschedule(r)

    # ---- queues, live routing and the end of a run ----

    def waiting_at(self, r: int) -> int:
        """Requests waiting at replica ``r`` (module docstring, "Dispatch within a pool"): its queue, less those
        only deferred to an event boundary's admissions (``deferred``), which the plain path admits."""
        return len(self.waiting[r]) - self.deferred[r]

    def queued(self, p: int) -> int:
        """Requests of pool ``p`` not yet admitted, less those only deferred to an event boundary's admissions
        (``deferred``: the plain path admits such requests at that boundary)."""
        return sum(map(self.waiting_at, self.ranges[p]))

    def reroute(self, i: int, p: int) -> None:
        """Request ``i`` goes to pool ``p`` instead (a live router, before its dispatch): its prefill chunks and
        compute are recomputed for that pool's profile."""
        prof = self.pools[p].profile
        self.rpool[i] = p
        self.kch[i] = int(prefill_chunks(prof, self.lin[i]))
        a_i, b_i = prefill_compute_terms(prof, self.lin[i])
        self.alpha[i], self.beta[i] = float(a_i), float(b_i)

    def prefill_terms(self, r: int, tokens: int) -> tuple[float, float]:
        r""":math:`(\alpha, \beta)` of a prefill of ``tokens`` on replica ``r`` (the KV path's recomputed prefills)."""
        prof = self.profiles[r]
        if not any(compute_coefficients(prof)[1:]):
            return 0.0, 0.0
        a_i, b_i = prefill_compute_terms(prof, tokens)
        return float(a_i), float(b_i)

    def finish(self, end_s: float) -> None:
        """Credit the iterations of replicas still running at the end of a run with a horizon."""
        for r, a in enumerate(self.act):
            if a is not None and self.run[r] and end_s > self.ref[r]:
                self.credit(r, self.boundary_at(r, end_s))


def _anchor_functions(s: IterationStation):
    r"""``after(r, m)``, ``boundary_at(r, now)``, ``credit(r, m)`` and ``advance(r, now)`` over the anchors of
    station ``s`` (:class:`IterationStation`, "the jump"), which every path uses.

    Closures over the station's lists rather than methods: they run at every event, and a closure's reads of
    its free variables are cheaper than attribute reads through ``self``.
    """
    ref, W, h, c0, g, d0, d1, it = s.ref, s.W, s.h, s.c0, s.g, s.d0, s.d1, s.it
    act, energy, lo_s, hi_s, metered = s.act, s.energy, s.lo_s, s.hi_s, s.metered

    def after(r: int, m: float) -> float:
        """Instant of boundary ``it + m``: :math:`ref + T(m)`."""
        return ref[r] + m * (W[r] + h[r] * c0[r] + d0[r]) + (h[r] * g[r] + d1[r]) * (m * (m - 1) // 2)

    def boundary_at(r: int, now: float) -> int:
        r"""Iterations :math:`m` from the anchor to the first boundary at or after ``now`` (0 if ``now <= ref``):
        :math:`T(m) \ge now - ref` solved for :math:`m` (a quadratic), then corrected for round-off."""
        if now <= ref[r]:
            return 0
        w, a = W[r] + h[r] * c0[r] + d0[r], h[r] * g[r] + d1[r]
        x = now - ref[r]
        m = math.ceil(x / w if a == 0 else (math.sqrt((w - a / 2) ** 2 + 2 * a * x) - (w - a / 2)) / a)
        while after(r, m) < now:
            m += 1
        while m > 0 and after(r, m - 1) >= now:
            m -= 1
        return m

    def credit(r: int, m: float) -> None:
        """Energy of the next ``m`` iterations from the anchor on an activity-power replica (module docstring,
        "Power"): weights, KV-scan and compute seconds summed in closed form, the board limit on their mean,
        the part inside the observation window."""
        a = act[r]
        if a is None or m <= 0:
            return
        tri = m * (m - 1) // 2
        ws, kv, cs = m * W[r], h[r] * (m * c0[r] + g[r] * tri), m * d0[r] + d1[r] * tri
        dur = ws + kv + cs
        t0 = ref[r]
        inside = min(t0 + dur, hi_s) - max(t0, lo_s)
        if inside > 0 and dur > 0:
            energy[r] += min(a[3] * dur, a[0] * ws + a[1] * kv + a[2] * cs) * inside / dur

    def advance(r: int, now: float) -> None:
        """Move a running replica's anchor to its first boundary at or after ``now``."""
        m = boundary_at(r, now)
        if metered:
            credit(r, m)
        ref[r] = after(r, m)
        c0[r] += m * g[r]
        d0[r] += m * d1[r]
        it[r] += m

    return after, boundary_at, credit, advance


def _plain_handlers(s: IterationStation):
    """``arrive(now, i)``, ``serve(at, seq, kind, r)``, ``admit(r, i, b)`` and ``reschedule(r)`` of station
    ``s`` (:class:`IterationStation`): the plain path, which also hands a request or a boundary of another
    path's replica to that path's handlers.

    Closures over the station's state, as :func:`_anchor_functions` (they run at every arrival and event).
    """
    it, ref, c0, g, d0, d1, seqs, waiting, token = s.it, s.ref, s.c0, s.g, s.d0, s.d1, s.seqs, s.waiting, s.token
    run, cap, outstanding, replica_pool, path = s.run, s.cap, s.outstanding, s.replica_pool, s.path
    start, first, end, rep, lin, kch, lout, rpool = s.start, s.first, s.end, s.rep, s.lin, s.kch, s.lout, s.rpool
    alpha, beta, chunk, gd, M, metered = s.alpha, s.beta, s.chunk, s.gd, s.M, s.metered
    heap, counter, BOUNDARY, batch_to, system_to, choose = \
        s.heap, s.counter, s.boundary_kind, s.batch_to, s.system_to, s.choose
    after, credit, advance = s.after, s.credit, s.advance
    arrive_tracked, serve_tracked, arrive_budget, serve_budget = \
        s.arrive_tracked, s.serve_tracked, s.arrive_budget, s.serve_budget
    push, pop = heapq.heappush, heapq.heappop

    def admit(r: int, i: int, b: float) -> None:
        """Request ``i`` joins replica ``r``'s batch at the boundary instant ``b`` (the anchor)."""
        run[r] += 1
        start[i] = b
        k = kch[i]
        if k:
            g[r] += chunk[r]
            d0[r] += alpha[i]
            d1[r] += beta[i]
            push(seqs[r], (it[r] + k) * M + 4 * i)
        else:                                   # no prompt: decoding from the start
            first[i] = b
            g[r] += 1
            d0[r] += gd[r]
            push(seqs[r], (it[r] + lout[i]) * M + 4 * i + 1)

    def reschedule(r: int) -> None:
        """Push replica ``r``'s next boundary (the head of its key heap), superseding the one before."""
        if run[r]:
            n = next(counter)
            push(heap, (after(r, seqs[r][0] // M - it[r]), n, BOUNDARY, r))
            token[r] = n
        else:
            token[r] = -1

    def arrive(now: float, i: int) -> None:
        """Request ``i`` arrives at ``now``: dispatch it to a replica, which admits it at its next boundary (at
        once when idle) or queues it."""
        p = rpool[i]
        system_to(p, now, 1)
        r = choose(p)
        outstanding[r] += 1
        rep[i] = r
        if path[r]:
            (arrive_tracked if path[r] == _TRACKED else arrive_budget)(now, i, r)
            return
        if run[r] >= cap[r]:
            waiting[r].append(i)
            return
        if not run[r]:
            ref[r] = now                          # idle: an iteration starts now (c0 = g = 0)
        elif now > ref[r]:
            advance(r, now)
        batch_to(r, ref[r])
        admit(r, i, ref[r])
        reschedule(r)

    def serve(at: float, seq: int, kind: EventKind, r: int) -> None:
        """Replica ``r`` reaches the boundary of heap entry ``seq`` at ``at``: prefills that end there emit their
        first token, sequences that complete leave, and waiting requests take the freed places."""
        if token[r] != seq:
            return                                # superseded by a later schedule of this replica
        if path[r]:
            (serve_tracked if path[r] == _TRACKED else serve_budget)(at, r)
            return
        sq, ch, p = seqs[r], chunk[r], replica_pool[r]
        e = sq[0] // M
        if metered:
            credit(r, e - it[r])
        c, gr = c0[r] + (e - it[r]) * g[r], g[r]
        f0, f1, gdr = d0[r] + (e - it[r]) * d1[r], d1[r], gd[r]
        it[r], ref[r] = e, at
        batch_to(r, at)
        done = 0
        while sq and sq[0] // M == e:
            key = pop(sq)
            i = (key % M) >> 2
            li, lo = lin[i], lout[i]
            if not key & 1:                       # prefill ends: first token; context jumps to l_in
                first[i] = at
                c += li - kch[i] * ch
                gr += 1 - ch
                b_i = beta[i]
                f0 -= alpha[i] + b_i * kch[i]     # its next chunk would have been chunk k
                f1 -= b_i
                if lo:
                    f0 += gdr
                    push(sq, (e + lo) * M + 4 * i + 1)
                    continue
                # no output: it completes at once
            else:
                f0 -= gdr
            end[i] = at
            c -= li + lo
            gr -= 1
            done += 1
            system_to(p, at, -1)
        c0[r], g[r] = c, gr
        run[r] -= done
        d0[r], d1[r] = (f0, f1) if run[r] else (0.0, 0.0)   # an idle replica drops the float residue
        outstanding[r] -= done
        q = waiting[r]
        while q and run[r] < cap[r]:
            admit(r, q.popleft(), at)
        reschedule(r)

    return arrive, serve, admit, reschedule


def _plain_loop(s: IterationStation, st: _State, other, jsq: bool, chunks: Iterator[tuple[list, list]],
                horizon_s: float) -> tuple[float, int]:
    r"""``(last_at, events)`` of :func:`_run` ``(chunks, horizon_s)`` with the handlers of station ``s`` inlined,
    for a run whose replicas are all plain and whose router is not live (module docstring, "The plain loop");
    ``st`` is the run's state and ``other(at, seq, kind, target)`` handles heap entries that are not replica
    boundaries (cap changes). ``jsq``: the run dispatches by :class:`~fleetopt.solvers.des.routing.JoinShortestQueue`,
    whose choice (the first replica of the pool with the fewest outstanding requests) is then made inline.

    It does *exactly* what ``_run`` with :func:`_plain_handlers` and :func:`_anchor_functions` does, in the same
    order and with the same floating-point expressions (the jump :math:`T(m)`, the quadratic for the first
    boundary at or after an arrival, the integrals of the batch, the power and the number in system). Two things
    are grouped differently but exactly: a boundary where several sequences complete integrates the pool's number
    in system once, then lowers it by all of them (the closures' later calls integrate over an empty interval);
    and the jump's two coefficients are read once per event instead of once per evaluation of :math:`T(m)` (the
    same floats). Activity power stays with ``credit`` and any other dispatch with the bound policy ``choose``.
    """
    it, ref, c0, g, d0, d1, seqs, waiting, token = s.it, s.ref, s.c0, s.g, s.d0, s.d1, s.seqs, s.waiting, s.token
    run, cap, outstanding, replica_pool = s.run, s.cap, s.outstanding, s.replica_pool
    start, first, end, rep, lin, kch, lout, rpool = s.start, s.first, s.end, s.rep, s.lin, s.kch, s.lout, s.rpool
    alpha, beta, chunk, gd, W, h, M, metered = s.alpha, s.beta, s.chunk, s.gd, s.W, s.h, s.M, s.metered
    heap, counter, BOUNDARY, choose, credit = s.heap, s.counter, s.boundary_kind, s.choose, s.credit
    lo_s, hi_s = st.lo_s, st.hi_s
    spans = [(x.start, x.stop) for x in s.ranges]
    batch_last, batch_area, energy, power = st.batch_last, st.batch_area, st.energy, st.power
    in_system, system_last, system_area = st.in_system, st.system_last, st.system_area
    push, pop = heapq.heappush, heapq.heappop
    ceil, sqrt, inf = math.ceil, math.sqrt, math.inf

    times, order = next(chunks, ([], []))
    times.append(inf)
    j, events, last_at = 0, 0, 0.0
    next_arrival = times[0]
    while True:
        service_at = heap[0][0] if heap else inf
        if service_at <= next_arrival:
            # ---- a heap event: a replica boundary (engine's serve) ----
            if service_at > horizon_s or service_at == inf:
                break
            at, seq, kind, r = pop(heap)
            events += 1
            last_at = at
            if kind is not BOUNDARY:
                other(at, seq, kind, r)
                continue
            if token[r] != seq:
                continue                      # superseded by a later schedule of this replica
            sq, ch = seqs[r], chunk[r]
            e = sq[0] // M
            m = e - it[r]
            if metered:
                credit(r, m)
            gr = g[r]
            c = c0[r] + m * gr
            f0, f1, gdr = d0[r] + m * d1[r], d1[r], gd[r]
            it[r] = e
            ref[r] = at
            t = lo_s if at < lo_s else (hi_s if at > hi_s else at)          # batch_to(r, at)
            dt = t - batch_last[r]
            n = run[r]
            if dt > 0:
                batch_area[r] += n * dt
                energy[r] += power[r][n] * dt
                batch_last[r] = t
            done = 0
            lim = (e + 1) * M                 # keys of iteration e are below it
            while sq and sq[0] < lim:
                key = pop(sq)
                i = (key % M) >> 2
                li, lo = lin[i], lout[i]
                if not key & 1:               # prefill ends: first token; context jumps to l_in
                    first[i] = at
                    c += li - kch[i] * ch
                    gr += 1 - ch
                    b_i = beta[i]
                    f0 -= alpha[i] + b_i * kch[i]
                    f1 -= b_i
                    if lo:
                        f0 += gdr
                        push(sq, (e + lo) * M + 4 * i + 1)
                        continue
                else:
                    f0 -= gdr
                end[i] = at
                c -= li + lo
                gr -= 1
                done += 1
            if done:                          # system_to(p, at, -done)
                p = replica_pool[r]
                dt = t - system_last[p]
                if dt > 0:
                    system_area[p] += in_system[p] * dt
                    system_last[p] = t
                in_system[p] -= done
                n -= done
                outstanding[r] -= done
            if not n:
                f0 = f1 = 0.0                 # an idle replica drops the float residue
            q = waiting[r]
            if q:
                cr = cap[r]
                while q and n < cr:           # admit(r, q.popleft(), at)
                    i = q.popleft()
                    n += 1
                    start[i] = at
                    k = kch[i]
                    if k:
                        gr += ch
                        f0 += alpha[i]
                        f1 += beta[i]
                        push(sq, (e + k) * M + 4 * i)
                    else:
                        first[i] = at
                        gr += 1
                        f0 += gdr
                        push(sq, (e + lout[i]) * M + 4 * i + 1)
            run[r] = n
            c0[r], g[r], d0[r], d1[r] = c, gr, f0, f1
            if n:                             # reschedule(r)
                m = sq[0] // M - e
                hr = h[r]
                sn = next(counter)
                push(heap, (at + m * (W[r] + hr * c + f0) + (hr * gr + f1) * (m * (m - 1) // 2), sn, BOUNDARY,
                            r))
                token[r] = sn
            else:
                token[r] = -1
            continue
        # ---- an arrival (engine's arrive) ----
        now = next_arrival
        if now > horizon_s:
            break
        i = order[j]
        j += 1
        next_arrival = times[j]
        if next_arrival == inf:               # the chunk's sentinel (arrival instants are finite)
            nxt = next(chunks, None)
            if nxt is not None:
                times, order = nxt
                times.append(inf)
                j = 0
                next_arrival = times[0]
        events += 1
        last_at = now
        p = rpool[i]
        t = lo_s if now < lo_s else (hi_s if now > hi_s else now)          # system_to(p, now, 1)
        dt = t - system_last[p]
        if dt > 0:
            system_area[p] += in_system[p] * dt
            system_last[p] = t
        in_system[p] += 1
        if jsq:                               # JoinShortestQueue's choose(p)
            r, hi = spans[p]
            if hi - r > 1:
                o = outstanding[r:hi]
                r += o.index(min(o))
        else:
            r = choose(p)
        outstanding[r] += 1
        rep[i] = r
        n = run[r]
        if n >= cap[r]:
            waiting[r].append(i)
            continue
        hr, wr = h[r], W[r]
        cr, gr, f0, f1, itr = c0[r], g[r], d0[r], d1[r], it[r]      # the anchor, written back once below
        if not n:
            ref[r] = b = now                  # idle: an iteration starts now (c0 = g = 0)
        else:
            b = ref[r]
            if now > b:                       # advance(r, now): the first boundary at or after now
                w, a = wr + hr * cr + f0, hr * gr + f1
                x = now - b
                m = ceil(x / w if a == 0 else (sqrt((w - a / 2) ** 2 + 2 * a * x) - (w - a / 2)) / a)
                tm = b + m * w + a * (m * (m - 1) // 2)                # T(m), kept for the anchor
                while tm < now:
                    m += 1
                    tm = b + m * w + a * (m * (m - 1) // 2)
                while m > 0:
                    t = b + (m - 1) * w + a * ((m - 1) * (m - 2) // 2)
                    if t < now:
                        break
                    m -= 1
                    tm = t
                if metered:
                    credit(r, m)
                ref[r] = b = tm
                cr += m * gr
                f0 += m * f1
                itr += m
        t = lo_s if b < lo_s else (hi_s if b > hi_s else b)                # batch_to(r, b)
        dt = t - batch_last[r]
        if dt > 0:
            batch_area[r] += n * dt
            energy[r] += power[r][n] * dt
            batch_last[r] = t
        run[r] = n + 1                        # admit(r, i, b)
        start[i] = b
        k = kch[i]
        sq = seqs[r]
        if k:
            gr += chunk[r]
            f0 += alpha[i]
            f1 += beta[i]
            push(sq, (itr + k) * M + 4 * i)
        else:                                 # no prompt: decoding from the start
            first[i] = b
            gr += 1
            f0 += gd[r]
            push(sq, (itr + lout[i]) * M + 4 * i + 1)
        c0[r], g[r], d0[r], d1[r], it[r] = cr, gr, f0, f1, itr
        m = sq[0] // M - itr                  # reschedule(r)
        sn = next(counter)
        push(heap, (b + m * (wr + hr * cr + f0) + (hr * gr + f1) * (m * (m - 1) // 2), sn, BOUNDARY, r))
        token[r] = sn
    return last_at, events


def _unused(*args) -> None:
    """Placeholder handler of a path no replica of the run takes (never called)."""
    raise AssertionError("no replica of this run takes this path")
