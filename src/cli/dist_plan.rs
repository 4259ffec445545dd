//! What `plan`'s text adds for more than one GPU: the per-rank lines (world, global batch,
//! host memory for offload, NCCL buffers) of the core's [`PerRank`] figures. (`--gpus auto`
//! is searched in `vramlab_words::train_words`.)

use vramlab_core::answer::per_rank::PerRank;
use vramlab_core::plan::TrainConfig;

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
