//! One rank's DeepSpeed ZeRO optimizer as data (`DsZero`): its stage and dtype, the flat
//! partition, the IPG buckets and the gradients they hold; the path a gradient takes through
//! it is `ds_zero.rs`'s.

use crate::model::ir::{Graph, Param};
use crate::plan::config::DType;
use crate::plan::distributed::{Distributed, Offload};
use crate::plan::policy::ParamPolicy;

/// `nccl_start_alignment_factor` (stage_1_and_2.py): the flat buffer is padded to a
/// multiple of this × world.
const NCCL_ALIGNMENT: u64 = 2;

/// One rank's DeepSpeed ZeRO optimizer.
#[derive(Debug)]
pub(super) struct DsZero {
    pub(super) stage: u8,
    /// The model's dtype: parameters, gradients, IPG buckets.
    pub(super) dtype: DType,
    /// Elements of this rank's flat partition (fp32 master, optimizer state).
    pub(super) partition: u64,
    /// Stages 1/2: whether each parameter overlaps rank 0's partition.
    pub(super) in_partition: Vec<bool>,
    /// Stages 1/2: each parameter's offset in the flat buffer (`bit16_groups_flat`).
    pub(super) offset: Vec<u64>,
    /// Stages 1/2: elements of `grads_in_partition`.
    pub(super) in_partition_elems: u64,
    /// `reduce_bucket_size` (elements) and the IPG buffers per bucket.
    pub(super) bucket: u64,
    pub(super) ipg_count: u64,
    pub(super) contiguous: bool,
    /// Gradients go to the bucket as each is ready (stage 2, `overlap_comm`, stage 3).
    pub(super) per_param: bool,
    /// `overlap_comm`: the reduction runs on its own stream (stages 1/2 `reduction_stream`,
    /// stage 3 `reduce_and_partition_stream`), whose allocations come from their own pool.
    pub(super) overlap: bool,
    pub(super) offload: bool,
    pub(super) world: u64,
    /// The largest parameter (elements): the offload staging buffer.
    pub(super) largest: u64,
    /// Live IPG buffers (stages 1/2: per backward).
    pub(super) ipg: Vec<u32>,
    /// Parameters in the bucket and their elements.
    pub(super) bucket_params: Vec<usize>,
    pub(super) bucket_used: u64,
    pub(super) grads_in_partition: Option<u32>,
    /// Without `contiguous_gradients`: autograd's gradients of the partition's parameters,
    /// held by `averaged_gradients` until the step.
    pub(super) held: Vec<u32>,
    /// Before the accumulation boundary: the partition's gradients kept by
    /// `all_grad_tensors` for the next micro-step to add into.
    pub(super) carried: Vec<u32>,
}

impl DsZero {
    /// DeepSpeed's optimizer for `d`, or `None` when `d` is not a DeepSpeed stage.
    pub(super) fn new(g: &Graph, d: &Distributed, policy: &ParamPolicy) -> Option<DsZero> {
        if !d.strategy.is_deepspeed() || policy.is_empty() {
            return None;
        }
        let world = d.world().max(1);
        let trainable: Vec<usize> = (0..g.params.len())
            .filter(|&p| policy.trainable(p))
            .collect();
        let stage = d.strategy.zero_stage();
        let mut flat_offset = vec![0u64; g.params.len()];
        let (partition, in_partition, in_partition_elems) = if stage == 3 {
            // `partition_numel()` of every parameter: ceil(numel / world).
            let part = trainable
                .iter()
                .map(|&p| g.params[p].elems.div_ceil(world))
                .sum();
            (part, Vec::new(), 0)
        } else {
            let total: u64 = trainable.iter().map(|&p| g.params[p].elems).sum();
            let align = NCCL_ALIGNMENT * world;
            let part = total.div_ceil(align) * align / world;
            let mut inside = vec![false; g.params.len()];
            let mut offset = 0u64;
            let mut elems = 0u64;
            for &p in &trainable {
                flat_offset[p] = offset;
                if offset < part {
                    inside[p] = true;
                    elems += g.params[p].elems;
                }
                offset += g.params[p].elems;
            }
            (part, inside, elems)
        };
        Some(DsZero {
            stage,
            dtype: policy.state(0).storage,
            partition,
            in_partition,
            offset: flat_offset,
            in_partition_elems,
            bucket: d.zero_bucket_elems,
            ipg_count: d.ipg_buffers(),
            contiguous: d.contiguous_gradients,
            per_param: stage >= 2 || d.overlap_comm_effective(),
            overlap: d.overlap_comm_effective(),
            offload: d.offload != Offload::None,
            world,
            largest: trainable
                .iter()
                .map(|&p| g.params[p].elems)
                .max()
                .unwrap_or(0),
            ipg: Vec::new(),
            bucket_params: Vec::new(),
            bucket_used: 0,
            grads_in_partition: None,
            held: Vec::new(),
            carried: Vec::new(),
        })
    }

    /// Stages 1/2: the elements of each flat copy `allreduce_bucket` makes (`flatten`, in
    /// the model dtype, freed before the next) when the bucket of `params` is reduced.
    /// With `contiguous_gradients`, `average_tensor` (`reduce_scatter`, the default, and
    /// `use_multi_rank_bucket_allreduce`, the default) slices each gradient at the
    /// partitions' boundaries of the flat buffer, merging consecutive slices of one
    /// partition, and `allreduce_and_scatter` flattens the slices gathered until they
    /// exceed `reduce_bucket_size`, then the rest. Without, `buffered_reduce_fallback`'s
    /// `allreduce_no_retain` flattens the bucket's gradients at once (its buffer size is the
    /// bucket's element count).
    pub(super) fn flat_chunks(&self, params: &[usize], all: &[Param]) -> Vec<u64> {
        let elems = |p: usize| all.get(p).map_or(0, |x| x.elems);
        if !self.contiguous {
            let total: u64 = params.iter().map(|&p| elems(p)).sum();
            return if total > 0 { vec![total] } else { Vec::new() };
        }
        let part = self.partition.max(1);
        // (partition, elements) of each slice, consecutive ones of a partition merged.
        let mut slices: Vec<(u64, u64)> = Vec::new();
        for &p in params {
            let start = self.offset.get(p).copied().unwrap_or(0);
            let end = start + elems(p);
            let mut pos = start;
            while pos < end {
                let id = pos / part;
                let next = ((id + 1) * part).min(end);
                match slices.last_mut() {
                    Some((last, n)) if *last == id => *n += next - pos,
                    _ => slices.push((id, next - pos)),
                }
                pos = next;
            }
        }
        let mut chunks = Vec::new();
        let mut numel = 0u64;
        for (_, n) in slices {
            numel += n;
            if numel > self.bucket {
                chunks.push(numel);
                numel = 0;
            }
        }
        if numel > 0 {
            chunks.push(numel);
        }
        chunks
    }

    /// Elements of the flat fp32 partition the inner optimizer steps (its only parameter),
    /// when the state lives on this GPU.
    pub(super) fn state_partition(&self) -> Option<u64> {
        (!self.offload).then_some(self.partition)
    }
}
