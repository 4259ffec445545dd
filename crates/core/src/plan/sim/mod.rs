//! The simulator: turns a graph, a training config and a parameter-state policy into the
//! allocation events of training steps, the way PyTorch autograd performs them (see
//! DESIGN.md): model creation, one warm-up step that creates the optimizer state, and the
//! measured steady-state step.
//!
//! - this file: one training step (zero_grad, micro-steps, optimizer step), the op
//!   annotations and [`generate`];
//! - [`state`]: the simulation state, buffers and their reference counts; it holds what
//!   [`blocks`], [`dist_state`] (with [`ds_zero_state`] and [`ds_fetch`]) and [`merged`]
//!   compute once per generation;
//! - [`autograd`]: the forward and backward walk of one micro-step, driven by the op
//!   rules of [`super::rules`];
//! - [`checkpoint`]: activation checkpointing (what a checkpoint keeps, recomputation);
//! - [`repeat`] (with [`repeat_state`]): the measured step's micro-steps copied from the
//!   warm-up's where they start alike (one GPU), instead of walking the graph again;
//! - [`dist`] and [`ds_zero`]: what one rank allocates under a multi-GPU strategy;
//! - [`eval_step`]: a validation forward after training;
//! - [`op_steps`]: an op given as explicit allocation sequences (SDPA's math path);
//! - [`optimizer_step`]: the optimizer's state and temporaries, from [`super::optimizer`].
//!
//! The files beside this one import only one another, never this file.

mod autograd;
mod blocks;
mod checkpoint;
mod dist;
mod dist_state;
mod ds_fetch;
mod ds_zero;
mod ds_zero_state;
mod eval_step;
mod merged;
mod op_steps;
mod optimizer_step;
mod repeat;
mod repeat_state;
mod state;

use self::blocks::Blocks;
use self::dist_state::DistSim;
use self::merged::Merged;
use self::repeat_state::Repeat;
use self::state::{NO_NODE, Sim};
use super::config::{DType, LoopShape, Precision, TrainConfig};
use super::events::{Category, Constants, Events, Phase};
use super::policy::ParamPolicy;
use super::rules::{Rule, backward_rule, rule};
use super::step_kind::StepKind;
use crate::model::ir::{Elem, Graph};

impl Sim<'_> {
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
        // The measured step repeats the warm-up's micro-steps where it starts as they did.
        if create_state || !self.repeat_micro_steps(micros) {
            for m in 0..micros {
                if create_state {
                    self.record_micro_step(m);
                } else {
                    self.micro_step(m);
                }
                if self.stopped {
                    return;
                }
            }
        } else if self.stopped {
            return;
        }
        self.optimizer_step(create_state);
    }

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
    /// Where each node's holds start in `g.holds` ([`hold_starts`]).
    hold_start: Vec<u32>,
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
            hold_start: hold_starts(g),
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
    merged: &[Merged],
) -> Vec<bool> {
    let mut requires_grad = vec![false; g.tensors.len()];
    for (n, node) in g.nodes.iter().enumerate() {
        let rg = match merged.get(n).copied().unwrap_or(Merged::Run) {
            Merged::Skip => false,
            Merged::Base(t) => requires_grad[t],
            Merged::Run => {
                node.params.iter().any(|&p| policy.trainable(p))
                    || node.inputs.iter().any(|&t| requires_grad[t])
                    || input_grads.contains(&n)
            }
        };
        requires_grad[node.output] = rg && g.tensors[node.output].elem == Elem::Float;
    }
    requires_grad
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
    generate_with(g, cfg, policy, k, stop_above, annotations, true)
}

/// [`generate_annotated`]; `repeat`: whether the measured step may repeat the warm-up's
/// micro-steps (`repeat.rs`) instead of walking the graph again (the same events either way).
fn generate_with(
    g: &Graph,
    cfg: &TrainConfig,
    policy: &ParamPolicy,
    k: &Constants,
    stop_above: u64,
    annotations: Option<&Annotations>,
    repeat: bool,
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
    for h in &g.holds {
        consumers[h.tensor] += 1;
    }
    let mut param_uses = vec![0u32; g.params.len()];
    for node in &g.nodes {
        for &p in &node.params {
            param_uses[p] += 1;
        }
    }
    let input_grads = blocks::input_embeddings(g, cfg);
    let requires_grad = requires_grad_of(g, policy, &input_grads, &[]);
    let merged = merged::merged_roles(g, cfg);
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
        ordered: [None; super::rules::ORDERED_EXTRAS],
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
        blocks: Blocks::new(g, cfg.checkpointing),
        ckpt_consumers: Vec::new(),
        block_inputs: vec![Vec::new(); g.block_count() as usize],
        reentrant: cfg.checkpointing && cfg.checkpoint_reentrant,
        reentrant_held: Vec::new(),
        chunk_grads: Vec::new(),
        input_grad_nodes: input_grads,
        merged,
        model_output: g.nodes.last().and_then(|n| n.inputs.first().copied()),
        recomputing: false,
        hold_start: &annotations.hold_start,
        dist: DistSim::new(g, &cfg.distributed, policy, cfg.checkpointing),
        repeat: Repeat::new(repeat && !cfg.distributed.active()),
        live1: 0,
        live1_peak: 0,
        stop_above,
        stopped: false,
        // What `eval::reserved_bound` asks of events replayed with expandable segments.
        bound1: cfg
            .allocator
            .expandable_segments
            .then(crate::plan::allocator::ExpandableBound::default),
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
        bound_at_one: sim.bound1.map(|b| b.reserved()),
    })
}

#[cfg(test)]
mod tests;

/// Where each node's holds start in `g.holds` (sorted by node), with one entry past the last
/// node; empty when the graph holds nothing.
fn hold_starts(g: &Graph) -> Vec<u32> {
    if g.holds.is_empty() {
        return Vec::new();
    }
    let mut starts = Vec::with_capacity(g.nodes.len() + 1);
    let mut i = 0;
    for n in 0..=g.nodes.len() {
        while g.holds.get(i).is_some_and(|h| h.node < n) {
            i += 1;
        }
        starts.push(u32::try_from(i).unwrap_or(u32::MAX));
    }
    starts
}
