//! More than one GPU in the simulator: what one rank allocates under DDP, ZeRO and FSDP2
//! ([`crate::plan::distributed`]). FSDP2 (`torch/distributed/fsdp/_fully_shard/`), per unit
//! (each block, then the root with everything else):
//!
//! - unshard (`FSDPParamGroup.unshard` → `foreach_all_gather`): the all-gather output, one
//!   flat buffer of world × the unit's padded shards in the compute dtype (with a
//!   `MixedPrecisionPolicy`, the shards are cast to it first), then each parameter's
//!   unsharded tensor, copied out of it (`foreach_all_gather_copy_out`); the output dies;
//! - forward: a block's parameters are resharded after its forward when
//!   `reshard_after_forward`; the root's never are (FSDP2 does not reshard the root);
//! - backward: a unit's pre-backward unshards it and prefetches the next one (the block
//!   before it), so two blocks and the root are unsharded while a block's backward runs;
//!   autograd writes unsharded gradients in the compute dtype;
//! - post-backward: reshard, wait for the previous reduce-scatter and free its input, then
//!   the reduce-scatter input (world × the padded shards in the reduce dtype), the copy-in,
//!   the unsharded gradients freed, and the output: the unit's sharded gradients (added to
//!   and freed under accumulation). The root's post-backward comes last; the last
//!   reduce-scatter input is freed at the end of backward.
//!
//! ZeRO-3 walks the same units; its parameters are gathered and released per module call by
//! DeepSpeed's coordinator ([`super::ds_fetch`]: prefetch, max live parameters, reuse
//! distance), each gather a flat all-gather output (world × the shards, one buffer per
//! parameter when it gathers one) and a copy per parameter, all on the all-gather stream;
//! its gradients take DeepSpeed's path, not the unit's reduce-scatter. DDP adds the
//! reducer's buckets at construction (`bucket_cap_mb`, the first bucket 1 MiB, in reverse
//! parameter order); with `gradient_as_bucket_view` the gradients are views into them.
//! PyTorch's ZeRO-1 is DDP whose optimizer state exists for this rank's own parameters only
//! ([`torch_zero1_owned`]). DeepSpeed's ZeRO-1/2/3 optimizers (fp32 master partition, IPG
//! buckets, gradient partitions, each gradient's hook) are [`super::ds_zero`]'s; ZeRO-3's
//! parameters of at most `stage3_param_persistence_threshold` elements are whole on every
//! rank and outside the unit walk.

use super::Sim;
use super::ds_fetch::{Coordinator, Trace};
use super::ds_zero::DsZero;
use crate::model::ir::Graph;
use crate::plan::config::DType;
use crate::plan::distributed::{Distributed, Offload, Strategy, torch_zero1_owned};
use crate::plan::events::{Category, Phase};
use crate::plan::policy::{ParamPolicy, Shard};

/// DDP's first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`).
const DDP_FIRST_BUCKET: u64 = 1 << 20;

/// The per-rank simulation state of a strategy.
#[derive(Debug, Default)]
pub(super) struct DistSim {
    /// FSDP2 / ZeRO-3 unit walk.
    pub(super) units: bool,
    pub(super) world: u64,
    pub(super) strategy: Strategy,
    /// The parameters of each unit (blocks first; the root, everything else, last).
    unit_params: Vec<Vec<usize>>,
    /// dtype of the unsharded parameters and their gradients.
    pub(super) unsharded: Option<DType>,
    reduce: Option<DType>,
    pub(super) reshard: bool,
    /// Live unsharded parameter buffers per unit.
    live: Vec<Vec<u32>>,
    rs_pending: Option<u32>,
    /// FSDP2's `comm_ctx.all_gather_state`: in forward, a unit's all-gather output is kept
    /// after its copy-out until the next unit's `wait_for_unshard` (to overlap that copy-out
    /// with the next all-gather) or the root's post-forward.
    ag_state: Option<u32>,
    /// The sharded gradients of each unit (one flat reduce-scatter output).
    sharded_grad: Vec<Option<u32>>,
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
    ddp_buckets: Vec<(u32, u64)>,
    /// ZeRO-3: DeepSpeed's parameter coordinator, and each parameter's gathered buffer.
    pub(super) ds: Option<Coordinator>,
    ds_bufs: Vec<Option<u32>>,
}

/// ZeRO-3's module trace of one micro-step, a module being a node with parameters: the
/// forward in order, then the backward in reverse, a checkpointed block's recomputed
/// forward before its backward (as [`super::Sim::micro_step`] and `recompute_block` walk).
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

impl Sim<'_> {
    fn padded(&self, elems: u64) -> u64 {
        let w = self.dist.world;
        elems.div_ceil(w) * w
    }

    /// Bytes of the unsharded gradient of parameter `p` (FSDP2 / ZeRO-3).
    pub(super) fn unsharded_grad_bytes(&self, p: usize) -> u64 {
        let d = self.dist.unsharded.unwrap_or(DType::F32);
        self.g.params[p].elems * d.size()
    }

    /// `FSDPParamGroup.unshard` of unit `u` (nothing when it is unsharded already).
    pub(super) fn unshard(&mut self, u: usize) {
        if !self.dist.units
            || self.dist.ds.is_some()
            || u >= self.dist.live.len()
            || !self.dist.live[u].is_empty()
        {
            return;
        }
        let params = self.dist.unit_params[u].clone();
        if params.is_empty() {
            return;
        }
        let dt = self.dist.unsharded.unwrap_or(DType::F32);
        let elems: u64 = params
            .iter()
            .map(|&p| self.padded(self.g.params[p].elems))
            .sum();
        let storage = self.policy.state(params[0]).storage;
        // MixedPrecisionPolicy: each shard cast to the compute dtype before the copy-in.
        let cast = (dt != storage).then(|| {
            self.alloc(
                0,
                elems / self.dist.world * dt.size(),
                Category::Transient,
                1,
            )
        });
        // Allocated in the all-gather copy-in stream.
        let out = self.alloc(0, elems * dt.size(), Category::Communication, 1);
        self.on_side_stream(out);
        if let Some(c) = cast {
            self.release(c);
        }
        // `wait_for_unshard` in forward (implicit prefetch): the previous unit's all-gather
        // result is freed before this copy-out (`_fsdp_param_group.py` `wait_for_unshard`).
        let deferred = self.phase == Phase::Forward && self.dist.world > 1;
        if deferred && let Some(prev) = self.dist.ag_state.take() {
            self.release(prev);
        }
        let mut live = Vec::with_capacity(params.len());
        for &p in &params {
            live.push(self.alloc(
                0,
                self.g.params[p].elems * dt.size(),
                Category::Unsharded,
                1,
            ));
        }
        if deferred {
            self.dist.ag_state = Some(out);
        } else {
            self.release(out);
        }
        self.dist.live[u] = live;
    }

    /// The root's post-forward frees the last all-gather result kept in forward
    /// (`_fsdp_state.py` `_post_forward`: `all_gather_state = None`).
    pub(super) fn free_all_gather_state(&mut self) {
        if let Some(b) = self.dist.ag_state.take() {
            self.release(b);
        }
    }

    /// ZeRO-3, before node `n` (forward, recomputed forward or backward): DeepSpeed's
    /// `fetch_sub_module` for its parameters — the all-gather of those not available, then
    /// the prefetch.
    #[inline]
    pub(super) fn ds_fetch(&mut self, n: usize) {
        // Called for every node of every pass: without ZeRO-3 nothing to do, decided here.
        if self.dist.ds.is_some() {
            self.ds_fetch_params(n);
        }
    }

    #[inline(never)]
    fn ds_fetch_params(&mut self, n: usize) {
        let g = self.g;
        let params = &g.nodes[n].params;
        if params.is_empty() {
            return;
        }
        let Some(c) = self.dist.ds.as_mut() else {
            return;
        };
        let (now, ahead) = c.fetch(params);
        self.ds_gather(&now);
        self.ds_gather(&ahead);
    }

    /// ZeRO-3, after node `n`: `release_sub_module`.
    #[inline]
    pub(super) fn ds_release(&mut self, n: usize) {
        if self.dist.ds.is_some() {
            self.ds_release_params(n);
        }
    }

    #[inline(never)]
    fn ds_release_params(&mut self, n: usize) {
        let g = self.g;
        let params = &g.nodes[n].params;
        if params.is_empty() {
            return;
        }
        let Some(c) = self.dist.ds.as_mut() else {
            return;
        };
        for p in c.release(params) {
            if let Some(b) = self.dist.ds_bufs[p].take() {
                self.release(b);
            }
        }
    }

    /// ZeRO-3: `reset_step` at the start of a forward.
    pub(super) fn ds_reset(&mut self) {
        if let Some(c) = self.dist.ds.as_mut() {
            c.reset_step();
        }
    }

    /// ZeRO-3, the end of backward: what is still gathered is released.
    fn ds_release_all(&mut self) {
        let Some(c) = self.dist.ds.as_mut() else {
            return;
        };
        for p in c.release_all() {
            if let Some(b) = self.dist.ds_bufs[p].take() {
                self.release(b);
            }
        }
    }

    /// `all_gather_coalesced` of `params` (`partition_parameters.py`): one parameter
    /// gathers into its own padded buffer (`_all_gather_sequential`); several into one
    /// flat buffer of world × their shards, then each parameter's tensor is copied out
    /// (`torch.cat` in the handle's `wait`) and the flat buffer dies — all on the
    /// all-gather stream.
    fn ds_gather(&mut self, params: &[usize]) {
        if params.is_empty() {
            return;
        }
        let dt = self.dist.unsharded.unwrap_or(DType::F32);
        if let [p] = params {
            let b = self.alloc(
                0,
                self.padded(self.g.params[*p].elems) * dt.size(),
                Category::Unsharded,
                1,
            );
            self.on_side_stream(b);
            self.dist.ds_bufs[*p] = Some(b);
            return;
        }
        let elems: u64 = params
            .iter()
            .map(|&p| self.padded(self.g.params[p].elems))
            .sum();
        let flat = self.alloc(0, elems * dt.size(), Category::Communication, 1);
        self.on_side_stream(flat);
        for &p in params {
            let b = self.alloc(
                0,
                self.g.params[p].elems * dt.size(),
                Category::Unsharded,
                1,
            );
            self.on_side_stream(b);
            self.dist.ds_bufs[p] = Some(b);
        }
        self.release(flat);
    }

    pub(super) fn on_side_stream(&mut self, b: u32) {
        if let Some(buf) = self.buffers.get_mut(b as usize) {
            buf.side_stream = true;
        }
    }

    /// `FSDPParamGroup.reshard` of unit `u`.
    pub(super) fn reshard(&mut self, u: usize) {
        if u < self.dist.live.len() {
            for b in std::mem::take(&mut self.dist.live[u]) {
                self.release(b);
            }
        }
    }

    /// `FSDPParamGroup.post_backward` of unit `u`: reshard, reduce-scatter the gradients.
    pub(super) fn post_backward(&mut self, u: usize) {
        if !self.dist.units || u >= self.dist.live.len() {
            return;
        }
        self.reshard(u);
        if self.dist.zero.is_some() {
            // ZeRO-3: each gradient went to the IPG bucket when it was ready.
            return;
        }
        let params = self.dist.unit_params[u].clone();
        let with_grad: Vec<usize> = params
            .iter()
            .copied()
            .filter(|&p| self.param_grad[p].is_some())
            .collect();
        if with_grad.is_empty() {
            return;
        }
        if let Some(prev) = self.dist.rs_pending.take() {
            self.release(prev);
        }
        let rd = self.dist.reduce.unwrap_or(DType::F32);
        let elems: u64 = with_grad
            .iter()
            .map(|&p| self.padded(self.g.params[p].elems))
            .sum();
        let input = self.alloc(0, elems * rd.size(), Category::Communication, 1);
        for &p in &with_grad {
            if let Some(b) = self.param_grad[p].take() {
                self.release(b);
            }
        }
        let out = self.alloc(
            0,
            elems / self.dist.world * rd.size(),
            Category::Gradients,
            1,
        );
        if self.dist.sharded_grad[u].is_none() {
            self.dist.sharded_grad[u] = Some(out);
        } else {
            self.release(out);
        }
        self.dist.rs_pending = Some(input);
    }

    /// The end of backward: the root's post-backward, the last reduce-scatter waited for.
    pub(super) fn finish_backward(&mut self) {
        self.ds_epilogue();
        if !self.dist.units {
            return;
        }
        let root = self.dist.root();
        self.post_backward(root);
        self.ds_release_all();
        for u in 0..self.dist.live.len() {
            self.reshard(u);
        }
        if let Some(prev) = self.dist.rs_pending.take() {
            self.release(prev);
        }
    }

    /// `zero_grad(set_to_none=True)` of the sharded gradients.
    pub(super) fn zero_sharded_grads(&mut self) {
        for u in 0..self.dist.sharded_grad.len() {
            if let Some(b) = self.dist.sharded_grad[u].take() {
                self.release(b);
            }
        }
    }

    /// DDP's `_rebuild_buckets` in the second iteration's pre-forward (`reducer.cpp`
    /// `rebuild_buckets` → `initialize_buckets`): a new set of buckets (in gradient-ready
    /// order; the same sizes here) is allocated before the old set is dropped, so the old
    /// buckets' blocks stay cached in the reserved pool.
    pub(super) fn rebuild_ddp_buckets(&mut self) {
        let old = std::mem::take(&mut self.dist.ddp_buckets);
        for &(_, bytes) in &old {
            let b = self.alloc(0, bytes, Category::Communication, 1);
            self.dist.ddp_buckets.push((b, bytes));
        }
        for (b, _) in old {
            self.release(b);
        }
    }

    /// Buffers a strategy creates with the model: DDP's reducer buckets, DeepSpeed's
    /// optimizer buffers ([`super::ds_zero`]).
    pub(super) fn setup_buffers(&mut self) {
        let g = self.g;
        self.ds_setup();
        if self.dist.strategy.uses_ddp() {
            {
                let cap = self.cfg.distributed.bucket_cap_mb.saturating_mul(1 << 20);
                let mut limit = DDP_FIRST_BUCKET;
                let mut size = 0u64;
                for p in (0..g.params.len())
                    .rev()
                    .filter(|&p| self.policy.trainable(p))
                {
                    size += self.policy.bytes(p, g.params[p].elems);
                    if size >= limit {
                        let b = self.alloc(0, size, Category::Communication, 1);
                        self.dist.ddp_buckets.push((b, size));
                        size = 0;
                        limit = cap;
                    }
                }
                if size > 0 {
                    let b = self.alloc(0, size, Category::Communication, 1);
                    self.dist.ddp_buckets.push((b, size));
                }
            }
        }
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
