//! An op whose rule gives its forward and backward as explicit allocation sequences
//! ([`OpSteps`]: SDPA's math path, [`crate::plan::sdpa_math`]): the events in the steps'
//! order, what autograd keeps decided per step by the gradients the step serves.

use super::state::Sim;
use crate::model::ir::Elem;
use crate::plan::events::Category;
use crate::plan::sdpa_math::{Grads, OpSteps, Size, Step};

/// Slots a sequence may name (`Step`'s `slot` values stay below this).
const SLOTS: usize = 32;

impl Sim<'_> {
    /// Whether node `n` computes one of the gradients `grads` (bits of its input positions;
    /// a single fused input stands for all three).
    fn computes(&self, n: usize, grads: Grads) -> bool {
        let inputs = &self.g.nodes[n].inputs;
        (0..3usize).any(|i| {
            grads & (1 << i) != 0
                && inputs
                    .get(i)
                    .or(inputs.first())
                    .is_some_and(|&t| self.requires_grad[t])
        })
    }

    fn step_buffer(&mut self, size: Size, category: Category) -> Option<u32> {
        (size.per_sample > 0 || size.fixed > 0)
            .then(|| self.alloc(size.per_sample, size.fixed, category, 1))
    }

    /// The forward of node `n` by its steps; `output` allocates the op's output at the
    /// `Output` step. Saved tensors are pushed onto `saved_bufs` (their one reference is
    /// autograd's); the others are released at their `Free` step, or at the end.
    pub(super) fn forward_steps(
        &mut self,
        n: usize,
        steps: &OpSteps,
        keep_saves: bool,
        output: impl FnOnce(&mut Self) -> Option<u32>,
    ) -> Option<u32> {
        let mut slot: [Option<u32>; SLOTS] = [None; SLOTS];
        let mut kept = [false; SLOTS];
        let mut output = Some(output);
        let mut out_buf = None;
        for step in &steps.forward {
            match *step {
                Step::Temp { slot: s, size } => {
                    slot[s as usize] = self.step_buffer(size, Category::Transient);
                }
                Step::Saved {
                    slot: s,
                    size,
                    for_grads,
                } => {
                    let s = s as usize;
                    if keep_saves && self.computes(n, for_grads) {
                        slot[s] = self.step_buffer(size, Category::Activations);
                        if let Some(b) = slot[s] {
                            self.saved_bufs.push(b);
                            kept[s] = true;
                        }
                    } else {
                        slot[s] = self.step_buffer(size, Category::Transient);
                    }
                }
                Step::Free(s) => {
                    if !kept[s as usize]
                        && let Some(b) = slot[s as usize].take()
                    {
                        self.release(b);
                    }
                }
                Step::Output => {
                    if let Some(f) = output.take() {
                        out_buf = f(self);
                    }
                }
                Step::Grad { .. }
                | Step::ReleaseSaved(_)
                | Step::ReleaseGradOut
                | Step::InputGrad { .. } => {}
            }
        }
        for s in 0..SLOTS {
            if !kept[s]
                && let Some(b) = slot[s].take()
            {
                self.release(b);
            }
        }
        out_buf
    }

    /// The backward of node `n` by its steps, `gout` its output's gradient. What the forward
    /// saved is released where the steps say (the rest at the end); a single fused input
    /// gets its gradient as one new tensor the parts are copied into (`torch.chunk`'s
    /// backward), as a fused SDPA's does.
    pub(super) fn backward_steps(&mut self, n: usize, steps: &OpSteps, gout: Option<u32>) {
        let range = std::mem::take(&mut self.saved[n]);
        let mut saved: [Option<u32>; SLOTS] = [None; SLOTS];
        let mut next = range.start;
        for step in &steps.forward {
            if let Step::Saved {
                slot: s, for_grads, ..
            } = *step
                && next < range.end
                && self.computes(n, for_grads)
            {
                saved[s as usize] = Some(self.saved_bufs[next]);
                next += 1;
            }
        }
        // Saved buffers the steps do not name (none for the math path) go at the end.
        let unnamed: Vec<u32> = self.saved_bufs[next..range.end].to_vec();
        let mut slot: [Option<u32>; SLOTS] = [None; SLOTS];
        let mut gout = gout;
        let mut parts = Vec::new();
        let g = self.g;
        let inputs = &g.nodes[n].inputs;
        for step in &steps.backward {
            match *step {
                Step::Grad {
                    slot: s,
                    size,
                    when,
                } => {
                    if self.computes(n, when) {
                        slot[s as usize] = self.step_buffer(size, Category::Transient);
                    }
                }
                Step::Free(s) => {
                    if let Some(b) = slot[s as usize].take() {
                        self.release(b);
                    }
                }
                Step::ReleaseSaved(s) => {
                    if let Some(b) = saved[s as usize].take() {
                        self.release(b);
                    }
                }
                Step::ReleaseGradOut => {
                    if let Some(b) = gout.take() {
                        self.release(b);
                    }
                }
                Step::InputGrad { input, slot: s } => {
                    let Some(b) = slot[s as usize].take() else {
                        continue;
                    };
                    let i = input as usize;
                    if inputs.len() == 1 {
                        parts.push(b);
                        continue;
                    }
                    match inputs.get(i) {
                        Some(&t)
                            if self.requires_grad[t]
                                && g.tensors[t].elem == Elem::Float
                                && !inputs[..i].contains(&t) =>
                        {
                            self.grad_for(t, b);
                        }
                        _ => self.release(b),
                    }
                }
                Step::Temp { .. } | Step::Saved { .. } | Step::Output => {}
            }
        }
        if let Some(&t) = inputs.first()
            && !parts.is_empty()
        {
            let (ps, fx) = self.tensor_bytes(t, self.dtypes[t]);
            let whole = self.alloc(ps, fx, Category::Transient, 1);
            for b in parts {
                self.release(b);
            }
            self.grad_for(t, whole);
        }
        let rest = slot.into_iter().chain(saved).chain([gout]).flatten();
        for b in rest.chain(unnamed).collect::<Vec<_>>() {
            self.release(b);
        }
    }
}
