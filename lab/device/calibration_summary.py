#!/usr/bin/env python3
"""lab/run calibration: a summary of the rows in OUT (the argument): per set, how many measured, OOM or
failed, then each row and each max-batch search."""
import json, os, sys
out = sys.argv[1]
GiB = 2 ** 30
def rows(name):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        return []
    r = []
    for line in open(p):
        try:
            r.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return r
for name in ("calibration.jsonl", "holdout.jsonl"):
    r = rows(name)
    ok = [x for x in r if x.get("oom") is False]
    oom = [x for x in r if x.get("oom") is True]
    err = [x for x in r if "error" in x]
    print(f"{name}: {len(r)} lines, {len(ok)} measured, {len(oom)} OOM, {len(err)} errors")
    for x in r:
        tag = "ERROR " + x["error"][:80] if "error" in x else ("OOM" if x.get("oom") else "")
        peak = x.get("peak_allocated")
        print(f"  {x.get('index', '?'):>3} {x.get('model_id', x.get('model', '?')):<20} b={x.get('batch', '?'):<4} "
              f"{x.get('precision', ''):<8} {x.get('optimizer', ''):<12} acc={x.get('accum', '')} "
              f"ckpt={int(bool(x.get('checkpointing')))} {x.get('attention', '') if x.get('seq') else '':<5} "
              f"peak={peak / GiB if peak else 0:7.2f} GiB  step={x.get('step_ms') or 0:8.1f} ms {tag}")
for x in rows("maxbatch.jsonl"):
    if "max_batch" in x:
        print(f"max-batch {json.dumps(x.get('config'))} cap={x.get('cap_gib')} GiB -> {x.get('max_batch')} "
              f"(first OOM {x.get('first_oom_batch')}, {x.get('trials')} trials) {x.get('error', '')}")
