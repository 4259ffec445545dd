//! What activation checkpointing asks of the graph, computed once per generation and held
//! by the simulation state: the blocks it recomputes (each one's nodes, what they output, who
//! reads it) and the input-embedding lookups `enable_input_require_grads` hooks.

use crate::model::ir::{Graph, Op};
use crate::plan::config::TrainConfig;

/// The nodes `model.enable_input_require_grads()` hooks under checkpointing: every lookup
/// of the input embedding (`get_input_embeddings()`, the first embedding table; an
/// encoder-decoder looks it up twice). transformers 5.17's `gradient_checkpointing_enable`
/// calls it for every `input_ids` model whether reentrant or not (`modeling_utils.py`:
/// `needs_embedding_grads = self.main_input_name == "input_ids"`), and peft's
/// `prepare_model_for_kbit_training` too; without it a reentrant checkpoint over a frozen
/// base passes no gradient to the adapters. Over a frozen embedding it makes the first
/// block's input gradient computed (LoRA / QLoRA rows: allocated median 0.41 → 0.37 % and
/// 0.83 → 0.64 %). Empty without checkpointing.
pub(super) fn input_embeddings(g: &Graph, cfg: &TrainConfig) -> Vec<usize> {
    if !cfg.checkpointing {
        return Vec::new();
    }
    let Some(table) = g
        .nodes
        .iter()
        .find(|n| n.op == Op::Embedding)
        .and_then(|n| n.params.first().copied())
    else {
        return Vec::new();
    };
    g.nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.op == Op::Embedding && n.params.contains(&table))
        .map(|(i, _)| i)
        .collect()
}

/// What checkpointing asks of the graph's blocks, computed once per generation (it asked
/// by scanning the whole graph for every block, and every block's nodes for every input).
#[derive(Debug, Default)]
pub(super) struct Blocks {
    /// Per block: from its first node to past its last (what a scan for the block's nodes
    /// found; empty at 0 for a block without nodes).
    pub(super) ranges: Vec<std::ops::Range<usize>>,
    /// Per block: the tensors the nodes of its range output, sorted.
    pub(super) outputs: Vec<Vec<usize>>,
    /// Per tensor: the first and last node that reads it (`None`: no node does).
    pub(super) readers: Vec<Option<(usize, usize)>>,
}

impl Blocks {
    /// The blocks of `g` (none without checkpointing, which is what asks).
    pub(super) fn new(g: &Graph, checkpointing: bool) -> Blocks {
        if !checkpointing {
            return Blocks::default();
        }
        let count = g.block_count() as usize;
        let mut first: Vec<Option<usize>> = vec![None; count];
        let mut last = vec![0usize; count];
        let mut readers: Vec<Option<(usize, usize)>> = vec![None; g.tensors.len()];
        for (n, node) in g.nodes.iter().enumerate() {
            if let Some(b) = node.block {
                let b = b as usize;
                first[b].get_or_insert(n);
                last[b] = n;
            }
            for &t in &node.inputs {
                let r = readers[t].get_or_insert((n, n));
                r.1 = n;
            }
        }
        let ranges: Vec<_> = first
            .iter()
            .zip(&last)
            .map(|(f, &l)| f.map_or(0..0, |f| f..l + 1))
            .collect();
        let outputs = ranges
            .iter()
            .map(|r| {
                let mut o: Vec<usize> = g.nodes[r.clone()].iter().map(|m| m.output).collect();
                o.sort_unstable();
                o
            })
            .collect();
        Blocks {
            ranges,
            outputs,
            readers,
        }
    }

    /// The nodes of block `b`: from its first node to past its last.
    pub(super) fn nodes(&self, b: u32) -> std::ops::Range<usize> {
        self.ranges.get(b as usize).cloned().unwrap_or(0..0)
    }

    /// Whether some node of block `b`'s range outputs tensor `t`.
    pub(super) fn produced_inside(&self, b: u32, t: usize) -> bool {
        self.outputs
            .get(b as usize)
            .is_some_and(|o| o.binary_search(&t).is_ok())
    }

    /// Whether some node outside `range` reads tensor `t`.
    pub(super) fn read_outside(&self, t: usize, range: &std::ops::Range<usize>) -> bool {
        self.readers
            .get(t)
            .copied()
            .flatten()
            .is_some_and(|(lo, hi)| lo < range.start || hi >= range.end)
    }
}

#[cfg(test)]
mod tests {
    use crate::model::families::transformer::AttnImpl;
    use crate::model::preset::builtin_presets;
    use crate::plan::config::TrainConfig;

    /// transformers hooks the embedding output under either checkpointing, never without;
    /// GPT-2 looks `wte` up once.
    #[test]
    fn the_input_embedding_is_hooked_under_checkpointing_only() {
        let gpt2 = builtin_presets()
            .expect("presets")
            .into_iter()
            .find(|p| p.id == "gpt2")
            .expect("gpt2");
        let g = gpt2.build(128, AttnImpl::Sdpa).expect("graph");
        let cfg = |checkpointing, checkpoint_reentrant| TrainConfig {
            checkpointing,
            checkpoint_reentrant,
            ..TrainConfig::default()
        };
        assert!(super::input_embeddings(&g, &cfg(false, false)).is_empty());
        for reentrant in [false, true] {
            let hooked = super::input_embeddings(&g, &cfg(true, reentrant));
            assert_eq!(hooked.len(), 1, "GPT-2 looks wte up once: {hooked:?}");
        }
    }
}
