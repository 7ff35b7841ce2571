"""Codec: exact round trips, and every damaged blob is an error, never a wrong tensor."""
import struct

import msgpack
import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplane.buffers import host_view
from kvplane.codec import (
    FORMAT_VERSION,
    CodecError,
    decode,
    decode_layer,
    encode,
    header_span,
    parse_header,
    read_header,
    recompress,
)
from kvplane.entry import KVEntry
from tests.kvplane.conftest import EntryFactory

_PREFIX_NBYTES = 20  # magic, version, flags, header length, header checksum


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_exact_for_every_dtype(make_entry: EntryFactory, dtype: torch.dtype) -> None:
    entry = make_entry(1, num_tokens=5, num_layers=4, dtype=dtype)
    header, kv = decode(encode(entry, priority=2.5), entry.key)
    assert kv.dtype == dtype
    assert torch.equal(kv, entry.kv)
    assert header.token_ids == entry.token_ids
    assert header.fingerprint == entry.fingerprint
    assert header.priority == 2.5


def test_decode_views_the_blob_without_copying(make_entry: EntryFactory) -> None:
    entry = make_entry(2)
    blob = encode(entry)
    header, kv = decode(blob, entry.key)
    assert kv.untyped_storage().data_ptr() == blob.untyped_storage().data_ptr()
    assert kv.data_ptr() == blob.data_ptr() + header.data_offset


def test_layers_are_contiguous_and_readable_by_byte_range(make_entry: EntryFactory) -> None:
    entry = make_entry(3, num_layers=5, dtype=torch.bfloat16)
    blob = encode(entry)
    header = parse_header(host_view(blob[: header_span(host_view(blob))]))
    assert header.data_offset % 64 == 0
    for index, offset in enumerate(header.layer_offsets):
        layer = decode_layer(header, index, blob[offset : offset + header.layer_nbytes].clone())
        assert layer.shape == (2, 8, 3, 8)
        assert torch.equal(layer, entry.kv[index])


def test_a_layer_from_the_wrong_place_is_caught(make_entry: EntryFactory) -> None:
    blob = encode(make_entry(4))
    header = read_header(blob)
    second = blob[header.layer_offsets[1] : header.layer_offsets[1] + header.layer_nbytes]
    with pytest.raises(CodecError, match="checksum"):
        decode_layer(header, 0, second)


def test_unknown_version_is_named_in_the_error(make_entry: EntryFactory) -> None:
    entry = make_entry(5)
    blob = encode(entry)
    struct.pack_into("<H", host_view(blob), 4, FORMAT_VERSION + 1)
    with pytest.raises(CodecError, match=f"unknown format version {FORMAT_VERSION + 1}"):
        decode(blob, entry.key)


def test_a_blob_under_another_key_is_refused(make_entry: EntryFactory) -> None:
    with pytest.raises(CodecError, match="holds"):
        decode(encode(make_entry(6)), make_entry(7).key)


def test_unsupported_dtype_and_bad_priority_are_refused_on_encode(make_entry: EntryFactory) -> None:
    entry = make_entry(8)
    with pytest.raises(ValueError):
        encode(entry, priority=-1.0)
    entry.kv = entry.kv.to(torch.float64)
    with pytest.raises(ValueError, match="dtype"):
        encode(entry)


_DAMAGE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_DAMAGE
@given(
    position=st.floats(0, 1, exclude_max=True),
    flip=st.integers(1, 255),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    compression=st.sampled_from(["none", "int8", "int4"]),
)
def test_any_flipped_byte_is_detected(
    make_entry: EntryFactory, position: float, flip: int, dtype: torch.dtype, compression: str
) -> None:
    entry = make_entry(9, num_layers=2, dtype=dtype)
    blob = encode(entry, compression_name=compression)
    index = int(position * blob.numel())
    blob[index] ^= flip
    with pytest.raises(CodecError):
        decode(blob, entry.key)


@_DAMAGE
@given(fraction=st.floats(0, 1, exclude_max=True), compression=st.sampled_from(["none", "int8", "int4"]))
def test_any_truncation_is_detected(make_entry: EntryFactory, fraction: float, compression: str) -> None:
    entry = make_entry(10, num_layers=2)
    blob = encode(entry, compression_name=compression)
    with pytest.raises(CodecError):
        decode(blob[: int(fraction * blob.numel())].clone(), entry.key)


def test_garbage_is_not_a_blob() -> None:
    with pytest.raises(CodecError, match="magic"):
        header_span(b"\x00" * 64)
    with pytest.raises(CodecError, match="truncated"):
        header_span(b"BSKV")


@pytest.mark.parametrize(("compression", "max_error"), [("int8", 0.05), ("int4", 0.6)])
def test_a_compressed_blob_decodes_close_to_the_chunk_and_names_its_compression(
    make_entry: EntryFactory, compression: str, max_error: float
) -> None:
    entry = make_entry(11, num_tokens=40, num_layers=3)
    blob = encode(entry, priority=1.5, compression_name=compression)
    header, kv = decode(blob, entry.key)
    assert header.compression == compression
    assert header.priority == 1.5 and header.token_ids == entry.token_ids
    assert blob.numel() < encode(entry).numel()
    assert kv.shape == entry.kv.shape and kv.dtype == entry.kv.dtype
    assert (kv - entry.kv).abs().max() <= max_error  # unit-normal values: a step is 2 x 4 / 254 or 2 x 4 / 15
    for index, offset in enumerate(header.layer_offsets):
        layer = decode_layer(header, index, blob[offset : offset + header.layer_nbytes].clone())
        assert torch.equal(layer, kv[index])


def test_recompress_keeps_the_identity_and_compressing_twice_changes_nothing(make_entry: EntryFactory) -> None:
    entry = make_entry(12, num_tokens=16)
    once = recompress(encode(entry, priority=3.0), "int8")
    header, kv = decode(once, entry.key)
    assert (header.key, header.fingerprint, header.priority, header.compression) == (
        entry.key, entry.fingerprint, 3.0, "int8"
    )
    again = recompress(encode(KVEntry(entry.key, kv, entry.token_ids, entry.fingerprint), 3.0), "int8")
    assert torch.equal(decode(again, entry.key)[1], kv)


def test_a_chunk_of_no_tokens_is_stored_uncompressed(make_entry: EntryFactory) -> None:
    entry = make_entry(13, num_tokens=0)
    header, kv = decode(encode(entry, compression_name="int4"), entry.key)
    assert header.compression == "none" and kv.shape == entry.kv.shape


def test_a_version_1_blob_still_reads(make_entry: EntryFactory) -> None:
    # Version 1 wrote the same layout without the compression field; entries on an SSD outlive an upgrade.
    entry = make_entry(14, num_tokens=6)
    current = encode(entry)
    header = read_header(current)
    fields = msgpack.unpackb(bytes(host_view(current[_PREFIX_NBYTES : header_span(host_view(current))])), raw=False)
    del fields["compression"]
    packed = msgpack.packb(fields, use_bin_type=True)
    assert _PREFIX_NBYTES + len(packed) <= header.data_offset  # the old header fits before the same payload
    old = current.clone()
    view = host_view(old)
    view[:_PREFIX_NBYTES] = struct.pack("<4sHHIQ", b"BSKV", 1, 0, len(packed), xxhash.xxh3_64_intdigest(packed))
    view[_PREFIX_NBYTES : header.data_offset] = packed + bytes(header.data_offset - _PREFIX_NBYTES - len(packed))
    old_header, kv = decode(old, entry.key)
    assert old_header.compression == "none"
    assert torch.equal(kv, entry.kv)
