//! The simulator: turns a graph, a training config and a parameter-state policy into the
//! allocation events of training steps, the way PyTorch autograd performs them (see
//! DESIGN.md): model creation, one warm-up step that creates the optimizer state, and the
//! measured steady-state step.
//!
//! - this file: the simulation state, buffers and their reference counts, one training
//!   step (zero_grad, micro-steps, optimizer step) and [`generate`];
//! - [`autograd`]: the forward and backward walk of one micro-step, driven by the op
//!   rules of [`super::rules`];
//! - [`checkpoint`]: activation checkpointing (what a checkpoint keeps, recomputation);
//! - [`optimizer_step`]: the optimizer's state and temporaries, from [`super::optimizer`].

mod autograd;
mod checkpoint;
mod dist;
mod ds_fetch;
mod ds_zero;
mod eval_step;
mod optimizer_step;

use std::ops::Range;

use super::allocator::round_size;
use super::config::{DType, LoopShape, Precision, TrainConfig};
use super::events::{Buffer, Category, Constants, Event, Events, Phase};
use super::policy::ParamPolicy;
use super::rules::{Extra, Rule, backward_rule, rule};
use super::step_kind::StepKind;
use crate::model::ir::{Elem, Graph};

/// The simulation state of one event generation: the graph, what each tensor's buffer
/// is, reference counts, what each node saved, gradients and the parameter policy.
struct Sim<'g> {
    g: &'g Graph,
    prec: Precision,
    cfg: TrainConfig,
    policy: &'g ParamPolicy,
    buffers: Vec<Buffer>,
    events: Vec<Event>,
    refs: Vec<u32>,
    phase: Phase,
    micro: u16,
    node: u32,
    /// Tensor → buffer currently holding it.
    tbuf: Vec<Option<u32>>,
    dtypes: &'g [DType],
    rules: &'g [Rule],
    consumers: &'g [u32],
    requires_grad: &'g [bool],
    /// Buffers each node keeps for its backward: `saved_bufs[saved[n]]`. The lists of one
    /// micro-step are appended to `saved_bufs`, which is cleared when it ends.
    saved: Vec<Range<usize>>,
    saved_bufs: Vec<u32>,
    /// Reused per-node scratch: the buffers of a node's inputs, its temporaries.
    input_bufs: Vec<Option<u32>>,
    temps: Vec<u32>,
    /// Casts of frozen weights made by the current op (not in the autocast cache).
    uncached: Vec<u32>,
    /// Tensor → gradient buffer.
    gbuf: Vec<Option<u32>>,
    /// Parameter → gradient buffer.
    param_grad: Vec<Option<u32>>,
    /// Parameter → the number of ops that use it (2 for tied embeddings).
    param_uses: Vec<u32>,
    /// A shared parameter's gradient contributions seen in this backward, and their sum so
    /// far (autograd's `InputBuffer` of its `AccumulateGrad` node).
    param_seen: Vec<u32>,
    param_pending: Vec<Option<u32>>,
    /// Whether the pending sum may be added into in place (see `shared_param_grad`).
    param_pending_inplace: Vec<bool>,
    /// Parameter → autocast copy in this forward.
    param_cast: Vec<Option<u32>>,
    /// References held until autocast exits (its weight cache).
    cache_refs: Vec<u32>,
    /// References held by Python until the micro-step ends (`del out, loss, x, y`).
    pinned: Vec<u32>,
    /// References held by the model's output object (the logits, Hugging Face's
    /// `past_key_values`) in a trainer loop, released once the loss is taken
    /// (`loss = model(**batch).loss`); a plain loop keeps them in `pinned`.
    output_refs: Vec<u32>,
    ckpt: bool,
    /// The blocks checkpointing recomputes ([`checkpoint::Blocks`]).
    blocks: checkpoint::Blocks,
    /// Scratch consumer counts of a recomputed block (all zeros between recomputations).
    ckpt_consumers: Vec<u32>,
    block_inputs: Vec<Vec<u32>>,
    /// Reentrant checkpointing (`CheckpointFunction`): what its backward holds through the
    /// block's inner backward (the recomputed outputs and their incoming gradients).
    reentrant: bool,
    reentrant_held: Vec<u32>,
    /// Gradients of `torch.chunk` outputs waiting for their split node: (input tensor, buffer).
    chunk_grads: Vec<(usize, u32)>,
    /// Embedding lookups whose output `enable_input_require_grads` makes require grad.
    input_grad_nodes: Vec<usize>,
    /// An evaluation step with merged adapters: each node's role (empty otherwise).
    merged: Vec<eval_step::Merged>,
    /// The loss's input (logits), held by the training loop's `out` variable.
    model_output: Option<usize>,
    /// Set while recomputing a checkpointed block.
    recomputing: bool,
    /// The multi-GPU strategy's per-rank state (inactive on one GPU).
    dist: dist::DistSim,
    /// Bytes live at batch 1, each buffer rounded as the caching allocator rounds it: at
    /// most what the allocator has allocated at that point of a replay at batch 1.
    live1: u64,
    /// [`generate_unless_above`]'s bound: the generation stops once `live1` passes it.
    stop_above: u64,
    stopped: bool,
}

/// `Event::node` outside any node (setup, zero_grad, the optimizer step).
const NO_NODE: u32 = u32::MAX;

impl<'g> Sim<'g> {
    fn new_buffer(&mut self, per_sample: u64, fixed: u64, category: Category) -> u32 {
        self.live1 = self.live1.saturating_add(size_at_one(per_sample, fixed));
        if self.live1 > self.stop_above {
            self.stopped = true;
        }
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

    fn alloc(&mut self, per_sample: u64, fixed: u64, category: Category, refs: u32) -> u32 {
        let id = self.new_buffer(per_sample, fixed, category);
        self.refs[id as usize] = refs;
        id
    }

    fn free(&mut self, id: u32) {
        if let Some(b) = self.buffers.get(id as usize) {
            self.live1 = self
                .live1
                .saturating_sub(size_at_one(b.per_sample, b.fixed));
        }
        self.events.push(Event {
            buffer: id,
            alloc: false,
            phase: self.phase,
            micro: self.micro,
            node: self.node,
        });
    }

    fn retain(&mut self, id: u32) {
        self.refs[id as usize] += 1;
    }

    fn release(&mut self, id: u32) {
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
    fn keeps(&self, e: &Extra, keep_saves: bool) -> bool {
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
    fn trains(&self, node: &crate::model::ir::Node) -> bool {
        node.params.iter().any(|&p| self.policy.trainable(p))
    }

    /// Allocates one extra of a rule: a temporary (returned for the caller to release), or a
    /// tensor saved for backward (kept in `saved_bufs`). `None` for an empty extra.
    fn extra_buffer(&mut self, e: &Extra, keep_saves: bool) -> Option<u32> {
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
    fn hold_in_output(&mut self, b: u32) {
        self.retain(b);
        match self.cfg.loop_shape {
            LoopShape::Plain => self.pinned.push(b),
            LoopShape::Trainer | LoopShape::Lightning => self.output_refs.push(b),
        }
    }

    fn tensor_bytes(&self, t: usize, d: DType) -> (u64, u64) {
        let ts = &self.g.tensors[t];
        (ts.per_sample * d.size(), ts.fixed * d.size())
    }

    /// A kernel workspace (bytes per sample, fixed bytes): taken and given back at once.
    fn workspace(&mut self, (per_sample, fixed): (u64, u64)) {
        if per_sample > 0 || fixed > 0 {
            let b = self.alloc(per_sample, fixed, Category::Transient, 1);
            self.release(b);
        }
    }

    fn step(&mut self, create_state: bool) {
        self.phase = Phase::ZeroGrad;
        self.node = NO_NODE;
        if self.cfg.loop_shape != LoopShape::Lightning {
            self.zero_grad();
        }
        if !create_state {
            self.rebuild_ddp_buckets();
        }
        let micros = self.cfg.accum.min(2) as u16;
        for m in 0..micros {
            self.micro_step(m);
            if self.stopped {
                return;
            }
        }
        self.optimizer_step(create_state);
    }
}

impl Sim<'_> {
    /// `optimizer.zero_grad(set_to_none=True)`: every gradient goes.
    pub(super) fn zero_grad(&mut self) {
        for p in 0..self.param_grad.len() {
            if let Some(b) = self.param_grad[p].take() {
                self.release(b);
            }
        }
        self.zero_sharded_grads();
    }
}

/// Every node's output dtype and rule under one precision and checkpointing setting: what
/// an event generation walks, a function of the graph and those two settings only, so the
/// make-it-fit search computes them once per graph and setting ([`crate::plan::GraphCache`])
/// instead of once per combination.
#[derive(Debug)]
pub struct Annotations {
    precision: Precision,
    checkpointing: bool,
    dtypes: Vec<DType>,
    rules: Vec<Rule>,
}

impl Annotations {
    /// Assigns dtypes and rules to every node of `g`.
    pub fn new(g: &Graph, precision: Precision, checkpointing: bool) -> Annotations {
        let mut dtypes = vec![precision.param_dtype(); g.tensors.len()];
        let mut rules = Vec::with_capacity(g.nodes.len());
        let mut ins = Vec::new();
        for node in &g.nodes {
            ins.clear();
            ins.extend(node.inputs.iter().map(|&t| dtypes[t]));
            let mut r = rule(g, node, &ins, precision, checkpointing);
            dtypes[node.output] = if g.tensors[node.output].elem == Elem::Int64 {
                DType::I64
            } else {
                r.out_dtype
            };
            backward_rule(g, node, &mut r, &dtypes);
            rules.push(r);
        }
        Annotations {
            precision,
            checkpointing,
            dtypes,
            rules,
        }
    }

    /// Whether these are the annotations `cfg` generates with (of the same graph).
    fn serve(&self, cfg: &TrainConfig) -> bool {
        self.precision == cfg.precision && self.checkpointing == cfg.checkpointing
    }
}

/// Per tensor: whether autograd records it (a float output of an op with a trainable
/// parameter or an input that requires grad, or an embedding `enable_input_require_grads`
/// hooks). Under merged adapters (`merged` non-empty) skipped adapter ops produce nothing
/// and a layer's result is its base output: after `merge_and_unload` only the base layers
/// run (measured on the H200: GPT-2 LoRA merged, eval-grad as much as no-grad, 2.63 vs
/// 2.62 GiB; `tests/data/merged.jsonl`).
fn requires_grad_of(
    g: &Graph,
    policy: &ParamPolicy,
    input_grads: &[usize],
    merged: &[eval_step::Merged],
) -> Vec<bool> {
    let mut requires_grad = vec![false; g.tensors.len()];
    for (n, node) in g.nodes.iter().enumerate() {
        let rg = match merged.get(n).copied().unwrap_or(eval_step::Merged::Run) {
            eval_step::Merged::Skip => false,
            eval_step::Merged::Base(t) => requires_grad[t],
            eval_step::Merged::Run => {
                node.params.iter().any(|&p| policy.trainable(p))
                    || node.inputs.iter().any(|&t| requires_grad[t])
                    || input_grads.contains(&n)
            }
        };
        requires_grad[node.output] = rg && g.tensors[node.output].elem == Elem::Float;
    }
    requires_grad
}

/// A buffer's bytes at batch 1 as the caching allocator rounds them.
fn size_at_one(per_sample: u64, fixed: u64) -> u64 {
    round_size(per_sample.saturating_add(fixed))
}

/// Generates the events for `g` under `cfg` with the parameters' states in `policy`
/// (the batch size is not used here).
pub fn generate(g: &Graph, cfg: &TrainConfig, policy: &ParamPolicy, k: &Constants) -> Events {
    // Without a bound the generation never stops (`live1` saturates at u64::MAX, never
    // above it).
    generate_unless_above(g, cfg, policy, k, u64::MAX).unwrap_or_default()
}

/// [`generate`], stopped (`None`) as soon as the bytes live at batch 1, each buffer rounded
/// as the caching allocator rounds it, pass `stop_above` at any event (model creation, the
/// warm-up, the measured step). The caching allocator's allocated bytes are at least those
/// live bytes at every event of a replay at batch 1, and its reserved bytes at least its
/// allocated bytes: a stopped generation is one whose replay at batch 1 reserves more than
/// `stop_above` at some point (an OOM under any cap up to it, an nvidia-smi peak above it
/// plus the context). The make-it-fit search stops its doomed combinations this way
/// ([`crate::plan::fit`]).
pub fn generate_unless_above(
    g: &Graph,
    cfg: &TrainConfig,
    policy: &ParamPolicy,
    k: &Constants,
    stop_above: u64,
) -> Option<Events> {
    generate_annotated(g, cfg, policy, k, stop_above, None)
}

/// [`generate_unless_above`] with `g`'s annotations when they were computed already (for
/// `cfg`'s precision and checkpointing; others are computed here).
pub fn generate_annotated(
    g: &Graph,
    cfg: &TrainConfig,
    policy: &ParamPolicy,
    k: &Constants,
    stop_above: u64,
    annotations: Option<&Annotations>,
) -> Option<Events> {
    let own;
    let annotations = match annotations {
        Some(a) if a.serve(cfg) => a,
        _ => {
            own = Annotations::new(g, cfg.precision, cfg.checkpointing);
            &own
        }
    };
    let (dtypes, train_rules) = (&annotations.dtypes, &annotations.rules);
    let eval_rules = if cfg.step.is_eval() {
        eval_step::eval_rules(g, train_rules)
    } else {
        Vec::new()
    };
    let mut consumers = vec![0u32; g.tensors.len()];
    for node in &g.nodes {
        for &t in &node.inputs {
            consumers[t] += 1;
        }
    }
    let mut param_uses = vec![0u32; g.params.len()];
    for node in &g.nodes {
        for &p in &node.params {
            param_uses[p] += 1;
        }
    }
    let input_grads = checkpoint::input_embeddings(g, cfg);
    let requires_grad = requires_grad_of(g, policy, &input_grads, &[]);
    let merged = eval_step::merged_roles(g, cfg);
    // With merged adapters the evaluation forward runs no adapter op: what requires grad
    // there follows from the ops that do run (nothing, when only adapters trained).
    let eval_requires_grad = if merged.is_empty() {
        Vec::new()
    } else {
        requires_grad_of(g, policy, &input_grads, &merged)
    };
    // Capacity for the events of most graphs and configs (measured on the presets: at most
    // ~12 events per node and micro-step, about half as many buffers), so that the lists rarely
    // grow. Every buffer has an allocation event: the event bound also bounds the buffers
    // (untouched capacity costs no page faults, a regrowth copies the whole list).
    let micro_steps = cfg.accum.clamp(1, 2) as usize * if cfg.checkpointing { 2 } else { 1 };
    let expected_events = 16 * (micro_steps * g.nodes.len() + g.params.len());
    let mut sim = Sim {
        g,
        prec: cfg.precision,
        cfg: *cfg,
        policy,
        buffers: Vec::with_capacity(expected_events),
        events: Vec::with_capacity(expected_events),
        refs: Vec::with_capacity(expected_events),
        phase: Phase::Setup,
        micro: 0,
        node: NO_NODE,
        tbuf: vec![None; g.tensors.len()],
        dtypes,
        rules: train_rules,
        consumers: &consumers,
        requires_grad: &requires_grad,
        saved: vec![0..0; g.nodes.len()],
        saved_bufs: Vec::new(),
        input_bufs: Vec::new(),
        temps: Vec::new(),
        uncached: Vec::new(),
        gbuf: vec![None; g.tensors.len()],
        param_grad: vec![None; g.params.len()],
        param_cast: vec![None; g.params.len()],
        param_uses,
        param_seen: vec![0; g.params.len()],
        param_pending: vec![None; g.params.len()],
        param_pending_inplace: vec![false; g.params.len()],
        cache_refs: Vec::new(),
        pinned: Vec::new(),
        output_refs: Vec::new(),
        ckpt: cfg.checkpointing,
        blocks: checkpoint::Blocks::new(g, cfg.checkpointing),
        ckpt_consumers: Vec::new(),
        block_inputs: vec![Vec::new(); g.block_count() as usize],
        reentrant: cfg.checkpointing && cfg.checkpoint_reentrant,
        reentrant_held: Vec::new(),
        chunk_grads: Vec::new(),
        input_grad_nodes: input_grads,
        merged,
        model_output: g.nodes.last().and_then(|n| n.inputs.first().copied()),
        recomputing: false,
        dist: dist::DistSim::new(g, &cfg.distributed, policy, cfg.checkpointing),
        live1: 0,
        stop_above,
        stopped: false,
    };
    if !sim.dist.offload_params {
        for (i, p) in g.params.iter().enumerate() {
            sim.alloc(0, policy.bytes(i, p.elems), Category::Parameters, 1);
        }
    }
    sim.setup_buffers();
    if sim.stopped {
        return None;
    }
    sim.step(true);
    if sim.stopped {
        return None;
    }
    // cuBLAS workspace: created with the first matmul, kept for the process.
    sim.phase = Phase::Setup;
    for &w in k.workspaces.iter().filter(|&&w| w > 0) {
        sim.alloc(0, w, Category::Transient, 1);
    }
    if cfg.step.is_eval() {
        // Validation runs after training steps: the pool holds what they reserved.
        sim.step(false);
    }
    let measured_start = sim.events.len();
    if cfg.step.is_eval() {
        sim.rules = &eval_rules;
        if !eval_requires_grad.is_empty() {
            sim.requires_grad = &eval_requires_grad;
        }
        sim.eval_step(cfg.step == StepKind::EvalGrad);
    } else {
        sim.step(false);
    }
    if sim.stopped {
        return None;
    }
    let side_streams = sim.buffers.iter().any(|b| b.side_stream);
    Some(Events {
        buffers: sim.buffers,
        events: sim.events,
        measured_start,
        side_streams,
        whole_blocks: false,
        empty_cache: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
