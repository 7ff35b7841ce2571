"""Chunk keys: content-addressed, position-free, safe as file and object names."""
import re

import pytest

from kvplane.keys import chunk_key, fingerprint_tag, is_chunk_key, key_dir, key_path, tenant_of_key, tenant_tag


def test_key_depends_on_content_only() -> None:
    tokens = [101, 7, 3021, 42]
    assert chunk_key("fp", "tenant", tokens) == chunk_key("fp", "tenant", list(tokens))
    assert chunk_key("fp", "tenant", tokens) != chunk_key("fp", "tenant", tokens[::-1])
    assert chunk_key("fp", "tenant", tokens) != chunk_key("fp", "other-tenant", tokens)
    assert chunk_key("fp", "tenant", tokens) != chunk_key("fp-new-rope", "tenant", tokens)


def test_parts_cannot_run_into_each_other() -> None:
    assert chunk_key("ab", "c", [1]) != chunk_key("a", "bc", [1])
    assert chunk_key("fp", "t", [1, 23]) != chunk_key("fp", "t", [12, 3])


def test_key_is_a_safe_name_led_by_the_fingerprint_tag() -> None:
    key = chunk_key("model/weights:v2 rope=1e5", "tenant/ä", range(100))
    assert re.fullmatch(r"[0-9a-f-]+", key)
    assert key.startswith(fingerprint_tag("model/weights:v2 rope=1e5") + "-")
    assert is_chunk_key(key)


def test_key_path_fans_out_under_the_fingerprint() -> None:
    key = chunk_key("fp", "t", [5, 6])
    tag, _tenant, content = key.split("-")
    assert key_path(key) == f"{tag}/{content[:2]}/{key}"
    assert key_dir(tag + "-") == tag
    assert key_dir("") == ""


def test_keys_carry_the_tenant_whatever_the_qualifier() -> None:
    plain, qualified = chunk_key("fp", "acme", [1]), chunk_key("fp", "acme\0context:abc", [2])
    assert tenant_of_key(plain) == tenant_of_key(qualified) == tenant_tag("acme") != tenant_tag("globex")
    assert tenant_of_key(chunk_key("fp", "globex", [1])) == tenant_tag("globex")
    assert tenant_of_key("not-a-key") == ""


@pytest.mark.parametrize("bad", ["", "../etc/passwd", "ABCDEF", "0" * 16 + "-" + "g" * 32, "0" * 16 + "-" + "0" * 32])
def test_key_path_rejects_foreign_names(bad: str) -> None:
    with pytest.raises(ValueError):
        key_path(bad)
