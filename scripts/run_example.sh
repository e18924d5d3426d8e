#!/usr/bin/env bash
# Installs what the example needs into ./.venv, then trains the SICK Tree-LSTM (fetching SICK
# and GloVe into $MXNET_HOME when there is no local copy; see docs/training.md).
# Extra arguments go to the example, e.g. `bash scripts/run_example.sh --epochs 10`.
# `bash scripts/run_example.sh --workers 2` trains with 2 worker processes and 1 parameter server
# on this machine (MXNet's dist_sync kvstore, see docs/distributed.md).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_venv.sh" examples
cd "$ROOT"
exec python examples/tree_lstm_sick.py "$@"
