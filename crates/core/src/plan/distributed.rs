//! More than one GPU, as plain configuration data: the world (nodes × GPUs per node), the
//! data-parallel strategy (DDP, ZeRO-1/2/3, FSDP2), CPU offload, FSDP2's
//! `reshard_after_forward` and `MixedPrecisionPolicy`, and the communication bucket sizes.
//! [`super::TrainConfig::distributed`] carries it; absent means one GPU. What each strategy
//! costs one rank is [`Shards`]': which parts of the model states this rank holds (a
//! [`super::policy::Shard`] each) and the collective buffers the simulator adds.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::error::PlanError;
use super::numerics::{DType, Precision};
use super::policy::Shard;
use crate::units::Bytes;

/// How the model states are split over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Strategy {
    /// One GPU (or independent replicas): no communication.
    #[default]
    #[serde(rename = "none")]
    None,
    /// `DistributedDataParallel`: replicated states, gradient buckets all-reduced.
    #[serde(rename = "ddp")]
    Ddp,
    /// DeepSpeed ZeRO stage 1: optimizer state partitioned.
    #[serde(rename = "zero1")]
    Zero1,
    /// PyTorch's ZeRO-1: DDP (replicated parameters and gradients, reducer buckets) with
    /// `ZeroRedundancyOptimizer`, whose state this rank holds for its own parameters only
    /// (whole parameters, greedily assigned by size: [`torch_zero1_owned`]).
    #[serde(rename = "torch-zero1")]
    TorchZero1,
    /// ZeRO stage 2: optimizer state and gradients partitioned (FSDP1 `SHARD_GRAD_OP`).
    #[serde(rename = "zero2")]
    Zero2,
    /// ZeRO stage 3: parameters too, gathered per layer.
    #[serde(rename = "zero3")]
    Zero3,
    /// FSDP2 `fully_shard` per block + root (FSDP1 `FULL_SHARD` uses the same memory).
    #[serde(rename = "fsdp2")]
    Fsdp2,
}

impl Strategy {
    pub const ALL: [Strategy; 7] = [
        Strategy::None,
        Strategy::Ddp,
        Strategy::Zero1,
        Strategy::TorchZero1,
        Strategy::Zero2,
        Strategy::Zero3,
        Strategy::Fsdp2,
    ];
    /// The strategies of a world of more than one GPU, simplest first (what the searches
    /// prefer on a tie): DDP, PyTorch's ZeRO-1 (DDP + `ZeroRedundancyOptimizer`: one
    /// wrapper more), DeepSpeed's stages 1, 2, 3, then FSDP2 (the model rewrapped per
    /// block, a mixed-precision policy of its own).
    pub const MULTI: [Strategy; 6] = [
        Strategy::Ddp,
        Strategy::TorchZero1,
        Strategy::Zero1,
        Strategy::Zero2,
        Strategy::Zero3,
        Strategy::Fsdp2,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::Ddp => "ddp",
            Strategy::Zero1 => "zero1",
            Strategy::TorchZero1 => "torch-zero1",
            Strategy::Zero2 => "zero2",
            Strategy::Zero3 => "zero3",
            Strategy::Fsdp2 => "fsdp2",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Strategy::None => "Single GPU",
            Strategy::Ddp => "DDP",
            Strategy::Zero1 => "ZeRO-1",
            Strategy::TorchZero1 => "DDP + ZeroRedundancyOptimizer",
            Strategy::Zero2 => "ZeRO-2",
            Strategy::Zero3 => "ZeRO-3",
            Strategy::Fsdp2 => "FSDP2",
        }
    }

    /// Whether parameters are sharded and gathered per unit (FSDP2, ZeRO-3).
    pub fn shards_params(self) -> bool {
        matches!(self, Strategy::Zero3 | Strategy::Fsdp2)
    }

    /// Whether gradients are sharded (reduce-scattered).
    pub fn shards_grads(self) -> bool {
        matches!(self, Strategy::Zero2 | Strategy::Zero3 | Strategy::Fsdp2)
    }

    /// Whether optimizer state is sharded.
    pub fn shards_state(self) -> bool {
        !matches!(self, Strategy::None | Strategy::Ddp)
    }

    /// DeepSpeed's ZeRO stage (0 for DDP and one GPU).
    pub fn zero_stage(self) -> u8 {
        match self {
            Strategy::Zero1 => 1,
            Strategy::Zero2 => 2,
            Strategy::Zero3 | Strategy::Fsdp2 => 3,
            Strategy::None | Strategy::Ddp | Strategy::TorchZero1 => 0,
        }
    }

    /// Whether the optimizer state can move to the CPU (DeepSpeed, FSDP2; not
    /// ZeroRedundancyOptimizer).
    pub fn can_offload(self) -> bool {
        self.shards_state() && self != Strategy::TorchZero1
    }

    /// Whether DistributedDataParallel's reducer runs (DDP, PyTorch's ZeRO-1).
    pub fn uses_ddp(self) -> bool {
        matches!(self, Strategy::Ddp | Strategy::TorchZero1)
    }

    /// Whether DeepSpeed runs it (its `zero_optimization` knobs apply).
    pub fn is_deepspeed(self) -> bool {
        matches!(self, Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is moved to host memory (DeepSpeed `offload_optimizer` / `offload_param`, FSDP
/// `CPUOffloadPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Offload {
    #[default]
    #[serde(rename = "none")]
    None,
    /// The optimizer state (and its fp32 master weights) lives and steps on the CPU.
    #[serde(rename = "optimizer")]
    Optimizer,
    /// The parameters too (ZeRO-3 / FSDP2 only): gathered from host memory per unit.
    #[serde(rename = "params")]
    Params,
}

impl Offload {
    pub const ALL: [Offload; 3] = [Offload::None, Offload::Optimizer, Offload::Params];

    pub fn as_str(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Optimizer => "optimizer",
            Offload::Params => "params",
        }
    }
}

/// FSDP2's `MixedPrecisionPolicy(param_dtype=…, reduce_dtype=float32)`: fp32 sharded
/// parameters, low-precision unsharded compute copies, fp32 gradient reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum FsdpMixedPrecision {
    /// No policy: unsharded parameters in their storage dtype.
    #[default]
    #[serde(rename = "none")]
    None,
    #[serde(rename = "bf16")]
    Bf16,
    #[serde(rename = "fp16")]
    Fp16,
}

impl FsdpMixedPrecision {
    pub fn as_str(self) -> &'static str {
        match self {
            FsdpMixedPrecision::None => "none",
            FsdpMixedPrecision::Bf16 => "bf16",
            FsdpMixedPrecision::Fp16 => "fp16",
        }
    }

    /// The dtype of the unsharded compute copies (`param_dtype`), if set.
    pub fn param_dtype(self) -> Option<DType> {
        match self {
            FsdpMixedPrecision::None => None,
            FsdpMixedPrecision::Bf16 => Some(DType::BF16),
            FsdpMixedPrecision::Fp16 => Some(DType::F16),
        }
    }
}

/// DeepSpeed's defaults (`runtime/zero/config.py`): `reduce_bucket_size`,
/// `allgather_bucket_size` 5e8 elements; `stage3_prefetch_bucket_size` 5e7;
/// `stage3_max_live_parameters` 1e9; `stage3_param_persistence_threshold` 1e5.
pub const DS_BUCKET_ELEMS: u64 = 500_000_000;
pub const DS_PREFETCH_ELEMS: u64 = 50_000_000;
pub const DS_MAX_LIVE_PARAMS: u64 = 1_000_000_000;
pub const DS_PERSISTENCE_THRESHOLD: u64 = 100_000;

/// NCCL's own device memory per process, outside PyTorch's caching allocator (what
/// `nvidia-smi` shows beyond reserved + CUDA context): channel buffers (`NCCL_BUFFSIZE`
/// 4 MiB × protocols × channels × peers) and the communicator's internal state. A
/// documented figure, not measured here: ~0.3–0.6 GiB per communicator on 8-GPU NVLink
/// nodes (NCCL 2.2x); 0 for one GPU.
pub const NCCL_BUFFERS_PER_PEER: Bytes = Bytes(64 << 20);
/// The cap of [`NCCL_BUFFERS_PER_PEER`] × peers.
pub const NCCL_BUFFERS_MAX: Bytes = Bytes(512 << 20);

/// The multi-GPU setup of a training run. The default is one GPU, no strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Distributed {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub strategy: Strategy,
    pub offload: Offload,
    /// FSDP2 `reshard_after_forward` (False keeps the unsharded parameters from forward to
    /// backward, like ZeRO-2).
    pub reshard_after_forward: bool,
    pub mixed_precision: FsdpMixedPrecision,
    /// DDP `bucket_cap_mb` (25; the first bucket is 1 MiB, `dist._DEFAULT_FIRST_BUCKET_BYTES`).
    pub bucket_cap_mb: u64,
    /// DDP `gradient_as_bucket_view`: gradients are views into the buckets (no second copy).
    pub gradient_as_bucket_view: bool,
    /// DeepSpeed `reduce_bucket_size` / `allgather_bucket_size` (elements).
    pub zero_bucket_elems: u64,
    /// DeepSpeed `stage3_prefetch_bucket_size` (elements).
    pub prefetch_elems: u64,
    /// DeepSpeed `stage3_max_live_parameters` (elements).
    pub max_live_params: u64,
    /// DeepSpeed `allgather_bucket_size` (elements, stage 1/2); absent: `zero_bucket_elems`.
    /// No memory of its own: the all-gather writes into the flat 16-bit groups
    /// (`runtime/utils.py` `all_gather_dp_groups`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allgather_bucket_elems: Option<u64>,
    /// DeepSpeed `overlap_comm`; absent: DeepSpeed's default, True for stage 3 and False
    /// for stages 1/2 (`runtime/zero/config.py` `overlap_comm_valid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_comm: Option<bool>,
    /// DeepSpeed `contiguous_gradients` (default True): the reduce (IPG) bucket buffers.
    #[serde(skip_serializing_if = "is_true")]
    pub contiguous_gradients: bool,
    /// DeepSpeed `stage3_param_persistence_threshold` (elements): parameters of at most
    /// this many elements stay whole on every rank.
    #[serde(skip_serializing_if = "is_default_persistence")]
    pub persistence_threshold: u64,
    /// DeepSpeed `stage3_max_reuse_distance` (elements); absent: `max_live_params`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_reuse_distance: Option<u64>,
}

/// DeepSpeed's `zero_optimization` knobs as a user or a measured row gives them (`None`:
/// not given). [`ZeroKnobs::apply`] is the one place they land on a [`Distributed`], for
/// the CLI flags and the measured rows alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroKnobs {
    pub reduce_bucket_size: Option<u64>,
    pub allgather_bucket_size: Option<u64>,
    pub overlap_comm: Option<bool>,
    pub contiguous_gradients: Option<bool>,
    pub stage3_prefetch_bucket_size: Option<u64>,
    pub stage3_max_live_parameters: Option<u64>,
    pub stage3_max_reuse_distance: Option<u64>,
    pub stage3_param_persistence_threshold: Option<u64>,
}

impl ZeroKnobs {
    /// Sets the given knobs on `d`; the ones `Distributed` keeps optional (all-gather bucket,
    /// `overlap_comm`, reuse distance) are set as given, absent included.
    pub fn apply(&self, d: &mut Distributed) {
        if let Some(v) = self.reduce_bucket_size {
            d.zero_bucket_elems = v;
        }
        d.allgather_bucket_elems = self.allgather_bucket_size;
        d.overlap_comm = self.overlap_comm;
        if let Some(v) = self.contiguous_gradients {
            d.contiguous_gradients = v;
        }
        if let Some(v) = self.stage3_prefetch_bucket_size {
            d.prefetch_elems = v;
        }
        if let Some(v) = self.stage3_max_live_parameters {
            d.max_live_params = v;
        }
        d.max_reuse_distance = self.stage3_max_reuse_distance;
        if let Some(v) = self.stage3_param_persistence_threshold {
            d.persistence_threshold = v;
        }
    }
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_default_persistence(t: &u64) -> bool {
    *t == DS_PERSISTENCE_THRESHOLD
}

impl Default for Distributed {
    fn default() -> Self {
        Distributed {
            nodes: 1,
            gpus_per_node: 1,
            strategy: Strategy::None,
            offload: Offload::None,
            reshard_after_forward: true,
            mixed_precision: FsdpMixedPrecision::None,
            bucket_cap_mb: 25,
            gradient_as_bucket_view: false,
            zero_bucket_elems: DS_BUCKET_ELEMS,
            prefetch_elems: DS_PREFETCH_ELEMS,
            max_live_params: DS_MAX_LIVE_PARAMS,
            allgather_bucket_elems: None,
            overlap_comm: None,
            contiguous_gradients: true,
            persistence_threshold: DS_PERSISTENCE_THRESHOLD,
            max_reuse_distance: None,
        }
    }
}

/// The largest world accepted.
pub const MAX_WORLD: u64 = 1 << 16;

impl Distributed {
    /// One GPU, no strategy: plans exactly as before this setting existed.
    pub fn is_single(&self) -> bool {
        *self == Distributed::default()
    }

    /// A world of `gpus` on one node with `strategy`.
    pub fn new(gpus: u32, strategy: Strategy) -> Distributed {
        Distributed {
            gpus_per_node: gpus,
            strategy,
            ..Distributed::default()
        }
    }

    /// Ranks in the world.
    pub fn world(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.gpus_per_node)
    }

    /// Whether the setup changes what one rank holds.
    pub fn active(&self) -> bool {
        self.strategy != Strategy::None
    }

    pub fn validate(&self) -> Result<(), PlanError> {
        if self.nodes == 0 || self.gpus_per_node == 0 {
            return Err(PlanError::Field {
                field: if self.nodes == 0 { "nodes" } else { "gpus" },
                reason: "must be at least 1".into(),
            });
        }
        if self.world() > MAX_WORLD {
            return Err(PlanError::Field {
                field: "gpus",
                reason: format!("a world of {} is larger than {MAX_WORLD}", self.world()),
            });
        }
        if self.offload == Offload::Params && !self.strategy.shards_params() {
            return Err(PlanError::Field {
                field: "offload",
                reason: format!(
                    "params offload needs a strategy that shards parameters (zero3 or fsdp2), not {}",
                    self.strategy
                ),
            });
        }
        if self.offload != Offload::None && !self.strategy.shards_state() {
            return Err(PlanError::Field {
                field: "offload",
                reason: format!(
                    "offload needs a ZeRO or FSDP strategy (zero1, zero2, zero3, fsdp2), not {}",
                    self.strategy
                ),
            });
        }
        if self.offload != Offload::None && self.strategy == Strategy::TorchZero1 {
            return Err(PlanError::Field {
                field: "offload",
                reason: "ZeroRedundancyOptimizer keeps its state on the GPU (no offload)".into(),
            });
        }
        if self.zero_bucket_elems == 0 {
            return Err(PlanError::Field {
                field: "reduce_bucket_size",
                reason: "must be at least 1 (DeepSpeed: gt=0)".into(),
            });
        }
        if self.bucket_cap_mb == 0 {
            return Err(PlanError::Field {
                field: "bucket_cap_mb",
                reason: "must be at least 1".into(),
            });
        }
        Ok(())
    }

    /// DeepSpeed's `overlap_comm` as it runs: the setting, else True for stage 3 and False
    /// for stages 1/2 (`runtime/zero/config.py:384-386`).
    pub fn overlap_comm_effective(&self) -> bool {
        self.overlap_comm.unwrap_or(self.strategy.zero_stage() == 3)
    }

    /// How many IPG (reduce bucket) buffers of `reduce_bucket_size` elements, in the
    /// gradient dtype, DeepSpeed allocates on each rank. Stages 1/2
    /// (`runtime/zero/stage_1_and_2.py:3256-3280`, `setup_buckets`, at the first gradient of
    /// each backward, freed by its epilogue): one when `contiguous_gradients`, a second when
    /// `overlap_comm` too ("double buffers"); stage 3 (`runtime/zero/stage3.py:780-784`, at
    /// initialisation, kept): one when `contiguous_gradients`. Other strategies: none.
    pub fn ipg_buffers(&self) -> u64 {
        if !self.contiguous_gradients {
            return 0;
        }
        match self.strategy {
            Strategy::Zero1 | Strategy::Zero2 => 1 + u64::from(self.overlap_comm_effective()),
            Strategy::Zero3 => 1,
            _ => 0,
        }
    }

    /// The precision the module trains in. DeepSpeed's `bf16` / `fp16` blocks (what the
    /// DeepSpeed export writes for `amp-bf16` / `amp-fp16`) hold the module itself in 16
    /// bits, with no autocast and fp32 only in the optimizer's master partition
    /// (`engine.py` `_configure_zero_optimizer`; `crates/device/runners/ds_runner.py` casts the model as
    /// DeepSpeed expects): planned as `bf16` (fp16 takes the same bytes). Others: `p`.
    pub fn module_precision(&self, p: Precision) -> Precision {
        match p {
            Precision::AmpBf16 | Precision::AmpFp16 if self.strategy.is_deepspeed() => {
                Precision::Bf16
            }
            _ => p,
        }
    }

    /// Whether any DeepSpeed knob differs from its default.
    pub fn deepspeed_knobs_set(&self) -> bool {
        let d = Distributed::default();
        self.zero_bucket_elems != d.zero_bucket_elems
            || self.prefetch_elems != d.prefetch_elems
            || self.max_live_params != d.max_live_params
            || self.allgather_bucket_elems.is_some()
            || self.overlap_comm.is_some()
            || self.contiguous_gradients != d.contiguous_gradients
            || self.persistence_threshold != d.persistence_threshold
            || self.max_reuse_distance.is_some()
    }

    /// The shard of each model state this rank holds.
    pub fn shards(&self) -> Shards {
        let part = Shard {
            num: 1,
            den: self.world().max(1),
        };
        let pick = |yes: bool| if yes { part } else { Shard::WHOLE };
        let st = self.strategy;
        Shards {
            params: pick(st.shards_params()),
            grads: pick(st.shards_grads()),
            state: pick(st.shards_state()),
        }
    }

    /// NCCL's buffers outside the caching allocator for this world (see
    /// [`NCCL_BUFFERS_PER_PEER`]).
    pub fn nccl_bytes(&self) -> Bytes {
        if !self.active() || self.world() <= 1 {
            return Bytes::ZERO;
        }
        let peers = self.world() - 1;
        Bytes(
            NCCL_BUFFERS_PER_PEER
                .0
                .saturating_mul(peers)
                .min(NCCL_BUFFERS_MAX.0),
        )
    }

    /// A one-line description ("4 × GPU, fsdp2, bf16 compute, reshard").
    pub fn describe(&self) -> String {
        let mut s = if self.nodes > 1 {
            format!(
                "{} nodes × {} GPUs, {}",
                self.nodes,
                self.gpus_per_node,
                self.strategy.label()
            )
        } else {
            format!("{} GPUs, {}", self.gpus_per_node, self.strategy.label())
        };
        if self.strategy == Strategy::Fsdp2 {
            if let Some(d) = self.mixed_precision.param_dtype() {
                s.push_str(&format!(", {d:?} compute copies").to_lowercase());
            }
            if !self.reshard_after_forward {
                s.push_str(", no reshard after forward");
            }
        }
        if self.strategy.uses_ddp() && self.gradient_as_bucket_view {
            s.push_str(", gradient_as_bucket_view");
        }
        if self.offload != Offload::None {
            s.push_str(&format!(", {} offloaded to CPU", self.offload.as_str()));
        }
        s
    }
}

/// Which parameters rank 0 owns under `ZeroRedundancyOptimizer` (and so holds optimizer
/// state for), given every parameter's element count and whether it trains (only trainable
/// parameters reach the optimizer). Mirrors `_partition_parameters`
/// (`torch/distributed/optim/zero_redundancy_optimizer.py:680-697`): the parameters sorted
/// by `numel()`, largest first (a stable sort), each given to the rank with the fewest
/// elements so far (`_get_min_index`, the first such rank).
pub fn torch_zero1_owned(elems: &[u64], trainable: &[bool], world: u64) -> Vec<bool> {
    let world = world.max(1) as usize;
    let mut order: Vec<usize> = (0..elems.len())
        .filter(|&p| trainable.get(p).copied().unwrap_or(false))
        .collect();
    order.sort_by(|&a, &b| elems[b].cmp(&elems[a]));
    let mut sizes = vec![0u64; world];
    let mut owned = vec![false; elems.len()];
    for p in order {
        let mut rank = 0;
        for (r, &s) in sizes.iter().enumerate() {
            if s < sizes[rank] {
                rank = r;
            }
        }
        sizes[rank] = sizes[rank].saturating_add(elems[p]);
        owned[p] = rank == 0;
    }
    owned
}

/// The part of each model state one rank holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shards {
    pub params: Shard,
    pub grads: Shard,
    pub state: Shard,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_single_and_serializes_round_trip() {
        let d = Distributed::default();
        assert!(d.is_single());
        assert_eq!(d.world(), 1);
        let j = serde_json::to_string(&Distributed::new(8, Strategy::Fsdp2)).expect("json");
        let back: Distributed = serde_json::from_str(&j).expect("parse");
        assert_eq!(back.world(), 8);
        assert_eq!(back.strategy, Strategy::Fsdp2);
    }

    #[test]
    fn shards_follow_the_strategy() {
        let z1 = Distributed::new(4, Strategy::Zero1).shards();
        assert_eq!(z1.params, Shard::WHOLE);
        assert_eq!(z1.grads, Shard::WHOLE);
        assert_eq!(z1.state, Shard { num: 1, den: 4 });
        let z2 = Distributed::new(4, Strategy::Zero2).shards();
        assert_eq!(z2.grads, Shard { num: 1, den: 4 });
        assert_eq!(z2.params, Shard::WHOLE);
        let f = Distributed::new(8, Strategy::Fsdp2).shards();
        assert_eq!(f.params, Shard { num: 1, den: 8 });
        let d = Distributed::new(8, Strategy::Ddp).shards();
        assert_eq!(d.state, Shard::WHOLE);
    }

    #[test]
    fn invalid_setups_name_the_field() {
        let mut d = Distributed::new(4, Strategy::Ddp);
        d.offload = Offload::Optimizer;
        assert!(
            d.validate()
                .expect_err("ddp offload")
                .to_string()
                .contains("offload")
        );
        let mut d = Distributed::new(4, Strategy::Zero2);
        d.offload = Offload::Params;
        assert!(
            d.validate()
                .expect_err("params")
                .to_string()
                .contains("zero3")
        );
        let d = Distributed::new(0, Strategy::Fsdp2);
        assert!(
            d.validate()
                .expect_err("zero gpus")
                .to_string()
                .contains("gpus")
        );
    }
}
