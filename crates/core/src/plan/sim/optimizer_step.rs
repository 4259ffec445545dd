//! The optimizer step: state created on the first step (warm-up), the step's
//! temporaries, for the trainable parameters of the policy. What each optimizer
//! allocates is [`crate::plan::optimizer`]'s.

use super::state::{NO_NODE, Sim};
use crate::plan::events::{Category, Phase};
use crate::plan::optimizer::{state_bytes, step_waves};

impl Sim<'_> {
    /// `optimizer.step()`: on the first step, the state of every trainable parameter;
    /// then each wave of temporaries, freed before the next.
    pub(super) fn optimizer_step(&mut self, create_state: bool) {
        self.phase = Phase::Optimizer;
        self.node = NO_NODE;
        let g = self.g;
        let opt = self.cfg.optimizer;
        let policy = self.policy;
        // PyTorch's ZeRO-1: this rank's optimizer holds (and steps) its own parameters only.
        let owned = self.dist.owned.clone();
        let trainable = || {
            g.params.iter().enumerate().filter(|&(i, _)| {
                policy.trainable(i)
                    && owned
                        .as_ref()
                        .is_none_or(|o| o.get(i).copied().unwrap_or(false))
            })
        };
        // DeepSpeed: the inner optimizer steps one flat fp32 partition.
        if self.dist.zero.is_some() {
            let grads = self.ds_step_grads();
            if let Some(elems) = self.dist.zero.as_ref().and_then(|z| z.state_partition()) {
                if create_state {
                    self.ds_state(elems);
                }
                let p = crate::model::ir::Param {
                    elems,
                    matrix: None,
                };
                for _ in step_waves(opt).iter().filter(|w| w.includes(&p)) {
                    let b = self.alloc(0, elems * 4, Category::Transient, 1);
                    self.release(b);
                }
            }
            for b in grads {
                self.release(b);
            }
            return;
        }
        // Offloaded: the state lives and steps on the CPU.
        if self.dist.offload_state {
            return;
        }
        // ZeRO-1/2 partition the state (and the step) without sharding the parameters.
        let state_shard = self.dist.state_shard;
        if create_state {
            for (i, p) in trainable() {
                let st = policy.state(i);
                let shard = state_shard.unwrap_or(st.shard);
                for &bytes in state_bytes(opt, p, st.storage).parts() {
                    self.alloc(0, shard.of(bytes), Category::OptimizerState, 1);
                }
            }
        }
        let mut temps = Vec::new();
        for wave in step_waves(opt) {
            for (i, p) in trainable().filter(|(_, p)| wave.includes(p)) {
                let bytes = match state_shard {
                    Some(s) => s.of(p.elems * policy.state(i).storage.size()),
                    None => policy.bytes(i, p.elems),
                };
                temps.push(self.alloc(0, bytes, Category::Transient, 1));
            }
            for b in temps.drain(..) {
                self.release(b);
            }
        }
    }
}
