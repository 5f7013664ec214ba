#!/usr/bin/env bash
# The prepared GPU session (bench/README.md, "On a GPU"). Run from the repository root on the
# lent machine, with gpu-kit/ carried (`make gpu-kit` here first):
#
#   bash bench/gpu_session.sh [PART ...]        PARTS: kit startup warmup table1 graphs gpu nlg (default: kit table1 gpu nlg)
#
# kit     installs the kit into the machine's Python with pip, offline (--no-deps only if the
#         resolving install fails), then `python -m darel.tools.gpu_kit --check` (every import,
#         MLflow on SQLite, codecarbon's offline tracker);
# startup bench/job_startup.py: what one job pays before its work (torch, CUDA context, MLflow, codecarbon);
# warmup  bench/gpu_warmup.py: what a run's first epoch pays once, cuDNN's algorithm search on and off;
# table1  `snakemake --cores N results/table1.csv --config profile=$GPU_PROFILE`, exactly as a user
#         runs it; the table, the cell records, the MLflow store and the logs come back packed;
# graphs  the same build with the profile's step switched to `compile: graphs` (what the paper
#         profile runs): the training loop, the calibration probes' compilations and their memory
#         under CUDA graphs, packed as table1_graphs_run.tar.gz (after table1 it re-runs the jobs
#         whose parameters changed: all but the data set's);
# gpu     bench/gpu.py: the previous and the new ResNet18 training step side by side (item 4);
# nlg     bench/nlg.py: the reference and the batched beam-10 decoder side by side (item 5).
#
# Every part runs under its own time box, cut further so that the whole session ends within
# GPU_SESSION_BUDGET_S (one device call is at most 600 s); a part that fails or runs out of time
# is recorded and the next one still runs. What comes back ($OUT, by part): summary.md,
# kit.log, startup.txt/.json, warmup.txt/.json, table1_run.tar.gz, table1_graphs_run.tar.gz,
# gpu_bench.txt/.json, nlg_bench.txt/.json.
#
# Settings (environment): PYTHON (python3), OUT (./gpu-session-out when unset), GPU_PROFILE (gpu),
# SNAKEMAKE_CONFIG (profile=$GPU_PROFILE), CORES (all), KIT_DIR (gpu-kit), GPU_SESSION_BUDGET_S
# (570), KIT_S/STARTUP_S/WARMUP_S/TABLE1_S/GRAPHS_S/GPU_S/NLG_S (each part's box), GPU_BENCH_ARGS,
# NLG_BENCH_ARGS.
set -uo pipefail

PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-session-out}
GPU_PROFILE=${GPU_PROFILE:-gpu}
SNAKEMAKE_CONFIG=${SNAKEMAKE_CONFIG:-profile=$GPU_PROFILE}
CORES=${CORES:-$(nproc)}
KIT_DIR=${KIT_DIR:-gpu-kit}
BUDGET_S=${GPU_SESSION_BUDGET_S:-570}
GPU_BENCH_ARGS=${GPU_BENCH_ARGS:---device cuda --models resnet18}
NLG_BENCH_ARGS=${NLG_BENCH_ARGS:---device cuda --model medium --steps 10 --warmup-steps 2 --decode-n 64 --decode-reference-batches 32 64 --decode-batches 32 64 --decode-check-fp32 8}
declare -A BOX=([kit]=${KIT_S:-90} [startup]=${STARTUP_S:-60} [warmup]=${WARMUP_S:-60} [table1]=${TABLE1_S:-240} [graphs]=${GRAPHS_S:-300} [gpu]=${GPU_S:-170} [nlg]=${NLG_S:-70})
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(kit table1 gpu nlg)

mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MLFLOW_DISABLE_TELEMETRY=true PYTHONUNBUFFERED=1
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
RESERVE_S=20  # packing the results and writing the summary
TABLE1_LOG=$(mktemp -d)/table1_snakemake.log  # packed into table1_run.tar.gz
GRAPHS_LOG=$(dirname "$TABLE1_LOG")/table1_graphs_snakemake.log  # packed into table1_graphs_run.tar.gz
SUMMARY="$OUT/summary.md"
ROWS=()

{
  echo "# GPU session $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "parts: ${PARTS[*]}; budget ${BUDGET_S} s; profile config: $SNAKEMAKE_CONFIG; cores $CORES"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | head -3 || true
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda',
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>&1 | tail -1
  echo '```'
} > "$SUMMARY"

# run_part NAME LOG CMD...: CMD under the part's box (cut to what the budget leaves); records the outcome.
run_part() {
  local name=$1 log=$2
  shift 2
  local now left limit began rc status
  now=$(date +%s)
  left=$((DEADLINE - RESERVE_S - now))
  limit=${BOX[$name]}
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 30 ]; then
    ROWS+=("| $name | skipped: ${left} s left in the budget | | |")
    return 1
  fi
  began=$(date +%s)
  echo "== $name (up to ${limit} s): $*" >> "$log"
  timeout --signal=INT --kill-after=15 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="timed out after ${limit} s" ;;
    *) status="failed (exit $rc)" ;;
  esac
  ROWS+=("| $name | $status | $(( $(date +%s) - began )) s | $(basename "$log") |")
  return $rc
}

install_kit() {
  if [ ! -f "$KIT_DIR/requirements.txt" ]; then
    echo "no $KIT_DIR/requirements.txt: run 'make gpu-kit' on the CPU machine and carry $KIT_DIR"
    return 2
  fi
  local pip=("$PY" -m pip install -q --no-index --no-cache-dir --no-compile --find-links "$KIT_DIR"
             --find-links "$KIT_DIR/spares")
  if ! "${pip[@]}" -r "$KIT_DIR/requirements.txt"; then
    echo "KIT: the resolving install failed (above); installing the kit's wheels without dependencies"
    "${pip[@]}" --no-deps "$KIT_DIR"/*.whl || return 1
  fi
  "$PY" -m pip check || echo "KIT: pip check reports the conflicts above"
  mkdir -p /tmp/gpu-kit-check
  "$PY" -m darel.tools.gpu_kit --check /tmp/gpu-kit-check
}

build_table1() {
  "$PY" -m snakemake --cores "$CORES" results/table1.csv --config $SNAKEMAKE_CONFIG
}

build_table1_graphs() {
  "$PY" -m snakemake --cores "$CORES" results/table1.csv --config $SNAKEMAKE_CONFIG \
    "profiles={$GPU_PROFILE: {compile: graphs}}"
}

# The table, the cell records, the MLflow store, the logs: everything but weights, checkpoints
# and data arrays, which the summary does not need and which would not fit the way back.
# pack_table1 ARCHIVE SNAKEMAKE_LOG
pack_table1() {
  "$PY" - "$1" "$2" <<'EOF'
import sys, tarfile
from pathlib import Path
keep = [Path("results/table1.csv"), Path("mlflow.db")]
for folder in ("results", "runs", "logs", ".snakemake/log"):
    if Path(folder).is_dir():
        keep += [p for p in Path(folder).rglob("*") if p.is_file() and p.suffix not in (".pt", ".npz", ".npy", ".prev")
                 and not p.name.startswith("ckpt")]
with tarfile.open(sys.argv[1], "w:gz") as tar:
    if Path(sys.argv[2]).is_file():
        tar.add(sys.argv[2], arcname=Path(sys.argv[2]).name)
    for path in sorted(set(keep)):
        if path.is_file() and path.stat().st_size < 8 << 20:
            tar.add(path)
EOF
}

# The two shell-function parts run in a child bash (timeout runs programs, not functions).
export PY KIT_DIR CORES SNAKEMAKE_CONFIG GPU_PROFILE
export -f install_kit build_table1 build_table1_graphs
for part in "${PARTS[@]}"; do
  case $part in
    kit) run_part kit "$OUT/kit.log" bash -c install_kit ;;
    startup) run_part startup "$OUT/startup.txt" "$PY" bench/job_startup.py --device cuda --out "$OUT/startup.json" ;;
    warmup) run_part warmup "$OUT/warmup.txt" "$PY" bench/gpu_warmup.py --device cuda --out "$OUT/warmup.json" ;;
    table1)
      run_part table1 "$TABLE1_LOG" bash -c build_table1
      pack_table1 "$OUT/table1_run.tar.gz" "$TABLE1_LOG" || ROWS+=("| table1 packing | failed | | |")
      ;;
    graphs)
      run_part graphs "$GRAPHS_LOG" bash -c build_table1_graphs
      pack_table1 "$OUT/table1_graphs_run.tar.gz" "$GRAPHS_LOG" || ROWS+=("| graphs packing | failed | | |")
      ;;
    gpu) run_part gpu "$OUT/gpu_bench.txt" "$PY" bench/gpu.py $GPU_BENCH_ARGS --out "$OUT/gpu_bench.json" ;;
    nlg) run_part nlg "$OUT/nlg_bench.txt" "$PY" bench/nlg.py $NLG_BENCH_ARGS --out "$OUT/nlg_bench.json" ;;
    *) ROWS+=("| $part | unknown part (kit, startup, warmup, table1, graphs, gpu, nlg) | | |") ;;
  esac
done

{
  echo
  echo "| part | outcome | wall | log |"
  echo "|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "session: $(( $(date +%s) - START )) s of ${BUDGET_S} s"
  if [ -f results/table1.csv ]; then
    echo
    echo '```'
    head -40 results/table1.csv
    echo '```'
  fi
  for log in "$OUT/kit.log" "$OUT/startup.txt" "$OUT/warmup.txt" "$TABLE1_LOG" "$GRAPHS_LOG" "$OUT/gpu_bench.txt" \
             "$OUT/nlg_bench.txt"; do
    [ -f "$log" ] || continue
    echo
    echo "## tail of $(basename "$log")"
    echo '```'
    tail -25 "$log"
    echo '```'
  done
} >> "$SUMMARY"
cat "$SUMMARY"
