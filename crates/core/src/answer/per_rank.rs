//! The figures of a multi-GPU plan: the world and strategy, the global batch, what one rank
//! needs outside the caching allocator (NCCL buffers) and in host memory (offload). The
//! plan's peaks are per rank then.

use serde::Serialize;

use crate::plan::distributed::Distributed;
use crate::plan::{Planner, multi_gpu};
use crate::units::Bytes;

/// What a plan on more than one GPU adds (`world`, `strategy`, `per_rank`, `global_batch`,
/// `host_ram_per_rank_bytes`, `nccl_buffer_bytes` of `plan --json`).
#[derive(Debug, Clone, PartialEq)]
pub struct PerRank {
    pub distributed: Distributed,
    /// Samples per optimizer step over all ranks (micro × accumulation × world).
    pub global_batch: u64,
    /// Host memory one rank needs for offloaded state.
    pub host_ram_per_rank: Bytes,
    /// NCCL's buffers outside the caching allocator (counted in the CUDA context).
    pub nccl_buffers: Bytes,
}

impl PerRank {
    /// The figures of `planner`'s world; `None` for one GPU.
    pub fn of(planner: &Planner) -> Option<PerRank> {
        let c = &planner.config;
        let d = c.distributed;
        if !d.active() {
            return None;
        }
        Some(PerRank {
            distributed: d,
            global_batch: c.global_batch(),
            host_ram_per_rank: multi_gpu::host_bytes(planner),
            nccl_buffers: d.nccl_bytes(),
        })
    }

    /// The fields of `plan --json`.
    pub(crate) fn json(&self) -> PerRankJson {
        PerRankJson {
            global_batch: self.global_batch,
            host_ram_per_rank_bytes: self.host_ram_per_rank,
            nccl_buffer_bytes: self.nccl_buffers,
            per_rank: true,
            strategy: self.distributed.strategy.as_str(),
            world: self.distributed.world(),
        }
    }
}

/// [`PerRank`] as `plan --json` writes it.
#[derive(Debug, Serialize)]
pub(crate) struct PerRankJson {
    global_batch: u64,
    host_ram_per_rank_bytes: Bytes,
    nccl_buffer_bytes: Bytes,
    per_rank: bool,
    strategy: &'static str,
    world: u64,
}
