"""Chunk variants: a chunk's KV computed after different preceding chunks, and the one that best fits a request.

Cache-Craft (Agarwal et al., SIGMOD'25) keeps a few versions of a chunk's KV, each computed after the chunks
that preceded it in some earlier request, and serves a request with the version whose preceding chunks best
overlap the request's: its KV already carries most of the cross-chunk attention, so less must be recomputed.
The fit here is the overlap of the two sets of preceding chunks (shared over all, so chunks the variant saw
but the request lacks count against it) less a penalty for the shared ones appearing in another order.
Variants live in the chunk store like any chunk (their context is part of the key), so they count against
its capacity; this index only says which exist, bounded per chunk, and which contexts each chunk was seen in:
a variant is made for a context only once it recurs, since one seen once mostly never is again.
"""
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvplane.checks import check, check_count


def overlap_score(request_before: Sequence[str], variant_before: Sequence[str], order_weight: float = 0.5) -> float:
    """How well a variant's preceding chunks match a request's, in [0, 1] (1: the same chunks in the same order).

    Shared chunks over all chunks on either side, times 1 - order_weight x the share of pairs of shared
    chunks whose order differs between the two.
    """
    shared = [key for key in request_before if key in set(variant_before)]
    union = len(set(request_before) | set(variant_before))
    if not shared:
        return 0.0
    rank = {key: index for index, key in enumerate(variant_before)}
    pairs = len(shared) * (len(shared) - 1) // 2
    swapped = sum(rank[a] > rank[b] for i, a in enumerate(shared) for b in shared[i + 1 :])
    return len(shared) / union * (1.0 - order_weight * (swapped / pairs if pairs else 0.0))


@dataclass(slots=True)
class Variant:
    """One version of a chunk's KV: the keys of the chunks it was computed after, and their token ids."""

    before: tuple[str, ...]
    context_ids: tuple[int, ...]  # prompt prefix + preceding chunks: the context its store key names
    uses: int = 0


@dataclass(frozen=True, slots=True)
class VariantRules:
    """When a variant is kept and when it is served."""

    max_per_chunk: int = 2  # beyond it, the least used variant of the chunk is dropped
    min_score: float = 0.5  # a variant fitting a request less than this is not served
    create_above: float = 0.3  # a variant is made only for a chunk whose measured impact here is at least this
    order_weight: float = 0.5
    # A variant is made once this many requests (this one included) put the chunk after preceding chunks that fit
    # each other at min_score: a context seen once is rarely seen again (bench/variant_rules.py).
    create_after_sightings: int = 2
    sightings_per_chunk: int = 8  # the latest contexts remembered per chunk
    max_tracked_chunks: int = 65536  # chunks whose sightings are remembered (least recently seen forgotten first)

    def __post_init__(self) -> None:
        for name in ("max_per_chunk", "create_after_sightings", "sightings_per_chunk", "max_tracked_chunks"):
            check_count(name, getattr(self, name), 1)
        for name in ("min_score", "create_above", "order_weight"):
            check(0.0 <= getattr(self, name) <= 1.0, name, "in [0, 1]", getattr(self, name))


class VariantIndex:
    """Which variants exist per chunk key (bounded per chunk); thread-safe."""

    def __init__(self, rules: VariantRules = VariantRules()) -> None:
        self.rules = rules
        self._variants: dict[str, list[Variant]] = {}
        self._sightings: OrderedDict[str, deque[tuple[str, ...]]] = OrderedDict()  # chunk key -> preceding chunks
        self._lock = threading.Lock()

    def best(self, chunk_key: str, request_before: Sequence[str]) -> tuple[Variant, float] | None:
        """The best-fitting variant for a request's preceding chunks and its score, if any fits well enough."""
        with self._lock:
            scored = [
                (overlap_score(request_before, v.before, self.rules.order_weight), v)
                for v in self._variants.get(chunk_key, [])
            ]
            if not scored:
                return None
            score, variant = max(scored, key=lambda pair: pair[0])
            if score < self.rules.min_score:
                return None
            variant.uses += 1
            return variant, score

    def worth_creating(self, chunk_key: str, request_before: Sequence[str], impact: float) -> bool:
        """A chunk the context reaches strongly, after preceding chunks seen before that no variant fits yet.

        Every call with preceding chunks counts as a sighting of them, whatever the answer.
        """
        if not request_before:
            return False
        rules = self.rules
        with self._lock:
            seen = self._seen(chunk_key)
            fits = sum(overlap_score(request_before, before, rules.order_weight) >= rules.min_score for before in seen)
            seen.append(tuple(request_before))
            if impact < rules.create_above or fits + 1 < rules.create_after_sightings:
                return False
            known = self._variants.get(chunk_key, [])
            return all(overlap_score(request_before, v.before, rules.order_weight) < 1.0 for v in known)

    def add(self, chunk_key: str, variant: Variant) -> Variant | None:
        """Record a stored variant; returns the one dropped to stay within the bound (to delete from the store)."""
        with self._lock:
            variants = self._variants.setdefault(chunk_key, [])
            variants.append(variant)
            if len(variants) <= self.rules.max_per_chunk:
                return None
            dropped = min(variants[:-1], key=lambda v: v.uses)  # the newcomer has had no chance to be used
            variants.remove(dropped)
            return dropped

    def _seen(self, chunk_key: str) -> deque[tuple[str, ...]]:
        """The chunk's remembered contexts, marked most recently seen; past the bound the least recent is forgotten."""
        seen = self._sightings.get(chunk_key)
        if seen is None:
            seen = self._sightings[chunk_key] = deque(maxlen=self.rules.sightings_per_chunk)
            if len(self._sightings) > self.rules.max_tracked_chunks:
                self._sightings.popitem(last=False)
        self._sightings.move_to_end(chunk_key)
        return seen

    def count(self, chunk_key: str) -> int:
        """How many variants the chunk has."""
        with self._lock:
            return len(self._variants.get(chunk_key, []))


def chunk_keys(store: Any, chunk_ids: Sequence[list[int]], context_ids: list[int], namespace: str) -> list[str]:
    """The store keys of chunks' base KV (computed after `context_ids`), in order."""
    return [store.key(ids, context_ids, namespace) for ids in chunk_ids]
