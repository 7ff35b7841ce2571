"""The Serve app with a chosen routing policy, for benchmarks that compare cache affinity with cache-blind routing."""
from typing import Any

from ray import serve
from ray.serve import Application

from cluster.app import Ingress, WorkerDeployment, worker_options
from cluster.config import config_from_dict, config_to_dict
from scheduler.simulation.routers import ROUTING_POLICIES, make_router


class PolicyIngress(Ingress.func_or_class):  # type: ignore[name-defined, misc]
    """The app's own ingress whose gateway routes by `policy` instead of by cache affinity alone."""

    async def __init__(self, workers: Any, config: dict[str, Any], policy: str, seed: int) -> None:
        await super().__init__(workers, config)
        self.gateway.router = make_router(policy, self.gateway.config.router, seed)


def build_policy_app(args: dict[str, Any], policy: str, seed: int = 0) -> Application:
    """`cluster.app.build_app` with the gateway's router replaced by `policy` (affinity, power_of_two, round_robin)."""
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"policy must be one of {ROUTING_POLICIES}, got {policy!r}")
    config = config_from_dict(args)
    plain = config_to_dict(config)
    workers = WorkerDeployment.options(**worker_options(config)).bind(plain)
    ingress = serve.deployment(PolicyIngress, name="Ingress", ray_actor_options={"num_cpus": 0})
    return ingress.options(max_ongoing_requests=config.server.max_ongoing_requests).bind(workers, plain, policy, seed)
