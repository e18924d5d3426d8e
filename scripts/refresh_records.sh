#!/usr/bin/env bash
# Re-runs the benchmarks of docs/benchmarks.md with their documented settings, one after another,
# writes every record (docs/records/NAME.json), copies the budget plot into docs/, then
# regenerates the tables of the docs (scripts/tables.py).
#
# Usage: bash scripts/refresh_records.sh [--quick] [NAME ...]
#   --quick  short settings (each script's --quick): a smoke run of every benchmark
#   NAME     only these records; default: all of sick_training sick_budget bench_core
#            user_models user_models_compiled plan_steps dynet_race soak soak_reads
#
# Run it on a machine doing nothing else: the benchmarks share it with nothing but each other.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_venv.sh" bench
cd "$ROOT"

declare -A COMMANDS=(
  [sick_training]="scripts/benchmark.py --systems eager,imperative-depth,compiled-depth,step-depth,handbatched --model both --batches 30 --epoch-check --out-dir runs/sick_training"
  [sick_budget]="scripts/benchmark.py --systems imperative,budget --model both --batches 30 --epoch-check --no-back-to-back --no-second-pass --out-dir runs/sick_budget"
  [bench_core]="scripts/bench_core.py --rounds 7"
  [user_models]="scripts/user_models_bench.py --samples 64 --hidden 128 --rounds 3"
  [user_models_compiled]="scripts/user_models_bench.py --samples 64 --hidden 128 --rounds 7 --warmup 16 --compiled both"
  [plan_steps]="scripts/plan_steps.py"
  [dynet_race]="scripts/bench_dynet.py --workloads treelstm,tagger --dims 128/128 --configs depth:imperative,depth:step,depth:compiled --encoders cell,op --out-dir runs/dynet_race"
  [soak]="scripts/soak.py --no-progress"
  [soak_reads]="scripts/soak.py --no-progress --model reads --batches 1000 --warmup 100"
)
ORDER=(sick_training sick_budget bench_core user_models user_models_compiled plan_steps dynet_race
       soak soak_reads)
NO_QUICK=" plan_steps "      # runs in a couple of minutes with its full settings

QUICK=""
NAMES=()
FAILED=()
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK="--quick" ;;
    *) [ -n "${COMMANDS[$arg]+set}" ] || { echo "unknown record: $arg (one of ${ORDER[*]})" >&2; exit 2; }
       NAMES+=("$arg") ;;
  esac
done
[ ${#NAMES[@]} -gt 0 ] || NAMES=("${ORDER[@]}")

for name in "${NAMES[@]}"; do
  extra="$QUICK"
  [[ "$NO_QUICK" == *" $name "* ]] && extra=""
  rm -f runs/sick_budget/budget_tradeoff.png
  echo "[refresh] $name: python ${COMMANDS[$name]} $extra --record $name" >&2
  # shellcheck disable=SC2086  # the commands are words
  if ! python ${COMMANDS[$name]} $extra --record "$name"; then
    FAILED+=("$name")      # soak.py exits 1 when memory grew past its bound; its record is written
  fi
  if [ "$name" = sick_budget ] && [ -f runs/sick_budget/budget_tradeoff.png ]; then
    cp runs/sick_budget/budget_tradeoff.png docs/benchmark_budget_tradeoff.png
  fi
done
python scripts/tables.py
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "[refresh] exited with an error: ${FAILED[*]}" >&2
  exit 1
fi
