//! What can go wrong when a configuration is planned.

use crate::model::ModelError;

/// A training configuration that cannot be planned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
    #[error("unknown {field} `{value}` (known: {known})")]
    Unknown {
        field: &'static str,
        value: String,
        known: &'static str,
    },
    #[error("{0}: the byte count overflows 64 bits; reduce the batch or the model size")]
    Overflow(&'static str),
    #[error(transparent)]
    Model(#[from] ModelError),
}
