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

use super::state::Sim;
use crate::plan::config::DType;
use crate::plan::events::{Category, Phase};

/// DDP's first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`).
const DDP_FIRST_BUCKET: u64 = 1 << 20;

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
