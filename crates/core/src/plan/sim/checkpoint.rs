//! Activation checkpointing (`torch.utils.checkpoint`, non-reentrant, one per block):
//! which buffers a checkpoint keeps for the recomputation, and the recomputation itself
//! (the block's forward again, saving for backward this time) before the block's backward.

use super::{NO_NODE, Sim};

impl Sim<'_> {
    pub(super) fn in_ckpt_block(&self, n: usize) -> bool {
        self.ckpt && self.g.nodes[n].block.is_some()
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

    pub(super) fn block_external_inputs(&self, b: u32) -> Vec<u32> {
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

    pub(super) fn recompute_block(&mut self, b: u32) {
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
}
