#!/usr/bin/env python3
"""vramlab inference runner (issue 29), the lab's entry point: the measurement itself is the
runner shipped in the binary, `crates/device/runners/infer_runner.py` (read its docstring for
what is measured); this file runs its `main` and re-exports its names (`load_config`,
`checkpoint`, `DTYPES`, …) for the lab scripts that import them, so the lab and
`vramlab bench --engine torch --step generate|prefill` measure with one copy of the code.

    python3 lab/device/infer_runner.py --configs lab/grids/grid29_configs.jsonl --out $OUT/grid29.jsonl
    python3 lab/device/infer_runner.py --configs FILE --out FILE --device cpu   # dry run, no GPU
    python3 lab/device/infer_runner.py serve [--device cpu]   # the bench engine's protocol
"""
import importlib.util
import os
import sys

RUNNERS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "crates", "device", "runners")
# the shipped runner imports its siblings (torch_runner.py) by name
sys.path.insert(0, RUNNERS)
_spec = importlib.util.spec_from_file_location("vramlab_infer_runner",
                                               os.path.join(RUNNERS, "infer_runner.py"))
_shipped = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shipped)
globals().update({k: v for k, v in vars(_shipped).items() if not k.startswith("__")})

if __name__ == "__main__":
    sys.exit(_shipped.main())
