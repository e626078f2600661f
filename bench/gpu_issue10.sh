#!/usr/bin/env bash
# The GPU benches and tests of issues 10, 11 and 13 on the H200 (Llama-3-8B shape, random bf16; the hybrid's
# Qwen3.5 shape), in parts that one device call joins, each log under $OUT. Needs .whl (datasets, dill,
# multiprocess, fla-core) carried, .gpu_cache_tgz where a call before left its compiled kernels, and for the RAG
# parts bench/data (the datasets, built here with `python bench/rag.py --build-only --samples 64`).
#
#   GIT_SHA=<sha> bash bench/gpu_issue10.sh [part,part,...]      (default: all = a + b)
#
# Parts: tests (the GPU tests), ncusrc (issue 13's batch-1 decode under ncu, per SASS instruction), ops (tests, the op's
# validation, the short read), ttft (tests, validation, the TTFT grid, RAG), grid, ttft1 (the cached 8 x 2,048 row),
# next93 (that row straight after its documents, then 200 ms after), next53 (next93, then the short read's SPLIT_IDS on
# and off), next57 (.base's tree and this one alternated on that row, then host_ttft), next58 (next57's first pair),
# next59 (this tree's row twice around its host_ttft, then .base's once), skinny59 (the row with the skinny matmul on,
# then off, then its GPU test), skinny60 (off and on alternated twice, the GPU test, the engine's decode off and
# on), skinny61 (skinny60's last three), confirm61 (the row with the default routes in three processes, then the GPU
# tests), decode1 (issue 13's batch-1 decode over 8k-32k keys: op, keys as stored, SDPA), confirm64 (confirm61's
# three processes, then decode1, then the GPU tests where time is left), next93s (only 200 ms after), next93b (the GPU tests), rag, ragphase, rag0, offload,
# spans (uncached span scaling), host, hostdiag, splits, read, readprof (with ncu), readfloor, engineread, mixed,
# smallkernels, gemm, skinny, l2, handoff, aftereffect, prefill (engine prefill vs transformers), engine (gpu_engine:
# decode, prefill, profile), decode (the engine's decode, default schedule), ttftab / decodeab (.base's tree beside this
# one, alternated), hybrid, final, a, b, all. The one-off parts of earlier sessions' experiments (next21 ... next91,
# each named in its results' files) are in git history: `git show 3239062:bench/gpu_issue10.sh` (decodewarps: `git show
# 19db9d0:...`).
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
fits() {  # fits LIMIT_S: a step of that limit ends before DEADLINE_S (seconds into this script; unset: always)
    [[ -z ${DEADLINE_S:-} ]] || (( SECONDS + $1 < DEADLINE_S ))
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
RAG="python3 bench/rag.py --device cuda --llama3-8b-shape --samples 64"
HYBRID="python3 bench/hybrid_checkpoints.py --gpu --num-layers 8 --prefill-len 2048 --decode-tokens 32"
GPU_TESTS="python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -p no:logging --tb=short"
TTFT_GRID="bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 512,1024,2048,4096 --ks 1,2,4,8 --repeats 2"
if want ops; then  # after a kernel change: the GPU tests, the op's validation, the short-prefill op bench
    step gpu_tests 200 $GPU_TESTS
    step op_validation 120 python3 bench/gpu_ops.py --only __none__ --out "$OUT"
    step short_prefill 240 python3 bench/gpu_short_prefill.py
fi
if want ttft; then  # the cached-prompt TTFT grid and the RAG bench, with the tests first (one call)
    step gpu_tests 110 $GPU_TESTS
    step op_validation 90 python3 bench/gpu_ops.py --only __none__ --out /tmp/gpu_ops  # its log says enough
    step ttft_grid 160 python3 $TTFT_GRID
    step rag 200 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
fi
if want grid; then
    step ttft_grid 170 python3 $TTFT_GRID
fi
if want ttft1; then  # the cached 8 x 2,048 row alone (a first prompt and next questions, each with its GPU busy time)
    step ttft 150 python3 $TTFT_8X2048
fi
if want next93; then  # issue 10: the cached 8 x 2,048 TTFT as a first prompt straight after its documents' prefill,
    # then 200 ms after it (diag19: the prefill runs under the power cap, and the short read, latency-bound, slows
    # with the clock), each in its own process
    step ttft 240 python3 $TTFT_8X2048 --tag=-next93
    step ttft_settle 150 python3 $TTFT_8X2048 --settle-ms 200 --tag=-next93
fi
if want next53; then  # stop 53's open questions on an H200: next93's two TTFTs, then the short read with and without
    # SPLIT_IDS (its default since e82a40c, measured on an H100 only)
    step ttft 240 python3 $TTFT_8X2048 --tag=-next93
    step ttft_settle 150 python3 $TTFT_8X2048 --settle-ms 200 --tag=-next93
    step read_splitids 120 env READ_SWEEP=splitids python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases short16k,short16k_cold
fi
if want next57; then  # stop 57's host-time changes: .base's tree (the stop's start) and this one on that row, host_ttft
    # of this one, then the row again in the other order (what fits a call comes first)
    step ttft_base_1 150 $BASE_ENV python3 .base/$TTFT_8X2048 --tag=-base-1 --out "$OUT"
    step ttft_new_1 150 python3 $TTFT_8X2048 --tag=-new-1 --out "$OUT"
    step host_new 90 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32 --out "$OUT"
    step ttft_new_2 150 python3 $TTFT_8X2048 --tag=-new-2 --out "$OUT"
    step ttft_base_2 150 $BASE_ENV python3 .base/$TTFT_8X2048 --tag=-base-2 --out "$OUT"
fi
if want next58; then  # next57's first pair alone (this tree, then .base's), for a call with ~300 s of device time left
    step ttft_new_1 150 python3 $TTFT_8X2048 --tag=-new-1 --out "$OUT"
    step ttft_base_1 150 $BASE_ENV python3 .base/$TTFT_8X2048 --tag=-base-1 --out "$OUT"
fi
if want next59; then  # this tree's row twice around its host_ttft, then .base's once (what fits a call comes first)
    step ttft_new_1 150 python3 $TTFT_8X2048 --tag=-new-1 --out "$OUT"
    step host_new 90 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --block-size 32 --out "$OUT"
    step ttft_new_2 150 python3 $TTFT_8X2048 --tag=-new-2 --out "$OUT"
    step ttft_base_1 150 $BASE_ENV python3 .base/$TTFT_8X2048 --tag=-base-1 --out "$OUT"
fi
if want skinny59; then  # the skinny matmul's experiment (MINIPIC_SKINNY_MATMUL): the cached 8 x 2,048 row with it on,
    # then off (the default until stop 61), then its GPU test (tokens against the eager engine's, its call against
    # F.linear)
    # NOTE: limits for a machine with no compiled-kernel cache (torch.compile and the routes' timing start cold)
    step ttft_skinny1 300 env MINIPIC_SKINNY_MATMUL=1 python3 $TTFT_8X2048 --tag=-skinny1 --out "$OUT"
    step ttft_skinny0 200 env MINIPIC_SKINNY_MATMUL=0 python3 $TTFT_8X2048 --tag=-skinny0 --out "$OUT"
    fits 150 && step gpu_test_skinny 150 python3 -m pytest -q -m gpu tests/test_gpu.py -k "skinny or cublaslt" \
        -p no:cacheprovider -p no:logging --tb=short
fi
if want skinny60; then  # stop 60's follow-up: the row with the skinny matmul off and on, twice each (stop 60 had one of
    # each, 59.81x against 60.96x), its GPU test (tokens as near float32's best as cuBLAS's), then the engine's decode
    # at batch 1 and 64 off and on (its graphs' buckets take it too: the part below); each step only where it ends
    # before DEADLINE_S
    # NOTE: the first step starts cold (torch.compile, the routes' timing): 300 s; the next ones reuse its cache
    for round in 1 2; do
        fits 300 && step ttft_skinny0_$round $((round == 1 ? 300 : 150)) env MINIPIC_SKINNY_MATMUL=0 \
            python3 $TTFT_8X2048 --tag=-skinny0-$round --out "$OUT"
        fits 200 && step ttft_skinny1_$round $((round == 1 ? 200 : 150)) env MINIPIC_SKINNY_MATMUL=1 \
            python3 $TTFT_8X2048 --tag=-skinny1-$round --out "$OUT"
    done
fi
if want skinny60 || want skinny61; then  # skinny60's tail, or skinny61 alone in a second call: the GPU test, then the
    # decode off and on
    fits 120 && step gpu_test_skinny 120 $GPU_TESTS -k skinny
    fits 140 && engine_decode decode_skinny0 140 new "$OUT/gpu_decode_${GIT_SHA}_skinny0.json" MINIPIC_SKINNY_MATMUL=0
    fits 140 && engine_decode decode_skinny1 140 new "$OUT/gpu_decode_${GIT_SHA}_skinny1.json" MINIPIC_SKINNY_MATMUL=1
fi
if want confirm61 || want confirm64; then  # stop 61's open question: the cached 8 x 2,048 row with the default routes (the skinny matmul on
    # Hopper since stop 61) in three processes (60x was met once, in one process), then every GPU test
    for run in 1 2 3; do
        limit=$((run == 1 ? 300 : 150))  # NOTE: the first starts cold
        fits $limit && step ttft_default_$run $limit python3 $TTFT_8X2048 --tag=-default-$run --out "$OUT"
    done
    want confirm61 && fits 300 && step gpu_tests 300 $GPU_TESTS
fi
if want decode1 || want confirm64; then  # issue 13's open goal as the tree stands: batch-1 decode over 8k-32k keys, the op
    # against keys as stored (no rotation) and SDPA's default backend, each case's defaults only (no sweep)
    fits 150 && step decode1 150 env READ_SWEEP=0 python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases b1x8k,b1x16k,b1x32k,b1x8k_cold
    want confirm64 && fits 120 && step gpu_tests 120 $GPU_TESTS  # NOTE: 63 s on an H100 with the carried cache
fi
if want next93s; then  # next93's second half alone (the first prompt 200 ms after its documents): fits ~300 s of device
    step ttft_settle 150 python3 $TTFT_8X2048 --settle-ms 200 --tag=-next93
fi
if want tests || want next93b; then  # NOTE: a cold H100 (stop 51) passed 8 of the 17 in 300 s, fla autotuning the
    # hybrid tests: give them a call of their own
    step gpu_tests 540 $GPU_TESTS
fi
if want ttftab; then
    ttft_ab 150
fi
if want rag; then  # the RAG table: 6 systems x reuse 0 / 0.5 / 0.9, and the ceiling
    step rag 330 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
fi
if want ragphase; then  # where a step's time goes per span policy (reuse 0.5): schedule, prepare, execute, postprocess
    step rag_phases 200 $RAG --reuse 0.5 --systems inline,isps,barrier --max-num-seqs 32 --max-num-batched-tokens 8192 \
        --tag=-phases
fi
if want rag0; then  # reuse 0 again (vanilla_prefix, inline, isps): run-to-run variation beside the table's ratios
    for run in 2 3; do
        step "rag_reuse0_run$run" 120 $RAG --reuse 0 --systems vanilla_prefix,inline,isps --max-num-seqs 32 \
            --max-num-batched-tokens 8192 --tag="-reuse0-run$run"
    done
fi
if want offload; then  # issue 10: host tier vs recompute vs copy-rerotate on a cache of 1/4 of the working set
    step offload 300 $RAG --offload --reuse 0.9 --max-num-seqs 4 --max-num-batched-tokens 4096 --tag=-offload
fi
if want spans; then  # uncached span prefill time against one causal prompt of the same length
    step span_scaling 120 python3 bench/span_scaling.py --device cuda --llama3-8b-shape --span-tokens 2048 \
        --ns 1,2,4,8,16 --repeats 2
fi
if want host; then  # where a cached prompt's TTFT goes on the host (sections, cProfile), then the 8 x 2,048 row
    step host_ttft 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20 --profile
    step ttft 150 python3 $TTFT_8X2048
fi
if want hostdiag; then  # what ttft_spans adds over host_ttft: torch's intra-op threads (host_ttft sets 1, ttft_spans
    # keeps torch's 16) and a first prompt on fresh blocks (ttft_spans resets first)
    for opts in "" "--threads 16" "--fresh" "--threads 16 --fresh"; do
        step "host_ttft${opts// /}" 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 10 $opts
    done
fi
if want splits; then  # the short read's split count past 32
    step short_prefill_splits 200 python3 bench/gpu_short_prefill.py --splits
fi
if want readprof || want read; then  # issues 10/13: the split-KV read (short prefill, decode) by case, with sweeps
    step read_profile "${READ_LIMIT:-200}" python3 bench/gpu_read_profile.py --out "$OUT" \
        --cases "${READ_CASES:-short16k,b1x8k,b64x8k,b1x576w8k,b64x576w8k}"
fi
if want readprof; then  # ... and the same kernels under ncu
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    for c in short16k b1x8k b64x8k sdpa_b1x8k; do
        step "ncu_$c" 90 "$NCU" --clock-control none --set detailed --profile-from-start off --launch-count 4 \
            python3 bench/gpu_read_profile.py --case "$c" --calls 4
    done
fi
if want ncusrc; then  # issue 13: where the batch-1 decode's read stalls, per SASS instruction (position-free and keys as
    # stored), and the launch shape of cuDNN's kernels for the same decode
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    for c in b1x8k b1x8k_stored; do
        step "ncusrc_$c" 150 "$NCU" --clock-control none --set full --profile-from-start off --launch-count 1 \
            -k regex:_rope_paged --page source --print-source sass --csv \
            python3 bench/gpu_read_profile.py --case "$c" --calls 2
        step "ncudet_$c" 150 "$NCU" --clock-control none --set full --profile-from-start off --launch-count 1 \
            -k regex:_rope_paged python3 bench/gpu_read_profile.py --case "$c" --calls 2
    done
    step ncudet_sdpa_b1x8k 150 "$NCU" --clock-control none --set full --profile-from-start off --launch-count 3 \
        python3 bench/gpu_read_profile.py --case sdpa_b1x8k --calls 2
fi
if want readfloor; then  # K and V read through the block table with no math, beside the op and SDPA
    step read_floor 150 python3 bench/gpu_read_floor.py --out "$OUT"
fi
if want engineread; then  # the engine's short read on its own arguments (graph bucket, eager) against the op bench's
    step engine_read 200 python3 bench/gpu_engine_read.py --out "$OUT"
fi
if want mixed; then  # a mixed step's decodes in their own attention launch against one launch
    step mixed_step 90 python3 bench/gpu_mixed_step.py --out "$OUT"
fi
if want smallkernels; then  # the split merge, cuBLAS's split-K reduction, the residual add + RMSNorm alone
    step small_kernels 200 python3 bench/gpu_small_kernels.py
fi
if want gemm; then  # the decode step's matmuls alone at 1, 17, 32 and 64 rows
    step gemm_shapes 150 python3 bench/gpu_gemm_shapes.py --out "$OUT/gpu_gemm_shapes_${GIT_SHA}_h200.json"
fi
if want skinny; then  # a skinny matmul in Triton against cuBLAS
    step skinny_gemm 420 python3 bench/gpu_skinny_gemm.py --rows 1,17,64 --out "$OUT/gpu_skinny_gemm_${GIT_SHA}_h200.json"
fi
if want l2; then  # the o projection after the short read, its weights prefetched into L2 or not
    step l2_prefetch 200 python3 bench/gpu_l2_prefetch.py
fi
if want handoff; then  # a cached prompt's TTFT through generate against the engine driven directly
    step loop_direct_b32 120 python3 bench/loop_handoff.py --device cuda --llama3-8b-shape --block-size 32 --rounds 3 \
        --ways blocking,direct
fi
if want aftereffect; then  # torch's profiler's after-effect on a process's later timings
    step profiler_after_effect 150 python3 bench/profiler_after_effect.py --device cuda --llama3-8b-shape
fi
if want prefill; then  # engine prefill against transformers at 4 x 2,048, 1 x 8k, 16k and 32k
    step engine_prefill 250 python3 bench/gpu_engine_prefill.py --out "$OUT/gpu_engine_prefill_${GIT_SHA}_h200.json"
fi
if want engine; then  # issue 13: engine decode b1 / b64 against the HBM roofline, with its profile, and prefill vs HF
    step gpu_engine 400 python3 bench/gpu_engine.py --out "$OUT/gpu_engine_${GIT_SHA}_h200.json"
fi
if want decode; then  # the engine's decode at batch 1 and 64 (DECODE_QUICK: the default schedule)
    engine_decode decode 170 new "$OUT/gpu_decode_${GIT_SHA}.json"
fi
if want decodeab; then  # the same, .base's tree and this one alternated twice
    for round in 1 2; do
        engine_decode "decode_base_$round" 120 base "$OUT/gpu_decode_base_$round.json"
        engine_decode "decode_new_$round" 120 new "$OUT/gpu_decode_${GIT_SHA}_$round.json"
    done
fi
if want hybrid; then  # issue 11: the fla path's GPU test (fla autotunes ~35 s per dtype on a fresh machine), then the
    # side by side with transformers + fla, with its device and host profiles
    step gpu_tests 170 $GPU_TESTS
    step hybrid_gpu 130 $HYBRID --skip-savings --profile
fi
if want final; then  # a stop's last call: every GPU test, then the cached 8 x 2,048 TTFT's host sections and row
    step gpu_tests 300 $GPU_TESTS
    step host_ttft 60 python3 bench/host_ttft.py --device cuda --llama3-8b-shape --runs 20
    step ttft 150 python3 $TTFT_8X2048
fi
if want all || want a; then
    [[ ${SKIP_TESTS:-0} == 1 ]] || step gpu_tests 240 $GPU_TESTS
    step rag 420 $RAG --max-num-seqs 32 --max-num-batched-tokens 8192
    step offload 300 $RAG --offload --reuse 0.9 --max-num-seqs 4 --max-num-batched-tokens 4096 --tag=-offload
fi
if want all || want b; then
    step ttft_grid 240 python3 $TTFT_GRID
    step span_scaling 120 python3 bench/span_scaling.py --device cuda --llama3-8b-shape --span-tokens 2048 \
        --ns 1,2,4,8,16 --repeats 2
    step hybrid_gpu 200 python3 bench/hybrid_checkpoints.py --gpu --skip-savings --profile
fi
cp bench/results/*"$GIT_SHA"* "$OUT"/ 2>/dev/null
(cd "$OUT" && tar czf results.tgz --remove-files ./*.*)
# NOTE: a cache hit needs only each kernel's cubin, ptx and json (Triton skips a group's missing files): the IRs went
# past the 64 MiB a call carries (next81: 1 GB of cache, 65 MB compressed; 33 MB without them)
find .gpu_cache/triton \( -name "*.llir" -o -name "*.ttir" -o -name "*.ttgir" -o -name "*.source" \) -delete
if [[ ${SKIP_CACHE:-0} == 1 ]]; then  # a call short of time sends no compiled-kernel cache back
    :
elif command -v xz >/dev/null; then  # NOTE: 16 MiB at most per file back
    tar cf - .gpu_cache | xz -T0 -6 | split -b 15000000 - "$OUT/gpu_cache.txz."
else
    tar czf - .gpu_cache | split -b 15000000 - "$OUT/gpu_cache.tgz."
fi
ls -l "$OUT"
