//! DeepSpeed 0.19.8's ZeRO optimizers on one rank: the model states they create and the
//! path a gradient takes, mirrored from `runtime/zero/stage_1_and_2.py`
//! (`DeepSpeedZeroOptimizer`, stages 1 and 2) and `runtime/zero/stage3.py`
//! (`DeepSpeedZeroOptimizer_Stage3`). With `bf16.enabled` (or none) and no
//! `data_types.grad_accum_dtype`, the gradient accumulation dtype is the model's
//! (`engine.py` `get_data_types`), so neither optimizer keeps fp32 gradients of its own
//! (`use_grad_accum_attribute` and the compact fp32 partition buffer are off).
//!
//! Stages 1/2, at `deepspeed.initialize`:
//! - the parameters are flattened into one buffer per group (`bit16_groups_flat`, the
//!   model's parameters become views of it: no second copy), padded to a multiple of
//!   2 × world; rank 0's partition is its first `padded / world` elements;
//! - `single_partition_of_fp32_groups`: an fp32 clone of this rank's partition (also
//!   under fp32 training), the optimizer's only parameter: its state (Adam's two fp32
//!   moments of the partition) is created lazily by the first step;
//! - with `offload_optimizer` the master partition and the state live on the CPU and the
//!   GPU keeps `temp_grad_buffer_for_gpu_offload` (the largest parameter, model dtype).
//!
//! Stages 1/2, each backward: the gradient hook's `setup_buckets` allocates the IPG
//! buffer(s) (`reduce_bucket_size` elements in the model dtype, a second with
//! `overlap_comm`) when the first gradient is ready. Stage 2 (and stage 1 with
//! `overlap_comm`) then copies each gradient into the bucket and drops autograd's tensor;
//! stage 1 without overlap keeps autograd's gradients until `reduce_gradients` after the
//! backward, which copies them into the bucket. A full bucket is reduced
//! (`reduce_ipg_grads`): `average_tensor` → `allreduce_and_scatter` → `allreduce_bucket`
//! flattens the bucket's gradient slices into a new tensor (`flatten`: the bucket's
//! elements, model dtype, freed once copied back: a backward-peak transient as large as
//! the bucket); then the gradients of the parameters in rank 0's partition are copied
//! into `grads_in_partition` (allocated at the first such copy: every parameter that
//! overlaps the partition, whole), the others dropped. The epilogue reduces the last
//! bucket and frees the IPG buffers; `grads_in_partition` lives until the step.
//!
//! Gradient accumulation: the engine's `allreduce_gradients` runs stage 2's epilogue after
//! every backward, stage 1's (`reduce_gradients`) only at the accumulation boundary. So
//! before the boundary stage 1 keeps the IPG buffer(s) `setup_buckets` allocated (its
//! `ready_for_gradients` stays set: the boundary backward reuses them) and every `.grad`,
//! into which the next micro-step's gradients are added in place; stage 2 keeps the
//! partition's gradients in `all_grad_tensors`.
//!
//! Stages 1/2, `step`: `flatten(averaged_gradients)` (the partition, model dtype), its fp32
//! copy (`.to(float32)`, none under fp32), `grads_in_partition` freed, the inner
//! optimizer's step on the fp32 partition, the copies freed.
//!
//! Stage 3, at `deepspeed.initialize`: the IPG bucket (`reduce_bucket_size`, model dtype),
//! the fp32 master partition (`fp32_partitioned_groups_flat`: a copy, fp32 models included —
//! the reuse test compares a `torch.device` with a string) and `grad_partitions_flat_buffer` (this rank's gradient partition,
//! model dtype), neither on the GPU with `offload_optimizer`. Each gradient is copied into
//! the bucket when ready (`__add_grad_to_ipg_bucket`) and autograd's tensor dropped; a
//! full bucket is reduce-scattered (`reduce_scatter_coalesced`: the bucket's gradients
//! padded to world × their partitions, one transient) into the flat gradient partition.
//! `step` (`_prepare_fp32_grad_for_sub_group`): `flatten(averaged_gradients)` cast to fp32
//! (the flat copy freed once cast; under fp32 it is the fp32 gradient), the inner step.
//!
//! With `overlap_comm` the reductions run on a stream of their own (stages 1/2
//! `reduction_stream`: `grads_in_partition`; stage 3 `reduce_and_partition_stream`: the
//! reduce-scatter's input), so those buffers come from the side streams' pool.

use super::state::Sim;
use crate::model::ir::Param;
use crate::plan::config::DType;
use crate::plan::events::Category;
use crate::plan::optimizer::state_bytes;

impl Sim<'_> {
    /// The buffers `deepspeed.initialize` leaves on the GPU besides the parameters.
    pub(super) fn ds_setup(&mut self) {
        let Some(z) = self.dist.zero.as_ref() else {
            return;
        };
        let (stage, dt, part, offload) = (z.stage, z.dtype, z.partition, z.offload);
        let (ipg, bucket, largest) = (z.ipg_count, z.bucket, z.largest);
        if stage == 3 {
            for _ in 0..ipg {
                self.alloc(
                    0,
                    bucket.saturating_mul(dt.size()),
                    Category::Communication,
                    1,
                );
            }
            if !offload {
                // Always a copy, fp32 models included: `_create_fp32_partitions` reuses the
                // partition only when `partition.device == self.device`, and `self.device` is
                // the string `current_device_name()` ("cuda:0"), which a `torch.device` never
                // equals — `.to(...).clone()` runs (DeepSpeed 0.19.8 stage3.py:333, :1162).
                // Measured: fp32 ZeRO-3 rows held exactly one more fp32 partition (TinyLlama
                // ×4: 1.03 GiB; Qwen2.5-0.5B-L4 ×4: 0.18 GiB; GPT-2 ×8: 0.06 GiB).
                self.alloc(0, part * 4, Category::OptimizerState, 1);
                self.alloc(0, part * dt.size(), Category::Gradients, 1);
            }
        } else if offload {
            self.alloc(0, largest * dt.size(), Category::Communication, 1);
        } else {
            self.alloc(0, part * 4, Category::OptimizerState, 1);
        }
    }

    /// The gradient hook of parameter `p` (`grad_handling_hook` / ZeRO-3's
    /// `reduce_partition_and_remove_grads`), once its gradient of this backward is complete.
    pub(super) fn ds_grad_ready(&mut self, p: usize) {
        let Some(z) = self.dist.zero.as_ref() else {
            return;
        };
        if z.stage < 3 && z.ipg.is_empty() && z.contiguous {
            // `setup_buckets`.
            let (n, bytes) = (z.ipg_count, z.bucket.saturating_mul(z.dtype.size()));
            let bufs: Vec<u32> = (0..n)
                .map(|_| self.alloc(0, bytes, Category::Communication, 1))
                .collect();
            if let Some(z) = self.dist.zero.as_mut() {
                z.ipg = bufs;
            }
        }
        let boundary = self.ds_boundary();
        let Some(z) = self.dist.zero.as_ref() else {
            return;
        };
        if z.per_param && (z.stage >= 2 || boundary) {
            self.ds_bucket_add(p);
        }
    }

    /// Whether this micro-step ends the accumulation (DeepSpeed reduces stage 1 then).
    fn ds_boundary(&self) -> bool {
        u64::from(self.micro) + 1 >= self.cfg.accum.clamp(1, 2)
    }

    /// `reduce_independent_p_g_buckets_and_remove_grads` / `__add_grad_to_ipg_bucket`:
    /// the bucket reduced first when `p` does not fit, then `p`'s gradient copied into it
    /// and autograd's tensor dropped.
    fn ds_bucket_add(&mut self, p: usize) {
        let elems = self.g.params[p].elems;
        let Some(z) = self.dist.zero.as_ref() else {
            return;
        };
        // A gradient larger than the bucket, and every gradient without
        // `contiguous_gradients`, stays autograd's tensor until the bucket is reduced.
        let copied = z.contiguous && elems <= z.bucket;
        if z.bucket_used + elems > z.bucket {
            self.ds_reduce_bucket();
        }
        if copied && let Some(b) = self.param_grad[p].take() {
            self.release(b);
        }
        if let Some(z) = self.dist.zero.as_mut() {
            z.bucket_params.push(p);
            z.bucket_used += elems;
        }
    }

    /// `reduce_ipg_grads` (stages 1/2: the partition's gradients into
    /// `grads_in_partition`) / `__reduce_and_partition_ipg_grads` (stage 3: the
    /// reduce-scatter's padded input, transient).
    fn ds_reduce_bucket(&mut self) {
        let Some(z) = self.dist.zero.as_mut() else {
            return;
        };
        let params = std::mem::take(&mut z.bucket_params);
        z.bucket_used = 0;
        if params.is_empty() {
            return;
        }
        let (stage, dt, world, contiguous) = (z.stage, z.dtype, z.world, z.contiguous);
        let side = z.overlap;
        if stage == 3 {
            let padded: u64 = params
                .iter()
                .map(|&p| self.g.params[p].elems.div_ceil(world) * world)
                .sum();
            // On `reduce_and_partition_stream` (its own stream with `overlap_comm`,
            // stage3.py:340-341): the side streams' pool.
            let b = self.alloc(0, padded * dt.size(), Category::Communication, 1);
            if side {
                self.on_side_stream(b);
            }
            self.release(b);
            for &p in &params {
                if let Some(b) = self.param_grad[p].take() {
                    self.release(b);
                }
            }
            return;
        }
        // The reduction's flat copies (`allreduce_bucket`), on `reduction_stream` with
        // `overlap_comm`.
        for elems in z.flat_chunks(&params, &self.g.params) {
            let b = self.alloc(0, elems * dt.size(), Category::Communication, 1);
            if side {
                self.on_side_stream(b);
            }
            self.release(b);
        }
        let Some(z) = self.dist.zero.as_ref() else {
            return;
        };
        if !contiguous {
            // The reduced gradients stay autograd's: the partition's are kept for the step
            // (`averaged_gradients`), the others dropped.
            let inside: Vec<bool> = params
                .iter()
                .map(|&p| z.in_partition.get(p).copied().unwrap_or(false))
                .collect();
            for (&p, inside) in params.iter().zip(inside) {
                if let Some(b) = self.param_grad[p].take() {
                    if inside {
                        if let Some(z) = self.dist.zero.as_mut() {
                            z.held.push(b);
                        }
                    } else {
                        self.release(b);
                    }
                }
            }
            return;
        }
        // Offloaded: the partition's gradients go to the CPU's fp32 buffer.
        let needs = !z.offload
            && z.grads_in_partition.is_none()
            && params
                .iter()
                .any(|&p| z.in_partition.get(p).copied().unwrap_or(false));
        if needs {
            let bytes = z.in_partition_elems * dt.size();
            // Copied under `reduction_stream` with `overlap_comm` (stage_1_and_2.py:2239-2249).
            let b = self.alloc(0, bytes, Category::Gradients, 1);
            if side {
                self.on_side_stream(b);
            }
            if let Some(z) = self.dist.zero.as_mut() {
                z.grads_in_partition = Some(b);
            }
        }
        // An oversized gradient reduced in place: copied into the partition or dropped.
        for &p in &params {
            if let Some(b) = self.param_grad[p].take() {
                self.release(b);
            }
        }
    }

    /// The end of a backward (`independent_gradient_partition_epilogue`). Before the
    /// accumulation boundary stage 1 runs none (the IPG buffers and `.grad` stay). Stage 1
    /// without overlap reduces every gradient at the boundary (`reduce_gradients`);
    /// the last bucket is reduced; the IPG buffers are freed (`_release_ipg_buffers`) and no
    /// `.grad` is left (`_clear_param_grad_only`). Before the boundary `all_grad_tensors`
    /// keeps the partition's gradients (`get_all_grad_tensors`: references, not copies) and
    /// the others are dropped; at the boundary the new ones are added into those kept and
    /// freed.
    pub(super) fn ds_epilogue(&mut self) {
        let Some(z) = self.dist.zero.as_ref() else {
            return;
        };
        if z.stage == 3 {
            self.ds_reduce_bucket();
            return;
        }
        let boundary = self.ds_boundary();
        if z.stage == 1 && !boundary {
            // The engine's `allreduce_gradients` reduces stage 1 only at the boundary and
            // runs no epilogue before it: the IPG buffers and every `.grad` stay, the next
            // micro-step's gradients are added into them in place.
            return;
        }
        if boundary && !z.per_param {
            let order: Vec<usize> = (0..self.g.params.len())
                .filter(|&p| self.param_grad[p].is_some())
                .collect();
            for p in order {
                self.ds_bucket_add(p);
            }
        }
        self.ds_reduce_bucket();
        let mut drop = Vec::new();
        if let Some(z) = self.dist.zero.as_mut() {
            drop.append(&mut z.ipg);
        }
        // Gradients no bucket took (none: stage 2 takes each when ready, stage 1 at the
        // boundary).
        let in_partition: Vec<bool> = self
            .dist
            .zero
            .as_ref()
            .map(|z| z.in_partition.clone())
            .unwrap_or_default();
        for p in 0..self.param_grad.len() {
            if let Some(b) = self.param_grad[p].take() {
                let keep = !boundary && in_partition.get(p).copied().unwrap_or(false);
                match self.dist.zero.as_mut() {
                    Some(z) if keep => z.carried.push(b),
                    _ => drop.push(b),
                }
            }
        }
        if let Some(z) = self.dist.zero.as_mut() {
            if !boundary {
                z.carried.extend(z.grads_in_partition.take());
                let held = std::mem::take(&mut z.held);
                z.carried.extend(held);
            } else if !z.carried.is_empty() {
                drop.extend(z.grads_in_partition.take());
                drop.append(&mut z.held);
                z.held = std::mem::take(&mut z.carried);
            }
        }
        for b in drop {
            self.release(b);
        }
    }

    /// Before the inner optimizer's step: the flattened gradient partition cast to fp32
    /// (returned, freed after the step). `flatten(averaged_gradients)` is freed once cast
    /// (stages 1/2: `del flat_grad_partition`, stage_1_and_2.py:3119; stage 3: an
    /// intermediate of `_prepare_fp32_grad_for_sub_group`); under fp32 it is the fp32
    /// gradient. Stages 1/2 then free the partition's gradients
    /// (`free_grad_in_param_list`, `averaged_gradients[i] = None`): `grads_in_partition`, or
    /// autograd's tensors without `contiguous_gradients`.
    pub(super) fn ds_step_grads(&mut self) -> Vec<u32> {
        let Some(z) = self.dist.zero.as_ref() else {
            return Vec::new();
        };
        let (dt, part) = (z.dtype, z.partition);
        let mut out = Vec::new();
        if z.offload {
            return out;
        }
        let flat = self.alloc(0, part * dt.size(), Category::Transient, 1);
        if dt != DType::F32 {
            let fp32 = self.alloc(0, part * 4, Category::Transient, 1);
            self.release(flat);
            out.push(fp32);
        } else {
            out.push(flat);
        }
        let mut drop = Vec::new();
        if let Some(z) = self.dist.zero.as_mut() {
            drop.extend(z.grads_in_partition.take());
            drop.append(&mut z.held);
        }
        for b in drop {
            self.release(b);
        }
        out
    }

    /// The inner optimizer's state of the flat fp32 partition (one vector parameter).
    pub(super) fn ds_state(&mut self, elems: u64) {
        let opt = self.cfg.optimizer;
        let p = Param {
            elems,
            matrix: None,
        };
        for &bytes in state_bytes(opt, &p, DType::F32).parts() {
            self.alloc(0, bytes, Category::OptimizerState, 1);
        }
    }
}
