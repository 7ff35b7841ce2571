"""The Ray namespace of blendserve's named actors, so every job and replica of a cluster finds the same ones."""
import ray
from ray.actor import ActorHandle

RAY_NAMESPACE = "blendserve"


def named_actors(prefix: str) -> dict[str, ActorHandle]:
    """Live actors in RAY_NAMESPACE whose name starts with `prefix`, by name."""
    found = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == RAY_NAMESPACE and entry["name"].startswith(prefix):
            try:
                found[entry["name"]] = ray.get_actor(entry["name"], namespace=RAY_NAMESPACE)
            except ValueError:  # died between listing and lookup
                continue
    return found
