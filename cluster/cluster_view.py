"""What the ingress asks the cluster: the ready workers, where chunks are cached, the shards' evictions."""
import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from ray.serve.handle import DeploymentHandle

from kvplane.ray.health import shard_health
from kvplane.ray.location_index import launch_location_index
from kvplane.ray.namespace import named_actors
from kvplane.ray.shard import SHARD_NAME_PREFIX
from scheduler.membership import Member, launch_membership
from workers.engines.base import StoredChunk
from workers.worker import Event, Job

Copies = dict[str, list[tuple[str, str]]]
"""key -> [(holder, tier)]: every known copy of each chunk."""


class ClusterView(Protocol):
    """The cluster state the gateway routes on."""

    async def members(self) -> list[Member]:
        """Workers that are up, with a loaded model."""

    async def copies(self, keys: list[str]) -> Copies:
        """Where each chunk is cached."""

    async def shard_evictions(self) -> dict[tuple[str, str], int]:
        """(shard, tier) -> chunks evicted so far."""

    async def drop_chunk(self, key: str) -> None:
        """Remove a chunk from every node shard."""


class WorkerClient(Protocol):
    """How the gateway reaches one chosen worker."""

    def stream(self, job: Job, worker_id: str) -> AsyncIterator[Event]:
        """Run a job on `worker_id`: text deltas, then Finished."""

    async def store_documents(self, documents: list[str], namespace: str, worker_id: str) -> list[StoredChunk]:
        """Compute and keep documents' chunk KV on `worker_id`."""


class RayClusterView:
    """ClusterView over the membership and location-index actors and the node shards."""

    def __init__(self) -> None:
        self._membership = launch_membership()
        self._index = launch_location_index()

    async def members(self) -> list[Member]:
        return await self._membership.members.remote()

    async def copies(self, keys: list[str]) -> Copies:
        found = await self._index.lookup.remote(keys)
        return {key: [(copy.holder, copy.tier) for copy in copies] for key, copies in found.items()}

    async def shard_evictions(self) -> dict[tuple[str, str], int]:
        evictions = {}
        for name, health in (await shard_health()).items():  # a hung shard times out: left out, not waited for
            evictions.update({(name, tier): int(events["evictions"]) for tier, events in health.events.items()
                              if "evictions" in events})
        return evictions

    async def drop_chunk(self, key: str) -> None:
        # Every shard, not only the key's home: a shard that joined since the chunk was written changed the homes.
        await asyncio.gather(*(shard.delete.remote(key) for shard in named_actors(SHARD_NAME_PREFIX).values()))


class ServeWorkers:
    """WorkerClient over the worker deployment's handle; the pinned request router honours `worker_id`."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self._handle = handle

    async def stream(self, job: Job, worker_id: str) -> AsyncIterator[Event]:
        response = self._handle.options(stream=True).stream.remote(job, worker_id=worker_id)
        finished = False
        try:
            async for event in response:
                yield event
            finished = True
        finally:
            if not finished:  # the client went away (or the stream failed): the worker stops generating for it
                response.cancel()

    async def store_documents(self, documents: list[str], namespace: str, worker_id: str) -> list[StoredChunk]:
        return await self._handle.store_documents.remote(documents, namespace, worker_id=worker_id)
