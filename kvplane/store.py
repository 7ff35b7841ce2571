"""TieredStore: the chunk-KV cache over ordered tiers, fastest first. Plain class, no Ray."""
import copy
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

import torch

from kvplane.buffers import host_view
from kvplane.codec import HEADER_PROBE_BYTES, ChunkHeader, CodecError, decode, decode_layer, encode, header_span
from kvplane.codec import parse_header, read_header
from kvplane.entry import KVEntry
from kvplane.keys import KEY_SEPARATOR, fingerprint_tag
from kvplane.layer_stream import ChunkLost, LayerStream
from kvplane.policy import EvictionPolicy, make_policy
from kvplane.stats import StoreStats, TierStats
from kvplane.tier import Tier, TierError
from kvplane.tier_spec import TierSpec, open_tier
from kvplane.writeback import WriteBack

PlacementListener = Callable[[str, str, int], None]
"""Told (key, tier name, bytes) when a tier gains a key, and (key, tier name, 0) when it loses one."""

_log = logging.getLogger(__name__)


def _ignore_placement(key: str, tier: str, nbytes: int) -> None:
    """Default listener: nobody is watching placements."""


class TieredStore:
    """Chunks by content key over tiers, fastest first.

    Writes land in the top tier now and in every lower tier in the background (so the slow, durable
    tiers hold everything). Each tier's policy decides what it keeps; an evicted key moves one tier
    down unless that tier already holds it; a hit below the top is promoted upward in the background.
    Corrupt or truncated entries are deleted and read as misses.
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        policies: str | Sequence[str] = "tinylfu",
        write_back_threads: int = 1,
        listener: PlacementListener | None = None,
    ) -> None:
        names = [policies] * len(tiers) if isinstance(policies, str) else list(policies)
        if not tiers or len(names) != len(tiers):
            raise ValueError("need at least one tier, and one policy per tier")
        if len({tier.name for tier in tiers}) != len(tiers):
            raise ValueError("tier names must be unique")
        self._tiers = list(tiers)
        self._policies: list[EvictionPolicy] = [make_policy(n, t.capacity_bytes) for n, t in zip(names, tiers)]
        self._stats = StoreStats({tier.name: TierStats() for tier in tiers})
        self._listener = listener or _ignore_placement
        self._lock = threading.RLock()
        self._writer = WriteBack(write_back_threads, on_error=self._count_write_back_error)

    @classmethod
    def from_specs(
        cls, specs: Sequence[TierSpec], write_back_threads: int = 1, listener: PlacementListener | None = None
    ) -> "TieredStore":
        """A store over the tiers the specs describe, each with its spec's policy."""
        return cls([open_tier(spec) for spec in specs], [spec.policy for spec in specs], write_back_threads, listener)

    @property
    def tier_names(self) -> list[str]:
        """Tier names, fastest first."""
        return [tier.name for tier in self._tiers]

    def put(self, entry: KVEntry, priority: float = 1.0) -> None:
        """Store a chunk; `priority` (>= 0, default 1) scales how hard frequency-aware tiers keep it."""
        self.put_blob(entry.key, encode(entry, priority))

    def put_blob(self, key: str, blob: torch.Tensor) -> None:
        """Store an encoded chunk: the top tier now, every lower tier in the background. Keeps `blob`."""
        header = read_header(blob)
        if header.key != key:
            raise ValueError(f"blob holds {header.key}, not {key}")
        self._place(0, key, blob, header.priority)
        if len(self._tiers) > 1:
            self._writer.submit(self._write_back, key, blob, header.priority)

    def get(self, key: str) -> KVEntry | None:
        """The whole chunk from the fastest tier holding it, or None. The tensor is the caller's own."""
        for level in range(len(self._tiers)):
            blob = self._fetch(level, key)
            if blob is None:
                continue
            try:
                header, kv = decode(blob, key)
            except CodecError as err:
                self._discard(level, key, err)
                continue
            self._count_hit(level, key, blob.numel())
            if level > 0:
                # `kv` views `blob` and belongs to the caller now; promotion gets its own copy.
                self._writer.submit(self._promote, key, blob.clone(), header.priority, level)
            return KVEntry(key, kv, header.token_ids, header.fingerprint)
        self._count_miss(key)
        return None

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Raw encoded bytes `[start, end)` from the fastest tier holding `key` (what a shard serves).

        A read from offset 0 is a lookup: it counts as hit or miss and promotes in the background.
        Checksums are left to the reader, who decodes.
        """
        for level in range(len(self._tiers)):
            data = self._fetch(level, key, start, end)
            if data is None:
                continue
            if start == 0:
                self._count_hit(level, key, data.numel())
                if level > 0:
                    self._writer.submit(self._promote_from, key, level)
            else:
                with self._lock:
                    self._stats.tiers[self._tiers[level].name].bytes_read += data.numel()
            return data
        if start == 0:
            self._count_miss(key)
        return None

    def read_layers(self, key: str) -> LayerStream | None:
        """The chunk layer by layer (`[2, T, H_kv, D]` each) from the fastest tier holding it, or None.

        Each layer is one byte-range read, checked against its checksum before it is yielded. If a
        layer is lost mid-stream the stream continues from a lower tier; iteration raises ChunkLost
        only when no tier can supply it.
        """
        found = self._find_header(key, 0, None)
        if found is None:
            self._count_miss(key)
            return None
        level, header, head = found
        self._count_hit(level, key, header.total_bytes)
        return LayerStream(header, self._tiers[level].name, self._stream(key, level, header, head))

    def locate(self, key: str) -> str | None:
        """Name of the fastest tier holding `key`, or None."""
        for tier in self._tiers:
            try:
                if tier.contains(key):
                    return tier.name
            except TierError as err:
                self._count_error(tier, err)
        return None

    def contains(self, key: str) -> bool:
        """Whether any tier holds `key`."""
        return self.locate(key) is not None

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Keys starting with `prefix` in any tier, each once, with its blob size."""
        seen: set[str] = set()
        for tier in self._tiers:
            try:
                found = list(tier.scan(prefix))
            except TierError as err:
                self._count_error(tier, err)
                continue
            for key, nbytes in found:
                if key not in seen:
                    seen.add(key)
                    yield key, nbytes

    def delete(self, key: str) -> None:
        """Remove `key` from every tier (after pending background writes, so none re-adds it)."""
        self._writer.flush()
        for level in range(len(self._tiers)):
            self._forget(level, key)

    def invalidate(self, fingerprint: str) -> int:
        """Remove every chunk made under `fingerprint` from every tier; returns how many keys went."""
        self._writer.flush()
        prefix = fingerprint_tag(fingerprint) + KEY_SEPARATOR
        removed: set[str] = set()
        for level, tier in enumerate(self._tiers):
            try:
                keys = [key for key, _ in tier.scan(prefix)]
            except TierError as err:
                self._count_error(tier, err)
                continue
            for key in keys:
                self._forget(level, key)
            removed.update(keys)
        return len(removed)

    def recover(self) -> int:
        """Adopt chunks already in the tiers (an SSD after a restart) into the policies; returns how many."""
        adopted = 0
        for level, tier in enumerate(self._tiers):
            for key, nbytes in tier.scan():
                with self._lock:
                    victims = self._policies[level].admit(key, nbytes, 1.0)
                for victim in victims:
                    self._writer.submit(self._demote, level, victim)
                adopted += 1
        return adopted

    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        with self._lock:
            return copy.deepcopy(self._stats)

    def flush(self) -> None:
        """Wait for background write-backs, promotions and demotions."""
        self._writer.flush()

    def close(self) -> None:
        """Finish background work and stop its threads."""
        self._writer.close()

    def __enter__(self) -> "TieredStore":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _place(self, level: int, key: str, blob: torch.Tensor, priority: float) -> bool:
        """Offer `blob` to one tier through its policy; True if the tier holds it afterwards."""
        tier, policy, stats = self._level(level)
        nbytes = blob.numel()
        with self._lock:
            if policy.contains(key):
                return True
            victims = policy.admit(key, nbytes, priority)
            admitted = key not in victims
            stats.rejections += not admitted
            stats.evictions += len(victims) - (not admitted)
        if admitted:
            try:
                tier.put(key, blob)
            except TierError as err:
                with self._lock:
                    policy.remove(key)
                self._count_error(tier, err)
                admitted = False
            else:
                with self._lock:
                    stats.bytes_written += nbytes
                self._listener(key, tier.name, nbytes)
        for victim in victims:
            if victim != key:
                self._writer.submit(self._demote, level, victim)
        return admitted

    def _write_back(self, key: str, blob: torch.Tensor, priority: float) -> None:
        for level in range(1, len(self._tiers)):
            self._place(level, key, blob, priority)

    def _promote(self, key: str, blob: torch.Tensor, priority: float, from_level: int) -> None:
        for level in range(from_level):
            if self._place(level, key, blob, priority):
                with self._lock:
                    self._stats.tiers[self._tiers[level].name].promotions += 1

    def _promote_from(self, key: str, level: int) -> None:
        blob = self._fetch(level, key)
        priority = self._verified_priority(level, key, blob)
        if blob is not None and priority is not None:
            self._promote(key, blob, priority, level)

    def _demote(self, level: int, key: str) -> None:
        """Move an evicted key one tier down (unless that tier holds it already), then drop it here."""
        below = level + 1
        if below < len(self._tiers) and not self._holds(below, key):
            blob = self._fetch(level, key)
            priority = self._verified_priority(level, key, blob)
            if blob is not None and priority is not None:
                self._place_below(level, key, blob, priority)
        with self._lock:
            readmitted = self._policies[level].contains(key)
        if not readmitted:
            self._drop(level, key)

    def _place_below(self, level: int, key: str, blob: torch.Tensor, priority: float) -> None:
        """Place in the nearest lower tier whose policy admits the key."""
        for lower in range(level + 1, len(self._tiers)):
            if self._place(lower, key, blob, priority):
                with self._lock:
                    self._stats.tiers[self._tiers[lower].name].demotions += 1
                return

    def _stream(self, key: str, level: int, header: ChunkHeader, head: torch.Tensor) -> Iterator[torch.Tensor]:
        # Promotion needs a copy made before the caller sees (and may overwrite) each layer.
        staging = self._staging(header, head) if level > 0 else None
        source = header
        for index, offset in enumerate(header.layer_offsets):
            layer = self._read_layer(level, key, header, source, index)
            while layer is None:
                found = self._find_header(key, level + 1, header)
                if found is None:
                    raise ChunkLost(f"{key}: layer {index} is gone from every tier")
                level, source, _ = found
                layer = self._read_layer(level, key, header, source, index)
            if staging is not None:
                staging[offset : offset + header.layer_nbytes].copy_(layer.reshape(-1).view(torch.uint8))
            yield layer
        if staging is not None:
            self._writer.submit(self._promote, key, staging, header.priority, level)

    def _read_layer(self, level: int, key: str, header: ChunkHeader, source: ChunkHeader, index: int) -> torch.Tensor | None:
        offset = source.layer_offsets[index]
        data = self._fetch(level, key, offset, offset + header.layer_nbytes)
        if data is None:
            return None
        try:
            return decode_layer(header, index, data)
        except CodecError as err:
            self._discard(level, key, err)
            return None

    def _find_header(
        self, key: str, first_level: int, like: ChunkHeader | None
    ) -> tuple[int, ChunkHeader, torch.Tensor] | None:
        """First tier from `first_level` down with a sound header for `key` (with `like`'s layers, if given)."""
        for level in range(first_level, len(self._tiers)):
            head = self._fetch(level, key, 0, HEADER_PROBE_BYTES)
            if head is None:
                continue
            try:
                span = header_span(host_view(head))
                if span > head.numel() and head.numel() == HEADER_PROBE_BYTES:
                    rest = self._fetch(level, key, head.numel(), span)
                    head = torch.cat([head, rest]) if rest is not None else head
                header = parse_header(host_view(head))
                if header.key != key:
                    raise CodecError(f"header names {header.key}, not {key}")
            except CodecError as err:
                self._discard(level, key, err)
                continue
            if like is None or header.layer_checksums == like.layer_checksums:
                return level, header, head
        return None

    def _staging(self, header: ChunkHeader, head: torch.Tensor) -> torch.Tensor:
        staging = torch.zeros(header.total_bytes, dtype=torch.uint8)
        prefix_bytes = min(head.numel(), header.data_offset)
        staging[:prefix_bytes].copy_(head[:prefix_bytes])
        return staging

    def _verified_priority(self, level: int, key: str, blob: torch.Tensor | None) -> float | None:
        if blob is None:
            return None
        try:
            return decode(blob, key)[0].priority
        except CodecError as err:
            self._discard(level, key, err)
            return None

    def _holds(self, level: int, key: str) -> bool:
        tier, policy, _ = self._level(level)
        with self._lock:
            if policy.contains(key):
                return True
        try:
            return tier.contains(key)
        except TierError as err:
            self._count_error(tier, err)
            return False

    def _fetch(self, level: int, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        tier = self._tiers[level]
        try:
            return tier.read(key, start, end)
        except TierError as err:
            self._count_error(tier, err)
            return None

    def _forget(self, level: int, key: str) -> None:
        with self._lock:
            self._policies[level].remove(key)
        self._drop(level, key)

    def _discard(self, level: int, key: str, err: CodecError) -> None:
        _log.warning("kvplane: dropping bad entry %s from tier %s: %s", key, self._tiers[level].name, err)
        with self._lock:
            self._stats.tiers[self._tiers[level].name].corruptions += 1
        self._forget(level, key)

    def _drop(self, level: int, key: str) -> None:
        tier = self._tiers[level]
        try:
            tier.delete(key)
        except TierError as err:
            self._count_error(tier, err)
            return
        self._listener(key, tier.name, 0)

    def _count_hit(self, level: int, key: str, nbytes: int) -> None:
        with self._lock:
            for upper in range(level):
                self._stats.tiers[self._tiers[upper].name].misses += 1
            stats = self._stats.tiers[self._tiers[level].name]
            stats.hits += 1
            stats.bytes_read += nbytes
            for upper in range(level + 1):
                self._policies[upper].touch(key)

    def _count_miss(self, key: str) -> None:
        with self._lock:
            for tier, policy in zip(self._tiers, self._policies):
                self._stats.tiers[tier.name].misses += 1
                policy.touch(key)

    def _count_error(self, tier: Tier, err: TierError) -> None:
        _log.warning("kvplane: tier %s failed: %s", tier.name, err)
        with self._lock:
            self._stats.tiers[tier.name].errors += 1

    def _count_write_back_error(self, err: BaseException) -> None:
        with self._lock:
            self._stats.write_back_errors += 1

    def _level(self, level: int) -> tuple[Tier, EvictionPolicy, TierStats]:
        tier = self._tiers[level]
        return tier, self._policies[level], self._stats.tiers[tier.name]
