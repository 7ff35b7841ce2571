"""A Ray Serve request router that sends each request to the worker replica the gateway chose."""
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica


class PinnedRequestRouter(RequestRouter):
    """Honours the `worker_id` keyword of a call; any replica when it is absent or that replica is gone."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        target = None if pending_request is None else pending_request.kwargs.get("worker_id")
        pinned = [replica for replica in candidate_replicas if replica.replica_id.unique_id == target]
        return [pinned or candidate_replicas]
