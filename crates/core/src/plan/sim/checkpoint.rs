//! Activation checkpointing (`torch.utils.checkpoint`, one per block): which buffers a
//! checkpoint keeps for the recomputation, and the recomputation itself (the block's forward
//! again, saving for backward this time) before the block's backward.
//!
//! Reentrant (`use_reentrant=True`, torch's `CheckpointFunction`): forward under `no_grad`
//! saves the block's tensor inputs (as the non-reentrant one does); its backward detaches
//! them, re-runs the whole block under `enable_grad`, and calls `torch.autograd.backward`
//! on the recomputed outputs while its locals still hold those outputs and the incoming
//! output gradients: both stay alive until the block's inner backward ends.

use super::state::{NO_NODE, Sim};

impl Sim<'_> {
    pub(super) fn in_ckpt_block(&self, n: usize) -> bool {
        self.ckpt && self.g.nodes[n].block.is_some()
    }

    fn block_nodes(&self, b: u32) -> std::ops::Range<usize> {
        self.blocks.nodes(b)
    }

    pub(super) fn block_external_inputs(&self, b: u32) -> Vec<u32> {
        let range = self.block_nodes(b);
        let mut out = Vec::new();
        for n in range {
            for &t in &self.g.nodes[n].inputs {
                if !self.blocks.produced_inside(b, t)
                    && let Some(buf) = self.tbuf[t]
                    && !out.contains(&buf)
                {
                    out.push(buf);
                }
            }
        }
        out
    }

    /// Tensors made in block `b` and read after it (the block's outputs).
    fn block_outputs(&self, b: u32) -> Vec<usize> {
        let range = self.block_nodes(b);
        let nodes = &self.g.nodes;
        range
            .clone()
            .map(|n| nodes[n].output)
            .filter(|&t| self.blocks.read_outside(t, &range))
            .collect()
    }

    pub(super) fn recompute_block(&mut self, b: u32) {
        let range = self.block_nodes(b);
        // The block's own consumer counts, in a scratch list that is all zeros between
        // recomputations (the entries set here are reset at the end).
        let mut consumers = std::mem::take(&mut self.ckpt_consumers);
        consumers.resize(self.g.tensors.len(), 0);
        for n in range.clone() {
            for &t in &self.g.nodes[n].inputs {
                consumers[t] += 1;
            }
            for h in self.holds_at(n) {
                consumers[h.tensor] += 1;
            }
        }
        let outputs = if self.reentrant {
            self.block_outputs(b)
        } else {
            Vec::new()
        };
        for &t in &outputs {
            // Held by `CheckpointFunction.backward`'s `outputs`.
            consumers[t] += 1;
            // The incoming gradient (`*args`), held until the inner backward returns.
            if let Some(gb) = self.gbuf[t] {
                self.retain(gb);
                self.reentrant_held.push(gb);
            }
        }
        let phase = self.phase;
        self.recomputing = true;
        for n in range.clone() {
            // Inputs from outside the block are held by the checkpoint: give the
            // consumers' releases something to release.
            let g = self.g;
            let held = self.holds_at(n).iter().map(|h| h.tensor);
            for t in g.nodes[n].inputs.iter().copied().chain(held) {
                if !self.blocks.produced_inside(b, t)
                    && let Some(buf) = self.tbuf[t]
                {
                    self.retain(buf);
                }
            }
            self.ds_fetch(n);
            self.forward_node(n, true, &consumers);
            self.ds_release(n);
        }
        self.node = NO_NODE;
        for &t in &outputs {
            if let Some(buf) = self.tbuf[t].take() {
                self.reentrant_held.push(buf);
            }
        }
        for buf in std::mem::take(&mut self.cache_refs) {
            self.release(buf);
        }
        for p in 0..self.param_cast.len() {
            self.param_cast[p] = None;
        }
        self.phase = phase;
        self.recomputing = false;
        for n in range {
            for &t in &self.g.nodes[n].inputs {
                consumers[t] = 0;
            }
            for h in self.holds_at(n) {
                consumers[h.tensor] = 0;
            }
        }
        for &t in &outputs {
            consumers[t] = 0;
        }
        self.ckpt_consumers = consumers;
    }

    /// Before the backward of node `n`: the output of a hooked embedding lookup over a
    /// frozen table is a leaf that requires grad, so its gradient is accumulated into its
    /// `.grad` and kept until the step's graph is dropped (after backward).
    pub(super) fn keep_input_grad(&mut self, n: usize) {
        if !self.input_grad_nodes.contains(&n) {
            return;
        }
        let node = &self.g.nodes[n];
        if self.trains(node) {
            return;
        }
        if let Some(gb) = self.gbuf[node.output] {
            self.retain(gb);
            self.pinned.push(gb);
        }
    }

    /// The end of a block's backward: a reentrant checkpoint's backward returns and drops
    /// what it held.
    pub(super) fn release_reentrant_held(&mut self) {
        for buf in std::mem::take(&mut self.reentrant_held) {
            self.release(buf);
        }
    }
}
