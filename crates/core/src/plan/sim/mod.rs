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
#[cfg(test)]
mod test_support;

use std::ops::Range;

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
}

/// `Event::node` outside any node (setup, zero_grad, the optimizer step).
const NO_NODE: u32 = u32::MAX;

impl<'g> Sim<'g> {
    fn new_buffer(&mut self, per_sample: u64, fixed: u64, category: Category) -> u32 {
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
            LoopShape::Trainer => self.output_refs.push(b),
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
        for p in 0..self.param_grad.len() {
            if let Some(b) = self.param_grad[p].take() {
                self.release(b);
            }
        }
        self.zero_sharded_grads();
        if !create_state {
            self.rebuild_ddp_buckets();
        }
        let micros = self.cfg.accum.min(2) as u16;
        for m in 0..micros {
            self.micro_step(m);
        }
        self.optimizer_step(create_state);
    }
}

/// Assigns dtypes and rules to every node.
fn annotate(g: &Graph, prec: Precision, checkpointing: bool) -> (Vec<DType>, Vec<Rule>) {
    let mut dtypes = vec![prec.param_dtype(); g.tensors.len()];
    let mut rules = Vec::with_capacity(g.nodes.len());
    let mut ins = Vec::new();
    for node in &g.nodes {
        ins.clear();
        ins.extend(node.inputs.iter().map(|&t| dtypes[t]));
        let mut r = rule(g, node, &ins, prec, checkpointing);
        dtypes[node.output] = if g.tensors[node.output].elem == Elem::Int64 {
            DType::I64
        } else {
            r.out_dtype
        };
        backward_rule(g, node, &mut r, &dtypes);
        rules.push(r);
    }
    (dtypes, rules)
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

/// Generates the events for `g` under `cfg` with the parameters' states in `policy`
/// (the batch size is not used here).
pub fn generate(g: &Graph, cfg: &TrainConfig, policy: &ParamPolicy, k: &Constants) -> Events {
    let (dtypes, train_rules) = annotate(g, cfg.precision, cfg.checkpointing);
    let eval_rules = if cfg.step.is_eval() {
        eval_step::eval_rules(g, &train_rules)
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
        dtypes: &dtypes,
        rules: &train_rules,
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
        block_inputs: vec![Vec::new(); g.block_count() as usize],
        reentrant: cfg.checkpointing && cfg.checkpoint_reentrant,
        reentrant_held: Vec::new(),
        chunk_grads: Vec::new(),
        input_grad_nodes: input_grads,
        merged,
        model_output: g.nodes.last().and_then(|n| n.inputs.first().copied()),
        recomputing: false,
        dist: dist::DistSim::new(g, &cfg.distributed, policy, cfg.checkpointing),
    };
    if !sim.dist.offload_params {
        for (i, p) in g.params.iter().enumerate() {
            sim.alloc(0, policy.bytes(i, p.elems), Category::Parameters, 1);
        }
    }
    sim.setup_buffers();
    sim.step(true);
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
    let side_streams = sim.buffers.iter().any(|b| b.side_stream);
    Events {
        buffers: sim.buffers,
        events: sim.events,
        measured_start,
        side_streams,
        whole_blocks: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::families::transformer::AttnImpl;
    use crate::model::ir::{Op, Pointwise};
    use crate::model::preset::builtin_presets;
    use crate::plan::config::LoopShape;
    use crate::plan::config::{Attention, Optimizer, Precision};

    #[test]
    fn every_preset_gives_consistent_events() {
        for p in builtin_presets().expect("presets parse") {
            let size = p.default_size().min(256);
            let size = if p.input.is_tokens() {
                size
            } else {
                224.max(size)
            };
            let g = match p.build(size, AttnImpl::Sdpa) {
                Ok(g) => g,
                Err(e) => panic!("{}: {e}", p.id),
            };
            for prec in Precision::ALL {
                for ckpt in [false, true] {
                    for accum in [1, 3] {
                        let cfg = TrainConfig {
                            precision: prec,
                            checkpointing: ckpt,
                            accum,
                            optimizer: Optimizer::AdamW,
                            attention: Attention::Sdpa,
                            ..TrainConfig::default()
                        };
                        let ev = generate(
                            &g,
                            &cfg,
                            &ParamPolicy::full(&g, cfg.precision),
                            &Constants::default(),
                        );
                        if let Err(e) = ev.check(&g) {
                            panic!("{} {prec} ckpt={ckpt} accum={accum}: {e}", p.id);
                        }
                    }
                }
            }
        }
    }

    /// `AddBackward0` hands the same gradient to both operands: a residual add allocates
    /// nothing in backward (allocator history of ResNet-18, H100, PyTorch 2.11).
    #[test]
    fn residual_add_passes_its_gradient_through() {
        let p = crate::model::preset::find_builtin("resnet18").expect("preset");
        let g = p.build(224, AttnImpl::Sdpa).expect("graph");
        let ev = generate(
            &g,
            &TrainConfig::default(),
            &ParamPolicy::full(&g, Precision::default()),
            &Constants::default(),
        );
        let adds: Vec<u32> = g
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                matches!(
                    n.op,
                    Op::Pointwise {
                        f: Pointwise::Add,
                        ..
                    }
                )
            })
            .map(|(i, _)| i as u32)
            .collect();
        assert_eq!(adds.len(), 8, "one residual add per basic block");
        let in_backward = ev.events[ev.measured_start..]
            .iter()
            .filter(|e| e.alloc && e.phase == Phase::Backward && adds.contains(&e.node))
            .count();
        assert_eq!(in_backward, 0);
    }

    /// Tied embeddings (GPT-2's `wte` is also the LM head): at the embedding's backward its
    /// gradient is summed with the head's out of place (a new tensor and the sum) in fp32,
    /// in place into the fp32 gradient of autocast's weight copy under AMP.
    #[test]
    fn tied_weight_gradients_sum_out_of_place_unless_via_autocast() {
        let p = crate::model::preset::find_builtin("gpt2").expect("preset");
        let g = p.build(128, AttnImpl::Sdpa).expect("graph");
        let wte = g
            .nodes
            .iter()
            .position(|n| g.name(n) == "transformer.wte")
            .expect("wte") as u32;
        let bytes = g.params[0].elems * 4;
        for (precision, expect) in [(Precision::Fp32, 2), (Precision::AmpBf16, 1)] {
            let cfg = TrainConfig {
                precision,
                ..TrainConfig::default()
            };
            let ev = generate(
                &g,
                &cfg,
                &ParamPolicy::full(&g, cfg.precision),
                &Constants::default(),
            );
            let weight_sized = ev.events[ev.measured_start..]
                .iter()
                .filter(|e| e.alloc && e.phase == Phase::Backward && e.node == wte)
                .filter(|e| ev.buffers[e.buffer as usize].fixed == bytes)
                .count();
            assert_eq!(weight_sized, expect, "{precision}");
        }
    }

    /// A trainer loop releases the logits when the loss is taken, a plain one at the end of
    /// the micro-step.
    #[test]
    fn trainer_loop_frees_the_logits_before_backward() {
        let p = crate::model::preset::find_builtin("gpt2").expect("preset");
        let g = p.build(128, AttnImpl::Sdpa).expect("graph");
        let logits = g.nodes.last().map(|n| n.inputs[0]).expect("loss");
        let head = g
            .nodes
            .iter()
            .position(|n| n.output == logits)
            .expect("head") as u32;
        for (loop_shape, phase) in [
            (LoopShape::Plain, Phase::Backward),
            (LoopShape::Trainer, Phase::Forward),
        ] {
            let cfg = TrainConfig {
                loop_shape,
                precision: Precision::Fp32,
                ..TrainConfig::default()
            };
            let ev = generate(
                &g,
                &cfg,
                &ParamPolicy::full(&g, cfg.precision),
                &Constants::default(),
            );
            let measured = &ev.events[ev.measured_start..];
            let logits_bytes = g.tensors[logits].per_sample * 4;
            let buf = measured
                .iter()
                .find(|e| {
                    e.alloc
                        && e.node == head
                        && ev.buffers[e.buffer as usize].per_sample == logits_bytes
                })
                .map(|e| e.buffer)
                .expect("logits allocated");
            let freed = measured
                .iter()
                .find(|e| !e.alloc && e.buffer == buf)
                .expect("logits freed");
            assert_eq!(freed.phase, phase, "{loop_shape}");
        }
    }

    /// `NewGELUActivation` runs as Python ops: each temporary dies when the next value exists
    /// and the output comes last (GPT-2's allocator history under AMP bf16, H200): at most
    /// two fp32 temporaries are live at once, never beside the output.
    #[test]
    fn gelu_new_allocates_in_python_order() {
        let p = crate::model::preset::find_builtin("gpt2").expect("preset");
        let g = p.build(128, AttnImpl::Sdpa).expect("graph");
        let cfg = TrainConfig {
            precision: Precision::AmpBf16,
            ..TrainConfig::default()
        };
        let ev = generate(
            &g,
            &cfg,
            &ParamPolicy::full(&g, cfg.precision),
            &Constants::default(),
        );
        let act = g
            .nodes
            .iter()
            .position(|n| n.op == Op::GeluNewPython)
            .expect("a gelu_new") as u32;
        let seq: Vec<(bool, Category)> = ev.events[ev.measured_start..]
            .iter()
            .filter(|e| e.node == act && e.phase == Phase::Forward)
            .map(|e| (e.alloc, ev.buffers[e.buffer as usize].category))
            .collect();
        use Category::{Activations as A, Transient as T};
        let expect = [
            (true, A), // 0.5 * x
            (true, A), // x cast to fp32 for pow, saved
            (true, T), // pow
            (true, T), // 0.044715 * ·
            (false, T),
            (true, T), // x + ·
            (false, T),
            (true, T), // sqrt(2/π) * ·
            (false, T),
            (true, A), // tanh, saved
            (false, T),
            (true, A),  // 1 + tanh, saved
            (true, A),  // the output
            (false, A), // x itself, whose last reader this was
        ];
        assert_eq!(seq, expect);
    }

    /// `gate, up = gate_up.chunk(2, dim=-1)` (Phi-3's fused MLP, the MoE experts): the
    /// activation and the product give half-size gradients, and the split node concatenates
    /// them into one new gradient of the whole `gate_up` at the first chunk (the order of
    /// the `mul`, `mul`, `silu_backward`, `cat` allocations in the per-op trace of Mixtral's
    /// experts, H200, PyTorch 2.11).
    #[test]
    fn chunk_gradients_are_halves_then_one_cat() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/hf_configs_device/Phi-3-mini-4k-instruct-L3.json"
        );
        let text = std::fs::read_to_string(path).expect("config");
        let p = crate::model::hf::from_config_text(&text, "phi3").expect("preset");
        let g = p.build(64, AttnImpl::Sdpa).expect("graph");
        let cfg = TrainConfig {
            precision: Precision::Fp32,
            ..TrainConfig::default()
        };
        let ev = generate(
            &g,
            &cfg,
            &ParamPolicy::full(&g, cfg.precision),
            &Constants::default(),
        );
        let chunks: Vec<usize> = (0..g.nodes.len())
            .filter(|&i| g.nodes[i].op == Op::Chunk)
            .collect();
        assert_eq!(chunks.len(), 2 * 3, "two chunks per layer");
        let whole = g.tensors[g.nodes[chunks[0]].inputs[0]].per_sample * 4;
        let half = whole / 2;
        let bwd_allocs = |node: usize| -> Vec<u64> {
            ev.events[ev.measured_start..]
                .iter()
                .filter(|e| e.alloc && e.phase == Phase::Backward && e.node == node as u32)
                .map(|e| ev.buffers[e.buffer as usize].per_sample)
                .collect()
        };
        // the first chunk of the first layer: the one cat
        assert_eq!(bwd_allocs(chunks[0]), vec![whole]);
        assert!(bwd_allocs(chunks[1]).is_empty());
        // between the chunks and the down projection nothing allocates a whole gradient
        for n in chunks[1] + 1..chunks[1] + 3 {
            let a = bwd_allocs(n);
            assert!(a.iter().all(|&x| x <= half), "node {n}: {a:?}");
            assert!(!a.is_empty(), "node {n} computes a gradient");
        }
    }
}
