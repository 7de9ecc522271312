#!/usr/bin/env bash
# The GPU check: one prepared run of the probe on an H200 (see /work/shared/gpu-check.md).
#
#   bench/gpu_check.sh             # on the GPU box: real configs, --device cuda
#   bench/gpu_check.sh --dry-run   # anywhere: tiny configs on the CPU, checks the script itself
#
# Every step logs to $OUT (default ./gpu-check-out): nvidia-smi, package versions, one memtest
# JSON + log per sweep, and summary.log with each step's exit code and seconds. Each sweep stops
# at its first OOM by design (the probe records it); the script always goes on to the next one.
# The probe runs from the source tree (PYTHONPATH=.), no pip install: the H200 image reaches no
# package registry. GPU time: each sweep has a soft limit (--time-limit: no new length after it)
# (2/3 of the hard one) and a hard one (timeout); the hard limits add up to 6.2 minutes.
#
# Sweeps (/work/shared/gpu-check.md): the seed case with the probe's own loop (chunked loss, full
# loss, offloaded checkpoints), a dense Llama-3.1-8B full fine-tune, then the `hf` stack
# (transformers Trainer + peft, as users run it) for the seed case and for Llama-3.1-8B LoRA with
# lora_dropout 0.05 and gradient accumulation 2, and Liger (`--loss liger`, Trainer's
# use_liger_kernel) where liger-kernel imports, both with an evaluation pass of 4 rows after each
# length (`--eval-batch 4`: Trainer.evaluate()), and QLoRA (bitsandbytes NF4) on the hf stack.
# Unsloth: the probe has no Unsloth stack; the script records whether `import unsloth` works
# there, nothing more. Wheels the box lacks (liger-kernel, flash-linear-attention, bitsandbytes)
# can travel in ./wheelhouse; installed with --no-index.
# Each memtest records max_memory_allocated, max_memory_reserved and, per length,
# torch.cuda.mem_get_info before and after (`results[i].device_memory`: context + workspaces).
#
# Environment: OUT, PYTHON (default python3), DRY_RUN=1 (same as --dry-run), WHEELHOUSE.
set -u -o pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu-check-out}
PY=${PYTHON:-python3}
DRY=${DRY_RUN:-0}
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; fi
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

TARGETS=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,in_proj_qkv,in_proj_z,out_proj
if [[ "$DRY" == 1 ]]; then
  DEVICE=cpu
  SEED_CONFIG=tests/data/configs/tiny-qwen3.5.json
  DENSE_CONFIG=tests/data/configs/tiny-llama.json
  SEED_SWEEP=64,128,192
  DENSE_SWEEP=64,128,256
  SEED_STEPS=2
  DENSE_STEPS=2
  LIMITS=(90 90 90 90 90 90 60 60)  # hard limits per sweep, seconds
else
  DEVICE=cuda
  SEED_CONFIG=tests/data/configs/qwen3.5-27b.json
  DENSE_CONFIG=tests/data/configs/Llama-3.1-8B.json
  SEED_SWEEP=16000,32000,48000
  DENSE_SWEEP=2048,4096,8192
  SEED_STEPS=2             # 2 steps: the second one has the optimizer states
  DENSE_STEPS=2
  # 70+40+45+30+50+30+30+45 = 340 s of hard limits (each includes loading the random model),
  # plus 50 s for fla's compiles (fla-warmup) and about 30 s for the steps before it: 7 min.
  # On 2026-12-04 the 8B sweeps took 23-29 s, QLoRA 61 s with its checkpoint on disk.
  LIMITS=(70 40 45 30 50 30 30 45)
fi

SUMMARY="$OUT/summary.log"
: >"$SUMMARY"

# limit_for NAME DEFAULT: $LIMIT_<NAME> (dashes as underscores) if set, else DEFAULT
limit_for() {
  local var="LIMIT_${1//-/_}"
  echo "${!var:-$2}"
}

# run NAME HARD_LIMIT_S COMMAND...: log to $OUT/NAME.log, record rc and seconds, never abort.
# With ONLY set (names separated by spaces), steps not named there are skipped: a rerun of the
# sweeps that failed, in the device time that is left. LIMIT_<name> (dashes as underscores)
# replaces a step's hard limit.
run() {
  local name=$1 limit=$2
  shift 2
  local start rc
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then
    echo "== $name: skipped (not in ONLY)" >>"$SUMMARY"
    return 0
  fi
  limit=$(limit_for "$name" "$limit")
  start=$(date +%s)
  echo "== $name: $*" | tee -a "$SUMMARY"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "   $name rc=$rc seconds=$(($(date +%s) - start))" | tee -a "$SUMMARY"
  return 0
}

if command -v nvidia-smi >/dev/null 2>&1; then
  run nvidia-smi 30 nvidia-smi
else
  echo "== nvidia-smi: not found (dry run: $DRY)" | tee -a "$SUMMARY"
fi
# Wheels the image lacks, installed with --no-deps into a folder of their own that goes on
# PYTHONPATH (the image's site-packages stays untouched): bitsandbytes (8-bit AdamW, QLoRA),
# liger-kernel, and flash-linear-attention + fla-core, the Triton kernels transformers calls for
# Qwen3.5's Gated DeltaNet layers when `fla` imports (without them its torch reference runs,
# whose memory is not the kernel's; probe/linear_attention.py).
WHEELHOUSE=${WHEELHOUSE:-./wheelhouse}
SITE=${SITE:-/tmp/trainfit-site}
if [[ "$DRY" != 1 && -d "$WHEELHOUSE" ]]; then
  run wheelhouse 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
    "$WHEELHOUSE"/*.whl
  export PYTHONPATH="$PYTHONPATH:$SITE"
fi
# Triton keeps autotuning results on disk, so a kernel tuned in one sweep is not retuned in the
# next (fla's and Liger's kernels are autotuned on first use).
export TRITON_CACHE_AUTOTUNING=1
run versions 60 "$PY" -m pip show torch transformers peft accelerate bitsandbytes trl liger-kernel \
  flash-linear-attention fla-core triton
run unsloth-import 60 "$PY" -c "import unsloth; print('unsloth', unsloth.__version__)"
run torch-info 60 "$PY" -c "import torch, sys; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda device')"

OPTIMIZER=adamw
if [[ "$DEVICE" == cuda ]] && "$PY" -c "import bitsandbytes" >/dev/null 2>&1; then
  OPTIMIZER=adamw-8bit
fi
echo "== seed optimizer: $OPTIMIZER" | tee -a "$SUMMARY"

# fla's kernels compiled and tuned once, at the seed model's head shapes, so that no sweep
# spends its limit on them (bench/fla_warmup.py; exits 2 without CUDA or fla)
run fla-warmup 50 "$PY" bench/fla_warmup.py "$SEED_CONFIG"

probe() {  # probe NAME HARD_LIMIT_S PROBE_ARGS...
  local name=$1 limit
  limit=$(limit_for "$1" "$2")
  shift 2
  run "$name" "$limit" "$PY" -m probe --device "$DEVICE" --no-progress --timings \
    --time-limit $((limit * 2 / 3)) --out "$OUT/memtest_$name.json" "$@"
}

SEED=(--config "$SEED_CONFIG" --method lora --lora-rank 16 --lora-targets "$TARGETS"
  --optimizer "$OPTIMIZER" --precision bf16 --sweep "$SEED_SWEEP" --steps "$SEED_STEPS")

# 1. the seed case: checkpoints on the GPU, chunked loss
probe seed-gpu-chunked "${LIMITS[0]}" "${SEED[@]}" --checkpointing gpu --loss chunked
# 2. the same with full logits
probe seed-gpu-full "${LIMITS[1]}" "${SEED[@]}" --checkpointing gpu --loss full
# 3. the same with the checkpoints offloaded to the host
probe seed-offload-chunked "${LIMITS[2]}" "${SEED[@]}" --checkpointing offload --loss chunked
# 4. a dense second architecture: full fine-tune, AdamW
probe dense-full "${LIMITS[3]}" --config "$DENSE_CONFIG" --method full --optimizer adamw \
  --precision bf16 --checkpointing gpu --loss full --sweep "$DENSE_SWEEP" --steps "$DENSE_STEPS"

# 5. the hf stack (transformers Trainer + peft) for the seed case: the Trainer has no chunked
#    loss, so its own (full logits); autocast and fused AdamW / adamw_bnb_8bit as users run it
probe hf-seed "${LIMITS[4]}" "${SEED[@]}" --stack hf --checkpointing gpu --loss full
# 6. the hf stack, Llama-3.1-8B LoRA r16 with lora_dropout 0.05 and gradient accumulation 2
HF_DENSE=(--config "$DENSE_CONFIG" --stack hf --method lora --lora-rank 16 --lora-dropout 0.05
  --grad-accum 2 --checkpointing gpu --sweep "$DENSE_SWEEP" --steps "$DENSE_STEPS")
#    and, after each length, Trainer.evaluate() on 4 rows (the evaluation pass, results[i].evaluation)
probe hf-llama-lora "${LIMITS[5]}" "${HF_DENSE[@]}" --loss full --eval-batch 4
# 7. the same with Liger's fused linear cross entropy, where liger-kernel imports (CUDA only;
#    elsewhere the probe exits 2 saying so, which the summary records); Liger skips the logits
#    in training only, so its evaluation makes them
probe hf-llama-lora-liger "${LIMITS[6]}" "${HF_DENSE[@]}" --loss liger --eval-batch 4
# 8. QLoRA as users run it: the same, with the base in bitsandbytes 4-bit NF4 (CUDA only;
#    without bitsandbytes or off CUDA the probe exits 2 saying so)
# (the last --method wins)
probe hf-llama-qlora "${LIMITS[7]}" "${HF_DENSE[@]}" --loss full --method qlora

if command -v nvidia-smi >/dev/null 2>&1; then
  run nvidia-smi-after 30 nvidia-smi
fi

echo "== done; memtests:" | tee -a "$SUMMARY"
ls -1 "$OUT"/memtest_*.json 2>/dev/null | tee -a "$SUMMARY"
