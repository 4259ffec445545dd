//! An evaluation step after training (see [`crate::plan::step_kind`]): one forward and the
//! loss in `model.eval()`, with autograd off (`torch.no_grad()`) or on, then `del out, loss`.

use super::{NO_NODE, Sim};
use crate::model::ir::{Graph, Op};
use crate::plan::config::TrainConfig;
use crate::plan::events::Phase;
use crate::plan::rules::Rule;

/// A node's part in an evaluation forward with merged adapters (peft's `merge_and_unload`:
/// each adapted layer is its base layer again, the adapter folded into the base weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Merged {
    /// Runs as planned (not an adapter op).
    Run,
    /// An adapter op: does not run.
    Skip,
    /// The adapter op that wrote the layer's result: the result is the base layer's output
    /// (this tensor).
    Base(usize),
}

/// The suffixes `finetune.rs` names adapter ops with.
const ADAPTER_OPS: [&str; 8] = [
    ".lora_cast",
    ".lora_dropout",
    ".lora_A",
    ".lora_B",
    ".lora_scaling",
    ".base_clone",
    ".lora_add",
    ".lora_to",
];

/// Each node's [`Merged`] role under `cfg` (empty unless an evaluation step with merged
/// adapters is planned).
pub(super) fn merged_roles(g: &Graph, cfg: &TrainConfig) -> Vec<Merged> {
    if !(cfg.step.is_eval() && cfg.finetune.lora_merged && cfg.finetune.mode.has_adapters()) {
        return Vec::new();
    }
    let adapter: Vec<bool> = g
        .nodes
        .iter()
        .map(|n| {
            let name = g.name(n);
            ADAPTER_OPS.iter().any(|s| name.ends_with(s))
        })
        .collect();
    let mut producer = vec![None; g.tensors.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        producer[n.output] = Some(i);
    }
    let mut read_by_adapter = vec![false; g.tensors.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if adapter[i] {
            for &t in n.inputs.iter() {
                read_by_adapter[t] = true;
            }
        }
    }
    g.nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if !adapter[i] {
                return Merged::Run;
            }
            if read_by_adapter[n.output] {
                return Merged::Skip;
            }
            // The layer's result: back along the first inputs to the base layer's output.
            let mut t = n.inputs.first().copied().unwrap_or(n.output);
            while let Some(p) = producer[t].filter(|&p| adapter[p]) {
                t = g.nodes[p].inputs.first().copied().unwrap_or(t);
                if producer[t] == Some(p) {
                    break;
                }
            }
            Merged::Base(t)
        })
        .collect()
}

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
    }
}
