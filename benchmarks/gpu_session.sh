#!/usr/bin/env bash
# One GPU session: every GPU figure and check of hpc-train on one H200, in one command (issue 21).
#
#   benchmarks/gpu_session.sh [--cpu-smoke] [--only STAGE,...] [OUT_DIR]
#
#   --cpu-smoke  the script itself on a CPU: tiny sizes, the GPU-only parts skipped (saying why), and
#                submitit made unimportable, as on the GPU machine (nothing on this path may need it)
#   --only       run these stages only (a rerun of what failed; recipe always regenerates its data)
#
# Uses the machine's own python3 (PYTHON=... to choose; --cpu-smoke takes the repository's .venv where
# there is one) and torch: no install, no network, the repository on PYTHONPATH. Every stage runs under
# its own `timeout` (a slow stage costs only itself), shortened to fit
# the session's deadline (GPU_SESSION_S, 560 s: under the device tool's 600 s per command; a stage with
# less than 20 s left is skipped), and appends to OUT_DIR/session.jsonl as it ends: one line
# {"stage", "rc", "wall_s", "cap_s", "timed_out", "log"} and one "<stage>_result" line of its figures
# (benchmarks/gpu_session_results.py); the last line is {"stage": "session", ...}.
#
#   stage      cap    what
#   data       20 s   CIFAR-10 python files with random pixels, the official 50,000 / 10,000 images
#   recipe    110 s   the 200-epoch LDAM-DRW speed recipe end to end: bf16 (one bf16 weight copy), channels_last,
#                     captured (python -m hpc_train.train jobs/cifar10_lt_ldam_drw_fast.yaml ...): its end line
#   bench     150 s   benchmarks/gpu.py: reference, eager, captured timed first; compiled last, if time allows
#   gpu_check 150 s   tests/unit/train/gpu_check.py: one PASS/FAIL/SKIP line per check
#   pack      150 s   benchmarks/gpu_pack.py: K = 4 packed runs vs one, then under MPS if it starts
#
# OUT_DIR holds small files only, none in a subfolder (what a device session brings back: 8 files at
# most): session.jsonl, gpu_bench.json, gpu_check.json, gpu_pack.json and logs.tar.gz (every stage's log,
# the runs' logs and small files, no checkpoints; refreshed after each stage). The bulky files (~180 MB of
# CIFAR files, run directories, checkpoints) stay in GPU_SESSION_WORK (default /tmp/hpc-train-gpu-session).
# Exit status: 0 when every stage that was asked for exited 0; 2 on bad arguments.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
stages="data recipe bench gpu_check pack"
smoke=0
only=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --cpu-smoke) smoke=1; shift ;;
        --only) only=${2:-}; shift 2 || { echo "gpu_session.sh: --only needs a list of stages" >&2; exit 2; } ;;
        -*) echo "gpu_session.sh: unknown option $1 (--cpu-smoke, --only STAGE,...)" >&2; exit 2 ;;
        *) break ;;
    esac
done
for name in ${only//,/ }; do
    if [[ " $stages " != *" $name "* ]]; then
        echo "gpu_session.sh: no stage '$name' (stages: $stages)" >&2
        exit 2
    fi
done
if [[ -n $only && ,$only, == *,recipe,* && ,$only, != *,data,* ]]; then only="data,$only"; fi
dir=${1:-gpu-session-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir" || exit 2
out=$(cd "$dir" && pwd)
work=${GPU_SESSION_WORK:-/tmp/hpc-train-gpu-session}
session_s=${GPU_SESSION_S:-560}
py=${PYTHON:-python3}
if [[ $smoke == 1 && -z ${PYTHON:-} && -x $repo/.venv/bin/python ]]; then py=$repo/.venv/bin/python; fi  # make venv's
mkdir -p "$work/logs" || exit 2
echo '{}' > "$work/site.yaml"
pythonpath=$repo
if [[ $smoke == 1 ]]; then  # as on the GPU machine: no submitit
    mkdir -p "$work/no-submitit/submitit"
    echo 'raise ImportError("submitit is not installed on the GPU machine (gpu_session.sh --cpu-smoke)")' \
        > "$work/no-submitit/submitit/__init__.py"
    pythonpath=$work/no-submitit:$repo
fi
export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HPC_TRAIN_SITE="$work/site.yaml"
cd "$repo" || exit 2
status=0
began=$(date +%s)

wanted() { [[ -z $only || ,$only, == *,$1,* ]]; }

: > "$out/session.jsonl"  # this call's lines; a stage that runs replaces its report, the others' stay
for name in bench:gpu_bench gpu_check:gpu_check pack:gpu_pack; do
    wanted "${name%%:*}" && rm -f "$out/${name#*:}.json"
done

emit() { echo "$1" >> "$out/session.jsonl"; echo "$1"; }

# The logs and the runs' small files, in one archive (no checkpoints, data, compile caches or sockets).
pack_logs() {
    local parts=() part
    for part in logs recipe-run gpu-check pack gpus.txt; do [[ -e $work/$part ]] && parts+=("$part"); done
    tar -czf "$out/logs.tar.gz.part" -C "$work" --exclude='*.pt' --exclude='*.pth' --exclude='compile-cache' \
        --exclude='mps-pipe' "${parts[@]}" 2>/dev/null
    mv -f "$out/logs.tar.gz.part" "$out/logs.tar.gz"
}

# stage NAME CAP_S COMMAND...: run it under `timeout` (the cap, or what the session has left), append its lines.
stage() {
    local name=$1 cap=$2 start ms rc timed_out=false left result
    shift 2
    wanted "$name" || return 0
    left=$(( session_s - ($(date +%s) - began) - 10 ))
    if (( left < 20 )); then
        emit "{\"stage\": \"$name\", \"skipped\": \"session deadline: $left s left of GPU_SESSION_S=$session_s\"}"
        status=1
        return 0
    fi
    (( cap > left )) && cap=$left
    start=$(date +%s%N)
    timeout --kill-after=5 "$cap" "$@" > "$work/logs/$name.log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    if [[ $rc == 124 || $rc == 137 ]]; then timed_out=true; fi
    if [[ $rc != 0 ]]; then status=1; fi
    emit "$(printf '{"stage": "%s", "rc": %d, "wall_s": %d.%01d, "cap_s": %d, "timed_out": %s, "log": "logs/%s.log"}' \
        "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$cap" "$timed_out" "$name")"
    if [[ $name != data ]]; then
        result=$("$py" benchmarks/gpu_session_results.py "$name" "$work" "$out" 2> "$work/logs/$name-result.err")
        [[ $result == "{"* ]] || result="{\"stage\": \"${name}_result\", \"error\": \"see logs/$name-result.err\"}"
        [[ -s $work/logs/$name-result.err ]] || rm -f "$work/logs/$name-result.err"
        emit "$result"
    fi
    pack_logs
}

if [[ $smoke == 1 ]]; then
    data_args=(--tiny)
    recipe_args=(--epochs 2 --set train.device=cpu --set slurm.gpus_per_node=0 --set 'train.amp="off"'
                 --set train.channels_last=false --set train.eval_batch_size=200)
    bench_args=(--device cpu --tiny --rounds 1)
    check_args=(--cpu-smoke)
    pack_args=(--device cpu --tiny --k 2 --epochs 2)
else
    data_args=()
    recipe_args=()  # the speed switches are the recipe's own
    bench_args=(--budget-s 140 --compile-reserve-s 80)
    check_args=()
    pack_args=(--k 4 --epochs 3 --timeout-s 45)
fi

nvidia-smi -L > "$work/gpus.txt" 2>&1 || true
wanted recipe && rm -rf "$work/recipe-run"
wanted gpu_check && rm -rf "$work/gpu-check"
stage data 20 "$py" benchmarks/cifar_files.py --root "$work/data" "${data_args[@]}"
stage recipe 110 "$py" -m hpc_train.train jobs/cifar10_lt_ldam_drw_fast.yaml --set "train.data.root=$work/data" \
    --run-dir "$work/recipe-run" "${recipe_args[@]}"
stage bench 150 "$py" benchmarks/gpu.py --out "$out/gpu_bench.json" "${bench_args[@]}"
stage gpu_check 150 "$py" tests/unit/train/gpu_check.py --out "$out/gpu_check.json" --keep "$work/gpu-check" \
    "${check_args[@]}"
stage pack 150 "$py" benchmarks/gpu_pack.py --out "$out/gpu_pack.json" --work "$work/pack" "${pack_args[@]}"
pack_logs
emit "$(printf '{"stage": "session", "rc": %d, "wall_s": %d, "smoke": %s, "out": "%s", "work": "%s", "files": "%s"}' \
    "$status" $(( $(date +%s) - began )) "$([[ $smoke == 1 ]] && echo true || echo false)" "$out" "$work" \
    "$(find "$out" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' ' | sed 's/ $//')")"
exit "$status"
