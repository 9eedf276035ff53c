#!/bin/bash
# device call 3: docs/gpu.md "Next on a GPU" -- update_rows at full depth, then the paper's 4 PPO updates with rows
# shuffled vs whole prompts per mini-batch, and the log-prob chunk 2^25 (default) vs 2^28 at 4 updates
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat .whl/commit.txt; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
F="warn|Loading weights"
check() {  # name, timeout, gpu_check arguments
    local name=$1 limit=$2; shift 2
    echo "== $name: $*"
    timeout "$limit" python3 scripts/gpu_check.py --engine hf --skip-trl --out "$OUT/$name.json" "$@" 2>&1 \
        | grep -v -i -E "$F" | tee "$OUT/$name.log"
}
check c_36_update_rows 200 --layers 36 --vision-depth 32 --prompts 32 --update-rows 32
check d_updates4_rows 70 --updates 4
check d_updates4_prompts 70 --updates 4 --grouped-minibatches
check e_updates4_chunk2e28 70 --updates 4 --chunk-logits 268435456
echo done
