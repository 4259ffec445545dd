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
"$venv/bin/pip" install --quiet --disable-pip-version-check torch \
    --index-url https://download.pytorch.org/whl/cpu
"$venv/bin/pip" install --quiet --disable-pip-version-check . "pytest>=7"
export VRAMLAB_BIN="${VRAMLAB_BIN:-$PWD/target/debug/vramlab}"
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
