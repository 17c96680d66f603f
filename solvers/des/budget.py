r"""Iteration-mode handlers of replicas with a binding token budget (vLLM's ``max_num_batched_tokens``).

The semantics and the math are in :mod:`fleetopt.solvers.des.engine` ("Token budget"); this
module holds the two handlers so that the plain hot path of the engine does not
change. A budgeted replica keeps its decoding sequences as completion keys on
the replica's heap (kind 1, as the plain path does) and its prefilling
sequences in a short list, in admission order, with the tokens already
prefilled and the current allocation of each. Every event of the replica
brings the list up to date, recomputes the allocation and, from it, the total
context :math:`C_0`, the growth :math:`g` and the index of the next
allocation change, so the closed-form jump :math:`T(m)` of the engine applies
unchanged between events.

Compute terms. A decoding sequence's step costs :math:`g` more; a prefill piece of :math:`x` tokens written at
prefix :math:`p` costs its exact causal compute :math:`a x + b\,((p + x)^2 - p^2)`, so a prompt's pieces sum to
:math:`aP + bP^2` however the budget cuts them (the even-chunk convention of the plain path,
:func:`fleetopt.models.service.prefill_compute_terms`, is this formula for :math:`k` equal pieces). Between events
a prefill's allocation is constant and its prefix grows by :math:`x` per iteration, so the replica's compute is
:math:`D_0 + D_1 j` in the iteration :math:`j` after the anchor with

.. math:: D_0 = n_{dec}\, g + \sum_{s:\, x_s > 0} \left(a x_s + b (2 p_s x_s + x_s^2)\right), \qquad
          D_1 = \sum_{s} 2 b x_s^2,

which is the engine's jump with ``d0``, ``d1``; activity power is credited over the same spans.
"""

from __future__ import annotations

import heapq
import math
from typing import cast


__all__ = ["budget_handlers"]


def budget_handlers(x):  # x: the engine's IterationStation (not imported: the engine imports this module)
    """``arrive(now, i, r)`` and ``serve(at, r)`` of budgeted replicas (:mod:`fleetopt.solvers.des.engine`,
    "Token budget").

    ``serve`` is called for a replica's boundary event that is still current
    (the engine checks the heap entry's sequence number first); ``arrive`` after
    the engine has picked replica ``r`` and counted the request there.
    """
    it, ref, c0, g, seqs, waiting, token = x.it, x.ref, x.c0, x.g, x.seqs, x.waiting, x.token
    run, cap, outstanding, replica_pool, deferred = x.run, x.cap, x.outstanding, x.replica_pool, x.deferred
    start, first, end, lin, lout, chunk, tokens, M = x.start, x.first, x.end, x.lin, x.lout, x.chunk, x.tokens, x.M
    heap, counter, BOUNDARY, after, boundary_at = x.heap, x.counter, x.boundary_kind, x.after, x.boundary_at
    batch_to, system_to = x.batch_to, x.system_to
    d0, d1, gd, credit, ab = x.d0, x.d1, x.gd, x.credit if x.metered else None, x.prefill_ab
    push, pop, inf = heapq.heappush, heapq.heappop, math.inf
    R = len(it)
    prefills = [[] for _ in range(R)]   # [request, prompt tokens in its KV cache, tokens per iteration], oldest first
    n_dec = [0] * R                      # decoding sequences
    dec_ctx = [0] * R                    # their total context at iteration it[r]
    left = [0] * R                       # budget left after the running sequences' allocation
    change = [inf] * R                   # iteration index of the next allocation change of a prefill

    def allocate(r: int) -> None:
        """Decodes take one token each, prefills the rest oldest first; set ``c0``, ``g``, ``left``, ``change``."""
        free, ch, at = tokens[r] - n_dec[r], chunk[r], it[r]
        c, gr, nxt = dec_ctx[r], n_dec[r], inf
        pa, pb = ab[r]
        f0, f1 = n_dec[r] * gd[r], 0.0
        for s in prefills[r]:
            rest = lin[s[0]] - s[1]
            a = ch if ch < rest else rest
            a = a if a < free else free
            s[2] = a
            if a:
                free -= a
                c += s[1]
                gr += a
                f0 += pa * a + pb * (2 * s[1] * a + a * a)
                f1 += 2 * pb * a * a
                e = at + rest // a          # the prefill ends there (a divides rest) or its last piece starts
                nxt = e if e < nxt else nxt
        c0[r], g[r], left[r], change[r] = c, gr, free, nxt
        d0[r], d1[r] = f0, f1

    def advance(r: int, m: int) -> None:
        """Move the replica's anchor ``m`` iterations on under the current allocation (not ``ref``)."""
        dec_ctx[r] += m * n_dec[r]
        for s in prefills[r]:
            s[1] += m * s[2]
        c0[r] += m * g[r]
        d0[r] += m * d1[r]
        it[r] += m

    def next_event(r: int) -> int | float:
        sq = seqs[r]
        e = change[r]
        return sq[0] // M if sq and sq[0] // M < e else e

    def reschedule(r: int) -> None:
        if run[r]:
            s = next(counter)
            push(heap, (after(r, next_event(r) - it[r]), s, BOUNDARY, r))
            token[r] = s
        else:
            token[r] = -1

    def admit(r: int, i: int, b: float) -> None:
        """Admit request ``i`` at boundary ``b`` (index ``it[r]``) into the tokens left (at least one)."""
        run[r] += 1
        start[i] = b
        li = lin[i]
        if li:
            a = chunk[r] if chunk[r] < li else li
            a = a if a < left[r] else left[r]
            prefills[r].append([i, 0, a])
            e = it[r] + li // a
            if e < change[r]:
                change[r] = e
            pa, pb = ab[r]
            d0[r] += pa * a + pb * a * a
            d1[r] += 2 * pb * a * a
        else:                               # no prompt: decoding from the start
            a = 1
            first[i] = b
            n_dec[r] += 1
            d0[r] += gd[r]
            push(seqs[r], (it[r] + lout[i]) * M + 4 * i + 1)
        left[r] -= a
        g[r] += a

    def arrive(now: float, i: int, r: int) -> None:
        q = waiting[r]
        if run[r] >= cap[r] or q or (run[r] and left[r] <= 0):
            if q and len(q) == deferred[r] and run[r] + len(q) < cap[r] and left[r] > len(q):
                deferred[r] += 1            # behind requests deferred to the next event, with room for it too
            q.append(i)
            return
        if not run[r]:
            ref[r] = now                    # idle: an iteration starts now with the whole budget
            left[r] = tokens[r]
            d0[r] = d1[r] = 0.0
        else:
            m = boundary_at(r, now)
            if it[r] + m >= next_event(r):
                q.append(i)                 # that boundary is an event: admitted after its allocation
                deferred[r] += 1
                return
            if m:
                if credit is not None:
                    credit(r, m)
                b = after(r, m)
                advance(r, m)
                ref[r] = b
        batch_to(r, ref[r])
        admit(r, i, ref[r])
        reschedule(r)

    def serve(at: float, r: int) -> None:
        e = cast(int, next_event(r))    # the event being served is due: a whole iteration, not the inf sentinel
        if credit is not None:
            credit(r, e - it[r])
        advance(r, e - it[r])
        ref[r] = at
        batch_to(r, at)
        p, sq, done = replica_pool[r], seqs[r], 0
        still = []
        for s in prefills[r]:
            i = s[0]
            li = lin[i]
            if s[1] < li:
                still.append(s)
                continue
            first[i] = at                   # the iteration that ended here wrote its last prompt token
            lo = lout[i]
            if lo:
                n_dec[r] += 1
                dec_ctx[r] += li
                push(sq, (e + lo) * M + 4 * i + 1)
                continue
            end[i] = at                     # no output: it completes at once
            done += 1
            system_to(p, at, -1)
        prefills[r] = still
        while sq and sq[0] // M == e:
            i = (pop(sq) % M) >> 2
            end[i] = at
            n_dec[r] -= 1
            dec_ctx[r] -= lin[i] + lout[i]
            done += 1
            system_to(p, at, -1)
        run[r] -= done
        outstanding[r] -= done
        allocate(r)
        q = waiting[r]
        while q and run[r] < cap[r] and left[r] > 0:
            admit(r, q.popleft(), at)
        deferred[r] = 0
        reschedule(r)

    return arrive, serve
