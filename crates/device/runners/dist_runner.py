#!/usr/bin/env python3
"""vramlab distributed runner: the per-rank memory of one training step under FSDP2 or DDP,
measured on ONE GPU (tests/data/distributed.jsonl), or on every rank of a world under
torchrun (vramlab's bench: crates/device/src/bench/dist.rs).

stdout carries JSON only, one object per line; logging goes to stderr.

  dist_runner.py MODE CONFIGS.jsonl [--out-dir DIR]
      --out-dir: every rank also appends its records to DIR/rank<R>.jsonl (the bench reads
      one file per rank).
  dist_runner.py selftest             the CUDA-free parts on CPU (no GPU needed)

  dist_runner.py fsdp CONFIGS.jsonl   FSDP2 (`fully_shard` per block + root) as rank 0 of a
                                      world of `gpus` under PyTorch's fake process group
                                      (collectives are no-ops, their buffers are allocated)
  dist_runner.py ddp CONFIGS.jsonl    DDP with a real NCCL process group of world size 1
                                      (the reducer and its buckets exist); `gpus` > 1: rank 0
                                      of that world under the fake process group with the
                                      no-op comm hook of `zero1` below
  dist_runner.py zero1 CONFIGS.jsonl  PyTorch's ZeRO-1 ("strategy": "torch-zero1"): DDP +
                                      ZeroRedundancyOptimizer as rank 0 of a world of `gpus`
                                      under the fake process group. DDP's default all-reduce
                                      hook returns None there ("expected the hook result is
                                      either a Tensor or a TensorList found None"), so a
                                      no-op comm hook returns the bucket itself (what the
                                      in-place all-reduce would return: no extra memory);
                                      ZeroRedundancyOptimizer partitions the parameters over
                                      the N ranks (rank 0 steps and keeps state for its own)
                                      and its broadcasts are no-ops.

Under torchrun (`python -m torch.distributed.run --standalone --nproc_per_node N
dist_runner.py MODE CONFIGS.jsonl --out-dir DIR`; RANK / LOCAL_RANK / WORLD_SIZE set) every
mode runs for real: an NCCL process group of WORLD_SIZE (which must equal the config's
`gpus`), rank R on GPU LOCAL_RANK, DDP's own all-reduce. Each rank writes its record; a rank
that runs out of memory or fails exits with status 1 after writing it, so torchrun stops the
others instead of leaving them waiting in a collective. Every record says how it ran:
"rank", "world_size", "world_mode" ("torchrun", "emulated" = fake process group, "single" =
NCCL world of 1 in one process).

A config is torch_runner.py's (model, batch, seq, precision, optimizer, accum, checkpointing,
attention, loop) plus:
  "gpus": N, "strategy": "fsdp2" | "ddp" | "torch-zero1",
  "reshard_after_forward": true,            fsdp2 (fully_shard's argument)
  "fsdp_mixed_precision": null | "bf16" | "fp16"
        MixedPrecisionPolicy(param_dtype=bf16|fp16, reduce_dtype=float32); null: no policy
  "bucket_cap_mb": 25, "gradient_as_bucket_view": false     ddp, torch-zero1

The model is built on the meta device, checkpointing enabled (HF gradient checkpointing,
non-reentrant), every decoder block and then the root are `fully_shard`-ed, then
`to_empty(device="cuda")`; local shards are initialised N(0, 0.02) (1-D weights 1, biases 0)
and the rotary embedding is rebuilt on the GPU. The measured loop is torch_runner.run_step
(two warm-up steps, then one measured step after reset_peak_memory_stats). Between configs
the process group is destroyed, the model dropped, gc.collect() + empty_cache().
"""

import gc
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_runner as tr  # noqa: E402

DIST_KEYS = ("gpus", "nodes", "strategy", "reshard_after_forward", "fsdp_mixed_precision",
             "bucket_cap_mb", "gradient_as_bucket_view", "tag")
MP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_MAKE_OPTIMIZER = tr.make_optimizer


def log(*args):
    print("[dist_runner]", *args, file=sys.stderr, flush=True)


def blocks_of(model):
    """The decoder blocks: the first nn.ModuleList holding more than one module."""
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > 0:
            return name, list(m)
    raise RuntimeError("no block list found")


def init_local(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = p._local_tensor if hasattr(p, "_local_tensor") else p
            if t.numel() == 0:
                continue
            if name.endswith("bias"):
                t.zero_()
            elif p.dim() == 1:
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02)
        for name, b in model.named_buffers():
            if b.is_floating_point():
                b.zero_()
    inner = getattr(model, "model", None)
    rope = getattr(inner, "rotary_emb", None) if inner is not None else None
    if rope is not None:
        try:
            inner.rotary_emb = type(rope)(config=model.config, device="cuda")
        except Exception as e:  # numerics only; memory is the same
            log(f"rotary rebuild failed: {e}")


def build_fsdp(cfg, preset, dcfg):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    fam = preset["family"]
    with torch.device("meta"):
        model = tr.build_reference(preset, cfg.get("seq"), attention=cfg["attention"])
    if cfg["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    wrapped = tr.enable_checkpointing(model, fam) if cfg["checkpointing"] else 0
    mpn = dcfg.get("fsdp_mixed_precision")
    mp = MixedPrecisionPolicy(param_dtype=MP_DTYPES[mpn], reduce_dtype=torch.float32) if mpn \
        else MixedPrecisionPolicy()
    reshard = bool(dcfg.get("reshard_after_forward", True))
    _, blocks = blocks_of(model)
    for b in blocks:
        fully_shard(b, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    model.to_empty(device="cuda")
    init_local(model)
    params = list(model.parameters())
    info = {
        "applied_mp_param_dtype": str(mp.param_dtype),
        "applied_reshard_after_forward": reshard,
        "params": int(sum(p.numel() for p in params)),
        "local_param_bytes": int(sum(tr.tensor_bytes(getattr(p, "_local_tensor", p)) for p in params)),
        "fsdp_units": len(blocks) + 1,
        "checkpointed_blocks": wrapped,
    }
    return model, info


def build_ddp(cfg, preset, dcfg):
    from torch.nn.parallel import DistributedDataParallel as DDP

    fam = preset["family"]
    with torch.device("cuda"):
        model = tr.build_reference(preset, cfg.get("seq"), attention=cfg["attention"])
    if cfg["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    wrapped = tr.enable_checkpointing(model, fam) if cfg["checkpointing"] else 0
    params = list(model.parameters())
    info = {"params": int(sum(p.numel() for p in params)),
            "param_bytes": int(sum(tr.tensor_bytes(p) for p in params)),
            "checkpointed_blocks": wrapped,
            "applied_gradient_as_bucket_view": bool(dcfg.get("gradient_as_bucket_view", False))}
    ddp = DDP(model, device_ids=[torch.cuda.current_device()],
              bucket_cap_mb=dcfg.get("bucket_cap_mb", 25),
              gradient_as_bucket_view=bool(dcfg.get("gradient_as_bucket_view", False)))
    if dist.get_backend() == "fake":
        ddp.register_comm_hook(None, noop_hook)
        info["applied_comm_hook"] = "noop (fake process group)"
    info["world"] = dist.get_world_size()
    return ddp, info


def build_zero1(cfg, preset, dcfg):
    """DDP (no-op comm hook under the fake process group) + ZeroRedundancyOptimizer:
    run_step's optimizer is swapped for ZeroRedundancyOptimizer(params,
    optimizer_class=<the config's optimizer>)."""
    return build_ddp(cfg, preset, dcfg)


def zero1_optimizer(name, params):
    """ZeroRedundancyOptimizer around torch_runner's optimizer `name` (same arguments)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    import inspect

    probe = _MAKE_OPTIMIZER(name, [torch.nn.Parameter(torch.zeros(1))])
    cls = type(probe)
    # defaults hold keys the constructor does not take (AdamW: decoupled_weight_decay).
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in probe.defaults.items() if k in accepted}
    opt = ZeroRedundancyOptimizer(list(params), optimizer_class=cls, **kwargs)
    _ZERO1_MADE.append(opt)
    return opt


# The ZeroRedundancyOptimizers run_step made (its wrapper's `state` is empty: the local
# optimizer's state is rank 0's), read back and dropped after each config.
_ZERO1_MADE = []


def parse_row(cfg_in, mode):
    """The torch_runner config and the distributed keys of one row (no CUDA needed);
    raises ValueError when the row does not belong to `mode`."""
    extra = {k: cfg_in[k] for k in DIST_KEYS if k in cfg_in}
    base = {k: v for k, v in cfg_in.items() if k not in DIST_KEYS}
    want = {"fsdp": ("fsdp2",), "ddp": ("ddp",), "zero1": ("torch-zero1",)}[mode]
    if extra.get("strategy", want[0]) not in want:
        raise ValueError(f"strategy {extra.get('strategy')!r} in a `{mode}` run (wants {want[0]})")
    if int(extra.get("gpus", 1)) < 1:
        raise ValueError(f"gpus {extra.get('gpus')!r}: at least 1")
    cfg, preset = tr.normalize_config(base)
    return cfg, preset, extra


def torchrun_env(environ=None):
    """(rank, local_rank, world_size) when launched by torchrun, else None."""
    env = os.environ if environ is None else environ
    if not all(k in env for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return None
    return int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"])


def world_mode(cfg, mode, environ=None):
    """How a config's world runs here: "torchrun", "emulated" (fake process group, rank 0 of
    `gpus`) or "single" (NCCL world of 1, DDP only)."""
    if torchrun_env(environ) is not None:
        return "torchrun"
    if mode == "ddp" and int(cfg.get("gpus", 1)) == 1:
        return "single"
    return "emulated"


def init_pg(cfg, mode):
    how = world_mode(cfg, mode)
    if how == "torchrun":
        _, local_rank, world = torchrun_env()
        if int(cfg.get("gpus", 1)) != world:
            raise ValueError(f"gpus {cfg.get('gpus')} in a torchrun world of {world}")
        if not dist.is_initialized():  # one process group for the process's life
            dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        return how
    if dist.is_initialized():
        dist.destroy_process_group()
    if how == "emulated":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=int(cfg["gpus"]))
    else:
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    return how


def noop_hook(_state, bucket):
    """The fake process group's all-reduce returns None; this returns the bucket itself
    (what the in-place all-reduce would return: no extra memory)."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def measure(cfg_in, index, mode, dev, emit):
    """Runs one config; emits its record; returns it."""
    rec = {"index": index}
    tr_env = torchrun_env()
    rec["rank"] = tr_env[0] if tr_env else 0
    rec["world_size"] = tr_env[2] if tr_env else int(cfg_in.get("gpus", 1) or 1)
    model = None
    err = oom = None
    try:
        cfg, preset, extra = parse_row(cfg_in, mode)
        rec.update(cfg)
        rec.update(extra)
        rec["model_id"] = preset["id"]
        rec["world_mode"] = init_pg(cfg_in, mode)
        t0 = time.time()
        # The distributed keys (kept out of torch_runner's config) drive the wrapping.
        build = {"fsdp": build_fsdp, "ddp": build_ddp, "zero1": build_zero1}[mode]
        model, info = build(cfg, preset, extra)
        rec.update(info)
        rec["build_s"] = round(time.time() - t0, 3)
        dev.empty_cache()
        tr.run_step(model, preset["family"], cfg, preset, dev, rec)
        if _ZERO1_MADE:
            local = _ZERO1_MADE[-1].optim
            rec["opt_state_bytes"] = tr.optimizer_state_bytes(local)
            rec["zero1_rank0_params"] = int(sum(p.numel() for g in local.param_groups for p in g["params"]))
            _ZERO1_MADE.clear()
        rec["oom"] = False
    except torch.OutOfMemoryError as e:
        oom = str(e).strip().splitlines()[0][:500] if str(e).strip() else "CUDA out of memory"
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        log(traceback.format_exc())
    _ZERO1_MADE.clear()
    if oom is not None:
        rec["oom"] = True
        rec["message"] = oom
        rec["peak_allocated_before_oom"] = dev.peak()
        rec["peak_reserved_before_oom"] = dev.peak_reserved()
    if err is not None:
        rec["error"] = err
    if model is not None:
        for p in model.parameters():
            p.grad = None
    model = None
    gc.collect()
    torch.cuda.empty_cache()
    rec["versions"] = tr.versions()
    emit(rec)
    log(f"{index}: {mode} rank {rec['rank']} {rec.get('model_id')} gpus={cfg_in.get('gpus')} "
        f"alloc={rec.get('peak_allocated')} reserved={rec.get('peak_reserved')} err={err} oom={oom}")
    return rec


MODES = ("fsdp", "ddp", "zero1")


def parse_args(argv, modes=MODES, prog="dist_runner.py"):
    """(mode, configs path, out dir or None); raises ValueError naming what is wrong.
    `modes` / `prog`: another runner's (ds_runner.py: "measure")."""
    rest = list(argv)
    out_dir = None
    if "--out-dir" in rest:
        i = rest.index("--out-dir")
        if i + 1 >= len(rest):
            raise ValueError("--out-dir needs a folder")
        out_dir = rest[i + 1]
        del rest[i:i + 2]
    if len(rest) != 2 or rest[0] not in modes:
        raise ValueError(f"usage: {prog} {'|'.join(modes)} CONFIGS.jsonl [--out-dir DIR]")
    return rest[0], rest[1], out_dir


def rank_file(out_dir, rank):
    """Where rank `rank` writes its records under --out-dir."""
    return os.path.join(out_dir, f"rank{rank}.jsonl")


def selftest():
    """The CUDA-free parts, on CPU: arguments, the torchrun environment, the mode picked,
    rank files, the fake process group. `dist_runner.py selftest` prints "selftest ok"."""
    import tempfile

    assert parse_args(["fsdp", "c.jsonl"]) == ("fsdp", "c.jsonl", None)
    assert parse_args(["ddp", "c.jsonl", "--out-dir", "/x"]) == ("ddp", "c.jsonl", "/x")
    for bad in (["fsdp"], ["nope", "c"], ["fsdp", "c", "--out-dir"]):
        try:
            parse_args(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    assert torchrun_env(env) == (1, 1, 2) and torchrun_env({}) is None
    assert world_mode({"gpus": 2}, "fsdp", env) == "torchrun"
    assert world_mode({"gpus": 1}, "ddp", {}) == "single"
    assert world_mode({"gpus": 4}, "ddp", {}) == "emulated"
    with tempfile.TemporaryDirectory() as t:
        tr.Emitter(rank_file(t, 3))({"index": 0, "rank": 3})
        with open(os.path.join(t, "rank3.jsonl")) as f:
            assert json.loads(f.read()) == {"index": 0, "rank": 3}
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    assert dist.get_world_size() == 4
    # DDP at world 4 under the fake process group needs the no-op comm hook.
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(nn.Linear(8, 1))
    ddp.register_comm_hook(None, noop_hook)
    ddp(torch.randn(2, 8)).sum().backward()
    dist.destroy_process_group()
    print("selftest ok")
    return 0


def main(argv):
    if argv[:1] == ["selftest"]:
        return selftest()
    if len(argv) >= 2 and argv[0] == "check":
        # Parse every row of a config file without CUDA: `dist_runner.py check MODE FILE`.
        mode, path = argv[1], argv[2]
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip() and not line.startswith("#")]
        for i, row in enumerate(rows):
            cfg, preset, extra = parse_row(row, mode)
            print(json.dumps({"index": i, "ok": True, "model_id": preset["id"], **extra}))
        return 0
    try:
        mode, path, out_dir = parse_args(argv)
    except ValueError as e:
        print(__doc__, file=sys.stderr)
        log(str(e))
        return 2
    with open(path) as f:
        configs = [json.loads(line) for line in f if line.strip() and not line.startswith("#")]
    dev = tr.Device("cuda")
    tr_env = torchrun_env()
    rank, local_rank = (tr_env[0], tr_env[1]) if tr_env else (0, 0)
    emit = tr.Emitter(rank_file(out_dir, rank) if out_dir else None)
    torch.cuda.set_device(local_rank)
    if mode == "zero1":
        # run_step builds its optimizer with torch_runner.make_optimizer.
        tr.make_optimizer = zero1_optimizer
    for i, cfg in enumerate(configs):
        rec = measure(cfg, i, mode, dev, emit)
        if tr_env is not None and (rec.get("oom") or "error" in rec):
            # The other ranks may wait in a collective for this one: end the world now
            # (torchrun stops them when a worker exits non-zero).
            sys.stdout.flush()
            os._exit(1)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
