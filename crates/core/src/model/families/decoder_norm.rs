//! The decoder's norm layer, shared by its attention variants ([`super::decoder`],
//! [`super::mla`]).

use super::llama::{LlamaParams, NormKind};
use super::transformer::layer_norm;
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Op, ParamId, TensorId};

/// The decoder's norm layer over `dim` of `rows` rows (RMSNorm, Gemma's, OLMo 2's or
/// LayerNorm, after [`LlamaParams`]).
pub(super) fn norm(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    x: TensorId,
    rows: u64,
    dim: u64,
    name: &str,
) -> TensorId {
    if p.norm == Some(NormKind::LayerNorm) {
        return layer_norm(b, x, rows, dim, name);
    }
    let w: ParamId = b.param(dim, None);
    let n = rows.saturating_mul(dim);
    if p.gemma || p.norm == Some(NormKind::RmsFp32Product) {
        b.op(Op::RmsNormOffset { rows }, &[x], n, &[w], name)
    } else {
        b.op(Op::RmsNorm { rows }, &[x], n, &[w], name)
    }
}
