//! What the planning commands add for more than one GPU: `--gpus auto` (the fewest GPUs of
//! the card that fit), and the per-rank lines and JSON fields (world, global batch, host
//! memory for offload, the sharded and unsharded parts).

use anyhow::{Result, bail};

use vramlab_core::model::Preset;
use vramlab_core::plan::search::Budget;
use vramlab_core::plan::{Planner, TrainConfig, multi_gpu};

use super::dist_args::DistArgs;

/// With `--gpus auto`: `cfg` with the fewest GPUs that fit its batch (an error when even
/// `--max-gpus` do not); otherwise `cfg` unchanged.
pub fn resolve_auto(
    a: &DistArgs,
    preset: &Preset,
    cfg: TrainConfig,
    budget: Budget,
) -> Result<TrainConfig> {
    if !a.auto() {
        return Ok(cfg);
    }
    let d = cfg.distributed;
    let per_node = 8;
    match multi_gpu::fewest_gpus(preset, &cfg, d.strategy, per_node, a.max_gpus, budget)? {
        Some(f) => {
            let mut c = cfg;
            c.distributed.nodes = f.nodes;
            c.distributed.gpus_per_node = f.gpus_per_node;
            super::args::note(&format!(
                "--gpus auto: {} GPU(s) ({} node(s) × {}) is the fewest that fit batch {} with {}",
                f.gpus,
                f.nodes,
                f.gpus_per_node,
                cfg.batch,
                d.strategy.label()
            ));
            Ok(c)
        }
        None => bail!(
            "--gpus auto: batch {} does not fit on up to {} GPUs with {} (try --checkpointing, a smaller --batch, --offload, or a larger --max-gpus)",
            cfg.batch,
            a.max_gpus,
            d.strategy.label()
        ),
    }
}

/// The per-rank lines of a multi-GPU plan (empty for one GPU).
pub fn lines(planner: &Planner) -> Vec<String> {
    let c = &planner.config;
    let d = c.distributed;
    if !d.active() {
        return Vec::new();
    }
    let mut v = vec![
        format!("parallel: {} · peaks below are per rank", d.describe()),
        format!(
            "global batch = micro {} × accum {} × world {} = {}",
            c.batch,
            c.accum,
            d.world(),
            c.global_batch()
        ),
    ];
    let nccl = d.nccl_bytes();
    if nccl.0 > 0 {
        v.push(format!(
            "NCCL buffers outside the caching allocator: {nccl} (a documented figure, in the CUDA context line)"
        ));
    }
    let host = multi_gpu::host_bytes(planner);
    if host.0 > 0 {
        v.push(format!("host RAM per rank for offload: {host}"));
    }
    v
}

/// The JSON fields of a multi-GPU plan (none for one GPU).
pub fn json(planner: &Planner, o: &mut serde_json::Map<String, serde_json::Value>) {
    let c = &planner.config;
    let d = c.distributed;
    if !d.active() {
        return;
    }
    o.insert("world".into(), serde_json::json!(d.world()));
    o.insert("strategy".into(), serde_json::json!(d.strategy.as_str()));
    o.insert("per_rank".into(), serde_json::json!(true));
    o.insert("global_batch".into(), serde_json::json!(c.global_batch()));
    o.insert(
        "host_ram_per_rank_bytes".into(),
        serde_json::json!(multi_gpu::host_bytes(planner).0),
    );
    o.insert(
        "nccl_buffer_bytes".into(),
        serde_json::json!(d.nccl_bytes().0),
    );
}
