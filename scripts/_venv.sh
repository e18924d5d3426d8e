# Sourced by the set-up scripts: makes ./.venv and installs the package with the given extras.
# Usage: source scripts/_venv.sh EXTRAS   (e.g. "test" or "examples")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv in $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
STAMP="$VENV/.installed-$1"
CORE="$ROOT/gluon_dynbatch/record/_core"
# Install (which compiles the recording core, Cython) when the venv has not got
# these extras yet, when setup.py changed, or when the core's source is newer
# than its compiled module.
if [ ! -f "$STAMP" ] || [ "$ROOT/setup.py" -nt "$STAMP" ] \
    || ! ls "$CORE".*.so > /dev/null 2>&1 || [ "$CORE.pyx" -nt "$(ls "$CORE".*.so | head -n 1)" ]; then
  echo "[setup] installing gluon_dynbatch[$1] (mxnet 1.9.1, numpy<1.24, Cython; compiling its core)"
  # Fail loudly (and leave no stamp) when pip fails; drop one harmless warning.
  if ! "$VENV/bin/pip" install -q -e "$ROOT[$1]" > "$VENV/pip-$1.log" 2>&1; then
    grep -v "is ignored: it is neither" "$VENV/pip-$1.log" >&2
    echo "[setup] pip install failed (log: $VENV/pip-$1.log)" >&2
    exit 1
  fi
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export MXNET_SUBGRAPH_VERBOSE=0
