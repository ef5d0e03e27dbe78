#!/usr/bin/env bash
# Run the test suite once under each Keras backend: tensorflow, jax and torch.
# Usage: tests/run_backends.sh [BACKEND ...] [-- PYTEST ARGS]
# A backend that is not installed is reported and left out
# (pip install -e ".[jax]" or ".[torch]"; for torch on a CPU, torch==2.13.0 first).
set -uo pipefail
cd "$(dirname "$0")/.."

backends=()
while [[ $# -gt 0 && "$1" != "--" ]]; do backends+=("$1"); shift; done
[[ "${1:-}" == "--" ]] && shift
[[ ${#backends[@]} -eq 0 ]] && backends=(tensorflow jax torch)

failed=()
for backend in "${backends[@]}"; do
    if ! python -c "import $backend" 2>/dev/null; then
        echo "== $backend: not installed, not run"
        failed+=("$backend (not installed)")
        continue
    fi
    echo "== KERAS_BACKEND=$backend"
    KERAS_BACKEND="$backend" python -m pytest "$@" || failed+=("$backend")
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
