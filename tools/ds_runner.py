#!/usr/bin/env python3
"""vramlab DeepSpeed runner: rank 0's memory of one ZeRO-1/2/3 training step, measured on ONE
GPU (tests/data/distributed_deepspeed.jsonl once measured).

stdout carries JSON only, one object per line; logging goes to stderr.

  ds_runner.py measure CONFIGS.jsonl [--device cuda|cpu]
  ds_runner.py check CONFIGS.jsonl     parse every row and validate its DeepSpeed config with
                                       DeepSpeed's own DeepSpeedConfig (no GPU, no process group)

A config is torch_runner.py's (model, batch, seq, precision, optimizer, accum, checkpointing,
attention, loop) plus:
  "gpus": N (the world), "strategy": "zero1" | "zero2" | "zero3",
  "offload": null | "optimizer" | "params",
  "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
  "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
  "stage3_param_persistence_threshold"        -- absent: DeepSpeed's defaults, as vramlab's
                                                 export writes them
  "ds_config": {...}                          -- optional: this DeepSpeed config verbatim
                                                 (e.g. `vramlab export --format deepspeed`)

The DeepSpeed config is the dict `vramlab export --format deepspeed` writes for the same
settings (crates/core/src/export/frameworks.rs `deepspeed`, distributed_exports.rs
`zero_optimization`: micro-batch, accumulation, train_batch_size = micro × accum × world,
gradient_clipping 1.0, bf16 / fp16 from the precision, AdamW lr 1e-4 wd 0.01, the ZeRO
block), plus what a GPU without nvcc needs: `"torch_adam": true` in the optimizer params
(torch.optim.AdamW instead of FusedAdam / DeepSpeedCPUAdam, which JIT-build with ninja:
`engine.py` `get_optimizer_configuration` takes torch_adam before the CPU-offload branch,
so offload runs torch's AdamW on the CPU partitions) and `"zero_force_ds_cpu_optimizer":
false` (only read for a client optimizer; harmless here).

Precision: "fp32" → no mixed-precision block; "bf16" and "amp-bf16" → `bf16.enabled` (the
export's mapping: DeepSpeed keeps the module in bf16 with fp32 master weights in its
optimizer; no torch.autocast), "amp-fp16" → `fp16.enabled` (dynamic loss scale). The model is
cast to that dtype before `deepspeed.initialize`, as DeepSpeed expects.

World N: rank 0 of a world of N under PyTorch's fake process group
(`dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=N)`; collectives are
no-ops, their buffers are allocated), then `deepspeed.init_distributed()`: with torch.distributed
already initialised and no DeepSpeed backend yet, `deepspeed/comm/comm.py` `init_distributed`
wraps it (`TorchBackend`, whose `init_process_group` is skipped when torch's group exists) and
DeepSpeed's groups are built from it.

The loop (torch_runner.WARMUP = 2 warm-up steps, then the measured one: ZeRO-3's fetch trace
is recorded in step 2 and complete in step 3): per micro-step `loss = engine(**batch).loss`
(torch_runner.forward_loss), `engine.backward(loss)`, `engine.step()` (DeepSpeed steps the
optimizer at the accumulation boundary); peak allocated / reserved after
reset_peak_memory_stats at the start of step 3. One config per process is safest (run_ds_on_device.sh
does that): DeepSpeed keeps hooks and groups in module globals.
"""

import gc
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_runner as tr  # noqa: E402

DS_KEYS = ("gpus", "nodes", "strategy", "offload", "reduce_bucket_size", "allgather_bucket_size",
           "overlap_comm", "contiguous_gradients", "stage3_prefetch_bucket_size",
           "stage3_max_live_parameters", "stage3_max_reuse_distance",
           "stage3_param_persistence_threshold", "ds_config", "tag")
STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}
# DeepSpeed's defaults (runtime/zero/config.py), as vramlab's Distributed::default().
DEFAULTS = {
    "reduce_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_param_persistence_threshold": 100_000,
}


def log(*args):
    print("[ds_runner]", *args, file=sys.stderr, flush=True)


def zero_optimization(extra):
    """distributed_exports.rs `zero_optimization`, from the row's keys."""
    stage = STAGES[extra["strategy"]]
    z = {"stage": stage}
    ov = extra.get("overlap_comm")
    z["overlap_comm"] = bool(ov) if ov is not None else stage == 3
    z["contiguous_gradients"] = bool(extra.get("contiguous_gradients", True))
    z["reduce_bucket_size"] = int(extra.get("reduce_bucket_size", DEFAULTS["reduce_bucket_size"]))
    if stage < 3:
        z["allgather_bucket_size"] = int(extra.get("allgather_bucket_size", z["reduce_bucket_size"]))
        z["reduce_scatter"] = True
    else:
        max_live = int(extra.get("stage3_max_live_parameters", DEFAULTS["stage3_max_live_parameters"]))
        z["stage3_prefetch_bucket_size"] = int(
            extra.get("stage3_prefetch_bucket_size", DEFAULTS["stage3_prefetch_bucket_size"]))
        z["stage3_param_persistence_threshold"] = int(
            extra.get("stage3_param_persistence_threshold", DEFAULTS["stage3_param_persistence_threshold"]))
        z["stage3_max_live_parameters"] = max_live
        z["stage3_max_reuse_distance"] = int(extra.get("stage3_max_reuse_distance", max_live))
    off = extra.get("offload")
    if off not in (None, "none", "optimizer", "params"):
        raise ValueError(f"offload {off!r}: none, optimizer or params")
    if off == "params" and stage != 3:
        raise ValueError("offload params needs zero3")
    if off in ("optimizer", "params"):
        z["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if off == "params":
        z["offload_param"] = {"device": "cpu", "pin_memory": True}
    return z


def ds_config(cfg, extra):
    """frameworks.rs `deepspeed`, plus torch_adam / zero_force_ds_cpu_optimizer (see above)."""
    if "ds_config" in extra:
        c = json.loads(json.dumps(extra["ds_config"]))
    else:
        world = int(extra.get("gpus", 1)) * int(extra.get("nodes", 1))
        c = {
            "train_micro_batch_size_per_gpu": cfg["batch"],
            "gradient_accumulation_steps": cfg["accum"],
            "train_batch_size": cfg["batch"] * cfg["accum"] * world,
            "gradient_clipping": 1.0,
        }
        p = cfg["precision"]
        if p == "amp-fp16":
            c["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
        elif p in ("amp-bf16", "bf16"):
            c["bf16"] = {"enabled": True}
        if cfg["optimizer"] not in ("adam", "adamw"):
            raise ValueError(f"optimizer {cfg['optimizer']!r}: the runner uses DeepSpeed's Adam / AdamW")
        wd = 0.01 if cfg["optimizer"] == "adamw" else 0.0
        c["optimizer"] = {"type": "AdamW" if cfg["optimizer"] == "adamw" else "Adam",
                          "params": {"lr": 1e-4, "weight_decay": wd}}
        if cfg["checkpointing"]:
            c["activation_checkpointing"] = {"partition_activations": False,
                                             "contiguous_memory_optimization": False}
        c["zero_optimization"] = zero_optimization(extra)
    opt = c.setdefault("optimizer", {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}})
    opt.setdefault("params", {})["torch_adam"] = True
    c["zero_force_ds_cpu_optimizer"] = False
    c.setdefault("steps_per_print", 1_000_000)
    c.setdefault("wall_clock_breakdown", False)
    return c


def parse_row(cfg_in):
    """torch_runner's config, the DeepSpeed keys and the DeepSpeed config of one row."""
    extra = {k: cfg_in[k] for k in DS_KEYS if k in cfg_in}
    base = {k: v for k, v in cfg_in.items() if k not in DS_KEYS}
    st = extra.get("strategy")
    if st not in STAGES:
        raise ValueError(f"strategy {st!r}: zero1, zero2 or zero3")
    if int(extra.get("gpus", 1)) < 1 or int(extra.get("nodes", 1)) < 1:
        raise ValueError(f"gpus {extra.get('gpus')!r} / nodes {extra.get('nodes')!r}: at least 1")
    cfg, preset = tr.normalize_config(base)
    if cfg.get("finetune", "full") != "full" or cfg.get("step", "train") != "train":
        raise ValueError("full fine-tuning training steps only")
    if preset["family"] not in tr.HF_FAMILIES:
        raise ValueError(f"family {preset['family']!r}: Hugging Face families only")
    return cfg, preset, extra, ds_config(cfg, extra)


def init_pg(world, device):
    if dist.is_initialized():
        dist.destroy_process_group()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ["WORLD_SIZE"] = str(world)
    import deepspeed

    # (`import deepspeed.comm.torch` would give PyTorch: deepspeed.comm re-exports `torch`.)
    ds_torch = sys.modules["deepspeed.comm.torch"]
    # TorchBackend builds the CPU shared-memory all-reduce op when the accelerator offers
    # it (the CPU accelerator does): a JIT build with ninja, for CPU inference only.
    ds_torch.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo",
                               auto_mpi_discovery=False)


def build(cfg, preset, dev):
    with dev.torch_device:
        model = tr.build_reference(preset, cfg.get("seq"), attention=cfg["attention"])
    p = cfg["precision"]
    if p in ("bf16", "amp-bf16"):
        model = model.to(torch.bfloat16)
    elif p == "amp-fp16":
        model = model.to(torch.float16)
    wrapped = tr.enable_checkpointing(model, preset["family"]) if cfg["checkpointing"] else 0
    return model, wrapped


def ds_versions():
    v = dict(tr.versions())
    try:
        import deepspeed

        v["deepspeed"] = deepspeed.__version__
    except Exception as e:  # still a row: the error says why
        v["deepspeed"] = f"unavailable: {e}"
    return v


def run(engine, cfg, preset, dev, rec):
    fam = preset["family"]
    make_batch = tr.make_batch_fn(cfg, preset, dev)
    engine.train()
    for step in range(tr.WARMUP + 1):
        measured = step == tr.WARMUP
        if measured:
            dev.sync()
            dev.reset_peak()
            rec["allocated_start"] = dev.allocated()
            wall0 = time.perf_counter()
        for micro in range(cfg["accum"]):
            x, y = make_batch()
            out, loss = tr.forward_loss(engine, fam, x, y, cfg.get("loop", "plain"))
            if measured and micro == cfg["accum"] - 1:
                dev.sync()
                rec["allocated_after_forward"] = dev.allocated()
                rec["peak_after_forward"] = dev.peak()
                rec["loss"] = float(loss.detach().float().item())
            engine.backward(loss)
            del out, loss, x, y
            if measured and micro == cfg["accum"] - 1:
                dev.sync()
                rec["allocated_after_backward"] = dev.allocated()
                rec["peak_after_backward"] = dev.peak()
            engine.step()
    dev.sync()
    rec["step_ms"] = round((time.perf_counter() - wall0) * 1e3, 3)
    rec["peak_allocated"] = dev.peak()
    rec["peak_reserved"] = dev.peak_reserved()
    rec["allocated_end"] = dev.allocated()
    rec["reserved_end"] = dev.reserved()
    proc, used = tr.nvml_readings()
    rec["nvml_process_bytes"] = proc
    rec["nvml_device_used_bytes"] = used
    rec["steps_run"] = tr.WARMUP + 1
    rec["global_steps"] = int(engine.global_steps)


def measure(cfg_in, index, dev, emit):
    rec = {"index": index}
    engine = model = None
    err = oom = None
    try:
        cfg, preset, extra, dsc = parse_row(cfg_in)
        rec.update(cfg)
        rec.update({k: v for k, v in extra.items() if k != "ds_config"})
        rec["model_id"] = preset["id"]
        rec["ds_config"] = dsc
        world = int(extra.get("gpus", 1)) * int(extra.get("nodes", 1))
        init_pg(world, dev.kind)
        import deepspeed

        t0 = time.time()
        model, wrapped = build(cfg, preset, dev)
        rec["params"] = int(sum(p.numel() for p in model.parameters()))
        rec["checkpointed_blocks"] = wrapped
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dsc)
        rec["build_s"] = round(time.time() - t0, 3)
        rec["world"] = dist.get_world_size()
        rec["zero_stage"] = int(engine.zero_optimization_stage())
        rec["basic_optimizer"] = type(engine.basic_optimizer).__name__
        rec["ds_optimizer"] = type(engine.optimizer).__name__
        dev.empty_cache()
        rec["allocated_after_init"] = dev.allocated()
        run(engine, cfg, preset, dev, rec)
        rec["oom"] = False
    except torch.OutOfMemoryError as e:
        oom = str(e).strip().splitlines()[0][:500] if str(e).strip() else "CUDA out of memory"
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        log(traceback.format_exc())
    if oom is not None:
        rec["oom"] = True
        rec["message"] = oom
    if err is not None:
        rec["error"] = err
    engine = model = None
    gc.collect()
    if dev.cuda:
        torch.cuda.empty_cache()
    rec["versions"] = ds_versions()
    emit(rec)
    log(f"{index}: {cfg_in.get('strategy')} {rec.get('model_id')} gpus={cfg_in.get('gpus')} "
        f"alloc={rec.get('peak_allocated')} reserved={rec.get('peak_reserved')} err={err} oom={oom}")


def check(path):
    """Every row parsed and its config accepted by DeepSpeedConfig at the row's world."""
    import deepspeed.runtime.config as dsconfig
    from deepspeed.runtime.config import DeepSpeedConfig

    bad = 0
    for i, row in enumerate(read(path)):
        rec = {"index": i}
        try:
            cfg, preset, extra, dsc = parse_row(row)
            world = int(extra.get("gpus", 1)) * int(extra.get("nodes", 1))
            dsconfig.dist.get_world_size = lambda *a, **k: world
            dsconfig.dist.get_rank = lambda *a, **k: 0
            c = DeepSpeedConfig(json.loads(json.dumps(dsc)))
            z = c.zero_config
            rec.update(ok=c.zero_optimization_stage == STAGES[extra["strategy"]]
                       and c.train_batch_size == cfg["batch"] * cfg["accum"] * world,
                       model_id=preset["id"], stage=c.zero_optimization_stage,
                       train_batch_size=c.train_batch_size, overlap_comm=z.overlap_comm,
                       prefetch=z.prefetch_bucket_size, max_live=z.max_live_parameters,
                       bf16=bool(c.bfloat16_config.enabled), fp16=bool(c.float16_config.enabled))
        except Exception as e:
            rec.update(ok=False, error=f"{type(e).__name__}: {e}")
        bad += not rec["ok"]
        print(json.dumps(rec), flush=True)
    return 1 if bad else 0


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip() and not line.startswith("#")]


def main(argv):
    if len(argv) >= 2 and argv[0] == "check":
        return check(argv[1])
    if len(argv) < 2 or argv[0] != "measure":
        print(__doc__, file=sys.stderr)
        return 2
    kind = argv[argv.index("--device") + 1] if "--device" in argv else "cuda"
    dev = tr.Device(kind)
    # DeepSpeed logs to stdout: the JSON lines get the real stdout, everything else stderr.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(rec):
        json_out.write(json.dumps(rec, allow_nan=True) + "\n")
        json_out.flush()

    if dev.cuda:
        torch.cuda.set_device(0)
    for i, cfg in enumerate(read(argv[1])):
        measure(cfg, i, dev, emit)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
