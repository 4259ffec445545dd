//! What a model description must hold to be built: [`ModelError`], and the checks of
//! builder parameters (positive, bounded sizes and layer counts, probabilities, a sequence
//! within the position table, a graph whose element counts cannot overflow).

use super::ir::Graph;

/// A model description that cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    #[error("{field} must be at least 1 (got {value})")]
    NotPositive { field: String, value: u64 },
    #[error("{field} is too large ({value}); the limit is {limit}")]
    TooLarge {
        field: String,
        value: u64,
        limit: u64,
    },
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("unknown model family `{family}` (known: {})", .known.join(", "))]
    UnknownFamily {
        family: String,
        /// The families a preset may name (`preset::FAMILIES`).
        known: &'static [&'static str],
    },
    #[error("malformed preset: {0}")]
    Malformed(String),
    #[error(
        "unknown model `{0}`: run `vramlab presets` for the list, or pass a preset or config.json \
         path, a model folder, or a Hugging Face Hub id with its owner (`Qwen/Qwen2.5-7B`)"
    )]
    UnknownModel(String),
}

/// Largest size accepted for any single builder dimension; larger is surely a typo and
/// would overflow byte counts.
pub const MAX_DIM: u64 = 1 << 20;

/// `seq` tokens (after `offset` reserved positions) against the model's position table of
/// `max` entries, named `key` as in its config; the error names `seq_len`.
pub(crate) fn check_seq_fits(seq: u64, offset: u64, max: u64, key: &str) -> Result<(), ModelError> {
    if seq.saturating_add(offset) > max {
        return Err(ModelError::Invalid {
            field: "seq_len".into(),
            reason: format!("{seq} exceeds the model's {key} {max}"),
        });
    }
    Ok(())
}

pub(crate) fn check_positive(field: &str, value: u64) -> Result<(), ModelError> {
    if value == 0 {
        return Err(ModelError::NotPositive {
            field: field.to_string(),
            value,
        });
    }
    if value > MAX_DIM {
        return Err(ModelError::TooLarge {
            field: field.to_string(),
            value,
            limit: MAX_DIM,
        });
    }
    Ok(())
}

/// Most elements any one tensor or parameter of a graph may have (2^56: 256 PiB in fp32,
/// far beyond any device; byte counts of up to 8-byte elements then still fit 64 bits).
pub const MAX_ELEMS: u64 = 1 << 56;

/// Refuses a graph with a tensor or parameter beyond [`MAX_ELEMS`] (the planner multiplies
/// element counts by dtype sizes and batch; beyond this they would overflow).
pub(crate) fn check_graph_size(g: &Graph) -> Result<(), ModelError> {
    let tensors = g.tensors.iter().map(|t| t.per_sample.max(t.fixed));
    let params = g.params.iter().map(|p| p.elems);
    match tensors.chain(params).max() {
        Some(n) if n > MAX_ELEMS => Err(ModelError::TooLarge {
            field: "model size (elements of one tensor)".into(),
            value: n,
            limit: MAX_ELEMS,
        }),
        _ => Ok(()),
    }
}

/// Most layers (blocks) a model may have; more would be a typo and a huge graph.
pub const MAX_LAYERS: u64 = 1000;

pub(crate) fn check_layers(field: &str, value: u64) -> Result<(), ModelError> {
    check_positive(field, value)?;
    if value > MAX_LAYERS {
        return Err(ModelError::TooLarge {
            field: field.to_string(),
            value,
            limit: MAX_LAYERS,
        });
    }
    Ok(())
}

pub(crate) fn check_prob(field: &str, value: f64) -> Result<(), ModelError> {
    if !(0.0..1.0).contains(&value) {
        return Err(ModelError::Invalid {
            field: field.to_string(),
            reason: format!("must be a probability in [0, 1), got {value}"),
        });
    }
    Ok(())
}
