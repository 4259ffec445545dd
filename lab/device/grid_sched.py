#!/usr/bin/env python3
"""Run a pre-registered grid's rows on one GPU, several processes at once, under a memory budget.

    python3 lab/device/grid_sched.py OUT_DIR ROWS.jsonl [ROWS.jsonl ...] [--deadline S] [--par N]
                                [--budget-frac F] [--skip DONE.jsonl ...]

Every row (a JSON line with "grid_id", "split" and "estimate_gb") runs in its own
`torch_runner.py measure` process. A row starts when fewer than --par rows run and the rows
running plus this one are estimated under --budget-frac of the GPU's memory (read with
nvidia-smi), biggest rows first; a row bigger than the budget runs alone. Nothing starts
within 45 s of the deadline, and rows still running at the deadline are killed (they are
listed as not run, to be run by a later call). Results are appended as they come, one file
per split (OUT_DIR/<prefix>_<split>.jsonl), so a call cut short keeps what it measured.
Rows whose grid_id is in a --skip file were measured by an earlier call and are left out.
The GPU is shared by the rows running at once; each process reads its own peaks
(torch.cuda.max_memory_allocated/reserved), which other processes do not change, and the
budget keeps any row from meeting an OOM caused by the others.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.environ.get("GRID_SCHED_RUNNER") or os.path.join(ROOT, "crates", "device", "runners", "torch_runner.py")
DROP = ("estimate_gb", "model_type")


def gpu_gb():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return float(out.split()[0]) * 1.048576e6 / 1e9
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 80.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--prefix", default="grid")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds from start")
    ap.add_argument("--par", type=int, default=3)
    ap.add_argument("--budget-frac", type=float, default=0.78)
    ap.add_argument("--skip", nargs="*", default=[])
    a = ap.parse_args()
    t0 = time.time()
    done = set()
    for f in a.skip:
        if os.path.exists(f):
            done |= {json.loads(l).get("grid_id") for l in open(f) if l.strip()}
    rows = [json.loads(l) for f in a.rows for l in open(f) if l.strip()]
    rows = [r for r in rows if r["grid_id"] not in done]
    rows.sort(key=lambda r: (-r["estimate_gb"], r["grid_id"]))
    budget = a.budget_frac * gpu_gb()
    print(f"{len(rows)} rows to run ({len(done)} skipped), budget {budget:.0f} GB, {a.par} at once",
          file=sys.stderr, flush=True)
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    running = []  # (proc, row, out_path, started)
    measured, killed = 0, []
    while rows or running:
        now = time.time() - t0
        for p, r, path, st in list(running):
            if p.poll() is None and now < a.deadline:
                continue
            if p.poll() is None:
                p.kill()
                p.wait()
                killed.append(r["grid_id"])
                print(f"killed at the deadline: {r['grid_id']}", file=sys.stderr, flush=True)
            else:
                with open(path) as f:
                    lines = [l for l in f if l.strip()]
                with open(os.path.join(a.out, f"{a.prefix}_{r.get('split', 'fit')}.jsonl"), "a") as f:
                    f.writelines(l if l.endswith("\n") else l + "\n" for l in lines)
                measured += bool(lines)
                print(f"{r['grid_id']} rc={p.returncode} {time.time() - t0 - st:.0f}s rows={len(lines)}",
                      file=sys.stderr, flush=True)
            running.remove((p, r, path, st))
        if now >= a.deadline - 45:
            if not running:
                break
            time.sleep(1)
            continue
        used = sum(r["estimate_gb"] for _, r, _, _ in running)
        pick = None
        if len(running) < a.par:
            for r in rows:
                if used + r["estimate_gb"] <= budget or not running:
                    pick = r
                    break
        if pick is None:
            time.sleep(1)
            continue
        rows.remove(pick)
        rf = os.path.join(tmp, pick["grid_id"] + ".jsonl")
        with open(rf, "w") as f:
            f.write(json.dumps({k: v for k, v in pick.items() if k not in DROP}) + "\n")
        path = os.path.join(tmp, pick["grid_id"] + ".out")
        log = open(os.path.join(a.out, f"{pick['grid_id']}.log"), "w")
        p = subprocess.Popen([sys.executable, RUNNER, "measure", rf], stdout=open(path, "w"), stderr=log)
        running.append((p, pick, path, time.time() - t0))
    left = killed + [r["grid_id"] for r in rows]
    print(f"measured {measured}; not run: {len(left)} {left}; {time.time() - t0:.0f}s",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
