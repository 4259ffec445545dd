#!/usr/bin/env python3
"""vramlab distributed runner: the per-rank memory of one training step under FSDP2 or DDP,
measured on ONE GPU (tests/data/distributed.jsonl).

stdout carries JSON only, one object per line; logging goes to stderr.

  dist_runner.py fsdp CONFIGS.jsonl   FSDP2 (`fully_shard` per block + root) as rank 0 of a
                                      world of `gpus` under PyTorch's fake process group
                                      (collectives are no-ops, their buffers are allocated)
  dist_runner.py ddp CONFIGS.jsonl    DDP with a real NCCL process group of world size 1
                                      (the reducer and its buckets exist)
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
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=dcfg.get("bucket_cap_mb", 25),
              gradient_as_bucket_view=bool(dcfg.get("gradient_as_bucket_view", False)))
    return ddp, info


def build_zero1(cfg, preset, dcfg):
    """DDP (no-op comm hook) + ZeroRedundancyOptimizer: run_step's optimizer is swapped for
    ZeroRedundancyOptimizer(params, optimizer_class=<the config's optimizer>)."""
    ddp, info = build_ddp(cfg, preset, dcfg)

    def noop_hook(_state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, noop_hook)
    info["applied_comm_hook"] = "noop (fake process group)"
    info["world"] = dist.get_world_size()
    return ddp, info


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


def init_pg(cfg, mode):
    if dist.is_initialized():
        dist.destroy_process_group()
    if mode in ("fsdp", "zero1"):
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=int(cfg["gpus"]))
    else:
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))


def measure(cfg_in, index, mode, dev, emit):
    rec = {"index": index}
    extra = {k: cfg_in[k] for k in DIST_KEYS if k in cfg_in}
    model = None
    err = oom = None
    try:
        cfg, preset, extra = parse_row(cfg_in, mode)
        rec.update(cfg)
        rec.update(extra)
        rec["model_id"] = preset["id"]
        init_pg(cfg_in, mode)
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
    log(f"{index}: {mode} {rec.get('model_id')} gpus={cfg_in.get('gpus')} "
        f"alloc={rec.get('peak_allocated')} reserved={rec.get('peak_reserved')} err={err} oom={oom}")


def main(argv):
    if len(argv) >= 2 and argv[0] == "check":
        # Parse every row of a config file without CUDA: `dist_runner.py check MODE FILE`.
        mode, path = argv[1], argv[2]
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip() and not line.startswith("#")]
        for i, row in enumerate(rows):
            cfg, preset, extra = parse_row(row, mode)
            print(json.dumps({"index": i, "ok": True, "model_id": preset["id"], **extra}))
        return 0
    if len(argv) < 2 or argv[0] not in ("fsdp", "ddp", "zero1"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, path = argv[0], argv[1]
    with open(path) as f:
        configs = [json.loads(line) for line in f if line.strip() and not line.startswith("#")]
    dev = tr.Device("cuda")
    emit = tr.Emitter()
    torch.cuda.set_device(0)
    if mode == "zero1":
        # run_step builds its optimizer with torch_runner.make_optimizer.
        tr.make_optimizer = zero1_optimizer
    for i, cfg in enumerate(configs):
        measure(cfg, i, mode, dev, emit)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
