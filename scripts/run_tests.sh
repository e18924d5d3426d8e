#!/usr/bin/env bash
# Installs what the tests need into ./.venv, then runs the test suite (slow tests excluded).
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -m slow` or `-k engine`.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_venv.sh" test
cd "$ROOT"
exec python -m pytest "$@"
