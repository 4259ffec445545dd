//! Which step is planned: a training step, or an evaluation (validation) step run in the
//! same process after training, with or without `torch.no_grad()`.
//!
//! The seed articles' case: validation written without `torch.no_grad()` /
//! `torch.inference_mode()` keeps autograd's graph — every activation a backward would need —
//! until the loss and the output are dropped, on top of the weights, gradients and optimizer
//! state training left resident. The evaluation step is planned the way such a loop runs:
//!
//! ```python
//! model.eval()                       # dropout off; HF gradient checkpointing off (it
//! with torch.no_grad():              #   checks `self.training`)
//!     out = model(x)                 # "eval": nothing saved, activations die as used
//!     loss = criterion(out, y)       # "eval-grad": the same without `no_grad`: the graph
//! del out, loss                      #   lives until here
//! ```
//!
//! Gradients of the last training step are still allocated (`zero_grad` runs at the start of
//! the next training step), and so is the optimizer state.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The step a plan is for. Files written before this setting existed have no `step` key:
/// they planned training steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum StepKind {
    /// Forward, backward and the optimizer step.
    #[default]
    #[serde(rename = "train")]
    Train,
    /// An evaluation forward (and loss) under `torch.no_grad()` / `inference_mode()` in
    /// `model.eval()`, after training.
    #[serde(rename = "eval")]
    Eval,
    /// The same evaluation forward with autograd on (no `no_grad`): the graph is kept until the
    /// loss and output are dropped.
    #[serde(rename = "eval-grad")]
    EvalGrad,
}

impl StepKind {
    pub const ALL: [StepKind; 3] = [StepKind::Train, StepKind::Eval, StepKind::EvalGrad];

    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Train => "train",
            StepKind::Eval => "eval",
            StepKind::EvalGrad => "eval-grad",
        }
    }

    /// A short description for outputs.
    pub fn describe(self) -> &'static str {
        match self {
            StepKind::Train => "training step (forward, backward, optimizer step)",
            StepKind::Eval => "evaluation step under torch.no_grad() (after training)",
            StepKind::EvalGrad => {
                "evaluation step WITHOUT torch.no_grad(): autograd keeps the graph (after training)"
            }
        }
    }

    pub fn is_train(&self) -> bool {
        *self == StepKind::Train
    }

    pub fn is_eval(self) -> bool {
        !self.is_train()
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
