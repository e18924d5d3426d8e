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
# Install (which compiles the Cython modules) when the venv has not got these
# extras yet, when setup.py changed, or when a module's source is newer than its
# compiled form (or has none).
stale() {
  local pyx
  for pyx in "$ROOT"/gluon_dynbatch/*/_*.pyx; do
    local so
    so="$(ls "${pyx%.pyx}".*.so 2> /dev/null | head -n 1)"
    if [ -z "$so" ] || [ "$pyx" -nt "$so" ]; then
      return 0
    fi
  done
  return 1
}
if [ ! -f "$STAMP" ] || [ "$ROOT/setup.py" -nt "$STAMP" ] || stale; then
  echo "[setup] installing gluon_dynbatch[$1] (mxnet 1.9.1, numpy<1.24, Cython; compiling its modules)"
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
