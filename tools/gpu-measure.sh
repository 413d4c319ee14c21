#!/usr/bin/env bash
# Measures on a CUDA GPU what carma's models predict, and writes it to DIR (default: $OUT):
#   env.txt              GPU, driver, CUDA, torch, torchvision, transformers versions
#   memory-heldout.csv   peak memory of the held-out jobs (python -m carma_profile.measure)
#   memory-carma.csv     peak memory of CARMA's single-GPU jobs on this GPU
#   interference.csv     steps per second alone, in pairs and in threes, SM activity
#                        (tools/measure-interference.py)
#   activity.log         every SM activity sample
#   attention.csv        each SDPA backend's memory for the models the trace misses (tools/gpu-probe-attention.py)
#   breakdown-*.json/txt what the GPU keeps beside what the trace keeps, by module and operator, for
#                        the jobs the traced estimate misses (python -m carma_profile.device_breakdown)
#   log.txt              everything printed
#
#   bash tools/gpu-measure.sh [DIR]
#
# CARMA_GPU_BUDGET_S (default 420) bounds the whole run: each part gets a deadline from
# what is left, and a part cut short keeps the rows it wrote. CARMA_WORKLOADS names CARMA's
# .rad task files (default ../shared/traces/carma/v2/workloads). CARMA_GPU_PARTS picks the parts, in
# this order (default: all): heldout breakdown carma interference attention.
set -u
out=${1:-${OUT:?give a directory}}
mkdir -p "$out"
budget=${CARMA_GPU_BUDGET_S:-420}
workloads=${CARMA_WORKLOADS:-../shared/traces/carma/v2/workloads}
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
export PYTHONPATH=$PWD/estimator/profile${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
log=$out/log.txt
step() { echo "== $(date -u +%H:%M:%S) $* ($(left) s left)" | tee -a "$log"; }

step env
{
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 - <<'EOF'
import sys
import torch, torchvision, transformers
print("python", sys.version.split()[0])
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("torchvision", torchvision.__version__, "transformers", transformers.__version__)
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory >> 20, "MiB")
EOF
  python3 -m pip show nvidia-ml-py 2>/dev/null | head -2
} >"$out/env.txt" 2>&1
cat "$out/env.txt" >>"$log"

want() { [[ " ${CARMA_GPU_PARTS:-heldout breakdown carma interference attention} " == *" $1 "* ]]; }

# The jobs whose traced estimate misses their measured peak or whose replay misses the GPU's
# reservation (docs/traced-estimate.md), each taken apart on the GPU in a process of its own.
BREAKDOWN_JOBS=("t5-small (seq2seq)" "vit_b_16" "wide_resnet50_2" "efficientnet_b3"
  "bert-base (masked LM, bf16 autocast)" "gpt2 (causal LM, bf16 autocast)" "opt-125m (causal LM)"
  "bert-large (masked LM)")

# Each part's deadline is a share of the time left when it starts; a part cut short keeps its rows.
share() { local v=$(($(left) * $1 / 100)); echo $((v > 10 ? v : 10)); }

if want heldout; then
  step "memory: held-out jobs"
  python3 -m carma_profile.measure --set heldout --out "$out/memory-heldout.csv" --parallel 3 \
    --deadline-s "$(share 27)" 2>&1 | tee -a "$log"
fi
if want breakdown; then
  step "breakdown: what the GPU keeps beside the trace"
  until=$(( $(date +%s) + $(share 30) ))
  for job in "${BREAKDOWN_JOBS[@]}"; do
    slug=$(printf '%s' "$job" | tr -c 'A-Za-z0-9' '_')
    rest=$(( until - $(date +%s) ))
    if [ "$rest" -lt 20 ]; then echo "breakdown: not run (no time left): $job" | tee -a "$log"; continue; fi
    extra=()
    [ "$job" = "bert-large (masked LM)" ] && extra=(--batch 8)
    timeout "$rest" python3 -m carma_profile.device_breakdown "$job" "${extra[@]}" \
      --out "$out/breakdown-$slug.json" >"$out/breakdown-$slug.txt" 2>&1
    echo "breakdown: $job: exit $?" | tee -a "$log"
    cat "$out/breakdown-$slug.txt" >>"$log"
  done
fi
if want carma; then
  step "memory: CARMA's jobs"
  python3 -m carma_profile.measure --set carma --workloads "$workloads" --out "$out/memory-carma.csv" \
    --parallel 3 --deadline-s "$(share 36)" 2>&1 | tee -a "$log"
fi
if want interference; then
  step "interference"
  python3 tools/measure-interference.py --out "$out" --window-s 5 --settle-s 1.5 --triples \
    --deadline-s "$(share "$(want attention && echo 60 || echo 90)")" 2>&1 | tee -a "$log"
fi
if want attention; then
  step "attention backends"
  python3 tools/gpu-probe-attention.py --out "$out" --deadline-s "$(share 90)" 2>&1 | tee -a "$log"
fi
step done
