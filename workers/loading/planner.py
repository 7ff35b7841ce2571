"""The planner a worker runs: its measured curves, corrected by what served requests measure."""
import math
import threading
from dataclasses import dataclass, field

from workers.loading.request_plan import BLEND_PLAN, PLAIN_PLAN, PrefillCosts, RequestPlan


@dataclass(slots=True)
class PlanCorrection:
    """Measured over predicted TTFT per plan, a running geometric mean (`weight` for each new request).

    The curves are measured on a quiet worker at start; under serving load (other processes on the same
    cores) requests run slower, and not alike for both plans. A factor starts at 1 and moves with each
    request served under its plan.
    """

    weight: float = 0.2
    factors: dict[str, float] = field(default_factory=lambda: {BLEND_PLAN: 1.0, PLAIN_PLAN: 1.0})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not 0.0 < self.weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {self.weight}")

    def observe(self, plan: str, measured_s: float, predicted_s: float) -> None:
        """Fold one request's measured TTFT, against the uncorrected prediction of its plan, into the factor."""
        if measured_s <= 0 or predicted_s <= 0:
            return
        with self._lock:
            log_factor = math.log(self.factors[plan])
            log_factor += self.weight * (math.log(measured_s / predicted_s) - log_factor)
            self.factors[plan] = math.exp(log_factor)

    def factor(self, plan: str) -> float:
        """The current factor of `plan`."""
        return self.factors[plan]


@dataclass(slots=True)
class RequestPlanner:
    """Chooses each request's plan from the curves times their corrections, and learns from each served one."""

    costs: PrefillCosts
    correction: PlanCorrection = field(default_factory=PlanCorrection)

    def prices(self, mode: str, recompute_ratio: float) -> bool:
        """Whether the curves were measured for this mode and ratio."""
        return self.costs.prices(mode, recompute_ratio)

    def plan(self, num_tokens: int, missed_tokens: int) -> RequestPlan:
        """The plan predicted to reach the first token sooner."""
        factors = self.correction.factors
        return self.costs.choose(num_tokens, missed_tokens, factors[BLEND_PLAN], factors[PLAIN_PLAN])

    def observe(self, plan: RequestPlan, measured_ttft_s: float) -> None:
        """Correct the plan's curve by the TTFT its request measured."""
        self.correction.observe(plan.name, measured_ttft_s, plan.curve_ttft_s)
