#!/usr/bin/env python3
"""Checks vramlab's multi-GPU DeepSpeed exports with DeepSpeed's own config class, and
records DeepSpeed's model-state estimators for the comparison test
(tests/data/deepspeed_estimates.jsonl).

Usage: check_ds_zero.py path/to/vramlab [--write tests/data/deepspeed_estimates.jsonl]
Prints one JSON line per check; exits 1 when a config is rejected or read back wrong.
DeepSpeed installs on a CPU machine with DS_BUILD_OPS=0 (no ops are built)."""
import json
import platform
import subprocess
import sys

exe = sys.argv[1]
write = sys.argv[sys.argv.index("--write") + 1] if "--write" in sys.argv else None

import deepspeed  # noqa: E402
import deepspeed.runtime.config as dsconfig  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs  # noqa: E402

results = []


def export(args):
    r = subprocess.run([exe, "export", "--format", "deepspeed"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip()[:300])
    return json.loads(r.stdout)


for strategy in ("zero1", "zero2", "zero3"):
    for offload in (None, "optimizer", "params"):
        if offload == "params" and strategy != "zero3":
            continue
        for nodes, gpus in ((1, 4), (1, 8), (2, 8)):
            args = ["--model", "gpt2", "--batch", "4", "--accum", "2", "--precision", "bf16",
                    "--gpus", str(gpus), "--nodes", str(nodes), "--strategy", strategy]
            if offload:
                args += ["--offload", offload]
            world = gpus * nodes
            rec = {"check": "deepspeed_zero", "strategy": strategy, "offload": offload, "world": world}
            try:
                ds = export(args)
                # DeepSpeedConfig reads the world from torch.distributed; stand in for it.
                dsconfig.dist.get_world_size = lambda *a, **k: world
                dsconfig.dist.get_rank = lambda *a, **k: 0
                c = DeepSpeedConfig(ds)
                z = c.zero_config
                want_stage = int(strategy[-1])
                dev = lambda o: getattr(o.device, "value", o.device) if o else "none"  # noqa: E731
                off_opt = str(dev(z.offload_optimizer))
                off_par = str(dev(z.offload_param))
                ok = (c.zero_optimization_stage == want_stage
                      and c.train_batch_size == 4 * 2 * world
                      and c.train_micro_batch_size_per_gpu == 4
                      and c.gradient_accumulation_steps == 2
                      and off_opt == ("cpu" if offload else "none")
                      and off_par == ("cpu" if offload == "params" else "none")
                      and int(z.reduce_bucket_size) == ds["zero_optimization"]["reduce_bucket_size"])
                rec.update({"ok": ok, "stage": c.zero_optimization_stage, "train_batch_size": c.train_batch_size,
                            "offload_optimizer": off_opt, "offload_param": off_par,
                            "reduce_bucket_size": int(z.reduce_bucket_size)})
            except Exception as e:  # a rejected config is what this script is for
                rec.update({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
            results.append(rec)

# The ZeRO knobs: each flag's value exported and read back by DeepSpeedConfig.
KNOBS = [  # (strategy, flags, {zero_config attribute: expected})
    ("zero2", [], {"overlap_comm": False, "contiguous_gradients": True,
                   "reduce_bucket_size": 500000000, "allgather_bucket_size": 500000000}),
    ("zero1", ["--overlap-comm", "true", "--reduce-bucket-size", "200000000"],
     {"overlap_comm": True, "reduce_bucket_size": 200000000, "allgather_bucket_size": 200000000}),
    ("zero2", ["--no-contiguous-gradients", "--allgather-bucket-size", "100000000"],
     {"contiguous_gradients": False, "allgather_bucket_size": 100000000}),
    ("zero3", [], {"overlap_comm": True, "param_persistence_threshold": 100000,
                   "prefetch_bucket_size": 50000000, "max_live_parameters": 1000000000,
                   "max_reuse_distance": 1000000000}),
    ("zero3", ["--overlap-comm", "false", "--stage3-prefetch-bucket-size", "20000000",
               "--stage3-max-live-parameters", "300000000", "--stage3-max-reuse-distance", "400000000",
               "--stage3-param-persistence-threshold", "0"],
     {"overlap_comm": False, "prefetch_bucket_size": 20000000, "max_live_parameters": 300000000,
      "max_reuse_distance": 400000000, "param_persistence_threshold": 0}),
]
for strategy, flags, want in KNOBS:
    rec = {"check": "deepspeed_zero_knobs", "strategy": strategy, "flags": " ".join(flags)}
    try:
        ds = export(["--model", "gpt2", "--batch", "4", "--precision", "bf16", "--gpus", "4",
                     "--strategy", strategy] + flags)
        dsconfig.dist.get_world_size = lambda *a, **k: 4
        dsconfig.dist.get_rank = lambda *a, **k: 0
        z = DeepSpeedConfig(ds).zero_config
        got = {k: (int(v) if isinstance(v, int) and not isinstance(v, bool) else v)
               for k, v in ((k, getattr(z, k)) for k in want)}
        rec.update({"ok": got == want, "read_back": got})
    except Exception as e:  # a rejected config is what this script is for
        rec.update({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
    results.append(rec)

# DeepSpeed's estimators for the comparison test (numbers as DeepSpeed computes them).
estimates = [{"machine": f"{platform.node()} (CPU only)", "python": platform.python_version(),
              "deepspeed": deepspeed.__version__, "torch": __import__("torch").__version__,
              "functions": "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs, "
                           "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs"}]
MODELS = {  # total params, largest layer params (the embedding: vocab x hidden)
    "gpt2": (124439808, 50257 * 768),
    "Llama-2-7b-hf": (6738415616, 32000 * 4096),
    "Meta-Llama-3-8B": (8030261248, 128256 * 4096),
}
for name, (total, largest) in MODELS.items():
    for nodes, gpn in ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8)):
        for off in (False, True):
            cpu, gpu = estimate_zero2_model_states_mem_needs(total, gpn, nodes, cpu_offload=off)
            estimates.append({"fn": "zero2", "model": name, "total_params": total, "gpus_per_node": gpn,
                              "nodes": nodes, "cpu_offload": off, "cpu_bytes": cpu, "gpu_bytes": gpu})
        for off, offp in ((False, False), (True, False), (True, True)):
            for zi in (True, False):
                cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, gpn, nodes, cpu_offload=off,
                                                                    cpu_offload_params=offp, zero_init=zi)
                estimates.append({"fn": "zero3", "model": name, "total_params": total,
                                  "largest_layer_params": largest, "gpus_per_node": gpn, "nodes": nodes,
                                  "cpu_offload": off, "cpu_offload_params": offp, "zero_init": zi,
                                  "cpu_bytes": int(cpu), "gpu_bytes": int(gpu)})
if write:
    with open(write, "w") as f:
        for e in estimates:
            f.write(json.dumps(e) + "\n")
for r in results:
    print(json.dumps(r))
sys.exit(1 if any(r.get("ok") is False for r in results) else 0)
