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
//!
//! The same builder plans `BartForConditionalGeneration` (`models/bart/modeling_bart.py`)
//! when [`T5Params::bart`] is set; what differs is an option of each piece:
//!
//! - norms: `nn.LayerNorm` after each residual add (post-norm), `layernorm_embedding` on
//!   the embeddings, no final norm and no dropout after the stacks;
//! - positions: learned `BartLearnedPositionalEmbedding` tables (`max_position_embeddings +
//!   2` rows, ids offset by 2) instead of the relative bias: the encoder's position ids are
//!   `arange(s).expand(b, -1) + 2` (a per-sample int64 tensor, its embedding per sample), the
//!   decoder's `arange(t).unsqueeze(0) + 2` (batch-independent, broadcast in the add);
//!   `BartScaledWordEmbedding` multiplies by `embed_scale` (1.0 too: a new tensor);
//! - biases on every linear layer; `fc1 → act → dropout(activation_dropout) → fc2` without
//!   T5's cast to `wo`'s dtype; `attention_dropout` in the attention;
//! - attention with `scaling = head_dim ** -0.5` and no mask: SDPA runs the fused kernels
//!   (encoder bidirectional, decoder `is_causal`, cross-attention with its own key length);
//!   eager adds the decoder's causal `(batch, 1, t, t)` float mask built once per forward;
//! - no cache in training (`labels` turn `use_cache` off); `lm_head` tied to `shared`, its
//!   output plus the `final_logits_bias` buffer is a second vocabulary-sized tensor (fp32
//!   under autocast: the buffer is fp32).

use serde::{Deserialize, Serialize};

use super::transformer::{AttnImpl, layer_norm};
use crate::model::builder::GraphBuilder;
use crate::model::checks::{ModelError, check_layers, check_positive, check_prob};
use crate::model::ir::{Elem, Graph, Op, ParamId, Pointwise, TensorId};

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
    /// T5's relative position buckets (0 for BART, which has learned positions).
    #[serde(default)]
    pub relative_attention_num_buckets: u64,
    pub dropout_rate: f64,
    /// `DenseGatedActDense` (`feed_forward_proj: gated-*`).
    pub is_gated_act: bool,
    /// The feed-forward activation (one of [`ACTIVATIONS`]).
    pub dense_act_fn: String,
    /// Multiply the decoder output by `d_model ** -0.5` before `lm_head`.
    pub scale_decoder_outputs: bool,
    /// BART's layout (`model_type: bart`); `None` is T5's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bart: Option<BartOptions>,
}

/// What `BartForConditionalGeneration` does differently from T5, as options of the
/// encoder-decoder builder (see the module documentation).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BartOptions {
    /// Rows of each learned position table, less its offset of 2.
    pub max_position_embeddings: u64,
    /// Dropout of the attention probabilities (`attention_dropout`).
    pub attention_dropout: f64,
    /// Dropout after the feed-forward activation (`activation_dropout`).
    pub activation_dropout: f64,
    /// `scale_embedding`: `embed_scale = sqrt(d_model)` (else 1.0; the product is taken
    /// either way).
    pub scale_embedding: bool,
}

/// `BartLearnedPositionalEmbedding.offset`.
pub const BART_POSITION_OFFSET: u64 = 2;

impl T5Params {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_positive("params.vocab_size", self.vocab_size)?;
        check_positive("params.d_model", self.d_model)?;
        check_positive("params.d_kv", self.d_kv)?;
        check_positive("params.d_ff", self.d_ff)?;
        check_layers("params.num_layers", self.num_layers)?;
        check_layers("params.num_decoder_layers", self.num_decoder_layers)?;
        check_positive("params.num_heads", self.num_heads)?;
        match &self.bart {
            None => check_positive(
                "params.relative_attention_num_buckets",
                self.relative_attention_num_buckets,
            )?,
            Some(o) => {
                check_positive(
                    "params.bart.max_position_embeddings",
                    o.max_position_embeddings,
                )?;
                check_prob("params.bart.attention_dropout", o.attention_dropout)?;
                check_prob("params.bart.activation_dropout", o.activation_dropout)?;
            }
        }
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

/// Shapes and options shared by the ops of one stack.
struct Dims {
    d: u64,
    inner: u64,
    heads: u64,
    hd: u64,
    /// Dropout after the embeddings and every sub-layer.
    p: f64,
    /// Dropout of the attention probabilities.
    attn_p: f64,
    imp: AttnImpl,
    /// BART's layout: post-LayerNorm, biases, learned positions, `fc1`/`fc2`.
    bart: bool,
}

/// T5's RMS norm (`T5LayerNorm`, weight only) or BART's `nn.LayerNorm`.
fn norm(b: &mut GraphBuilder, dims: &Dims, x: TensorId, rows: u64, name: &str) -> TensorId {
    if dims.bart {
        return layer_norm(b, x, rows, dims.d, name);
    }
    let w: ParamId = b.param(dims.d, None);
    b.op(
        Op::T5LayerNorm { rows },
        &[x],
        rows.saturating_mul(dims.d),
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

/// What is added to the attention scores.
#[derive(Clone, Copy)]
enum ScoreBias {
    /// Nothing (BART's encoder and cross-attention; its decoder under SDPA, `is_causal`).
    None,
    /// T5's `(1, heads, q, k)` position bias (`true`: it trains), causally masked when the
    /// call is causal (a new mask per call).
    Position(TensorId, bool),
    /// BART's eager decoder: the causal float mask built once per forward.
    Mask(TensorId),
}

/// The attention after the projections: q over `q_len` rows, k and v over `kv_len`;
/// `causal` for decoder self-attention.
fn attend(
    b: &mut GraphBuilder,
    dims: &Dims,
    qkv: [TensorId; 3],
    bias: ScoreBias,
    (q_len, kv_len): (u64, u64),
    causal: bool,
) -> TensorId {
    let [q, k, v] = qkv;
    let out = q_len * dims.inner;
    let scores = dims.heads * q_len * kv_len;
    match (dims.imp, bias) {
        (AttnImpl::Sdpa, ScoreBias::Position(bias, bias_grad)) => {
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
                    dropout: dims.attn_p,
                    bias_grad,
                },
                &[q, k, v, mask],
                out,
                &[],
                "sdpa",
            )
        }
        (AttnImpl::Sdpa, _) if q_len == kv_len => b.op(
            Op::Sdpa {
                heads: dims.heads,
                kv_heads: dims.heads,
                head_dim: dims.hd,
                seq: q_len,
                dropout: dims.attn_p,
            },
            &[q, k, v],
            out,
            &[],
            "sdpa",
        ),
        // Cross-attention without a mask: the fused kernel over `kv_len` keys.
        (AttnImpl::Sdpa, _) => b.op(
            Op::SdpaBias {
                heads: dims.heads,
                head_dim: dims.hd,
                q_len,
                kv_len,
                dropout: dims.attn_p,
                bias_grad: false,
            },
            &[q, k, v],
            out,
            &[],
            "sdpa",
        ),
        (AttnImpl::Eager, bias) => {
            // `eager_attention_forward`: matmul · scaling (T5: 1.0) + bias (+ mask), softmax
            // in autocast's fp32, dropout, matmul (autocast casts the weights back).
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
            let s = match bias {
                ScoreBias::None => s,
                ScoreBias::Mask(m) => b.binary(s, m, Pointwise::Add, false, "add_mask"),
                ScoreBias::Position(bias, _) => {
                    let s = b.binary(s, bias, Pointwise::Add, false, "add_position_bias");
                    if causal {
                        let m = b.constant(q_len * kv_len, "causal_mask");
                        b.binary(s, m, Pointwise::Add, false, "add_mask")
                    } else {
                        s
                    }
                }
            };
            let p = b.op(Op::Softmax { fp32: false }, &[s], scores, &[], "softmax");
            let p = b.dropout(p, dims.attn_p, false, "attn_dropout");
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

/// The feed-forward activation `p.dense_act_fn` over `n` elements.
fn activation(b: &mut GraphBuilder, p: &T5Params, x: TensorId, n: u64, name: &str) -> TensorId {
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
}

/// T5's `T5LayerFF` (norm, `DenseReluDense` or gated, dropout, residual) or BART's
/// `fc1 → act → dropout → fc2 → dropout`, residual, `final_layer_norm`.
fn feed_forward(
    b: &mut GraphBuilder,
    p: &T5Params,
    dims: &Dims,
    h: TensorId,
    rows: u64,
) -> TensorId {
    let (d, ff) = (dims.d, p.d_ff);
    if let Some(o) = &p.bart {
        let m = b.linear(h, rows, d, ff, true, "fc1");
        let m = activation(b, p, m, rows * ff, "activation_fn");
        let m = b.dropout(m, o.activation_dropout, false, "activation_dropout");
        let m = b.linear(m, rows, ff, d, true, "fc2");
        let m = b.dropout(m, dims.p, false, "dropout");
        let r = b.binary(h, m, Pointwise::Add, false, "residual");
        return norm(b, dims, r, rows, "final_layer_norm");
    }
    let x = norm(b, dims, h, rows, "layer_norm");
    let m = if p.is_gated_act {
        let g = b.linear(x, rows, d, ff, false, "DenseReluDense.wi_0");
        let g = activation(b, p, g, rows * ff, "DenseReluDense.act");
        let u = b.linear(x, rows, d, ff, false, "DenseReluDense.wi_1");
        b.binary(g, u, Pointwise::Mul, false, "DenseReluDense.mul")
    } else {
        let m = b.linear(x, rows, d, ff, false, "DenseReluDense.wi");
        activation(b, p, m, rows * ff, "DenseReluDense.act")
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

/// One attention sub-layer (`h` over `rows` rows); k and v read `kv_src` (`kv_rows` rows)
/// for cross-attention.
struct Sublayer<'a> {
    name: &'a str,
    kv_src: Option<(TensorId, u64)>,
    bias: ScoreBias,
    causal: bool,
    cache: bool,
}

/// q/k/v/o of one attention sub-layer with its norm (T5: before, BART: after the residual
/// add), dropout and residual.
fn attention_layer(
    b: &mut GraphBuilder,
    dims: &Dims,
    h: TensorId,
    rows: u64,
    s: Sublayer,
) -> TensorId {
    let (d, inner, name) = (dims.d, dims.inner, s.name);
    let x = if dims.bart {
        h
    } else {
        norm(b, dims, h, rows, "layer_norm")
    };
    let (src, kv_rows) = s.kv_src.unwrap_or((x, rows));
    let proj = |n: &str| {
        if dims.bart {
            format!("{name}.{n}_proj")
        } else {
            format!("{name}.{n}")
        }
    };
    let bias = dims.bart;
    let q = b.linear(x, rows, d, inner, bias, &proj("q"));
    let k = b.linear(src, kv_rows, d, inner, bias, &proj("k"));
    let v = b.linear(src, kv_rows, d, inner, bias, &proj("v"));
    let (k, v) = if s.cache {
        let kc = b.op(Op::CacheAppend, &[k], kv_rows * inner, &[], "cache_k");
        let vc = b.op(Op::CacheAppend, &[v, k], kv_rows * inner, &[], "cache_v");
        (kc, vc)
    } else {
        (k, v)
    };
    let a = attend(b, dims, [q, k, v], s.bias, (rows, kv_rows), s.causal);
    let a = b.linear(
        a,
        rows,
        inner,
        d,
        bias,
        &proj(if dims.bart { "out" } else { "o" }),
    );
    let a = b.dropout(a, dims.p, false, "dropout");
    let r = b.binary(h, a, Pointwise::Add, false, "residual");
    if dims.bart {
        norm(b, dims, r, rows, &format!("{name}_layer_norm"))
    } else {
        r
    }
}

/// BART's embeddings of one stack: the tied token embedding times `embed_scale`, plus the
/// learned positions (`pos` from [`bart_positions`]), `layernorm_embedding`, dropout.
fn bart_embed(
    b: &mut GraphBuilder,
    dims: &Dims,
    tokens: TensorId,
    pos: TensorId,
    rows: u64,
) -> TensorId {
    let s = b.pointwise(tokens, Pointwise::Scale, false, "embed_tokens.embed_scale");
    let h = b.binary(s, pos, Pointwise::Add, false, "add_positions");
    let h = norm(b, dims, h, rows, "layernorm_embedding");
    b.dropout(h, dims.p, false, "dropout")
}

/// `BartLearnedPositionalEmbedding` over `rows` positions: per sample (the encoder's
/// `arange(s).expand(b, -1) + 2`) or batch-independent (the decoder's `(1, t)` ids).
fn bart_positions(
    b: &mut GraphBuilder,
    dims: &Dims,
    max_pos: u64,
    rows: u64,
    per_sample: bool,
) -> TensorId {
    let n = max_pos + BART_POSITION_OFFSET;
    let table = b.param(n * dims.d, Some((n, dims.d)));
    if per_sample {
        let ids = b.op_elem(
            Op::Constant,
            &[],
            rows,
            Elem::Int64,
            &[],
            "embed_positions.position_ids",
        );
        b.op(
            Op::Embedding,
            &[ids],
            rows * dims.d,
            &[table],
            "embed_positions",
        )
    } else {
        let ids = b.constant_elem(rows, Elem::Int64, "embed_positions.position_ids");
        b.fixed_op(
            Op::Embedding,
            &[ids],
            rows * dims.d,
            &[table],
            "embed_positions",
        )
    }
}

/// Builds T5 (or BART, [`T5Params::bart`]) with the LM head for `seq` source and `target`
/// target tokens.
pub fn build(p: &T5Params, seq: u64, target: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    check_positive("target_seq", target)?;
    if let Some(o) = &p.bart {
        let max = o.max_position_embeddings;
        crate::model::checks::check_seq_fits(seq, 0, max, "max_position_embeddings")?;
        if target > max {
            return Err(ModelError::Invalid {
                field: "target_seq".into(),
                reason: format!("{target} exceeds the model's max_position_embeddings {max}"),
            });
        }
    }
    let d = p.d_model;
    let dims = Dims {
        d,
        inner: p.num_heads * p.d_kv,
        heads: p.num_heads,
        hd: p.d_kv,
        p: p.dropout_rate,
        attn_p: p
            .bart
            .as_ref()
            .map_or(p.dropout_rate, |o| o.attention_dropout),
        imp,
        bart: p.bart.is_some(),
    };
    let layers = (p.num_layers + p.num_decoder_layers) as usize;
    let mut b = GraphBuilder::with_capacity(40 * layers + 16);
    let ids = b.input(seq, Elem::Int64);
    let shared = b.param(p.vocab_size * d, Some((p.vocab_size, d)));
    let enc = encoder(&mut b, p, &dims, ids, shared, seq);
    let (h, labels) = decoder(&mut b, p, &dims, (enc, seq), shared, target);
    b.scope("");
    let h = if p.scale_decoder_outputs {
        b.pointwise(h, Pointwise::Scale, false, "scale_decoder_outputs")
    } else {
        h
    };
    let logits = b.linear_tied(h, target, shared, d, p.vocab_size, "lm_head");
    let logits = if dims.bart {
        // `lm_logits + self.final_logits_bias`: a buffer `(1, vocab)` in the parameters'
        // dtype (fp32 under autocast, so the sum is fp32).
        let fb = b.constant(p.vocab_size, "final_logits_bias");
        b.binary(logits, fb, Pointwise::Add, false, "add_final_logits_bias")
    } else {
        logits
    };
    b.cross_entropy(logits, labels, target, p.vocab_size, false);
    Ok(b.finish())
}

/// The encoder over `seq` source tokens; returns its last hidden state.
fn encoder(
    b: &mut GraphBuilder,
    p: &T5Params,
    dims: &Dims,
    ids: TensorId,
    shared: ParamId,
    seq: u64,
) -> TensorId {
    let prefix = if dims.bart {
        "model.encoder"
    } else {
        "encoder"
    };
    b.scope(prefix);
    let e = b.op(
        Op::Embedding,
        &[ids],
        seq * dims.d,
        &[shared],
        "embed_tokens",
    );
    let (mut h, bias) = match &p.bart {
        Some(o) => {
            let pos = bart_positions(b, dims, o.max_position_embeddings, seq, true);
            (bart_embed(b, dims, e, pos, seq), ScoreBias::None)
        }
        None => {
            let h = b.dropout(e, p.dropout_rate, false, "dropout");
            b.scope("encoder.block.0.layer.0.SelfAttention");
            let bias = position_bias(b, p.relative_attention_num_buckets, dims, seq, seq);
            (h, ScoreBias::Position(bias, true))
        }
    };
    for l in 0..p.num_layers {
        b.begin_block();
        let (attn_scope, ff_scope, name) = if dims.bart {
            let s = format!("{prefix}.layers.{l}");
            (s.clone(), s, "self_attn")
        } else {
            (
                format!("encoder.block.{l}.layer.0"),
                format!("encoder.block.{l}.layer.1"),
                "SelfAttention",
            )
        };
        b.scope(attn_scope);
        let s = Sublayer {
            name,
            kv_src: None,
            bias,
            causal: false,
            cache: false,
        };
        h = attention_layer(b, dims, h, seq, s);
        b.scope(ff_scope);
        h = feed_forward(b, p, dims, h, seq);
        b.end_block();
    }
    b.scope(prefix);
    if dims.bart {
        h
    } else {
        let h = norm(b, dims, h, seq, "final_layer_norm");
        b.dropout(h, p.dropout_rate, false, "dropout")
    }
}

/// The decoder over `target` tokens (the labels shifted right: `_shift_right`,
/// `shift_tokens_right`) attending to `enc` (`enc_rows` rows); returns its last hidden
/// state and the labels.
fn decoder(
    b: &mut GraphBuilder,
    p: &T5Params,
    dims: &Dims,
    (enc, seq): (TensorId, u64),
    shared: ParamId,
    target: u64,
) -> (TensorId, TensorId) {
    let prefix = if dims.bart {
        "model.decoder"
    } else {
        "decoder"
    };
    b.scope(prefix);
    let labels = b.labels(target);
    let dec_ids = b.op_elem(Op::Copy, &[labels], target, Elem::Int64, &[], "shift_right");
    let e = b.op(
        Op::Embedding,
        &[dec_ids],
        target * dims.d,
        &[shared],
        "embed_tokens",
    );
    let (mut h, self_bias, cross_bias) = match &p.bart {
        Some(o) => {
            // Eager: `create_causal_mask` builds a `(batch, 1, t, t)` float mask once (in
            // the embeddings' dtype); SDPA gets none (`is_causal`).
            let mask = match dims.imp {
                AttnImpl::Eager => {
                    let m = b.op(Op::Constant, &[], target * target, &[], "causal_mask");
                    ScoreBias::Mask(m)
                }
                AttnImpl::Sdpa => ScoreBias::None,
            };
            let pos = bart_positions(b, dims, o.max_position_embeddings, target, false);
            let h = bart_embed(b, dims, e, pos, target);
            (h, mask, ScoreBias::None)
        }
        None => {
            let h = b.dropout(e, p.dropout_rate, false, "dropout");
            b.scope("decoder.block.0.layer.0.SelfAttention");
            let buckets = p.relative_attention_num_buckets;
            let dec_bias = position_bias(b, buckets, dims, target, target);
            b.scope("decoder.block.0.layer.1.EncDecAttention");
            // `torch.zeros((1, heads, q, k))` without gradient, reused by every
            // cross-attention.
            let n = p.num_heads * target * seq;
            let zeros = b.constant(n, "position_bias");
            let cross = b.fixed_op(Op::ToComputeDtype, &[zeros], n, &[], "position_bias.dtype");
            (
                h,
                ScoreBias::Position(dec_bias, true),
                ScoreBias::Position(cross, false),
            )
        }
    };
    // T5 keeps k/v in an `EncoderDecoderCache` in training; BART turns the cache off when
    // given labels.
    let cache = !dims.bart;
    let (self_name, cross_name) = if dims.bart {
        ("self_attn", "encoder_attn")
    } else {
        ("SelfAttention", "EncDecAttention")
    };
    for l in 0..p.num_decoder_layers {
        b.begin_block();
        let [self_scope, cross_scope, ff_scope] = if dims.bart {
            [0, 1, 2].map(|_| format!("{prefix}.layers.{l}"))
        } else {
            [0, 1, 2].map(|i| format!("decoder.block.{l}.layer.{i}"))
        };
        b.scope(self_scope);
        let s = Sublayer {
            name: self_name,
            kv_src: None,
            bias: self_bias,
            causal: true,
            cache,
        };
        h = attention_layer(b, dims, h, target, s);
        b.scope(cross_scope);
        let s = Sublayer {
            name: cross_name,
            kv_src: Some((enc, seq)),
            bias: cross_bias,
            causal: false,
            cache,
        };
        h = attention_layer(b, dims, h, target, s);
        b.scope(ff_scope);
        h = feed_forward(b, p, dims, h, target);
        b.end_block();
    }
    b.scope(prefix);
    let h = if dims.bart {
        h
    } else {
        let h = norm(b, dims, h, target, "final_layer_norm");
        b.dropout(h, p.dropout_rate, false, "dropout")
    };
    (h, labels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf;
    use crate::model::preset::ModelSpec;

    fn config(name: &str) -> crate::model::preset::Preset {
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
