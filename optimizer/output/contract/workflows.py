"""The documents of the workflow commands: ``tpw`` and its rho sweep, ``bench``, ``pareto`` (the split table and
the ``--axes`` frontiers), ``headroom`` (and ``--range``), ``diff``, ``whatif``, ``gridflex``, ``profile fit`` and
``catalog list``, on the contract's envelope and figures (:mod:`fleetopt.optimizer.output.contract`)."""

from typing import Literal, get_args

from pydantic import Field

from fleetopt.optimizer.output.contract import Document, Figure, Interval, _Open


class _TpwRow(_Open):
    profile: str
    model: str
    context: int
    n_slots: int
    iter_latency_ms: Figure
    tok_per_s: Figure
    power_w: Figure
    tok_per_watt: Figure
    quality: str
    source: Literal["analytic"]


class TpwDocument(Document):
    """``fleetopt tpw``: tokens per watt of one replica per context window."""

    command: Literal["tpw"]
    instance: None
    rows: list[_TpwRow]


class _RhoPoint(_Open):
    """The fleet at one utilisation of every pool (``fleet_points``, ``fleet_now``)."""

    rho: Figure = Field(description="utilisation (null: the pool is unstable now)")
    power_w: Figure
    output_tok_per_s: Figure
    tok_per_watt: Figure
    usd_per_mtok: Figure


class _RhoPoolPoint(_Open):
    """One pool brought to a utilisation by scaling the arrival rate (``now``: the instance's own rate)."""

    rho: Figure = Field(description="utilisation (null: the pool is unstable now)")
    fleet_arrival_rate: Figure = Field(description="the fleet's req/s that brings the pool to rho")
    arrival_rate: Figure = Field(description="the pool's own req/s there")
    utilization: Figure
    mean_batch: Figure
    power_w: Figure
    output_tok_per_s: Figure
    tok_per_watt: Figure
    usd_per_mtok: Figure
    cost_per_hr: float
    ttft_p99_ms: Figure
    slo_met: bool


class _RhoPool(_Open):
    pool: str
    gpu: str
    replicas: int
    batch_cap: int
    quality: str
    routing_share: Figure
    points: list[_RhoPoolPoint]
    now: _RhoPoolPoint


class RhoSweepDocument(Document):
    """``fleetopt tpw INSTANCE --fleet SPEC --rho-sweep``: a fleet's pools against utilisation."""

    command: Literal["tpw --rho-sweep"]
    instance: str
    fleet: str
    arrival_rate: float
    ttft_model: str
    source: Literal["analytic"]
    rhos: list[float]
    pools: list[_RhoPool]
    fleet_points: list[_RhoPoint]
    fleet_now: _RhoPoint
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")


class _BenchRow(_Open):
    name: str


class BenchDocument(Document):
    """``fleetopt bench``: one row per benchmark (medians in s, targets, whether met)."""

    command: Literal["bench"]
    instance: None
    machine: dict
    repeats: int
    statistic: str
    benchmarks: list[_BenchRow]


class _SplitRow(_Open):
    """One boundary of the split table (``fleetopt.optimizer.workflows.split_table.SplitRow``)."""

    boundary_tokens: int
    share_short: float = Field(description="F(B): the share of requests of at most boundary_tokens tokens")
    replicas_short: int
    replicas_long: int
    total_gpus: int
    cost_per_hr: float
    cost_per_year: float
    saving_pct: Figure = Field(description="100 (C0 - C) / C0 against the baseline's cost C0")
    ttft_p99_ms_short: Figure
    ttft_p99_ms_long: Figure
    slo_met: bool
    pareto: bool
    fleet: str
    miss_reason: str = Field(description="why a pool misses the SLO (empty when the row meets it)")
    limits_ok: bool = Field(description="the row's fleet breaks no limit of the instance")
    violations: list[str] = Field(description="every instance limit the row's fleet breaks (as evaluate's)")


class _SplitBaseline(_Open):
    """The homogeneous fleet of the split table's GPU option the savings are measured against."""

    replicas: int
    total_gpus: int
    cost_per_hr: float
    cost_per_year: float
    ttft_p99_ms: Figure
    slo_met: bool
    fleet: str
    violations: list[str] = Field(description="every instance limit the baseline breaks")


class ParetoDocument(Document):
    """``fleetopt pareto --split-table``: one two-pool fleet per split boundary."""

    command: Literal["pareto --split-table"]
    instance: str
    source: Literal["analytic"]
    gpu: str
    arrival_rate: float
    slo_ttft_p99_ms: float
    ttft_model: str
    max_utilization: float
    max_context_tokens: int
    baseline: _SplitBaseline
    rows: list[_SplitRow]
    recommended: int | None = Field(description="0-based index into rows of the cost optimum meeting the SLO "
                                                "within the instance's limits; null when none does")
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")


class _FrontierHead(_Open):
    fleet: str = Field(description="the plan's fleet spec, LO-HI:GPUxN,... (one entry per pool)")
    cost_per_hr: float
    cost_per_year: float


class _PowerAxis(_FrontierHead):
    power: Figure = Field(description="the point's value on the power axis: axis_value, kW")


class _TtftAxis(_FrontierHead):
    ttft: Figure = Field(description="the point's value on the ttft axis: axis_value, ms")


class _PoolsAxis(_FrontierHead):
    pools: int = Field(description="number of pools of the plan (the pools axis: axis_value)")


class _FrontierPoint(_FrontierHead):
    """One point of a ``pareto --axes`` curve: an optimal plan of a re-solve, re-judged on the instance itself.
    Its value on the second axis is ``axis_value``, and also under the axis' name (``power``, ``ttft``), after
    ``cost_per_year``; on the pools axis that key is ``pools`` itself, there (the points of each axis:
    :class:`_PowerPoint`, :class:`_TtftPoint`, :class:`_PoolsPoint`)."""

    axis_value: Figure = Field(description="the plan's value on the second axis, in axis_unit")
    axis_unit: str
    total_gpus: int = Field(description="GPUs as the options price them (seed units count one per TP=8 server)")
    physical_gpus: int = Field(description="physical GPUs of the plan's pools")
    pools: int = Field(description="number of pools of the plan")
    power_kw: Figure
    worst_ttft_p99_ms: Figure = Field(description="the largest analytic P99 TTFT over the pools with traffic")
    worst_tpot_p99_ms: Figure
    slo_miss_share: Figure
    slo_met: bool = Field(description="the plan meets the instance's own SLO, re-evaluated at its counts")
    violations: list[str] = Field(description="every limit of the instance the plan breaks")
    constraint: str = Field(description="the --set of the re-solve that found it")
    rank: int = Field(description="1-based, by increasing cost (the baseline: 0)")
    recommended: bool
    knee: bool


class _PowerPoint(_FrontierPoint, _PowerAxis):
    """A point of the cost,power curve (``power``: its kW)."""


class _TtftPoint(_FrontierPoint, _TtftAxis):
    """A point of the cost,ttft curve (``ttft``: its worst P99 TTFT, ms)."""


class _PoolsPoint(_FrontierPoint, _PoolsAxis):
    """A point of the cost,pools curve (``pools`` right after ``cost_per_year``)."""


class FrontierDocument(Document):
    """``fleetopt pareto --axes cost,AXIS``: the exact least-cost curve against power, P99 TTFT or pools (one
    model per axis: :class:`PowerFrontierDocument`, :class:`TtftFrontierDocument`, :class:`PoolsFrontierDocument`,
    whose points carry the axis' key)."""

    command: Literal["pareto --axes cost,power", "pareto --axes cost,ttft", "pareto --axes cost,pools"]
    instance: str
    source: str
    axes: list[str] = Field(min_length=2, max_length=2, description='["cost", AXIS]')
    axis_unit: str = Field(description="kW, ms or pools")
    sweep: Literal["consecutive", "evenly spaced caps"]
    slo_ttft_p99_ms: float = Field(description="the instance's P99 TTFT SLO every point is judged on")
    slo_tpot_p99_ms: float | None = Field(description="the instance's P99 TPOT SLO (null: none)")
    slo: str = Field(description="the instance's SLO in words")
    points: list[_FrontierPoint] = Field(description="non-dominated, by increasing cost")
    recommended: int | None = Field(description="0-based index into points of the cheapest point meeting the SLO "
                                                "within the instance's limits; null when none does")
    recommended_index: int | None = Field(description="recommended, under a second name")
    recommended_reason: str
    recommendation_rule: str = Field(description="what recommended means, in words")
    knee_index: int | None = Field(description="0-based index into points of the knee (an alternative)")
    knee_rule: str = Field(description="what the knee is, in words")
    baseline: _FrontierPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")
    baseline_dominated: bool | None
    solves: int
    solve_seconds: float
    truncated: bool = Field(description="a consecutive sweep stopped at its point limit before the curve's end")
    overrides: list[str]
    solves_unused: int = Field(description="solves made ahead on the backend's workers the sweep did not ask for")
    backend: str = Field(description="where the re-solves ran")


class PowerFrontierDocument(FrontierDocument):
    """``fleetopt pareto --axes cost,power``."""

    command: Literal["pareto --axes cost,power"]
    points: list[_PowerPoint] = Field(description="non-dominated, by increasing cost")
    baseline: _PowerPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")


class TtftFrontierDocument(FrontierDocument):
    """``fleetopt pareto --axes cost,ttft``."""

    command: Literal["pareto --axes cost,ttft"]
    points: list[_TtftPoint] = Field(description="non-dominated, by increasing cost")
    baseline: _TtftPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")


class PoolsFrontierDocument(FrontierDocument):
    """``fleetopt pareto --axes cost,pools``."""

    command: Literal["pareto --axes cost,pools"]
    points: list[_PoolsPoint] = Field(description="non-dominated, by increasing cost")
    baseline: _PoolsPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")


FRONTIER_DOCUMENTS: dict[str, type[FrontierDocument]] = {
    "power": PowerFrontierDocument, "ttft": TtftFrontierDocument, "pools": PoolsFrontierDocument}
"""The document model of each ``pareto --axes cost,AXIS``, by AXIS."""
FRONTIER_POINTS: dict[str, type[_FrontierPoint]] = {"power": _PowerPoint, "ttft": _TtftPoint, "pools": _PoolsPoint}
"""The model of a point (and of the baseline) of each ``pareto --axes cost,AXIS``, by AXIS."""


class _HeadroomPool(_Open):
    """One pool's analytic limit (``fleetopt.optimizer.workflows.headroom.PoolLimit``)."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    routing_share: Figure
    max_arrival_rate: Figure = Field(description="the largest fleet rate at which the pool carries its share "
                                                 "(null: no traffic, or no limit below the search's top)")
    pool_arrival_rate: Figure = Field(description="routing_share x max_arrival_rate")
    limited_by: str = Field(description="what fails just above the limit (empty: nothing)")
    ttft_p99_ms: Figure = Field(description="the pool's analytic P99 TTFT at the limit")
    capacity_load: Figure = Field(description="the pool's capacity load at the limit")
    ttft_p99_ms_above: Figure = Field(description="the pool's analytic P99 TTFT one grid step above the limit")
    capacity_load_above: Figure


class _HeadroomProbe(_Open):
    """One simulated rate of a pool's search: the pool alone at its share of the fleet rate."""

    arrival_rate: float = Field(description="the fleet rate (req/s)")
    pool_arrival_rate: Figure
    slo_met: bool
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval
    requests: int = Field(description="measured requests of the pool (all replications)")


class _HeadroomPoolSim(_Open):
    """One pool's simulated limit: the largest passing and the smallest failing fleet rate of the grid."""

    pool: str
    routing_share: Figure
    max_arrival_rate_sim: Figure
    min_failing_rate_sim: Figure
    probes: list[_HeadroomProbe]


class _HeadroomSim(_Open):
    """The simulated limit (``headroom --verify``): the least of the pools'."""

    max_arrival_rate_sim: Figure
    binding_pool: str | None
    tolerance_req_per_s: float
    rule: str
    ci: str
    simulations: int
    options: dict = Field(description="the simulation settings")
    pools: list[_HeadroomPoolSim]


class HeadroomDocument(Document):
    """``fleetopt headroom``: the largest arrival rate a fleet carries within its SLO."""

    command: Literal["headroom"]
    instance: str
    fleet: str
    source: Literal["analytic"]
    arrival_rate: float
    slo_ttft_p99_ms: float
    ttft_model: str
    scope: str
    max_utilization: float
    max_arrival_rate: Figure
    binding_pool: str | None
    binding_pool_index: int | None = Field(description="0-based index into pools of binding_pool (null: the "
                                                       "fleet-wide P99 binds, or nothing)")
    limited_by: str
    fleet_p99_limit: Figure = Field(description="fleet scope only: the largest rate at which the fleet-wide P99 "
                                                "meets the SLO")
    tolerance_req_per_s: float
    evaluations: int = Field(description="analytic evaluations of the fleet the search made")
    pools: list[_HeadroomPool]
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")
    slo_met: bool = Field(description="the fleet meets its SLO at the instance's arrival_rate")
    limits_ok: bool = Field(description="the fleet breaks no limit of the instance at its arrival_rate "
                                        "(false: exit code 6)")
    violations: list[str] = Field(description="every instance limit the fleet breaks at its arrival_rate "
                                              "(as evaluate's)")
    max_arrival_rate_sim: Figure = Field(None, description="--verify only: sim.max_arrival_rate_sim")
    sim: _HeadroomSim | None = Field(None, description="--verify only: the simulated limit")


class _DiffPoolChange(_Open):
    change: Literal["added", "removed", "resized", "moved", "unchanged"]
    gpu: str
    phase: Literal["both", "prefill", "decode"]
    hardware: str = Field(description="the profile's GPU (its name up to the first /), else the GPU option")
    physical_gpus_per_replica: int
    min_tokens_a: int | None = Field(description="the pool's segment in A (null: added)")
    max_tokens_a: int | None
    min_tokens_b: int | None = Field(description="the pool's segment in B (null: removed)")
    max_tokens_b: int | None
    replicas_a: int
    replicas_b: int
    replicas_delta: int = Field(description="replicas_b - replicas_a")
    physical_gpus_a: int
    physical_gpus_b: int
    physical_gpus_delta: int = Field(description="physical_gpus_b - physical_gpus_a")


class _DiffOption(_Open):
    gpu: str
    replicas_a: int
    replicas_b: int
    replicas_delta: int
    physical_gpus_a: int
    physical_gpus_b: int
    physical_gpus_delta: int


class _DiffHardware(_Open):
    hardware: str
    physical_gpus_a: int
    physical_gpus_b: int
    physical_gpus_delta: int = Field(description="GPUs to buy (> 0) or release (< 0)")
    action: Literal["buy", "release", "keep"]


class _BoundaryMove(_Open):
    from_tokens: int
    to_tokens: int


class FleetChange(_Open):
    """What changes from fleet A to fleet B (``diff``'s ``change``, each ``headroom --range`` step's): pools
    matched by GPU configuration, phase and segment, GPUs per option and per hardware, boundaries, $/hr."""

    pools: list[_DiffPoolChange]
    options: list[_DiffOption]
    hardware: list[_DiffHardware]
    boundaries_a: list[int]
    boundaries_b: list[int]
    boundary_moves: list[_BoundaryMove]
    boundaries_added: list[int]
    boundaries_removed: list[int]
    replicas_delta: int
    physical_gpus_delta: int
    cost_per_hr_delta: float | None = Field(description="B's $/hr - A's (null: a side's cost unknown)")
    cost_per_year_delta: float | None
    unchanged: bool
    summary: str = Field(description="the change in words: GPUs to buy / release per hardware, the $/hr delta")


class _RangePool(_Open):
    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    phase: Literal["both", "prefill", "decode"] = "both"
    hardware: str = Field("", description="the profile's GPU (its name up to the first /), else the GPU option")
    physical_gpus: int = 0


class _RangeFleet(_Open):
    """The optimal fleet at one rate of ``headroom --range`` (no plan: ``fleet`` null and costs null)."""

    arrival_rate: float
    status: str = Field(description="the solve's status at this rate")
    fleet: str | None
    total_gpus: int | None
    total_replicas: int | None
    physical_gpus: int | None
    cost_per_hr: Figure
    cost_per_year: Figure
    pools: list[_RangePool]


class _RangePlateau(_RangeFleet):
    add_capacity_before: Figure = Field(description="the step rate that ends the plateau (null: it lasts to the "
                                                    "range's top)")
    change: FleetChange | None = Field(description="from the current fleet (--fleet) to the plateau's fleet "
                                                   "(null without --fleet)")


class _RangeStep(_Open):
    arrival_rate: float
    before: _RangeFleet
    after: _RangeFleet
    change: FleetChange = Field(description="what to add at the step: from the current fleet (--fleet) or else "
                                            "from the previous step's fleet")
    change_from_previous: FleetChange


class HeadroomRangeDocument(Document):
    """``fleetopt headroom --range LO:HI``: where the optimal fleet steps up over a rate range."""

    command: Literal["headroom --range"]
    instance: str
    source: str
    range: list[float] = Field(min_length=2, max_length=2)
    slo_ttft_p99_ms: float
    ttft_model: str
    current_fleet: _RangeFleet | None = Field(description="the --fleet at the instance's rate (null without --fleet)")
    reference: Literal["current fleet", "previous step"] = Field(
        description="what each step's change is measured from")
    steps: list[_RangeStep]
    plateaus: list[_RangePlateau]
    solved: list[_RangeFleet] = Field(description="every rate solved, by increasing rate")
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")


class _DiffFigures(_Open):
    """A plan's headline figures (``diff``'s ``a`` and ``b``), or their change B - A (``delta``)."""

    physical_gpus: int
    total_replicas: int
    cost_per_hr: float
    cost_per_year: float
    power_kw: Figure
    tok_per_watt: Figure
    usd_per_million_output_tokens: Figure


class _DiffPlanHead(_Open):
    file: str
    command: Literal["solve", "evaluate", "simulate"]
    instance: str | None
    plan: str = Field(description="which plan of the file: the selected plan, plan N, fleet N, the simulated fleet")
    fleet: str | None
    overrides: list[str]
    slo_ttft_p99_ms: float | None
    arrival_rate: Figure = Field(description="req/s: the sum of its pools' analytic arrival_rate (decode rows out)")


class _DiffPlan(_DiffFigures, _DiffPlanHead):
    """One side of a ``diff``: which plan, its headline figures, its SLO verdict."""

    slo_met: bool | None
    slo_source: Literal["analytic", "simulated"]
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval | None = Field(description="simulated only: the P99 TTFT's 95 % interval")


class _DiffDelta(_DiffFigures):
    """B - A of each headline figure."""


class DiffDocument(Document):
    """``fleetopt diff A.json B.json``: what changes from plan A to plan B."""

    command: Literal["diff"]
    instance: str | None = Field(description="the instance of both plans; null when they differ")
    same_instance: bool
    instance_note: str | None = Field(description="what differs between the plans' instances (null: nothing)")
    a: _DiffPlan
    b: _DiffPlan
    change: FleetChange
    delta: _DiffDelta = Field(description="B - A of each headline figure (null where a side's is null)")


class _WhatIfPool(_Open):
    """One pool of a scenario's plan (analytic)."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    gpus: int
    ttft_p99_ms: Figure
    capacity_load: Figure
    cost_per_hr: float


class _WhatIfBinding(_Open):
    """What a pool breaks with one deployed replica fewer (``fleetopt.optimizer.workflows.whatif.binding``)."""

    pool: str = Field(description="LO-HI:GPUxN")
    binds: list[str] = Field(description="P99 TTFT, TPOT, utilization cap; or one replica, or above least count")
    replicas_tested: int | None = Field(description="the up count tested (null: the pool has no traffic)")
    ttft_p99_ms: Figure = Field(description="the pool's P99 TTFT at replicas_tested (null: not evaluated)")
    capacity_load: Figure


class _WhatIfSim(_Open):
    """--verify only: the scenario's plan simulated."""

    slo_met: bool = Field(description="the upper end of the 95 % P99 TTFT interval within the SLO")
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval
    requests_measured: int
    seed: int


class _WhatIfRecord(_Open):
    """A solve's record: the base instance's, or one scenario's (``fleetopt.optimizer.workflows.whatif.RECORD_KEYS``;
    the plan's keys null without a plan)."""

    status: str
    method: str
    explanation: str
    mip_gap: float | None
    cost_per_hr: float | None
    cost_per_year: float | None
    total_replicas: int | None
    total_gpus: int | None
    power_kw: Figure
    fleet: str | None
    pools: list[_WhatIfPool]
    binding: list[_WhatIfBinding]
    limits_at_bound: list[str] = Field(description="the fleet-wide limits the plan meets with equality")
    binding_note: str = Field(description="why the per-pool binding is not determined (empty: it is)")
    sim: _WhatIfSim | None = Field(description="--verify only (null without)")


class _PoolResize(_Open):
    pool: str = Field(description="LO-HI:GPU")
    replicas_base: int
    replicas: int


class _WhatIfDeltas(_Open):
    """A scenario against the base (null where either has no plan)."""

    cost_per_year: float | None = Field(description="$/yr: the scenario's - the base's")
    cost_pct: float | None = Field(description="cost_per_year over the base's, in %")
    replicas: int | None
    gpus: int | None
    pools_added: list[str]
    pools_removed: list[str]
    pools_resized: list[_PoolResize]
    gpu_types_added: list[str]
    gpu_types_removed: list[str]
    same_fleet: bool | None


class _ScenarioHead(_Open):
    index: int
    key: str
    overrides: dict = Field(description="the swept values by dotted path")


class _Scenario(_WhatIfRecord, _ScenarioHead):
    """One scenario of the grid: its place, its values, its record and its deltas against the base."""

    deltas: _WhatIfDeltas


class _Sweep(_Open):
    path: str = Field(description="the dotted instance field swept")
    values: list = Field(description="its values, as YAML reads them")


class WhatIfDocument(Document):
    """``fleetopt whatif``: the base solve and one re-solve per scenario of the grid."""

    command: Literal["whatif"]
    instance: str
    instance_file: str
    source: str
    slo_ttft_p99_ms: float
    ttft_model: str
    overrides: list[str] = Field(description="the --set overrides of the base and every scenario")
    sweeps: list[_Sweep]
    base: _WhatIfRecord
    scenarios: list[_Scenario]
    sim_options: dict | None = Field(None, description="--verify only: the simulation settings")


class _DepthEvent(_Open):
    delivered_reduction: Figure
    draw_kw: Figure
    uncurtailed_draw_kw: Figure
    source: Literal["simulated"]
    verdict: Literal["met", "breach", "undecided"] | None
    undecided_pools: list[str]


class _DepthPool(_Open):
    """One pool at one curtailment depth (``fleetopt.optimizer.workflows.gridflex.PoolDepth``)."""

    pool: str
    replicas: int = Field(description="replicas left in service")
    replicas_out: int = Field(description="replicas taken out of service")
    batch_cap: int
    power_cap_w: Figure
    replica_power_at_cap_w: Figure
    power_w: Figure
    utilization: Figure
    ttft_p99_ms_analytic: Figure
    ttft_p99_ms_event: Figure
    ttft_p99_ci_ms_event: Interval
    power_w_event: Figure
    drain_s_event: Figure
    measured_event: int
    sustained_ok: bool
    event_ok: bool
    event_verdict: str = Field(description="met, breach or undecided; empty when not simulated")


class _Depth(_Open):
    depth: float
    batch_cap: int | None = Field(description="the cap of a one-pool fleet (null with several pools)")
    power_kw: Figure
    ttft_p99_ms_analytic: Figure
    ttft_p99_ms_event: Figure
    ttft_p99_ci_ms_event: Interval
    power_kw_event: Figure
    drain_s_event: Figure
    sustained_ok: bool
    event_ok: bool
    simulated: bool
    lever: str
    delivered_reduction: Figure
    draw_kw: Figure
    uncurtailed_draw_kw: Figure
    source: Literal["analytic"]
    verdict: Literal["met", "breach"]
    delivers: bool
    event: _DepthEvent
    pools: list[_DepthPool]


class _GridFlexSources(_Open):
    """Where each figure of a depth comes from."""

    batch_cap: str
    power_kw: str
    delivered_reduction: str
    ttft_p99_ms_analytic: str
    ttft_p99_ms_event: str


class GridFlexDocument(Document):
    """``fleetopt gridflex``: the fleet at each curtailment depth, a depth read as ``convention`` (``delivered``:
    the fleet's draw reduction; ``seed``: the reference scenarios' per-GPU peak-power cap)."""

    command: Literal["gridflex"]
    instance: str
    fleet: str
    arrival_rate: float
    slo_ttft_p99_ms: float
    ttft_model: str
    scope: str
    convention: Literal["delivered", "seed"]
    convention_label: str
    source: _GridFlexSources
    event_seconds: float
    warmup_seconds: float
    tail_seconds: float
    replications: int
    seed: int
    event_model: str
    depths: list[_Depth]
    max_safe_depth_sustained: float | None
    max_safe_depth_event: float | None
    undecided_pools: list[str]
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")
    wall_seconds: float = Field(description="wall-clock time of the sweep (s)")


class ProfileFitDocument(Document):
    """``fleetopt profile fit``: the fitted coefficients, every point and the profile file's content."""

    command: Literal["profile fit"]
    instance: None
    coefficients: dict[str, float]
    power: dict | None
    fit: dict
    summary: dict
    points: list[dict]
    profile: dict


class CatalogDocument(Document):
    """``fleetopt catalog list``: what the catalogue holds, with units and provenance."""

    command: Literal["catalog list"]
    instance: None
    kinds: list[str] = Field(min_length=1)
    files: dict[str, str]
    units: dict


DOCUMENTS: dict[str, type[Document]] = {
    kind: m
    for m in (TpwDocument, RhoSweepDocument, BenchDocument, ParetoDocument, *FRONTIER_DOCUMENTS.values(),
              HeadroomDocument, HeadroomRangeDocument, WhatIfDocument, GridFlexDocument, ProfileFitDocument,
              CatalogDocument, DiffDocument)
    for kind in get_args(m.model_fields["command"].annotation)}
"""Each document kind (its ``command`` value) this module declares, and its model."""
