//! Python spellings the generated scripts and configs share.

use crate::plan::config::Optimizer;

/// HF `TrainingArguments.optim` of an optimizer.
pub(crate) fn hf_optim(o: Optimizer) -> &'static str {
    match o {
        Optimizer::Sgd | Optimizer::SgdMomentum => "sgd",
        Optimizer::Adam | Optimizer::AdamW => "adamw_torch",
        Optimizer::Adafactor => "adafactor",
        Optimizer::Adam8bit | Optimizer::AdamW8bit => "adamw_bnb_8bit",
        Optimizer::PagedAdamW8bit => "paged_adamw_8bit",
        Optimizer::PagedAdamW => "paged_adamw_32bit",
    }
}

/// A Python boolean literal, for the generated scripts and configs.
pub(crate) fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}
