"""Chunk KV <-> bytes: a fixed prefix, a msgpack header, then layer-contiguous tensor bytes."""

# Layout: `prefix | header | zero padding to 64 bytes | layer 0 | layer 1 | ...`. The prefix is
# magic, format version, flags, header length and the header's xxh3 checksum; the header carries the
# key, fingerprint, dtype, shape, token ids, priority, per-layer offsets and per-layer xxh3 checksums,
# and the compression of the layers (kvplane.compression; version 1 blobs predate it and hold raw
# layers), so one layer can be fetched with a byte-range read and checked on its own. Checksums cover
# the stored (compressed) bytes.
import struct
from dataclasses import dataclass

import msgpack
import numpy as np
import torch
import xxhash

from kvplane.buffers import copy_bytes, host_view, new_blob
from kvplane.compression.base import Compression
from kvplane.compression.registry import COMPRESSIONS, NONE, compression
from kvplane.entry import KVEntry

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAGIC = b"BSKV"
PAYLOAD_ALIGN_BYTES = 64
HEADER_PROBE_BYTES = 16384
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_PREFIX = struct.Struct("<4sHHIQ")  # magic, version, flags (0), header bytes, xxh3-64 of header


class CodecError(ValueError):
    """Bytes that do not decode to the chunk they claim to be (unknown version, truncated, corrupted)."""


@dataclass(slots=True, frozen=True)
class ChunkHeader:
    """What a blob says about itself; validated on construction."""

    key: str
    fingerprint: str
    dtype: str
    shape: tuple[int, ...]
    token_ids: list[int]
    priority: float
    layer_offsets: tuple[int, ...]
    layer_checksums: tuple[int, ...]
    compression: str = NONE

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {self.compression!r}")
        if len(self.shape) != 5 or self.shape[1] != 2 or self.shape[0] < 1 or min(self.shape) < 0:
            raise ValueError(f"bad shape {self.shape}")
        if self.shape[2] != len(self.token_ids):
            raise ValueError("token count does not match shape")
        if len(self.layer_checksums) != self.num_layers or len(self.layer_offsets) != self.num_layers:
            raise ValueError("per-layer tables do not match the layer count")
        expected = tuple(self.data_offset + i * self.layer_nbytes for i in range(self.num_layers))
        if self.layer_offsets != expected:
            raise ValueError("layer offsets are not contiguous")

    @property
    def num_layers(self) -> int:
        """Layers in the chunk."""
        return self.shape[0]

    @property
    def layer_shape(self) -> tuple[int, ...]:
        """Shape of one layer: `[2, T, H_kv, D]`."""
        return self.shape[1:]

    @property
    def torch_dtype(self) -> torch.dtype:
        """Tensor dtype of the payload."""
        return DTYPES[self.dtype]

    @property
    def codec(self) -> Compression:
        """How the layers are compressed."""
        return compression(self.compression)

    @property
    def layer_nbytes(self) -> int:
        """Stored bytes of one layer."""
        return self.codec.layer_nbytes(self.layer_shape, self.torch_dtype)

    @property
    def data_offset(self) -> int:
        """Byte offset of layer 0 (it also bounds the header region)."""
        return self.layer_offsets[0]

    @property
    def total_bytes(self) -> int:
        """Size of the whole blob."""
        return self.data_offset + self.num_layers * self.layer_nbytes


def encode(entry: KVEntry, priority: float = 1.0, compression_name: str = NONE) -> torch.Tensor:
    """Serialize a chunk into a new host blob, its layers compressed by `compression_name` (CompressionError
    when they cannot be)."""
    if entry.kv.dtype not in _DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {entry.kv.dtype}; supported: {sorted(DTYPES)}")
    if not np.isfinite(priority) or priority < 0:
        raise ValueError(f"priority must be finite and >= 0, got {priority}")
    # A chunk of no tokens has nothing to compress (and no range to scale by).
    codec = compression(compression_name if entry.kv.shape[2] else NONE)
    kv = entry.kv.detach().contiguous()
    num_layers = entry.num_layers
    layer_nbytes = codec.layer_nbytes(tuple(kv.shape[1:]), kv.dtype)
    # Checksums are packed fixed-width, so the header's length is known before they are computed.
    draft = _draft(entry, priority, 0, layer_nbytes, [0] * num_layers, codec.name)
    data_offset = _align(_PREFIX.size + len(_pack(draft)))
    blob = new_blob(data_offset + num_layers * layer_nbytes)
    offsets = [data_offset + i * layer_nbytes for i in range(num_layers)]
    for offset, layer in zip(offsets, kv):
        copy_bytes(blob[offset : offset + layer_nbytes], codec.compress(layer))
    view = host_view(blob)
    checksums = [xxhash.xxh3_64_intdigest(view[o : o + layer_nbytes]) for o in offsets]
    packed = _pack(_draft(entry, priority, data_offset, layer_nbytes, checksums, codec.name))
    view[: _PREFIX.size] = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(packed), xxhash.xxh3_64_intdigest(packed))
    view[_PREFIX.size : _PREFIX.size + len(packed)] = packed
    view[_PREFIX.size + len(packed) : data_offset] = bytes(data_offset - _PREFIX.size - len(packed))
    return blob


def recompress(blob: torch.Tensor, compression_name: str) -> torch.Tensor:
    """The same chunk with its layers compressed by `compression_name` (checked on the way; same key, priority)."""
    header, kv = decode(blob, read_header(blob).key)
    entry = KVEntry(header.key, kv, header.token_ids, header.fingerprint)
    return encode(entry, header.priority, compression_name)


def header_span(prefix: memoryview | bytes) -> int:
    """Bytes from the blob start needed to parse its header, read from the first bytes of a blob."""
    if len(prefix) < _PREFIX.size:
        raise CodecError(f"truncated: {len(prefix)} bytes cannot hold the {_PREFIX.size}-byte prefix")
    magic, version, flags, header_nbytes, _checksum = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise CodecError("not a chunk-KV blob (bad magic)")
    if version not in READABLE_VERSIONS:
        raise CodecError(f"unknown format version {version}; this build reads versions {READABLE_VERSIONS}")
    if flags != 0:
        raise CodecError(f"unknown flags {flags:#x} for format version {version}")
    return _PREFIX.size + header_nbytes


def parse_header(head: memoryview | bytes) -> ChunkHeader:
    """Header of a blob from its first `header_span` (or more) bytes."""
    span = header_span(head)
    if len(head) < span:
        raise CodecError(f"truncated: header needs {span} bytes, got {len(head)}")
    checksum = _PREFIX.unpack_from(head)[4]
    packed = head[_PREFIX.size : span]
    if xxhash.xxh3_64_intdigest(packed) != checksum:
        raise CodecError("header fails its checksum")
    try:
        return _unpack(packed)
    except (msgpack.UnpackException, ValueError, TypeError, KeyError, OverflowError) as err:
        raise CodecError(f"malformed header: {err}") from err


def read_header(blob: torch.Tensor) -> ChunkHeader:
    """Header of a whole (or header-prefixed) blob."""
    span = header_span(host_view(blob[: _PREFIX.size]))
    return parse_header(host_view(blob[:span]))


def check_layer(header: ChunkHeader, index: int, data: torch.Tensor) -> None:
    """Raise CodecError unless `data` is layer `index`'s stored bytes: its length and checksum."""
    if data.numel() != header.layer_nbytes:
        raise CodecError(f"truncated: layer {index} of {header.key} has {data.numel()} of {header.layer_nbytes} bytes")
    # Device blobs are not hashed: they reached device memory from a blob that was just encoded or
    # already verified on the host, and hashing them would cost a device-to-host copy.
    if data.device.type == "cpu" and xxhash.xxh3_64_intdigest(host_view(data)) != header.layer_checksums[index]:
        raise CodecError(f"layer {index} of {header.key} fails its checksum")


def decode_layer(header: ChunkHeader, index: int, data: torch.Tensor) -> torch.Tensor:
    """Layer `index` as `[2, T, H_kv, D]` (a view of `data` when uncompressed), after checking it."""
    check_layer(header, index, data)
    return decode_layers(header, data[None])[0]


def decode_layers(header: ChunkHeader, data: torch.Tensor) -> torch.Tensor:
    """Stored layers `[N, layer_nbytes]`, already checked, as `[N, 2, T, H_kv, D]` (one call: cheaper than N)."""
    return header.codec.decompress(data, header.layer_shape, header.torch_dtype)


def decode(blob: torch.Tensor, expected_key: str) -> tuple[ChunkHeader, torch.Tensor]:
    """Header and `[L, 2, T, H_kv, D]` tensor (viewing `blob` when uncompressed), every layer checked."""
    header = read_header(blob)
    if header.key != expected_key:
        raise CodecError(f"blob holds {header.key}, not {expected_key}")
    if blob.numel() != header.total_bytes:
        raise CodecError(f"truncated or padded: {blob.numel()} bytes, header says {header.total_bytes}")
    if any(host_view(blob[header_span(host_view(blob[: _PREFIX.size])) : header.data_offset])):
        raise CodecError("padding after the header is not zero")
    if blob.device.type == "cpu":  # device blobs: see check_layer
        view, layer_nbytes = host_view(blob), header.layer_nbytes
        for index, (offset, checksum) in enumerate(zip(header.layer_offsets, header.layer_checksums)):
            if xxhash.xxh3_64_intdigest(view[offset : offset + layer_nbytes]) != checksum:
                raise CodecError(f"layer {index} of {header.key} fails its checksum")
    return header, decode_layers(header, blob[header.data_offset :].view(header.num_layers, header.layer_nbytes))


def _align(nbytes: int) -> int:
    return -(-nbytes // PAYLOAD_ALIGN_BYTES) * PAYLOAD_ALIGN_BYTES


def _draft(
    entry: KVEntry, priority: float, data_offset: int, layer_nbytes: int, checksums: list[int], compression_name: str
) -> ChunkHeader:
    return ChunkHeader(
        key=entry.key,
        fingerprint=entry.fingerprint,
        dtype=_DTYPE_NAMES[entry.kv.dtype],
        shape=tuple(entry.kv.shape),
        token_ids=list(entry.token_ids),
        priority=float(priority),
        layer_offsets=tuple(data_offset + i * layer_nbytes for i in range(entry.num_layers)),
        layer_checksums=tuple(checksums),
        compression=compression_name,
    )


def _pack(header: ChunkHeader) -> bytes:
    # Integer tables go in as fixed-width little-endian arrays: compact, and of a length that does
    # not depend on their values.
    return msgpack.packb(
        {
            "key": header.key,
            "fingerprint": header.fingerprint,
            "dtype": header.dtype,
            "shape": list(header.shape),
            "token_ids": np.asarray(header.token_ids, dtype="<u4").tobytes(),
            "priority": header.priority,
            "layer_offsets": np.asarray(header.layer_offsets, dtype="<u8").tobytes(),
            "layer_checksums": np.asarray(header.layer_checksums, dtype="<u8").tobytes(),
            "compression": header.compression,
        },
        use_bin_type=True,
    )


def _unpack(packed: memoryview | bytes) -> ChunkHeader:
    fields = msgpack.unpackb(packed, raw=False)
    return ChunkHeader(
        key=str(fields["key"]),
        fingerprint=str(fields["fingerprint"]),
        dtype=str(fields["dtype"]),
        shape=tuple(int(n) for n in fields["shape"]),
        token_ids=np.frombuffer(fields["token_ids"], dtype="<u4").tolist(),
        priority=float(fields["priority"]),
        layer_offsets=tuple(np.frombuffer(fields["layer_offsets"], dtype="<u8").tolist()),
        layer_checksums=tuple(np.frombuffer(fields["layer_checksums"], dtype="<u8").tolist()),
        compression=str(fields.get("compression", NONE)),
    )
