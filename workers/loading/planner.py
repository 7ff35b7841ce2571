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
    request served under its plan, by at most `max_step` times a request: one stalled request must not
    decide the plan of the next hundred. A plan not taken is not measured, so its factor would keep whatever
    last made it lose; instead it goes back toward the curve measured at start by `forget` (in log terms) each
    time the other plan is measured, and is tried again once that makes it the faster.
    """

    weight: float = 0.2
    max_step: float = 2.0
    forget: float = 0.05
    factors: dict[str, float] = field(default_factory=lambda: {BLEND_PLAN: 1.0, PLAIN_PLAN: 1.0})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not 0.0 < self.weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {self.weight}")
        if self.max_step <= 1.0:
            raise ValueError(f"max_step must be > 1, got {self.max_step}")
        if not 0.0 <= self.forget < 1.0:
            raise ValueError(f"forget must be in [0, 1), got {self.forget}")

    def observe(self, plan: str, measured_s: float, predicted_s: float) -> None:
        """Fold one request's measured TTFT, against the uncorrected prediction of its plan, into the factor."""
        if measured_s <= 0 or predicted_s <= 0:
            return
        ratio = min(max(measured_s / predicted_s, 1.0 / self.max_step), self.max_step)
        with self._lock:
            for name, factor in self.factors.items():
                log_factor = math.log(factor)
                if name == plan:
                    log_factor += self.weight * (math.log(ratio) - log_factor)
                else:
                    log_factor *= 1.0 - self.forget
                self.factors[name] = math.exp(log_factor)

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
