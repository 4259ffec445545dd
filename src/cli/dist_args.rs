//! The multi-GPU flags every planning command shares (`--gpus`, `--nodes`, `--strategy`,
//! `--offload`, `--no-reshard-after-forward`, `--fsdp-mixed-precision`, bucket sizes) and
//! how they become a [`Distributed`] setup.

use anyhow::{Result, bail};
use clap::Args;

use vramlab_core::plan::distributed::{Distributed, FsdpMixedPrecision, Offload, Strategy};

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
    /// Data-parallel strategy: ddp, zero1, zero2, zero3, fsdp2 (FSDP1 aliases full_shard,
    /// shard_grad_op, no_shard) [default: fsdp2 with --gpus, else none].
    #[arg(long, value_name = "ddp|zero1|zero2|zero3|fsdp2")]
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
    /// Largest world `--gpus auto` tries.
    #[arg(long, default_value_t = 64)]
    pub max_gpus: u64,
}

impl DistArgs {
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
            || self.gradient_as_bucket_view;
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
        let fsdp_only = self.no_reshard_after_forward || self.fsdp_mixed_precision.is_some();
        if fsdp_only && d.strategy != Strategy::Fsdp2 {
            bail!(
                "--no-reshard-after-forward / --fsdp-mixed-precision: need --strategy fsdp2, not {}",
                d.strategy
            );
        }
        let ddp_only = self.bucket_cap_mb.is_some() || self.gradient_as_bucket_view;
        if ddp_only && d.strategy != Strategy::Ddp {
            bail!(
                "--bucket-cap-mb / --gradient-as-bucket-view: need --strategy ddp, not {}",
                d.strategy
            );
        }
        d.validate()?;
        Ok(d)
    }
}
