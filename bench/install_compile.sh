#!/usr/bin/env bash
# The environment's install two ways, side by side in one run (issue 52 item 3: make quick
# counts its install): pip byte-compiling as it installs (one core), against pip with
# --no-compile followed by `python -m compileall -j 0` (every core). Both install
# requirements.lock into a fresh virtual environment from the same package cache; ROUNDS
# alternating rounds (default 2), so a change in the machine's load hits both ways.
# Usage: bash bench/install_compile.sh [ROUNDS]      (about 3-4 minutes a round on 2 cores)
set -euo pipefail
ROUNDS=${1:-2}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

now() { date +%s.%N; }
install() {  # install WAY VENV: prints the seconds it took
  local way=$1 venv=$2 began
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  began=$(now)
  if [ "$way" = pip ]; then
    "$venv/bin/python" -m pip install -q -r "$ROOT/requirements.lock" > "$WORK/$way.log" 2>&1
  else
    "$venv/bin/python" -m pip install -q --no-compile -r "$ROOT/requirements.lock" > "$WORK/$way.log" 2>&1
    "$venv/bin/python" -m compileall -qq -j 0 \
      "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >> "$WORK/$way.log" 2>&1 || true
  fi
  echo "$(now) - $began" | bc
}
count_pyc() { find "$1" -name '*.pyc' | wc -l; }

echo "install of requirements.lock, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$ROOT" rev-parse --short HEAD)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-34s %10s %10s %8s\n' round way seconds pyc_files load1
for round in $(seq "$ROUNDS"); do
  for way in pip compileall; do
    seconds=$(install "$way" "$WORK/venv-$way")
    pyc=$(count_pyc "$WORK/venv-$way")
    label=$([ "$way" = pip ] && echo "pip (compiles on one core)" || echo "pip --no-compile + compileall -j 0")
    printf '%-6s %-34s %10.1f %10s %8s\n' "$round" "$label" "$seconds" "$pyc" "$(cut -d' ' -f1 /proc/loadavg)"
    echo "$way $seconds" >> "$WORK/times"
  done
done
awk '{sum[$1] += $2; n[$1]++} END {
  a = sum["pip"] / n["pip"]; b = sum["compileall"] / n["compileall"];
  printf "mean: pip %.1f s, --no-compile + compileall %.1f s: %.2fx, %.1f s saved\n", a, b, a / b, a - b }' "$WORK/times"
