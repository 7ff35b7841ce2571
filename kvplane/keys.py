"""Content keys for chunk KV: a hash of (model fingerprint, tenant namespace, token ids), no position."""
import hashlib
import re
from collections.abc import Sequence

import numpy as np

KEY_SEPARATOR = "-"
NAMESPACE_QUALIFIER = "\0"  # a namespace is `<tenant>` or `<tenant>\0<qualifier>` (e.g. the context KV is after)
_TAG_HEX = 16
_TENANT_HEX = 8
_KEY_PATTERN = re.compile(rf"^[0-9a-f]{{{_TAG_HEX}}}-[0-9a-f]{{{_TENANT_HEX}}}-[0-9a-f]{{32}}$")


def fingerprint_tag(fingerprint: str) -> str:
    """Hex tag of a model fingerprint; every key made under that fingerprint starts with it."""
    return hashlib.blake2b(fingerprint.encode(), digest_size=_TAG_HEX // 2).hexdigest()


def tenant_tag(namespace: str) -> str:
    """Hex tag of the tenant a namespace belongs to (its part before any qualifier); it is in every key."""
    tenant = namespace.split(NAMESPACE_QUALIFIER, 1)[0]
    return hashlib.blake2b(tenant.encode(), digest_size=_TENANT_HEX // 2, person=b"tenant").hexdigest()


def chunk_key(fingerprint: str, namespace: str, token_ids: Sequence[int]) -> str:
    """Key of a chunk's KV, safe as a file or object name: `<fingerprint tag>-<tenant tag>-<content hash>`."""
    # A keyed cryptographic hash, not xxhash: tenants must not be able to forge a collision with
    # another tenant's chunk. Length prefixes keep ("ab", "c") apart from ("a", "bc"). The tenant tag
    # lets a tier count each tenant's bytes (a tenant may not fill a shared cache on its own).
    digest = hashlib.blake2b(digest_size=16)
    for part in (fingerprint.encode(), namespace.encode()):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    digest.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return KEY_SEPARATOR.join((fingerprint_tag(fingerprint), tenant_tag(namespace), digest.hexdigest()))


def is_chunk_key(name: str) -> bool:
    """Whether `name` has the shape of a key made by `chunk_key`."""
    return _KEY_PATTERN.match(name) is not None


def tenant_of_key(key: str) -> str:
    """The tenant tag inside a chunk key ("" for a string that is not one)."""
    return key.split(KEY_SEPARATOR)[1] if is_chunk_key(key) else ""


def key_path(key: str) -> str:
    """Relative path of a key in a directory-like tier: grouped by fingerprint, fanned out by hash."""
    if not is_chunk_key(key):
        raise ValueError(f"not a chunk key: {key!r}")
    tag, _tenant, content = key.split(KEY_SEPARATOR)
    return f"{tag}/{content[:2]}/{key}"


def key_dir(prefix: str) -> str:
    """Deepest directory that holds every key starting with `prefix` (a fingerprint tag or more)."""
    tag = prefix.split(KEY_SEPARATOR)[0]
    return tag if len(tag) == _TAG_HEX else ""
