//! The masked-LM encoders' builder: BERT / RoBERTa ([`super::bert`]), or one of its option
//! sets, ModernBERT ([`super::modernbert`]) and DeBERTa-v2/v3 ([`super::deberta`]).

use super::bert::{self, BertParams};
use super::transformer::AttnImpl;
use crate::model::checks::ModelError;
use crate::model::ir::Graph;

/// Builds the encoder `p` describes, with its masked-LM head, for `seq` tokens.
pub fn build(p: &BertParams, seq: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    if let Some(m) = &p.modernbert {
        return Ok(super::modernbert::build(p, m, seq, imp));
    }
    if let Some(d) = &p.deberta {
        return super::deberta::build(p, d, seq);
    }
    bert::build(p, seq, imp)
}
