//! Turns a graph + config into the allocation events of training steps, the way
//! PyTorch autograd performs them (see DESIGN.md). Sizes stay symbolic in the batch:
//! each buffer is `per_sample × batch + fixed` bytes, so one event list serves every batch.

use std::ops::Range;

use serde::Serialize;

use super::config::{DType, LoopShape, Optimizer, Precision, TrainConfig};
use super::rules::{Extra, Rule, rule};
use crate::model::ir::{Elem, Graph, Op, Pointwise};

/// What a buffer holds (the breakdown categories).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    /// fp16/bf16 copies of the weights made by autocast (its weight cache).
    WeightCasts,
    /// Activations: forward outputs and tensors saved for backward, the input batch.
    Activations,
    /// Activation gradients and temporaries (backward working set, optimizer temporaries, cuBLAS workspace).
    Transient,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::WeightCasts,
        Category::Activations,
        Category::Transient,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Category::Parameters => "Parameters",
            Category::Gradients => "Gradients",
            Category::OptimizerState => "Optimizer state",
            Category::WeightCasts => "Low-precision weight copies",
            Category::Activations => "Activations",
            Category::Transient => "Transient / workspace",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A phase of the training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Model creation and persistent workspaces (before the measured step).
    Setup,
    /// `zero_grad(set_to_none=True)` at the step's start.
    ZeroGrad,
    Forward,
    Backward,
    /// `optimizer.step()`.
    Optimizer,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::ZeroGrad => "zero_grad",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer step",
        }
    }
}

/// A buffer: one allocation of `per_sample × batch + fixed` bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Buffer {
    pub per_sample: u64,
    pub fixed: u64,
    pub category: Category,
}

/// One allocation or free.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    pub buffer: u32,
    pub alloc: bool,
    pub phase: Phase,
    /// Micro-step (0-based) for forward/backward events.
    pub micro: u16,
    /// Node index (for labels), or `u32::MAX`.
    pub node: u32,
}

/// Calibration constants measured on the device (see `tests/data/`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Constants {
    /// Persistent buffers PyTorch allocates through its caching allocator on first use:
    /// one 32 MiB cuBLAS workspace per handle (the forward thread and the autograd thread)
    /// and ~2 MiB of small state. Measured as `allocated_start − params − grads − optimizer
    /// state` = 66 MiB on most rows of tests/data (H200, PyTorch 2.11, CUDA 13).
    pub workspaces: [u64; 3],
}

impl Default for Constants {
    fn default() -> Self {
        Constants {
            workspaces: [32 << 20, 32 << 20, 2 << 20],
        }
    }
}

/// The events of: model creation, one warm-up step (creates optimizer state) and
/// the measured steady-state step, which starts at `measured_start`.
#[derive(Debug, Clone)]
pub struct Events {
    pub buffers: Vec<Buffer>,
    pub events: Vec<Event>,
    pub measured_start: usize,
}

struct Sim<'g> {
    g: &'g Graph,
    prec: Precision,
    cfg: TrainConfig,
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
    /// The loss's input (logits), held by the training loop's `out` variable.
    model_output: Option<usize>,
    /// Set while recomputing a checkpointed block.
    recomputing: bool,
}

const NO_NODE: u32 = u32::MAX;

impl<'g> Sim<'g> {
    fn new_buffer(&mut self, per_sample: u64, fixed: u64, category: Category) -> u32 {
        self.buffers.push(Buffer {
            per_sample,
            fixed,
            category,
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

    /// Allocates one extra of a rule: a temporary (returned for the caller to release), or a
    /// tensor saved for backward (kept in `saved_bufs`). `None` for an empty extra.
    fn extra_buffer(&mut self, e: &Extra, keep_saves: bool) -> Option<u32> {
        let ps = e.per_sample * e.dtype.size();
        let fx = e.fixed * e.dtype.size();
        if ps == 0 && fx == 0 {
            return None;
        }
        if e.transient || !keep_saves {
            Some(self.alloc(ps, fx, Category::Transient, 1))
        } else {
            let b = self.alloc(ps, fx, Category::Activations, 1);
            self.saved_bufs.push(b);
            Some(b)
        }
    }

    fn tensor_bytes(&self, t: usize, d: DType) -> (u64, u64) {
        let ts = &self.g.tensors[t];
        (ts.per_sample * d.size(), ts.fixed * d.size())
    }

    fn in_ckpt_block(&self, n: usize) -> bool {
        self.ckpt && self.g.nodes[n].block.is_some()
    }

    /// Forward of node `n`. `recompute`: re-run inside a checkpointed backward.
    fn forward_node(&mut self, n: usize, keep_saves: bool, consumers: &[u32]) {
        self.node = n as u32;
        let g = self.g;
        let node = &g.nodes[n];
        let rules = self.rules;
        let r = &rules[n];
        let out = node.output;
        // Autocast casts of inputs.
        let mut input_bufs = std::mem::take(&mut self.input_bufs);
        input_bufs.clear();
        input_bufs.extend(node.inputs.iter().map(|&t| self.tbuf[t]));
        for &(i, to) in &r.casts {
            let (ps, fx) = self.tensor_bytes(node.inputs[i], to);
            let b = self.alloc(ps, fx, Category::Activations, 1);
            input_bufs[i] = Some(b);
        }
        // Autocast weight cache.
        let mut first_weight_cast = None;
        if r.casts_params {
            for &p in &node.params {
                let b = match self.param_cast[p] {
                    Some(b) => b,
                    None => {
                        let bytes = g.params[p].elems * self.prec.compute_dtype().size();
                        let b = self.alloc(0, bytes, Category::WeightCasts, 1);
                        self.cache_refs.push(b);
                        self.param_cast[p] = Some(b);
                        b
                    }
                };
                first_weight_cast.get_or_insert(b);
            }
        }
        let saved_start = self.saved_bufs.len();
        let mut temps = std::mem::take(&mut self.temps);
        temps.clear();
        if r.chain {
            let mut pending = None;
            for e in &r.extras {
                let b = self.extra_buffer(e, keep_saves);
                if let Some(p) = pending.take() {
                    self.release(p);
                }
                if e.transient || !keep_saves {
                    pending = b;
                }
            }
            if let Some(p) = pending {
                self.release(p);
            }
        }
        // Output.
        let out_buf = if r.alias {
            let b = input_bufs.first().copied().flatten();
            if let Some(b) = b {
                self.refs[b as usize] += consumers[out];
            }
            b
        } else if g.tensors[out].per_sample == 0 && g.tensors[out].fixed == 0 {
            None
        } else {
            let (ps, fx) = self.tensor_bytes(out, r.out_dtype);
            let refs = consumers[out];
            let b = self.new_buffer(ps, fx, Category::Activations);
            self.refs[b as usize] = refs;
            Some(b)
        };
        self.tbuf[out] = out_buf;
        // The model output (`out`) stays referenced until `del out` after backward.
        if Some(out) == self.model_output
            && !self.recomputing
            && let Some(b) = out_buf
        {
            self.hold_in_output(b);
        }
        // Saved tensors and extras (a chain's extras are saved already, with their own
        // reference).
        let retain_from = self.saved_bufs.len();
        if keep_saves {
            for &i in &r.saves_inputs {
                if let Some(b) = input_bufs.get(i).copied().flatten() {
                    self.saved_bufs.push(b);
                }
            }
            if r.saves_output
                && let Some(b) = out_buf
            {
                self.saved_bufs.push(b);
            }
            // Weights are needed for the input gradient.
            if let Some(w) = first_weight_cast
                && node.inputs.first().is_some_and(|&t| self.requires_grad[t])
            {
                self.saved_bufs.push(w);
            }
        }
        for i in retain_from..self.saved_bufs.len() {
            self.retain(self.saved_bufs[i]);
        }
        // An output nobody reads or saves (a recomputed block's result) dies at once.
        if let Some(b) = out_buf
            && !r.alias
            && self.refs[b as usize] == 0
        {
            self.free(b);
            self.tbuf[out] = None;
        }
        if !r.chain {
            for e in &r.extras {
                if let Some(b) = self.extra_buffer(e, keep_saves)
                    && (e.transient || !keep_saves)
                {
                    temps.push(b);
                }
            }
        }
        for &b in &temps {
            self.release(b);
        }
        self.temps = temps;
        if keep_saves {
            self.saved[n] = saved_start..self.saved_bufs.len();
        }
        // Casts not saved die now; inputs lose one consumer.
        for &(i, _) in &r.casts {
            if let Some(b) = input_bufs[i] {
                self.release(b);
            }
        }
        self.input_bufs = input_bufs;
        for &t in &node.inputs {
            if let Some(b) = self.tbuf[t] {
                self.release(b);
            }
        }
        if let Some(b) = out_buf {
            if node.op == Op::Input {
                self.retain(b);
                self.pinned.push(b);
            } else if node.op == Op::CacheAppend && !r.alias {
                self.hold_in_output(b);
            }
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

    fn grad_for(&mut self, t: usize, b: u32) {
        match self.gbuf[t] {
            None => self.gbuf[t] = Some(b),
            // `InputBuffer::accumulate` adds into the old gradient when nothing else holds
            // it, else into the new one (the old one may be a pass-through shared with
            // another input): the one not added into is released.
            Some(old) if self.refs[old as usize] > 1 && self.refs[b as usize] == 1 => {
                self.gbuf[t] = Some(b);
                self.release(old);
            }
            Some(_) => self.release(b),
        }
    }

    /// Whether node `n` hands its output gradient to its inputs unchanged, as
    /// `AddBackward0` does for same-shape, same-dtype operands (no new tensor). A parameter
    /// operand (a broadcast position embedding) needs its gradient summed over the batch.
    fn passes_grad_through(&self, n: usize) -> bool {
        let node = &self.g.nodes[n];
        matches!(
            node.op,
            Op::Pointwise {
                f: Pointwise::Add,
                ..
            }
        ) && node.params.is_empty()
            && node.inputs.iter().all(|&t| {
                let (a, b) = (&self.g.tensors[t], &self.g.tensors[node.output]);
                a.per_sample == b.per_sample
                    && a.fixed == b.fixed
                    && self.dtypes[t] == self.dtypes[node.output]
            })
    }

    fn backward_node(&mut self, n: usize, first_micro: bool) {
        self.node = n as u32;
        let g = self.g;
        let node = &g.nodes[n];
        let rules = self.rules;
        let r = &rules[n];
        let gout = self.gbuf[node.output].take();
        let has_grad_path = gout.is_some() || node.op == Op::Input;
        let is_loss = matches!(node.op, Op::CrossEntropy { .. });
        if (has_grad_path || is_loss) && node.op != Op::Input {
            if matches!(node.op, Op::View | Op::CacheAppend)
                || (r.alias && matches!(node.op, Op::ToComputeDtype | Op::SdpaOutContiguous))
            {
                if let (Some(go), Some(&t)) = (gout, node.inputs.first()) {
                    if self.requires_grad[t] {
                        self.grad_for(t, go);
                    } else {
                        self.release(go);
                    }
                }
            } else if self.passes_grad_through(n) {
                let mut given = false;
                for (i, &t) in node.inputs.iter().enumerate() {
                    if !self.requires_grad[t] || node.inputs[..i].contains(&t) {
                        continue;
                    }
                    if let Some(go) = gout {
                        if given {
                            self.retain(go);
                        }
                        given = true;
                        self.grad_for(t, go);
                    }
                }
                if let (Some(go), false) = (gout, given) {
                    self.release(go);
                }
            } else {
                self.emit_input_grads(n, r, is_loss);
                self.emit_param_grads(n, r, first_micro);
                if r.bwd_transient > 0 {
                    let b = self.alloc(
                        r.bwd_transient * r.out_dtype.size(),
                        0,
                        Category::Transient,
                        1,
                    );
                    self.release(b);
                }
                if let Some(go) = gout {
                    self.release(go);
                }
            }
        }
        self.release_saved(n);
    }

    /// Drops what node `n` saved for its backward.
    fn release_saved(&mut self, n: usize) {
        for i in std::mem::take(&mut self.saved[n]) {
            self.release(self.saved_bufs[i]);
        }
    }

    fn emit_input_grads(&mut self, n: usize, r: &Rule, is_loss: bool) {
        let g = self.g;
        let node = &g.nodes[n];
        if is_loss {
            // nll_loss backward → log_softmax backward → (cast back to the logits' dtype).
            let logits = node.inputs[0];
            if !self.requires_grad[logits] {
                return;
            }
            let ls = r.extras.iter().rev().find(|e| !e.transient).copied();
            if let Some(ls) = ls {
                let ps = ls.per_sample * ls.dtype.size();
                let d = self.dtypes[logits];
                let upcast = matches!(node.op, Op::CrossEntropy { upcast: true, .. });
                let g1 = self.alloc(ps, 0, Category::Transient, 1);
                if d != ls.dtype && !upcast {
                    // log_softmax backward writes the logits' dtype directly; the saved
                    // fp32 output is released first (order seen in the allocator trace of
                    // BERT under autocast, H200, PyTorch 2.11).
                    self.release_saved(n);
                    let (p, f) = self.tensor_bytes(logits, d);
                    let gi = self.alloc(p, f, Category::Transient, 1);
                    self.release(g1);
                    self.grad_for(logits, gi);
                    return;
                }
                let g2 = self.alloc(ps, 0, Category::Transient, 1);
                self.release(g1);
                let gi = if d != ls.dtype {
                    let (p, f) = self.tensor_bytes(logits, d);
                    let gi = self.alloc(p, f, Category::Transient, 1);
                    self.release(g2);
                    gi
                } else {
                    g2
                };
                self.grad_for(logits, gi);
            }
            return;
        }
        let fused_parts = matches!(node.op, Op::Sdpa { .. }) && node.inputs.len() == 1;
        for (i, &t) in node.inputs.iter().enumerate() {
            if !self.requires_grad[t] || g.tensors[t].elem != Elem::Float {
                continue;
            }
            if node.inputs[..i].contains(&t) {
                continue;
            }
            let d = self.dtypes[t];
            let cast = r.casts.iter().find(|c| c.0 == i).map(|c| c.1);
            let (ps, fx) = self.tensor_bytes(t, cast.unwrap_or(d));
            let mut gi = self.alloc(ps, fx, Category::Transient, 1);
            if i == 0 {
                self.workspace(r.conv_ws.data);
            }
            if fused_parts {
                // dq, dk, dv are separate; the split's backward concatenates them.
                let whole = self.alloc(ps, fx, Category::Transient, 1);
                self.release(gi);
                gi = whole;
            }
            if cast.is_some() {
                let (ps, fx) = self.tensor_bytes(t, d);
                let back = self.alloc(ps, fx, Category::Transient, 1);
                self.release(gi);
                gi = back;
            }
            self.grad_for(t, gi);
        }
    }

    /// A kernel workspace (bytes per sample, fixed bytes): taken and given back at once.
    fn workspace(&mut self, (per_sample, fixed): (u64, u64)) {
        if per_sample > 0 || fixed > 0 {
            let b = self.alloc(per_sample, fixed, Category::Transient, 1);
            self.release(b);
        }
    }

    fn emit_param_grads(&mut self, n: usize, r: &Rule, first_micro: bool) {
        let g = self.g;
        let node = &g.nodes[n];
        let pd = self.prec.param_dtype();
        for (k, &p) in node.params.iter().enumerate() {
            let bytes = g.params[p].elems * pd.size();
            let low = if r.casts_params {
                let lb = g.params[p].elems * self.prec.compute_dtype().size();
                Some(self.alloc(0, lb, Category::Transient, 1))
            } else {
                None
            };
            // The weight-gradient kernel's workspace follows the tensor it writes.
            if k == 0 && low.is_some() {
                self.workspace(r.conv_ws.filter);
            }
            let becomes_grad = first_micro && self.param_grad[p].is_none();
            if self.param_uses[p] > 1 {
                self.shared_param_grad(p, bytes, becomes_grad, low.is_some());
            } else if becomes_grad {
                let b = self.alloc(0, bytes, Category::Gradients, 1);
                self.param_grad[p] = Some(b);
            } else {
                let b = self.alloc(0, bytes, Category::Transient, 1);
                self.release(b);
            }
            if k == 0 && low.is_none() {
                self.workspace(r.conv_ws.filter);
            }
            if let Some(l) = low {
                self.release(l);
            }
        }
    }

    /// One gradient contribution to a parameter used by several ops (tied embeddings: the
    /// LM head, then the embedding). Autograd sums the contributions in the `AccumulateGrad`
    /// node's input buffer and hands the sum to `.grad` once the last one has arrived.
    /// `InputBuffer::accumulate` adds into the first contribution in place only when it is a
    /// plain tensor it alone holds: the fp32 gradient of autocast's weight copy is one, the
    /// transposed view a linear layer's weight gradient arrives as is not, and then the sum
    /// `old + new` is a third tensor of the weight's size (allocator histories of tied Gemma
    /// and Llama 3.2 heads in fp32 and bf16, and under AMP, H200, PyTorch 2.11).
    fn shared_param_grad(&mut self, p: usize, bytes: u64, becomes_grad: bool, via_cast: bool) {
        let category = if becomes_grad {
            Category::Gradients
        } else {
            Category::Transient
        };
        let sum = match self.param_pending[p].take() {
            None => {
                self.param_pending_inplace[p] = via_cast;
                self.alloc(0, bytes, category, 1)
            }
            Some(old) if self.param_pending_inplace[p] => {
                let new = self.alloc(0, bytes, Category::Transient, 1);
                self.release(new);
                old
            }
            Some(old) => {
                let new = self.alloc(0, bytes, Category::Transient, 1);
                let sum = self.alloc(0, bytes, category, 1);
                self.release(old);
                self.release(new);
                self.param_pending_inplace[p] = true;
                sum
            }
        };
        self.param_seen[p] += 1;
        if self.param_seen[p] < self.param_uses[p] {
            self.param_pending[p] = Some(sum);
            return;
        }
        self.param_seen[p] = 0;
        if becomes_grad {
            self.param_grad[p] = Some(sum);
        } else {
            // Later micro-steps: `AccumulateGrad` adds into `.grad` in place.
            self.release(sum);
        }
    }

    fn micro_step(&mut self, micro: u16) {
        let g = self.g;
        self.micro = micro;
        self.phase = Phase::Forward;
        let consumers = self.consumers;
        let count = g.nodes.len();
        let mut block_start: Option<u32> = None;
        for n in 0..count {
            let block = g.nodes[n].block;
            if self.ckpt && block.is_some() && block != block_start {
                block_start = block;
                if let Some(b) = block {
                    // The checkpoint keeps the block's inputs for the recomputation.
                    let ins = self.block_external_inputs(b);
                    for &b in &ins {
                        self.retain(b);
                    }
                    self.block_inputs[b as usize] = ins;
                }
            }
            let keep = !self.in_ckpt_block(n);
            self.forward_node(n, keep, consumers);
        }
        self.node = NO_NODE;
        // `loss = model(**batch).loss`: the output object dies with the expression.
        if self.cfg.loop_shape == LoopShape::Trainer {
            for b in std::mem::take(&mut self.output_refs) {
                self.release(b);
            }
        }
        // Autocast exits: its weight cache is dropped.
        for b in std::mem::take(&mut self.cache_refs) {
            self.release(b);
        }
        for p in 0..self.param_cast.len() {
            self.param_cast[p] = None;
        }
        self.phase = Phase::Backward;
        let first = micro == 0;
        let mut n = count;
        while n > 0 {
            n -= 1;
            if let Some(b) = g.nodes[n].block
                && self.ckpt
                && (n + 1 == count || g.nodes[n + 1].block != Some(b))
            {
                self.recompute_block(b);
            }
            self.backward_node(n, first);
            if let Some(b) = g.nodes[n].block
                && self.ckpt
                && (n == 0 || g.nodes[n - 1].block != Some(b))
            {
                for buf in std::mem::take(&mut self.block_inputs[b as usize]) {
                    self.release(buf);
                }
            }
        }
        self.node = NO_NODE;
        for b in std::mem::take(&mut self.pinned) {
            self.release(b);
        }
        for t in 0..self.gbuf.len() {
            if let Some(b) = self.gbuf[t].take() {
                self.release(b);
            }
        }
        // Every node's backward has released what it saved.
        debug_assert!(self.saved.iter().all(|r| r.is_empty()));
        self.saved_bufs.clear();
    }

    fn block_nodes(&self, b: u32) -> std::ops::Range<usize> {
        let nodes = &self.g.nodes;
        let start = nodes.iter().position(|n| n.block == Some(b)).unwrap_or(0);
        let end = nodes
            .iter()
            .rposition(|n| n.block == Some(b))
            .map_or(start, |e| e + 1);
        start..end
    }

    fn block_external_inputs(&self, b: u32) -> Vec<u32> {
        let range = self.block_nodes(b);
        let mut out = Vec::new();
        for n in range.clone() {
            for &t in &self.g.nodes[n].inputs {
                let produced_inside = self.g.nodes[range.clone()].iter().any(|m| m.output == t);
                if !produced_inside
                    && let Some(buf) = self.tbuf[t]
                    && !out.contains(&buf)
                {
                    out.push(buf);
                }
            }
        }
        out
    }

    fn recompute_block(&mut self, b: u32) {
        let range = self.block_nodes(b);
        let mut consumers = vec![0u32; self.g.tensors.len()];
        for n in range.clone() {
            for &t in &self.g.nodes[n].inputs {
                consumers[t] += 1;
            }
        }
        let phase = self.phase;
        self.recomputing = true;
        for n in range.clone() {
            // Inputs from outside the block are held by the checkpoint: give the
            // consumers' releases something to release.
            for &t in &self.g.nodes[n].inputs {
                let inside = self.g.nodes[range.clone()].iter().any(|m| m.output == t);
                if !inside && let Some(buf) = self.tbuf[t] {
                    self.retain(buf);
                }
            }
            self.forward_node(n, true, &consumers);
        }
        self.node = NO_NODE;
        for buf in std::mem::take(&mut self.cache_refs) {
            self.release(buf);
        }
        for p in 0..self.param_cast.len() {
            self.param_cast[p] = None;
        }
        self.phase = phase;
        self.recomputing = false;
    }

    fn optimizer_step(&mut self, create_state: bool) {
        self.phase = Phase::Optimizer;
        self.node = NO_NODE;
        let g = self.g;
        let pd = self.prec.param_dtype();
        let opt = self.cfg.optimizer;
        if create_state {
            for p in &g.params {
                let bytes = p.elems * pd.size();
                match opt {
                    Optimizer::Sgd => {}
                    Optimizer::SgdMomentum => {
                        self.alloc(0, bytes, Category::OptimizerState, 1);
                    }
                    Optimizer::Adam | Optimizer::AdamW => {
                        for _ in 0..2 {
                            self.alloc(0, bytes, Category::OptimizerState, 1);
                        }
                    }
                    Optimizer::Adafactor => {
                        let parts: Vec<u64> = match p.matrix {
                            Some((r, c)) => vec![p.elems / c, p.elems / r],
                            None => vec![p.elems],
                        };
                        for e in parts {
                            self.alloc(0, e * pd.size(), Category::OptimizerState, 1);
                        }
                    }
                    Optimizer::Adam8bit => {
                        // Two uint8 states plus one fp32 absmax per 2048-element block each;
                        // bitsandbytes keeps tensors under 4096 elements in 32-bit.
                        let per = if p.elems < 4096 {
                            8 * p.elems
                        } else {
                            2 * p.elems + 2 * 4 * p.elems.div_ceil(2048)
                        };
                        self.alloc(0, per, Category::OptimizerState, 1);
                    }
                }
            }
        }
        // foreach temporaries.
        let mut temps = Vec::new();
        match opt {
            Optimizer::Adam | Optimizer::AdamW => {
                for p in &g.params {
                    temps.push(self.alloc(0, p.elems * pd.size(), Category::Transient, 1));
                }
            }
            Optimizer::Adafactor => {
                // Matrices: `row_var @ col_var` estimates (one per matrix) at once;
                // vectors: grads² then clones of the variances.
                for p in g.params.iter().filter(|p| p.matrix.is_some()) {
                    temps.push(self.alloc(0, p.elems * pd.size(), Category::Transient, 1));
                }
                for b in std::mem::take(&mut temps) {
                    self.release(b);
                }
                for p in g.params.iter().filter(|p| p.matrix.is_none()) {
                    temps.push(self.alloc(0, p.elems * pd.size(), Category::Transient, 1));
                }
            }
            _ => {}
        }
        for b in temps {
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
        let micros = self.cfg.accum.min(2) as u16;
        for m in 0..micros {
            self.micro_step(m);
        }
        self.optimizer_step(create_state);
    }
}

impl Events {
    /// Checks that every buffer is allocated once and freed at most once, after its
    /// allocation (a simulation bug otherwise); `g` is the graph the events came from
    /// (for the node names in the message).
    pub fn check(&self, g: &Graph) -> Result<(), String> {
        let mut state = vec![0u8; self.buffers.len()];
        for (i, e) in self.events.iter().enumerate() {
            let s = &mut state[e.buffer as usize];
            match (e.alloc, *s) {
                (true, 0) => *s = 1,
                (false, 1) => *s = 2,
                _ => {
                    return Err(format!(
                        "event {i}: buffer {} {} in state {s} (node {})",
                        e.buffer,
                        if e.alloc { "allocated" } else { "freed" },
                        g.nodes.get(e.node as usize).map_or("-", |n| g.name(n))
                    ));
                }
            }
        }
        Ok(())
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
        let r = rule(g, node, &ins, prec, checkpointing);
        dtypes[node.output] = if g.tensors[node.output].elem == Elem::Int64 {
            DType::I64
        } else {
            r.out_dtype
        };
        rules.push(r);
    }
    (dtypes, rules)
}

/// Generates the events for `g` under `cfg` (the batch size is not used here).
pub fn generate(g: &Graph, cfg: &TrainConfig, k: &Constants) -> Events {
    let (dtypes, rules) = annotate(g, cfg.precision, cfg.checkpointing);
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
    let mut requires_grad = vec![false; g.tensors.len()];
    for node in &g.nodes {
        let rg = !node.params.is_empty() || node.inputs.iter().any(|&t| requires_grad[t]);
        requires_grad[node.output] = rg && g.tensors[node.output].elem == Elem::Float;
    }
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
        buffers: Vec::with_capacity(expected_events),
        events: Vec::with_capacity(expected_events),
        refs: Vec::with_capacity(expected_events),
        phase: Phase::Setup,
        micro: 0,
        node: NO_NODE,
        tbuf: vec![None; g.tensors.len()],
        dtypes: &dtypes,
        rules: &rules,
        consumers: &consumers,
        requires_grad: &requires_grad,
        saved: vec![0..0; g.nodes.len()],
        saved_bufs: Vec::new(),
        input_bufs: Vec::new(),
        temps: Vec::new(),
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
        model_output: g.nodes.last().and_then(|n| n.inputs.first().copied()),
        recomputing: false,
    };
    let pd = cfg.precision.param_dtype();
    for p in &g.params {
        sim.alloc(0, p.elems * pd.size(), Category::Parameters, 1);
    }
    sim.step(true);
    // cuBLAS workspace: created with the first matmul, kept for the process.
    sim.phase = Phase::Setup;
    for &w in k.workspaces.iter().filter(|&&w| w > 0) {
        sim.alloc(0, w, Category::Transient, 1);
    }
    let measured_start = sim.events.len();
    sim.step(false);
    Events {
        buffers: sim.buffers,
        events: sim.events,
        measured_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::families::transformer::AttnImpl;
    use crate::model::preset::builtin_presets;
    use crate::plan::config::{Attention, LoopShape, Optimizer, Precision};

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
                        let ev = generate(&g, &cfg, &Constants::default());
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
        let ev = generate(&g, &TrainConfig::default(), &Constants::default());
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
            let ev = generate(&g, &cfg, &Constants::default());
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
            let ev = generate(&g, &cfg, &Constants::default());
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
        let ev = generate(&g, &cfg, &Constants::default());
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
}
