#!/usr/bin/env python3
"""vramlab DeepSpeed runner: rank 0's memory of one ZeRO-1/2/3 training step, measured on ONE
GPU (tests/data/distributed_deepspeed.jsonl once measured).

stdout carries JSON only, one object per line; logging goes to stderr.

  ds_runner.py measure CONFIGS.jsonl [--device cuda|cpu] [--out-dir DIR]
      --out-dir: every rank also appends its records to DIR/rank<R>.jsonl (the bench,
      crates/device/src/bench/dist.rs, reads one file per rank; dist_runner.py's format)
  ds_runner.py check CONFIGS.jsonl     parse every row and validate its DeepSpeed config with
                                       DeepSpeed's own DeepSpeedConfig (no GPU, no process group)
  ds_runner.py selftest                the GPU-free parts on CPU (arguments, rank files, the
                                       config a bench line gives, the torchrun world check)

Two ways to run a world (every record says which: "rank", "world_size", "world_mode"):
  emulated  (no torchrun environment): rank 0 of a world of N under the fake process group,
            as below; one config per process is safest.
  torchrun  (`python -m torch.distributed.run --standalone --nproc_per_node N ds_runner.py
            measure CONFIGS.jsonl --out-dir DIR`; RANK / LOCAL_RANK / WORLD_SIZE set):
            `deepspeed.init_distributed(dist_backend="nccl")` builds the real process group
            (once per process; WORLD_SIZE must equal the row's gpus × nodes), rank R on GPU
            LOCAL_RANK. A rank that runs out of memory or fails writes its record and exits
            with status 1, so torchrun stops the others instead of leaving them waiting in a
            collective (dist_runner.py's behaviour; its helpers are imported, not copied).
An OOM record carries "message", "peak_allocated_before_oom" and "peak_reserved_before_oom".
Host memory (what CPU offload costs): "host_rss_start_bytes" (before the model is built),
"host_rss_end_bytes" (after the measured step), "host_rss_delta_bytes" and
"host_peak_rss_bytes" (the process's maximum resident set, getrusage) — psutil when installed,
else /proc/self/statm; null where neither answers.

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
reset_peak_memory_stats at the start of step 3. One config per process is safest (`lab/run ds`
does that): DeepSpeed keeps hooks and groups in module globals.
"""

import gc
import json
import os
import resource
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_runner as dr  # noqa: E402  (torchrun_env, rank_file, parse_args)
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


def _deepspeed_no_shm():
    """deepspeed, with TorchBackend's CPU shared-memory all-reduce op switched off: the CPU
    accelerator offers it as a JIT build with ninja, for CPU inference only."""
    import deepspeed

    # (`import deepspeed.comm.torch` would give PyTorch: deepspeed.comm re-exports `torch`.)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    return deepspeed


def init_pg(world, device):
    if dist.is_initialized():
        dist.destroy_process_group()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ["WORLD_SIZE"] = str(world)
    _deepspeed_no_shm().init_distributed(dist_backend="nccl" if device == "cuda" else "gloo",
                                         auto_mpi_discovery=False)


def check_torchrun_world(world, tr_env):
    """Raises ValueError when the row's world is not torchrun's."""
    if world != tr_env[2]:
        raise ValueError(f"gpus × nodes = {world} in a torchrun world of {tr_env[2]}")


def init_torchrun(world, device, tr_env):
    """The real process group from torchrun's environment, once for the process's life."""
    check_torchrun_world(world, tr_env)
    if dist.is_initialized():
        return
    _deepspeed_no_shm().init_distributed(dist_backend="nccl" if device == "cuda" else "gloo",
                                         auto_mpi_discovery=False)


def host_rss():
    """This process's resident host memory in bytes (psutil, else /proc/self/statm), or None."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return None


def host_peak_rss():
    """The process's maximum resident set in bytes (Linux reports KiB), or None."""
    try:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except Exception:
        return None
    return int(kib) * (1 if sys.platform == "darwin" else 1024)


def _world_of(cfg_in):
    """gpus × nodes of a row, 1 where unreadable (parse_row says why)."""
    try:
        return max(1, int(cfg_in.get("gpus", 1) or 1)) * max(1, int(cfg_in.get("nodes", 1) or 1))
    except (TypeError, ValueError):
        return 1


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
    rss = host_rss()
    rec["host_rss_end_bytes"] = rss
    start = rec.get("host_rss_start_bytes")
    rec["host_rss_delta_bytes"] = rss - start if rss is not None and start is not None else None
    rec["host_peak_rss_bytes"] = host_peak_rss()
    proc, used = tr.nvml_readings()
    rec["nvml_process_bytes"] = proc
    rec["nvml_device_used_bytes"] = used
    rec["steps_run"] = tr.WARMUP + 1
    rec["global_steps"] = int(engine.global_steps)


def measure(cfg_in, index, dev, emit, tr_env=None):
    """Runs one config (`tr_env`: dist_runner.torchrun_env() read at start, else emulated);
    emits its record; returns it."""
    rec = {"index": index,
           "rank": tr_env[0] if tr_env else 0,
           "world_size": tr_env[2] if tr_env else _world_of(cfg_in),
           "world_mode": "torchrun" if tr_env else "emulated",
           "host_rss_start_bytes": host_rss()}
    engine = model = None
    err = oom = None
    try:
        cfg, preset, extra, dsc = parse_row(cfg_in)
        rec.update(cfg)
        rec.update({k: v for k, v in extra.items() if k != "ds_config"})
        rec["model_id"] = preset["id"]
        rec["ds_config"] = dsc
        world = int(extra.get("gpus", 1)) * int(extra.get("nodes", 1))
        if tr_env:
            init_torchrun(world, dev.kind, tr_env)
        else:
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
        rec["peak_allocated_before_oom"] = dev.peak()
        rec["peak_reserved_before_oom"] = dev.peak_reserved()
    if err is not None:
        rec["error"] = err
    engine = model = None
    gc.collect()
    if dev.cuda:
        torch.cuda.empty_cache()
    rec["versions"] = ds_versions()
    emit(rec)
    log(f"{index}: {cfg_in.get('strategy')} rank {rec['rank']} {rec.get('model_id')} "
        f"gpus={cfg_in.get('gpus')} alloc={rec.get('peak_allocated')} "
        f"reserved={rec.get('peak_reserved')} err={err} oom={oom}")
    return rec


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


def parse_args(argv):
    """(configs path, device kind, out dir or None); raises ValueError naming what is wrong."""
    rest = list(argv)
    kind = "cuda"
    if "--device" in rest:
        i = rest.index("--device")
        if i + 1 >= len(rest) or rest[i + 1] not in ("cuda", "cpu"):
            raise ValueError("--device needs cuda or cpu")
        kind = rest[i + 1]
        del rest[i:i + 2]
    _, path, out_dir = dr.parse_args(rest, modes=("measure",), prog="ds_runner.py")
    return path, kind, out_dir


def make_emit(json_out, out_dir, rank):
    """Writes each record as one JSON line to `json_out` and, with --out-dir, to this rank's
    file (dist_runner.rank_file)."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    rank_out = open(dr.rank_file(out_dir, rank), "a") if out_dir else None

    def emit(rec):
        line = json.dumps(rec, allow_nan=True) + "\n"
        for f in (json_out, rank_out):
            if f is not None:
                f.write(line)
                f.flush()

    return emit


def selftest():
    """The GPU-free parts on CPU; prints "selftest ok"."""
    import io
    import tempfile

    assert parse_args(["measure", "c.jsonl"]) == ("c.jsonl", "cuda", None)
    assert parse_args(["measure", "c.jsonl", "--out-dir", "/o", "--device", "cpu"]) == \
        ("c.jsonl", "cpu", "/o")
    for bad in (["fsdp", "c"], ["measure"], ["measure", "c", "--device"], ["measure", "c", "--out-dir"]):
        try:
            parse_args(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")
    with tempfile.TemporaryDirectory() as t:
        out = io.StringIO()
        make_emit(out, t, 1)({"index": 0, "rank": 1})
        with open(os.path.join(t, "rank1.jsonl")) as f:
            assert json.loads(f.read()) == json.loads(out.getvalue()) == {"index": 0, "rank": 1}
    # A bench line (world.rs dist_config_line): absent knobs are DeepSpeed's defaults, a null
    # offload is none.
    line = {"model": "gpt2", "batch": 4, "seq": 128, "precision": "amp-bf16", "optimizer": "adamw",
            "accum": 2, "checkpointing": False, "attention": "sdpa", "loop": "plain", "gpus": 4,
            "nodes": 1, "strategy": "zero3", "offload": None, "reduce_bucket_size": 500000000,
            "contiguous_gradients": True, "stage3_prefetch_bucket_size": 50000000,
            "stage3_max_live_parameters": 1000000000, "stage3_param_persistence_threshold": 100000}
    cfg, _, extra, dsc = parse_row(line)
    z = dsc["zero_optimization"]
    assert dsc["train_batch_size"] == 4 * 2 * 4 and dsc["bf16"] == {"enabled": True}
    assert z["stage"] == 3 and z["overlap_comm"] is True and "offload_optimizer" not in z
    assert z["stage3_max_reuse_distance"] == 1000000000
    assert dsc["optimizer"]["params"]["torch_adam"] is True
    line.update(strategy="zero2", offload="optimizer")
    z = parse_row(line)[3]["zero_optimization"]
    assert z["stage"] == 2 and z["overlap_comm"] is False and z["offload_optimizer"]["device"] == "cpu"
    assert _world_of({"gpus": 4, "nodes": 2}) == 8 and _world_of({"gpus": "x"}) == 1
    check_torchrun_world(2, (0, 0, 2))
    try:
        check_torchrun_world(4, (1, 1, 2))
        raise AssertionError("a world of 4 under torchrun of 2")
    except ValueError as e:
        assert "torchrun world of 2" in str(e)
    rss = host_rss()
    assert rss is None or rss > 0
    print("selftest ok")
    return 0


def main(argv):
    if argv[:1] == ["selftest"]:
        return selftest()
    if len(argv) >= 2 and argv[0] == "check":
        return check(argv[1])
    try:
        path, kind, out_dir = parse_args(argv)
    except ValueError as e:
        print(__doc__, file=sys.stderr)
        log(str(e))
        return 2
    # Read before anything runs: the emulated world sets RANK / LOCAL_RANK / WORLD_SIZE.
    tr_env = dr.torchrun_env()
    rank, local_rank = (tr_env[0], tr_env[1]) if tr_env else (0, 0)
    dev = tr.Device(kind)
    # DeepSpeed logs to stdout: the JSON lines get the real stdout, everything else stderr.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    emit = make_emit(json_out, out_dir, rank)
    if dev.cuda:
        torch.cuda.set_device(local_rank)
    for i, cfg in enumerate(read(path)):
        rec = measure(cfg, i, dev, emit, tr_env)
        if tr_env is not None and (rec.get("oom") or "error" in rec):
            # The other ranks may wait in a collective for this one: end the world now
            # (torchrun stops them when a worker exits non-zero).
            os._exit(1)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
