//! Evaluation with merged adapters (peft's `merge_and_unload`): each node's part in the
//! forward, computed once per generation and held by the simulation state.

use crate::model::ir::Graph;
use crate::plan::config::TrainConfig;

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
