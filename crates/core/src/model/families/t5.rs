//! Hugging Face `T5ForConditionalGeneration` (transformers 5.17, `models/t5/modeling_t5.py`),
//! op by op: an encoder over the source (`seq` tokens) and a decoder over the target
//! (`target_seq` tokens, the labels shifted right), sharing one embedding.
//!
//! - `T5LayerNorm` (RMS, variance in fp32), dropout after the embeddings, after every
//!   sub-layer and after each stack's final norm; no embedding scaling.
//! - Relative position bias: computed once per stack, in its first layer, from an
//!   `nn.Embedding(num_buckets, heads)` — a batch-independent `(1, heads, q, k)` tensor added
//!   to the scores of every self-attention of that stack. With SDPA it is the float
//!   `attn_mask`; a mask that requires grad sends SDPA to its math backend (observed per op
//!   on the H200: `tests/data/t5_sdpa_ops.jsonl`); the decoder masks it causally
//!   (`torch.where`) in every layer. Cross-attention gets an all-zero `(1, heads, q, k)`
//!   mask without gradient, which the fused kernels take (cuDNN under autocast, the
//!   memory-efficient kernel in fp32).
//! - No `1/√d` scaling of the scores (`scaling = 1.0`).
//! - `DenseReluDense`: `wi → act → dropout → wo`, or gated (`act(wi_0) · wi_1`); the hidden
//!   state is cast to `wo`'s dtype first (under autocast an fp32 copy, `wo` being fp32).
//! - The decoder keeps its self- and cross-attention k/v in an `EncoderDecoderCache`
//!   (`use_cache` is true in training unless gradient checkpointing turns it off).
//! - transformers 5.17 always ties `lm_head` to the shared embedding (`T5Config` sets
//!   `tie_word_embeddings = True`); a config with `tie_word_embeddings: false` only turns off
//!   the `d_model ** -0.5` scaling of the decoder output (`scale_decoder_outputs`).
//! - The loss: `CrossEntropyLoss` over `(batch · target_seq, vocab)`, no `.float()`.

use serde::{Deserialize, Serialize};

use super::transformer::AttnImpl;
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Elem, Graph, Op, ParamId, Pointwise, TensorId};
use crate::model::{ModelError, check_layers, check_positive, check_prob};

/// Feed-forward activations (`feed_forward_proj`'s last part; `gated-gelu` is `gelu_new`).
pub const ACTIVATIONS: &[&str] = &["relu", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu"];

/// Target length when none is given (`--target-seq`).
pub const DEFAULT_TARGET_SEQ: u64 = 128;

/// `T5Config` fields that shape memory.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct T5Params {
    pub vocab_size: u64,
    pub d_model: u64,
    /// Width of one head (need not be d_model / num_heads).
    pub d_kv: u64,
    pub d_ff: u64,
    /// Encoder layers.
    pub num_layers: u64,
    pub num_decoder_layers: u64,
    pub num_heads: u64,
    pub relative_attention_num_buckets: u64,
    pub dropout_rate: f64,
    /// `DenseGatedActDense` (`feed_forward_proj: gated-*`).
    pub is_gated_act: bool,
    /// The feed-forward activation (one of [`ACTIVATIONS`]).
    pub dense_act_fn: String,
    /// Multiply the decoder output by `d_model ** -0.5` before `lm_head`.
    pub scale_decoder_outputs: bool,
}

impl T5Params {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_positive("params.vocab_size", self.vocab_size)?;
        check_positive("params.d_model", self.d_model)?;
        check_positive("params.d_kv", self.d_kv)?;
        check_positive("params.d_ff", self.d_ff)?;
        check_layers("params.num_layers", self.num_layers)?;
        check_layers("params.num_decoder_layers", self.num_decoder_layers)?;
        check_positive("params.num_heads", self.num_heads)?;
        check_positive(
            "params.relative_attention_num_buckets",
            self.relative_attention_num_buckets,
        )?;
        check_prob("params.dropout_rate", self.dropout_rate)?;
        if !ACTIVATIONS.contains(&self.dense_act_fn.as_str()) {
            return Err(ModelError::Invalid {
                field: "params.dense_act_fn".into(),
                reason: format!(
                    "`{}` is not supported ({})",
                    self.dense_act_fn,
                    ACTIVATIONS.join(", ")
                ),
            });
        }
        Ok(())
    }
}

/// Shapes shared by the ops of one stack.
struct Dims {
    d: u64,
    inner: u64,
    heads: u64,
    hd: u64,
    p: f64,
    imp: AttnImpl,
}

fn layer_norm(b: &mut GraphBuilder, x: TensorId, rows: u64, d: u64, name: &str) -> TensorId {
    let w: ParamId = b.param(d, None);
    b.op(
        Op::T5LayerNorm { rows },
        &[x],
        rows.saturating_mul(d),
        &[w],
        name,
    )
}

/// The relative position bias of a stack's first layer: bucket ids (int64, no gradient),
/// the embedding lookup `(q, k, heads)`, permuted to `(1, heads, q, k)` (a view).
fn position_bias(b: &mut GraphBuilder, buckets: u64, dims: &Dims, q: u64, k: u64) -> TensorId {
    let table = b.param(buckets * dims.heads, Some((buckets, dims.heads)));
    let ids = b.constant_elem(q * k, Elem::Int64, "relative_position_bucket");
    b.fixed_op(
        Op::Embedding,
        &[ids],
        q * k * dims.heads,
        &[table],
        "relative_attention_bias",
    )
}

/// `T5Attention` after the projections: q over `q_len` rows, k and v over `kv_len`;
/// `bias` the `(1, heads, q, k)` tensor added to the scores; `causal` masks it first
/// (decoder self-attention).
#[allow(
    clippy::too_many_arguments,
    reason = "one attention call, field by field"
)]
fn attend(
    b: &mut GraphBuilder,
    dims: &Dims,
    qkv: [TensorId; 3],
    bias: TensorId,
    bias_grad: bool,
    q_len: u64,
    kv_len: u64,
    causal: bool,
) -> TensorId {
    let [q, k, v] = qkv;
    let out = q_len * dims.inner;
    let scores = dims.heads * q_len * kv_len;
    match dims.imp {
        AttnImpl::Sdpa => {
            // `create_position_bias_mask`: `torch.where(causal, bias, min)` when causal,
            // else the bias itself.
            let mask = if causal {
                b.fixed_op(Op::Copy, &[bias], scores, &[], "position_bias_mask")
            } else {
                bias
            };
            b.op(
                Op::SdpaBias {
                    heads: dims.heads,
                    head_dim: dims.hd,
                    q_len,
                    kv_len,
                    dropout: dims.p,
                    bias_grad,
                },
                &[q, k, v, mask],
                out,
                &[],
                "sdpa",
            )
        }
        AttnImpl::Eager => {
            // `eager_attention_forward`: matmul · scaling (1.0) + bias (+ mask), softmax in
            // autocast's fp32, dropout, matmul (autocast casts the weights back).
            let s = b.op(
                Op::Matmul {
                    batch: dims.heads,
                    m: q_len,
                    k: dims.hd,
                    n: kv_len,
                },
                &[q, k],
                scores,
                &[],
                "qk",
            );
            let s = b.pointwise(s, Pointwise::Scale, false, "scale");
            let s = b.binary(s, bias, Pointwise::Add, false, "add_position_bias");
            let s = if causal {
                let m = b.constant(q_len * kv_len, "causal_mask");
                b.binary(s, m, Pointwise::Add, false, "add_mask")
            } else {
                s
            };
            let p = b.op(Op::Softmax { fp32: false }, &[s], scores, &[], "softmax");
            let p = b.dropout(p, dims.p, false, "attn_dropout");
            let o = b.op(
                Op::Matmul {
                    batch: dims.heads,
                    m: q_len,
                    k: kv_len,
                    n: dims.hd,
                },
                &[p, v],
                out,
                &[],
                "av",
            );
            b.copy(o, "contiguous")
        }
    }
}

/// `T5LayerFF`: norm, `DenseReluDense` (or gated), dropout, residual.
fn feed_forward(
    b: &mut GraphBuilder,
    p: &T5Params,
    dims: &Dims,
    h: TensorId,
    rows: u64,
) -> TensorId {
    let (d, ff) = (dims.d, p.d_ff);
    let x = layer_norm(b, h, rows, d, "layer_norm");
    let act = |b: &mut GraphBuilder, x: TensorId, name: &str| -> TensorId {
        let n = rows * ff;
        let op = match p.dense_act_fn.as_str() {
            "relu" => Op::Pointwise {
                f: Pointwise::Relu,
                inplace: false,
            },
            "gelu_new" => Op::GeluNewPython,
            "silu" => Op::Pointwise {
                f: Pointwise::Silu,
                inplace: false,
            },
            _ => Op::Pointwise {
                f: Pointwise::Gelu,
                inplace: false,
            },
        };
        b.op(op, &[x], n, &[], name)
    };
    let m = if p.is_gated_act {
        let g = b.linear(x, rows, d, ff, false, "DenseReluDense.wi_0");
        let g = act(b, g, "DenseReluDense.act");
        let u = b.linear(x, rows, d, ff, false, "DenseReluDense.wi_1");
        b.binary(g, u, Pointwise::Mul, false, "DenseReluDense.mul")
    } else {
        let m = b.linear(x, rows, d, ff, false, "DenseReluDense.wi");
        act(b, m, "DenseReluDense.act")
    };
    let m = b.dropout(m, dims.p, false, "DenseReluDense.dropout");
    // `hidden_states.to(self.wo.weight.dtype)`: under autocast an fp32 copy of a 16-bit
    // tensor (`wo` is fp32), which `wo` casts back.
    let m = b.op(
        Op::ToF32,
        &[m],
        rows * ff,
        &[],
        "DenseReluDense.to_wo_dtype",
    );
    let m = b.linear(m, rows, ff, d, false, "DenseReluDense.wo");
    let m = b.dropout(m, dims.p, false, "dropout");
    b.binary(h, m, Pointwise::Add, false, "residual")
}

/// q/k/v/o of one attention sub-layer; k and v read `kv_src` (`kv_rows` rows).
#[allow(
    clippy::too_many_arguments,
    reason = "one attention sub-layer, field by field"
)]
fn attention_layer(
    b: &mut GraphBuilder,
    dims: &Dims,
    h: TensorId,
    rows: u64,
    kv_src: Option<(TensorId, u64)>,
    bias: TensorId,
    bias_grad: bool,
    causal: bool,
    cache: bool,
    name: &str,
) -> TensorId {
    let (d, inner) = (dims.d, dims.inner);
    let x = layer_norm(b, h, rows, d, "layer_norm");
    let (src, kv_rows) = kv_src.unwrap_or((x, rows));
    let q = b.linear(x, rows, d, inner, false, &format!("{name}.q"));
    let k = b.linear(src, kv_rows, d, inner, false, &format!("{name}.k"));
    let v = b.linear(src, kv_rows, d, inner, false, &format!("{name}.v"));
    let (k, v) = if cache {
        let kc = b.op(Op::CacheAppend, &[k], kv_rows * inner, &[], "cache_k");
        let vc = b.op(Op::CacheAppend, &[v, k], kv_rows * inner, &[], "cache_v");
        (kc, vc)
    } else {
        (k, v)
    };
    let a = attend(b, dims, [q, k, v], bias, bias_grad, rows, kv_rows, causal);
    let a = b.linear(a, rows, inner, d, false, &format!("{name}.o"));
    let a = b.dropout(a, dims.p, false, "dropout");
    b.binary(h, a, Pointwise::Add, false, "residual")
}

/// Builds T5 with the LM head for `seq` source and `target` target tokens.
pub fn build(p: &T5Params, seq: u64, target: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    check_positive("target_seq", target)?;
    let d = p.d_model;
    let dims = Dims {
        d,
        inner: p.num_heads * p.d_kv,
        heads: p.num_heads,
        hd: p.d_kv,
        p: p.dropout_rate,
        imp,
    };
    let buckets = p.relative_attention_num_buckets;
    let layers = (p.num_layers + p.num_decoder_layers) as usize;
    let mut b = GraphBuilder::with_capacity(40 * layers + 16);
    let ids = b.input(seq, Elem::Int64);
    let shared = b.param(p.vocab_size * d, Some((p.vocab_size, d)));

    // Encoder.
    b.scope("encoder");
    let e = b.op(Op::Embedding, &[ids], seq * d, &[shared], "embed_tokens");
    let mut h = b.dropout(e, p.dropout_rate, false, "dropout");
    b.scope("encoder.block.0.layer.0.SelfAttention");
    let enc_bias = position_bias(&mut b, buckets, &dims, seq, seq);
    for l in 0..p.num_layers {
        b.begin_block();
        b.scope(format!("encoder.block.{l}.layer.0"));
        h = attention_layer(
            &mut b,
            &dims,
            h,
            seq,
            None,
            enc_bias,
            true,
            false,
            false,
            "SelfAttention",
        );
        b.scope(format!("encoder.block.{l}.layer.1"));
        h = feed_forward(&mut b, p, &dims, h, seq);
        b.end_block();
    }
    b.scope("encoder");
    let h = layer_norm(&mut b, h, seq, d, "final_layer_norm");
    let enc = b.dropout(h, p.dropout_rate, false, "dropout");

    // Decoder: input ids are the labels shifted right (`_shift_right`).
    b.scope("decoder");
    let labels = b.labels(target);
    let dec_ids = b.op_elem(Op::Copy, &[labels], target, Elem::Int64, &[], "shift_right");
    let e = b.op(
        Op::Embedding,
        &[dec_ids],
        target * d,
        &[shared],
        "embed_tokens",
    );
    let mut h = b.dropout(e, p.dropout_rate, false, "dropout");
    b.scope("decoder.block.0.layer.0.SelfAttention");
    let dec_bias = position_bias(&mut b, buckets, &dims, target, target);
    b.scope("decoder.block.0.layer.1.EncDecAttention");
    // `torch.zeros((1, heads, q, k))` without gradient, reused by every cross-attention.
    let zeros = b.constant(p.num_heads * target * seq, "position_bias");
    let cross_bias = b.fixed_op(
        Op::ToComputeDtype,
        &[zeros],
        p.num_heads * target * seq,
        &[],
        "position_bias.dtype",
    );
    for l in 0..p.num_decoder_layers {
        b.begin_block();
        b.scope(format!("decoder.block.{l}.layer.0"));
        h = attention_layer(
            &mut b,
            &dims,
            h,
            target,
            None,
            dec_bias,
            true,
            true,
            true,
            "SelfAttention",
        );
        b.scope(format!("decoder.block.{l}.layer.1"));
        h = attention_layer(
            &mut b,
            &dims,
            h,
            target,
            Some((enc, seq)),
            cross_bias,
            false,
            false,
            true,
            "EncDecAttention",
        );
        b.scope(format!("decoder.block.{l}.layer.2"));
        h = feed_forward(&mut b, p, &dims, h, target);
        b.end_block();
    }
    b.scope("decoder");
    let h = layer_norm(&mut b, h, target, d, "final_layer_norm");
    let h = b.dropout(h, p.dropout_rate, false, "dropout");
    b.scope("");
    let h = if p.scale_decoder_outputs {
        b.pointwise(h, Pointwise::Scale, false, "scale_decoder_outputs")
    } else {
        h
    };
    let logits = b.linear_tied(h, target, shared, d, p.vocab_size, "lm_head");
    b.cross_entropy(logits, labels, target, p.vocab_size, false);
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf;
    use crate::model::preset::ModelSpec;

    fn config(name: &str) -> crate::model::Preset {
        let path = format!(
            "{}/../../tests/data/hf_configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("config");
        hf::from_config_text(&text, name).expect("import")
    }

    /// `sum(p.numel())` of `T5ForConditionalGeneration(cfg)` (transformers 5.17, meta
    /// device; `tests/data/hf_param_counts.jsonl`): the head is tied for all three.
    #[test]
    fn parameter_counts_equal_transformers() {
        for (name, want) in [
            ("t5-small", 60_506_624),
            ("t5-base", 222_903_552),
            ("flan-t5-base", 222_903_552),
        ] {
            let g = config(name).build(64, AttnImpl::Sdpa).expect("graph");
            assert_eq!(g.param_count(), want, "{name}");
        }
    }

    #[test]
    fn flan_is_gated_gelu_new_and_unscaled() {
        let p = config("flan-t5-base");
        let ModelSpec::T5(t) = &p.spec else {
            panic!("not t5")
        };
        assert!(t.is_gated_act && t.dense_act_fn == "gelu_new");
        assert!(!t.scale_decoder_outputs, "tie_word_embeddings false");
        assert_eq!((t.num_layers, t.num_decoder_layers), (12, 12));
        let small = config("t5-small");
        let ModelSpec::T5(s) = &small.spec else {
            panic!("not t5")
        };
        assert!(!s.is_gated_act && s.dense_act_fn == "relu" && s.scale_decoder_outputs);
    }

    /// The relative position bias is batch-independent; the target length shapes the
    /// decoder, the logits and the loss.
    #[test]
    fn bias_is_fixed_and_target_shapes_the_decoder() {
        let p = config("t5-small");
        let g = p.build_with(512, Some(100), AttnImpl::Sdpa).expect("graph");
        let bias: Vec<_> = g
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Embedding) && n.params.len() == 1)
            .filter(|n| g.tensors[n.output].per_sample == 0)
            .map(|n| g.tensors[n.output].fixed)
            .collect();
        assert_eq!(bias, vec![8 * 512 * 512, 8 * 100 * 100]);
        let sdpa: Vec<_> = g
            .nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::SdpaBias {
                    q_len,
                    kv_len,
                    bias_grad,
                    ..
                } => Some((q_len, kv_len, bias_grad)),
                _ => None,
            })
            .collect();
        assert_eq!(sdpa.len(), 6 + 2 * 6);
        assert!(sdpa.contains(&(100, 512, false)), "cross-attention");
        assert!(sdpa.contains(&(100, 100, true)) && sdpa.contains(&(512, 512, true)));
        let loss = g.nodes.last().expect("loss");
        assert!(matches!(
            loss.op,
            Op::CrossEntropy {
                rows: 100,
                classes: 32128,
                ..
            }
        ));
        // Longer targets, more memory per sample; the source length is unbounded.
        let longer = p
            .build_with(2048, Some(300), AttnImpl::Eager)
            .expect("eager");
        let elems = |g: &Graph| g.tensors.iter().map(|t| t.per_sample).sum::<u64>();
        assert!(elems(&longer) > elems(&g));
    }

    #[test]
    fn target_seq_is_refused_for_other_models() {
        let gpt2 = crate::model::preset::find_builtin("gpt2").expect("gpt2");
        let err = gpt2
            .build_with(128, Some(64), AttnImpl::Sdpa)
            .expect_err("not seq2seq")
            .to_string();
        assert!(
            err.contains("target_seq") && err.contains("encoder-decoder"),
            "{err}"
        );
        assert_eq!(gpt2.target_seq(Some(64)), None);
        let t5 = config("t5-small");
        assert_eq!(t5.target_seq(None), Some(DEFAULT_TARGET_SEQ));
        let err = t5
            .build_with(128, Some(0), AttnImpl::Sdpa)
            .expect_err("zero")
            .to_string();
        assert!(err.contains("target_seq"), "{err}");
    }
}
