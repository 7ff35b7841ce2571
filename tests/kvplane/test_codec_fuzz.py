"""Property-based fuzzing of the codec's decoder: any bytes, any header a forger can checksum, never a crash."""
import msgpack
import pytest
import torch
import xxhash
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from kvplane.codec import (
    _PREFIX,
    FORMAT_VERSION,
    MAGIC,
    ChunkHeader,
    CodecError,
    _align,
    _pack,
    decode,
    encode,
    parse_header,
)
from kvplane.layer_stream import ChunkLost
from kvplane.store import TieredStore
from kvplane.tiers.memory import MemoryTier
from tests.kvplane.conftest import build_entry

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENTRY = build_entry(11, num_tokens=4, num_layers=2)
SOUND = encode(ENTRY)
SOUND_FIELDS = msgpack.unpackb(
    bytes(SOUND.numpy()[_PREFIX.size : _PREFIX.size + _PREFIX.unpack_from(SOUND.numpy())[3]])
)

anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=64),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def checksummed(fields: object, payload: bytes) -> torch.Tensor:
    """A blob with a correct prefix and header checksum around any header and payload."""
    packed = msgpack.packb(fields, use_bin_type=True)
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(packed), xxhash.xxh3_64_intdigest(packed))
    return torch.frombuffer(bytearray(prefix + packed + payload), dtype=torch.uint8)


@FUZZ
@given(data=st.binary(max_size=4096))
def test_any_bytes_are_refused_with_a_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode(torch.frombuffer(bytearray(data + b"\0"), dtype=torch.uint8), ENTRY.key)


@FUZZ
@given(
    replaced=st.dictionaries(st.sampled_from(sorted(SOUND_FIELDS)), anything, min_size=1, max_size=3),
    payload=st.binary(max_size=2048),
)
@example(replaced={"shape": [float("inf")]}, payload=b"")  # int(inf) raises OverflowError, not ValueError
def test_a_forged_header_with_a_valid_checksum_decodes_or_is_refused(replaced: dict, payload: bytes) -> None:
    blob = checksummed({**SOUND_FIELDS, **replaced}, payload)
    try:
        header, kv = decode(blob, ENTRY.key)
    except CodecError:
        return
    assert kv.numel() * kv.element_size() == header.num_layers * header.layer_nbytes <= blob.numel()


@FUZZ
@given(
    num_layers=st.integers(1, 4),
    dims=st.lists(st.integers(0, 1 << 30), min_size=2, max_size=2),
    num_tokens=st.integers(0, 8),
    payload=st.binary(max_size=512),
)
def test_claimed_shapes_never_allocate_what_they_claim(
    num_layers: int, dims: list[int], num_tokens: int, payload: bytes
) -> None:
    shape = (num_layers, 2, num_tokens, *dims)
    layer_nbytes = 2 * num_tokens * dims[0] * dims[1] * 4
    # The header stores layer offsets as unsigned 64-bit integers: a forger can claim no offset past 2^64.
    assume(num_layers * layer_nbytes < 1 << 63)

    def header(data_offset: int) -> ChunkHeader:  # offsets are fixed-width: the draft has the final length
        offsets = tuple(data_offset + i * layer_nbytes for i in range(num_layers))
        return ChunkHeader(
            ENTRY.key, ENTRY.fingerprint, "float32", shape, list(range(num_tokens)), 1.0, offsets, (0,) * num_layers
        )

    data_offset = _align(_PREFIX.size + len(_pack(header(0))))
    packed = _pack(header(data_offset))
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(packed), xxhash.xxh3_64_intdigest(packed))
    blob = torch.frombuffer(
        bytearray(prefix + packed + bytes(data_offset - len(prefix) - len(packed)) + payload), dtype=torch.uint8
    )
    disk = MemoryTier("disk", 1 << 40)
    disk.put(ENTRY.key, blob)  # below the top tier, where a forger's file would sit
    with TieredStore([MemoryTier("ram", 1 << 20), disk], "lru") as store:
        try:
            stream = store.read_layers(ENTRY.key)
            layers = [] if stream is None else list(stream)
        except ChunkLost:
            layers = []
        assert sum(layer.numel() * layer.element_size() for layer in layers) <= blob.numel()


def test_the_sound_header_parses() -> None:
    assert parse_header(bytes(SOUND.numpy()[:4096])).key == ENTRY.key
