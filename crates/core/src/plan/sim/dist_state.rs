//! The per-rank state of a multi-GPU strategy in the simulator (`DistSim`): FSDP2 / ZeRO-3
//! units and their live buffers, DDP's buckets, DeepSpeed's optimizer and parameter
//! coordinator; computed once per generation and held by the simulation state (the walk
//! that updates it is `dist.rs`'s).

use super::ds_fetch::{Coordinator, Trace};
use super::ds_zero_state::DsZero;
use crate::model::ir::Graph;
use crate::plan::config::DType;
use crate::plan::distributed::{Distributed, Offload, Strategy, torch_zero1_owned};
use crate::plan::policy::{ParamPolicy, Shard};

/// The per-rank simulation state of a strategy.
#[derive(Debug, Default)]
pub(super) struct DistSim {
    /// FSDP2 / ZeRO-3 unit walk.
    pub(super) units: bool,
    pub(super) world: u64,
    pub(super) strategy: Strategy,
    /// The parameters of each unit (blocks first; the root, everything else, last).
    pub(super) unit_params: Vec<Vec<usize>>,
    /// dtype of the unsharded parameters and their gradients.
    pub(super) unsharded: Option<DType>,
    pub(super) reduce: Option<DType>,
    pub(super) reshard: bool,
    /// Live unsharded parameter buffers per unit.
    pub(super) live: Vec<Vec<u32>>,
    pub(super) rs_pending: Option<u32>,
    /// FSDP2's `comm_ctx.all_gather_state`: in forward, a unit's all-gather output is kept
    /// after its copy-out until the next unit's `wait_for_unshard` (to overlap that copy-out
    /// with the next all-gather) or the root's post-forward.
    pub(super) ag_state: Option<u32>,
    /// The sharded gradients of each unit (one flat reduce-scatter output).
    pub(super) sharded_grad: Vec<Option<u32>>,
    pub(super) state_shard: Option<Shard>,
    pub(super) offload_state: bool,
    pub(super) offload_params: bool,
    /// DDP with `gradient_as_bucket_view`: gradients live in the buckets.
    pub(super) grads_in_buckets: bool,
    /// DeepSpeed ZeRO-1/2/3: the optimizer's model states and gradient path.
    pub(super) zero: Option<DsZero>,
    /// PyTorch's ZeRO-1: the parameters whose optimizer state this rank (0) holds.
    pub(super) owned: Option<Vec<bool>>,
    /// DDP's reducer buckets (buffer id, bytes).
    pub(super) ddp_buckets: Vec<(u32, u64)>,
    /// ZeRO-3: DeepSpeed's parameter coordinator, and each parameter's gathered buffer.
    pub(super) ds: Option<Coordinator>,
    pub(super) ds_bufs: Vec<Option<u32>>,
}

/// ZeRO-3's module trace of one micro-step, a module being a node with parameters: the
/// forward in order, then the backward in reverse, a checkpointed block's recomputed
/// forward before its backward (as [`super::state::Sim::micro_step`] and `recompute_block` walk).
fn zero3_trace(g: &Graph, checkpointing: bool) -> Trace {
    let with_params = |n: usize| !g.nodes[n].params.is_empty();
    let module = |n: usize| {
        let mut ps = g.nodes[n].params.to_vec();
        ps.sort_unstable();
        ps.dedup();
        ps
    };
    let count = g.nodes.len();
    let mut trace: Trace = (0..count).filter(|&n| with_params(n)).map(module).collect();
    for n in (0..count).rev() {
        if checkpointing
            && let Some(b) = g.nodes[n].block
            && (n + 1 == count || g.nodes[n + 1].block != Some(b))
        {
            let start = g.nodes.iter().position(|m| m.block == Some(b)).unwrap_or(n);
            trace.extend((start..=n).filter(|&m| with_params(m)).map(module));
        }
        if with_params(n) {
            trace.push(module(n));
        }
    }
    trace
}

impl DistSim {
    pub(super) fn new(
        g: &Graph,
        d: &Distributed,
        policy: &ParamPolicy,
        checkpointing: bool,
    ) -> DistSim {
        if !d.active() {
            return DistSim::default();
        }
        let blocks = g.block_count() as usize;
        let root = blocks;
        let mut unit_of = vec![usize::MAX; g.params.len()];
        for node in &g.nodes {
            for &p in &node.params {
                if unit_of[p] == usize::MAX {
                    unit_of[p] = node.block.map_or(root, |b| b as usize);
                }
            }
        }
        let mut unit_params = vec![Vec::new(); blocks + 1];
        let persistent = |p: usize| {
            d.strategy == Strategy::Zero3 && g.params[p].elems <= d.persistence_threshold
        };
        for (p, u) in unit_of.iter_mut().enumerate() {
            if *u == usize::MAX {
                *u = root;
            }
            if !persistent(p) {
                unit_params[*u].push(p);
            }
        }
        let ds = (d.strategy == Strategy::Zero3).then(|| {
            let numel: Vec<u64> = g.params.iter().map(|p| p.elems).collect();
            let persistent = (0..g.params.len()).map(persistent).collect();
            Coordinator::new(
                zero3_trace(g, checkpointing),
                numel,
                persistent,
                d.prefetch_elems,
                d.max_live_params,
                d.max_reuse_distance.unwrap_or(d.max_live_params),
            )
        });
        let owned = (d.strategy == Strategy::TorchZero1).then(|| {
            let elems: Vec<u64> = g.params.iter().map(|p| p.elems).collect();
            let trainable: Vec<bool> = (0..g.params.len()).map(|p| policy.trainable(p)).collect();
            torch_zero1_owned(&elems, &trainable, d.world())
        });
        let sh = d.shards();
        let units = d.strategy.shards_params();
        let storage = (!policy.is_empty()).then(|| policy.state(0).storage);
        let mp = if d.strategy == Strategy::Fsdp2 {
            d.mixed_precision.param_dtype()
        } else {
            None
        };
        DistSim {
            units,
            world: d.world().max(1),
            strategy: d.strategy,
            unit_params,
            unsharded: mp.or(storage),
            // MixedPrecisionPolicy(reduce_dtype=float32); without one, the parameter dtype.
            reduce: if mp.is_some() {
                Some(DType::F32)
            } else {
                storage
            },
            reshard: d.reshard_after_forward || d.strategy == Strategy::Zero3,
            live: vec![Vec::new(); blocks + 1],
            rs_pending: None,
            ag_state: None,
            sharded_grad: vec![None; blocks + 1],
            state_shard: (sh.state != Shard::WHOLE && owned.is_none()).then_some(sh.state),
            offload_state: d.offload != Offload::None,
            offload_params: d.offload == Offload::Params,
            grads_in_buckets: d.strategy.uses_ddp() && d.gradient_as_bucket_view,
            zero: DsZero::new(g, d, policy),
            owned,
            ddp_buckets: Vec::new(),
            ds_bufs: if ds.is_some() {
                vec![None; g.params.len()]
            } else {
                Vec::new()
            },
            ds,
        }
    }

    /// Whether block `b` is resharded after its forward.
    pub(super) fn reshard_after(&self, _b: usize) -> bool {
        self.reshard
    }

    pub(super) fn root(&self) -> usize {
        self.unit_params.len().saturating_sub(1)
    }
}

/// The unit walk's hooks are placed by the forward and backward loops
/// ([`super::autograd`]); this checks the unit bookkeeping on a real graph.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::families::transformer::AttnImpl;
    use crate::plan::config::Precision;

    #[test]
    fn every_parameter_has_one_unit_and_the_root_is_last() {
        let p = crate::model::preset::find_builtin("gpt2").expect("preset");
        let g = p.build(128, AttnImpl::Sdpa).expect("graph");
        let pol = ParamPolicy::full(&g, Precision::Fp32);
        let d = Distributed::new(4, Strategy::Fsdp2);
        let ds = DistSim::new(&g, &d, &pol, false);
        assert_eq!(ds.unit_params.len(), g.block_count() as usize + 1);
        let n: usize = ds.unit_params.iter().map(Vec::len).sum();
        assert_eq!(n, g.params.len());
        // GPT-2's root holds wte, wpe and ln_f.
        assert!(ds.unit_params[ds.root()].len() >= 3);
    }
}
