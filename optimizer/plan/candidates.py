"""Candidate pools for the fleet MIP: every (length segment x GPU option), sized analytically.

A candidate :math:`p = (i, j, g)` serves requests of total length in
:math:`(b_i, b_j]` with context window :math:`b_j` on GPU option :math:`g`.
Each candidate offers one or more *replica choices* :math:`c`:

* pool-scope SLO: the single minimum count :math:`N^*_p` meeting the P99-TTFT
  SLO and :math:`\\rho_{max}`;
* fleet-scope SLO: every count from the utilisation floor
  :math:`N_\\rho = \\lceil \\lambda E[S] / (n \\rho_{max}) \\rceil` up to the count where
  the pool's miss probability stops falling (within :math:`10^{-9}` of its limit
  as :math:`N \\to \\infty`), each with its exact miss rate
  :math:`\\lambda_p P(T > T_{SLO} \\mid N)`.

Counts are inflated to :math:`\\lceil N / A_g \\rceil` for availability
:math:`A_g` (the SLO then holds while a share :math:`1 - A_g` of replicas is
down). Candidates that cannot meet the SLO at any count are dropped with their
reason; dominated choices are pruned (:func:`prune_dominated`). A solve for its
``top`` best plans sizes only the candidates that ``top`` others of their segment
do not rule out by their floors (:func:`bounded_sizing`, :func:`_size_bounded`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from fleetopt.models.numerics import unique
from fleetopt.models.fleet import inflate_for_availability
from fleetopt.models.queueing.erlang import Sizing
from fleetopt.models.service import decode_power_curve, tpot_batch_cap, tpot_bound_s
from fleetopt.models.queueing.ttft import TTFTModel, ttft_model
from fleetopt.models.units import MS_PER_S, P99_TAIL

from fleetopt.optimizer.io.instance import Instance

if TYPE_CHECKING:
    from fleetopt.models.segments import RawSums, SegmentBasis

__all__ = ["Candidates", "Deadline", "Dropped", "WindowCut", "SizingCache", "TighteningCandidates",
           "generate_candidates", "bounded_sizing", "BOUNDS", "prune_dominated", "restrict", "least_counts",
           "batch_caps", "pool_counts", "fleet_counts"]

MAX_EXTRA_COUNTS = 64
"""Fleet scope: at most this many replica counts above the utilisation floor per candidate."""
_NO_COUNT = 2 ** 62
"""A :class:`SizingCache` count for a candidate no count serves (the search starts at its cap, and fails)."""


@dataclass(frozen=True)
class Deadline:
    """The instant, on ``clock``, by which a solve must stop (``SolveOptions.time_limit_s`` after it started).

    Candidate building checks it before sizing each GPU option (:func:`generate_candidates`); the MIP gets
    what is left (:meth:`remaining_s`). ``clock`` returns seconds (default :func:`time.perf_counter`); a test
    passes a fake one.

    Examples
    --------
    >>> ticks = iter([0.0, 1.0, 2.0])
    >>> d = Deadline.after(1.5, clock=lambda: next(ticks))   # started at 0.0: due at 1.5
    >>> d.passed(), d.passed()                              # read at 1.0, then at 2.0
    (False, True)
    """

    at_s: float
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False, compare=False)

    @classmethod
    def after(cls, seconds: float | None, clock: Callable[[], float] = time.perf_counter) -> Deadline | None:
        """The deadline ``seconds`` from now on ``clock``; None when ``seconds`` is None or inf (no limit)."""
        if seconds is None or seconds == float("inf"):
            return None
        return cls(clock() + float(seconds), clock)

    def passed(self) -> bool:
        return self.clock() >= self.at_s

    def remaining_s(self) -> float:
        """Seconds left (0 once passed)."""
        return max(self.at_s - self.clock(), 0.0)


@dataclass(frozen=True)
class Dropped:
    """A candidate pool that cannot be part of any plan, and why."""

    lo_tokens: int
    hi_tokens: int
    gpu: str
    why: str | Callable[[], str] = field(repr=False, compare=False)
    """The reason, or a function that writes it (most dropped candidates are never reported)."""

    @property
    def reason(self) -> str:
        return self.why if isinstance(self.why, str) else self.why()


@dataclass(frozen=True, eq=False, kw_only=True)
class Candidates:
    """Candidate pools and their replica choices as parallel arrays.

    Pool arrays (``i``, ``j``, ``gpu``, ``arrival_rate``, ``output_tok_per_s``)
    have one entry per candidate; ``choice_*`` arrays one per replica choice,
    ``choice_pool`` pointing at its candidate. All figures are analytic;
    P99 TTFT is computed only for the pools a plan uses, in the exact
    re-evaluation.
    """

    boundaries: np.ndarray
    gpu_names: tuple[str, ...]
    i: np.ndarray
    j: np.ndarray
    gpu: np.ndarray
    arrival_rate: np.ndarray
    output_tok_per_s: np.ndarray
    choice_pool: np.ndarray
    choice_replicas: np.ndarray
    choice_gpus: np.ndarray
    choice_cost_per_hr: np.ndarray
    choice_power_w: np.ndarray
    choice_miss_rate: np.ndarray
    dropped: tuple[Dropped, ...]
    generated: int
    state_in: np.ndarray
    """Compression state at the pool's lower boundary: index into ``gammas`` of the pool below (0 = none)."""
    state_out: np.ndarray
    """The pool's own compression factor, as an index into ``gammas`` (0 = none)."""
    cap: np.ndarray
    """Batch cap (max_num_seqs) per replica of each pool."""
    load_erlangs: np.ndarray
    """Offered load :math:`\\lambda E[S]` of each pool (busy slots on average)."""
    min_replicas_analytic: np.ndarray
    """:math:`N^*_p`: the least replica count the analytic model offers the pool, before availability inflation
    (pool scope: the SLO minimum; fleet scope: the utilisation floor :math:`N_\\rho`)."""
    gammas: tuple[float, ...] = (1.0,)
    decode_gpu: np.ndarray | None = None
    """Disaggregated prefill/decode: the decode option of each pair candidate (``gpu`` is then its prefill
    option), -1 for an aggregated pool (None: every pool is aggregated)."""
    decode_cap: np.ndarray | None = None
    """The decode pool's batch cap of each pair candidate (0 for an aggregated pool)."""
    choice_decode_replicas: np.ndarray | None = None
    """Decode replicas of each choice (0 for an aggregated pool; ``choice_replicas`` is then the prefill's)."""
    choice_decode_gpus: np.ndarray | None = None
    """GPUs of each choice on its decode option (0 for an aggregated pool; ``choice_gpus`` counts both phases)."""
    unsized_gpus: tuple[str, ...] = ()
    """GPU options left unsized because the solve's :class:`Deadline` passed while candidates were built (empty:
    every option was sized). Non-empty: the candidates are a subset, so a plan among them is not proven optimal
    and infeasibility among them proves nothing."""
    left_unsized: int = 0
    """Candidate rows (segment x GPU option) never sized because a feasible candidate of the same segment rules them
    out (``generate_candidates(..., bounded=...)``, :func:`bounded_sizing`)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.decode_gpu is None:
            set_(self, "decode_gpu", np.full(len(self.i), -1, dtype=np.int64))
        if self.decode_cap is None:
            set_(self, "decode_cap", np.zeros(len(self.i), dtype=np.int64))
        if self.choice_decode_replicas is None:
            set_(self, "choice_decode_replicas", np.zeros(len(self.choice_pool), dtype=np.int64))
        if self.choice_decode_gpus is None:
            set_(self, "choice_decode_gpus", np.zeros(len(self.choice_pool), dtype=np.int64))

    @property
    def is_pair(self) -> np.ndarray:
        """Per candidate: a disaggregated prefill/decode pair (True) or an aggregated pool."""
        return np.asarray(self.decode_gpu) >= 0

    @property
    def from_node(self) -> np.ndarray:
        """Path node at the pool's lower boundary: boundary x compression state."""
        return self.i * len(self.gammas) + self.state_in

    @property
    def to_node(self) -> np.ndarray:
        return self.j * len(self.gammas) + self.state_out

    def __len__(self) -> int:
        return len(self.i)

    @property
    def n_choices(self) -> int:
        return len(self.choice_pool)

    def uncovered(self) -> int | None:
        """The highest elementary segment :math:`(b_k, b_{k+1}]` that no candidate serves, or None when every
        length has one. Such a range proves the instance infeasible without a solve: every plan tiles
        :math:`(0, b_{max}]` with candidates (unless ``unsized_gpus`` says the candidates are a subset)."""
        covered = np.zeros(len(self.boundaries) - 1, dtype=bool)
        for i, j in zip(self.i, self.j):
            covered[i:j] = True
        return None if covered.all() else int(np.flatnonzero(~covered)[-1])

    def label(self, p: int) -> str:
        b = self.boundaries
        gamma = self.gammas[self.state_out[p]]
        return f"{int(b[self.i[p]]):,}-{int(b[self.j[p]]):,}:{self.pool_name(p)}" + (f"@{gamma:g}" if gamma > 1 else "")

    def pool_name(self, p: int) -> str:
        """The option a pool runs on, or ``PREFILL+DECODE`` for a pair
        (:func:`fleetopt.optimizer.plan.disagg_candidates.pair_label`)."""
        d = int(self.decode_gpu[p])  # type: ignore[index]
        name = self.gpu_names[self.gpu[p]]
        return name if d < 0 else f"{name}+{self.gpu_names[d]}"

    def keep_choices(self, keep: np.ndarray) -> Candidates:
        """Only the selected choices, and the candidates that still have one (indices renumbered)."""
        keep = np.asarray(keep, dtype=bool)
        pools = unique(self.choice_pool[keep])
        renumber = np.full(len(self), -1)
        renumber[pools] = np.arange(len(pools))
        pool_fields = {f: getattr(self, f)[pools] for f in ("i", "j", "gpu", "arrival_rate", "output_tok_per_s",
                                                           "state_in", "state_out", "cap", "load_erlangs",
                                                           "min_replicas_analytic", "decode_gpu", "decode_cap")}
        choice_fields = {f: getattr(self, f)[keep] for f in ("choice_replicas", "choice_gpus", "choice_cost_per_hr",
                                                             "choice_power_w", "choice_miss_rate",
                                                             "choice_decode_replicas", "choice_decode_gpus")}
        return Candidates(boundaries=self.boundaries, gpu_names=self.gpu_names,
                          choice_pool=renumber[self.choice_pool[keep]],
                          dropped=self.dropped, generated=self.generated, gammas=self.gammas,
                          unsized_gpus=self.unsized_gpus, left_unsized=self.left_unsized, **pool_fields,
                          **choice_fields)


def generate_candidates(instance: Instance, deadline: Deadline | None = None,
                        cache: SizingCache | None = None, *, bounded: str | None = None, top: int = 1) -> Candidates:
    """Size every (segment, GPU option, compression states, batch cap) candidate of the instance.

    With a ``deadline``, it is checked before each GPU option is sized; once it has passed, the remaining
    options are left out and named in ``Candidates.unsized_gpus`` (``generated`` counts the rows of the options
    sized only). With a ``cache`` (:class:`SizingCache`), what does not depend on the TTFT SLO is computed once
    across calls, and each count search starts at the count of the nearest looser SLO sized before; the
    candidates are the same as without it.

    ``bounded`` (a rule of :func:`bounded_sizing`, for a solve that wants its ``top`` best plans; not with a
    deadline or a cache, nor below :data:`MIN_BOUNDED_ROWS` rows): candidates ``top`` others of their segment rule
    out are left unsized (:func:`_size_bounded`, counted in ``Candidates.left_unsized``); every candidate sized has
    the columns the full sizing gives it.
    """
    if cache is not None:
        cache.check(instance)
    b = np.asarray(instance.pools.boundaries, dtype=float)
    gammas = (1.0,) + tuple(instance.pools.compress_gammas)
    rows = _candidate_rows(b, gammas)
    grid = unique(np.concatenate([b] + [g * b[1:-1] for g in gammas[1:]]))
    grid = grid[grid <= b[-1]]
    pools, choices, dropped = _Columns(), _Columns(), []
    unsized: list[str] = []
    aggregated = instance.pools.disaggregation != "only"
    options = list(enumerate(instance.gpus)) if aggregated else []
    workers = _sizing_workers(len(options), len(rows[0])) if cache is None and deadline is None else 1
    left_unsized = 0
    if bounded is not None and bounded not in BOUNDS:
        raise ValueError(f"bounded must be one of {BOUNDS} or None; got {bounded!r}")
    if bounded is not None and cache is None and deadline is None and len(options) > 1 \
            and len(options) * len(rows[0]) >= MIN_BOUNDED_ROWS:
        left_unsized = _size_bounded(instance, options, b, rows, gammas, grid, pools, choices, dropped, bounded,
                                     top)
        options = []
    elif workers > 1:
        _size_forked(instance, options, b, rows, gammas, grid, workers, pools, choices, dropped)
        options = []
    raws: dict[int, object] = {}  # chunk tokens -> raw sums of every row (_traffic)
    uses = Counter(opt.profile.chunk_tokens for _, opt in options)
    for g_idx, opt in options:
        if unsized or (deadline is not None and deadline.passed()):
            unsized.append(opt.name)
            continue
        inputs = None if cache is None else cache.inputs.get(g_idx)
        if inputs is None:
            chunk = opt.profile.chunk_tokens
            if chunk not in raws:  # the basis and the raw sums depend on the option through its chunk only
                raws[chunk] = _chunk_traffic(instance, b, gammas, grid, rows, chunk)
            inputs = _option_inputs(instance, opt, raws[chunk], b, rows)
            uses[chunk] -= 1
            if not uses[chunk]:  # kept only while a later option has the same chunk (peak memory)
                del raws[chunk]
            if cache is not None:
                cache.inputs[g_idx] = inputs
        dropped.extend(_slow_dropped(instance, opt, inputs, b, rows))
        _size_option(instance, g_idx, opt, inputs, b, rows, pools, choices, dropped, cache)
    empty = np.zeros(0)  # no option sized (the deadline passed first), or none with a feasible candidate
    P = {k: empty for k in ("i", "j", "gpu", "arrival_rate", "output_tok_per_s", "state_in", "state_out", "cap",
                            "load_erlangs", "min_replicas")} | pools.arrays()
    P.pop("row", None)  # the sizing's own bookkeeping (_pool_columns)
    C = {k: empty for k in ("pool", "replicas", "gpus", "cost", "power", "miss")} | choices.arrays()
    generated = len(rows[0]) * (len(instance.gpus) - len(unsized)) if aggregated else 0
    P["decode_gpu"], P["decode_cap"] = np.full(len(P["i"]), -1), np.zeros(len(P["i"]))
    C["decode_replicas"], C["decode_gpus"] = np.zeros(len(C["pool"])), np.zeros(len(C["pool"]))
    if instance.pools.disaggregation != "none" and not unsized and not (deadline is not None and deadline.passed()):
        from fleetopt.optimizer.plan.disagg_candidates import pair_candidates

        pc = pair_candidates(instance, b)
        generated += pc.generated
        dropped.extend(Dropped(lo, hi, name, why) for lo, hi, name, why in pc.dropped)
        first, n = len(P["i"]), len(pc.pools["i"])
        extra = {"state_in": np.zeros(n), "state_out": np.zeros(n), "cap": np.zeros(n)} | pc.pools
        P = {k: np.concatenate([v, np.asarray(extra[k], dtype=float)]) for k, v in P.items()}
        extra = pc.choices | {"pool": first + np.asarray(pc.choices["pool"])}
        C = {k: np.concatenate([v, np.asarray(extra[k], dtype=float)]) for k, v in C.items()}
    elif instance.pools.disaggregation != "none" and deadline is not None and deadline.passed() and not unsized:
        unsized.append("(disaggregated pairs)")
    return Candidates(boundaries=b, gpu_names=tuple(g.name for g in instance.gpus), i=P["i"].astype(np.int64),
                      j=P["j"].astype(np.int64), gpu=P["gpu"].astype(np.int64), arrival_rate=P["arrival_rate"],
                      output_tok_per_s=P["output_tok_per_s"], choice_pool=C["pool"].astype(np.int64),
                      choice_replicas=C["replicas"].astype(np.int64), choice_gpus=C["gpus"].astype(np.int64),
                      choice_cost_per_hr=C["cost"], choice_power_w=C["power"], choice_miss_rate=C["miss"],
                      dropped=tuple(dropped), generated=generated,
                      state_in=P["state_in"].astype(np.int64), state_out=P["state_out"].astype(np.int64),
                      cap=P["cap"].astype(np.int64), load_erlangs=P["load_erlangs"],
                      min_replicas_analytic=P["min_replicas"].astype(np.int64), gammas=gammas,
                      decode_gpu=P["decode_gpu"].astype(np.int64), decode_cap=P["decode_cap"].astype(np.int64),
                      choice_decode_replicas=C["decode_replicas"].astype(np.int64),
                      choice_decode_gpus=C["decode_gpus"].astype(np.int64), unsized_gpus=tuple(unsized),
                      left_unsized=left_unsized)


MIN_BOUNDED_ROWS = 2_000
"""Fewest candidate rows (segments x compression states x GPU options) for which a solve sizes them in bounded
rounds (:func:`_size_bounded`). Below it the second round's fixed costs outweigh what it leaves unsized; measured
in process (best of 3) on the bundled instances: 156-1,108 rows 6-22 % slower (a few milliseconds), 342 rows of
quickstart 14 % faster, 15,128 rows of the stress instance 0.62 -> 0.32 s, 118,096 of the large one 5.2 -> 0.55 s."""

MIN_FORKED_ROWS = 2_000
"""Fewest candidate rows (segments x compression states x GPU options) for which the GPU options are sized side by
side on forked workers (:mod:`fleetopt.optimizer.forked`). Measured on 2 cores (sizing in process, medians): 1,088
rows of 8 options 0.20 -> 0.15 s, 8,648 rows 0.60 -> 0.38 s, the stress instance's 15,128 rows 0.83 -> 0.53 s;
below about 1,000 rows starting the workers (15-20 ms) costs about what it saves (342 rows of 2 options: 0.049 s
in process, 0.065 s forked)."""


def _sizing_workers(options: int, rows_per_option: int) -> int:
    """Worker processes that size ``options`` GPU options of ``rows_per_option`` rows each: one per usable core up
    to one per option where forking is allowed and the work pays for it (:data:`MIN_FORKED_ROWS`), else 1."""
    from fleetopt.optimizer.forked import forkable, usable_cpus

    if options < 2 or options * rows_per_option < MIN_FORKED_ROWS or not forkable():
        return 1
    return min(options, usable_cpus())


def _chunk_traffic(instance: Instance, b, gammas, grid, rows, chunk: int):
    """:func:`_traffic` of every row for options with ``chunk``-token prefill chunks (the basis and the raw sums
    depend on an option through its chunk only)."""
    return _traffic(instance, _chunk_basis(instance, grid, chunk), grid, b, gammas, rows, chunk)


def _chunk_basis(instance: Instance, grid, chunk: int) -> SegmentBasis:
    """The workload's :class:`~fleetopt.models.segments.SegmentBasis` on ``grid`` for ``chunk``-token chunks."""
    from fleetopt.models.segments import segment_basis

    w = instance.workload
    return segment_basis(w.lengths, grid, chunk, w.input_fraction)


class _Rows:
    """The raw sums of some candidate rows, taken by row index as the sums of every row are (:meth:`take`, what an
    option's inputs read: :func:`_option_inputs`)."""

    def __init__(self, part: RawSums, at: np.ndarray, n: int):
        self.part, self.size = part, len(at)
        self.pos = np.full(n, -1, dtype=np.int64)
        self.pos[at] = np.arange(len(at))

    def take(self, idx) -> RawSums:
        at = self.pos[np.asarray(idx, dtype=np.int64)]
        assert np.all(at >= 0), "a row the round did not compute"
        if len(at) == self.size and np.array_equal(at, np.arange(self.size)):
            return self.part     # every row in order (an option alone on its chunk size): no copy (read only)
        return self.part.take(at)


class _RowSums:
    """The raw sums of the candidate rows per chunk size, computed for the rows a round sizes.

    :meth:`means` gives every row's sums without the chunk histograms' columns past the first, the prompt bins and
    the spectra (all the count floors read: :func:`_count_floors`); :meth:`sums` gives the full sums of
    :func:`_traffic` of the rows ``need`` marks (row by row: the values of computing every row), indexed as the
    sums of every row are (:class:`_Rows`). Nothing the size of all rows is allocated: a round's rows are about a
    third of them, and the prompt bins and spectra take some 10 KB a row. With compression states every row is
    computed, once per chunk size, and kept for the rounds (a compressed band may widen the histograms)."""

    def __init__(self, instance: Instance, b, gammas, grid, rows):
        self.instance, self.b, self.gammas, self.grid, self.rows = instance, b, gammas, grid, rows
        self._bases: dict[int, SegmentBasis] = {}
        self._every: dict[int, _Rows] = {}      # with compression states: every row's sums, per chunk size

    def _basis(self, chunk: int) -> SegmentBasis:
        if chunk not in self._bases:
            self._bases[chunk] = _chunk_basis(self.instance, self.grid, chunk)
        return self._bases[chunk]

    def _traffic(self, basis, rows) -> RawSums:
        return _traffic(self.instance, basis, self.grid, self.b, self.gammas, rows, basis.chunk_tokens)

    def means(self, chunk: int) -> RawSums:
        if len(self.gammas) > 1:
            full = self.sums(chunk, np.ones(len(self.rows[0]), dtype=bool)).part
            return replace(full, k_hist=full.k_hist[:, :1], prompt_bins=None, spectra=None)
        basis = self._basis(chunk)
        return self._traffic(replace(basis, chunk_mass_prefix=basis.chunk_mass_prefix[:, :1],
                                     prompt_bin_prefix=basis.prompt_bin_prefix[:, :1], spectra_prefix=None),
                             self.rows)

    def sums(self, chunk: int, need: np.ndarray) -> _Rows:
        n = len(self.rows[0])
        if len(self.gammas) > 1:
            if chunk not in self._every:
                self._every[chunk] = _Rows(self._traffic(self._basis(chunk), self.rows), np.arange(n), n)
            return self._every[chunk]
        at = np.flatnonzero(need)
        return _Rows(self._traffic(self._basis(chunk), tuple(r[at] for r in self.rows)), at, n)


def _size_forked(instance: Instance, options, b, rows, gammas, grid, workers: int, pools: _Columns,
                 choices: _Columns, dropped: list) -> None:
    """Each GPU option of ``options`` sized on its own forked worker (:func:`fleetopt.optimizer.forked.ordered_map`),
    its columns appended in the options' order: the same columns as sizing them one after the other here. The raw
    sums of each chunk size are computed here first, so every worker inherits them; a worker writes its dropped
    candidates' reasons (the solve's report reads them all)."""
    from fleetopt.optimizer.forked import ordered_map

    raws = {chunk: _chunk_traffic(instance, b, gammas, grid, rows, chunk)
            for chunk in dict.fromkeys(opt.profile.chunk_tokens for _, opt in options)}

    def size(item):
        g_idx, opt = item
        p, c, slow, d = _option_columns(instance, g_idx, opt, raws[opt.profile.chunk_tokens], b, rows, written=True)
        return p, c, slow + d

    for p, c, d in ordered_map(size, options, workers):
        first = len(pools)
        if p:
            pools.add(**p)
        if c:
            choices.add(**(c | {"pool": first + c["pool"]}))
        dropped.extend(d)


def _option_columns(instance: Instance, g_idx: int, opt, raw, b, rows, keep_rows: np.ndarray | None = None, *,
                    slow: bool = True, written: bool = False) -> tuple[dict, dict, list, list]:
    """One GPU option's sizing as arrays, for a forked worker to send back: its pool and choice columns
    (:func:`_size_option`; ``pool`` counts from 0), the rows too slow for a TPOT SLO (:func:`_slow_dropped`; none
    without ``slow``) and the dropped candidates. ``keep_rows``: only those rows (:func:`_option_inputs`);
    ``written``: every dropped reason written out (a worker's: the parent cannot call back into it)."""
    p, c, d = _Columns(), _Columns(), []
    inputs = _option_inputs(instance, opt, raw, b, rows, keep_rows)
    _size_option(instance, g_idx, opt, inputs, b, rows, p, c, d)
    too_slow = _slow_dropped(instance, opt, inputs, b, rows) if slow else []
    return p.arrays(), c.arrays(), too_slow, [replace(x, why=x.reason) for x in d] if written else d


BOUNDS = ("cost", "dominance")
"""The rules by which a solve may leave candidates unsized (:func:`bounded_sizing`, :func:`_size_bounded`)."""


def bounded_sizing(instance: Instance, top: int = 1, method: str = "auto") -> str | None:
    """Which candidates a solve of ``instance`` may leave unsized (:func:`_size_bounded`), or None: size them all.

    Both rules hold under the pool-scope SLO (a candidate's miss rate is then not a figure of the MIP), routed by
    length to one model class, for a solve that wants its ``top`` :math:`N` best plans:

    * ``"dominance"``: a candidate :math:`N` candidates of its segment dominate, as :func:`prune_dominated` would
      drop it (strictly cheaper, no more power and GPUs, and free to stand in for it). The pruned candidates are
      then exactly those of the full sizing (what the unsized ones dominate, their dominators dominate too), so
      the MIP (or the oracle) is the same and so is its answer;
    * ``"cost"``, where nothing but cost decides (objective ``cost``, solved by the graph oracle or for
      ``--top N`` by the MIP: no inventory, pool-count, GPU, budget or power limit,
      :attr:`fleetopt.solvers.problem.FleetProblem.separable`): a candidate that costs more than :math:`N` feasible
      candidates of its segment, whatever its power and GPUs. Swapping it for any of them keeps a plan valid and
      lowers its cost, so a plan that uses it has :math:`N` cheaper ones and is not among the :math:`N` best; with
      one plan, the oracle's search reads each segment's best choice alone
      (:func:`fleetopt.solvers.oracle.shortest_fleet`).
    """
    if instance.slo.scope != "pool" or instance.semantic is not None or instance.pools.routing == "split":
        return None
    c = instance.constraints
    separable = (c.max_total_gpus is None and c.max_cost_per_hr is None and c.max_power_kw is None
                 and all(g.max_count is None and not g.min_count and g.max_pools is None and not g.min_pools
                         for g in instance.gpu_inventories()))
    if separable and instance.objective == "cost" and method in ("auto", "oracle"):
        return "cost"
    return "dominance"


def _count_floors(instance: Instance, opt, raw, b, rows) -> np.ndarray:
    """Per row of ``rows``: the fewest replicas (deployed: after availability inflation) any candidate of the row
    on ``opt`` can have, the least of its batch caps' utilisation floors
    (:meth:`fleetopt.models.queueing.ttft.TTFTModel.count_floor`, where every count search starts); inf for a row
    without a candidate. Closed form on the segment statistics' means: ``raw`` may lack what only the miss
    probabilities read (:meth:`_RowSums.means`; ``tests/test_bounded_sizing.py`` checks the floors against the
    full statistics')."""
    from fleetopt.models.segments import stats_from_raw

    ii, jj = rows[0], rows[1]
    idx, caps, _ = batch_caps(instance, opt.profile, b[jj])
    s = stats_from_raw(raw.take(idx), b[ii[idx]], b[jj[idx]], opt.profile, n_slots=caps)
    model = ttft_model(instance.slo.ttft_model)
    floor = model.count_floor(model.traffic(s, instance.workload.arrival_rate_req_per_s * s.rate_share),
                              instance.constraints.max_utilization)
    out = np.full(len(ii), np.inf)
    np.minimum.at(out, idx, np.asarray(inflate_for_availability(floor, opt.availability), dtype=float))
    return out


def _size_bounded(instance: Instance, options, b, rows, gammas, grid, pools: _Columns, choices: _Columns,
                  dropped: list, bound: str, top: int = 1) -> int:
    r"""Size only the candidates the solve may need, in two rounds; returns how many (row, option) pairs were left
    unsized.

    Each row (a segment :math:`(i, j)` with its compression states) is served by one candidate per GPU option
    :math:`g` (several with batch caps). Every count search starts at the utilisation floor, so a candidate has at
    least :math:`\underline n_g` deployed replicas (:func:`_count_floors`) and costs at least
    :math:`\underline\kappa_g = \kappa^{rep}_g \underline n_g`, with at least :math:`\underline P_g =
    P^{min}_g \underline n_g` watts (:func:`fleetopt.models.power.power_floor_w`) and
    :math:`\underline G_g = G^{rep}_g \underline n_g` GPUs. Round one sizes, per row, the ``top`` :math:`N` options
    of the least :math:`\underline\kappa` among those that may stand in for any other (no inventory or pool-count
    limit; under ``bound="cost"`` every option); round two every other option unless :math:`N` of round one's
    feasible candidates :math:`y` of the row (each option's cheapest) rule it out:

    .. math::

        \kappa_y < \underline\kappa_g \quad (\text{``cost''}), \qquad
        \kappa_y < \underline\kappa_g,\ P_y \le \underline P_g,\ G_y \le \underline G_g,
        \ g \text{ without a lower bound} \quad (\text{``dominance''})

    (:func:`bounded_sizing` says why either suffices). The floors read every row's means; the full raw sums (chunk
    histograms, prompt bins, spectra) are computed for the rows a round sizes only (:class:`_RowSums`). Each round
    sizes the options on forked workers as :func:`_size_forked` does; an option's candidates come back in its row
    order, each with the columns the full sizing gives it (a candidate's sizing reads its own row only:
    ``tests/test_bounded_sizing.py``).
    """
    from fleetopt.models.power import power_floor_w
    from fleetopt.optimizer.forked import ordered_map

    sums = _RowSums(instance, b, gammas, grid, rows)
    means = {chunk: sums.means(chunk) for chunk in dict.fromkeys(opt.profile.chunk_tokens for _, opt in options)}
    counts = np.stack([_count_floors(instance, opt, means[opt.profile.chunk_tokens], b, rows) for _, opt in options])
    del means
    profiles = [opt.profile for _, opt in options]
    cost = counts * np.array([p.cost_usd_per_hr for p in profiles])[:, None]
    has = np.isfinite(counts)
    inventories, entry_of = instance.gpu_inventories(), instance.inventory_of_options()
    entries = [inventories[entry_of[g_idx]] for g_idx, _ in options]
    free = np.array([bound == "cost" or (e.max_count is None and e.max_pools is None) for e in entries])
    guarded = np.array([bound != "cost" and bool(e.min_count or e.min_pools) for e in entries])
    ranked = np.argsort(np.where(free[:, None], cost, np.inf), axis=0, kind="stable")   # ties: the first first
    first = np.zeros_like(has)
    np.put_along_axis(first, ranked[:top], True, axis=0)
    first &= has & free[:, None]

    def run(masks, report_slow: bool):
        items = [(k, m) for k, m in enumerate(masks) if m.any() or report_slow]
        workers = _sizing_workers(len(items), -(-int(sum(m.sum() for _, m in items)) // max(len(items), 1)))
        need: dict[int, np.ndarray] = {}    # per chunk size, the rows this round sizes on an option that has it
        for k, m in items:
            chunk = options[k][1].profile.chunk_tokens
            need[chunk] = need[chunk] | m if chunk in need else m
        raws = {chunk: sums.sums(chunk, m) for chunk, m in need.items()}     # (computed here: the workers inherit)

        def size(item):
            k, mask = item
            g_idx, opt = options[k]
            return k, *_option_columns(instance, g_idx, opt, raws[opt.profile.chunk_tokens], b, rows, mask,
                                       slow=report_slow, written=workers > 1)

        return {k: (p, c, slow, d) for k, p, c, slow, d in ordered_map(size, items, workers)}

    one = run(first, True)
    if bound == "dominance":
        power = counts * np.array([power_floor_w(p.power) for p in profiles])[:, None]
        gpus = counts * np.array([p.gpus_per_replica for p in profiles])[:, None]
    # per row, how many of round one's options have a feasible candidate y (the option's cheapest of the row, with
    # its power and GPUs) that rules each option out
    beaten = np.zeros(cost.shape, dtype=np.int64)
    for p, c, _, _ in one.values():
        if not len(c.get("pool", ())):
            continue
        row = p["row"][c["pool"].astype(np.int64)]
        order = np.lexsort((c["cost"], row))                # by row, the cheapest first
        lead = order[np.r_[True, row[order][1:] != row[order][:-1]]]
        best = np.full((3, len(rows[0])), np.inf)
        best[:, row[lead]] = np.stack([c["cost"], c["power"], c["gpus"]])[:, lead]
        rules = best[0][None, :] < cost
        if bound == "dominance":
            rules &= (best[1][None, :] <= power) & (best[2][None, :] <= gpus) & ~guarded[:, None]
        beaten += rules
    second = has & ~first & (beaten < top)
    two = run(second, False)
    empty: tuple = ({}, {}, [], [])
    for k in range(len(options)):
        _merge_rounds(one.get(k, empty), two.get(k, empty), pools, choices, dropped)
    return int((has & ~first & ~second).sum())


def _merge_rounds(a, b, pools: _Columns, choices: _Columns, dropped: list) -> None:
    """One option's candidates of two rounds ``(pools, choices, slow rows, dropped)`` appended in row (then batch
    cap) order with their choices (``pool`` renumbered), and its dropped candidates as one sizing of the option
    lists them: the rows too slow for the TPOT SLO, then the others in segment order."""
    parts = [x for x in (a, b) if x[0] and len(x[0]["row"])]
    if parts:
        P = {k: np.concatenate([x[0][k] for x in parts]) for k in parts[0][0]}
        C = {k: np.concatenate([x[1][k] for x in parts]) for k in parts[0][1]}
        if len(parts) == 2:
            C["pool"] = C["pool"] + np.r_[np.zeros(len(parts[0][1]["pool"])), np.full(len(parts[1][1]["pool"]),
                                                                                       len(parts[0][0]["row"]))]
        order = np.lexsort((P["cap"], P["row"]))
        at = np.empty(len(order), dtype=np.int64)
        at[order] = np.arange(len(order))
        C["pool"] = at[C["pool"].astype(np.int64)]
        by = np.argsort(C["pool"], kind="stable")
        first = len(pools)
        pools.add(**{k: v[order] for k, v in P.items()})
        choices.add(**({k: v[by] for k, v in C.items()} | {"pool": first + C["pool"][by]}))
    dropped.extend(list(a[2]) + sorted(list(a[3]) + list(b[3]), key=lambda d: (d.lo_tokens, d.hi_tokens)))


class SizingCache:
    """What candidate sizing keeps across solves of instances that differ only in the TTFT SLO (a cost,ttft
    frontier re-solves one instance under ever tighter SLOs).

    Per GPU option it keeps the SLO-independent inputs (traffic statistics, batch caps), and per (option, SLO)
    sized (batched model, pool scope) each candidate's least count :math:`N_t`. Sizing at a new SLO :math:`s`
    starts each search at the count of the nearest looser SLO :math:`t \\ge s` sized before:
    :math:`P(T > s \\mid N) \\ge P(T > t \\mid N)`, so :math:`N_t - 1` fails at :math:`s` too
    (``at_least`` of :func:`fleetopt.models.queueing.batched.batched_min_replicas`); the counts are the same as a search
    from the utilisation floor. :meth:`check` refuses an instance that differs from the first one seen in
    anything the inputs read.

    (Tried and dropped: probing each count found at a slightly tighter SLO, so that the next re-solves skip the
    candidates that still pass. On the stress instance's frontier it cost more than it saved: the candidates
    near their limit, which the probe cannot clear, are the ones whose evaluation is dear.)
    """

    def __init__(self):
        self.inputs: dict[int, tuple] = {}
        self._counts: dict[int, list[tuple[float, np.ndarray]]] = {}
        self._key = None

    @staticmethod
    def _fingerprint(instance: Instance):
        w, slo, pools = instance.workload, instance.slo, instance.pools
        return (w.source, w.arrival_rate_req_per_s, w.input_fraction, w.truncated_share, slo.ttft_model, slo.scope,
                slo.tpot_p99_s, tuple(pools.boundaries), tuple(pools.compress_gammas), pools.compress_success,
                instance.constraints.max_utilization,
                tuple((g.name, g.profile.name, g.availability) for g in instance.gpus))

    def check(self, instance: Instance) -> None:
        """Raise ``ValueError`` unless ``instance`` differs from the first one seen only in the TTFT SLO."""
        key = self._fingerprint(instance)
        if self._key is None:
            self._key = key
        elif key != self._key:
            raise ValueError("SizingCache: the instance differs from the cached one in more than slo.ttft_p99_ms")

    def size(self, model: TTFTModel, g_idx: int, traffic, slo_s: float, rho_max: float) -> Sizing:
        """The least counts of option ``g_idx``'s candidates at ``slo_s`` under ``model`` (one that takes a lower
        bound, :attr:`fleetopt.models.queueing.ttft.TTFTModel.warm_start`; class docstring)."""
        looser = [(t, n) for t, n in self._counts.get(g_idx, ()) if t >= slo_s]
        start = min(looser, key=lambda tn: tn[0])[1] if looser else None
        z = model.min_replicas(traffic, slo_s, rho_max, at_least=start)
        # a candidate no count serves here is served by none at a tighter SLO: its search starts at the cap
        self._counts.setdefault(g_idx, []).append((float(slo_s), np.where(z.feasible, z.replicas, _NO_COUNT)))
        return z

    def feasible_rows(self, g_idx: int) -> np.ndarray:
        """Positions, among option ``g_idx``'s sized rows, of the candidates its last sizing found a count for (the
        order :func:`generate_candidates` lists them in)."""
        sized = self._counts.get(g_idx)
        return np.zeros(0, dtype=np.int64) if not sized else np.flatnonzero(sized[-1][1] < _NO_COUNT)


class TighteningCandidates:
    r"""The candidates of one instance under a TTFT SLO that only tightens (a cost,ttft frontier), sized lazily.

    Pool scope and the batched model (one replica choice per candidate). Built at the instance's own SLO
    :math:`t_0`, every candidate sized exactly (:func:`generate_candidates`); one that no count serves at
    :math:`t_0` serves none at a tighter SLO and is gone. At a tighter SLO :math:`s` (:meth:`tighten`) each
    candidate keeps the count :math:`N_t` it was last sized to, a *lower bound* of its least count at :math:`s`
    (:math:`P(T > s \mid N) \ge P(T > t \mid N)`), until :meth:`verify` sizes it at :math:`s` (a search that
    starts at :math:`N_t`). :meth:`table` gives the candidates with those counts. Cost and GPUs grow with the
    count, and so does power from a stable count on (a replica added draws its idle power and the load's work
    is the same; ``tests/test_sizing_cache.py`` checks it on every candidate of the stress instance), so the
    table is a relaxation: a plan's figures in it are at most its figures at :math:`s`, every
    plan feasible at :math:`s` is feasible in it, and an optimum of the table whose candidates are all verified
    at :math:`s` (their counts exact) is an optimum at :math:`s`. The caller solves, verifies the chosen
    candidates, and solves again while a verification changed a count
    (:func:`fleetopt.optimizer.workflows.frontier.frontier`). Dominance pruning of a table stays valid: a
    candidate dropped for one no worse in the table can be swapped for it in any plan, so the relaxation's
    optimum is no dearer than the optimum at :math:`s`.
    """

    def __init__(self, instance: Instance):
        self.model = ttft_model(instance.slo.ttft_model)
        if instance.slo.scope != "pool" or not self.model.warm_start:
            raise ValueError("TighteningCandidates: needs slo.scope pool and a ttft_model that sizes from a lower "
                             "bound (batched)")
        if instance.pools.disaggregation != "none":
            raise ValueError("TighteningCandidates: sizes aggregated pools only (pools.disaggregation none)")
        self.instance = instance
        self.slo_s = float(instance.slo.ttft_sizing_s)
        self._cache = SizingCache()
        c = generate_candidates(instance, cache=self._cache)
        if not np.array_equal(c.choice_pool, np.arange(len(c))):
            raise ValueError("TighteningCandidates: expected one replica choice per candidate")
        self._base = c
        self._rows = _candidate_rows(c.boundaries, c.gammas)
        self._cols = {f: getattr(c, f).copy() for f in _TABLE_FIELDS}
        self._row_of = np.zeros(len(c), dtype=np.int64)
        for g in range(len(instance.gpus)):
            mine = np.flatnonzero(c.gpu == g)
            if mine.size:
                self._row_of[mine] = self._cache.feasible_rows(g)
        self._exact_at = np.full(len(c), self.slo_s)
        self.alive = np.ones(len(c), dtype=bool)

    def tighten(self, slo_s: float) -> None:
        """Move to sizing target ``slo_s`` (an SLO less its margin, ``SLO.ttft_sizing_s``; no looser than the
        current one): every count becomes a lower bound."""
        if slo_s > self.slo_s * (1 + 1e-12):
            raise ValueError(f"TighteningCandidates: {slo_s} s is looser than the current {self.slo_s} s")
        self.slo_s = float(slo_s)

    def table(self) -> tuple[Candidates, np.ndarray]:
        """The live candidates with their current counts (exact or lower bounds), and each one's id (what
        :meth:`verify` takes)."""
        ids = np.flatnonzero(self.alive)
        c = replace(self._base, **{f: self._cols[f] for f in _TABLE_FIELDS}).keep_choices(self.alive)
        return c, ids

    def ids_of(self, table: Candidates, ids: np.ndarray, pruned: Candidates, pools) -> np.ndarray:
        """The ids of pools ``pools`` of ``pruned`` (``table`` after :meth:`Candidates.keep_choices`)."""
        where = {k: n for n, k in enumerate(_pool_keys(table))}
        keys = _pool_keys(pruned)
        return np.array([ids[where[keys[int(p)]]] for p in pools], dtype=np.int64)

    def verify(self, ids) -> bool:
        """Size candidates ``ids`` exactly at the current SLO; True when every one of them kept its count (none
        changed, none is infeasible now)."""
        ids = np.asarray(ids, dtype=np.int64)
        todo = ids[self.alive[ids] & (self._exact_at[ids] != self.slo_s)]
        unchanged = bool(self.alive[ids].all())
        inst = self.instance
        gpu = self._base.gpu
        for g in unique(gpu[todo]):
            t = todo[gpu[todo] == g]
            opt, inputs = inst.gpus[int(g)], self._cache.inputs[int(g)]
            rows = self._row_of[t]
            z = self.model.min_replicas(inputs[5].take(rows), self.slo_s, inst.constraints.max_utilization,
                                        at_least=self._cols["min_replicas_analytic"][t])
            self._exact_at[t] = self.slo_s
            self.alive[t[~z.feasible]] = False
            moved = z.feasible & (z.replicas != self._cols["min_replicas_analytic"][t])
            unchanged = unchanged and bool(z.feasible.all()) and not bool(moved.any())
            if moved.any():
                self._update(int(g), opt, inputs, t[moved], rows[moved], z.replicas[moved])
        return unchanged

    def _update(self, g: int, opt, inputs, t, rows, counts) -> None:
        pool = _pool_columns(g, inputs, self._rows, rows, counts)
        choice = _choice_columns(opt, inputs, rows, counts, np.zeros(len(rows)))
        self._cols["load_erlangs"][t] = pool["load_erlangs"]
        self._cols["min_replicas_analytic"][t] = pool["min_replicas"]
        for f, k in (("choice_replicas", "replicas"), ("choice_gpus", "gpus"), ("choice_cost_per_hr", "cost"),
                     ("choice_power_w", "power")):
            self._cols[f][t] = choice[k]


_TABLE_FIELDS = ("load_erlangs", "min_replicas_analytic", "choice_replicas", "choice_gpus", "choice_cost_per_hr",
                 "choice_power_w")
"""The :class:`Candidates` fields a :class:`TighteningCandidates` count change re-prices."""


def _pool_keys(c: Candidates) -> list[tuple]:
    """One hashable key per candidate pool: segment, GPU option, compression states and batch cap."""
    return list(zip(c.i.tolist(), c.j.tolist(), c.gpu.tolist(), c.state_in.tolist(), c.state_out.tolist(),
                    c.cap.tolist()))


def _candidate_rows(b: np.ndarray, gammas: tuple[float, ...]):
    """All (i, j, state in, state out) with i < j whose compression bands fit: arrays ``ii, jj, sin, sout``.

    A pool entered in state :math:`s > 0` lost :math:`(b_i, \\gamma_s b_i]` to the pool below, so that band must
    end within it; a pool leaving in state :math:`s > 0` needs a pool above it for its band.
    """
    top = len(b) - 1
    parts = []
    for s_in in range(len(gammas)):
        for s_out in range(len(gammas)):
            ii, jj = np.triu_indices(len(b), k=1)
            ok = np.ones(len(ii), dtype=bool)
            if s_in:
                ok &= (ii > 0) & (gammas[s_in] * b[ii] <= b[jj])
            if s_out:
                ok &= (jj < top) & (gammas[s_out] * b[jj] <= b[-1])
            parts.append((ii[ok], jj[ok], np.full(ok.sum(), s_in), np.full(ok.sum(), s_out)))
    return tuple(np.concatenate(x) for x in zip(*parts))


def _traffic(instance: Instance, basis, grid: np.ndarray, b: np.ndarray, gammas, rows, chunk: int):
    """Raw moment sums of every candidate's traffic: its range, less the band the pool below compresses
    away, plus its own compressed band (see :func:`fleetopt.models.fleet.evaluate_fleet`)."""
    from fleetopt.models.segments import RawSums, compressed_band, raw_between

    w = instance.workload
    p_c = instance.pools.compress_success
    ii, jj, sin, sout = rows
    at = {float(x): n for n, x in enumerate(grid)}
    gi = np.array([at[float(x)] for x in b[ii]], dtype=np.int64)
    gj = np.array([at[float(x)] for x in b[jj]], dtype=np.int64)
    gm = np.array([at.get(float(gammas[s] * b[i]), at[float(b[i])]) for i, s in zip(ii, sin)], dtype=np.int64)
    if np.any(sin > 0):
        raw = raw_between(basis, gi, gm).scaled(np.where(sin > 0, 1.0 - p_c, 1.0)) + raw_between(basis, gm, gj)
    else:   # no pool entered compressed: every range starts at its own boundary (gm = gi; the band's sums are 0)
        raw = raw_between(basis, gm, gj)
    if len(gammas) == 1 or p_c == 0:
        return raw
    top = len(b) - 1
    zero = raw_between(basis, [0], [0])
    for s in range(1, len(gammas)):
        # row j + 1: the p_c share of (b_j, gamma_s b_j] compressed to b_j; row 0: nothing
        bands = RawSums.stack([zero] + [compressed_band(w.lengths, b[j], gammas[s], chunk, w.input_fraction)
                                        .scaled([p_c])
                                        if 0 < j < top and gammas[s] * b[j] <= b[-1] else zero
                                        for j in range(len(b))])
        raw = raw + bands.take(np.where(sout == s, jj + 1, 0))
    return raw


def _option_inputs(instance: Instance, opt, raw, b, rows, keep_rows: np.ndarray | None = None) -> tuple:
    """What sizing one GPU option's candidates reads that no TTFT SLO changes: rows and batch caps, the rows too
    slow for the TPOT SLO, segment statistics, arrival rates, the TTFT model's view of the traffic and the model
    (:class:`fleetopt.models.queueing.ttft.TTFTModel`). ``keep_rows`` (a mask over ``rows``): only the
    candidates of those rows (every statistic is a function of its own row: the same values as in the whole)."""
    from fleetopt.models.segments import stats_from_raw

    ii, jj = rows[0], rows[1]
    prof = opt.profile
    idx, caps, slow = batch_caps(instance, prof, b[jj])
    if keep_rows is not None:
        at = keep_rows[idx]
        idx, caps = idx[at], caps[at]
    s = stats_from_raw(raw.take(idx), b[ii[idx]], b[jj[idx]], prof, n_slots=caps)
    lam = instance.workload.arrival_rate_req_per_s * s.rate_share
    model = ttft_model(instance.slo.ttft_model)
    return idx, caps, slow, s, lam, model.traffic(s, lam), model


def _slow_dropped(instance: Instance, opt, inputs, b, rows) -> list[Dropped]:
    """The rows of ``opt`` whose smallest batch already breaks the TPOT SLO (they have no candidate), as dropped
    candidates (the uncompressed segments only: the compressed variants say nothing new)."""
    ii, jj, sin, sout = rows
    slow = inputs[2]
    return [Dropped(int(b[ii[k]]), int(b[jj[k]]), opt.name, _tpot_reason(instance, opt.profile, b[jj[k]]))
            for k in np.flatnonzero(slow & (sin == 0) & (sout == 0))]


def _size_option(instance: Instance, g_idx: int, opt, inputs, b, rows, pools, choices, dropped,
                 cache: SizingCache | None = None) -> None:
    """Sizing and replica choices of one GPU option's candidates (appended to the columns; the candidates no
    count serves to ``dropped``, the rows too slow for a TPOT SLO left to :func:`_slow_dropped`)."""
    ii, jj, sin, sout = rows
    idx, caps, slow, s, lam, traffic, model = inputs
    if instance.slo.scope == "fleet":
        counts, ok, reasons = fleet_counts(instance, s, lam)
    else:
        sized = None
        if cache is not None and model.warm_start:
            sized = cache.size(model, g_idx, traffic, instance.slo.ttft_sizing_s,
                               instance.constraints.max_utilization)
        counts, ok, reasons = pool_counts(instance, s, lam, traffic, sized)
    largest_cap = np.r_[idx[1:] != idx[:-1], True]  # rows are sorted by (row, cap)
    for k in np.flatnonzero(~ok & largest_cap):
        r = idx[k]
        if sin[r] == 0 and sout[r] == 0:  # compressed variants of a dropped segment say nothing new
            dropped.append(Dropped(int(b[ii[r]]), int(b[jj[r]]), opt.name, partial(reasons.__getitem__, k)))
    keep = np.flatnonzero(ok)
    least_n, owner, all_n, miss = _flat_counts(counts, keep)
    first = len(pools)
    pools.add(**_pool_columns(g_idx, inputs, rows, keep, least_n))
    if len(keep):
        choices.add(pool=first + owner, **_choice_columns(opt, inputs, keep[owner], all_n, miss))


def _pool_columns(g_idx: int, inputs, rows, keep: np.ndarray, least_n: np.ndarray) -> dict:
    """The pool columns of option ``g_idx``'s sized rows ``keep`` (positions in ``inputs``' arrays) with least
    counts ``least_n`` (:class:`Candidates`); the offered load is the model's at the least count (restrict
    re-prices with it)."""
    ii, jj, sin, sout = rows
    idx, caps, _, s, lam, traffic, model = inputs
    load = model.load_erlangs(traffic.take(keep), least_n)
    return dict(i=ii[idx[keep]], j=jj[idx[keep]], gpu=np.full(len(keep), g_idx), arrival_rate=lam[keep],
                output_tok_per_s=lam[keep] * np.nan_to_num(s.mean_output_tokens[keep]),
                state_in=sin[idx[keep]], state_out=sout[idx[keep]], cap=caps[keep], load_erlangs=load,
                min_replicas=np.asarray(least_n, dtype=np.int64), row=idx[keep])


def _choice_columns(opt, inputs, row: np.ndarray, counts: np.ndarray, miss: np.ndarray) -> dict:
    """The choice columns (replicas after availability inflation, GPUs, $/hr, W, misses/s) of ``counts`` replicas
    of sized rows ``row`` of ``opt``."""
    prof = opt.profile
    _, _, _, s, lam, traffic, model = inputs
    n = inflate_for_availability(np.asarray(counts), opt.availability)
    power = model.power_w(prof, traffic.take(row), n)
    return dict(replicas=n, gpus=n * prof.gpus_per_replica, cost=n * prof.cost_usd_per_hr, power=power,
                miss=lam[row] * miss)





CAP_LEVELS = (1.0, 0.5, 0.25)
"""With a TPOT SLO, each window offers these fractions of its largest TPOT-feasible batch cap."""


def batch_caps(instance: Instance, profile, windows: np.ndarray):
    """Candidate rows and batch caps: one per row without a TPOT SLO, else up to one per cap level.

    Returns (row indices into ``windows``, caps, rows whose smallest batch already breaks the TPOT SLO).
    """
    full = np.asarray(profile.n_slots(windows.astype(np.int64)), dtype=np.int64)
    tpot = instance.slo.tpot_p99_s
    if tpot is None:
        return np.arange(len(windows)), full, np.zeros(len(windows), dtype=bool)
    top = np.minimum(full, tpot_batch_cap(profile, windows, tpot))
    slow = (top < 1) & (full >= 1)
    rows, caps, seen = [], [], set()
    for level in CAP_LEVELS:
        cap = np.floor(level * top).astype(np.int64)
        for r in np.flatnonzero(cap >= 1):
            if (r, cap[r]) not in seen:
                seen.add((r, cap[r]))
                rows.append(r)
                caps.append(cap[r])
    order = np.lexsort((np.array(caps), np.array(rows))) if rows else np.zeros(0, dtype=int)
    return np.array(rows, dtype=np.int64)[order], np.array(caps, dtype=np.int64)[order], slow


def _tpot_reason(instance: Instance, profile, window: float) -> str:
    t = float(tpot_bound_s(profile, 1, window)) * MS_PER_S
    tpot_s = instance.slo.tpot_p99_s
    assert tpot_s is not None    # only a TPOT SLO drops a candidate for its TPOT
    return (f"one sequence at the {int(window):,}-token window decodes in {t:,.1f} ms per token, above the "
            f"{tpot_s * MS_PER_S:,.4g} ms TPOT SLO")


class _Columns:
    """Accumulates named numpy columns."""

    def __init__(self):
        self._cols: dict[str, list] = {}
        self._n = 0

    def add(self, **cols):
        for k, v in cols.items():
            self._cols.setdefault(k, []).append(np.asarray(v))
        self._n += len(next(iter(cols.values())))

    def __len__(self):
        return self._n

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in self._cols.items()}


def pool_counts(instance: Instance, s, lam, traffic=None, sized: Sizing | None = None):
    """Pool scope: the minimum count meeting the pool's own P99 (one choice, no misses counted).

    ``traffic``: the TTFT model's view of ``s`` (:meth:`fleetopt.models.queueing.ttft.TTFTModel.traffic`) if built
    already; ``sized``: its :class:`~fleetopt.models.queueing.erlang.Sizing` if sized already
    (:class:`SizingCache`). Returns the counts of the feasible candidates, the feasible mask and the reasons of the
    others (a mapping, each reason written when read).
    """
    slo = instance.slo
    model = ttft_model(slo.ttft_model)
    traffic = model.traffic(s, lam) if traffic is None else traffic
    z = sized if sized is not None else model.min_replicas(traffic, slo.ttft_sizing_s,
                                                           instance.constraints.max_utilization)
    counts = _OneCount(np.asarray(z.replicas, dtype=np.int64), np.asarray(z.feasible, dtype=bool))
    bad = np.flatnonzero(~z.feasible)
    return counts, z.feasible, _Reasons(bad, _reason_writer(model, traffic, z.reason, bad, s, slo))


class _OneCount(Mapping):
    """Pool scope's counts: candidate ``k`` (feasible) -> ``(array([N*]), array([0.0]))``, the shape of
    :func:`fleet_counts`' choices, held as one array (``replicas``)."""

    def __init__(self, replicas: np.ndarray, feasible: np.ndarray):
        self.replicas, self.feasible = replicas, feasible

    def __getitem__(self, k):
        if not self.feasible[int(k)]:
            raise KeyError(k)
        return np.array([self.replicas[int(k)]]), np.array([0.0])

    def __iter__(self):
        return iter(np.flatnonzero(self.feasible).tolist())

    def __len__(self) -> int:
        return int(self.feasible.sum())


def _flat_counts(counts, keep: np.ndarray):
    """The choices of candidates ``keep`` flattened: each one's least count, and per choice its candidate
    (position in ``keep``), count and miss probability."""
    if isinstance(counts, _OneCount):
        n = counts.replicas[keep]
        return n, np.arange(len(keep)), n, np.zeros(len(keep))
    if not len(keep):
        return (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                np.zeros(0))
    owner = np.concatenate([np.full(len(counts[k][0]), k_local) for k_local, k in enumerate(keep)])
    return (np.array([int(counts[k][0][0]) for k in keep], dtype=np.int64), owner,
            np.concatenate([counts[k][0] for k in keep]), np.concatenate([counts[k][1] for k in keep]))


class _Reasons(Mapping):
    """Why each infeasible candidate is dropped, written only when read (most never are)."""

    def __init__(self, keys, reason: Callable[[int], str]):
        self._keys = [int(k) for k in keys]
        self._set = set(self._keys)
        self._reason = reason

    def __getitem__(self, k) -> str:
        if int(k) not in self._set:
            raise KeyError(k)
        return self._reason(int(k))

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def fleet_counts(instance: Instance, s, lam):
    """Fleet scope: counts from the utilisation floor until the miss probability reaches its limit."""
    slo = instance.slo
    total = instance.workload.arrival_rate_req_per_s
    model = ttft_model(slo.ttft_model)
    traffic = model.traffic(s, lam)
    floor = model.min_replicas(traffic, np.inf, instance.constraints.max_utilization)
    limit = model.prefill_miss_share(traffic, slo.ttft_sizing_s)
    ok = floor.feasible & (lam * limit <= P99_TAIL * total * (1 + 1e-12))
    reasons = {}
    infeasible = np.flatnonzero(~floor.feasible)
    floor_reason = _reason_writer(model, traffic, floor.reason, infeasible, s, slo)
    for k in np.flatnonzero(~ok):
        if not floor.feasible[k]:
            reasons[int(k)] = floor_reason(int(k))
        else:
            reasons[int(k)] = (f"requests whose prefill alone exceeds {slo.sizing_text()} are "
                               f"{lam[k] * limit[k] / total:.2%} "
                               "of all traffic, above the fleet's 1 % budget")
    counts = {}
    active = np.flatnonzero(ok)
    per = {int(k): ([], []) for k in active}
    for extra in range(MAX_EXTRA_COUNTS + 1):
        if not len(active):
            break
        n = floor.replicas[active] + extra
        miss = model.miss_probability(slo.ttft_sizing_s, traffic.take(active), n)
        miss = np.where(lam[active] > 0, miss, 0.0)
        for k, nk, mk in zip(active, n, miss):
            per[int(k)][0].append(int(nk))
            per[int(k)][1].append(float(mk))
        active = active[miss > limit[active] + 1e-9]
    for k, (ns, ms) in per.items():
        counts[k] = (np.array(ns), np.array(ms))
    return counts, ok, reasons


def _reason_writer(model: TTFTModel, traffic, codes: np.ndarray, bad: np.ndarray, s, slo) -> Callable[[int], str]:
    """Why candidate ``k`` (one of ``bad``, with sizing reason ``codes[k]``) is dropped. The prefill floors
    (:meth:`fleetopt.models.queueing.ttft.TTFTModel.prefill_floor_s`) of every candidate dropped for its prefill are
    computed together, the first time one is asked for. The writer keeps only what it reads: the windows, the codes
    of ``bad`` and the traffic of the candidates dropped for their prefill (keeping the whole option's traffic and
    statistics held every GPU option's arrays until the candidates were dropped: 1.3 GB on the large instance)."""
    floors: dict[int, float] = {}
    code_of = {int(k): str(codes[k]) for k in bad}
    hi_tokens = np.array(s.hi_tokens, dtype=float)
    rows = np.array([k for k, c in code_of.items() if c == "prefill"], dtype=np.int64)
    prefill_traffic = traffic.take(rows) if len(rows) else None

    def reason(k: int) -> str:
        code = code_of[k]
        if code == "no-slots":
            return f"the {int(hi_tokens[k]):,}-token context window does not fit the KV cache"
        if code == "prefill":
            if not floors:
                floors.update(zip(rows.tolist(), model.prefill_floor_s(prefill_traffic).tolist()))
            return model.drop_reason(floors[k], slo.sizing_text())
        return f"no replica count up to the search cap meets {slo.sizing_text()}"

    return reason


@dataclass(frozen=True)
class WindowCut:
    """A verification cut on a context window on one GPU option, as a derating of the analytic minimum.

    Every candidate pool :math:`(b', b_{hi}, g)` with lower boundary :math:`b' \\le` ``lo_max_tokens``,
    window ``hi_tokens`` and GPU option ``gpu`` needs at least :math:`\\lceil f N^*_{(b', b_{hi}, g)} \\rceil`
    replicas, :math:`f` = ``factor`` and :math:`N^*` its analytic minimum (``Candidates.min_replicas_analytic``).
    See :mod:`fleetopt.optimizer.simulation.verify` for where the factor comes from and why lower starts are covered.
    """

    lo_max_tokens: int
    hi_tokens: int
    gpu: str
    factor: float

    def covers(self, lo_tokens, hi_tokens, gpu: str):
        """Whether the cut applies to pools ``(lo_tokens, hi_tokens]`` on ``gpu`` (array-friendly)."""
        return (np.asarray(lo_tokens) <= self.lo_max_tokens) & (np.asarray(hi_tokens) == self.hi_tokens) \
            & (gpu == self.gpu)

    def least_replicas(self, min_replicas_analytic) -> np.ndarray:
        """:math:`\\lceil f N^* \\rceil` (a relative 1e-9 below an integer counts as that integer)."""
        n = self.factor * np.asarray(min_replicas_analytic, dtype=float)
        return np.ceil(n * (1 - 1e-9)).astype(np.int64)


def least_counts(keys: list[tuple[int, int, str]], min_replicas_analytic, min_replicas: dict,
                 window_cuts=()) -> np.ndarray:
    """Each pool's least replica count under verification cuts (0 = none): its own ``min_replicas[key]`` and
    :meth:`WindowCut.least_replicas` of every window cut covering it; ``keys[p] = (lo, hi, gpu)``."""
    least = np.array([min_replicas.get(k, 0) for k in keys], dtype=np.int64)
    if not keys:
        return least
    lo = np.array([k[0] for k in keys])
    hi = np.array([k[1] for k in keys])
    gpu = np.array([k[2] for k in keys], dtype=object)
    for cut in window_cuts:
        hit = cut.covers(lo, hi, gpu)
        least[hit] = np.maximum(least[hit], cut.least_replicas(np.asarray(min_replicas_analytic)[hit]))
    return least


def restrict(c: Candidates, instance: Instance, min_replicas: dict, forbidden: set, window_cuts=()) -> Candidates:
    """Apply cuts from verification: pools ``forbidden`` (keys ``(lo, hi, gpu)``) disappear, and a pool with a
    least count (its own ``min_replicas[key]``, or a :class:`WindowCut` covering it; :func:`least_counts`) gets
    every smaller choice raised to it (re-priced: GPUs, cost, power at the same load). A disaggregated pair's key
    names ``PREFILL+DECODE`` (:meth:`Candidates.pool_name`): it may be forbidden; least counts are cuts on
    aggregated pools and leave pairs as they are."""
    b = c.boundaries
    keys = [(int(b[c.i[p]]), int(b[c.j[p]]), c.pool_name(p)) for p in range(len(c))]
    least = least_counts(keys, c.min_replicas_analytic, min_replicas, window_cuts)
    least[c.is_pair] = 0  # a pair's key is PREFILL+DECODE: the cuts of aggregated pools never reach it
    keep = np.array([keys[p] not in forbidden for p in c.choice_pool], dtype=bool)
    replicas = c.choice_replicas.copy()
    gpus, cost, power = c.choice_gpus.copy(), c.choice_cost_per_hr.copy(), c.choice_power_w.copy()
    for ch, p in enumerate(c.choice_pool):
        low = int(least[p])
        if replicas[ch] >= low:
            continue
        prof = instance.gpus[c.gpu[p]].profile
        replicas[ch] = low
        gpus[ch] = low * prof.gpus_per_replica
        cost[ch] = low * prof.cost_usd_per_hr
        curve = decode_power_curve(prof, c.boundaries[c.j[p]] / 2)
        power[ch] = low * float(curve.power_w(min(c.load_erlangs[p] / low, c.cap[p])))
    raised = replace(c, choice_replicas=replicas, choice_gpus=gpus, choice_cost_per_hr=cost, choice_power_w=power)
    return raised.keep_choices(keep)


def prune_dominated(c: Candidates, unlimited_gpu: np.ndarray, protected_gpu: np.ndarray, top: int = 1) -> Candidates:
    """Drop replica choices that at least ``top`` other choices for the same segment beat on every resource.

    Choice :math:`q` dominates :math:`p` (same path nodes, i.e. same :math:`(i, j)` and compression
    states; different pool)
    when its cost, power, physical GPUs and miss rate are all no larger, every GPU
    option it uses has no inventory or pool-count limit (``unlimited_gpu``) or both use one and the same
    option, and no option :math:`p` uses carries a lower bound
    (``protected_gpu``); exact ties keep the lower index. These are the only quantities the objective and the coupling
    constraints read, so pruning never changes the optimum. A disaggregated pair uses its prefill and its decode
    option: an aggregated pool on the pair's prefill option never stands in for it while the decode option's
    inventory is another (the GPUs would move between inventories).

    With ``top`` :math:`N > 1` (``solve --top N``: the runners-up may use a dominated choice) a choice goes only when
    :math:`N` or more choices dominate it, another count of its own pool included (a pool's counts stand in for one
    another too), and the :math:`N` best plans keep their objectives. Domination so counted is transitive (each
    condition is), so by induction on the number of its dominators a pruned choice has :math:`N` dominators that
    are kept; a plan using pruned choices then has :math:`N` distinct kept plans, each swapping its pruned choices
    for kept dominators (one of them in :math:`N` ways), feasible and no worse in any figure. For every
    :math:`k \\le N` there are therefore :math:`k` kept plans no worse than the :math:`k`-th best of all: the
    :math:`k`-th best objective is the same (``tests/test_mip.py`` checks the runners-up against enumeration).
    """
    cp = c.choice_pool
    n_nodes = len(c.boundaries) * len(c.gammas)
    seg = c.from_node[cp] * (n_nodes + 1) + c.to_node[cp]
    gpu = c.gpu[cp]
    dgpu = np.where(c.decode_gpu[cp] >= 0, c.decode_gpu[cp], gpu)  # type: ignore[index]
    single = np.where(dgpu == gpu, gpu, -1)                        # the one option a choice uses, or -1
    free = unlimited_gpu[gpu] & unlimited_gpu[dgpu]
    guarded = protected_gpu[gpu] | protected_gpu[dgpu]
    metrics = np.stack([c.choice_cost_per_hr, c.choice_power_w, c.choice_gpus.astype(float), c.choice_miss_rate], 1)
    keep = np.ones(c.n_choices, dtype=bool)
    if not c.n_choices:
        return c.keep_choices(keep)
    order = np.argsort(seg, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(seg[order]) != 0])
    sizes = np.diff(np.r_[starts, len(order)])
    # Segments of similar size together, padded to the largest of each batch, compared all pairs at once (a batch
    # holds at most about _PRUNE_BATCH pair comparisons).
    by_size = np.argsort(sizes, kind="stable")
    lo = 0
    while lo < len(by_size):
        hi = lo + 1
        while hi < len(by_size) and (hi - lo + 1) * int(sizes[by_size[hi]]) ** 2 <= _PRUNE_BATCH:
            hi += 1
        groups = by_size[lo:hi]
        lo = hi
        width = int(sizes[groups].max())
        if width < 2:
            continue
        slot = np.arange(width)
        valid = slot[None, :] < sizes[groups][:, None]                       # [group, position]
        idx = order[np.minimum(starts[groups][:, None] + slot[None, :], len(order) - 1)]
        idx = np.where(valid, idx, -1)
        m = np.where(valid[:, :, None], metrics[idx], np.inf)
        no_worse = np.all(m[:, :, None, :] <= m[:, None, :, :], axis=3)     # [group, q, p]: q no worse than p
        strictly = np.any(m[:, :, None, :] < m[:, None, :, :], axis=3)
        earlier = idx[:, :, None] < idx[:, None, :]
        one = single[idx]
        inventory_ok = free[idx][:, :, None] | ((one[:, :, None] == one[:, None, :]) & (one[:, :, None] >= 0))
        dom = (no_worse & (strictly | earlier) & inventory_ok & ~guarded[idx][:, None, :]
               & valid[:, :, None] & valid[:, None, :])
        if top == 1:
            dom &= cp[idx][:, :, None] != cp[idx][:, None, :]
        dropped = (dom.sum(axis=1) >= top) & valid
        keep[idx[dropped]] = False
    return c.keep_choices(keep)


_PRUNE_BATCH = 1 << 18
"""Pair comparisons :func:`prune_dominated` makes at once (padded segments), bounding its memory."""
