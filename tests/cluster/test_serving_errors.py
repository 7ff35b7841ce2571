"""Every bad input gets its 4xx with a message naming the field, and the server keeps answering."""
import httpx
import pytest

from tests.cluster.test_serving import DOCS, MODEL

CHAT = "/v1/chat/completions"


def body(**changes: object) -> dict:
    base = {"model": MODEL, "messages": [{"role": "user", "content": "Where is the tower?"}],
            "documents": [{"text": DOCS[0]}], "max_tokens": 4}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


CASES = [
    (CHAT, b'{"messages": [', 400, "body: is not valid JSON"),
    (CHAT, body(max_tokens="4"), 400, "max_tokens: "),
    (CHAT, body(messages=None), 400, "messages: is required"),
    (CHAT, body(messages=[]), 400, "messages: must hold at least one message"),
    (CHAT, body(documents=[{"text": ""}]), 400, "documents[0].text: must be a non-empty string"),
    (CHAT, body(documents=[{"text": 7}]), 400, "documents[0].text: "),
    (CHAT, body(documents=[{"text": "x"}] * 9), 400, "documents: must hold at most 8 documents"),
    (CHAT, body(documents=[{"text": "word " * 2500}] * 5), 400, "exceeds the model's context"),
    (CHAT, body(max_tokens=0), 400, "max_tokens: must be in [1, 64]"),
    (CHAT, body(max_tokens=65), 400, "max_tokens: must be in [1, 64]"),
    (CHAT, body(model="gpt-4"), 404, "model: unknown model 'gpt-4'"),
    (CHAT, body(blend={"mode": "magic"}), 400, "blend.mode: must be one of"),
    (CHAT, body(blend={"recompute_ratio": 1.5}), 400, "blend.recompute_ratio: must be in [0, 1]"),
    (CHAT, body(documents=[{"text": "x" * 70000}]), 413, "exceed the limit of 65536 bytes"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt: must be a non-empty string"),
    ("/v1/documents", {"documents": []}, 400, "documents: must hold 1 to 256 documents"),
    ("/v1/documents", {"documents": [{"text": "   "}]}, 400, "documents[0].text: must be a non-empty string"),
]


@pytest.mark.parametrize(("path", "payload", "status", "words"), CASES, ids=[c[3][:40] for c in CASES])
def test_bad_input_is_refused_with_the_field_named(server: str, path: str, payload: object, status: int, words: str):
    content = payload if isinstance(payload, bytes) else None
    response = httpx.post(f"{server}{path}", content=content, json=None if content else payload, timeout=60)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_bad_tenant_header_and_the_server_still_answers(server: str):
    response = httpx.post(f"{server}{CHAT}", json=body(), headers={"X-Tenant": "no/slashes"}, timeout=60)
    assert response.status_code == 400 and "X-Tenant" in response.json()["error"]["message"]
    assert httpx.post(f"{server}{CHAT}", json=body(), timeout=120).status_code == 200
