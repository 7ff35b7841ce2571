"""TieredStore: the chunk-KV cache over ordered tiers, fastest first. Plain class, no Ray."""
import copy
import threading
from collections.abc import Collection, Iterator, Sequence

import torch

from kvplane.buffers import clone_bytes, host_view
from kvplane.codec import ChunkHeader, CodecError, decode, encode, parse_header, read_header
from kvplane.compression.registry import NONE, compression
from kvplane.compression.verdicts import CompressionGate
from kvplane.entry import KVEntry
from kvplane.eviction.policy import EvictionPolicy, make_policy
from kvplane.eviction.slot_share import SlotSharePolicy
from kvplane.keys import KEY_SEPARATOR, fingerprint_tag
from kvplane.layer_stream import LayerStream, find_header, stream_layers
from kvplane.level import Level, PlacementListener
from kvplane.stats import StoreStats
from kvplane.tiers.spec import TierSpec, open_tier
from kvplane.tiers.tier import Tier
from kvplane.writeback import MAX_PENDING_BYTES, WriteBack

STALE_TEMPORARY_S = 3600.0  # a temporary file this old belongs to a write no process will finish


def _ignore_placement(key: str, tier: str, nbytes: int) -> None:
    """Default listener: nobody is watching placements."""


def _policy(name: str, capacity_bytes: int, tenant_share: float, capped: bool) -> EvictionPolicy:
    """The registry's policy for a tier; a capped tier's is wrapped so that its limit can fall below capacity."""
    policy = make_policy(name, capacity_bytes, tenant_share)
    return SlotSharePolicy(policy, capacity_bytes) if capped else policy


class TieredStore:
    """Chunks by content key over tiers, fastest first; thread-safe."""

    # Writes land in the top tier now and in every lower tier in the background, so the slow, durable
    # tiers hold everything. Each tier's policy decides what it keeps; an evicted key moves one tier
    # down unless that tier already holds it; a hit below the top is promoted upward in the
    # background. Corrupt or truncated entries are deleted and read as misses.

    def __init__(
        self,
        tiers: Sequence[Tier],
        policies: str | Sequence[str] = "tinylfu",
        *,
        write_back_threads: int = 1,
        listener: PlacementListener | None = None,
        tenant_share: float = 1.0,
        max_pending_write_bytes: int = MAX_PENDING_BYTES,
        capped_tiers: Collection[str] = (),
        compressions: Sequence[str] | None = None,
        gate: CompressionGate | None = None,
    ) -> None:
        names = [policies] * len(tiers) if isinstance(policies, str) else list(policies)
        if not tiers or len(names) != len(tiers):
            raise ValueError("need at least one tier, and one policy per tier")
        compressions = [NONE] * len(tiers) if compressions is None else list(compressions)
        if len(compressions) != len(tiers):
            raise ValueError("need one compression per tier")
        if len({tier.name for tier in tiers}) != len(tiers):
            raise ValueError("tier names must be unique")
        unknown = set(capped_tiers) - {tier.name for tier in tiers}
        if unknown:
            raise ValueError(f"capped_tiers names no tier of this store: {sorted(unknown)}")
        report = listener or _ignore_placement
        self._levels = [
            Level(tier, _policy(name, tier.capacity_bytes, tenant_share, tier.name in capped_tiers), report, how, gate)
            for name, tier, how in zip(names, tiers, compressions)
        ]
        self._write_back_errors = 0
        self._errors_lock = threading.Lock()
        self._writer = WriteBack(
            write_back_threads, on_error=self._count_write_back_error, max_pending_bytes=max_pending_write_bytes
        )

    @classmethod
    def from_specs(
        cls,
        specs: Sequence[TierSpec],
        *,
        write_back_threads: int = 1,
        listener: PlacementListener | None = None,
        tenant_share: float = 1.0,
        capped_tiers: Collection[str] = (),
        gate: CompressionGate | None = None,
    ) -> "TieredStore":
        """A store over the tiers the specs describe, each with its spec's policy."""
        tiers = [open_tier(spec) for spec in specs]
        policies = [spec.policy for spec in specs]
        return cls(
            tiers,
            policies,
            write_back_threads=write_back_threads,
            listener=listener,
            tenant_share=tenant_share,
            capped_tiers=capped_tiers,
            compressions=[spec.compression for spec in specs],
            gate=gate,
        )

    @property
    def tier_names(self) -> list[str]:
        """Tier names, fastest first."""
        return [level.name for level in self._levels]

    def compressions(self) -> dict[str, str]:
        """Each tier's compression of the entries written to it uncompressed."""
        return {level.name: level.compression for level in self._levels}

    def set_compression(self, tier: str, compression_name: str) -> None:
        """Compress what `tier` is written from now on with `compression_name` (entries held stay as they are)."""
        level = next((level for level in self._levels if level.name == tier), None)
        if level is None:
            raise ValueError(f"no tier {tier!r} in this store; tiers: {self.tier_names}")
        level.compression = compression(compression_name).name

    def put(self, entry: KVEntry, priority: float = 1.0) -> None:
        """Store a chunk; `priority` (>= 0, default 1) scales how hard frequency-aware tiers keep it."""
        self.put_blob(entry.key, encode(entry, priority))

    def put_many(self, entries: Sequence[KVEntry], priority: float = 1.0) -> None:
        """Store several chunks; a top tier over the node shards takes them in one call per shard."""
        self.put_blobs([(entry.key, encode(entry, priority)) for entry in entries])

    def put_blob(self, key: str, blob: torch.Tensor) -> None:
        """Store an encoded chunk: the top tier now, every lower tier in the background. Keeps `blob`."""
        self.put_blobs([(key, blob)])

    def put_blobs(self, items: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Store encoded chunks `(key, blob)`: the top tier now, every lower tier in the background. Keeps them."""
        priorities = []
        for key, blob in items:
            header = read_header(blob)
            if header.key != key:
                raise ValueError(f"blob holds {header.key}, not {key}")
            priorities.append(header.priority)
        placed = self._levels[0].place_many([(key, blob, p) for (key, blob), p in zip(items, priorities)])
        for _, victims in placed:
            for victim in victims:
                self._evict(0, victim)
        if len(self._levels) > 1:
            for (key, blob), priority in zip(items, priorities):
                # Refused when the lower tiers lag too far behind: they miss this chunk, memory stays bounded.
                self._writer.submit(self._write_back, key, blob, priority, nbytes=blob.numel())

    def get(self, key: str) -> KVEntry | None:
        """The whole chunk from the fastest tier holding it, or None. The tensor is the caller's own."""
        for index, level in enumerate(self._levels):
            blob = level.fetch(key)
            if blob is None:
                continue
            try:
                header, kv = decode(blob, key)
            except CodecError as err:
                level.discard(key, err)
                continue
            self._count_hit(index, key, blob.numel())
            if index > 0:
                # `kv` views `blob` and belongs to the caller now; promotion gets its own copy.
                copy = clone_bytes(blob)
                self._writer.submit(self._promote, key, copy, header.priority, index, nbytes=copy.numel())
            return KVEntry(key, kv, header.token_ids, header.fingerprint, level.hit_label())
        self._count_miss(key)
        return None

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Raw encoded bytes `[start, end)` from the fastest tier holding `key` (what a shard serves)."""
        # A read from offset 0 is a lookup: it counts as hit or miss and promotes in the background.
        # Checksums are left to the reader, who decodes.
        for index, level in enumerate(self._levels):
            data = level.fetch(key, start, end)
            if data is None:
                continue
            if start > 0:
                with level.lock:
                    level.stats.bytes_read += data.numel()
                return data
            self._count_hit(index, key, data.numel())
            if index > 0:
                self._writer.submit(self._promote_from, key, index)
            return data
        if start == 0:
            self._count_miss(key)
        return None

    def read_layers(
        self, key: str, tier: str | None = None, decode_device: torch.device | None = None
    ) -> LayerStream | None:
        """The chunk layer by layer (`[2, T, H_kv, D]` each) from `tier`, else the fastest tier holding it, or None.

        `decode_device`: where compressed layers are decoded (their bytes moved there first); None: where read.
        """
        # Each layer is one byte-range read, checked before it is yielded. A layer lost mid-stream is
        # read from a lower tier; iteration raises ChunkLost only when no tier has it. A chosen tier
        # that no longer holds the chunk falls through to the tiers below it, then to those above.
        first = self._level_index(key, tier)
        found = find_header(self._levels, key, first) or (find_header(self._levels, key, 0) if first else None)
        if found is None:
            self._count_miss(key)
            return None
        index, header, head = found
        return self._open_stream(key, index, header, head, self._levels[index].stream_label(key), decode_device)

    def read_layers_many(
        self, keys: Sequence[str], decode_device: torch.device | None = None
    ) -> list[LayerStream | None]:
        """`read_layers` of each key from the fastest tier holding it (None: a miss).

        A tier whose reads are round trips (the node shards) is asked once for every key still unfound, and
        answers with whole blobs: header, layers and the serving tier come back in that one call, where one
        key at a time costs three (its header, its serving tier, its layers).
        """
        streams: list[LayerStream | None] = [None] * len(keys)
        pending = list(range(len(keys)))
        for index, level in enumerate(self._levels):
            if not pending:
                break
            if level.reads_whole:
                hits = level.fetch_whole_many([keys[i] for i in pending])
                for i, hit in zip(pending, hits):
                    if hit is not None:
                        streams[i] = self._whole_stream(keys[i], index, hit[0], hit[1], decode_device)
            else:
                for i in pending:
                    found = find_header(self._levels[: index + 1], keys[i], index)
                    if found is not None:
                        streams[i] = self._open_stream(keys[i], *found, level.stream_label(keys[i]), decode_device)
            pending = [i for i in pending if streams[i] is None]
        for i in pending:
            self._count_miss(keys[i])
        return streams

    def _whole_stream(
        self, key: str, index: int, blob: torch.Tensor, label: str, decode_device: torch.device | None
    ) -> LayerStream | None:
        """The stream of a blob read whole from level `index`; None (the copy discarded) if its header is damaged."""
        try:
            header = parse_header(host_view(blob))
            if header.key != key:
                raise CodecError(f"header names {header.key}, not {key}")
        except CodecError as err:
            self._levels[index].discard(key, err)
            return None
        return self._open_stream(key, index, header, blob, label, decode_device, head_is_whole=True)

    def _open_stream(  # noqa: PLR0913 - the found chunk's parts, as find_header or a whole read gives them
        self, key: str, index: int, header: ChunkHeader, head: torch.Tensor, label: str,
        decode_device: torch.device | None, head_is_whole: bool = False,
    ) -> LayerStream:
        """A found chunk counted as a hit and streamed from level `index`; promoted at the end if from below."""
        self._count_hit(index, key, header.total_bytes)

        def promote(blob: torch.Tensor, from_index: int) -> None:
            self._writer.submit(self._promote, key, blob, header.priority, from_index, nbytes=blob.numel())

        layers = stream_layers(self._levels, key, index, header, head, promote, decode_device, head_is_whole)
        return LayerStream(header, label, layers)

    def _level_index(self, key: str, tier: str | None) -> int:
        """Index of the level named `tier` (or whose inner tier of that name holds `key`); 0 for None or unknown."""
        if tier is None:
            return 0
        named = next((index for index, level in enumerate(self._levels) if level.name == tier), None)
        if named is not None:
            return named
        return next((index for index, level in enumerate(self._levels) if level.label_of(key) == tier), 0)

    def note_impact(self, key: str, impact: float) -> None:
        """A chunk's context impact, for the tiers whose policy weighs it (impact_tinylfu); others ignore it."""
        for level in self._levels:
            with level.lock:
                level.policy.note_impact(key, impact)

    def cap_tier(self, tier: str, limit_bytes: int) -> int:
        """Hold at most `limit_bytes` in `tier` (one of capped_tiers) from now on; returns how many entries went."""
        index = next((index for index, level in enumerate(self._levels) if level.name == tier), None)
        level = None if index is None else self._levels[index]
        if level is None or not isinstance(level.policy, SlotSharePolicy):
            raise ValueError(f"tier {tier!r} is not one of this store's capped_tiers")
        with level.lock:
            victims = level.policy.set_limit(limit_bytes)
        for victim in victims:  # removed as any eviction is: moved down if a tier is below, dropped here
            self._evict(index, victim)
        return len(victims)

    def locate(self, key: str) -> str | None:
        """Name of the fastest tier holding `key`, or None."""
        return next((level.name for level in self._levels if level.holds(key)), None)

    def tiers_holding(self, key: str) -> list[str]:
        """Every tier holding `key`, fastest first (inner tiers named for a tier over the node shards)."""
        return [label for level in self._levels if (label := level.label_of(key)) is not None]

    def contains(self, key: str) -> bool:
        """Whether any tier holds `key`."""
        return self.locate(key) is not None

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """`contains` of each key, each tier asked once for the keys no faster tier holds."""
        found = [False] * len(keys)
        remaining = list(range(len(keys)))
        for level in self._levels:
            if not remaining:
                break
            held = level.holds_many([keys[i] for i in remaining])
            for i, is_held in zip(remaining, held):
                found[i] = is_held
            remaining = [i for i, is_held in zip(remaining, held) if not is_held]
        return found

    def tiers_holding_many(self, keys: Sequence[str]) -> list[list[str]]:
        """`tiers_holding` of each key, each tier asked once for them all."""
        by_level = [level.labels_of(keys) for level in self._levels]
        return [[label for labels in by_level if (label := labels[i]) is not None] for i in range(len(keys))]

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Keys starting with `prefix` in any tier, each once, with its blob size."""
        seen: set[str] = set()
        for level in self._levels:
            for key, nbytes in level.scan(prefix):
                if key not in seen:
                    seen.add(key)
                    yield key, nbytes

    def placements(self, tiers: frozenset[str] | None = None) -> Iterator[tuple[str, str, int]]:
        """(tier, key, bytes) of every entry held, in the tiers named (all when None)."""
        for level in self._levels:
            if tiers is None or level.name in tiers:
                for key, nbytes in level.scan(""):
                    yield level.name, key, nbytes

    def delete(self, key: str) -> None:
        """Remove `key` from every tier (after pending background writes, so none re-adds it)."""
        self._writer.flush()
        for level in self._levels:
            level.forget(key)

    def invalidate(self, fingerprint: str) -> int:
        """Remove every chunk made under `fingerprint` from every tier; returns how many keys went."""
        self._writer.flush()
        prefix = fingerprint_tag(fingerprint) + KEY_SEPARATOR
        removed: set[str] = set()
        for level in self._levels:
            keys = [key for key, _ in level.scan(prefix)]
            for key in keys:
                level.forget(key)
            removed.update(keys)
        return len(removed)

    def recover(self, temporaries_older_than_s: float = STALE_TEMPORARY_S) -> int:
        """Adopt chunks already in the tiers (an SSD after a restart) and report them; returns how many."""
        # Files of writes a crash interrupted are swept first; a caller owning the tier alone passes 0.
        adopted = 0
        for index, level in enumerate(self._levels):
            level.tier.sweep_temporaries(temporaries_older_than_s)
            for key, nbytes in level.scan(""):
                for victim in level.adopt(key, nbytes):
                    self._evict(index, victim)
                adopted += 1
        return adopted

    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        tiers = {}
        for level in self._levels:
            with level.lock:
                tiers[level.name] = copy.copy(level.stats)
        down = tuple(level.name for level in self._levels if level.is_down)
        return StoreStats(tiers, self._write_back_errors, self._writer.dropped, down)

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

    def _place(self, index: int, key: str, blob: torch.Tensor, priority: float) -> bool:
        """Offer `blob` to one level; its evictions move down in the background."""
        admitted, victims = self._levels[index].place(key, blob, priority)
        for victim in victims:
            self._evict(index, victim)
        return admitted

    def _evict(self, index: int, key: str) -> None:
        """Demote an evicted key in the background; when the queue is full, drop it here at once."""
        if not self._writer.submit(self._demote, index, key):
            self._drop_unless_readmitted(index, key)

    def _write_back(self, key: str, blob: torch.Tensor, priority: float) -> None:
        for index in range(1, len(self._levels)):
            self._place(index, key, blob, priority)

    def _promote(self, key: str, blob: torch.Tensor, priority: float, from_index: int) -> None:
        for index in range(from_index):
            if self._place(index, key, blob, priority):
                with self._levels[index].lock:
                    self._levels[index].stats.promotions += 1

    def _promote_from(self, key: str, index: int) -> None:
        blob = self._levels[index].fetch(key)
        priority = self._verified_priority(index, key, blob)
        if blob is not None and priority is not None:
            self._promote(key, blob, priority, index)

    def _demote(self, index: int, key: str) -> None:
        """Move an evicted key down (unless the next tier holds it already), then drop it here."""
        # The next tier is asked, not only its policy: an entry lost behind the store's back is copied again.
        if index + 1 < len(self._levels) and not self._levels[index + 1].present(key):
            self._move_down(index, key)
        self._drop_unless_readmitted(index, key)

    def _drop_unless_readmitted(self, index: int, key: str) -> None:
        level = self._levels[index]
        with level.lock:
            readmitted = level.policy.contains(key)
        if not readmitted:
            level.drop(key)

    def _move_down(self, index: int, key: str) -> None:
        """Copy a key into the nearest lower tier whose policy admits it."""
        blob = self._levels[index].fetch(key)
        priority = self._verified_priority(index, key, blob)
        if blob is None or priority is None:
            return
        for lower in range(index + 1, len(self._levels)):
            if self._place(lower, key, blob, priority):
                with self._levels[lower].lock:
                    self._levels[lower].stats.demotions += 1
                return

    def _verified_priority(self, index: int, key: str, blob: torch.Tensor | None) -> float | None:
        """Priority of a blob about to move between tiers, or None if it is absent or damaged."""
        if blob is None:
            return None
        try:
            return decode(blob, key)[0].priority
        except CodecError as err:
            self._levels[index].discard(key, err)
            return None

    def _count_hit(self, index: int, key: str, nbytes: int) -> None:
        for upper, level in enumerate(self._levels[: index + 1]):
            with level.lock:
                if upper < index:
                    level.stats.misses += 1
                else:
                    level.stats.hits += 1
                    level.stats.bytes_read += nbytes
                level.policy.touch(key)

    def _count_miss(self, key: str) -> None:
        for level in self._levels:
            with level.lock:
                level.stats.misses += 1
                level.policy.touch(key)

    def _count_write_back_error(self, err: BaseException) -> None:
        with self._errors_lock:
            self._write_back_errors += 1
