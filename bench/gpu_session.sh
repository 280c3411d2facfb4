#!/usr/bin/env bash
# One device call: run each named stage in order over the machine's torch/triton (atomlite from PYTHONPATH), each
# one's output to $OUT/<stage>.log (and the terminal); a failing stage does not stop the next.
#   bash bench/gpu_session.sh k-from-v moe-bench 26b tests-new   (stages: the case below)
#   bash bench/gpu_session.sh tests-gpu tests-memory   (every GPU test; the memory test must run alone)
#   bash bench/gpu_session.sh ab-26b-b1   (batch-1 TPOT of baseline_code/, carried, then of this tree)
#   bash bench/gpu_session.sh ab-models   (31B, 31B MXFP4 and 26B-A4B at batch 1, 26B-A4B at 16: baseline, then this tree)
#   bash bench/gpu_session.sh serve-26b   (the server's load in process, then over HTTP; needs the serve extra: carry
#                                          .whl/ and install it as the device README says)
# On a machine of two GPUs, two sessions run side by side, e.g. the demo training beside the tests:
#   CUDA_VISIBLE_DEVICES=1 bash bench/gpu_session.sh train-demo & CUDA_VISIBLE_DEVICES=0 bash bench/gpu_session.sh ...
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}  # keeps packages installed aside (e.g. --target)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast here
OUT=${OUT:-/tmp/atomlite-gpu}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log -1 --format='commit %h %s' 2>/dev/null

latency() {  # MODEL [extra flags]: the bench/README "Decode from graphs" row
    local model=$1; shift
    python -m atomlite.cli bench latency --model "examples/configs/$model" --load-format dummy --dtype bfloat16 \
        --input-len 512 --output-len 64 --batch-size 16 --max-num-seqs 16 --max-model-len 2048 --repeats 5 "$@"
}

speculative() {  # MODEL [flags]: the bench/README speculative decoding rows (batch 1, k = 4)
    local model=$1; shift
    python -m atomlite.cli bench speculative --model "examples/configs/$model" --load-format dummy --dtype bfloat16 \
        --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}' --input-len 512 --output-len 128 \
        --repeats 3 --max-num-seqs 1 --max-model-len 2048 "$@"
}

latency_b1() {  # MODEL: batch 1 alone (one graph to capture, three TTFT repeats): the quick A/B row
    python -m atomlite.cli bench latency --model "examples/configs/$1" --load-format dummy --dtype bfloat16 \
        --input-len 512 --output-len 64 --batch-size 1 --max-num-seqs 1 --max-model-len 2048 --repeats 3
}

ttft_2040() {  # MODEL: TTFT of one 2040-token prompt (one 2048-token prefill step), issue 56's row
    python -m atomlite.cli bench latency --model "examples/configs/$1" --load-format dummy --dtype bfloat16 \
        --input-len 2040 --output-len 4 --batch-size 1 --max-num-seqs 1 --max-model-len 2048 --repeats 5
}

tp_latency() {  # MODEL TP: the bench/README tensor-parallel rows (TTFT of 2048 tokens, TPOT at batch 1 and 16)
    python -m atomlite.cli bench latency --model "examples/configs/$1" --load-format dummy --dtype bfloat16 \
        --input-len 2048 --output-len 64 --batch-size 16 --max-num-seqs 16 --max-model-len 4096 --repeats 5 \
        --tensor-parallel-size "$2" "${@:3}"
}

tp_rows() {  # MODEL: TP=2 (one-shot all-reduce), TP=2 through nccl alone, TP=1; one machine
    echo "--- TP=2"; tp_latency "$1" 2
    echo "--- TP=2, nccl"; tp_latency "$1" 2 --disable-custom-all-reduce
    echo "--- TP=1"; tp_latency "$1" 1
}

tp_pair() {  # MODEL: TP=2 then TP=1 alone (issue 56's ratios, one call; about 3 min for 31B)
    echo "--- TP=2"; tp_latency "$1" 2
    echo "--- TP=1"; tp_latency "$1" 1
}

load() {  # MODEL [flags]: the throughput-under-load row (256 x 512 in / 256 out, up to 256 at once)
    local model=$1; shift
    python -m atomlite.cli bench throughput --model "examples/configs/$model" --load-format dummy --dtype bfloat16 \
        --num-prompts 256 --input-len 512 --output-len 256 --max-num-seqs 256 --max-model-len 1024 "$@"
}

pool_rows() {  # MODEL: the shared KV pool's row: the load at --max-model-len 2048, then at 32768; one machine
    for len in 2048 32768; do
        echo "--- max-model-len $len"
        python -m atomlite.cli bench throughput --model "examples/configs/$1" --load-format dummy --dtype bfloat16 \
            --num-prompts 256 --input-len 512 --output-len 256 --max-num-seqs 256 --max-model-len $len
    done
}

serve_vs_engine() {  # MODEL: one load (256 x 512 in / 128 out, 64 at once) in process, then over HTTP; then 1 at once
    local model="examples/configs/$1" port=8011 pid
    local flags=(--model "$model" --load-format dummy --dtype bfloat16 --max-num-seqs 64 --max-model-len 2048)
    local load=(--num-prompts 256 --input-len 512 --output-len 128)
    python -m atomlite.cli bench throughput "${flags[@]}" "${load[@]}" --json "$OUT/throughput-$1.json"
    python -m atomlite.cli serve "${flags[@]}" --port $port > "$OUT/serve-$1.log" 2>&1 &
    pid=$!
    until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
        kill -0 $pid 2> /dev/null || { cat "$OUT/serve-$1.log"; return 1; }; sleep 2
    done
    local client=(--base-url "http://127.0.0.1:$port" --model "$model" --input-len 512 --output-len 128)
    # one at a time first: its first request is the fresh server's first (TTFT against the warm ones after it)
    python -m atomlite.cli bench serve "${client[@]}" --num-prompts 8 --max-concurrency 1 --json "$OUT/serve1-$1.json"
    python -m atomlite.cli bench serve "${client[@]}" --num-prompts 256 --max-concurrency 64 --json "$OUT/serve64-$1.json"
    curl -s "http://127.0.0.1:$port/metrics" > "$OUT/metrics64-$1.txt"
    kill -TERM $pid; wait $pid; echo "server exit $?"
    tail -3 "$OUT/serve-$1.log"
    python -m atomlite.cli bench latency "${flags[@]}" --input-len 512 --output-len 128 --batch-size 1 --repeats 3
}

serve_images() {  # 31B with its vision tower (dummy weights) over HTTP: 16 concurrent chats of one 896x896 image each,
                  # then as many text-only completions of the same length; /health timed meanwhile; decode graph use
    local served=/tmp/g31v port=8012 pid
    python -m atomlite.benchmarks.bench_checkpoint examples/configs/gemma-4-31B-it-vision $served || return 1
    python -m atomlite.cli serve $served --load-format dummy --dtype bfloat16 --max-num-seqs 16 --max-model-len 2048 \
        --port $port > "$OUT/serve-images.log" 2>&1 &
    pid=$!
    until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
        kill -0 $pid 2> /dev/null || { cat "$OUT/serve-images.log"; return 1; }; sleep 2
    done
    local client=(--base-url "http://127.0.0.1:$port" --model $served --output-len 64 --max-concurrency 16)
    python -m atomlite.cli bench serve "${client[@]}" --num-prompts 4 --input-len 32 --images-per-prompt 1  # warm
    curl -s "http://127.0.0.1:$port/metrics" | grep '^atomlite:forward_passes'
    python -m atomlite.cli bench serve "${client[@]}" --num-prompts 64 --input-len 256 --images-per-prompt 1 \
        --image-size 896x896 --json "$OUT/serve-images.json"
    curl -s "http://127.0.0.1:$port/metrics" | grep '^atomlite:forward_passes'
    python -m atomlite.cli bench serve "${client[@]}" --num-prompts 64 --input-len 544 --json "$OUT/serve-text.json"
    kill -TERM $pid; wait $pid; echo "server exit $?"
    grep -E "graphs|vision|encoder" "$OUT/serve-images.log" | head -5
}

from_baseline() {  # COMMAND...: run it in baseline_code/ (git archive REV atomlite | tar -x -C baseline_code)
    if [ ! -d baseline_code/atomlite ]; then echo "no baseline_code/ (carry it)"; return 2; fi
    (cd baseline_code && ln -sfn ../examples examples && PYTHONPATH=. "$@")
}

stage() {
    case $1 in
        audio-ttft) python bench/audio_ttft.py --model examples/configs/gemma-4-E4B-it-audio --runs 20 ;;  # issue 58: 30 s clip vs text
        k-from-v) python bench/k_from_v.py ;;
        attn-b1) python bench/decode_attention.py ;;
        moe-bench) python bench/moe_layer.py ;;
        moe-sweep) python bench/moe_layer.py --sweep ;;
        fp4-small) python bench/fp4_gemm.py --ms 1,2,4,16 ;;
        fp4-row-copy) python bench/fp4_row_copy.py ;;  # many rows on the e4m3 weight copy against the packed path and bf16
        tests-fp4) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_mxfp4_gemm.py ;;
        moe-sweep-small) python bench/moe_layer.py --sweep --batches 1,4 ;;
        moe-decode-tiles) python bench/moe_decode_tiles.py ;;  # 26B-A4B batch-1 TPOT per few-pairs gate_up tile
        decode-gemms) for m in gemma-4-31B-it gemma-4-26B-A4B-it; do
                          python bench/decode_gemms.py --model examples/configs/$m --ms 1 --sweep --partial-sums; done
                      python bench/decode_gemms.py --model examples/configs/gemma-4-31B-it --ms 1 --sweep --partial-sums --tp 2 ;;
        tests-new) python -m pytest -q -x -m "gpu or not gpu" tests/kernels/test_moe_gpu.py tests/kernels/test_k_from_v.py \
                       tests/kernels/test_kv_fp8.py tests/kernels/test_moe_gemv.py ;;
        tests-graphs) python -m pytest -q -n 4 -m gpu tests/e2e/test_decode_graphs.py tests/e2e/test_gemma3_parity.py \
                          tests/e2e/test_vision_graphs.py tests/kernels/test_graph_capture.py \
                          tests/e2e/test_prefill_graphs.py ;;  # xdist: parallel compiles; about 5 min (prefill graphs)
        prefill-graphs-ab) for len in 2040 512; do for mode in FULL_DECODE_ONLY FULL_AND_PIECEWISE; do
                               echo "--- $len tokens, cudagraph_mode $mode"
                               python -m atomlite.cli bench latency --model examples/configs/gemma-4-26B-A4B-it \
                                   --load-format dummy --dtype bfloat16 --input-len $len --output-len 4 --batch-size 1 \
                                   --max-num-seqs 1 --max-model-len 2048 --repeats 5 \
                                   --compilation-config "{\"cudagraph_mode\": \"$mode\"}"
                           done; done ;;  # issue 56: 26B-A4B TTFT, eager prefill against prefill graphs, one call
        tests-kv) python -m pytest -q -n 4 -m "gpu or not gpu" tests/kernels/test_k_from_v.py tests/kernels/test_kv_fp8.py \
                      tests/kernels/test_kv_scales.py ;;
        tests-router) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_router_topk.py tests/e2e/test_decode_graphs.py \
                          -k "router or moe" ;;
        tests-fp8-gemv) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_kv_fp8.py tests/kernels/test_moe_gemv.py ;;
        tests-moe) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_moe_gemv.py tests/kernels/test_moe_gpu.py \
                       tests/kernels/test_mxfp4_moe.py ;;
        tests-audio-graphs) python -m pytest -q -m gpu tests/e2e/test_audio_graphs.py ;;  # issue 58: replay = eager
        tests-memory) python -m pytest -q -m gpu tests/e2e/test_memory_profile.py ;;  # alone: it fills 90% of the GPU
        tests-gpu) python -m pytest -q -n 4 -m "gpu or not gpu" tests/kernels/test_triton_attention.py tests/kernels/test_skinny_gemm.py \
                       tests/kernels/test_router_topk.py tests/kernels/test_triton_ops.py tests/kernels/test_k_from_v.py tests/kernels/test_kv_fp8.py \
                       tests/e2e/test_decode_graphs.py tests/kernels/test_branches.py tests/kernels/test_moe_gpu.py tests/kernels/test_mxfp4_gemm.py \
                       tests/kernels/test_moe_gemv.py tests/kernels/test_graph_capture.py ;;  # then tests-memory alone
        tests-kernels) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_triton_attention.py tests/kernels/test_triton_ops.py \
                           tests/kernels/test_skinny_gemm.py ;;
        serve-26b) serve_vs_engine gemma-4-26B-A4B-it ;;
        serve-31b) serve_vs_engine gemma-4-31B-it ;;
        prefill-26b) python bench/decode_profile.py --model examples/configs/gemma-4-26B-A4B-it --input-len 2000 \
                         --steps 2 && python bench/moe_layer.py --batches 2048 --sweep ;;
        tests-mxfp4-m) python -m pytest -q -m gpu tests/kernels/test_mxfp4_every_m.py tests/kernels/test_mxfp4_blockwise.py ;;
        prefill-31b-mxfp4) python bench/decode_profile.py --model examples/configs/gemma-4-31B-it-mxfp4 --input-len 2000 \
                               --steps 2 ;;
        31b-mxfp4-load) python -m atomlite.cli bench throughput --model examples/configs/gemma-4-31B-it-mxfp4 \
                            --load-format dummy --dtype bfloat16 --num-prompts 64 --input-len 512 --output-len 64 \
                            --max-num-seqs 64 --max-model-len 1024 ;;
        load-26b) load gemma-4-26B-A4B-it ;;
        load-31b) load gemma-4-31B-it ;;
        load-31b-mxfp4) load gemma-4-31B-it-mxfp4 ;;
        pool-31b) pool_rows gemma-4-31B-it ;;
        pool-26b) pool_rows gemma-4-26B-A4B-it ;;
        tests-images) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_bidirectional_attention.py \
                          tests/kernels/test_triton_attention.py && python bench/key_ends_prefill.py ;;
        encoder-attention) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_encoder_attention.py \
                               tests/e2e/test_memory_profile.py && python bench/encoder_attention.py ;;
        images-31b) python -m atomlite.cli bench latency --model examples/configs/gemma-4-31B-it-vision --load-format dummy \
                        --dtype bfloat16 --input-len 512 --output-len 16 --batch-size 1 --max-num-seqs 1 \
                        --max-model-len 2048 --repeats 5 --images-per-prompt 1 --image-size 896x896 ;;  # 1 image, 256 soft tokens
        images-31b-serve) serve_images ;;  # needs the serve extra (carry .whl/, see serve-26b)
        prefill-gaps) python bench/prefill_gaps.py --model examples/configs/gemma-4-26B-A4B-it --input-len 512,2048 \
                          && python bench/prefill_gaps.py --model examples/configs/gemma-4-31B-it ;;  # TTFT beyond kernels
        decode-26b-b1) python bench/decode_profile.py --model examples/configs/gemma-4-26B-A4B-it --timeline 40 ;;
        prefill-attention) python bench/prefill_attention.py ;;  # issue 56: each layer shape's prefill tiles
        moe-tails) python bench/moe_layer.py --batches 512,1024,2048,4096 --tails ;;  # issue 56: tail tiles
        moe-tp2) python bench/moe_layer.py --batches 512,2048 --projections -tp 2 ;;  # issue 56: one TP=2 rank's tiles
        moe-projections) python bench/moe_layer.py --batches 512,2048 --projections ;;  # prefill tiles, each projection
        ttft-26b) ttft_2040 gemma-4-26B-A4B-it ;;
        ab-fp8-26b) for run in "ttft_2040 gemma-4-26B-A4B-it-fp8-dynamic" "latency_b1 gemma-4-26B-A4B-it-fp8-dynamic" \
                               "ttft_2040 gemma-4-26B-A4B-it-fp8-dynamic"; do
                        echo "--- baseline: $run"; from_baseline bash -c "$(declare -f ttft_2040 latency_b1); $run"
                        echo "--- this tree: $run"; $run
                    done ;;  # issue 55: 26B-A4B FP8 prefill and batch 1, the baseline copy against this tree
        lora-31b) python bench/lora_tpot.py --model examples/configs/gemma-4-31B-it ;;  # 4 rank-16 adapters in 16
        lora-26b) python bench/lora_tpot.py --model examples/configs/gemma-4-26B-A4B-it --targets attention ;;
        lora-kernels) python bench/lora_kernels.py --sweep-expand ;;  # each 31B projection's LoRA against its GEMM, batch 16
        tests-lora) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_lora_kernels.py tests/e2e/test_lora_parity.py ;;
        spec-31b) speculative gemma-4-31B-it ;;
        spec-26b) speculative gemma-4-26B-A4B-it ;;
        verify-31b) python bench/verify_step.py --model examples/configs/gemma-4-31B-it ;;
        verify-26b) python bench/verify_step.py --model examples/configs/gemma-4-26B-A4B-it ;;
        train-assistant) python -m tools.demo_training.train_assistant --device cuda --max-seconds "${TRAIN_SECONDS:-220}" \
                             --out /tmp/assistant && tar -C /tmp -cf "$OUT/assistant.tar" assistant ;;
        tests-spec) python -m pytest -q -m "gpu or not gpu" tests/e2e/test_spec_decode.py tests/e2e/test_gemma4_assistant.py ;;
        tp-31b) tp_rows gemma-4-31B-it ;;  # nvidia-h100-x2
        tp-26b) tp_rows gemma-4-26B-A4B-it ;;
        ttft-rows) latency_b1 gemma-4-26B-A4B-it; tp_latency gemma-4-26B-A4B-it 1; tp_latency gemma-4-31B-it 1 ;;  # issue 56, TP=1
        tp-pairs) tp_pair gemma-4-26B-A4B-it; tp_pair gemma-4-31B-it ;;  # nvidia-h200-x2: TP=2 against TP=1, no nccl row
        tests-tp) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_one_shot_all_reduce.py \
                      tests/e2e/test_tensor_parallel_engine.py -k gpus ;;  # x2; each engine test takes over 100 s
        all-reduce) python bench/all_reduce.py ;;
        sustained-gemm) python bench/sustained_gemm.py ;;  # the GEMM rate after 50-400 ms of load, against the probe
        31b) latency gemma-4-31B-it ;;
        31b-fp8kv) latency gemma-4-31B-it --kv-cache-dtype fp8 ;;
        31b-mxfp4) latency gemma-4-31B-it-mxfp4 ;;
        fp8-gemm) python bench/fp8_gemm.py ;;
        fp8-decode-sweep) python bench/fp8_decode_sweep.py ;;  # issue 55: each FP8 decode way and tile against bf16
        fp8-experts) python bench/fp8_experts_decode.py ;;  # issue 55: 26B-A4B's FP8 experts at decode, each pair-block tile
        tests-fp8) python -m pytest -q -m "gpu or not gpu" tests/kernels/test_fp8_gemm.py tests/kernels/test_fp8_moe.py ;;
        fp8-b1) for model in gemma-4-31B-it gemma-4-31B-it-fp8-dynamic gemma-4-31B-it-fp8-block gemma-4-31B-it-quark-fp8 \
                             gemma-4-26B-A4B-it gemma-4-26B-A4B-it-fp8-dynamic gemma-4-26B-A4B-it-fp8-block; do
                    latency_b1 "$model"; done ;;  # issue 55: 31B FP8 <= 0.56x bf16, 26B-A4B FP8 <= 0.75x at batch 1
        ab-fp8-b1) for model in gemma-4-31B-it-fp8-dynamic gemma-4-31B-it-quark-fp8 gemma-4-26B-A4B-it-fp8-dynamic; do
                       echo "--- baseline: $model"; from_baseline bash -c "$(declare -f latency_b1); latency_b1 $model"
                       echo "--- this tree: $model"; latency_b1 "$model"
                   done ;;  # issue 55: FP8 batch 1, the baseline copy against this tree, model by model, one machine
        load-fp8) load gemma-4-31B-it; load gemma-4-31B-it-fp8-dynamic; load gemma-4-31B-it-fp8-block ;;
        26b) latency gemma-4-26B-A4B-it ;;
        26b-b1) latency_b1 gemma-4-26B-A4B-it ;;
        ab-26b-b1) from_baseline bash -c "$(declare -f latency_b1); latency_b1 gemma-4-26B-A4B-it" \
                       && latency_b1 gemma-4-26B-A4B-it ;;  # the baseline copy, then this tree, one machine
        ab-models) for run in "latency gemma-4-26B-A4B-it" "latency_b1 gemma-4-26B-A4B-it" \
                              "latency_b1 gemma-4-31B-it" "latency_b1 gemma-4-31B-it-mxfp4"; do
                       echo "--- baseline: $run"; from_baseline bash -c "$(declare -f latency latency_b1); $run"
                       echo "--- this tree: $run"; $run
                   done ;;  # the baseline copy and this tree side by side, model by model, one machine
        train-demo) python -m tools.demo_training.train --device cuda --max-seconds "${TRAIN_SECONDS:-470}" ${TRAIN_ARGS:-} --out /tmp/demo \
                        && tar -C /tmp -cf "$OUT/demo.tar" demo ;;  # one file back instead of six
        26b-profile) python bench/decode_profile.py --model examples/configs/gemma-4-26B-A4B-it --enforce-eager ;;
        31b-mxfp4-profile) python bench/decode_profile.py --model examples/configs/gemma-4-31B-it-mxfp4 ;;
        *) echo "unknown stage $1"; return 2 ;;
    esac
}

for name in "$@"; do
    echo "=== $name $(date +%T)"
    stage "$name" 2>&1 | tee "$OUT/$name.log"
    echo "=== $name rc=${PIPESTATUS[0]} ${SECONDS}s"
done
