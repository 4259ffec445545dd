//! The multi-GPU flags every planning command shares (`--gpus`, `--nodes`, `--strategy`,
//! `--offload`, `--no-reshard-after-forward`, `--fsdp-mixed-precision`, bucket sizes) and
//! how they become a [`Distributed`] setup.

use anyhow::{Result, bail};
use clap::Args;

use vramlab_core::plan::distributed::{
    Distributed, FsdpMixedPrecision, Offload, Strategy, ZeroKnobs,
};

/// More than one GPU.
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
    /// Whether a DeepSpeed knob of every stage was given.
    fn deepspeed_given(&self) -> bool {
        self.reduce_bucket_size.is_some()
            || self.allgather_bucket_size.is_some()
            || self.overlap_comm.is_some()
            || self.no_contiguous_gradients
    }

    /// Whether a DeepSpeed stage-3 knob was given.
    fn stage3_given(&self) -> bool {
        self.stage3_prefetch_bucket_size.is_some()
            || self.stage3_max_live_parameters.is_some()
            || self.stage3_max_reuse_distance.is_some()
            || self.stage3_param_persistence_threshold.is_some()
    }

    /// Whether `--gpus auto` was given.
    pub fn auto(&self) -> bool {
        self.gpus
            .as_deref()
            .is_some_and(|g| g.trim().eq_ignore_ascii_case("auto"))
    }

    /// The setup from the flags (`--gpus auto` plans one GPU here; the search is the
    /// caller's).
    pub fn distributed(&self) -> Result<Distributed> {
        let mut d = Distributed::default();
        let gpus = match self.gpus.as_deref() {
            None => None,
            Some(_) if self.auto() => Some(1),
            Some(g) => match g.trim().parse::<u32>() {
                Ok(n) if n >= 1 => Some(n),
                _ => bail!("--gpus: `{g}` is not a whole number of at least 1 or `auto`"),
            },
        };
        let given = gpus.is_some()
            || self.nodes.is_some()
            || self.strategy.is_some()
            || self.offload.is_some()
            || self.no_reshard_after_forward
            || self.fsdp_mixed_precision.is_some()
            || self.bucket_cap_mb.is_some()
            || self.gradient_as_bucket_view
            || self.deepspeed_given()
            || self.stage3_given();
        if !given {
            return Ok(d);
        }
        d.gpus_per_node = gpus.unwrap_or(1);
        d.nodes = self.nodes.unwrap_or(1);
        d.strategy = match &self.strategy {
            Some(s) => s.parse::<Strategy>()?,
            None => Strategy::Fsdp2,
        };
        if let Some(o) = &self.offload {
            d.offload = o.parse::<Offload>()?;
        }
        d.reshard_after_forward = !self.no_reshard_after_forward;
        if let Some(mp) = &self.fsdp_mixed_precision {
            d.mixed_precision = mp.parse::<FsdpMixedPrecision>()?;
        }
        if let Some(b) = self.bucket_cap_mb {
            d.bucket_cap_mb = b;
        }
        d.gradient_as_bucket_view = self.gradient_as_bucket_view;
        ZeroKnobs {
            reduce_bucket_size: self.reduce_bucket_size,
            allgather_bucket_size: self.allgather_bucket_size,
            overlap_comm: self.overlap_comm,
            contiguous_gradients: Some(!self.no_contiguous_gradients),
            stage3_prefetch_bucket_size: self.stage3_prefetch_bucket_size,
            stage3_max_live_parameters: self.stage3_max_live_parameters,
            stage3_max_reuse_distance: self.stage3_max_reuse_distance,
            stage3_param_persistence_threshold: self.stage3_param_persistence_threshold,
        }
        .apply(&mut d);
        let fsdp_only = self.no_reshard_after_forward || self.fsdp_mixed_precision.is_some();
        if fsdp_only && d.strategy != Strategy::Fsdp2 {
            bail!(
                "--no-reshard-after-forward / --fsdp-mixed-precision: need --strategy fsdp2, not {}",
                d.strategy
            );
        }
        let ddp_only = self.bucket_cap_mb.is_some() || self.gradient_as_bucket_view;
        if ddp_only && !d.strategy.uses_ddp() {
            bail!(
                "--bucket-cap-mb / --gradient-as-bucket-view: need --strategy ddp or torch-zero1, not {}",
                d.strategy
            );
        }
        if self.deepspeed_given() && !d.strategy.is_deepspeed() {
            bail!(
                "--reduce-bucket-size / --allgather-bucket-size / --overlap-comm / --no-contiguous-gradients: need --strategy zero1, zero2 or zero3, not {}",
                d.strategy
            );
        }
        if self.stage3_given() && d.strategy != Strategy::Zero3 {
            bail!("--stage3-*: need --strategy zero3, not {}", d.strategy);
        }
        if self.allgather_bucket_size.is_some() && d.strategy == Strategy::Zero3 {
            bail!(
                "--allgather-bucket-size: stages 1/2 only (zero3 gathers with --stage3-prefetch-bucket-size)"
            );
        }
        d.validate()?;
        Ok(d)
    }
}
