"""The Ray namespace of blendserve's named actors, so every job and replica of a cluster finds the same ones."""
import warnings

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


def was_restarted() -> bool:
    """Whether this process is a Ray actor that Ray brought back after it died (False outside an actor)."""
    if not ray.is_initialized():  # asking the runtime context would start a Ray
        return False
    try:
        with warnings.catch_warnings():  # Ray's own property reads a deprecated one of its own
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # not inside an actor: a plain object in tests or tools
        return False
