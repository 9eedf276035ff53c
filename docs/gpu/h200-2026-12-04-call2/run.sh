#!/bin/bash
# device call 2: stop 30's memory fix (chunked log-probs, update_rows) and stop 31's shared prompts, on the GPU
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat .whl/commit.txt; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
F="warn|Loading weights"
echo "== A: 4 layers, 32 x 8, shared prompts (default), TRL"
timeout 160 python3 scripts/gpu_check.py --engine hf --out $OUT/a_shared.json 2>&1 | grep -v -i -E "$F" | tee $OUT/a_shared.log
echo "== C: 36 layers, 32 vision blocks, 32 x 8, update_rows 32"
timeout 220 python3 scripts/gpu_check.py --engine hf --layers 36 --vision-depth 32 --prompts 32 --update-rows 32 --skip-trl --out $OUT/c_36.json 2>&1 | grep -v -i -E "$F" | tee $OUT/c_36.log
echo "== B: 4 layers, 32 x 8, per-row prompts"
timeout 110 python3 scripts/gpu_check.py --engine hf --per-row-prompts --skip-trl --out $OUT/b_per_row.json 2>&1 | grep -v -i -E "$F" | tee $OUT/b_per_row.log
echo done
