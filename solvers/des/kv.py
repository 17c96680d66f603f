"""Iteration-mode handlers of overcommitted replicas: KV blocks, block events and preemption.

A replica has ``profile.total_kv_blocks`` KV blocks of :math:`b` =
``profile.blk_size_tokens`` tokens. During its step of an iteration a running
sequence holds :math:`\\lceil x' / b \\rceil` blocks, :math:`x'` being the
tokens in its KV cache once the step is written (its context plus the chunk or
the one token of the step). The longest admitted request, :math:`l_{in} +
l_{out} \\le B`, never holds more than :math:`\\lceil B/b \\rceil`, so a pool
with ``max_num_seqs`` :math:`\\le n_{slots}(B)` can never run out of blocks:
such pools skip the block bookkeeping entirely (their runs are unchanged). A
pool built with ``allow_overcommit=True`` and ``max_num_seqs`` above
:math:`n_{slots}(B)` (:attr:`fleetopt.solvers.des.state.SimPool.overcommitted`) tracks blocks, as vLLM's
scheduler with the recompute policy [1]_:

* Admission (FCFS, up to ``max_num_seqs``) also needs free blocks for the
  request's first step; the queue head that does not fit blocks the queue.
* The step index at which a running sequence needs another block is known
  in closed form (a prefill chunk or a decode token crossing a block
  boundary). At a boundary the sequences needing blocks are served oldest
  admission first; when too few blocks are free the most recently admitted
  running sequence is preempted (possibly the needy one itself) until the
  need fits.
* A preempted sequence frees all its blocks and goes to the *front* of the
  waiting queue. If it had decoded :math:`d` tokens since its last
  admission, it is readmitted with a prefill of :math:`l_{in} + d` tokens
  (its prompt and the tokens it generated, from scratch, in chunks of
  :math:`c`) followed by its :math:`l_{out} - d` remaining decode steps, so
  its last decode step still starts at context :math:`l_{in} + l_{out} - 1`;
  preempted during its prefill, it redoes the same prefill. Its
  ``start_at_s`` stays its first admission and its ``first_token_at_s`` the
  first time a token was produced (a recompute produces no new first token).
* As in vLLM, a boundary that preempted admits nobody; the next boundary is
  then an event, where admissions resume.

The rest of the iteration model (the closed-form jump :math:`T(m)` between a
replica's events, the order of simultaneous events) is in :mod:`fleetopt.solvers.des.engine`;
this module holds the two handlers of an overcommitted replica, so that the
plain hot path of the engine does not change. Besides the engine's kind 0
(prefill ends) and kind 1 (completion) keys, an overcommitted replica's heap
holds kind 3 keys (a wake-up to admit after a step that preempted); its block
crossings (kind 2 keys: a sequence needs more blocks for its step of that
iteration) sit on a heap of their own.

Crossings settled in bulk
-------------------------
A crossing only matters when it meets a shortage: otherwise it takes its
blocks and nothing else changes (the batch, the iteration time and every
admission decision are the same whether the blocks were taken at the crossing
or later, as long as they are counted before anyone reads the free blocks).
So crossings are not events while a shortage is impossible, and the blocks held
are read from a bound where it suffices. A sequence holding :math:`t` tokens
after its step holds :math:`\\lceil t/b \\rceil \\le (t + b - 1)/b` blocks, so a
replica of :math:`n` sequences holds at most

.. math:: U = \\left\\lfloor \\frac{T + n(b - 1)}{b} \\right\\rfloor, \\qquad T = C + G,

with :math:`C` its context sum at the iteration's start and :math:`G = \\sum_s
g_s` its growth per iteration (:math:`g_s` the chunk, or 1 when decoding);
:math:`T` grows by at most :math:`G` per iteration. The replica's next *check*
is the first iteration at which this bound can exceed its blocks; before it, no
crossing can meet a shortage. Where the bound already exceeds them, the
crossings are settled and the exact free blocks :math:`F` decide: each sequence
takes at most :math:`\\Delta g_s / b + 1` blocks in :math:`\\Delta` iterations, so
the check is :math:`\\lfloor (F - n) b / G \\rfloor + 1` iterations on, or, when
:math:`F < n`, the next crossing itself (every crossing an event, as without
settling).

The replica's next boundary event is its next key (a prefill end, a completion,
a wake-up) or its check, whichever is first. An admission the bound allows
admits at once; one it cannot decide settles the crossings up to its boundary
and reads the exact free blocks. At a check, the crossings before it are
settled and those at it are served as above, oldest admission first. A
sequence's due crossings are settled at once (its blocks for the step at the
settling iteration). A run is the same as with every crossing an event: the
step-by-step reference in ``tests/test_des.py`` checks it, with the block counts
at every change (the probe settles every crossing first) and without.

References
----------
.. [1] W. Kwon et al., "Efficient Memory Management for Large Language Model
       Serving with PagedAttention", SOSP 2023 (continuous batching in vLLM).
"""

from __future__ import annotations

import heapq
import itertools


__all__ = ["kv_handlers"]

_block_probe = None
"""Test hook: when set, called as ``probe(r, used, blocks, held, needed)`` after every KV-block change of
an overcommitted replica (``held``/``needed``: each running sequence's blocks and the blocks its next step
needs). None in normal runs."""


def kv_handlers(x):  # x: the engine's IterationStation (not imported: the engine imports this module)
    """``arrive(now, i, r)`` and ``serve(at, r)`` of overcommitted replicas (module docstring).

    ``serve`` is called for a replica's boundary event that is still current
    (the engine checks the heap entry's sequence number first); ``arrive`` after
    the engine has picked replica ``r`` and counted the request there.
    """
    it, ref, c0, g, seqs, waiting = x.it, x.ref, x.c0, x.g, x.seqs, x.waiting
    run, cap, outstanding, replica_pool, deferred = x.run, x.cap, x.outstanding, x.replica_pool, x.deferred
    start, first, end, lin, kch, lout, M = x.start, x.first, x.end, x.lin, x.kch, x.lout, x.M
    chunk, blk, blocks, preempt_count = x.chunk, x.blk, x.blocks, x.preemptions
    after, boundary_at = x.after, x.boundary_at
    batch_to, system_to = x.batch_to, x.system_to
    d0, d1, alpha, beta, gd, terms = x.d0, x.d1, x.alpha, x.beta, x.gd, x.prefill_terms
    credit = x.credit if x.metered else None
    push, pop = heapq.heappush, heapq.heappop
    R = len(it)
    heap, counter, BOUNDARY, token = x.heap, x.counter, x.boundary_kind, x.token
    used = [0] * R                                # KV blocks held per replica, as of its last settle
    bheap = [[] for _ in range(R)]                # block crossings per replica: keys (index * M + 4 i + 2)
    check = [0] * R                               # iteration of the replica's next check (module docstring)
    live = [{} for _ in range(R)]                 # running request -> admission serial (admission order)
    adm, held = {}, {}                            # running request -> iteration of admission, blocks held (settled)
    serial = itertools.count()

    def need(i: int, j: int, bs: int, ch: int) -> int:
        """Blocks request ``i`` holds during its step ``j``: its KV cache once the step is written."""
        k = kch[i]
        if j < k:
            w = (j + 1) * ch                      # prompt tokens in its KV cache after the step
            li = lin[i]
            return -(-(w if w < li else li) // bs)
        return -(-(lin[i] + j - k + 1) // bs)

    def schedule_block(r: int, i: int, j0: int) -> None:
        """Push request ``i``'s next block event: the first step ``j >= j0`` needing more than it holds."""
        bs, k, li = blk[r], kch[i], lin[i]
        top = held[i] * bs                        # tokens the held blocks can take
        if j0 < k and li > top:
            j = top // chunk[r]
            j = j if j > j0 else j0
        else:
            d = top - li
            d = d if d > j0 - k else j0 - k
            if d < 0:
                d = 0
            if d >= lout[i]:
                return                            # fits until it completes
            j = k + d
        push(bheap[r], (adm[i] + j) * M + 4 * i + 2)

    def settle(r: int, upto: int) -> None:
        """Grant the blocks of replica ``r``'s crossings at iterations up to ``upto`` (no shortage is possible
        there: module docstring, "Crossings settled in bulk"): each sequence with a crossing due takes the
        blocks of its step at ``upto`` in one go, and its next crossing after it is scheduled."""
        bh, bs, ch = bheap[r], blk[r], chunk[r]
        while bh and bh[0] // M <= upto:
            i = (pop(bh) % M) >> 2
            if i not in adm:
                continue                          # completed since (its key is dropped here)
            j = upto - adm[i]                     # all its crossings up to upto at once: its blocks for step j
            want = need(i, j, bs, ch) - held[i]
            used[r] += want
            held[i] += want
            schedule_block(r, i, j + 1)

    def next_index(r: int) -> int:
        """Iteration of the replica's next boundary event: its next key or its next check."""
        e = seqs[r][0] // M
        return e if e < check[r] else check[r]

    def reschedule_tracked(r: int) -> None:
        """Set the replica's next check and push its next boundary event (the engine's ``reschedule`` with the
        checks of the module docstring)."""
        if not run[r]:
            token[r] = -1
            return
        n, grow, bs = run[r], g[r], blk[r]
        room = (blocks[r] + 1) * bs - 1 - (c0[r] + grow) - n * (bs - 1)   # tokens of growth the bound allows
        if grow <= 0:
            check[r] = it[r] + (1 << 62)
        elif room >= 0:
            check[r] = it[r] + room // grow + 1
        else:                                     # the bound is no help: the exact blocks decide
            settle(r, it[r])
            spare = blocks[r] - used[r] - n
            if spare >= 0:
                check[r] = it[r] + spare * bs // grow + 1
            else:                                 # a shortage may come at the next crossing: it is the check
                bh = bheap[r]
                while bh and (bh[0] % M) >> 2 not in adm:
                    pop(bh)
                check[r] = bh[0] // M if bh else it[r] + (1 << 62)
        s = next(counter)
        push(heap, (after(r, next_index(r) - it[r]), s, BOUNDARY, r))
        token[r] = s

    def admit_tracked(r: int, i: int, b: float) -> None:
        run[r] += 1
        if start[i] != start[i]:                  # NaN: first admission (a recompute keeps it)
            start[i] = b
        adm[i] = it[r]
        live[r][i] = next(serial)
        nb = held[i] = need(i, 0, blk[r], chunk[r])
        used[r] += nb
        k = kch[i]
        if k:
            g[r] += chunk[r]
            d0[r] += alpha[i]
            d1[r] += beta[i]
            push(seqs[r], (it[r] + k) * M + 4 * i)
        else:
            if first[i] != first[i]:
                first[i] = b
            g[r] += 1
            d0[r] += gd[r]
            push(seqs[r], (it[r] + lout[i]) * M + 4 * i + 1)
        schedule_block(r, i, 1)

    def arrive_tracked(now: float, i: int, r: int) -> None:
        q = waiting[r]
        if run[r] >= cap[r] or q:
            if q and len(q) == deferred[r] and run[r] + len(q) < cap[r]:
                deferred[r] += 1                  # behind requests deferred to the next event, room for it too
            q.append(i)
            return
        if not run[r]:
            ref[r] = now                          # idle: no blocks held, the first chunk fits
        else:
            m = boundary_at(r, now)
            if it[r] + m >= next_index(r):
                q.append(i)                       # that boundary is an event: admitted after it is handled
                deferred[r] += 1
                return
            bs, nb = blk[r], need(i, 0, blk[r], chunk[r])
            if blocks[r] - (c0[r] + (m + 1) * g[r] + run[r] * (bs - 1)) // bs < nb:   # the bound is no help
                settle(r, it[r] + m)
                if blocks[r] - used[r] < nb:
                    q.append(i)                   # blocks are freed only at events: wait for the next one
                    return
            if m:
                if credit is not None:
                    credit(r, m)
                ref[r] = after(r, m)
                c0[r] += m * g[r]
                d0[r] += m * d1[r]
                it[r] += m
        batch_to(r, ref[r])
        admit_tracked(r, i, ref[r])
        reschedule_tracked(r)
        if _block_probe is not None:
            probe(r)

    def preempt(r: int, v: int, e: int, c: int, gr: int, f0: float, f1: float) -> tuple[int, int, float, float]:
        """Preempt running request ``v`` at boundary ``e`` (recompute): free its blocks, queue it first. ``c``,
        ``gr``, ``f0``, ``f1``: the replica's context sum, its growth, compute seconds and their growth at ``e``,
        returned without ``v``."""
        j, k, li = e - adm[v], kch[v], lin[v]
        if j < k:                                 # mid-prefill: the prefill restarts as it was
            c -= j * chunk[r]
            gr -= chunk[r]
            f0 -= alpha[v] + beta[v] * j          # its chunk j's compute
            f1 -= beta[v]
        else:                                     # decoded d steps: recompute l_in + d tokens, then the rest
            d = j - k
            c -= li + d
            gr -= 1
            f0 -= gd[r]
            lin[v] = li + d
            lout[v] -= d
            kch[v] = -(-(li + d) // chunk[r])
            alpha[v], beta[v] = terms(r, li + d)
        used[r] -= held.pop(v)
        del live[r][v], adm[v]
        run[r] -= 1
        preempt_count[r] += 1
        for sq in (seqs[r], bheap[r]):
            sq[:] = [x for x in sq if (x % M) >> 2 != v]
            heapq.heapify(sq)
        waiting[r].appendleft(v)
        return c, gr, f0, f1

    def serve_tracked(at: float, r: int) -> None:
        sq, ch, p, bs = seqs[r], chunk[r], replica_pool[r], blk[r]
        lv = live[r]
        e = next_index(r)
        exact = e >= check[r]                     # a check: shortages are possible here
        if exact:
            settle(r, e - 1)
        if credit is not None:
            credit(r, e - it[r])
        c, gr = c0[r] + (e - it[r]) * g[r], g[r]
        f0, f1, gdr = d0[r] + (e - it[r]) * d1[r], d1[r], gd[r]
        it[r], ref[r] = e, at
        batch_to(r, at)
        done = 0
        bh = bheap[r]
        needs = []
        while exact and bh and bh[0] // M == e:
            i = (pop(bh) % M) >> 2
            if i in adm:
                needs.append(i)
        while sq and sq[0] // M == e:
            key = pop(sq)
            i = (key % M) >> 2
            kind = key & 3
            # This handler mirrors the plain one (fleetopt.solvers.des.engine) plus block bookkeeping; the plain path
            # stays separate so pools that cannot run out of blocks pay nothing for it (hot loop).
            if kind == 3:                         # wake-up after a preemption: admissions only
                continue
            li, lo = lin[i], lout[i]
            if kind == 0:                         # prefill (or its recompute) ends
                if first[i] != first[i]:
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
            else:
                f0 -= gdr
            end[i] = at
            c -= li + lo
            gr -= 1
            done += 1
            system_to(p, at, -1)
            used[r] -= held.pop(i)
            del lv[i], adm[i]
        run[r] -= done
        outstanding[r] -= done
        preempted = False
        if needs:
            needs.sort(key=lv.__getitem__)        # oldest admission first
            for i in needs:
                if i not in lv:
                    continue                      # preempted at this boundary already
                j = e - adm[i]
                want = need(i, j, bs, ch) - held[i]
                while blocks[r] - used[r] < want:
                    v = next(reversed(lv))        # the most recently admitted running sequence
                    c, gr, f0, f1 = preempt(r, v, e, c, gr, f0, f1)
                    preempted = True
                    if v == i:
                        break
                if i in lv:
                    used[r] += want
                    held[i] += want
                    schedule_block(r, i, j + 1)
        c0[r], g[r] = c, gr
        d0[r], d1[r] = (f0, f1) if run[r] else (0.0, 0.0)     # an idle replica drops the float residue
        if not preempted:                         # as vLLM: no admissions in a step that preempted
            q = waiting[r]
            while q and run[r] < cap[r]:
                nb = need(q[0], 0, bs, ch)
                if not exact and blocks[r] - (c0[r] + g[r] + run[r] * (bs - 1)) // bs < nb:
                    settle(r, e)                  # the bound is no help: the exact blocks decide
                    exact = True
                if exact and blocks[r] - used[r] < nb:
                    break
                admit_tracked(r, q.popleft(), at)
        else:                                     # ... so the next boundary is an event: admissions there
            push(sq, (e + 1) * M + 3)
        deferred[r] = 0
        reschedule_tracked(r)
        if _block_probe is not None:
            probe(r)

    def probe(r: int) -> None:
        hook = _block_probe
        assert hook is not None                   # called only while a test has set it
        settle(r, it[r])                          # the blocks as every crossing up to now had taken them
        hook(r, used[r], blocks[r], [held[i] for i in live[r]],
             [need(i, it[r] - adm[i], blk[r], chunk[r]) for i in live[r]])

    return arrive_tracked, serve_tracked
