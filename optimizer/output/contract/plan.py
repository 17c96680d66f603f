"""The documents of the planning commands: ``validate`` (:class:`ValidateDocument`), ``evaluate``
(:class:`EvaluateDocument`) and ``solve`` (:class:`SolveDocument`, with ``--verify-top``'s verification), on the
contract's envelope, figures, pools and fleets (:mod:`fleetopt.optimizer.output.contract`)."""

from typing import Any, Literal, get_args

from pydantic import Field

from fleetopt.optimizer.output.contract import (DROPPED_LINES, Document, Figure, Fleet, FleetAnalytic, FleetSimulated,
                                                Interval, Pool, _deprecated, _Open, _Unit)


class _ValidateWorkload(_Open):
    kind: str
    source: str
    arrival_rate: float
    input_fraction: float | None
    truncated_share: float


class _ValidateSlo(_Open):
    ttft_p99_ms: float
    ttft_model: str
    scope: str
    tpot_p99_ms: float | None
    ttft_margin: float
    ttft_sizing_ms: float


class _ValidateGpu(_Open):
    name: str
    profile: str
    kind: str
    model: str
    gpus_per_replica: int
    physical_gpus_per_replica: int
    unit: _Unit
    unit_note: str
    cost_per_hr: float
    n_slots_at_max_context: int
    max_count: int | None
    availability: float
    quality: str


class _ValidatePools(_Open):
    max_pools: int
    max_context: int
    routing: str
    boundaries: list[int]


class _ValidateConstraints(_Open):
    max_utilization: float
    max_power_kw: float | None
    max_cost_per_hr: float | None
    max_total_gpus: int | None


class InstanceSummary(_Open):
    """What an instance asks for (``fleetopt validate``'s document without its envelope)."""

    name: str
    workload: _ValidateWorkload
    slo: _ValidateSlo
    gpus: list[_ValidateGpu]
    pools: _ValidatePools
    constraints: _ValidateConstraints
    objective: str
    valid: bool
    warnings: list[str]


class ValidateDocument(InstanceSummary, Document):
    """``fleetopt validate``: what the instance asks for."""

    command: Literal["validate"]
    instance: str


class _FleetSpec(_Open):
    fleet: str = Field(description="the fleet spec, LO-HI:GPUxN,...")


class EvaluatedFleet(Fleet, _FleetSpec):
    """One fleet given to ``evaluate`` (its spec first), judged against the instance's limits."""

    violations: list[str] = Field(description="every instance limit it breaks")


class _Baseline(Fleet):
    """The homogeneous baseline: the cheapest fleet of one pool of one GPU option."""

    violations: list[str] = Field(description="every instance limit it breaks")


def _one_fleet(key: str) -> Any:
    """A top-level key of an ``evaluate`` document of one fleet: fleets[0]'s, in the 1.0 layout."""
    return Field(None, description=f"one fleet only: fleets[0].{key} (the deprecated 1.0 layout)",
                 json_schema_extra={"deprecated": True})


class EvaluateDocument(Document):
    """``fleetopt evaluate``: every given fleet (always a list) and the homogeneous baseline; with one fleet its
    keys also sit at top level (the deprecated 1.0 layout), before ``fleets``."""

    command: Literal["evaluate"]
    instance: str
    ttft_model: str
    slo_ttft_p99_ms: float
    max_utilization: float
    truncated_share: float
    fleet: str | None = _one_fleet("fleet")
    physical_gpus: int | None = _one_fleet("physical_gpus")
    cost_per_hr: float | None = _one_fleet("cost_per_hr")
    cost_per_year: float | None = _one_fleet("cost_per_year")
    power_kw: Figure = _one_fleet("power_kw")
    tok_per_watt: Figure = _one_fleet("tok_per_watt")
    usd_per_million_output_tokens: Figure = _one_fleet("usd_per_million_output_tokens")
    total_replicas: int | None = _one_fleet("total_replicas")
    total_gpus: int | None = _one_fleet("total_gpus")
    slo_met: bool | None = _one_fleet("slo_met")
    feasible: bool | None = _one_fleet("feasible")
    scope: Literal["pool", "fleet"] | None = _one_fleet("scope")
    ttft_p99_ms: Figure = _one_fleet("ttft_p99_ms")
    slo_miss_share: Figure = _one_fleet("slo_miss_share")
    pools: list[Pool] | None = _one_fleet("pools")
    analytic: FleetAnalytic | None = _one_fleet("analytic")
    simulated: FleetSimulated | None = _one_fleet("simulated")
    source: str | None = _one_fleet("source")
    violations: list[str] | None = _one_fleet("violations")
    fleets: list[EvaluatedFleet] = Field(min_length=1)
    baseline: _Baseline | None


class _Objective(_Open):
    name: str = Field(description="the instance's objective")
    value: float | None = Field(description="the selected plan's objective value, in unit (null without a plan)")
    unit: str
    bound: float | None = Field(description="the solver's best bound on the objective")
    lp_bound: float | None = Field(description="the LP relaxation's bound")
    minimizes: str = Field(description="what the solver minimises, in words")


class _Routing(_Open):
    """A split-routing plan's routing: per elementary length segment, the req/s sent to each pool."""

    boundaries_tokens: list[int] = Field(description="the elementary segments' boundaries")
    rate_req_per_s: list[list[float]] = Field(description="per segment, the req/s to each pool (columns in the "
                                                          "order of the plan's pools)")
    source: Literal["MIP"]


class _SolutionHead(_Open):
    rank: int = Field(description="1-based, by increasing objective")
    objective: float = Field(description="the plan's objective value, in objective.unit")


class _Solution(Fleet, _SolutionHead):
    """One plan the solver found: its rank and objective, then the fleet's keys."""

    fleet: str | None = Field(description="the fleet spec, LO-HI:GPUxN,...; null for a split-routing plan, whose "
                              "pools overlap (its routing says how)")
    routing: _Routing | None




class _DroppedReason(_Open):
    """The dropped candidates of one GPU option that share one reason (its wording less the numbers)."""

    count: int = Field(description="candidates dropped for this reason")
    example: str = Field(description="one of them, with its segment and reason: LO-HI on GPU: why")


class _DroppedOption(_Open):
    """The candidates of one GPU option the sizing dropped."""

    gpu: str = Field(description="the GPU option (a semantic plan's: role, share and option)")
    dropped: int = Field(description="candidate segments dropped")
    reasons: list[_DroppedReason] = Field(description="per reason, most frequent first (at most 3; the rest in "
                                                      "other)")
    other: int = Field(description="dropped for a reason not listed")


class _Candidates(_Open):
    generated: int = Field(description="candidate pools (segment x GPU option) generated")
    feasible: int = Field(description="those a replica count makes meet the SLO")
    after_pruning: int = Field(description="those left after dominated ones are pruned")
    left_unsized: int = Field(description="candidates never sized because feasible candidates of the same segment "
                                          "(as many as the plans asked for) rule them out by their cost (and "
                                          "power and GPU) floors, so the plans are the same without them; "
                                          "counted in generated, in neither feasible nor dropped_total")
    dropped_total: int = Field(description="candidates dropped: no replica count makes them meet the SLO")
    dropped: list[str] = Field(description=f"the reasons of representative dropped candidates (at most "
                                           f"{DROPPED_LINES}, the most frequent reason of each option first)")
    dropped_by_option: list[_DroppedOption] = Field(description="per GPU option, how many were dropped and why")


class _VerifiedPool(_Open):
    """One pool of a simulated plan of ``solve --verify-top``."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    ttft_p99_ms_analytic: Figure
    ttft_p99_ms_sim: Figure = Field(description="null: the plan's simulation has no row for the pool")
    ttft_p99_ci_ms: Interval | None
    slo_met_sim: bool
    outcome: Literal["pass", "fail", "undecided"]
    too_few_requests: bool
    requests_measured: int | None
    preemptions: int | None


class _VerifiedPlan(_Open):
    """One plan simulated by ``solve --verify-top``, in one round."""

    round: int
    rank: int
    cost_per_hr: float
    passed: bool
    outcome: Literal["pass", "fail", "undecided"]
    accepted: bool
    verdict: str = Field(description="passes, misses or undecided in simulation at N requests")
    ttft_p99_ms_sim: Figure
    ttft_p99_ci_ms: Interval
    requests_simulated: int
    cached: bool = Field(description="judged in an earlier round, not simulated again")
    pools: list[_VerifiedPool]


class _SizingTrial(_Open):
    """One simulated count of a pool sized alone."""

    replicas: int
    passed: bool
    outcome: str
    ttft_p99_ms_sim: Figure
    ttft_p99_ci_ms: Interval
    requests: int = Field(description="measured requests")
    requests_simulated: int
    source: str = Field(description="alone: the pool's own run; or the plan's run it was judged in")


class _PoolSizing(_Open):
    """A pool sized alone by simulation (``--verify-cuts pool``): its least passing count."""

    min_tokens: int
    max_tokens: int
    gpu: str
    max_num_seqs: int
    least_replicas: int | None = Field(description="the least count that passes (null: none up to the cap)")
    cap_replicas: int
    reason: str | None
    trials: list[_SizingTrial]


class _TrimPool(_Open):
    """One pool of the trimmed plan."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int = Field(description="replicas to buy: replicas_up inflated by availability, at least min_count")
    replicas_up: int = Field(description="replicas the simulations ran (the trimmed, confirmed count)")
    replicas_verified: int = Field(description="the verified plan's count")
    ttft_p99_ms_sim: Figure
    ttft_p99_ci_ms: Interval
    ttft_p99_ms_confirmation: Figure = Field(description="the independent confirmation run's P99 TTFT")
    ttft_p99_ms_analytic: Figure
    slo_met_analytic: bool


class _Trim(_Open):
    """``solve --trim``: the chosen plan's counts lowered while its simulation still meets the SLO."""

    source: Literal["simulated"]
    confirmed: bool = Field(description="an independent simulation confirms the trimmed plan")
    cost_per_hr: float = Field(description="the trimmed plan's $/hr")
    verified_cost_per_hr: float
    savings: float = Field(description="$/hr saved against the verified plan")
    ttft_p99_ms_sim: Figure
    ttft_p99_ms_confirmation: Figure
    fleet: str | None
    fleet_simulated: str | None
    trials: int
    requests_per_trial: int
    pools: list[_TrimPool]
    options: dict = Field(description="the simulation settings")


class _Verification(_Open):
    """``solve --verify-top N``: every simulated plan, per round, the pools sized alone, and the trim."""

    rule: str = Field(description="what meets the SLO in simulation (--verify-rule)")
    rounds: int
    cuts: list[str] = Field(description="why each cut was made, in order")
    plans: list[_VerifiedPlan]
    reason: str | None = Field(description="why no plan was chosen (null: one was)")
    pool_sizing: list[_PoolSizing]
    solves: int
    plan_simulations: int
    pool_simulations: int
    pool_runs: int
    engine: dict | None = Field(description="the simulation engine's settings (null: nothing simulated)")
    options: dict = Field(description="the simulation settings")
    outcome: Literal["pass", "fail", "undecided"] | None
    verdict: str | None
    chosen_rank: int | None
    chosen_round: int | None
    trim: _Trim | None = Field(description="--trim only (null without)")


class _Provenance(_Open):
    selection: str = Field(description="what selected the plan (the method)")
    numbers: str = Field(description="where its figures come from")
    profiles: list[str] = Field(description="per GPU option of the plan: the quality of its profile")


class SolveDocument(Document):
    """``fleetopt solve``: the chosen plan's fleet at top level (its keys null without a plan), every solution."""

    command: Literal["solve"]
    instance: str
    overrides: list[str]
    status: str
    method: str
    solver: str | None = Field(description="the solver that selected the plan")
    explanation: str
    objective: _Objective
    physical_gpus: int | None = Field(description="physical GPUs of the plan (null without a plan)")
    cost_per_hr: float | None = Field(description="deprecated alias of analytic.cost_per_hr (null without a plan)",
                                      json_schema_extra={"deprecated": True})
    cost_per_year: float | None = _deprecated("analytic.cost_per_year")
    power_kw: Figure = _deprecated("analytic.power_kw")
    tok_per_watt: Figure = _deprecated("analytic.tok_per_watt")
    usd_per_million_output_tokens: Figure = Field(description="the plan's $ per million output tokens "
                                                              "(analytic.usd_per_million_output_tokens; null "
                                                              "without a plan)")
    total_replicas: int | None = _deprecated("analytic.total_replicas")
    total_gpus: int | None = _deprecated("analytic.total_gpus")
    slo_met: bool | None = _deprecated("analytic.slo_met")
    feasible: bool | None = _deprecated("analytic.feasible")
    scope: Literal["pool", "fleet"] | None = Field(None, description="the SLO's scope (absent without a plan)")
    ttft_p99_ms: Figure = Field(None, description="deprecated alias of analytic.ttft_p99_ms (absent without a plan)",
                                json_schema_extra={"deprecated": True})
    slo_miss_share: Figure = Field(None, description="deprecated alias of analytic.slo_miss_share (absent without "
                                                     "a plan)", json_schema_extra={"deprecated": True})
    pools: list[Pool] | None
    analytic: FleetAnalytic | None
    simulated: FleetSimulated | None
    source: str | None = Field(None, description="where the plan's figures come from (absent without a plan)")
    semantic: dict | None = Field(description="a semantic plan's model classes (null for one model class)")
    fleet: str | None
    routing: _Routing | None
    baseline: _Baseline | None
    warnings: list[str]
    solve_seconds: float
    mip_gap: float | None
    ttft_model: str
    slo_ttft_p99_ms: float
    ttft_margin: float = Field(description="share of the SLO the plans were sized to keep free (slo.ttft_margin; 0 "
                                           "with --verify-top)")
    ttft_sizing_ms: float = Field(description="the P99 TTFT the candidates were sized to: the SLO less the margin")
    power_linearization_error_w: Figure = Field(description="largest error of the MIP's linearised power")
    candidates: _Candidates = Field(description="the candidate pools generated, feasible and kept; the dropped ones "
                                                "summarised")
    solutions: list[_Solution]
    verified: bool | None = Field(description="null without --verify-top")
    verification: _Verification | None = Field(None, description="--verify-top only: every simulated plan, per "
                                                                 "round, the pools sized alone and the trim")
    provenance: _Provenance


DOCUMENTS: dict[str, type[Document]] = {
    kind: m for m in (ValidateDocument, EvaluateDocument, SolveDocument)
    for kind in get_args(m.model_fields["command"].annotation)}
"""Each document kind (its ``command`` value) this module declares, and its model."""
