"""The compressions a tier may be configured with, by the name blob headers carry."""
from kvplane.compression.base import Compression, NoCompression
from kvplane.compression.int4 import Int4
from kvplane.compression.int8 import Int8

NONE = "none"
COMPRESSIONS: dict[str, Compression] = {
    compression.name: compression
    for compression in (NoCompression(), Int8(), Int4("int4", key_group=64, value_group=64))
}


def compression(name: str) -> Compression:
    """The compression called `name`; a ValueError names the known ones."""
    found = COMPRESSIONS.get(name)
    if found is None:
        raise ValueError(f"unknown compression {name!r}; choose from {sorted(COMPRESSIONS)}")
    return found
