//! The autograd walk of one micro-step: each node's forward (autocast casts, the weight
//! cache, its output, what it saves for backward, its temporaries), then the backward in
//! reverse order (input and parameter gradients, accumulation, workspaces). What an op
//! does is its [`Rule`]; this file only follows the rules.

use std::ops::Range;

use super::state::{NO_NODE, Sim};
use crate::model::ir::{Elem, Op};
use crate::plan::config::LoopShape;
use crate::plan::events::{Category, Phase};
use crate::plan::rules::{Act, GradFlow, ORDERED_EXTRAS, Rule, SavedFor, saved_for};

impl Sim<'_> {
    /// Forward of node `n`. `recompute`: re-run inside a checkpointed backward.
    pub(super) fn forward_node(&mut self, n: usize, keep_saves: bool, consumers: &[u32]) {
        self.node = n as u32;
        let g = self.g;
        let node = &g.nodes[n];
        let rules = self.rules;
        let r = &rules[n];
        let out = node.output;
        // An op none of whose gradients is computed saves nothing.
        let keep_saves = keep_saves && self.requires_grad[out];
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
        // Frozen weights are not cached by autocast (it caches leaves that require grad):
        // their casts are fresh tensors, kept only while saved.
        let mut uncached = std::mem::take(&mut self.uncached);
        uncached.clear();
        if r.casts_params {
            for &p in &node.params {
                let b = match self.param_cast[p] {
                    Some(b) => b,
                    None if !self.policy.trainable(p) => {
                        let bytes = g.params[p].elems * self.prec.compute_dtype().size();
                        let b = self.alloc(0, bytes, Category::WeightCasts, 1);
                        uncached.push(b);
                        b
                    }
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
        // An op in Python's order: the extras before its output (the ones after it are
        // released with the temporaries below).
        let after_output = self.ordered_before_output(r, keep_saves);
        // Output (an op given by steps allocates it among them).
        let in0 = input_bufs.first().copied().flatten();
        let out_buf = match &r.steps {
            Some(steps) => self.forward_steps(n, steps, keep_saves, |s| {
                s.output_buffer(r, out, in0, consumers)
            }),
            None => self.output_buffer(r, out, in0, consumers),
        };
        self.tbuf[out] = out_buf;
        // The model output (`out`) stays referenced until `del out` after backward.
        if Some(out) == self.model_output
            && !self.recomputing
            && let Some(b) = out_buf
        {
            self.hold_in_output(b);
        }
        // Saved tensors and extras (an ordered op's extras are saved already, with their own
        // reference).
        let retain_from = self.saved_bufs.len();
        if keep_saves {
            self.push_saves(n, &input_bufs, out_buf, first_weight_cast);
        }
        for i in retain_from..self.saved_bufs.len() {
            self.retain(self.saved_bufs[i]);
        }
        for &b in &uncached {
            self.release(b);
        }
        self.uncached = uncached;
        // An output nobody reads or saves (a recomputed block's result) dies at once.
        if let Some(b) = out_buf
            && !r.alias
            && self.refs[b as usize] == 0
        {
            self.free(b);
            self.tbuf[out] = None;
        }
        self.ordered_after_output(r, after_output, keep_saves, &mut temps);
        if r.order.is_empty() {
            for e in &r.extras {
                if let Some(b) = self.extra_buffer(e, keep_saves)
                    && !self.keeps(e, keep_saves)
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
        self.release_holds(n);
        if let Some(b) = out_buf {
            if matches!(node.op, Op::Input) {
                self.retain(b);
                self.pinned.push(b);
            } else if matches!(node.op, Op::CacheAppend) && !r.alias {
                self.hold_in_output(b);
            }
        }
    }

    /// The buffer of an op's output tensor `out`: input 0's (`in0`) for an alias, else a new
    /// one its readers hold.
    fn output_buffer(
        &mut self,
        r: &Rule,
        out: usize,
        in0: Option<u32>,
        consumers: &[u32],
    ) -> Option<u32> {
        let t = &self.g.tensors[out];
        if r.alias {
            if let Some(b) = in0 {
                self.refs[b as usize] += consumers[out];
            }
            in0
        } else if t.per_sample == 0 && t.fixed == 0 {
            None
        } else {
            let (ps, fx) = self.tensor_bytes(out, r.out_dtype);
            let b = self.new_buffer(ps, fx, Category::Activations);
            self.refs[b as usize] = consumers[out];
            Some(b)
        }
    }

    /// The actions of [`Rule::order`] before the op's output: its extras allocated and released
    /// as Python does, their buffers kept in [`Sim::ordered`]. Returns the range of the
    /// actions after the output (empty when the rule has no order), for
    /// [`Sim::ordered_after_output`].
    fn ordered_before_output(&mut self, r: &Rule, keep_saves: bool) -> Range<usize> {
        if r.order.is_empty() {
            return 0..0;
        }
        let mut bufs = [None; ORDERED_EXTRAS];
        debug_assert!(r.extras.len() <= ORDERED_EXTRAS);
        let out_at = r
            .order
            .iter()
            .position(|a| *a == Act::Output)
            .unwrap_or(r.order.len());
        for a in &r.order[..out_at] {
            match *a {
                Act::Alloc(i) => {
                    bufs[i as usize] = self.extra_buffer(&r.extras[i as usize], keep_saves);
                }
                Act::Release(i) => {
                    if !self.keeps(&r.extras[i as usize], keep_saves)
                        && let Some(b) = bufs[i as usize].take()
                    {
                        self.release(b);
                    }
                }
                Act::Output => {}
            }
        }
        self.ordered = bufs;
        (out_at + 1).min(r.order.len())..r.order.len()
    }

    /// The releases of [`Rule::order`] after the op's output (`after`): the extras autograd
    /// does not keep join `temps`, freed once the output exists.
    fn ordered_after_output(
        &mut self,
        r: &Rule,
        after: Range<usize>,
        keep_saves: bool,
        temps: &mut Vec<u32>,
    ) {
        for a in &r.order[after] {
            if let Act::Release(i) = *a
                && !self.keeps(&r.extras[i as usize], keep_saves)
                && let Some(b) = self.ordered[i as usize].take()
            {
                temps.push(b);
            }
        }
    }

    /// The tensors a module's frame held until its last op, node `n`, has run
    /// ([`crate::model::ir::Hold`]).
    pub(super) fn release_holds(&mut self, n: usize) {
        for h in self.holds_at(n) {
            if let Some(b) = self.tbuf[h.tensor] {
                self.release(b);
            }
        }
    }

    /// Pushes what node `n` saves for backward onto `saved_bufs` (retained by the caller):
    /// each saved input only when the gradient it serves is computed.
    fn push_saves(
        &mut self,
        n: usize,
        input_bufs: &[Option<u32>],
        out_buf: Option<u32>,
        first_weight_cast: Option<u32>,
    ) {
        let g = self.g;
        let node = &g.nodes[n];
        let rules = self.rules;
        let r = &rules[n];
        for &i in &r.saves_inputs {
            let needed = match saved_for(node, i) {
                SavedFor::Output => true,
                SavedFor::Params => self.trains(node),
                SavedFor::Input(j) => node.inputs.get(j).is_some_and(|&t| self.requires_grad[t]),
            };
            if !needed {
                continue;
            }
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

    pub(super) fn grad_for(&mut self, t: usize, b: u32) {
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

    fn backward_node(&mut self, n: usize, first_micro: bool) {
        self.node = n as u32;
        let g = self.g;
        let node = &g.nodes[n];
        let rules = self.rules;
        let r = &rules[n];
        let gout = self.gbuf[node.output].take();
        let has_grad_path = gout.is_some() || matches!(node.op, Op::Input);
        let is_loss = r.grad == GradFlow::Loss;
        if r.grad == GradFlow::Chunk {
            self.chunk_backward(n, gout);
        } else if (has_grad_path || is_loss) && !matches!(node.op, Op::Input) {
            if r.grad == GradFlow::Alias {
                if let (Some(go), Some(&t)) = (gout, node.inputs.first()) {
                    if self.requires_grad[t] {
                        self.grad_for(t, go);
                    } else {
                        self.release(go);
                    }
                }
            } else if r.grad == GradFlow::PassThrough {
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
            } else if let Some(steps) = &r.steps {
                self.backward_steps(n, steps, gout);
            } else {
                // The generated backward computes its inputs' gradients in the sorted
                // order of their names in derivatives.yaml (`load_derivatives.py`:
                // `sorted(defn.keys())`): `mm`'s `mat2` (a bias-free linear layer's weight)
                // before `self`, `addmm`'s `mat1` (the input) before `mat2` and `self`.
                if matches!(node.op, Op::Linear { .. }) && node.params.len() == 1 {
                    self.emit_param_grads(n, r, first_micro);
                    self.emit_input_grads(n, r, is_loss);
                } else {
                    self.emit_input_grads(n, r, is_loss);
                    self.emit_param_grads(n, r, first_micro);
                }
                if r.bwd_transient > 0 || r.bwd_fixed > 0 {
                    let b = self.alloc(
                        r.bwd_transient * r.out_dtype.size(),
                        r.bwd_fixed,
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

    /// A `torch.chunk` output's backward: its gradient waits; at the first chunk of the
    /// input (the last one backward reaches) autograd's split node concatenates the waiting
    /// gradients into one new gradient of the whole input and frees them.
    fn chunk_backward(&mut self, n: usize, gout: Option<u32>) {
        let g = self.g;
        let Some(&base) = g.nodes[n].inputs.first() else {
            if let Some(go) = gout {
                self.release(go);
            }
            return;
        };
        if let Some(go) = gout {
            self.chunk_grads.push((base, go));
        }
        let first = !g.nodes[..n]
            .iter()
            .any(|m| m.op == Op::Chunk && m.inputs.first() == Some(&base));
        if !first {
            return;
        }
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.chunk_grads)
            .into_iter()
            .partition(|&(t, _)| t == base);
        self.chunk_grads = rest;
        if mine.is_empty() {
            return;
        }
        if self.requires_grad[base] {
            let (ps, fx) = self.tensor_bytes(base, self.dtypes[base]);
            let whole = self.alloc(ps, fx, Category::Transient, 1);
            for (_, b) in mine {
                self.release(b);
            }
            self.grad_for(base, whole);
        } else {
            for (_, b) in mine {
                self.release(b);
            }
        }
    }

    /// Drops what node `n` saved for its backward.
    pub(super) fn release_saved(&mut self, n: usize) {
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
        let fused_parts = r.fused_qkv_grad;
        // `bmm` / `mm` of two activations: `mat2`'s gradient first (the sorted order of
        // derivatives.yaml's names, see `backward_node`).
        let last_first = matches!(node.op, Op::Matmul { .. });
        let count = node.inputs.len();
        for k in 0..count {
            let i = if last_first { count - 1 - k } else { k };
            let t = node.inputs[i];
            if !self.requires_grad[t] || g.tensors[t].elem != Elem::Float {
                continue;
            }
            // `x.to(other.dtype)` reads `other` for its dtype only; an input read twice
            // takes one gradient.
            if node.inputs.iter().position(|&u| u == t) != Some(i)
                || (i > 0 && matches!(node.op, Op::TypeAs))
            {
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

    fn emit_param_grads(&mut self, n: usize, r: &Rule, first_micro: bool) {
        let g = self.g;
        let node = &g.nodes[n];
        // Frozen parameters take no gradient kernel (and no weight-gradient workspace).
        let trainable = node.params.iter().filter(|&&p| self.policy.trainable(p));
        for (k, &p) in trainable.enumerate() {
            let bytes = if self.dist.units {
                // FSDP2 / ZeRO-3: autograd writes the unsharded gradient.
                self.unsharded_grad_bytes(p)
            } else if self.dist.grads_in_buckets {
                // DDP bucket views: no gradient of its own.
                0
            } else {
                self.policy.bytes(p, g.params[p].elems)
            };
            // The unit's post-backward takes the unsharded gradients of every micro-step;
            // DeepSpeed's epilogue leaves no `.grad` between micro-steps.
            let first_micro = first_micro || self.dist.units || self.dist.zero.is_some();
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
            // DeepSpeed's gradient hook, once the gradient of this backward is complete.
            if self.param_uses[p] <= 1 || self.param_seen[p] == 0 {
                self.ds_grad_ready(p);
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

    /// FSDP2 / ZeRO-3 forward hooks around node `n`: the root is unsharded when the model
    /// is called, a block before its first op; a block is resharded after its last op when
    /// `reshard_after_forward`.
    fn forward_unit_hooks(&mut self, n: usize, before: bool) {
        let nodes = &self.g.nodes;
        let b = nodes[n].block;
        if before {
            if n == 0 {
                self.unshard(self.dist.root());
            }
            if let Some(b) = b
                && (n == 0 || nodes[n - 1].block != Some(b))
            {
                self.unshard(b as usize);
            }
        } else if let Some(b) = b
            && self.dist.reshard_after(b as usize)
            && (n + 1 == nodes.len() || nodes[n + 1].block != Some(b))
        {
            self.reshard(b as usize);
        }
    }

    pub(super) fn micro_step(&mut self, micro: u16) {
        let g = self.g;
        self.micro = micro;
        self.phase = Phase::Forward;
        let consumers = self.consumers;
        let count = g.nodes.len();
        let mut block_start: Option<u32> = None;
        for n in 0..count {
            if self.stopped {
                return;
            }
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
            if self.dist.units {
                self.forward_unit_hooks(n, true);
            }
            let keep = !self.in_ckpt_block(n);
            if n == 0 {
                self.ds_reset();
            }
            self.ds_fetch(n);
            self.forward_node(n, keep, consumers);
            self.ds_release(n);
            if self.dist.units {
                self.forward_unit_hooks(n, false);
            }
        }
        self.node = NO_NODE;
        // FSDP2: the root's post-forward.
        self.free_all_gather_state();
        // `loss = model(**batch).loss`: the output object dies with the expression.
        if self.cfg.loop_shape != LoopShape::Plain {
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
        // Lightning's closure: `zero_grad` after `training_step`, before `backward` (autocast has exited), at the
        // first micro-batch of an accumulation window.
        if self.cfg.loop_shape == LoopShape::Lightning && micro == 0 {
            let phase = self.phase;
            self.phase = Phase::ZeroGrad;
            self.zero_grad();
            self.phase = phase;
        }
        self.phase = Phase::Backward;
        let first = micro == 0;
        let mut n = count;
        if self.dist.units {
            // The root's pre-backward prefetches the last block.
            let last = g.block_count() as usize;
            self.unshard(last.saturating_sub(1));
        }
        while n > 0 {
            if self.stopped {
                return;
            }
            n -= 1;
            if let Some(b) = g.nodes[n].block
                && (n + 1 == count || g.nodes[n + 1].block != Some(b))
            {
                if self.dist.units {
                    // Pre-backward: this block, and the prefetch of the one before it.
                    self.unshard(b as usize);
                    if b > 0 {
                        self.unshard(b as usize - 1);
                    }
                }
                if self.ckpt {
                    self.recompute_block(b);
                }
            }
            self.keep_input_grad(n);
            self.ds_fetch(n);
            self.backward_node(n, first);
            self.ds_release(n);
            if let Some(b) = g.nodes[n].block
                && (n == 0 || g.nodes[n - 1].block != Some(b))
            {
                if self.ckpt {
                    self.release_reentrant_held();
                    for buf in std::mem::take(&mut self.block_inputs[b as usize]) {
                        self.release(buf);
                    }
                }
                self.post_backward(b as usize);
            }
        }
        self.node = NO_NODE;
        self.finish_backward();
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
}
