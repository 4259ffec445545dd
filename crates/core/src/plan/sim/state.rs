//! The simulation state of one event generation (`Sim`): what each tensor's buffer is,
//! reference counts, what each node saved, gradients, and the buffers' allocation and
//! release; the files beside it walk a step over it and `mod.rs` drives the step.

use std::ops::Range;

use super::blocks::Blocks;
use super::dist_state::DistSim;
use super::merged::Merged;
use super::repeat_state::Repeat;
use crate::model::ir::{Graph, Node};
use crate::plan::allocator::{ExpandableBound, round_size};
use crate::plan::config::{DType, LoopShape, Precision, TrainConfig};
use crate::plan::events::{Buffer, Category, Event, Phase};
use crate::plan::policy::ParamPolicy;
use crate::plan::rules::{Extra, Rule};

/// The simulation state of one event generation: the graph, what each tensor's buffer
/// is, reference counts, what each node saved, gradients and the parameter policy.
pub(super) struct Sim<'g> {
    pub(super) g: &'g Graph,
    pub(super) prec: Precision,
    pub(super) cfg: TrainConfig,
    pub(super) policy: &'g ParamPolicy,
    pub(super) buffers: Vec<Buffer>,
    pub(super) events: Vec<Event>,
    pub(super) refs: Vec<u32>,
    pub(super) phase: Phase,
    pub(super) micro: u16,
    pub(super) node: u32,
    /// Tensor → buffer currently holding it.
    pub(super) tbuf: Vec<Option<u32>>,
    pub(super) dtypes: &'g [DType],
    pub(super) rules: &'g [Rule],
    pub(super) consumers: &'g [u32],
    pub(super) requires_grad: &'g [bool],
    /// Buffers each node keeps for its backward: `saved_bufs[saved[n]]`. The lists of one
    /// micro-step are appended to `saved_bufs`, which is cleared when it ends.
    pub(super) saved: Vec<Range<usize>>,
    pub(super) saved_bufs: Vec<u32>,
    /// Reused per-node scratch: the buffers of a node's inputs, its temporaries.
    pub(super) input_bufs: Vec<Option<u32>>,
    pub(super) temps: Vec<u32>,
    /// The current op's extras by index, when its rule lists them in Python's order
    /// ([`crate::plan::rules::Rule::order`]), for the releases after its output.
    pub(super) ordered: [Option<u32>; crate::plan::rules::ORDERED_EXTRAS],
    /// Casts of frozen weights made by the current op (not in the autocast cache).
    pub(super) uncached: Vec<u32>,
    /// Tensor → gradient buffer.
    pub(super) gbuf: Vec<Option<u32>>,
    /// Parameter → gradient buffer.
    pub(super) param_grad: Vec<Option<u32>>,
    /// Parameter → the number of ops that use it (2 for tied embeddings).
    pub(super) param_uses: Vec<u32>,
    /// A shared parameter's gradient contributions seen in this backward, and their sum so
    /// far (autograd's `InputBuffer` of its `AccumulateGrad` node).
    pub(super) param_seen: Vec<u32>,
    pub(super) param_pending: Vec<Option<u32>>,
    /// Whether the pending sum may be added into in place (see `shared_param_grad`).
    pub(super) param_pending_inplace: Vec<bool>,
    /// Parameter → autocast copy in this forward.
    pub(super) param_cast: Vec<Option<u32>>,
    /// References held until autocast exits (its weight cache).
    pub(super) cache_refs: Vec<u32>,
    /// References held by Python until the micro-step ends (`del out, loss, x, y`).
    pub(super) pinned: Vec<u32>,
    /// References held by the model's output object (the logits, Hugging Face's
    /// `past_key_values`) in a trainer loop, released once the loss is taken
    /// (`loss = model(**batch).loss`); a plain loop keeps them in `pinned`.
    pub(super) output_refs: Vec<u32>,
    pub(super) ckpt: bool,
    /// The blocks checkpointing recomputes ([`Blocks`]).
    pub(super) blocks: Blocks,
    /// Scratch consumer counts of a recomputed block (all zeros between recomputations).
    pub(super) ckpt_consumers: Vec<u32>,
    pub(super) block_inputs: Vec<Vec<u32>>,
    /// Reentrant checkpointing (`CheckpointFunction`): what its backward holds through the
    /// block's inner backward (the recomputed outputs and their incoming gradients).
    pub(super) reentrant: bool,
    pub(super) reentrant_held: Vec<u32>,
    /// Gradients of `torch.chunk` outputs waiting for their split node: (input tensor, buffer).
    pub(super) chunk_grads: Vec<(usize, u32)>,
    /// Embedding lookups whose output `enable_input_require_grads` makes require grad.
    pub(super) input_grad_nodes: Vec<usize>,
    /// An evaluation step with merged adapters: each node's role (empty otherwise).
    pub(super) merged: Vec<Merged>,
    /// The loss's input (logits), held by the training loop's `out` variable.
    pub(super) model_output: Option<usize>,
    /// Set while recomputing a checkpointed block.
    pub(super) recomputing: bool,
    /// Where each node's holds start in the graph's (sorted) holds, one entry per node and
    /// one past the last: [`Sim::holds_at`] in constant time (built with the annotations,
    /// once per graph and setting).
    pub(super) hold_start: &'g [u32],
    /// The multi-GPU strategy's per-rank state (inactive on one GPU).
    pub(super) dist: DistSim,
    /// The warm-up's micro-steps, which the measured step repeats ([`Repeat`]).
    pub(super) repeat: Repeat,
    /// Bytes live at batch 1, each buffer rounded as the caching allocator rounds it: at
    /// most what the allocator has allocated at that point of a replay at batch 1.
    pub(super) live1: u64,
    /// The highest `live1` at an allocation since it was last set (a recorded micro-step's
    /// peak, `repeat.rs`).
    pub(super) live1_peak: u64,
    /// [`super::generate_unless_above`]'s bound: the generation stops once `live1` passes it.
    pub(super) stop_above: u64,
    pub(super) stopped: bool,
    /// The expandable-segments bound of the events at batch 1, fed with the same rounded
    /// sizes as `live1` at every allocation and free (`Events::bound_at_one`); `None` when
    /// not asked.
    pub(super) bound1: Option<ExpandableBound>,
}

/// `Event::node` outside any node (setup, zero_grad, the optimizer step).
pub(super) const NO_NODE: u32 = u32::MAX;

impl<'g> Sim<'g> {
    /// A new buffer of `size1` bytes at batch 1 in the running figures: `live1` (the
    /// generation stops once it passes `stop_above`), its peak, the expandable bound.
    #[inline]
    pub(super) fn count_alloc1(&mut self, size1: u64) {
        self.live1 = self.live1.saturating_add(size1);
        if let Some(bound) = &mut self.bound1 {
            bound.malloc_rounded(size1);
        }
        if self.live1 > self.stop_above {
            self.stopped = true;
        }
        self.live1_peak = self.live1_peak.max(self.live1);
    }

    /// A freed buffer of `size1` bytes at batch 1 in the running figures.
    #[inline]
    pub(super) fn count_free1(&mut self, size1: u64) {
        self.live1 = self.live1.saturating_sub(size1);
        if let Some(bound) = &mut self.bound1 {
            bound.free_rounded(size1);
        }
    }

    pub(super) fn new_buffer(&mut self, per_sample: u64, fixed: u64, category: Category) -> u32 {
        self.count_alloc1(size_at_one(per_sample, fixed));
        self.buffers.push(Buffer {
            per_sample,
            fixed,
            category,
            side_stream: false,
        });
        self.refs.push(0);
        let id = (self.buffers.len() - 1) as u32;
        self.events.push(Event {
            buffer: id,
            alloc: true,
            phase: self.phase,
            micro: self.micro,
            node: self.node,
        });
        id
    }

    /// The tensors held until node `n` has run (its entries of [`Graph::holds`]).
    #[inline]
    pub(super) fn holds_at(&self, n: usize) -> &'g [crate::model::ir::Hold] {
        let g: &'g Graph = self.g;
        match (self.hold_start.get(n), self.hold_start.get(n + 1)) {
            (Some(&a), Some(&b)) => g.holds.get(a as usize..b as usize).unwrap_or_default(),
            _ => &[],
        }
    }

    pub(super) fn alloc(
        &mut self,
        per_sample: u64,
        fixed: u64,
        category: Category,
        refs: u32,
    ) -> u32 {
        let id = self.new_buffer(per_sample, fixed, category);
        self.refs[id as usize] = refs;
        id
    }

    pub(super) fn free(&mut self, id: u32) {
        if let Some(b) = self.buffers.get(id as usize) {
            self.count_free1(size_at_one(b.per_sample, b.fixed));
        }
        self.events.push(Event {
            buffer: id,
            alloc: false,
            phase: self.phase,
            micro: self.micro,
            node: self.node,
        });
    }

    pub(super) fn retain(&mut self, id: u32) {
        self.refs[id as usize] += 1;
    }

    pub(super) fn release(&mut self, id: u32) {
        let r = &mut self.refs[id as usize];
        if *r == 0 {
            return;
        }
        *r -= 1;
        if *r == 0 {
            self.free(id);
        }
    }

    /// Whether autograd keeps extra `e` of the current node for backward: not a temporary,
    /// the node saves at all, and, for a tensor only the parameters' gradient reads, some
    /// parameter of the node trains.
    pub(super) fn keeps(&self, e: &Extra, keep_saves: bool) -> bool {
        !e.transient
            && keep_saves
            && (!e.for_params
                || self
                    .g
                    .nodes
                    .get(self.node as usize)
                    .is_some_and(|n| self.trains(n)))
    }

    /// Whether some parameter of `node` trains (its weight gradient is computed).
    pub(super) fn trains(&self, node: &Node) -> bool {
        node.params.iter().any(|&p| self.policy.trainable(p))
    }

    /// Allocates one extra of a rule: a temporary (returned for the caller to release), or a
    /// tensor saved for backward (kept in `saved_bufs`). `None` for an empty extra.
    pub(super) fn extra_buffer(&mut self, e: &Extra, keep_saves: bool) -> Option<u32> {
        let ps = e.per_sample * e.dtype.size();
        let fx = e.fixed * e.dtype.size();
        if ps == 0 && fx == 0 {
            return None;
        }
        if !self.keeps(e, keep_saves) {
            Some(self.alloc(ps, fx, Category::Transient, 1))
        } else {
            let b = self.alloc(ps, fx, Category::Activations, 1);
            self.saved_bufs.push(b);
            Some(b)
        }
    }

    /// A reference held by the model's output object (see [`LoopShape`]). In a plain loop it
    /// is released with the batch at the end of the micro-step (`del out, loss, x, y`).
    pub(super) fn hold_in_output(&mut self, b: u32) {
        self.retain(b);
        match self.cfg.loop_shape {
            LoopShape::Plain => self.pinned.push(b),
            LoopShape::Trainer | LoopShape::Lightning => self.output_refs.push(b),
        }
    }

    pub(super) fn tensor_bytes(&self, t: usize, d: DType) -> (u64, u64) {
        let ts = &self.g.tensors[t];
        (ts.per_sample * d.size(), ts.fixed * d.size())
    }

    /// A kernel workspace (bytes per sample, fixed bytes): taken and given back at once.
    pub(super) fn workspace(&mut self, (per_sample, fixed): (u64, u64)) {
        if per_sample > 0 || fixed > 0 {
            let b = self.alloc(per_sample, fixed, Category::Transient, 1);
            self.release(b);
        }
    }
}

/// A buffer's bytes at batch 1 as the caching allocator rounds them.
pub(super) fn size_at_one(per_sample: u64, fixed: u64) -> u64 {
    round_size(per_sample.saturating_add(fixed))
}
