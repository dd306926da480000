#!/usr/bin/env bash
# One GPU session: every GPU figure and check of hpc-train in <= 5 minutes on one H200 (issue 10).
#
#   benchmarks/gpu_session.sh [OUT_DIR]              # on the GPU machine, from any directory
#   benchmarks/gpu_session.sh --cpu-smoke [OUT_DIR]  # the script itself on a CPU: tiny sizes, no GPU stages
#
# Uses the machine's own python3 and torch (no install, no network), the repository on PYTHONPATH.
# Every stage runs under its own `timeout` (a slow stage costs only itself) and appends one JSON line to
# OUT_DIR/session.jsonl as it ends — {"stage", "rc", "wall_s", "timed_out", "log"} — echoed to stdout:
#
#   data       (20 s) CIFAR-10 python files with random pixels (the official sizes) -> OUT_DIR/data
#   recipe     (75 s) the 200-epoch LDAM-DRW recipe, bf16 + channels_last, captured (cuda_graphs auto):
#                     python -m hpc_train.train jobs/cifar10_lt_ldam_drw.yaml --set train.data.root=...
#                     its end line ("200 epochs in S s (...)") goes into the stage's JSON as "end_line"
#   bench      (55 s) benchmarks/gpu.py: eager / captured / compiled-in-capture vs the reference loop
#   gpu_check (150 s) tests/train/gpu_check.py: one PASS/FAIL line per check
#
# Caps add up to 300 s. Exit status: 0 when every stage exited 0.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
smoke=0
if [[ ${1:-} == --cpu-smoke ]]; then smoke=1; shift; fi
dir=${1:-gpu-session-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir"
out=$(cd "$dir" && pwd)
py=${PYTHON:-python3}
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HPC_TRAIN_SITE="$out/site.yaml"
echo '{}' > "$out/site.yaml"
: > "$out/session.jsonl"
cd "$repo" || exit 2
status=0

# stage NAME LIMIT_S COMMAND...: run it under `timeout`, append its JSON line.
stage() {
    local name=$1 limit=$2 start ms rc timed_out=false line
    shift 2
    start=$(date +%s%N)
    timeout --kill-after=5 "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    if [[ $rc == 124 || $rc == 137 ]]; then timed_out=true; fi
    if [[ $rc != 0 ]]; then status=1; fi
    line=$(printf '{"stage": "%s", "rc": %d, "wall_s": %d.%01d, "timed_out": %s, "log": "%s"}' \
        "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$timed_out" "$out/$name.log")
    echo "$line" >> "$out/session.jsonl"
    echo "$line"
}

if [[ $smoke == 1 ]]; then
    data_args=(--tiny)
    recipe_args=(--epochs 2 --set train.device=cpu --set slurm.gpus_per_node=0 --set 'train.amp="off"'
                 --set train.channels_last=false --set train.eval_batch_size=200)
    bench_args=(--device cpu --tiny --rounds 1)
    check_args=(--cpu-smoke)
else
    data_args=()
    recipe_args=(--set train.amp=bf16 --set train.channels_last=true)
    bench_args=(--budget-s 45)
    check_args=()
fi

nvidia-smi -L > "$out/gpus.txt" 2>&1 || true
stage data 20 "$py" benchmarks/cifar_files.py --root "$out/data" "${data_args[@]}"
stage recipe 75 "$py" -m hpc_train.train jobs/cifar10_lt_ldam_drw.yaml --set "train.data.root=$out/data" \
    --run-dir "$out/recipe-run" "${recipe_args[@]}"
end_line=$(grep -E '^[0-9]+ epochs in ' "$out/recipe.log" | tail -1)
# Progress reached, from the run's status (useful when the stage timed out).
progress=$(grep '"writer": "trainer"' "$out/recipe-run/state.jsonl" 2>/dev/null | tail -1 \
    | sed -e 's/.*"epoch": \([0-9]*\).*"global_step": \([0-9]*\).*/\1 epochs, \2 steps/' || true)
printf '{"stage": "recipe_result", "end_line": "%s", "progress": "%s"}\n' "$end_line" "$progress" \
    | tee -a "$out/session.jsonl"
stage bench 55 "$py" benchmarks/gpu.py --out "$out/gpu_bench.json" "${bench_args[@]}"
stage gpu_check 150 "$py" tests/train/gpu_check.py --out "$out/gpu_check.json" "${check_args[@]}"
grep -E '^(PASS|FAIL|SKIP) ' "$out/gpu_check.log" || true
echo "session: $out (exit $status)"
exit "$status"
