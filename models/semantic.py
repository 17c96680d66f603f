"""Semantic (multi-model) routing at the model level: split a workload into one length distribution per model.

A classifier sends a share :math:`\\alpha(L)` of the requests of total length :math:`L` to a small model
and the rest to a large model. Given the workload's density :math:`f(L)` (total rate 1), the two model
classes have the (unnormalised) densities

.. math::

    f_{small}(L) = \\alpha(L)\\, f(L), \\qquad f_{large}(L) = (1 - \\alpha(L))\\, f(L),

rate shares :math:`\\pi_{small} = \\int \\alpha f`, :math:`\\pi_{large} = 1 - \\pi_{small}`, and each class's
own length distribution is its density over its share. The rule is a step function of the length
(:class:`ShareRule`): constant :math:`\\alpha_k` on the right-closed segments :math:`(e_{k-1}, e_k]`
(:math:`e_0 = 0`, the last segment unbounded); a constant share is the one-segment rule. A workload's
pieces are uniform (:class:`~fleetopt.models.workload.LengthDistribution`), so cutting every piece at the
rule's edges and scaling each part by its segment's share gives each class's distribution **exactly**
(no sampling), again piecewise uniform: each class can be tiled into context pools by the same segment
machinery as the whole workload (:func:`fleetopt.models.segments.segment_basis`).

Only the *classification* is modelled here; the classifier's accuracy, its latency and whether the small
model's answers are good enough are the operator's to judge (docs/multi_model.md). The two classes'
outputs are different models' outputs: a fleet tok/W or $/M tokens summed over them compares unlike
tokens.

A :class:`~fleetopt.models.workload.RequestTrace` enters through its total lengths
(:meth:`~fleetopt.models.workload.RequestTrace.length_distribution`, one atom per distinct length); an atom
at :math:`L` is shared by :math:`\\alpha(L)`. Each class's prompt/output split then follows the
distribution convention (``input_fraction``), not the trace's own per-request split.

Examples
--------
>>> from fleetopt.models.workload import LengthDistribution
>>> d = LengthDistribution.from_cdf([(1000, 0.5), (3000, 1.0)])
>>> small, large = split_by_model(d, ShareRule.step([1000], [0.8, 0.2]))
>>> round(small.rate_share, 3), round(large.rate_share, 3)
(0.5, 0.5)
>>> round(small.distribution.mean_tokens, 1), round(large.distribution.mean_tokens, 1)
(800.0, 1700.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetopt.models.numerics import unique
from fleetopt.models.workload import LengthDistribution, RequestTrace

__all__ = ["ShareRule", "ModelClass", "split_by_model", "large_model_share"]

_TOL = 1e-12


@dataclass(frozen=True, eq=False)
class ShareRule:
    """The classifier's small-model share :math:`\\alpha(L)`, a step function of the total length.

    ``edges_tokens`` are the interior edges :math:`e_1 < \\dots < e_{K-1}` (tokens, > 0) and ``small_shares``
    the :math:`K` shares in [0, 1], one per right-closed segment :math:`(e_{k-1}, e_k]`: a request of exactly
    :math:`e_k` tokens belongs to segment :math:`k` (the CDF convention, "length <= B goes short").

    Examples
    --------
    >>> r = ShareRule.step([4096], [1.0, 0.0])
    >>> r.share_at([1, 4096, 4097]).tolist()
    [1.0, 1.0, 0.0]
    >>> ShareRule.constant(0.3).share_at(10_000.0)
    0.3
    """

    edges_tokens: np.ndarray
    small_shares: np.ndarray

    def __post_init__(self) -> None:
        edges = np.atleast_1d(np.asarray(self.edges_tokens, dtype=float))
        shares = np.atleast_1d(np.asarray(self.small_shares, dtype=float))
        problems = []
        if len(shares) != len(edges) + 1:
            problems.append(f"a rule with {len(edges)} edges needs {len(edges) + 1} shares; got {len(shares)}")
        if not np.all(np.isfinite(edges)) or np.any(edges <= 0) or np.any(np.diff(edges) <= 0):
            problems.append("edges_tokens must be finite, > 0 and strictly increasing")
        if not np.all(np.isfinite(shares)) or np.any((shares < 0) | (shares > 1)):
            problems.append("small_shares must lie in [0, 1]")
        if problems:
            raise ValueError("; ".join(problems))
        object.__setattr__(self, "edges_tokens", edges)
        object.__setattr__(self, "small_shares", shares)

    @classmethod
    def constant(cls, small_share: float) -> ShareRule:
        """The same share :math:`\\alpha` of every length (a classifier blind to length)."""
        return cls(np.empty(0), np.array([small_share], dtype=float))

    @classmethod
    def step(cls, edges_tokens, small_shares) -> ShareRule:
        """Share ``small_shares[k]`` on the segment ending at ``edges_tokens[k]`` (the last one unbounded)."""
        return cls(np.asarray(edges_tokens, dtype=float), np.asarray(small_shares, dtype=float))

    def share_at(self, tokens):
        """:math:`\\alpha(L)` (array-aware; a float for a scalar)."""
        L = np.asarray(tokens, dtype=float)
        out = self.small_shares[np.searchsorted(self.edges_tokens, L, side="left")]
        return out if out.ndim else float(out)


@dataclass(frozen=True, eq=False)
class ModelClass:
    """One model's traffic: its share of the total request rate and its own length distribution.

    ``distribution`` is ``None`` when the class gets no traffic (``rate_share`` 0)."""

    role: str
    rate_share: float
    distribution: LengthDistribution | None


def _pieces_at_edges(d: LengthDistribution, edges: np.ndarray):
    """The workload's pieces cut at the rule's edges: (lo, hi, prob, segment index), sorted by ``hi``.

    A uniform piece :math:`(l, h]` of mass :math:`p` cut at edges inside it becomes parts
    :math:`(u, v]` of mass :math:`p (v - u) / (h - l)`; an atom stays whole. The pieces of a
    :class:`~fleetopt.models.workload.LengthDistribution` are disjoint and ordered, so the piece holding each
    part is found by one search on the pieces' upper ends."""
    lo, hi, prob = d.lo_tokens, d.hi_tokens, d.prob
    atom = hi <= lo
    piece = ~atom & (prob > 0)
    plo, phi, pp = lo[piece], hi[piece], prob[piece]
    if pp.size:
        grid = unique(np.concatenate((plo, phi, edges[(edges > plo.min()) & (edges < phi.max())])))
        u, v = grid[:-1], grid[1:]
        mid = (u + v) / 2.0
        owner = np.minimum(np.searchsorted(phi, mid, side="left"), pp.size - 1)
        inside = (mid > plo[owner]) & (mid < phi[owner])
        u, v, owner = u[inside], v[inside], owner[inside]
        mass = pp[owner] * (v - u) / (phi[owner] - plo[owner])
    else:
        u = v = mass = np.empty(0)
    keep = atom & (prob > 0)
    u = np.concatenate((u, hi[keep]))
    v = np.concatenate((v, hi[keep]))
    mass = np.concatenate((mass, prob[keep]))
    order = np.lexsort((u < v, v))          # by upper end; an atom before the part that ends where it sits
    u, v, mass = u[order], v[order], mass[order]
    # the segment of a part: where its upper end lies (right-closed segments; an atom at an edge is in the lower)
    return u, v, mass, np.searchsorted(edges, v, side="left")


def _class(role: str, u, v, mass) -> ModelClass:
    keep = mass > _TOL
    total = float(mass[keep].sum())
    if total <= _TOL:
        return ModelClass(role, 0.0, None)
    return ModelClass(role, total, LengthDistribution(u[keep].copy(), v[keep].copy(), mass[keep] / total))


def split_by_model(workload: LengthDistribution | RequestTrace, rule: ShareRule) -> tuple[ModelClass, ModelClass]:
    """The small and the large model's traffic under ``rule`` (exact; see the module docstring).

    .. math::

        \\pi_{small} = \\sum_j \\alpha_{k(j)} p_j, \\qquad
        f_{small} = \\frac{1}{\\pi_{small}} \\sum_j \\alpha_{k(j)} p_j\\, U(u_j, v_j]

    over the parts :math:`(u_j, v_j]` of the workload's pieces cut at the rule's edges (mass :math:`p_j`,
    segment :math:`k(j)`), and the same with :math:`1 - \\alpha` for the large model. The two rate shares sum
    to 1 and the two unnormalised densities sum to the workload's, piece by piece.

    Examples
    --------
    >>> from fleetopt.models.workload import LengthDistribution
    >>> d = LengthDistribution.from_cdf([(2000, 1.0)])
    >>> small, large = split_by_model(d, ShareRule.constant(0.25))
    >>> small.rate_share, large.rate_share, small.distribution.mean_tokens
    (0.25, 0.75, 1000.0)
    """
    dist = workload.length_distribution() if isinstance(workload, RequestTrace) else workload
    u, v, p, segment = _pieces_at_edges(dist, rule.edges_tokens)
    alpha = rule.small_shares[segment]
    return _class("small", u, v, alpha * p), _class("large", u, v, (1.0 - alpha) * p)


def large_model_share(workload: LengthDistribution | RequestTrace, rule: ShareRule) -> float:
    """:math:`1 - \\pi_{small}`: the share of the traffic that reaches the large model (the quality
    constraint's left-hand side, "at least q of the traffic reaches the large model")."""
    return split_by_model(workload, rule)[1].rate_share
