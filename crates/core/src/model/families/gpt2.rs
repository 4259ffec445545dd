//! Hugging Face `GPT2LMHeadModel` (transformers 5, `models/gpt2/modeling_gpt2.py`).

use serde::{Deserialize, Serialize};

use super::transformer::{AttnImpl, AttnShape, attention, layer_norm, token_loss};
use crate::model::builder::GraphBuilder;
use crate::model::checks::{ModelError, check_layers, check_positive, check_prob};
use crate::model::ir::{Elem, Graph, Op, Pointwise};

/// `GPT2Config` fields that shape memory.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Gpt2Params {
    pub vocab_size: u64,
    pub n_positions: u64,
    pub n_embd: u64,
    pub n_layer: u64,
    pub n_head: u64,
    /// MLP width; `null` means 4 × n_embd.
    pub n_inner: Option<u64>,
    /// "gelu_new" (Python tanh formula) or "gelu" / "gelu_pytorch_tanh" (one kernel).
    pub activation_function: String,
    pub resid_pdrop: f64,
    pub embd_pdrop: f64,
    pub attn_pdrop: f64,
    pub tie_word_embeddings: bool,
}

impl Gpt2Params {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_positive("params.vocab_size", self.vocab_size)?;
        check_positive("params.n_positions", self.n_positions)?;
        check_positive("params.n_embd", self.n_embd)?;
        check_layers("params.n_layer", self.n_layer)?;
        check_positive("params.n_head", self.n_head)?;
        if let Some(n) = self.n_inner {
            check_positive("params.n_inner", n)?;
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ModelError::Invalid {
                field: "params.n_head".into(),
                reason: format!(
                    "n_embd {} is not divisible by n_head {}",
                    self.n_embd, self.n_head
                ),
            });
        }
        if !["gelu_new", "gelu", "gelu_pytorch_tanh", "relu"]
            .contains(&self.activation_function.as_str())
        {
            return Err(ModelError::Invalid {
                field: "params.activation_function".into(),
                reason: format!(
                    "`{}` is not supported (gelu_new, gelu, gelu_pytorch_tanh, relu)",
                    self.activation_function
                ),
            });
        }
        check_prob("params.resid_pdrop", self.resid_pdrop)?;
        check_prob("params.embd_pdrop", self.embd_pdrop)?;
        check_prob("params.attn_pdrop", self.attn_pdrop)?;
        Ok(())
    }
}

/// Builds GPT-2 for sequences of `seq` tokens.
pub fn build(p: &Gpt2Params, seq: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    crate::model::checks::check_seq_fits(seq, 0, p.n_positions, "n_positions")?;
    let c = p.n_embd;
    let inner = p.n_inner.unwrap_or(4 * c);
    let mut b = GraphBuilder::new();
    let ids = b.input(seq, Elem::Int64);
    let wte = b.param(p.vocab_size * c, Some((p.vocab_size, c)));
    let wpe = b.param(p.n_positions * c, Some((p.n_positions, c)));
    b.scope("transformer");
    let tok = b.op(Op::Embedding, &[ids], seq * c, &[wte], "wte");
    // Position embeddings are (1, s, C): batch-independent.
    let pos = b.op(Op::Embedding, &[], 0, &[wpe], "wpe");
    let h = b.binary(tok, pos, Pointwise::Add, false, "add_pos");
    let mut h = b.dropout(h, p.embd_pdrop, false, "drop");
    let shape = AttnShape {
        seq,
        heads: p.n_head,
        kv_heads: p.n_head,
        head_dim: c / p.n_head,
        dropout: p.attn_pdrop,
        softmax_fp32: false,
        causal: true,
        softcap: false,
    };
    for l in 0..p.n_layer {
        b.scope(format!("h.{l}"));
        b.begin_block();
        let x = layer_norm(&mut b, h, seq, c, "ln_1");
        let qkv = b.linear(x, seq, c, 3 * c, true, "attn.c_attn");
        // q stays a view of c_attn's output; k and v are copied into the DynamicCache.
        let k = b.op(Op::CacheAppend, &[qkv], seq * c, &[], "attn.cache_k");
        let v = b.op(Op::CacheAppend, &[qkv], seq * c, &[], "attn.cache_v");
        let a = attention(&mut b, &[qkv, k, v], shape, imp, "attn");
        let a = b.linear(a, seq, c, c, true, "attn.c_proj");
        let a = b.dropout(a, p.resid_pdrop, false, "attn.resid_dropout");
        h = b.binary(a, h, Pointwise::Add, false, "residual_1");
        let x = layer_norm(&mut b, h, seq, c, "ln_2");
        let m = b.linear(x, seq, c, inner, true, "mlp.c_fc");
        let m = match p.activation_function.as_str() {
            "gelu_new" => b.op(Op::GeluNewPython, &[m], seq * inner, &[], "mlp.act"),
            "relu" => b.pointwise(m, Pointwise::Relu, false, "mlp.act"),
            _ => b.pointwise(m, Pointwise::Gelu, false, "mlp.act"),
        };
        let m = b.linear(m, seq, inner, c, true, "mlp.c_proj");
        let m = b.dropout(m, p.resid_pdrop, false, "mlp.dropout");
        h = b.binary(m, h, Pointwise::Add, false, "residual_2");
        b.end_block();
    }
    b.scope("transformer");
    let h = layer_norm(&mut b, h, seq, c, "ln_f");
    // `GPT2Model.forward` keeps `inputs_embeds` and `position_embeds` (its locals, summed
    // into the first hidden states) until it returns after `ln_f` (transformers 5.17
    // `modeling_gpt2.py`; freed there in an allocator history, docs/accuracy.md).
    b.hold(tok);
    b.hold(pos);
    b.scope("");
    let logits = if p.tie_word_embeddings {
        b.linear_tied(h, seq, wte, c, p.vocab_size, "lm_head")
    } else {
        b.linear(h, seq, c, p.vocab_size, false, "lm_head")
    };
    // labels = input_ids in the runner: the same tensor.
    token_loss(&mut b, logits, ids, seq, p.vocab_size, true);
    Ok(b.finish())
}
