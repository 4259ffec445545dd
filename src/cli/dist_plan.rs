//! What the planning commands add for more than one GPU: `--gpus auto` (the fewest GPUs of
//! the card that fit), and the per-rank lines (world, global batch, host memory for
//! offload, NCCL buffers) of the core's [`PerRank`] figures.

use anyhow::{Result, bail};

use vramlab_core::answer::per_rank::PerRank;
use vramlab_core::model::Preset;
use vramlab_core::plan::search::Budget;
use vramlab_core::plan::{TrainConfig, multi_gpu};

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

/// The per-rank lines of a multi-GPU plan of `c`.
pub fn lines(p: &PerRank, c: &TrainConfig) -> Vec<String> {
    let d = p.distributed;
    let mut v = vec![
        format!("parallel: {} · peaks below are per rank", d.describe()),
        format!(
            "global batch = micro {} × accum {} × world {} = {}",
            c.batch,
            c.accum,
            d.world(),
            p.global_batch
        ),
    ];
    if p.nccl_buffers.0 > 0 {
        v.push(format!(
            "NCCL buffers outside the caching allocator: {} (a documented figure, in the CUDA context line)",
            p.nccl_buffers
        ));
    }
    if p.host_ram_per_rank.0 > 0 {
        v.push(format!(
            "host RAM per rank for offload: {}",
            p.host_ram_per_rank
        ));
    }
    v
}
