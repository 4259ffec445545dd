//! An evaluation step after training (see [`crate::plan::step_kind`]): one forward and the
//! loss in `model.eval()`, with autograd off (`torch.no_grad()`) or on, then `del out, loss`.

use super::merged::Merged;
use super::state::{NO_NODE, Sim};
use crate::model::ir::{Graph, Op};
use crate::plan::events::Phase;
use crate::plan::rules::Rule;
use crate::plan::sdpa_math::{MathShape, math_path};

/// The rules of `model.eval()`: dropout returns its input (`F.dropout(x, p, training=False)`
/// is `x`), allocating nothing and saving no mask; attention is called with `dropout=0.0`
/// (SDPA's math path then runs no `native_dropout`).
pub(super) fn eval_rules(g: &Graph, train: &[Rule]) -> Vec<Rule> {
    let mut rules = train.to_vec();
    for (node, r) in g.nodes.iter().zip(rules.iter_mut()) {
        if matches!(node.op, Op::Dropout { .. }) {
            r.alias = true;
            r.extras.clear();
            r.order.clear();
            r.saves_inputs.clear();
            r.saves_output = false;
        }
        if let Some(steps) = &mut r.steps
            && steps.shape.dropout > 0.0
        {
            **steps = math_path(MathShape {
                dropout: 0.0,
                ..steps.shape
            });
        }
    }
    rules
}

impl Sim<'_> {
    /// One evaluation forward. With `grad`, every op saves what its backward would need
    /// (autograd's graph hangs off the loss) until the loss and output are dropped; without,
    /// nothing is saved and activations die as soon as their last reader has run.
    /// Gradient checkpointing is off: Hugging Face models checkpoint only in training mode.
    pub(super) fn eval_step(&mut self, grad: bool) {
        let g = self.g;
        self.micro = 0;
        self.phase = Phase::Forward;
        self.ckpt = false;
        let consumers = self.consumers;
        for n in 0..g.nodes.len() {
            match self.merged.get(n).copied().unwrap_or(Merged::Run) {
                Merged::Run => self.forward_node(n, grad, consumers),
                role => self.merged_adapter_node(n, role),
            }
        }
        self.node = NO_NODE;
        // Autocast exits: its weight cache goes (casts the graph saved stay referenced).
        for b in std::mem::take(&mut self.cache_refs) {
            self.release(b);
        }
        for p in 0..self.param_cast.len() {
            self.param_cast[p] = None;
        }
        // `del out, loss` (an evaluation loop keeps the output for its metrics until here,
        // whichever training-loop shape is planned): the graph dies with them.
        for b in std::mem::take(&mut self.output_refs) {
            self.release(b);
        }
        for b in std::mem::take(&mut self.pinned) {
            self.release(b);
        }
        for n in 0..g.nodes.len() {
            self.release_saved(n);
        }
        self.saved_bufs.clear();
    }

    /// An adapter op of a merged layer: allocates nothing; the layer's result is the base
    /// layer's output buffer; the op's inputs lose the reader it was.
    fn merged_adapter_node(&mut self, n: usize, role: Merged) {
        self.node = n as u32;
        let node = &self.g.nodes[n];
        // (The training step left this tensor's old, freed buffer here.)
        self.tbuf[node.output] = None;
        for &t in node.inputs.iter() {
            // A base layer's output is handed to the result below, not released by the
            // adapter ops that read it.
            let is_base = self.merged.contains(&Merged::Base(t));
            if !is_base && let Some(b) = self.tbuf[t] {
                self.release(b);
            }
        }
        if let Merged::Base(base) = role
            && let Some(b) = self.tbuf[base]
        {
            self.refs[b as usize] += self.consumers[node.output];
            self.tbuf[node.output] = Some(b);
            // The adapter ops were all of the base output's readers.
            for _ in 0..self.consumers[base] {
                self.release(b);
            }
        }
        self.release_holds(n);
    }
}
