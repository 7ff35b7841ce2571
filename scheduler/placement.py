"""From the location index's holders (workers and node shards) to the tier each worker reaches a chunk in."""
from collections.abc import Iterable, Mapping

from scheduler.scoring import Locations
from scheduler.weights import RouterWeights

DEVICE, REMOTE = "device", "remote"


def worker_locations(
    copies: Mapping[str, Iterable[tuple[str, str]]],
    worker_nodes: Mapping[str, str],
    shard_nodes: Mapping[str, str],
    weights: RouterWeights,
) -> Locations:
    """key -> {worker: best tier}; `copies` is key -> [(holder, tier)] with holders being workers or shards.

    A worker reaches its own copies in their tier, a shard on its node in the shard's tier (ram, ssd) and a
    shard on another node as `remote`; holders that are neither live workers nor known shards are ignored.
    """
    locations: dict[str, dict[str, str]] = {}
    for key, holders in copies.items():
        best: dict[str, str] = {}
        for holder, tier in holders:
            if holder in worker_nodes:
                reach = {holder: tier}
            elif holder in shard_nodes:
                node = shard_nodes[holder]
                reach = {
                    worker: tier if worker_node == node else REMOTE for worker, worker_node in worker_nodes.items()
                }
            else:
                continue
            for worker, reached in reach.items():
                if worker not in best or weights.tier_weight(reached) > weights.tier_weight(best[worker]):
                    best[worker] = reached
        if best:
            locations[key] = best
    return locations
