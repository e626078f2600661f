#!/usr/bin/env bash
# Issues 10 and 11 on the H200, in parts that one device call can join: the GPU tests, the RAG, offload, TTFT and
# span-scaling benches (Llama-3-8B shape, random bf16), the hybrid side by side, each log under $OUT. Needs .whl (datasets, dill, multiprocess) and
# bench/data (the RAG datasets, built here with `python bench/rag.py --build-only --samples 64`) carried.
#
#   GIT_SHA=$(git rev-parse --short HEAD) bash bench/gpu_issue10.sh [part]   part: all (default), a, b, ops, ttft, host, hostdiag, offload, tests, splits, grid, rag, ragphase,
#   rag0, read, readprof (with ncu), engineread, tileslast, final2, rag09, check17, diag18, check18, final18, warps18, bs32, rag32, tests, regs19, diag19, final19, tile16, w16, ahead, ahead2, final20, rag20, ahead4, next21, check22, check22b, rag22, ttft22, ncu22, next23, final23, dyn24, prefill24, final24, gemm24, next25, gemv27, gemv28, gemv29, gemm30, next31, next32, next33, next33b, next33c, next33d, next33e, next34, rag34, next35, next35b, next35c, next36, next36a, next37, next37b, next38, next38b, next38c, next39, next39b, next39c, next39d, next39e, next40, next41, next41b, next41c, next41d, next41e, next41f, next42, next45, next46, next47, next48, next49, next50, next51, next52, next53, next54, next55, next56, next57, next58, next59, next60, next61, next62, next63, next64, next65, next66, next67, next68, next69, next70, next71, next72, next72b, next73, next74, next75, next76, next77, next78, next78b, next78c, next79, next80, next81, next81b, next81c, next82, next82b, next82c, next82d, next83, next83b, next84, next85, next85b, next86, next87, next87b, next88, next90, next91, next93, next93b, engine21, engine, pending, final, ttft1, probe or hybrid, or several joined by commas
set -u
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 GIT_SHA=${GIT_SHA:-unknown}
[[ -d .whl ]] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
# NOTE: compiled kernels and autotune results (Triton's cache; fla autotunes 35-55 s per dtype on a fresh machine)
# and torch.compile's cache, kept in a carried folder: a machine given back after 30 s idle starts warm next call.
# Back here: copy <files_at>/gpu_cache.t?z.* (xz, or gzip where the machine has no xz) into an emptied .gpu_cache_tgz/
# and carry it with .whl and bench/data (compressed, it fits the 64 MiB a call carries); the logs and results come back as one results.tgz (8 files at most come back).
# NOTE: xz-compressed (gpu_cache.txz.*: 21 MB where gzip took 57), read through Python's lzma, which needs no xz tool;
# gzip parts (gpu_cache.tgz.*) of earlier calls still read
if compgen -G ".gpu_cache_tgz/gpu_cache.txz.*" >/dev/null; then
    cat .gpu_cache_tgz/gpu_cache.txz.* | python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall()"
elif compgen -G ".gpu_cache_tgz/gpu_cache.tgz.*" >/dev/null; then
    cat .gpu_cache_tgz/gpu_cache.tgz.* | tar xz
fi
export TRITON_CACHE_DIR=$PWD/.gpu_cache/triton TORCHINDUCTOR_CACHE_DIR=$PWD/.gpu_cache/inductor
export TRITON_CACHE_AUTOTUNING=1  # autotune results kept on disk with the kernels
mkdir -p "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR"
step() {  # step NAME LIMIT_S command...: run it with a limit, keep its log, show its end
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T))"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "rc=$? ($(date +%T))"
    tail -n 30 "$OUT/$name.log"
}
# A/B parts: .base's tree (carried; BASE_SHA names its results) beside this one
BASE_ENV="env PYTHONPATH=/tmp/site:$PWD/.base GIT_SHA=${BASE_SHA:-base}"
TTFT_8X2048="bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3 --block-size 32"
ttft_ab() {  # ttft_ab LIMIT_S: the cached 8 x 2,048 row at block size 32, .base's tree and this one alternated twice
    for round in 1 2; do
        step ttft_base_$round "$1" $BASE_ENV python3 .base/$TTFT_8X2048 --tag=-base-$round
        step ttft_new_$round "$1" python3 $TTFT_8X2048 --tag=-new-$round
    done
}
part=${1:-all}  # one part, or several: hybrid,host
want() { [[ ",$part," == *",$1,"* ]]; }
engine_decode() {  # engine_decode NAME LIMIT base|new OUT_JSON [VAR=VALUE...]: gpu_engine --decode-only's default schedule
    # (DECODE_QUICK) in .base's tree or this one
    local name=$1 limit=$2 tree=$3 out=$4
    shift 4
    if [[ $tree == base ]]; then
        step "$name" "$limit" $BASE_ENV DECODE_QUICK=1 "$@" python3 .base/bench/gpu_engine.py --decode-only --out "$out"
    else
        step "$name" "$limit" env DECODE_QUICK=1 "$@" python3 bench/gpu_engine.py --decode-only --out "$out"
    fi
}
if want ops; then  # after a kernel change: the GPU tests, the op's validation, the short-prefill op bench
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
    step op_validation 120 python3 bench/gpu_ops.py --only __none__ --out "$OUT"
    step short_prefill 240 python3 bench/gpu_short_prefill.py
fi
if want ttft; then  # the cached-prompt TTFT grid and the RAG bench, with the tests first (one call)
    step gpu_tests 110 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
    step op_validation 90 python3 bench/gpu_ops.py --only __none__ --out /tmp/gpu_ops  # its log says enough
    step ttft_grid 160 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 512,1024,2048,4096 \
        --ks 1,2,4,8 --repeats 2
    step rag 200 python3 bench/rag.py --device cuda --llama3-8b-shape --samples 64 --max-num-seqs 32 \
        --max-num-batched-tokens 8192
fi
RAG="python3 bench/rag.py --device cuda --llama3-8b-shape --samples 64"
if want grid; then  # the TTFT grid alone (tests and op validation run in an earlier call of the same tree)
    step ttft_grid 170 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 512,1024,2048,4096 \
        --ks 1,2,4,8 --repeats 2
fi
if want ragphase; then  # where a step's time goes per span policy (reuse 0.5): schedule, prepare, execute, postprocess
    step rag_phases 200 $RAG --reuse 0.5 --systems inline,isps,barrier --max-num-seqs 32 --max-num-batched-tokens 8192 \
        --tag=-phases
fi
if want rag; then  # the RAG table alone: 6 systems x reuse 0 / 0.5 / 0.9, and the ceiling
    step rag 330 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
fi
if want rag0; then  # reuse 0 again (vanilla_prefix, inline, isps): run-to-run variation beside the table's ratios
    for run in 2 3; do
        step "rag_reuse0_run$run" 120 $RAG --reuse 0 --systems vanilla_prefix,inline,isps --max-num-seqs 32 \
            --max-num-batched-tokens 8192 --tag="-reuse0-run$run"
    done
fi
HYBRID="python3 bench/hybrid_checkpoints.py --gpu --num-layers 8 --prefill-len 2048 --decode-tokens 32"
if want splits; then  # the short-prefill read's split count past 32 (issue 10's cached TTFT: attention ~2.4 of 7.4 ms)
    step short_prefill_splits 200 python3 bench/gpu_short_prefill.py --splits
fi
if want hybrid; then  # issue 11: the fla path's GPU test (fla autotunes ~35 s per dtype on a fresh machine),
    # then the side by side with its device and host profiles (where the prefill's host time goes)
    step gpu_tests 170 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step hybrid_gpu 130 $HYBRID --skip-savings --profile
fi
if want host; then  # issue 10: where a cached prompt's TTFT goes on the H200 (sections, cProfile), then
    # the 8 x 2048 row under the profiler
    step host_ttft 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --profile
    step ttft_8x2048 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
fi
if want hostdiag; then  # issue 10: what ttft_spans adds over host_ttft (~1.2 ms at 4a3495f): torch's intra-op threads
    # (host_ttft sets 1, ttft_spans keeps torch's 16) and a first prompt on fresh blocks (ttft_spans resets first)
    for opts in "" "--threads 16" "--fresh" "--threads 16 --fresh"; do
        step "host_ttft${opts// /}" 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 10 $opts
    done
fi
if want offload; then  # issue 10: host tier vs recompute vs copy-rerotate on a cache of 1/4 of the working set
    step offload 200 $RAG --offload --reuse 0.9 --max-num-seqs 4 --max-num-batched-tokens 4096 --tag=-offload
fi
if want readprof || want read; then  # issues 10/13: where the split-KV read (short prefill, decode) loses time
    step read_profile 200 python3 bench/gpu_read_profile.py --out "$OUT" --cases "${READ_CASES:-short16k,b1x8k,b64x8k,b1x576w8k,b64x576w8k}"
fi
if want readprof; then  # ... and the same kernels under ncu
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    for c in short16k b1x8k b64x8k sdpa_b1x8k; do
        step "ncu_$c" 90 "$NCU" --clock-control none --set detailed --profile-from-start off --launch-count 4 \
            python3 bench/gpu_read_profile.py --case "$c" --calls 4
    done
fi
if want engineread; then  # issues 10/13: the engine's short read on its own arguments (graph bucket, eager) against
    # the op bench's
    step engine_read 200 python3 bench/gpu_engine_read.py --out "$OUT"
fi
if want tileslast; then  # issues 10/13 after the split launches took tiles last: the engine's read, the op's
    # reads at their defaults, the GPU tests, the cached 8 x 2048 TTFT
    step engine_read 150 python3 bench/gpu_engine_read.py --out "$OUT"
    step read_profile 120 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT" --cases short16k,b1x8k,b64x8k
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step ttft_8x2048 90 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
fi
if want final2; then  # this stop's last call: the GPU tests, the op's reads at their defaults, the engine's read,
    # the cached 8 x 2048 TTFT (its host sections and the grid's row), the RAG table at reuse 0 and 0.5
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step read_profile 90 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT"
    step engine_read 120 python3 bench/gpu_engine_read.py --out "$OUT"
    step host_ttft 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20
    step ttft_8x2048 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
    step rag 230 $RAG --reuse 0,0.5 --systems vanilla_prefix,barrier,inline,isps --max-num-seqs 32 \
        --max-num-batched-tokens 8192
fi
if want rag09; then  # the RAG table's reuse-0.9 rows alone (carry only bench/data/rag-64-reuse0.9 when the cache is big)
    step rag_reuse09 200 env TORCH_LOGS=recompiles $RAG --reuse 0.9 --systems vanilla_prefix,barrier,inline,isps --max-num-seqs 32 \
        --max-num-batched-tokens 8192 --tag=-reuse09  # TORCH_LOGS: why torch.compile compiled again
fi
if want check17; then  # what stop 17 left unmeasured: the GPU tests (every engine start now warms up the attention
    # variants), isps at reuse 0.9 (no compile in the run expected), the cached TTFT with the per-segment digest
    # (carry .whl, .gpu_cache_tgz and bench/data/rag-64-reuse0.9 only: the whole bench/data passes 64 MiB with the cache)
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step rag_reuse09 200 $RAG --reuse 0.9 --systems vanilla_prefix,barrier,inline,isps --max-num-seqs 32 \
        --max-num-batched-tokens 8192 --tag=-reuse09
    step host_ttft 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20
    step ttft_8x2048 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
fi
if want diag18; then  # issue 10: why a first prompt after the documents' prefill holds ~1.6 ms more host time than a next
    # question (ttft_spans 10.3 ms driven directly against host_ttft's 8.7 at 05fac4e). At bc9642e only fresh + 16 torch
    # threads slowed every host section ~1.5x: OpenMP workers spinning beside the host thread? PASSIVE makes them sleep.
    step host_ttft_fresh_t16 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 10 --fresh --threads 16 --profile
    step host_ttft_fresh_t16_passive 60 env OMP_WAIT_POLICY=PASSIVE python3 bench/host_ttft.py --device cuda \
        --llama3-8b-shape --runs 10 --fresh --threads 16
    step host_ttft_fresh 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 10 --fresh
    step ttft_8x2048_omp1 70 env OMP_NUM_THREADS=1 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape \
        --doc-tokens 2048 --ks 8 --repeats 3
fi
if want check18; then  # after the staged graph inputs and one torch thread on the loop thread: the GPU tests, the cached
    # 8 x 2048 TTFT (torch's default threads: the engine now drops its own to 1), host_ttft, the RAG table at reuse 0 / 0.5
    # (carry .whl, .gpu_cache_tgz, bench/data/rag-64-reuse0.0 and bench/data/rag-64-reuse0.5)
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step ttft_8x2048 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
    step host_ttft 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20
    step rag 260 $RAG --reuse 0,0.5 --systems vanilla_prefix,barrier,inline,isps --max-num-seqs 32 \
        --max-num-batched-tokens 8192
fi
if want final18; then  # this stop's last call: the GPU tests, host_ttft with its profile's callees (where prepare's
    # 0.3 ms goes on this host), the whole TTFT grid
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step host_ttft 70 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --profile
    step ttft_grid 240 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 512,1024,2048,4096 \
        --ks 1,2,4,8 --repeats 2
fi
if want warps18; then  # issues 10/13: the short read and decode 1 x 8k with 8 warps beside 4 (never swept before)
    step read_warps 230 env READ_SWEEP=warps python3 bench/gpu_read_profile.py --out "$OUT" --cases short16k,short16k_cold,b1x8k
fi
if want bs32; then  # next: block size 32 beside 16 (on the CPU the cached 8 x 2048 prompt's host part fell 1.00 -> 0.68 ms,
    # 4daba6c): the TTFT grid's 2048 / 4096 rows and host_ttft; rag32 has the RAG table (a passage pads ~16 tokens, not ~8)
    for b in 16 32; do
        step "ttft_b$b" 120 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048,4096 \
            --ks 4,8 --repeats 3 --block-size $b
        step "host_ttft_b$b" 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size $b
    done
fi
if want rag32; then  # the RAG table at block size 32 (carry bench/data/rag-64-reuse0.0 and rag-64-reuse0.5)
    step rag_b32 230 $RAG --reuse 0,0.5 --systems vanilla_prefix,barrier,inline,isps --max-num-seqs 32 \
        --max-num-batched-tokens 8192 --block-size 32 --tag=-b32
fi
if want tests; then  # the GPU tests alone
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
fi
if want regs19; then  # issues 10/13: registers capped (MAX_REGS) so 2 programs of 8 warps share an SM (the short read's
    # 4-warp default takes 255 registers and spills; ptxas offline)
    step read_regs 200 env READ_SWEEP=regs python3 bench/gpu_read_profile.py --out "$OUT" --cases short16k,short16k_cold,b1x8k
fi
if want diag19; then  # issue 10: a first prompt right after its documents' prefill reads 63 us a layer where a next
    # question reads 53 (ttft_spans-2f1f877-cuda-b32, GPU busy 7.3 against 6.7 ms): the GPU's clocks after a heavy
    # prefill? The cached 8 x 2048 prompt at block size 32 straight after the prefill and 200 ms later, with the SM clock,
    # power and throttle reasons sampled every 10 ms beside it; then the RAG table at block size 32
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,clocks_throttle_reasons.active --format=csv \
        -lms 10 >"$OUT/clocks_ttft.csv" 2>&1 &
    smi=$!
    for settle in 0 200; do
        step "ttft_b32_settle$settle" 120 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 \
            --ks 8 --repeats 3 --block-size 32 --settle-ms $settle
    done
    kill $smi
    step rag_b32 230 $RAG --reuse 0,0.5 --systems vanilla_prefix,barrier,inline,isps --max-num-seqs 32 \
        --max-num-batched-tokens 8192 --block-size 32 --tag=-b32
fi
if want final19; then  # this stop's last call: the short read's register cap on every short-read case beside the
    # 4-warp default it replaced, its ncu profile (stall reasons), then the cached grid rows (2048 / 4096 x 4 / 8) and host_ttft at block sizes 16 and 32
    step short_prefill_regs 150 python3 bench/gpu_short_prefill.py --regs
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    step ncu_short16k 120 "$NCU" --clock-control none --set detailed --section WarpStateStats --profile-from-start off \
        --launch-count 2 python3 bench/gpu_read_profile.py --case short16k --calls 2
    for b in 16 32; do
        step "ttft_b$b" 120 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048,4096 \
            --ks 4,8 --repeats 3 --block-size $b
        step "host_ttft_b$b" 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size $b
    done
fi
if want tile16; then  # issues 10/13: the short read's 32-key tiles spill at 128 registers (ncu: 28,672 spill requests,
    # ncu_short16k of final19); 16-key tiles fit without spilling (ptxas offline): the op bench's reads, then every
    # short-read case beside the default
    step read_tile16 150 env READ_SWEEP=tile16 python3 bench/gpu_read_profile.py --out "$OUT" --cases short16k,short16k_cold
    step short_prefill_tile16 150 python3 bench/gpu_short_prefill.py --sweep-json \
        '[{"TILE_N": 16, "num_stages": 2}, {"TILE_N": 16, "num_stages": 3}]'
fi
if want ahead; then  # TABLE_AHEAD, the next tile's block ids read an iteration ahead so that Triton's own
    # pipelining overlaps the copies with the math (with part tests first after a kernel change)
    step read_ahead 240 env READ_SWEEP=ahead python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases short16k,short16k_cold,b1x8k,b64x8k
fi
if want ahead2; then  # around part ahead's best short read (TABLE_AHEAD, 64-key tiles, 8 warps, 3 stages, 16 splits,
    # no register cap: 0.0430 ms against the default's 0.0528), then the candidates at every short-prefill case with
    # their splits from programs per SM (1 or 2, where pick_config aims at 4)
    step read_ahead2 170 env READ_SWEEP=ahead2 python3 bench/gpu_read_profile.py --out "$OUT" --cases short16k,short16k_cold
    A='"TABLE_AHEAD": true, "num_warps": 8, "MAX_REGS": null'
    step short_prefill_ahead 280 python3 bench/gpu_short_prefill.py --sweep-json "[
        {$A, \"TILE_N\": 64, \"num_stages\": 3, \"PROGRAMS_PER_SM\": 1},
        {$A, \"TILE_N\": 64, \"num_stages\": 3, \"PROGRAMS_PER_SM\": 2},
        {$A, \"TILE_N\": 64, \"num_stages\": 4, \"PROGRAMS_PER_SM\": 1},
        {\"TABLE_AHEAD\": true, \"num_warps\": 8, \"MAX_REGS\": 128, \"TILE_N\": 32, \"num_stages\": 3,
         \"PROGRAMS_PER_SM\": 2}]"
fi
if want final20; then  # the short read's new default (TABLE_AHEAD, 64-key tiles, one program per SM): the GPU tests,
    # every short-prefill case beside the last default, then the engine: the cached grid rows (2048 / 4096 x 4 / 8)
    # and host_ttft at block sizes 16 and 32
    step gpu_tests 150 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step short_prefill_last 100 python3 bench/gpu_short_prefill.py --sweep-json \
        '[{"TABLE_AHEAD": false, "TILE_N": 32, "num_stages": 2, "MAX_REGS": 128, "PROGRAMS_PER_SM": 4}]'
    for b in 16 32; do
        step "ttft_b$b" 100 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048,4096 \
            --ks 4,8 --repeats 3 --block-size $b
        step "host_ttft_b$b" 50 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size $b
    done
fi
if want rag20; then  # the RAG table's span policies (reuse 0 and 0.5, block size 16) after the short read's
    # TABLE_AHEAD default (a final part is a short read over its passages), then decode over the engine's short
    # contexts with TABLE_AHEAD (576 keys in 8k-wide tables, batch 1 and 64) and host_ttft
    step rag20 270 $RAG --reuse 0,0.5 --systems vanilla_prefix,barrier,inline,isps --max-num-seqs 32 \
        --max-num-batched-tokens 8192 --tag=-rag20
    step read_ahead3 100 env READ_SWEEP=ahead3 python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b64x576w8k,b1x576w8k
    step host_ttft_b16 50 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20
fi
if want ahead4; then  # decode's TABLE_AHEAD candidates at every decode case, long and short contexts
    step read_ahead4 150 env READ_SWEEP=ahead4 python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b1x8k,b64x8k,b1x576w8k,b64x576w8k
fi
if want next21; then  # the GPU tests with decode's TABLE_AHEAD default (cc8892d) and K/V written in one copy
    # (51f2f83), neither run on a GPU before, on a machine with no Triton cache (fla autotunes: 300 s); then the
    # cached 8 x 2048 TTFT at block sizes 16 and 32 and the host sections of a next question at 32
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    for b in 16 32; do
        step "ttft_b$b" 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
            --repeats 3 --block-size $b
    done
    step host_ttft_b32 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
fi
if want check22; then  # K and V written by one kernel (index_put_, e047702) in the GPU tests (the hybrid's bfloat16
    # case left out: fla autotunes it for minutes on a machine without its cache), the cached 8 x 2048 TTFT at block
    # sizes 32 and 16 and the host sections at 32; then the engine's decode and prefill as far as the call allows
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    for b in 32 16; do
        step "ttft_b$b" 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
            --repeats 3 --block-size $b
    done
    step host_ttft_b32 45 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
    step gpu_engine 190 python3 bench/gpu_engine.py --out "$OUT/gpu_engine_${GIT_SHA}_h200.json"
fi
if want check22b; then  # K and V written by one compiled kernel (Kernels.write_kv: Inductor's index_put in place),
    # after check22 found index_put_'s eager path at 1 + 2 launches a layer (0.22 ms a prompt against index_copy's
    # 0.18); the float32 engine's warm-up fixed (the short read's tiles were too big in float32): the engine bench
    step gpu_tests 150 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step ttft_b32 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
    step host_ttft_b32 45 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
    step gpu_engine 300 python3 bench/gpu_engine.py --out "$OUT/gpu_engine_${GIT_SHA}_h200.json"
fi
if want rag22; then  # the RAG table's span policies at reuse 0 and 0.5 after decode's TABLE_AHEAD and the compiled
    # K/V write (last run at 366e681)
    step rag22 280 $RAG --reuse 0,0.5 --systems vanilla_prefix,barrier,inline,isps --max-num-seqs 32 \
        --max-num-batched-tokens 8192 --tag=-rag22
fi
if want ttft22; then  # the cached 8 x 2048 TTFT at block sizes 32 and 16 with ttft_spans' new column: 7 next
    # questions through generate, unprofiled (the first prompt straight after its documents' prefill runs on a GPU
    # the prefill left power-capped: bench/HISTORY.md, diag19)
    for b in 32 16; do
        step "ttft_b$b" 90 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
            --repeats 3 --block-size $b
    done
fi
if want ncu22; then  # the short read and decode 1 x 8k at their defaults (TABLE_AHEAD) under ncu's full set (warp
    # states, source counters): where the short read's 42 us go against K and V read once at the copy rate (25 us)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    step ncu_short16k 80 "$NCU" --clock-control none --set full --profile-from-start off --launch-count 2 \
        -k regex:_rope_paged_attention_kernel python3 bench/gpu_read_profile.py --case short16k --calls 2
    step ncu_b1x8k 70 "$NCU" --clock-control none --set full --profile-from-start off --launch-count 2 \
        -k regex:_rope_paged_attention_kernel python3 bench/gpu_read_profile.py --case b1x8k --calls 2
fi
if want next23; then  # next (not yet run): the key loop with fewer instructions (a key's offset within its block
    # and its table entry computed once where tiles start on a block, no bounds checks in the unmasked body, the
    # scale fused with the max's subtraction, unsplit decode capped at 128 registers; bench/ptxas_stats.py: the
    # short read's body 667 -> 511 SASS instructions an iteration, decode's 413 -> 286). Compare with the defaults
    # before (read_profile_{f557ac8,316494b}: short16k 0.0430 ms; b1x8k 19.3 us, b64x8k 0.535 ms, b1x576w8k 8.8 us,
    # b64x576w8k 47.6 us) and the TTFT of check22b / ttft22. If a case is slower, the register cap is the first
    # suspect (DECODE_MAX_REGS), then the body's unchecked loads (IS_WHOLE)
    step gpu_tests 150 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step read_defaults 120 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT"
    step ttft_b32 90 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
    step host_ttft_b32 45 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
fi  # then engine21 in a call of its own: a machine without the carried cache compiles everything cold
if want final23; then  # next23's GPU tests (cut at 150 s there, compiling cold: 5 passed), then the engine bench
    step gpu_tests 220 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step gpu_engine 320 python3 bench/gpu_engine.py --out "$OUT/gpu_engine_${GIT_SHA}_h200.json"
fi
if want dyn24; then  # compile_kernel's automatic dynamic shapes (the model's sizes constant, so Inductor can reduce
    # the hidden size in one pass) against every size symbolic (MINIPIC_COMPILE_DYNAMIC=all, the behaviour before):
    # the cached 8 x 2048 TTFT's forward and the engine's decode with its kernel profile, side by side
    B32="--device cuda --llama3-8b-shape --runs 20 --block-size 32"
    step host_ttft_all 90 env MINIPIC_COMPILE_DYNAMIC=all python3 bench/host_ttft.py $B32
    step host_ttft_auto 90 python3 bench/host_ttft.py $B32
    step gpu_engine_all 220 env MINIPIC_COMPILE_DYNAMIC=all python3 bench/gpu_engine.py \
        --out "$OUT/gpu_engine_${GIT_SHA}_h200_all.json"
    step gpu_engine_auto 220 python3 bench/gpu_engine.py --out "$OUT/gpu_engine_${GIT_SHA}_h200.json"
fi
if want prefill24; then  # issue 13's engine prefill against HF (4 x 2048, 1 x 8k / 16k / 32k) with the model's sizes
    # constant in compile_kernel (dyn24: 4 x 2048 1.10x -> 1.20x HF), beside every size symbolic, one call
    step prefill_auto 250 python3 bench/gpu_engine_prefill.py --out "$OUT/gpu_engine_prefill_${GIT_SHA}_h200.json"
    step prefill_all 250 env MINIPIC_COMPILE_DYNAMIC=all python3 bench/gpu_engine_prefill.py \
        --out "$OUT/gpu_engine_prefill_${GIT_SHA}_h200_all.json"
fi
if want final24; then  # this stop's last call: the GPU tests after compile_kernel's automatic dynamic shapes (CUDA
    # graphs capture its static-then-symbolic entries), then the cached 8 x 2048 TTFT direct and through generate
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step host_ttft_b32 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
    step ttft_b32 200 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
fi
if want gemm24; then  # issue 13: the decode step's matmuls alone, as the engine calls them and with the operands
    # swapped (another shape for cuBLAS's choice; no split-K reduction kernel?), at 1 / 17 / 32 / 64 rows
    step gemm_shapes 150 python3 bench/gpu_gemm_shapes.py --out "$OUT/gpu_gemm_shapes_${GIT_SHA}_h200.json"
fi
if want next25; then  # run at 6e5cb77: the GPU tests, the read defaults, the decode matmuls by their kernels' device
    # time, the TTFT (its MERGE_LAST sweep and part pdl26 ran options removed after they measured slower)
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step read_defaults 90 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT"
    step gemm_shapes 100 python3 bench/gpu_gemm_shapes.py --out "$OUT/gpu_gemm_shapes_${GIT_SHA}_h200.json"
    step host_ttft_b32 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
fi
if want gemv27; then  # one-row matmuls as Inductor reductions (and SiLU-up fused into gate_up's) and under max-autotune,
    # beside cuBLAS: qkv read at 0.77 of the copy rate and o at 0.65 at next25
    step gemm_rows1 300 python3 bench/gpu_gemm_shapes.py --rows 1 --out "$OUT/gpu_gemm_shapes_${GIT_SHA}_rows1_h200.json"
fi
if want gemv28; then  # batch-1 decode with the projections that Inductor's one-row reduction beats routed to it
    # (models/routed_linear.py, timed at start-up) beside cuBLAS everywhere, each in its own process; the GPU tests
    step gpu_tests 240 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step decode_cublas 130 env MINIPIC_ONE_ROW_MATMUL=0 python3 bench/gpu_engine.py --decode-only \
        --out "$OUT/gpu_decode_${GIT_SHA}_cublas.json"
    step decode_routed 170 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
fi
if want gemv29; then  # gemv28 again in the other order (its GPU test's code check mended: a short reduction is persistent)
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step decode_routed 120 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
    step decode_cublas 100 env MINIPIC_ONE_ROW_MATMUL=0 python3 bench/gpu_engine.py --decode-only \
        --out "$OUT/gpu_decode_${GIT_SHA}_cublas.json"
fi
if want gemm30; then  # run at abc65f6 (rows 64 alone, directly): batch-64 decode's matmuls under max-autotune
    # (Triton's matmul templates against cuBLAS: qkv read at 0.76 of the copy rate, o 0.69, down 0.80 at next25)
    step gemm_rows64 400 python3 bench/gpu_gemm_shapes.py --rows 17,32,64 \
        --out "$OUT/gpu_gemm_shapes_${GIT_SHA}_rows64_h200.json"
fi
if want next31; then  # next (not yet run): the GPU tests (the one-kernel K/V write of 0db0130 among them), then the full
    # engine bench at HEAD: prefill and decode against HF in one call, batch-1 decode through the one-row route
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step gpu_engine 380 python3 bench/gpu_engine.py --out "$OUT/gpu_engine_${GIT_SHA}_h200.json"
fi
if want next32; then  # the GPU tests (q-RoPE + the K/V write as one combo kernel), decode
    # b1 / b64 with the b1 profile (next31: 219 tok/s = 0.78, silu 1.43 us and q-RoPE 1.41 us a layer), the cached TTFT
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step decode_routed 150 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
    step ttft_b32 200 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
fi
if want next33; then  # the GPU tests left unconfirmed at 99f00ed (cut by a cold compile), then the RAG table at HEAD
    # (last at c370a64)
    step gpu_tests_kernels 120 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging \
        --tb=short -k "kernel or argmax_rows"
    step rag 330 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
fi
if want next33b; then  # decode b1 / b64 with the wide-search candidate beside the tuned reduction (the probe's choice
    # flipped with the tuning at 99f00ed: qkv's reduction 511 us a pass against 413-427 in four earlier calls), then
    # the offload table at HEAD. Ran at 56207fd: both cut (220 s, 200 s): the wide search's cold tuning held the
    # engine's start-up past 3.5 min, and the candidate was removed unmeasured
    step decode_routed 220 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
    step offload 200 $RAG --offload --reuse 0.9 --max-num-seqs 4 --max-num-batched-tokens 4096 --tag=-offload
fi
if want next33c; then  # the cached TTFT at block size 32 (through generate and driven directly), the TTFT grid and
    # the span-scaling bench at HEAD
    step ttft_b32 150 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
    step ttft_grid 170 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 512,1024,2048,4096 \
        --ks 1,2,4,8 --repeats 2
    step span_scaling 110 python3 bench/span_scaling.py --device cuda --llama3-8b-shape --span-tokens 2048 \
        --ns 1,2,4,8,16 --repeats 2
fi
if want next33d; then  # decode b1 / b64 at HEAD (the route's two tuned candidates as at 99f00ed), the offload table
    step decode_routed 180 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
    step offload 300 $RAG --offload --reuse 0.9 --max-num-seqs 4 --max-num-batched-tokens 4096 --tag=-offload
fi
if want next33e; then  # ran at 19a158b (reverted at f9ccd4c): the compiled greedy argmax and next slots, their GPU
    # tests (one failed: struct.error staging a mixed greedy/sampled burst), then decode b1 / b64
    step gpu_tests_step_ops 150 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging \
        --tb=short -k "argmax or step_ops or graph_replay"
    step decode_routed 120 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
fi
if want next34; then  # next session's first call: the mixed greedy/sampled burst on a graph engine (is next33e's
    # struct.error the eager sampler's too?), its trace, then every GPU test but the bf16 hybrid
    step gpu_tests_mixed 90 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging \
        --tb=long -k "greedy_and_sampled"
    step mixed_trace 60 python3 bench/debug/mixed_sampling.py float32
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16 and not greedy_and_sampled"
    # the one-row probe's new rule (a candidate unless cuBLAS wins by 2%, 3c5afae): decode b1 / b64
    step decode_routed 150 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
fi
if want next35; then  # (ran at 3dad8ca; the fused path removed at the next stop, kept at a008f36) the fused
    # add + RMSNorm + projection at batch 1 (models/fused_one_row.py): its GPU tests,
    # every other GPU test but the bf16 hybrid, decode b1 / b64 with it and without it (MINIPIC_FUSED_ONE_ROW=0) in
    # one call, then the RAG table with isps's new default (no cap ahead) beside the 256 cap
    step gpu_tests 240 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "not bfloat16"
    step decode_fused 150 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_fused.json"
    step decode_unfused 150 env MINIPIC_FUSED_ONE_ROW=0 python3 bench/gpu_engine.py --decode-only \
        --out "$OUT/gpu_decode_${GIT_SHA}_unfused.json"
    step rag 300 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
fi
if want next35b; then  # (ran at 7bfa47a, 43.3 µs a call; removed, see next35) the fused kernel in one pass
    # with it and without it
    step gpu_tests_fused 120 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging \
        --tb=short -k "fused"
    step decode_fused 150 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_fused.json"
    step decode_unfused 150 env MINIPIC_FUSED_ONE_ROW=0 python3 bench/gpu_engine.py --decode-only \
        --out "$OUT/gpu_decode_${GIT_SHA}_unfused.json"
fi
if want next35c; then  # (ran at a008f36; removed, see next35) the fused kernel with one-stage configs, eviction hints
    step gpu_tests_fused 120 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging \
        --tb=short -k "fused"
    step decode_fused 150 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_fused.json"
    step decode_unfused 150 env MINIPIC_FUSED_ONE_ROW=0 python3 bench/gpu_engine.py --decode-only \
        --out "$OUT/gpu_decode_${GIT_SHA}_unfused.json"
fi
if want next36; then  # next session's first call: the RAG table with each system's execute time by step kind (decode,
    # graph prefill, eager): where position-free loses its ~3% to vanilla at reuse 0 (pic_disabled, same tokens),
    # what an eager step costs, and isps capped at 1,024 tokens ahead (modeled 33.78 samples/s against 31.21 uncapped
    # at reuse 0.5, sched_replay-0baf89c-cpu-cost-model-caps-*.json); then decode b1 / b64 under the probe's 5% margin
    step rag 450 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
    step decode_routed 150 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
fi
if want next37; then  # position-free decode at the RAG table's decode shape (32 x 2,200 keys in 8k-wide tables):
    # its decode steps took 8.9 ms against keys stored rotated's 7.7 (rag-dbcc69c-cuda.md, reuse 0); the op's
    # defaults, keys as stored (its own config), SDPA, and a sweep: REL_ROPE, the register cap, splits
    step read_rag 400 env READ_SWEEP=rel37 python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b32x2200w8k_cold,b64x576w8k,b1x8k,b64x8k
fi
if want next37b; then  # split decode at 3 stages up to 4 splits (the RAG table's decode step: 82.6 us a layer against
    # 134.5 in next37): the op's defaults (each checked against the torch path), the RAG table, decode b1 / b64
    step read_defaults 90 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b32x2200w8k_cold,b1x576w8k,b64x576w8k,b1x8k
    step rag 200 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
    step decode_routed 100 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_routed.json"
    # batch-64 decode's matmuls (issue 13: 0.675 of the roofline): cuBLAS gives qkv / o 48 / 32 tiles of 128 columns
    # for 132 SMs; a Triton split-K matmul beside it, 16 configs
    step gemm_splitk 150 python3 bench/gpu_gemm_shapes.py --split-k --rows 32,64 \
        --out "$OUT/gpu_gemm_splitk_${GIT_SHA}.json"
fi
if want next38; then  # async scheduling (the next decode burst queued before the last one's tokens are read): the GPU
    # tests, then decode b1 / b64 under each schedule (async and sync, 1 / 8 / 16 steps a visit) in one engine
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step decode_async 200 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_async.json"
fi
if want next38b; then  # the RAG table and the cached 8 x 2048 TTFT through generate, with async scheduling on; decode
    # b1 / b64 again with the batch-64 profile (where its step goes now)
    step rag 330 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
    step ttft_8x2048 100 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
    step decode_async 120 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_async.json"
fi
if want next38c; then  # after the host-tier fix for continuations: the GPU tests, the cached 8 x 2048 TTFT at block size
    # 32 (host sections, then through generate), decode schedules a third time
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step host_ttft_b32 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
    step ttft_8x2048_b32 100 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
    step decode_async 120 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_async.json"
fi
if want next39; then  # the greedy argmax inside the graphs on bf16 logits and the one-launch advance (issue 13's
    # batch 64); a mixed step's decodes read apart from its prefill (the op's decode hint): the GPU tests, the op side
    # by side, decode schedules
    step gpu_tests 240 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step mixed_step 90 python3 bench/gpu_mixed_step.py --out "$OUT"
    step decode_async 170 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_async.json"
fi
if want next39b; then  # decode at the session's first commit (.base: its tree, carried) beside this tree's
    step decode_async 200 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_async.json"
    if [[ -d .base ]]; then
        step decode_base 200 env PYTHONPATH=/tmp/site:$PWD/.base python3 .base/bench/gpu_engine.py --decode-only \
            --out "$OUT/gpu_decode_base.json"
    fi
fi
if want next39c; then  # the GPU tests, the RAG table (mixed steps' decodes read apart)
    step gpu_tests 220 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step rag 330 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
fi
if want next39d; then  # the RAG table again on a warm cache, copy-rerotate left out (next39c's ran out of time)
    step rag 400 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 \
        --systems vanilla_prefix,pic_disabled,barrier,inline,isps
fi
if want next39e; then  # next39b's two trees in the other order (the first process of a call ran slower kernels?)
    step decode_base 200 env PYTHONPATH=/tmp/site:$PWD/.base python3 .base/bench/gpu_engine.py --decode-only \
        --out "$OUT/gpu_decode_base.json"
    step decode_async 200 python3 bench/gpu_engine.py --decode-only --out "$OUT/gpu_decode_${GIT_SHA}_async.json"
fi
if want next41; then  # a prompt's missing spans as one span prefill (705fe23): the RAG table (copy-rerotate left
    # out), the cached 8 x 2048 TTFT at block size 32 (host sections, then through generate), the GPU tests
    step rag 290 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 \
        --systems vanilla_prefix,pic_disabled,barrier,inline,isps
    step host_ttft_b32 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
    step ttft_8x2048_b32 100 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
    step gpu_tests 110 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
fi
if want next41e || want next41f; then  # the copy-rerotate baseline after its copies are published (9d81f86; next41e),
    # and with its copies batched (e891a22; next41f), beside vanilla
    step rag_rerotate 240 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 --systems vanilla_prefix,copy_rerotate \
        --tag=-rerotate
fi
if want next78; then  # int32 key, value and cos/sin offsets in the read kernel (INT32_OFFSETS; the decode loop 307 -> 269
    # SASS instructions an iteration, the short read's 491 -> 459): the GPU tests, the op's reads beside .base (3cb8e38,
    # the op of e9d10d3; `git archive 3cb8e38 minipic_lite ops bench pyproject.toml | tar x -C .base`) alternated twice,
    # and (next78b) the cached 8 x 2,048 TTFT once in each tree
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    cases=b1x8k,b1x8k_cold,b1x576w8k,b64x576w8k,b32x2200w8k_cold,short16k
    for round in 1 2; do
        step "read_base_$round" 60 $BASE_ENV READ_SWEEP=0 python3 .base/bench/gpu_read_profile.py --out /tmp/rb$round \
            --cases $cases
        step "read_new_$round" 60 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT" --cases $cases
    done
fi
if want next90; then  # (next89 at f4d261f, H100: KV_PACK swept, no case faster; removed) the split merge's dims cut over
    # programs (MERGE_D_CHUNK) and its warps at the batch-1 decodes and the short read, warm and cold, SDPA beside
    step read_merge 240 env READ_SWEEP=merge python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b1x8k,b1x8k_cold,b1x576w8k,short16k
fi
if want next93; then  # issue 10 at 937d1f2's engine (no change on the GPU path since next91): the cached 8 x 2,048 TTFT
    # as a first prompt straight after its documents' prefill, then 200 ms after it (diag19: the prefill runs under the
    # power cap, and the short read, latency-bound, slows with the clock), each in its own process
    step ttft 240 python3 $TTFT_8X2048 --tag=-next93
    step ttft_settle 150 python3 $TTFT_8X2048 --settle-ms 200 --tag=-next93
fi
if want next93b; then  # the GPU tests (not run at stop 48)
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
fi
if want next91; then  # next90's merge sweep (its default now the 32-dim chunks: chunk 0 with 4 warps is the old one), then
    # (on an H200: issue 10's goal was set there) the cached 8 x 2,048 TTFT once and the engine's decode in one process
    step read_merge 150 env READ_SWEEP=merge python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b1x8k,b1x8k_cold,b1x576w8k,short16k
    step ttft 200 python3 $TTFT_8X2048 --tag=-next91
    cp bench/results/ttft_spans-*next91* "$OUT"/ 2>/dev/null
    engine_decode decode_1 170 new "$OUT/gpu_decode_${GIT_SHA}_next91_1.json"
fi
if want next88; then  # (run at 654e84f on an H100, no H200 came: decode_1 and ttft ran past their limits compiling) next87
    # on a machine with no carried cache (a fresh checkout): the first decode process compiles
    for round in 1 2 3; do
        engine_decode "decode_$round" $((round == 1 ? 160 : 90)) new "$OUT/gpu_decode_${GIT_SHA}_next88_$round.json"
    done
    step gpu_tests_mixed 80 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "mixed_steps"
    step ttft 110 python3 $TTFT_8X2048 --tag=-next88
    cp bench/results/ttft_spans-*next88* "$OUT"/ 2>/dev/null
fi
if want next87b; then  # next87's decode alone (what device time is left): two more processes
    for round in 1 2; do
        engine_decode "decode_$round" 70 new "$OUT/gpu_decode_${GIT_SHA}_next87b_$round.json"
    done
fi
if want next87; then  # the engine's decode in two more processes (next86: batch 64 at 0.739-0.766 of each process's
    # roofline), the GPU test next86 did not reach in its limit, and the cached 8 x 2,048 TTFT once
    for round in 1 2; do
        engine_decode "decode_$round" 70 new "$OUT/gpu_decode_${GIT_SHA}_next87_$round.json"
    done
    step gpu_tests_mixed 60 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "mixed_steps"
    step ttft 100 python3 $TTFT_8X2048 --tag=-next87
    cp bench/results/ttft_spans-*next87* "$OUT"/ 2>/dev/null
fi
if want next86; then  # (run at b3d97df; MINIPIC_PERSISTENT_NORM removed after: no gain) the GPU tests at this tree (stops 41-42 changed the GPU path: one PagedAttention for both families,
    # an eager step's norms through F.rms_norm), then next85b's decode with the norms looped and persistent
    # (MINIPIC_PERSISTENT_NORM=1) alternated twice, then the norm kernels alone (next85's second half)
    step gpu_tests 150 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    for round in 1 2; do
        engine_decode "decode_looped_norm_$round" 90 new "$OUT/gpu_decode_${GIT_SHA}_looped_norm_$round.json"
        engine_decode "decode_persistent_norm_$round" 90 new "$OUT/gpu_decode_${GIT_SHA}_persistent_norm_$round.json" \
            MINIPIC_PERSISTENT_NORM=1
    done
    step norms 60 env GIT_SHA=$GIT_SHA python3 bench/gpu_small_kernels.py --norms-only --tag norms
    cp bench/results/gpu_small_kernels_*_norms.json "$OUT"/ 2>/dev/null
fi
if want next85; then  # (its norm half run in next86 at b3d97df; MINIPIC_PERSISTENT_NORM removed after) decode at 2-8 rows: a pass over the layers at 2 rows through cuBLAS took 1.07-1.31x
    # the one-row reductions' at one row (next83's probe): the product as a reduction laid out so that each weight
    # element serves every row (few_rows_as_reduction) beside cuBLAS, before any engine route
    step gemm_few_rows 200 python3 bench/gpu_gemm_shapes.py --few-rows --rows 2,4,8 \
        --out "$OUT/gpu_gemm_few_rows_${GIT_SHA}_h200.json"
    # the norms as persistent reductions (MINIPIC_PERSISTENT_NORM=1, models/llama.py): their GPU tests, then the
    # kernels alone (looped, persistent, a hand-written Triton kernel) at 1 / 24 / 64 rows
    step gpu_tests_norm 120 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        -k "norm"
    step norms 120 env GIT_SHA=$GIT_SHA python3 bench/gpu_small_kernels.py --norms-only --tag norms
    cp bench/results/gpu_small_kernels_*_norms.json "$OUT"/ 2>/dev/null
fi
if want next85b; then  # (run as next86 at b3d97df; MINIPIC_PERSISTENT_NORM removed after) the engine's decode at batch 1 and 64 with the norms looped (the default) and
    # persistent (MINIPIC_PERSISTENT_NORM=1), alternated
    for round in 1 2; do
        engine_decode "decode_looped_norm_$round" 100 new "$OUT/gpu_decode_${GIT_SHA}_looped_norm_$round.json"
        engine_decode "decode_persistent_norm_$round" 100 new "$OUT/gpu_decode_${GIT_SHA}_persistent_norm_$round.json" \
            MINIPIC_PERSISTENT_NORM=1
    done
fi
if want next84; then  # (run at 0b6a654; the fused write removed after) the fused write where the op gained (next82b: 1 x 8k 17.30 against 18.50 us a
    # layer): the engine's batch-1 decode over 8,192-token prompts without and with MINIPIC_FUSED_WRITE=1, twice
    long=(DECODE_PROMPT_LEN=8192 DECODE_BATCHES=1 BENCH_MAX_MODEL_LEN=16384)
    for round in 1 2; do
        engine_decode "decode8k_separate_$round" 100 new "$OUT/gpu_decode8k_${GIT_SHA}_separate_$round.json" "${long[@]}"
        engine_decode "decode8k_fused_$round" 100 new "$OUT/gpu_decode8k_${GIT_SHA}_fused_$round.json" "${long[@]}" \
            MINIPIC_FUSED_WRITE=1
    done
fi
if want next83b; then  # (run at 9851340) next83's cuBLASLt test took cuBLASLt only within a 2x margin (tiny shapes time
    # noisily): again with it taken everywhere; then batch 64's decode with its profile (where the rest goes)
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step decode_b64_profile 200 env DECODE_BATCHES=64 python3 bench/gpu_engine.py --decode-only \
        --out "$OUT/gpu_decode_${GIT_SHA}_b64_profile.json"
fi
if want next83; then  # (run at 25bd3f7) the graphs' row counts routed to cuBLASLt where the start-up probe finds it faster
    # (models/routed_linear.py; next82c: batch-64 decode 10,134 tok/s with cuBLASLt everywhere against 9,880): the GPU
    # tests, then the engine's decode with the routes and without them (MINIPIC_CUBLASLT=0) in turn, the cached TTFT
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    engine_decode decode_routed_1 120 new "$OUT/gpu_decode_${GIT_SHA}_routed_1.json"
    engine_decode decode_cublas 100 new "$OUT/gpu_decode_${GIT_SHA}_cublas.json" MINIPIC_CUBLASLT=0
    engine_decode decode_routed_2 100 new "$OUT/gpu_decode_${GIT_SHA}_routed_2.json"
    step ttft_routed 100 python3 $TTFT_8X2048 --tag=-routed
    cp bench/results/ttft_spans-*routed* "$OUT"/ 2>/dev/null
fi
# NOTE: next82-next82d each fit one call (600 s at most a call; the GPU tests took 299 s in next81c compiling PDL's
# variants, ~150 s warm)
if want next82; then  # (run at 299009c; rope_write_attend was removed after: its code is at 299009c) a decode layer's RoPE, K/V write and attention in one launch (rope_write_attend;
    # the engine takes it with MINIPIC_FUSED_WRITE=1): the GPU tests without it (its own op test among them) and with
    # it (the engine's graph and span tests then run it)
    step gpu_tests 260 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step gpu_tests_fused 200 env MINIPIC_FUSED_WRITE=1 python3 -m pytest -q -m gpu tests/test_gpu.py \
        -p no:cacheprovider -p no:logging --tb=short -k "not hybrid"
fi
if want next82b; then  # (run at 299009c) the fused op against the engine's two launches; the engine's decode without it
    # and with it
    step fused_write 120 python3 bench/gpu_fused_write.py --out "$OUT"
    engine_decode decode_separate 120 new "$OUT/gpu_decode_${GIT_SHA}_separate.json"
    engine_decode decode_fused 150 new "$OUT/gpu_decode_${GIT_SHA}_fused.json" MINIPIC_FUSED_WRITE=1
fi
if want next82c; then  # (run at 299009c) the projections through cuBLASLt (TORCH_BLAS_PREFER_CUBLASLT=1: its own
    # heuristic's kernels) beside cuBLAS, each shape at 1 / 17 / 64 rows; the engine's decode under each
    step gemm_blas 150 python3 bench/gpu_gemm_shapes.py --blas --rows 1,17,64 --out "$OUT/gpu_gemm_blas_${GIT_SHA}_h200.json"
    engine_decode decode_cublas 120 new "$OUT/gpu_decode_${GIT_SHA}_cublas.json"
    engine_decode decode_cublaslt 150 new "$OUT/gpu_decode_${GIT_SHA}_cublaslt.json" TORCH_BLAS_PREFER_CUBLASLT=1
fi
if want next82d; then  # (run at 299009c) the cached 8 x 2,048 TTFT (PDL on, the default since stop 39) under cuBLAS and
    # under cuBLASLt, in turn
    step ttft_cublas 120 python3 $TTFT_8X2048 --tag=-cublas
    step ttft_cublaslt 150 env TORCH_BLAS_PREFER_CUBLASLT=1 python3 $TTFT_8X2048 --tag=-cublaslt
    cp bench/results/ttft_spans-*cublas* "$OUT"/ 2>/dev/null
fi
if want next81c; then  # next81b's GPU tests timed out (200 s) after 11 passed, compiling PDL's variants: again, named,
    # then the engine's decode with PDL on a second time (next81: 9,944 against 9,854 tok/s at batch 64 off)
    step gpu_tests 330 python3 -m pytest -v -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short \
        --durations=20
    engine_decode decode_pdl_on_2 150 new "$OUT/gpu_decode_${GIT_SHA}_pdl_on_2.json"
fi
if want next81b; then  # next81's TTFT with PDL on timed out compiling its variants (110 s): the GPU tests with PDL on (the
    # default), then the cached 8 x 2,048 row on, off, on
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step ttft_pdl_on_1 200 python3 $TTFT_8X2048 --tag=-pdl-on-1
    step ttft_pdl_off_2 110 env MINIPIC_PDL=0 python3 $TTFT_8X2048 --tag=-pdl-off-2
    step ttft_pdl_on_2 110 python3 $TTFT_8X2048 --tag=-pdl-on-2
    cp bench/results/ttft_spans-*pdl* "$OUT"/ 2>/dev/null
fi
if want next81; then  # programmatic dependent launch (PDL: the op's read and merge, Inductor's kernels) on and off
    # (MINIPIC_PDL=0) in this tree: the op's reads, the engine's decode at batch 1 and 64, the cached 8 x 2,048 TTFT
    cases=b1x8k,b1x576w8k,b64x576w8k,short16k
    step read_pdl_off 60 env MINIPIC_PDL=0 READ_SWEEP=0 python3 bench/gpu_read_profile.py --out /tmp/roff --cases $cases
    step read_pdl_on 60 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out /tmp/ron --cases $cases
    cp /tmp/roff/read_profile_*.json "$OUT/read_profile_${GIT_SHA}_pdl_off.json"
    cp /tmp/ron/read_profile_*.json "$OUT/read_profile_${GIT_SHA}_pdl_on.json"
    engine_decode decode_pdl_off 150 new "$OUT/gpu_decode_${GIT_SHA}_pdl_off.json" MINIPIC_PDL=0
    engine_decode decode_pdl_on 200 new "$OUT/gpu_decode_${GIT_SHA}_pdl_on.json"
    step ttft_pdl_off 110 env MINIPIC_PDL=0 python3 $TTFT_8X2048 --tag=-pdl-off
    step ttft_pdl_on 110 python3 $TTFT_8X2048 --tag=-pdl-on  # (timed out: compiling PDL's variants; see next81b)
    cp bench/results/ttft_spans-*pdl* "$OUT"/ 2>/dev/null
fi
if want next80; then  # (run: slower, see gpu_read_profile.py) 64-key tiles of 8 warps for a batch-1 decode (READ_SWEEP=w8t64) beside the defaults
    step read_w8t64 150 env READ_SWEEP=w8t64 python3 bench/gpu_read_profile.py --out "$OUT" --cases b1x8k,b1x8k_cold,b1x576w8k
fi
if want next79; then  # the admission's host saving (548cde3) at the cached 8 x 2,048 row beside b352364, alternated twice
    ttft_ab 100
    cp bench/results/ttft_spans-* .base/bench/results/ttft_spans-* "$OUT"/ 2>/dev/null
fi
if want next78c; then  # next78b again, alternated twice (ttft_ab): int32 offsets against 3cb8e38 at the cached 8 x 2,048 row
    ttft_ab 170
    cp bench/results/ttft_spans-* .base/bench/results/ttft_spans-* "$OUT"/ 2>/dev/null
fi
if want next78b; then  # next78's TTFT half: the cached 8 x 2,048 row in .base's tree and this one
    step ttft_base_1 200 $BASE_ENV python3 .base/$TTFT_8X2048 --tag=-base-1
    step ttft_new_1 200 python3 $TTFT_8X2048 --tag=-new-1
    cp bench/results/ttft_spans-* "$OUT"/ 2>/dev/null
fi
if want next77; then  # next76's sweep again: READ_SWEEP=s16 ran no config there (a list of sweep names in
    # gpu_read_profile.py lacked it; now any name but 0 sweeps)
    step read_s16 200 env READ_SWEEP=s16 python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b1x8k,b1x8k_cold,b1x576w8k,b64x576w8k
fi
if want next76; then  # (see below) and beside it, 16-key tiles for a long batch-1 decode (READ_SWEEP=s16)
    step read_s16 200 env READ_SWEEP=s16 python3 bench/gpu_read_profile.py --out "$OUT" --cases b1x8k,b1x8k_cold,b1x576w8k
fi
if want next76; then  # next75's engine half again: its llama3-8b-shape config said 8,192 positions, so a 16k-wide
    # table was refused at start-up (gpu_engine now widens max_position_embeddings to max_model_len)
    long=(DECODE_PROMPT_LEN=8192 DECODE_BATCHES=1 BENCH_MAX_MODEL_LEN=16384)
    for round in 1 2; do
        engine_decode "decode8k_base_$round" 120 base "$OUT/gpu_decode8k_base_$round.json" "${long[@]}"
        engine_decode "decode8k_new_$round" 120 new "$OUT/gpu_decode8k_${GIT_SHA}_$round.json" "${long[@]}"
    done
fi
if want next75; then  # (run at stop 38: the tests and reads passed, the engine half refused its 16k table; next76) stop 37's last tree through the GPU tests (64 splits
    # for a long batch-1 decode came after its last call), the op's decode reads, and the engine's batch-1 decode over
    # 8,192-token prompts in 16k-wide tables (64 splits here) beside .base = 8f0bdda's tree (32 splits; build it with
    # `git archive 8f0bdda minipic_lite ops bench pyproject.toml | tar x -C .base`, then this tree's bench/gpu_engine.py
    # copied in: DECODE_PROMPT_LEN, DECODE_BATCHES, BENCH_MAX_MODEL_LEN), alternated twice
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step read_defaults 60 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b1x8k,b1x8k_cold,b1x576w8k,b64x576w8k,b32x2200w8k_cold
    long=(DECODE_PROMPT_LEN=8192 DECODE_BATCHES=1 BENCH_MAX_MODEL_LEN=16384)
    for round in 1 2; do
        engine_decode "decode8k_base_$round" 120 base "$OUT/gpu_decode8k_base_$round.json" "${long[@]}"
        engine_decode "decode8k_new_$round" 120 new "$OUT/gpu_decode8k_${GIT_SHA}_$round.json" "${long[@]}"
    done
fi
if want next74; then  # 64 splits of 4 warps for a batch-1 decode now that it takes 128 registers (READ_SWEEP=s64)
    step read_s64 150 env READ_SWEEP=s64 python3 bench/gpu_read_profile.py --out "$OUT" --cases b1x8k,b1x8k_cold,b1x576w8k
fi
if want next73; then  # the cached 8 x 2,048 row at this tree (a next question's second token is a decode: ONE_TOKEN_SEQS)
    step ttft_8x2048_b32 170 python3 $TTFT_8X2048
    cp bench/results/ttft_spans-* "$OUT"/ 2>/dev/null
fi
if want next72b; then  # next72 again in the other order: .base, then this tree
    engine_decode decode_base2 120 base "$OUT/gpu_decode_base2.json"
    engine_decode decode_new2 120 new "$OUT/gpu_decode_${GIT_SHA}_2.json"
fi
if want next72; then  # next71's engine decode at batch 1 and 64 (timed out there at 100 s, starting cold): this tree, then .base
    engine_decode decode_new 230 new "$OUT/gpu_decode_${GIT_SHA}.json"
    engine_decode decode_base 230 base "$OUT/gpu_decode_base.json"
fi
if want next71; then  # a decode's tiles mapped to sequences with no search (ONE_TOKEN_SEQS) beside .base (7519d19): the
    # GPU tests, the op's decode reads (defaults) alternated, the engine's decode at batch 1 and 64
    step gpu_tests 130 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    for round in 1 2; do
        step "read_base_$round" 55 $BASE_ENV READ_SWEEP=0 python3 .base/bench/gpu_read_profile.py --out "$OUT/base" \
            --cases b1x8k,b1x8k_cold,b1x576w8k,b64x576w8k,b32x2200w8k_cold
        step "read_new_$round" 55 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT" \
            --cases b1x8k,b1x8k_cold,b1x576w8k,b64x576w8k,b32x2200w8k_cold
    done
    # NOTE: .base carries this tree's bench/gpu_engine.py (DECODE_QUICK: the default schedule only)
    engine_decode decode_new 100 new "$OUT/gpu_decode_${GIT_SHA}.json"
    engine_decode decode_base 100 base "$OUT/gpu_decode_base.json"
fi
if want next70; then  # the split decode with one or two warps a program (gpu_read_profile READ_SWEEP=w1)
    step read_w1 240 env READ_SWEEP=w1 python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b1x8k,b1x8k_cold,b1x576w8k,b64x576w8k
fi
if want next69; then  # next68's GPU tests and op validation at stop 36's last tree, after the floor of a decode's read
    # (bench/gpu_read_floor.py: K and V read through the block table with no math, beside the op and SDPA)
    step read_floor 150 python3 bench/gpu_read_floor.py --out "$OUT"
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step op_defaults 120 python3 bench/gpu_ops.py --only "llama prefill" --out "$OUT"
fi
if want next68; then  # (not run: stop 36's device time was spent) the GPU tests and the op's validation and prefill
    # table at stop 36's last tree: the 4k default (the halves, heads first) and the warm-up's launch-order variants
    step gpu_tests 330 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step op_defaults 240 python3 bench/gpu_ops.py --only "llama prefill" --sweep --sweep-set halves-order \
        --sweep-rows "llama prefill 4k" --budget-s 220 --out "$OUT"
fi
if want next67; then  # the halves with every kv head's longest tiles first (HEADS_FIRST), 4k-32k (no validation:
    # the order changes no tile's math)
    step op_halves_order 300 python3 bench/gpu_ops.py --skip-validation --only "llama prefill" --sweep \
        --sweep-set halves-order --sweep-rows "llama prefill 4k,llama prefill 8k,llama prefill 16k,llama prefill 32k" \
        --budget-s 280 --out "$OUT"
fi
if want next66; then  # the cached 8 x 2,048 row (cold and cached) in this tree and .base's (78d2f81: before the
    # dense halves, which a cold prefill's 8,192-token chunks take), alternated twice
    ttft_ab 110
    cp .base/bench/results/ttft_spans-* "$OUT"/ 2>/dev/null
fi
if want next65; then  # the GPU tests (next64's timed out compiling on a cold cache), then the cached 8 x 2,048 TTFT row
    # (its cold prefill's 8,192-token chunks now take the halves)
    step gpu_tests 330 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step ttft_8x2048_b32 150 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
fi
if want next64; then  # issue 13 with the halves as the long prefill's default: the GPU tests, the op's table (its
    # validation first) with 4k's tiles swept, the engine's long prefills against transformers
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step engine_prefill 170 python3 bench/gpu_engine_prefill.py --out "$OUT/gpu_engine_prefill_${GIT_SHA}_h200.json"
    step op_table 220 python3 bench/gpu_ops.py --sweep --sweep-set fourk --sweep-rows "llama prefill 4k" \
        --budget-s 200 --out "$OUT"
fi
if want next63; then  # issue 13: the dense kernel's tile as two halves sharing each key tile (Q_SPLIT=2) beside its
    # defaults and SDPA's cuDNN, prefill 4k-32k (the op's validation first, with two Q_SPLIT cases)
    step op_halves 560 python3 bench/gpu_ops.py --only "llama prefill" --sweep --sweep-set halves --budget-s 420 \
        --sweep-rows "llama prefill 4k,llama prefill 8k,llama prefill 16k,llama prefill 32k" --out "$OUT"
fi
if want next62; then  # the RAG table's barrier and isps at reuse 0.5 / 0.9, this tree and .base's alternated twice
    # (next61 ran them once each: the second process's host phases ran 1.6-2x slower in code neither tree changed)
    cp -r bench/data .base/bench/
    for round in 1 2; do
        step rag_base_$round 120 $BASE_ENV python3 \
            .base/bench/rag.py --device cuda --llama3-8b-shape --samples 64 --max-num-seqs 32 \
            --max-num-batched-tokens 8192 --reuse 0.5,0.9 --systems barrier,isps --tag=-base-$round
        step rag_new_$round 120 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 --reuse 0.5,0.9 \
            --systems barrier,isps --tag=-new-$round
    done
    cp .base/bench/results/rag-* "$OUT"/ 2>/dev/null
fi
if want next61; then  # next60's isps and barrier at reuse 0.5 beside the tree before the merge's one warp, the 24-token
    # bucket and the aligned slices (.base: 672f677's, carried; its results named by BASE_SHA), one call
    cp -r bench/data .base/bench/
    step rag_base 100 $BASE_ENV python3 .base/bench/rag.py \
        --device cuda --llama3-8b-shape --samples 64 --max-num-seqs 32 --max-num-batched-tokens 8192 \
        --reuse 0.5 --systems barrier,isps --tag=-base
    step rag_new 100 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 --reuse 0.5 --systems barrier,isps --tag=-new
    cp .base/bench/results/rag-* "$OUT"/ 2>/dev/null
fi
if want next60; then  # the RAG table's vanilla, barrier and isps after the merge's one warp (the table's decode step
    # reads 32 requests of ~2,200 keys in 2 splits: its merge 2.02 us a layer against 4.87) and the 24-token bucket
    step rag 400 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 --systems vanilla_prefix,barrier,isps
fi
if want next59; then  # the merge's one warp and the 24-token bucket (this tree) beside the tree before them (.base:
    # 672f677's, carried; BASE_SHA names its results): the GPU tests, the op's validation, the cached 8 x 2,048 row
    # in alternating trees, the host sections of each
    step gpu_tests 240 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step op_validation 120 python3 bench/gpu_ops.py --only __none__ --out /tmp/gpu_ops
    ttft_ab 150
    step host_base 120 $BASE_ENV python3 .base/bench/host_ttft.py --device cuda --llama3-8b-shape --block-size 32
    step host_new 120 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --block-size 32
fi
if want next58; then  # the split-KV merge by warps, cuBLAS's projections at 17 / 32 rows with and without a
    # workspace (split-K reductions), and the o projection after an L2 prefetch (next57's cases that failed to capture)
    step small_kernels 200 python3 bench/gpu_small_kernels.py
    CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0 step small_kernels_noworkspace 200 \
        python3 bench/gpu_small_kernels.py --projections-only --tag noworkspace
    step l2_prefetch 200 python3 bench/gpu_l2_prefetch.py
    step host_ttft_b32 200 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --block-size 32
fi
if want next57; then  # the o projection from L2 (bench/gpu_l2_prefetch.py); at 4b30257 this part also ran the engine's
    # cached 8 x 2,048 row with the weights prefetched (MINIPIC_L2_PREFETCH=0/1/plain, removed after it) and its GPU test
    step l2_prefetch 200 python3 bench/gpu_l2_prefetch.py
fi
if want next56; then  # the cached 8 x 2,048 row with 3 untimed next questions before the timed ones (next54's first
    # three ran 7.5-7.7 ms after direct_ttft's prefills, then 7.2; next55 timed 6.73 ms steady, another process)
    step ttft_8x2048_b32 150 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
fi
if want next55; then  # torch's profiler's after-effect on a process's later timings, alone (bench/profiler_after_effect.py)
    step profiler_after_effect 150 python3 bench/profiler_after_effect.py --device cuda --llama3-8b-shape
fi
if want next54; then  # the cached 8 x 2,048 row again, its profiled runs now after every timing (next53: a process
    # that had run torch's profiler timed next questions 0.7-1.0 ms slower than loop_handoff's, driven directly too)
    step ttft_8x2048_b32 150 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
fi
if want next53; then  # generate's progress bar before its requests (or none): the cached 8 x 2,048 TTFT grid row
    # at block size 32 (cold, cached, next questions through generate), then the hand-off against direct driving
    step ttft_8x2048_b32 150 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
    step loop_direct_b32 120 python3 bench/loop_handoff.py --device cuda --llama3-8b-shape --block-size 32 --rounds 3 \
        --ways blocking,direct
fi
if want next52; then  # HEADS_FIRST the default for the dense kernel's 64x64 tiles while a sequence's K and V take at
    # most 16 MB (8 MB since, after this part: 4k 0.3% slower) (next51: 1k 1.26x): the GPU tests, then both orders side by side at 1k-32k (the op's validation cases
    # first), then the engine's prefill against transformers (4 x 2,048 takes the new order)
    step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
    step order 200 python3 bench/gpu_ops.py --only "llama prefill" --sweep --sweep-set order --out "$OUT" \
        --sweep-rows "llama prefill 1k,llama prefill 2k,llama prefill 4k,llama prefill 8k,llama prefill 16k"
    step engine_prefill 250 python3 bench/gpu_engine_prefill.py --out "$OUT/gpu_engine_prefill_${GIT_SHA}_h200.json"
fi
if want next51; then  # ran at d09f002: the dense kernel's exponentials on the FMA pipe (EXP_POLY, removed since:
    # slower everywhere) and HEADS_FIRST (`gpu_ops_d09f002_h200_exp_poly.*`); then a cached 8 x 2,048 next question
    # through generate against the same driven directly on the loop thread
    step loop_direct_b32 200 python3 bench/loop_handoff.py --device cuda --llama3-8b-shape --block-size 32 --rounds 3 \
        --ways blocking,direct
fi
if want next50; then  # next49's isps at block size 128 ran reuse 0 (its first level) at 2.34 samples/s with 26.8 s of
    # eager steps, the later levels at normal speed: reuse 0 again after 0.5 says whether that was a one-time cost
    step rag_isps_b128_again 200 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 --systems isps --block-size 128 \
        --reuse 0,0.5,0 --tag=-isps-b128-again
fi
if want next49; then  # which block size for the RAG table (passages of 100-300 tokens pad to whole blocks), isps alone
    for bs in 16 32 64 128; do
        step rag_isps_b$bs 150 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 --systems isps --block-size $bs \
            --tag=-isps-b$bs
    done
fi
if want next48; then  # the cached prompt's short read took 1.22 / 1.41 / 1.44 ms a forward at block size 32 / 64 /
    # 128 (next46's profiles): the op alone, 17 tokens over 16k keys, by block size
    step read_blocks 150 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out bench/results \
        --cases short16k,short16k_b32,short16k_b64,short16k_b128,short16k_b32,short16k
fi
if want next47; then  # the hand-off to the loop thread in a cached 8 x 2,048 next question, the loop blocking on its
    # inbox against polling it (bench/loop_handoff.py), at block size 32
    step loop_handoff_b32 200 python3 bench/loop_handoff.py --device cuda --llama3-8b-shape --block-size 32 --rounds 3
fi
if want next46; then  # the cached 8 x 2,048 TTFT by block size (32, 64, 128), then its host sections (64, 128, 32):
    # host work a block against the short read's tiles (at 128 a 64-key tile holds part of a block)
    for bs in 32 64 128; do
        step ttft_8x2048_b$bs 150 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
            --repeats 3 --block-size $bs
    done
    step host_ttft_b64 90 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 64
    step host_ttft_b128 90 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 128
    step host_ttft_b32 90 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
fi
if want next45; then  # the cached 8 x 2,048 TTFT with a next question of one token and of two (the first token of an
    # answer, before the request's end), at block size 32 and 64; the host sections; the GPU tests
    step gpu_tests 220 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step host_ttft_b32 90 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
    step ttft_8x2048_b32 150 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
    step ttft_8x2048_b64 150 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 64
fi
if want next42; then  # issues 10 / 13: a skinny Triton matmul (swapped operands, TMA, split-K finished in-kernel) against
    # cuBLAS at the 8B projections, 1 / 17 / 64 rows, a config sweep each
    step skinny_gemm 420 python3 bench/gpu_skinny_gemm.py --rows 1,17,64 --out "bench/results/gpu_skinny_gemm_${GIT_SHA}_h200.json"
fi
if want next41d; then  # issue 13: what a projection takes with its weights in L2 (the same weight every call) beside
    # read from HBM: the most that prefetching the next matmul's weights during a latency-bound attention could save
    step gemm_l2 150 python3 bench/gpu_gemm_shapes.py --l2-warm --rows 1,17,64 --out "bench/results/gpu_gemm_l2_${GIT_SHA}_h200.json"
fi
if want next41c; then  # is the short read's second warpgroup (rows 64-127, padding for 17 tokens' 68 rows) worth a
    # tail tile? 16 and 17 new tokens over 16k keys: 64-row tiles with 4 warps, 1-4 programs an SM, beside the default
    step short_rows64 200 python3 bench/gpu_short_prefill.py --cases 1x16,1x17,1x32 --contexts 16384,32768 --tag=_rows64 \
        --sweep-json '[{"PROGRAMS_PER_SM": 2}, {"BLOCK_M": 64, "num_warps": 4, "PROGRAMS_PER_SM": 1},
        {"BLOCK_M": 64, "num_warps": 4, "num_stages": 2, "PROGRAMS_PER_SM": 2},
        {"BLOCK_M": 64, "num_warps": 4, "TILE_N": 32, "PROGRAMS_PER_SM": 2},
        {"BLOCK_M": 64, "num_warps": 4, "TILE_N": 32, "PROGRAMS_PER_SM": 4},
        {"BLOCK_M": 64, "num_warps": 4, "TILE_N": 32, "num_stages": 4, "PROGRAMS_PER_SM": 2}]'
fi
if want next41b; then  # the RAG table twice more, in both orders of the systems (reuse 0's ratios move by ~1% between
    # calls), and the cached 8 x 2048 TTFT with the engine driven directly (next41's ran out of its 60 s)
    step rag_reversed 200 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 \
        --systems isps,inline,barrier,pic_disabled,vanilla_prefix --tag=-reversed
    step rag 200 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192 \
        --systems vanilla_prefix,pic_disabled,barrier,inline,isps --tag=-again
    step host_ttft_b32 150 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
fi
if want next40; then  # not yet run: the cached 8 x 2048 TTFT at block size 32 after stop 30's graph changes (host
    # sections, then through generate), and the GPU tests
    step gpu_tests 220 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step host_ttft_b32 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32
    step ttft_8x2048_b32 100 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 \
        --repeats 3 --block-size 32
fi
if want next36a; then  # with the session's last 190 s: vanilla against PIC disabled at reuse 0 (the same tokens),
    # each step kind's execute time
    step rag_reuse0 95 $RAG --reuse 0 --systems vanilla_prefix,pic_disabled --max-num-seqs 32 \
        --max-num-batched-tokens 8192 --tag=-reuse0-kinds
fi
if want rag34; then  # next session's second call: the RAG table with isps capped ahead (290089e) beside
    # isps_whole_budget (the policy before), every other system as before
    step rag 450 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
fi
if want engine21; then  # the engine's decode b1 / b64 against the HBM roofline and HF (its batch-64 attention took
    # 57 us a layer over 576 keys before decode's TABLE_AHEAD; the op bench now 47.6), and prefill against HF
    step gpu_engine 400 python3 bench/gpu_engine.py --out "$OUT/gpu_engine_${GIT_SHA}_h200.json"
fi
if want w16; then  # next (not yet run): 16 warps on one tile of the short read (gpu_read_profile READ_SWEEP=w16)
    step read_w16 150 env READ_SWEEP=w16 python3 bench/gpu_read_profile.py --out "$OUT" --cases short16k,short16k_cold
fi
if want engine; then  # issue 13: engine decode b1 / b64 against the HBM roofline, with its profile, and prefill vs HF
    step gpu_engine 330 python3 bench/gpu_engine.py --out "$OUT/gpu_engine_${GIT_SHA}_h200.json"
fi
if want pending; then  # what stop 15 left unmeasured, in one call: the GPU tests after the hit guard, the offload
    # bench after it, and block placement over an engine-sized pool (the "fresh" forward's 0.9 ms)
    step gpu_tests 150 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step offload 220 $RAG --offload --reuse 0.9 --max-num-seqs 4 --max-num-batched-tokens 4096 --tag=-offload
    step read_profile_pool 150 python3 bench/gpu_read_profile.py --out "$OUT" --cases short16k,short16k_contig,short16k_spread
fi
if want final; then  # a stop's last call: every GPU test (fla autotunes on a machine without its cache), then
    # the cached 8 x 2048 TTFT: its host sections and the grid's row
    step gpu_tests 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short
    step host_ttft 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20
    step ttft_8x2048 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
fi
if want ttft1; then  # the cached 8 x 2048 TTFT alone (first prompt and a next question, each with its GPU busy time)
    step ttft_8x2048 100 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
fi
if want probe; then  # issue 11's fla path (tests, side by side with its profile), then issue 10's
    step gpu_tests 170 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
    step hybrid_gpu 150 $HYBRID --skip-savings --profile
    step ttft_8x2048 70 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 2048 --ks 8 --repeats 3
    step rag_ceiling 170 $RAG --reuse 0.5 --systems barrier,isps --max-num-seqs 32 --max-num-batched-tokens 8192
fi
if want all || want a; then
    [[ ${SKIP_TESTS:-0} == 1 ]] || step gpu_tests 240 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
    step rag 420 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
    # issue 10's offload comparison: host tier vs recompute vs copy-rerotate on a cache of 1/4 of the working set
    step offload 300 $RAG --offload --reuse 0.9 --max-num-seqs 4 --max-num-batched-tokens 4096 --tag=-offload
fi
if want all || want b; then
    step ttft_grid 240 python3 bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 512,1024,2048,4096 \
        --ks 1,2,4,8 --repeats 2
    step span_scaling 120 python3 bench/span_scaling.py --device cuda --llama3-8b-shape --span-tokens 2048 \
        --ns 1,2,4,8,16 --repeats 2
    # issue 11's side by side (Qwen3.5 9B shape vs transformers, fla-core carried in .whl); the token-savings
    # part needs the texts and SmolLM2's tokenizer, which this machine lacks
    step hybrid_gpu 200 python3 bench/hybrid_checkpoints.py --gpu --skip-savings --profile
fi
cp bench/results/*"$GIT_SHA"* "$OUT"/ 2>/dev/null
(cd "$OUT" && tar czf results.tgz --remove-files ./*.*)
# NOTE: a cache hit needs only each kernel's cubin, ptx and json (Triton skips a group's missing files): the IRs went
# past the 64 MiB a call carries (next81: 1 GB of cache, 65 MB compressed; 33 MB without them)
find .gpu_cache/triton \( -name "*.llir" -o -name "*.ttir" -o -name "*.ttgir" -o -name "*.source" \) -delete
if command -v xz >/dev/null; then  # NOTE: 16 MiB at most per file back
    tar cf - .gpu_cache | xz -T0 -6 | split -b 15000000 - "$OUT/gpu_cache.txz."
else
    tar czf - .gpu_cache | split -b 15000000 - "$OUT/gpu_cache.tgz."
fi
ls -l "$OUT"
