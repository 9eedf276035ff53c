# syntax=docker/dockerfile:1.7
# FastRL on NVIDIA GPUs: the `gpu` (vLLM 0.33) and `app` extras plus TRL, with `fastrl` as the entry point.
#
#   docker build -t fastrl:gpu .
#   docker run --gpus all -v "$PWD/runs:/workspace/runs" fastrl:gpu train engine=vllm device=cuda sketch=logprob steps=200
#   docker run -p 8501:8501 -v "$PWD/runs:/workspace/runs" fastrl:gpu app --store runs --address 0.0.0.0
#   docker run --gpus all --entrypoint python fastrl:gpu scripts/gpu_check.py
#   docker run --gpus all --entrypoint accelerate fastrl:gpu launch --num_processes 8 my_trl_script.py
#
# pyproject's dependencies are ranges; the CPU machines install with constraints/cpu.txt (torch 2.13.0,
# transformers 5.23.0) and this image with constraints/gpu.txt (vLLM 0.33: torch 2.14.0, transformers 5.20).
# docs/gpu.md says what was and was not run: this file was written without a Docker engine or a GPU at hand.

ARG CUDA_IMAGE=nvidia/cuda:12.9.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HF_HOME=/workspace/.cache/huggingface

# Python 3.12 (Ubuntu 24.04's) and a C compiler for Triton's runtime-compiled helpers. No git: .dockerignore leaves
# .git out of the build context, so a run's `code_version` in the store is the package version (pyproject.toml).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv "$VIRTUAL_ENV" \
 && pip install --upgrade pip

# The GPU pins (constraints/gpu.txt): torch/torchvision/transformers follow vLLM 0.33. The package is installed as a
# user installs it, not editable: its configs and the embedded warm start ship inside it (package data), and the
# source copy is removed after. scripts/ (gpu_check.py, fault_injection.py) is not part of the package: copied in.
# COPY takes the context .dockerignore leaves: everything but .git, tests, environments, runs and caches.
COPY . /tmp/fastrl-src
RUN pip install -c /tmp/fastrl-src/constraints/gpu.txt "/tmp/fastrl-src[gpu,app,trl]" \
 && mkdir -p /workspace && cp -r /tmp/fastrl-src/scripts /workspace/scripts && rm -rf /tmp/fastrl-src \
 && cd /workspace && python -c "from importlib.metadata import version; from fastrl_core.engines.vllm import VLLMEngine; \
from fastrl_core.integrations.trl import FastRLGRPOTrainer; print('fastrl', version('fastrl'), 'vllm', version('vllm'))"

WORKDIR /workspace
EXPOSE 8501
ENTRYPOINT ["fastrl"]
CMD ["--help"]
