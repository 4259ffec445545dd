//! An evaluation step after training (see [`crate::plan::step_kind`]): one forward and the
//! loss in `model.eval()`, with autograd off (`torch.no_grad()`) or on, then `del out, loss`.

use super::{NO_NODE, Sim};
use crate::model::ir::{Graph, Op};
use crate::plan::events::Phase;
use crate::plan::rules::Rule;

/// The rules of `model.eval()`: dropout returns its input (`F.dropout(x, p, training=False)`
/// is `x`), allocating nothing and saving no mask.
pub(super) fn eval_rules(g: &Graph, train: &[Rule]) -> Vec<Rule> {
    let mut rules = train.to_vec();
    for (node, r) in g.nodes.iter().zip(rules.iter_mut()) {
        if matches!(node.op, Op::Dropout { .. }) {
            r.alias = true;
            r.extras.clear();
            r.saves_inputs.clear();
            r.saves_output = false;
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
            self.forward_node(n, grad, consumers);
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
}
