"""Candidate pools for the fleet MIP: every (length segment x GPU option), sized analytically.

A candidate :math:`p = (i, j, g)` serves requests of total length in
:math:`(b_i, b_j]` with context window :math:`b_j` on GPU option :math:`g`.
For each one the foundation's models give its arrival rate, the minimum
replica count :math:`N^*_p` meeting the P99-TTFT SLO and :math:`\\rho_{max}`
(inflated to :math:`\\lceil N^*_p / A_g \\rceil` for availability :math:`A_g`),
and cost, physical GPUs, power and output tokens at that count. Candidates
that no count can bring within the SLO are dropped with their reason;
dominated candidates are pruned (:func:`prune_dominated`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.queueing import min_replicas
from models.segments import segment_basis, segment_stats
from models.units import MS_PER_S

from .instance import Instance

__all__ = ["Candidates", "Dropped", "generate_candidates", "prune_dominated"]


@dataclass(frozen=True)
class Dropped:
    """A candidate pool that cannot be part of any plan, and why."""

    lo_tokens: int
    hi_tokens: int
    gpu: str
    reason: str


@dataclass(frozen=True, eq=False)
class Candidates:
    """Candidate pools as parallel arrays (one entry per candidate).

    ``gpu`` indexes ``gpu_names``; ``i``/``j`` index ``boundaries``. All figures
    are analytic at ``replicas`` (= :math:`\\lceil N^*/A \\rceil`); P99 TTFT is computed only for the
    pools a plan uses, in the exact re-evaluation.
    """

    boundaries: np.ndarray
    gpu_names: tuple[str, ...]
    i: np.ndarray
    j: np.ndarray
    gpu: np.ndarray
    arrival_rate: np.ndarray
    replicas: np.ndarray
    gpus: np.ndarray
    cost_per_hr: np.ndarray
    power_w: np.ndarray
    output_tok_per_s: np.ndarray
    dropped: tuple[Dropped, ...]
    generated: int

    def __len__(self) -> int:
        return len(self.i)

    def subset(self, keep: np.ndarray) -> "Candidates":
        """The candidates selected by boolean or index array ``keep``."""
        arrays = {f: getattr(self, f)[keep] for f in ("i", "j", "gpu", "arrival_rate", "replicas", "gpus",
                                                     "cost_per_hr", "power_w", "output_tok_per_s")}
        return Candidates(self.boundaries, self.gpu_names, dropped=self.dropped, generated=self.generated, **arrays)

    def label(self, p: int) -> str:
        b = self.boundaries
        return f"{int(b[self.i[p]]):,}-{int(b[self.j[p]]):,}:{self.gpu_names[self.gpu[p]]}"


def generate_candidates(instance: Instance) -> Candidates:
    """Size every (segment, GPU option) pair of the instance's boundary grid (vectorized per GPU)."""
    w = instance.workload
    b = np.asarray(instance.pools.boundaries, dtype=float)
    ii, jj = np.triu_indices(len(b), k=1)
    slo = instance.slo
    rho = instance.constraints.max_utilization
    cols: dict[str, list] = {k: [] for k in ("i", "j", "gpu", "arrival_rate", "replicas", "gpus", "cost_per_hr",
                                             "power_w", "output_tok_per_s")}
    dropped: list[Dropped] = []
    bases: dict[int, object] = {}
    for g_idx, opt in enumerate(instance.gpus):
        prof = opt.profile
        chunk = prof.chunk_tokens
        if chunk not in bases:
            bases[chunk] = segment_basis(w.lengths, b, chunk, w.input_fraction)
        s = segment_stats(bases[chunk], ii, jj, prof)
        lam = w.arrival_rate_req_per_s * s.rate_share
        z = min_replicas(lam, s.mean_service_s, s.cv2_service, s.n_slots, slo.ttft_p99_s, s.prefill_times_s,
                         s.prefill_probs, s.mean_prefill_s, rho, slo.ttft_model)
        n = np.where(z.feasible, np.ceil(z.replicas / opt.availability - 1e-9), 0).astype(np.int64)
        es = np.nan_to_num(s.mean_service_s)
        batch = np.where(n > 0, lam * es / np.maximum(n, 1), 0.0)
        ok = z.feasible
        for k in np.flatnonzero(~ok):
            dropped.append(Dropped(int(b[ii[k]]), int(b[jj[k]]), opt.name, _reason(z.reason[k], s, k, slo)))
        cols["i"].append(ii[ok])
        cols["j"].append(jj[ok])
        cols["gpu"].append(np.full(ok.sum(), g_idx))
        cols["arrival_rate"].append(lam[ok])
        cols["replicas"].append(n[ok])
        cols["gpus"].append(n[ok] * prof.gpus_per_replica)
        cols["cost_per_hr"].append(n[ok] * prof.cost_usd_per_hr)
        cols["power_w"].append(n[ok] * prof.power.power_w(np.minimum(batch[ok], s.n_slots[ok])))
        cols["output_tok_per_s"].append(lam[ok] * np.nan_to_num(s.mean_output_tokens[ok]))
    arrays = {k: np.concatenate(v) for k, v in cols.items()}
    arrays["i"] = arrays["i"].astype(np.int64)
    arrays["j"] = arrays["j"].astype(np.int64)
    arrays["gpu"] = arrays["gpu"].astype(np.int64)
    return Candidates(b, tuple(g.name for g in instance.gpus), dropped=tuple(dropped),
                      generated=len(ii) * len(instance.gpus), **arrays)


def _reason(code: str, s, k: int, slo) -> str:
    slo_ms = slo.ttft_p99_s * MS_PER_S
    if code == "no-slots":
        return f"the {int(s.hi_tokens[k]):,}-token context window does not fit the KV cache"
    if code == "prefill":
        if slo.ttft_model == "mean-prefill":
            return f"mean prefill {s.mean_prefill_s[k] * MS_PER_S:,.0f} ms alone exceeds the {slo_ms:,.0f} ms SLO"
        cum = np.cumsum(s.prefill_probs[k])
        tau = s.prefill_times_s[min(int(np.searchsorted(cum, 0.99 - 1e-12)), len(cum) - 1)]
        return f"P99 prefill alone is {tau * MS_PER_S:,.0f} ms, above the {slo_ms:,.0f} ms SLO, at any replica count"
    return "no replica count up to the search cap meets the SLO"


def prune_dominated(c: Candidates, unlimited_gpu: np.ndarray, protected_gpu: np.ndarray) -> Candidates:
    """Drop candidates another candidate of the same segment beats on every resource.

    :math:`q` dominates :math:`p` (same :math:`(i, j)`) when its cost, power and
    physical GPUs are all no larger, it draws on an unlimited inventory or on
    :math:`p`'s own, and :math:`p`'s GPU option carries no lower bound
    (``protected_gpu``); ties keep the lower index. Cost, power and GPU counts
    are the only quantities the objective and the coupling constraints read,
    so pruning never changes the optimum.
    """
    keep = np.ones(len(c), dtype=bool)
    seg = c.i * (len(c.boundaries) + 1) + c.j
    order = np.argsort(seg, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(seg[order]) != 0])
    ends = np.r_[starts[1:], len(order)]
    for s0, s1 in zip(starts, ends):
        group = order[s0:s1]
        if len(group) < 2:
            continue
        for p in group:
            if protected_gpu[c.gpu[p]]:
                continue
            for q in group:
                if q == p or not keep[q]:
                    continue
                same_or_free = unlimited_gpu[c.gpu[q]] or c.gpu[q] == c.gpu[p]
                no_worse = (c.cost_per_hr[q] <= c.cost_per_hr[p] and c.power_w[q] <= c.power_w[p]
                            and c.gpus[q] <= c.gpus[p])
                better = (c.cost_per_hr[q] < c.cost_per_hr[p] or c.power_w[q] < c.power_w[p]
                          or c.gpus[q] < c.gpus[p] or q < p)
                if same_or_free and no_worse and better:
                    keep[p] = False
                    break
    return c.subset(keep)

