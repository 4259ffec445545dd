//! The multi-GPU flags every planning command shares (`--gpus`, `--nodes`, `--strategy`,
//! `--offload`, `--no-reshard-after-forward`, `--fsdp-mixed-precision`, bucket sizes) and
//! how they become [`DistWords`] (resolved by `vramlab-words` to a `Distributed` setup).

use clap::Args;

use vramlab_words::train_words::DistWords;

// More than one GPU. (A plain comment: see `TrainArgs`.)
#[derive(Debug, Args, Clone, Default)]
pub struct DistArgs {
    /// GPUs per node, or `auto`: the fewest GPUs of the card that fit the batch with the
    /// strategy (searched up to --max-gpus) [default: 1].
    #[arg(long, value_name = "N|auto")]
    pub gpus: Option<String>,
    /// Nodes (the world is nodes × GPUs per node) [default: 1].
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Data-parallel strategy: ddp, zero1, torch-zero1 (DDP + ZeroRedundancyOptimizer),
    /// zero2, zero3, fsdp2 (FSDP1 aliases full_shard, shard_grad_op, no_shard)
    /// [default: fsdp2 with --gpus, else none].
    #[arg(long, value_name = "ddp|zero1|torch-zero1|zero2|zero3|fsdp2")]
    pub strategy: Option<String>,
    /// Move to host memory: optimizer (state + fp32 grads) or params (ZeRO-3 / FSDP2).
    #[arg(long, value_name = "optimizer|params")]
    pub offload: Option<String>,
    /// FSDP2 `reshard_after_forward=False`: keep gathered parameters until backward.
    #[arg(long)]
    pub no_reshard_after_forward: bool,
    /// FSDP2 `MixedPrecisionPolicy(param_dtype=…, reduce_dtype=float32)`.
    #[arg(long, value_name = "bf16|fp16")]
    pub fsdp_mixed_precision: Option<String>,
    /// DDP `bucket_cap_mb` [default: 25].
    #[arg(long)]
    pub bucket_cap_mb: Option<u64>,
    /// DDP `gradient_as_bucket_view=True`.
    #[arg(long)]
    pub gradient_as_bucket_view: bool,
    /// DeepSpeed `reduce_bucket_size` (elements) [default: 5e8].
    #[arg(long, value_name = "ELEMS")]
    pub reduce_bucket_size: Option<u64>,
    /// DeepSpeed `allgather_bucket_size` (elements, stage 1/2) [default: reduce bucket].
    #[arg(long, value_name = "ELEMS")]
    pub allgather_bucket_size: Option<u64>,
    /// DeepSpeed `overlap_comm` [default: true for zero3, false for zero1/zero2].
    #[arg(long, value_name = "true|false")]
    pub overlap_comm: Option<bool>,
    /// DeepSpeed `contiguous_gradients=false` (no IPG reduce buckets).
    #[arg(long)]
    pub no_contiguous_gradients: bool,
    /// DeepSpeed `stage3_prefetch_bucket_size` (elements) [default: 5e7].
    #[arg(long, value_name = "ELEMS")]
    pub stage3_prefetch_bucket_size: Option<u64>,
    /// DeepSpeed `stage3_max_live_parameters` (elements) [default: 1e9].
    #[arg(long, value_name = "ELEMS")]
    pub stage3_max_live_parameters: Option<u64>,
    /// DeepSpeed `stage3_max_reuse_distance` (elements) [default: 1e9].
    #[arg(long, value_name = "ELEMS")]
    pub stage3_max_reuse_distance: Option<u64>,
    /// DeepSpeed `stage3_param_persistence_threshold` (elements; parameters this small stay
    /// whole on every rank) [default: 1e5].
    #[arg(long, value_name = "ELEMS")]
    pub stage3_param_persistence_threshold: Option<u64>,
    /// Largest world `--gpus auto` tries.
    #[arg(long, default_value_t = 64)]
    pub max_gpus: u64,
}

impl DistArgs {
    /// The flags as `vramlab-words`' words.
    pub fn words(&self) -> DistWords {
        DistWords {
            gpus: self.gpus.clone(),
            nodes: self.nodes,
            strategy: self.strategy.clone(),
            offload: self.offload.clone(),
            no_reshard_after_forward: self.no_reshard_after_forward,
            fsdp_mixed_precision: self.fsdp_mixed_precision.clone(),
            bucket_cap_mb: self.bucket_cap_mb,
            gradient_as_bucket_view: self.gradient_as_bucket_view,
            reduce_bucket_size: self.reduce_bucket_size,
            allgather_bucket_size: self.allgather_bucket_size,
            overlap_comm: self.overlap_comm,
            no_contiguous_gradients: self.no_contiguous_gradients,
            stage3_prefetch_bucket_size: self.stage3_prefetch_bucket_size,
            stage3_max_live_parameters: self.stage3_max_live_parameters,
            stage3_max_reuse_distance: self.stage3_max_reuse_distance,
            stage3_param_persistence_threshold: self.stage3_param_persistence_threshold,
            max_gpus: self.max_gpus,
        }
    }
}
