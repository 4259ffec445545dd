#!/usr/bin/env bash
# The Python package, as a user installs it: a fresh venv, `pip install .` (maturin from
# PyPI builds the abi3 wheel of crates/python in release) and PyTorch for the CPU (for
# `vramlab.plan_module`'s tests, which compare it with `vramlab capture` + `plan`), then
# pytest over python/tests/ (equality with the debug binary's `--json`, built by `cargo
# test` before this; the walkthrough of docs/python.md as a doctest). Timings: docs/python.md.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
# PyTorch's CPU build (about 200 MB) from its own index where it can be reached; elsewhere
# (PyPI's torch is the CUDA build, some 3 GB with its libraries: past this step's budget)
# test_module.py, the callbacks' torch tests and test_infer_export.py skip, saying so.
if "$venv/bin/pip" install --quiet --disable-pip-version-check --retries 1 --timeout 30 \
    torch --index-url https://download.pytorch.org/whl/cpu; then
    echo "python.sh: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') (CPU) installed"
    # The exported transformers script runs on a tiny random Llama (test_infer_export.py);
    # installed beside the CPU torch only (accelerate would pull PyPI's CUDA torch).
    "$venv/bin/pip" install --quiet --disable-pip-version-check --retries 1 --timeout 30 \
        "transformers==5.17.0" "accelerate==1.15.0" \
        || echo "python.sh: warning: transformers not installed: test_infer_export.py skips" >&2
else
    echo "python.sh: warning: PyTorch's CPU index is not reachable: plan_module's tests skip" >&2
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check . "pytest>=7"
export VRAMLAB_BIN="${VRAMLAB_BIN:-$PWD/target/debug/vramlab}"
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
