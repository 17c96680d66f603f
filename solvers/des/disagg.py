r"""A disaggregated prefill/decode (P/D) pair: a prefill pool and a decode pool joined by a KV transfer.

:func:`simulate_disaggregated` runs a request stream through the two stations of a :class:`DisaggPair` and
returns a :class:`DisaggResult`: per-request instants, TTFT and TPOT, per-phase batch, utilisation, busy time
and power, and the P99 TTFT and TPOT with batch-means confidence intervals (as the aggregated verification
uses, :func:`fleetopt.solvers.des.metrics.batch_means_ci`), so that a verifier decides pass / fail /
undecided as for an aggregated pool.

A request :math:`i` (arrival :math:`a_i`, prompt :math:`l_{in}`, output :math:`l_{out}`) goes through

1. the **prefill pool** (:math:`N_p` replicas of the prefill profile): it is dispatched on arrival to a
   replica (join-the-shortest-queue by default, as the aggregated engine), waits FCFS in that replica's queue
   and is prefilled in :math:`k = \lceil l_{in}/c \rceil` chunked-prefill iterations. The replicas run
   prefill-only iterations: this station *is* the aggregated engine (:func:`fleetopt.solvers.des.engine.simulate`,
   unchanged) on the stream with every output length set to 0, so an iteration over prefill chunks
   :math:`c_j` at prefixes :math:`p_j` takes

   .. math:: t = W_p + h_p \sum_j p_j + \sum_j \left(a\, c_j + b\left((p_j + c_j)^2 - p_j^2\right)\right)

   (:func:`fleetopt.models.service.compute_coefficients`; the compute split evenly over the chunks, which sums
   to :math:`a l_{in} + b l_{in}^2` per prompt), with at most ``prefill_max_num_seqs`` prompts in progress per
   replica and, optionally, a token budget per iteration (``prefill_max_batched_tokens``; the engine's "Token
   budget"). The prefill ends at :math:`e_i`, the end of its last prefill iteration.

   With ``prefill_queue="pool"`` the pool instead keeps **one FIFO queue** and each replica prefills one prompt
   at a time: an M/G/c queue (:math:`c = N_p`) whose service is the prompt's prefill alone on a replica,

   .. math:: S_p = k W_p + h_p c \frac{k(k-1)}{2} + a\, l_{in} + b\, l_{in}^2,

   so a prompt starts at :math:`\max(a_i, \text{earliest free replica})` (Kiefer-Wolfowitz; among idle replicas
   the one idle longest, ties to the lowest index). This is the queue of the analytic prefill station
   (:class:`fleetopt.models.queueing.disagg.PrefillStation`), and the same iterations as the engine's replica
   with ``prefill_max_num_seqs=1`` (with one replica the two options give the same run, but for power). Its
   power is the analytic station's: the activity energy of the prompt's iterations (the profile's activity
   power, a computed profile's ``activity_power`` included), capped at the board limit on their mean, or a
   power curve of the batch alone at a batch of one chunk's tokens while busy; idle power between; a prompt
   cut by the horizon is credited the share of its time inside the window.
2. the **KV transfer**: the prompt's KV cache moves to the decode pool in :math:`\tau_i` seconds, given by the
   caller (an array, a constant or a function of the prompt tokens; e.g. KV bytes over the link bandwidth).
   The link is not a shared resource here: transfers never queue behind one another.
3. the **decode pool** (:math:`N_d` replicas of the decode profile, at most ``decode_max_num_seqs``
   sequences each: the KV slots of the decode profile at the window by default). The request reaches it at
   :math:`r_i = e_i + \tau_i`. It joins the replica with the fewest running sequences among those with a free
   slot (ties: lowest index); when every slot is taken it waits in **one FIFO queue of the pool** and takes
   the first slot that frees. It joins a running replica at the replica's first iteration boundary at or
   after :math:`r_i` (an idle replica starts an iteration at once) and runs :math:`l_{out}` decode steps, one
   per iteration, at contexts :math:`l_{in}, l_{in} + 1, \dots, l_{in} + l_{out} - 1`: its prompt's KV counts
   in its context from the first step. A decode-only iteration over sequences with contexts :math:`x_s` takes

   .. math:: t = W_d + h_d \sum_s x_s + g_d\, n_{dec}

   and the request completes at the end of its :math:`l_{out}`-th step, :math:`d_i`.

Conventions
-----------
*Steps.* The decode pool runs :math:`l_{out}` steps, the aggregated engine's convention
(:mod:`fleetopt.solvers.des.engine`: the first token at the end of the prefill, then :math:`l_{out}` decode
iterations; :func:`fleetopt.models.service.iteration_work_s`), so a request does the same decode work whether
its pool is aggregated or disaggregated.

*First token.* The prefill node computes the first token at the end of the prefill (as in vLLM's
disaggregated serving, where the prefill instance runs the request with ``max_tokens=1``), and the user
receives it with the KV hand-off, at :math:`r_i = e_i + \tau_i`:

.. math:: \mathrm{TTFT}_i = r_i - a_i = (e_i - a_i) + \tau_i, \qquad
          \mathrm{TPOT}_i = \frac{d_i - r_i}{l_{out} - 1} \quad (l_{out} > 1)

(TTFT = prefill wait + prefill + transfer, as the issue's P/D pair defines it; TPOT is the benchmark
definition of :mod:`fleetopt.solvers.des.metrics`, so with :math:`l_{out}` steps after the first token it is
:math:`l_{out}/(l_{out}-1)` times their mean, as for aggregated pools). A wait for a decode slot therefore
counts in TPOT, not in TTFT; it is reported apart (``decode_wait_s``). ``prefill_end_at_s`` is kept, so a
caller crediting the token at the end of the prefill reads :math:`e_i - a_i`.

*Edge lengths.* A request without output (:math:`l_{out} = 0`) completes at :math:`e_i` with its first token
(no transfer, no decode). A request without a prompt (:math:`l_{in} = 0`) skips the prefill pool
(:math:`e_i = a_i`) and is transferred and decoded from context 0. A request longer than the window
(:math:`l_{in} + l_{out} > B`) is ``REJECTED`` (never served, times NaN), as in the aggregated engine.

Decode station: the closed-form jump
------------------------------------
Between two events of a decode replica (an admission, a completion) its :math:`n` sequences each add one
token per iteration, so :math:`m` iterations from an anchor of total context :math:`C_0` take
:math:`m(W + h C_0 + g n) + h n\, m(m-1)/2` exactly: the engine's anchor arithmetic
(``_anchor_functions`` of :mod:`fleetopt.solvers.des.engine`: the same jump, the same activity-power energy),
reused as is with growth :math:`n` tokens and compute :math:`g n` per iteration. Its record columns, time
integrals (number in system, batch, power curve) and end-of-run bookkeeping are the engine's
(:class:`fleetopt.solvers.des.state._State`), so each station leaves a :class:`~fleetopt.solvers.des.records.SimResult`
that :func:`~fleetopt.solvers.des.metrics.littles_law` and :func:`~fleetopt.solvers.des.metrics.summarize`
read like any other.

Order of simultaneous events (decode station; the prefill station is the engine's): heap events (a replica's
boundary) before arrivals at the same instant, among themselves in the order scheduled; at a boundary the
sequences that complete leave (in request order), then the head of the pool's queue takes the freed slots;
arrivals at one instant in order of :math:`r_i`, then of request index.

Windows and horizon
-------------------
Both stations integrate over ``[warmup_s, end]``: with ``horizon_s`` both end there and requests still in
flight are ``UNFINISHED`` (a request whose prefill or transfer ends after the horizon never reaches the decode
pool); without one each station ends at its own last event. P99s cover the *measured* requests, those arriving
in ``[warmup_s, measure_end_s]``: a measured request without a first token counts as :math:`+\infty` in the
TTFT percentile (as :mod:`fleetopt.optimizer.simulation.simulate` counts it), TPOT covers the completed ones
with :math:`l_{out} > 1`.

The run is deterministic: the same stream, transfer times and pair give byte-identical results (all
randomness is in the caller's stream, drawn from an explicit generator).

References
----------
.. [1] Y. Zhong et al., "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large Language
       Model Serving", OSDI 2024 (prefill and decode instances joined by a KV-cache transfer).
.. [2] P. Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase Splitting", ISCA 2024.
.. [3] vLLM, "Disaggregated Prefilling (experimental)", docs.vllm.ai (the prefill instance runs the request
       with ``max_tokens=1``, a connector moves its KV cache to the decode instance).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from fleetopt.models.numerics import unique
from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import ServingProfile
from fleetopt.models.service import compute_coefficients, iteration_coefficients
from fleetopt.solvers.des.engine import _anchor_functions, _arrival_chunks, _run, simulate
from fleetopt.solvers.des.metrics import Estimate, batch_means_ci
from fleetopt.solvers.des.records import Outcome, SimResult
from fleetopt.solvers.des.routing import Dispatch, Requests
from fleetopt.solvers.des.state import EventKind, SimPool, _State

__all__ = ["PREFILL_QUEUES", "DisaggPair", "PhaseStats", "DisaggResult", "simulate_disaggregated", "TransferTimes"]

PREFILL_QUEUES = ("replica", "pool")
"""Queueing of the prefill pool: per replica (the engine's, with a dispatch policy) or one FIFO queue for the pool
(one prompt at a time per replica)."""

TransferTimes = float | np.ndarray | Callable[[np.ndarray], np.ndarray | float]
"""KV-transfer seconds of each request: one value for all, one per request, or a function of the prompt tokens
(called once with the array of all prompts, returning an array or a scalar)."""


@dataclass(frozen=True, kw_only=True)
class DisaggPair:
    """The configuration of a P/D pair (validated when built; no run-time state).

    Parameters
    ----------
    prefill_profile : ServingProfile
        What one prefill replica can do (:mod:`fleetopt.models.profiles`).
    prefill_replicas : int
        Prefill replicas :math:`N_p` >= 1.
    decode_profile : ServingProfile
        What one decode replica can do.
    decode_replicas : int
        Decode replicas :math:`N_d` >= 1.
    window_tokens : int
        Context window :math:`B` of the pair: requests with :math:`l_{in} + l_{out} > B` are rejected.
    decode_max_num_seqs : int or None
        Slot cap of a decode replica (sequences decoding at once); None: ``decode_profile.n_slots(window_tokens)``,
        its KV slots at the window, which is also the most allowed.
    prefill_max_num_seqs : int or None
        Prompts one prefill replica prefills at once (each takes a chunk per iteration); None:
        ``prefill_profile.n_slots(window_tokens)``, the most allowed. 1 prefills one prompt at a time.
    prefill_max_batched_tokens : int or None
        Token budget of one prefill iteration (vLLM's ``max_num_batched_tokens``; the engine's "Token
        budget"), >= ``prefill_max_num_seqs``; None: no budget beyond the chunk per prompt.
    prefill_queue : {"replica", "pool"}
        ``"replica"`` (default): the engine's per-replica FCFS queues, a dispatch policy choosing the replica on
        arrival (join-the-shortest-queue by default). ``"pool"``: one FIFO queue for the pool and one prompt at a
        time per replica (module docstring, step 1; the analytic model's M/G/c); needs ``prefill_max_num_seqs``
        1 (None becomes 1) and no token budget.

    Raises
    ------
    ValueError
        Naming the field, for a count, cap, window or budget out of range (the checks of
        :class:`fleetopt.solvers.des.state.SimPool`, for pools named ``prefill`` and ``decode``).
    """

    prefill_profile: ServingProfile
    prefill_replicas: int
    decode_profile: ServingProfile
    decode_replicas: int
    window_tokens: int
    decode_max_num_seqs: int | None = None
    prefill_max_num_seqs: int | None = None
    prefill_max_batched_tokens: int | None = None
    prefill_queue: str = "replica"

    def __post_init__(self) -> None:
        if self.prefill_queue not in PREFILL_QUEUES:
            raise ValueError(f"DisaggPair.prefill_queue must be one of {PREFILL_QUEUES}; got {self.prefill_queue!r}")
        if self.prefill_queue == "pool":
            if self.prefill_max_num_seqs is None:
                object.__setattr__(self, "prefill_max_num_seqs", 1)
            if self.prefill_max_num_seqs != 1 or self.prefill_max_batched_tokens is not None:
                raise ValueError("DisaggPair: prefill_queue 'pool' prefills one prompt at a time: prefill_max_num_seqs "
                                 f"must be 1 (got {self.prefill_max_num_seqs}) and prefill_max_batched_tokens None "
                                 f"(got {self.prefill_max_batched_tokens})")
        for name in ("prefill_replicas", "decode_replicas", "window_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"DisaggPair.{name} must be a whole number >= 1; got {v!r}")
        for name in ("decode_max_num_seqs", "prefill_max_num_seqs", "prefill_max_batched_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise ValueError(f"DisaggPair.{name} must be a whole number >= 1 or None; got {v!r}")
        # SimPool checks the caps against the profiles' KV slots; its errors name the pool (prefill / decode)
        prefill, decode = self.prefill_pool, self.decode_pool
        object.__setattr__(self, "prefill_max_num_seqs", prefill.max_num_seqs)
        object.__setattr__(self, "decode_max_num_seqs", decode.max_num_seqs)

    @property
    def prefill_pool(self) -> SimPool:
        """The prefill pool as the engine's :class:`~fleetopt.solvers.des.state.SimPool` (named ``prefill``)."""
        return SimPool("prefill", self.prefill_profile, int(self.prefill_replicas), self.prefill_max_num_seqs,
                       int(self.window_tokens), max_batched_tokens=self.prefill_max_batched_tokens)

    @property
    def decode_pool(self) -> SimPool:
        """The decode pool as a :class:`~fleetopt.solvers.des.state.SimPool` (named ``decode``)."""
        return SimPool("decode", self.decode_profile, int(self.decode_replicas), self.decode_max_num_seqs,
                       int(self.window_tokens))


@dataclass(frozen=True, kw_only=True)
class PhaseStats:
    """Time averages of one station over its window ``[window_start_s, window_end_s]``.

    ``busy_s`` is the replica-seconds during which a replica runs iterations (its batch is not empty), summed
    over the replicas; ``utilization`` is that over ``replicas`` x window. ``slot_utilization`` is busy
    slot-seconds over ``replicas`` x ``max_num_seqs`` x window (the engine's ``pool_utilization``).
    ``mean_batch`` is the mean over replicas of their time-average batch (prompts in prefill; sequences
    decoding). Power is the profile's power model integrated as the aggregated engine does (a power curve of
    the batch, or activity power per iteration with idle power between): ``energy_j`` over the window, summed
    over the replicas, and ``mean_power_w`` = ``energy_j`` / window. ``mean_in_system`` is the time-average
    number of requests at the station (queued or served); ``served`` the requests that left it in the window.
    """

    replicas: int
    max_num_seqs: int
    window_start_s: float
    window_end_s: float
    served: int
    mean_batch: float
    busy_s: float
    utilization: float
    slot_utilization: float
    energy_j: float
    mean_power_w: float
    mean_in_system: float


@dataclass(frozen=True, kw_only=True, eq=False)
class DisaggResult:
    """What :func:`simulate_disaggregated` produced. Per-request arrays are in input order, read-only; an
    instant that did not happen (or falls after the horizon) is NaN, a replica index -1.

    Attributes
    ----------
    arrival_at_s, prompt_tokens, output_tokens : arrays
        The stream.
    transfer_s : array
        KV-transfer seconds :math:`\\tau_i` (0 for a request without output, which is not transferred).
    prefill_start_at_s, prefill_end_at_s : arrays
        Admission to a prefill batch and end of the last prefill iteration :math:`e_i` (both :math:`a_i` for
        a request without a prompt).
    first_token_at_s : array
        :math:`r_i = e_i + \\tau_i`, the first token at the user and the arrival at the decode pool
        (:math:`e_i` without output).
    decode_start_at_s : array
        Admission to a decode slot (NaN without output).
    end_at_s : array
        Completion :math:`d_i`.
    prefill_replica, decode_replica : arrays of int
        Replica within each pool (0-based), -1 none.
    outcome : array of int8
        :class:`~fleetopt.solvers.des.records.Outcome` codes.
    ttft_s, tpot_s, prefill_wait_s, decode_wait_s, e2e_s : arrays
        :math:`r_i - a_i`; :math:`(d_i - r_i)/(l_{out} - 1)` (NaN unless completed with :math:`l_{out} > 1`);
        prefill admission minus arrival; decode admission minus :math:`r_i`; :math:`d_i - a_i`.
    measured : array of bool
        Arrivals in ``[warmup_s, measure_end_s]``: the requests of the P99s.
    p99_ttft, p99_tpot : Estimate or None
        P99 of the measured TTFTs (a request without a first token: :math:`+\\infty`) and TPOTs with a
        ``confidence`` interval by batch means (``n_batches`` contiguous batches in arrival order,
        :func:`~fleetopt.solvers.des.metrics.batch_means_ci`); None with fewer values than batches.
    prefill, decode : PhaseStats
        The two stations' time averages.
    prefill_sim, decode_sim : SimResult
        Each station's own records (:func:`fleetopt.solvers.des.metrics.littles_law` etc. apply). The prefill
        one covers the requests with a prompt, in input order (``prefill_request`` maps its rows to request
        indices), its ``end_at_s`` being :math:`e_i`; the decode one covers the requests with output that
        completed their prefill (within the horizon), in the order of :math:`r_i` (``decode_request`` maps its
        rows), its ``arrival_at_s`` and ``first_token_at_s`` being :math:`r_i`.
    events : int
        Events both stations handled.
    """

    arrival_at_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    transfer_s: np.ndarray
    prefill_start_at_s: np.ndarray
    prefill_end_at_s: np.ndarray
    first_token_at_s: np.ndarray
    decode_start_at_s: np.ndarray
    end_at_s: np.ndarray
    prefill_replica: np.ndarray
    decode_replica: np.ndarray
    outcome: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    prefill_wait_s: np.ndarray
    decode_wait_s: np.ndarray
    e2e_s: np.ndarray
    measured: np.ndarray
    p99_ttft: Estimate | None
    p99_tpot: Estimate | None
    prefill: PhaseStats
    decode: PhaseStats
    prefill_sim: SimResult
    decode_sim: SimResult
    prefill_request: np.ndarray
    decode_request: np.ndarray
    events: int

    def count(self, outcome: Outcome) -> int:
        """Requests with ``outcome``."""
        return int(np.count_nonzero(self.outcome == outcome))


def simulate_disaggregated(pair: DisaggPair, requests: Requests, *, transfer_s: TransferTimes,
                           horizon_s: float | None = None, warmup_s: float = 0.0, measure_end_s: float | None = None,
                           prefill_dispatch: Dispatch | None = None, n_batches: int = 20,
                           confidence: float = 0.95) -> DisaggResult:
    """Simulate ``requests`` through the P/D pair ``pair``; every request gets exactly one outcome.

    Parameters
    ----------
    pair : DisaggPair
        The two pools.
    requests : Requests
        Arrival instants (sorted) and prompt and output tokens (:class:`fleetopt.solvers.des.routing.Requests`).
    transfer_s : float, array or callable
        KV-transfer seconds, finite and >= 0: one value, one per request, or ``f(prompt_tokens)`` of the
        prompt-token array (module docstring, step 2).
    horizon_s : float or None
        Stop both stations at this instant (in-flight requests are ``UNFINISHED``); None drains the stream.
    warmup_s : float
        Start of the time integrals and of the measured arrivals.
    measure_end_s : float or None
        Last measured arrival (None: every arrival from ``warmup_s`` on).
    prefill_dispatch : Dispatch or None
        Replica choice of the prefill pool with ``prefill_queue="replica"`` (default join-the-shortest-queue;
        module docstring of :mod:`fleetopt.solvers.des.engine`, "Dispatch within a pool"); must be None with
        ``"pool"``.
    n_batches, confidence : int, float
        Batch means of the P99 intervals.

    Returns
    -------
    DisaggResult

    Raises
    ------
    ValueError
        For a bad pair, stream, transfer time, horizon or window (the argument is named).

    Examples
    --------
    One request of 1,024 prompt and 4 output tokens on the seeds' H100 unit (W = 4 ms, H = 0.32 ms at 8,192
    tokens, chunks of 1,024 tokens, no compute terms): one prefill iteration of 4 ms, 10 ms of transfer, then
    four decode steps of :math:`W + h (1024 + d)`, :math:`h` = 0.32 ms / 8,192, which take 16.160234375 ms.

    >>> from fleetopt.models.power import PowerCurve
    >>> from fleetopt.models.profiles import CalibratedProfile
    >>> gpu = CalibratedProfile("g", "m", 0.004, 0.00032, 8192, 1024, 16, 65536, 256, 1.0, 1,
    ...     PowerCurve(300.0, 600.0, 1.0, 4.2, "measured"))
    >>> pair = DisaggPair(prefill_profile=gpu, prefill_replicas=1, decode_profile=gpu, decode_replicas=1,
    ...                   window_tokens=4096)
    >>> res = simulate_disaggregated(pair, Requests(np.array([0.0]), np.array([1024]), np.array([4])),
    ...                              transfer_s=0.010)
    >>> round(float(res.ttft_s[0]), 12), round(float(res.tpot_s[0] * 3), 12)   # TPOT: over l_out - 1 = 3
    (0.014, 0.016160234375)
    """
    if not isinstance(pair, DisaggPair):
        raise ValueError(f"pair must be a DisaggPair; got {type(pair).__name__}")
    if not isinstance(requests, Requests):
        raise ValueError(f"requests must be a Requests stream; got {type(requests).__name__}")
    if requests.service_s is not None:
        raise ValueError("requests.service_s does not apply to a P/D pair: both stations derive service from "
                         "their profiles")
    hi_s = math.inf if horizon_s is None else float(horizon_s)
    if not (0 < hi_s < math.inf or horizon_s is None):
        raise ValueError(f"horizon_s must be finite and > 0, or None; got {horizon_s}")
    if not 0.0 <= warmup_s < hi_s:
        raise ValueError(f"warmup_s must lie in [0, horizon_s); got {warmup_s}")
    end_meas = math.inf if measure_end_s is None else float(measure_end_s)
    if not end_meas >= warmup_s:
        raise ValueError(f"measure_end_s must be >= warmup_s ({warmup_s}); got {measure_end_s}")
    if isinstance(n_batches, bool) or not isinstance(n_batches, (int, np.integer)) or n_batches < 2:
        raise ValueError(f"n_batches must be a whole number >= 2; got {n_batches!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1); got {confidence}")
    n = len(requests)
    arrival, prompt, output = requests.arrival_at_s, requests.prompt_tokens, requests.output_tokens
    tau = _transfer_times(transfer_s, prompt)
    accepted = requests.total_tokens <= pair.window_tokens

    # ---- prefill: the aggregated engine on the prompts alone (no output tokens: prefill-only iterations)
    pf_idx = np.flatnonzero(accepted & (prompt > 0))
    pf_req = Requests(arrival[pf_idx], prompt[pf_idx], np.zeros(pf_idx.size, dtype=np.int64))
    if pair.prefill_queue == "pool":
        if prefill_dispatch is not None:
            raise ValueError("prefill_dispatch applies to prefill_queue 'replica' only (a pool queue has no dispatch)")
        pf = _pool_queue_prefill(pair.prefill_pool, pf_req, hi_s, float(warmup_s))
    else:
        pf = simulate([pair.prefill_pool], pf_req, _AllTo("prefill"), mode="iteration", dispatch=prefill_dispatch,
                      horizon_s=horizon_s, warmup_s=warmup_s)
    pf_start, pf_end = np.full(n, math.nan), np.full(n, math.nan)
    pf_rep = np.full(n, -1, dtype=np.int64)
    no_prompt = accepted & (prompt == 0)
    pf_start[no_prompt] = pf_end[no_prompt] = arrival[no_prompt]
    pf_start[pf_idx], pf_end[pf_idx], pf_rep[pf_idx] = pf.start_at_s, pf.end_at_s, pf.replica

    # ---- transfer, then decode: requests with output whose prefill ended, in order of their arrival there
    tau = np.where(output > 0, tau, 0.0)
    ready = pf_end + tau
    ready[ready > hi_s] = math.nan
    dec_idx = np.flatnonzero(np.isfinite(pf_end) & (output > 0))
    dec_idx = dec_idx[np.argsort(pf_end[dec_idx] + tau[dec_idx], kind="stable")]
    dec_req = Requests(pf_end[dec_idx] + tau[dec_idx], prompt[dec_idx], output[dec_idx])
    dec = _decode_station(pair.decode_pool, dec_req, hi_s, float(warmup_s))

    # ---- the requests' records
    first = np.where(output > 0, ready, pf_end)
    dec_start, end = np.full(n, math.nan), np.where(output > 0, math.nan, pf_end)
    dec_rep = np.full(n, -1, dtype=np.int64)
    dec_start[dec_idx], end[dec_idx], dec_rep[dec_idx] = dec.start_at_s, dec.end_at_s, dec.replica
    outcome = np.where(~accepted, Outcome.REJECTED,
                       np.where(np.isfinite(end), Outcome.COMPLETED, Outcome.UNFINISHED)).astype(np.int8)
    ttft = first - arrival
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output > 1, (end - first) / (output - 1.0), math.nan)
    measured = (arrival >= warmup_s) & (arrival <= end_meas)
    ttft_m = np.where(np.isnan(ttft), math.inf, ttft)[measured]
    tpot_m = tpot[measured & np.isfinite(tpot)]
    arrays = dict(
        arrival_at_s=arrival.copy(), prompt_tokens=prompt.copy(), output_tokens=output.copy(), transfer_s=tau,
        prefill_start_at_s=pf_start, prefill_end_at_s=pf_end, first_token_at_s=first, decode_start_at_s=dec_start,
        end_at_s=end, prefill_replica=pf_rep, decode_replica=dec_rep, outcome=outcome, ttft_s=ttft, tpot_s=tpot,
        prefill_wait_s=pf_start - arrival, decode_wait_s=dec_start - first, e2e_s=end - arrival, measured=measured,
        prefill_request=pf_idx, decode_request=dec_idx)
    for a in arrays.values():
        a.flags.writeable = False
    return DisaggResult(
        **arrays,
        p99_ttft=batch_means_ci(ttft_m, 99.0, n_batches, confidence) if ttft_m.size >= n_batches else None,
        p99_tpot=batch_means_ci(tpot_m, 99.0, n_batches, confidence) if tpot_m.size >= n_batches else None,
        prefill=_phase_stats(pf), decode=_phase_stats(dec), prefill_sim=pf, decode_sim=dec,
        events=pf.events + dec.events)


class _AllTo:
    """A router that sends every request to one pool."""

    def __init__(self, name: str) -> None:
        self.pool_names = (name,)

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        return np.zeros(len(prompt_tokens), dtype=np.int64)


def _transfer_times(transfer_s: TransferTimes, prompt_tokens: np.ndarray) -> np.ndarray:
    """The per-request KV-transfer seconds of ``transfer_s`` (module docstring, step 2), checked."""
    n = len(prompt_tokens)
    raw = transfer_s(prompt_tokens.copy()) if callable(transfer_s) else transfer_s
    try:
        tau = np.broadcast_to(np.asarray(raw, dtype=float), (n,)).copy()
    except ValueError:
        raise ValueError(f"transfer_s must give one value or one per request ({n}); got shape "
                         f"{np.shape(raw)}") from None
    bad = np.flatnonzero(~np.isfinite(tau) | (tau < 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"transfer_s[{i}] must be finite and >= 0; got {tau[i]}")
    return tau


def _decode_station(pool: SimPool, requests: Requests, hi_s: float, lo_s: float) -> SimResult:
    """Run the decode pool on ``requests`` (their arrival: :math:`r_i`, sorted) and return its records (module
    docstring, steps 3 and "Decode station"); every request has output tokens and fits the window.

    Per replica the state is the engine's anchor (``it``, ``ref``, ``c0``, ``g``, ``d0``; ``d1`` stays 0: a
    decode step's compute does not grow) and a heap of completion keys ``index * M + i`` (request ``i``
    completes at the end of iteration ``index``); the pool keeps one FIFO queue of requests waiting for a slot,
    non-empty only while every slot is taken.
    """
    n = len(requests)
    st = _State([pool], n, lo_s, hi_s)
    st.first_at[:] = requests.arrival_at_s       # the first token reached the user on arrival here
    R, cap = pool.replicas, int(pool.max_num_seqs or 0)
    prof = pool.profile
    W0, h0 = iteration_coefficients(prof)
    gd = compute_coefficients(prof)[0]
    pw = prof.power
    act = (pw.weights_w, pw.kv_w, pw.compute_w, pw.limit_w) if isinstance(pw, ActivityPower) else None
    # the engine's anchor functions read these attributes of its station; a namespace holds this station's
    anchors: Any = SimpleNamespace(ref=[0.0] * R, W=[W0] * R, h=[h0] * R, c0=[0] * R, g=[0] * R, d0=[0.0] * R,
                                   d1=[0.0] * R, it=[0] * R, act=[act] * R, energy=st.energy, lo_s=lo_s,
                                   hi_s=hi_s, metered=act is not None)
    after, boundary_at, credit, advance = _anchor_functions(anchors)
    ref, c0, g, d0, it = anchors.ref, anchors.c0, anchors.g, anchors.d0, anchors.it
    metered = anchors.metered
    seqs: list[list[int]] = [[] for _ in range(R)]
    token = [-1] * R
    queue: deque[int] = deque()
    run, heap, counter, batch_to, system_to = st.batch, st.heap, st.counter, st.batch_to, st.system_to
    start, end, rep = st.start, st.end, st.rep
    lin, lout = requests.prompt_tokens.tolist(), requests.output_tokens.tolist()
    M = max(n, 1)
    replicas = range(R)
    least = run.__getitem__
    push, pop = heapq.heappush, heapq.heappop
    BOUNDARY = EventKind.BOUNDARY                 # the only kind of heap event here

    def admit(r: int, i: int, b: float) -> None:
        """Request ``i`` takes a slot of replica ``r`` at the boundary instant ``b`` (the anchor)."""
        run[r] += 1
        start[i] = b
        rep[i] = r
        c0[r] += lin[i]
        g[r] += 1
        d0[r] += gd
        push(seqs[r], (it[r] + lout[i]) * M + i)

    def reschedule(r: int) -> None:
        """Push replica ``r``'s next boundary (its next completion), superseding the one before."""
        if run[r]:
            k = next(counter)
            push(heap, (after(r, seqs[r][0] // M - it[r]), k, BOUNDARY, r))
            token[r] = k
        else:
            token[r] = -1

    def arrive(now: float, i: int) -> None:
        """Request ``i`` reaches the pool at ``now``: the least-loaded replica with a free slot admits it at its
        next boundary (at once when idle), else it joins the pool's queue."""
        system_to(0, now, 1)
        r = min(replicas, key=least)
        if run[r] >= cap:
            queue.append(i)
            return
        if not run[r]:
            ref[r] = now
        elif now > ref[r]:
            advance(r, now)
        batch_to(r, ref[r])
        admit(r, i, ref[r])
        reschedule(r)

    def serve(at: float, seq: int, kind: int, r: int) -> None:
        """Replica ``r`` reaches the boundary of heap entry ``seq`` at ``at``: the sequences that complete there
        leave, and the pool's queue takes the freed slots."""
        if token[r] != seq:
            return
        sq = seqs[r]
        e = sq[0] // M
        if metered:
            credit(r, e - it[r])
        c, gr, f0 = c0[r] + (e - it[r]) * g[r], g[r], d0[r]
        it[r], ref[r] = e, at
        batch_to(r, at)
        done = 0
        while sq and sq[0] // M == e:
            i = pop(sq) % M
            end[i] = at
            c -= lin[i] + lout[i]
            gr -= 1
            f0 -= gd
            done += 1
            system_to(0, at, -1)
        c0[r], g[r] = c, gr
        run[r] -= done
        d0[r] = f0 if run[r] else 0.0            # an idle replica drops the float residue
        while queue and run[r] < cap:
            admit(r, queue.popleft(), at)
        reschedule(r)

    last_at, events = _run(heap, arrive, serve, _arrival_chunks(requests.arrival_at_s, np.ones(n, dtype=bool)),
                           hi_s)
    end_s = hi_s if hi_s < math.inf else max(last_at, lo_s)
    if metered:                                   # iterations still running at a horizon
        for r in replicas:
            if run[r] and end_s > ref[r]:
                credit(r, boundary_at(r, end_s))
    return st.result("iteration", ("decode",), requests, np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool),
                     end_s, events)


def _pool_queue_prefill(pool: SimPool, requests: Requests, hi_s: float, lo_s: float) -> SimResult:
    r"""The prefill pool with one FIFO queue and one prompt at a time per replica (module docstring, step 1,
    ``prefill_queue="pool"``): Kiefer-Wolfowitz's recursion for the starts, then the engine's records and
    window integrals (:class:`~fleetopt.solvers.des.records.SimResult`) from them, vectorised.

    Per replica over the window :math:`[T_0, T_1]`: batch area = busy time :math:`\sum_i |[s_i, e_i] \cap
    [T_0, T_1]|`; energy = busy time at :math:`P(c)` plus idle time at :math:`P(0)` (a power curve of the batch
    alone, the seeds' units: a chunk computes as many tokens as :math:`c` decode sequences), or
    :math:`\sum_i E_i\, |[s_i, e_i] \cap [T_0, T_1]| / S_i` plus idle power (activity power: the profile's
    ``power`` when it is one, else a computed profile's ``activity_power``; the analytic
    :class:`~fleetopt.models.queueing.disagg.PrefillStation` charges the same), with
    :math:`E_i = \min(P_{lim} S_i, p_w kW + p_{kv} h c k(k-1)/2 + p_c (a l_{in} + b l_{in}^2))` (the engine's credit
    of the :math:`k` iterations of a prompt alone).
    """
    n, R = len(requests), pool.replicas
    prof = pool.profile
    W, h = iteration_coefficients(prof)
    _, a, b = compute_coefficients(prof)
    c = float(prof.chunk_tokens)
    P = requests.prompt_tokens.astype(float)
    k = np.ceil(P / c)
    w_s, kv_s, comp_s = k * W, h * c * k * (k - 1) / 2, a * P + b * P * P
    S = w_s + kv_s + comp_s
    arrival = requests.arrival_at_s
    arrived = int(np.searchsorted(arrival, hi_s, side="right"))
    start, end = np.full(n, math.nan), np.full(n, math.nan)
    replica = np.full(n, -1, dtype=np.int64)
    free = [(0.0, r) for r in range(R)]           # (free at, replica): the earliest free, then the lowest index
    replace = heapq.heapreplace
    for i, (t, s_i) in enumerate(zip(arrival[:arrived].tolist(), S[:arrived].tolist())):
        f, r = free[0]
        st = t if t > f else f
        start[i], replica[i] = st, r
        replace(free, (st + s_i, r))
    end[:arrived] = start[:arrived] + S[:arrived]
    start[start > hi_s] = math.nan
    replica[np.isnan(start)] = -1
    end[end > hi_s] = math.nan
    end_s = hi_s if hi_s < math.inf else max(float(np.nanmax(end, initial=0.0)), lo_s)
    window = end_s - lo_s
    on = np.isfinite(start)
    busy_each = np.clip(np.where(np.isnan(end), end_s, end), lo_s, end_s) - np.clip(start, lo_s, end_s)
    busy = np.bincount(replica[on], busy_each[on], R)
    power = prof.power
    activity = power if isinstance(power, ActivityPower) else getattr(prof, "activity_power", None)
    if activity is not None:
        full = np.minimum(activity.limit_w * S,
                          activity.weights_w * w_s + activity.kv_w * kv_s + activity.compute_w * comp_s)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(S > 0, busy_each / np.where(S > 0, S, 1.0), 0.0)
        energy = np.bincount(replica[on], (full * share)[on], R) + activity.idle_w * (window - busy)
    else:
        curve = cast(PowerCurve, power)             # no activity power: the profile's power is a curve of the batch
        energy = float(curve.power_w(c)) * busy + float(curve.power_w(0)) * (window - busy)
    in_sys = np.clip(np.where(np.isnan(end), end_s, end), lo_s, end_s) - np.clip(arrival, lo_s, end_s)
    outcome = np.where(np.isfinite(end), Outcome.COMPLETED, Outcome.UNFINISHED).astype(np.int8)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_in_system = np.array([np.sum(in_sys[:arrived]) / window])
        mean_batch = busy / window
    cols = (arrival.copy(), start, end.copy(), end, requests.prompt_tokens.copy(), requests.output_tokens.copy(),
            np.zeros(n, dtype=np.int64), replica, outcome)
    pools = (mean_in_system, np.array([busy.sum()]), np.array([R], dtype=np.int64), np.zeros(R, dtype=np.int64),
             mean_batch, np.asarray(energy, dtype=float))
    counts = (np.zeros(1, dtype=np.int64), np.zeros(R, dtype=np.int64), np.zeros(1, dtype=np.int64))
    for x in cols + pools + counts:
        x.flags.writeable = False
    events = arrived + int(np.count_nonzero(np.isfinite(end)))
    return SimResult("iteration", ("prefill",), *cols, lo_s, end_s, *pools, events, *counts)


def _busy_s(res: SimResult) -> float:
    r"""Replica-seconds with a non-empty batch within the window, summed over replicas: per replica the length
    of the union of its requests' intervals :math:`[t_{start}, t_{end}]` (a request is in the batch exactly
    then; :math:`t_{end}` = the window's end while still running), clipped to the window."""
    t0, t1 = res.window_start_s, res.window_end_s
    ok = np.isfinite(res.start_at_s) & (res.replica >= 0)
    s = np.clip(res.start_at_s[ok], t0, t1)
    e = np.clip(np.where(np.isnan(res.end_at_s[ok]), t1, res.end_at_s[ok]), t0, t1)
    rep = res.replica[ok]
    total = 0.0
    for r in unique(rep):
        sel = rep == r
        order = np.argsort(s[sel], kind="stable")
        sr, er = s[sel][order], np.maximum.accumulate(e[sel][order])
        first = np.r_[True, sr[1:] > er[:-1]]           # a new busy period starts after the last one ended
        last = np.r_[first[1:], True]
        total += float(np.sum(er[last] - sr[first]))
    return total


def _phase_stats(res: SimResult) -> PhaseStats:
    """One station's :class:`PhaseStats` from its records and integrals."""
    window = res.window_s
    replicas = len(res.replica_pool)
    energy = float(np.sum(res.replica_energy_j))
    busy = _busy_s(res)
    with np.errstate(divide="ignore", invalid="ignore"):
        return PhaseStats(
            replicas=replicas, max_num_seqs=int(res.pool_slots[0]) // replicas, window_start_s=res.window_start_s,
            window_end_s=res.window_end_s,
            served=int(np.count_nonzero((res.outcome == Outcome.COMPLETED) & (res.end_at_s >= res.window_start_s))),
            mean_batch=float(res.pool_mean_batch[0]), busy_s=busy,
            utilization=float(np.float64(busy) / (replicas * window)),
            slot_utilization=float(res.pool_utilization[0]), energy_j=energy,
            mean_power_w=float(np.float64(energy) / window), mean_in_system=float(res.pool_mean_in_system[0]))
