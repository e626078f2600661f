#!/usr/bin/env bash
# Issue 10's cached-prompt TTFT on the H200, in two device calls: (a) the GPU tests, the op's GPU validation and
# the short-prefill op bench; (b) the TTFT grid (Llama-3-8B shape, random bf16) and the RAG bench. Logs under $OUT.
# (b) needs .whl (datasets, dill, multiprocess) and bench/data (built by `python bench/rag.py --build-only`) carried.
#
#   GIT_SHA=$(git rev-parse --short HEAD) bash bench/gpu_ttft.sh a|b
set -u
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 GIT_SHA=${GIT_SHA:-unknown}
[[ -d .whl ]] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
step() {  # step NAME LIMIT_S command...: run it with a limit, keep its log, show its end
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T))"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "rc=$? ($(date +%T))"
    tail -n 30 "$OUT/$name.log"
}
if [[ $1 == a ]]; then
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
    step op_validation 120 python3 bench/gpu_ops.py --only __none__ --out "$OUT"
    step short_prefill 240 python3 bench/gpu_short_prefill.py
fi
if [[ $1 == c ]]; then  # after a kernel change: tests and validation, then the RAG bench
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
    step op_validation 120 python3 bench/gpu_ops.py --only __none__ --out "$OUT"
    step rag 300 python3 bench/rag.py --device cuda --llama3-8b-shape --samples 64 --max-num-seqs 32 \
        --max-num-batched-tokens 8192
fi
if [[ $1 == b ]]; then
    step ttft_grid 280 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 512,1024,2048,4096 \
        --ks 1,2,4,8 --repeats 2
    step rag 300 python3 bench/rag.py --device cuda --llama3-8b-shape --samples 64 --max-num-seqs 32 \
        --max-num-batched-tokens 8192
fi
cp bench/results/*"$GIT_SHA"* "$OUT"/ 2>/dev/null
ls "$OUT"
