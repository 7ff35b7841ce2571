"""A chunk read layer by layer, for the loader that overlaps loading with recompute."""
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from kvplane.buffers import clone_bytes, copy_bytes, host_view, new_blob
from kvplane.codec import (
    HEADER_PROBE_BYTES,
    ChunkHeader,
    CodecError,
    check_layer,
    decode_layers,
    header_span,
    parse_header,
)
from kvplane.compression.registry import NONE
from kvplane.level import Level


class ChunkLost(LookupError):
    """A chunk vanished or failed its checksum mid-stream in every tier holding it: treat it as a miss."""


@dataclass(slots=True)
class LayerStream:
    """Header of a found chunk, the tier that served it, and its layers (`[2, T, H_kv, D]`, in order)."""

    header: ChunkHeader
    tier: str
    layers: Iterator[torch.Tensor]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self.layers

    @property
    def token_ids(self) -> list[int]:
        """Token ids of the chunk."""
        return self.header.token_ids

    @property
    def num_layers(self) -> int:
        """Layers the stream yields."""
        return self.header.num_layers


def find_header(
    levels: Sequence[Level], key: str, first: int, like: ChunkHeader | None = None
) -> tuple[int, ChunkHeader, torch.Tensor] | None:
    """(index, header, bytes read) of the first level from `first` with a sound header for `key`."""
    # With `like`, only a copy holding the same layers will do; damaged headers are discarded.
    for index in range(first, len(levels)):
        level = levels[index]
        head = level.fetch(key, 0, HEADER_PROBE_BYTES)
        if head is None:
            continue
        try:
            head = _complete_head(level, key, head)
            header = parse_header(host_view(head))
            if header.key != key:
                raise CodecError(f"header names {header.key}, not {key}")
        except CodecError as err:
            level.discard(key, err)
            continue
        if like is None or header.layer_checksums == like.layer_checksums:
            return index, header, head
    return None


def stream_layers(
    levels: Sequence[Level],
    key: str,
    index: int,
    header: ChunkHeader,
    head: torch.Tensor,
    promote: Callable[[torch.Tensor, int], None],
    decode_device: torch.device | None = None,
    head_is_whole: bool = False,
) -> Iterator[torch.Tensor]:
    """Layers in order from `levels[index]`, falling back to lower levels for a lost or damaged one.

    `head_is_whole`: `head` is the whole blob, read in one call (its layers are not read again).

    With `decode_device`, a compressed layer's checked bytes move there before they are decoded (a GPU worker
    copies the compressed bytes, not the decoded layer, and decodes in the device's memory).
    """
    # A chunk served from below the top is collected as it streams (copies taken before the caller can
    # overwrite a layer) and handed to `promote(blob, level index)` at the end. Nothing is allocated from
    # the header's claims: a forged header with a valid checksum meets a checked layer read first.
    promoting = index > 0
    copies: list[torch.Tensor] = []
    source = header
    region = _whole_region(levels[index], key, header, source, head if head_is_whole else None)
    for layer_index in range(header.num_layers):
        stored = _read_layer(levels[index], key, header, source, layer_index, region)
        while stored is None:
            found = find_header(levels, key, index + 1, header)
            if found is None:
                raise ChunkLost(f"{key}: layer {layer_index} is gone from every tier")
            index, source, _ = found
            region = _whole_region(levels[index], key, header, source)
            stored = _read_layer(levels[index], key, header, source, layer_index, region)
        if promoting:  # the stored bytes, taken before the caller may overwrite an uncompressed layer's view
            copies.append(clone_bytes(stored))
        if decode_device is not None and header.compression != NONE:
            stored = stored.to(decode_device, non_blocking=True)
        yield decode_layers(header, stored[None])[0]
    if promoting:
        promote(_assemble(header, head, copies), index)


def _complete_head(level: Level, key: str, head: torch.Tensor) -> torch.Tensor:
    """The probe, extended when the header is longer than the probe read."""
    span = header_span(host_view(head))
    if span <= head.numel() or head.numel() < HEADER_PROBE_BYTES:
        return head
    rest = level.fetch(key, head.numel(), span)
    return head if rest is None else torch.cat([head, rest])


def _whole_region(
    level: Level, key: str, header: ChunkHeader, source: ChunkHeader, whole: torch.Tensor | None = None
) -> tuple[int, torch.Tensor] | None:
    """Every layer of `source` with its start offset: in `whole` when the blob was read whole, else in one read
    where a read costs a round trip; else None (read layer by layer)."""
    if not source.layer_offsets:
        return None
    start, end = min(source.layer_offsets), max(source.layer_offsets) + header.layer_nbytes
    if whole is not None and whole.numel() >= end:
        return 0, whole
    if not level.reads_whole:
        return None
    data = level.fetch(key, start, end)
    return None if data is None else (start, data)


def _read_layer(
    level: Level,
    key: str,
    header: ChunkHeader,
    source: ChunkHeader,
    index: int,
    region: tuple[int, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """Stored bytes of layer `index` as laid out in `source` (from `region` when read whole), checked against
    `header`; None if gone or damaged."""
    offset = source.layer_offsets[index]
    if region is None:
        data = level.fetch(key, offset, offset + header.layer_nbytes)
    else:
        start, whole = region
        data = whole[offset - start : offset - start + header.layer_nbytes]
    if data is None:
        return None
    try:
        check_layer(header, index, data)
    except CodecError as err:
        level.discard(key, err)
        return None
    return data


def _assemble(header: ChunkHeader, head: torch.Tensor, layers: list[torch.Tensor]) -> torch.Tensor:
    """The whole blob from its header region (`head`, zero-padded) and its checked layers."""
    blob = new_blob(header.total_bytes)
    known = min(head.numel(), header.data_offset)
    copy_bytes(blob[:known], head[:known])
    copy_bytes(blob[known : header.data_offset], torch.zeros(header.data_offset - known, dtype=torch.uint8))
    for offset, layer in zip(header.layer_offsets, layers):
        copy_bytes(blob[offset : offset + header.layer_nbytes], layer)
    return blob
