//! Hugging Face `DebertaV2ForMaskedLM` (transformers 5.17,
//! `models/deberta_v2/modeling_deberta_v2.py`) as an option of the BERT encoder builder.
//!
//! transformers 5.17 has no SDPA (nor flash) path for DeBERTa-v2: `DisentangledSelfAttention`
//! always runs its own eager code, whatever `attn_implementation` asks, so the graph is the
//! same for both. Per layer and sample it materialises the heads×s×s scores several times:
//! `q·kᵀ/scale`, the content→position (c2p) and position→content (p2c) terms gathered from
//! heads×s×2·span products with the relative embeddings, their sum, the masked scores, the
//! softmax and its dropout.

use super::bert::{BertParams, Decoder, MlmHead, mlm_head};
pub use super::encoder_options::{ConvOptions, DebertaOptions};
use super::transformer::layer_norm;
use crate::model::builder::GraphBuilder;
use crate::model::checks::ModelError;
use crate::model::ir::{Elem, Graph, Op, ParamId, Pointwise, TensorId};

/// Builds DeBERTa-v2/v3 with its masked-LM head over `seq` tokens (labels on every
/// position); eager attention (see the module documentation).
pub fn build(p: &BertParams, d: &DebertaOptions, seq: u64) -> Result<Graph, ModelError> {
    if d.position_biased_input {
        crate::model::checks::check_seq_fits(
            seq,
            0,
            p.max_position_embeddings,
            "max_position_embeddings",
        )?;
    }
    let c = p.hidden_size;
    let pd = p.hidden_dropout_prob;
    let mut b = GraphBuilder::new();
    let ids = b.input(seq, Elem::Int64);
    let word = b.param(p.vocab_size * c, Some((p.vocab_size, c)));
    b.scope("deberta.embeddings");
    // `attention_mask = torch.ones(input_shape)` (fp32), held through the forward.
    let ones = b.op(Op::Constant, &[], seq, &[], "attention_mask");
    let mut e = b.op(Op::Embedding, &[ids], seq * c, &[word], "word_embeddings");
    if d.position_biased_input {
        let table = b.param(
            p.max_position_embeddings * c,
            Some((p.max_position_embeddings, c)),
        );
        // position_ids is a (1, s) buffer: the embedding broadcasts over the batch.
        let pe = b.op(Op::Embedding, &[], 0, &[table], "position_embeddings");
        e = b.binary(e, pe, Pointwise::Add, false, "add_position");
    }
    if p.type_vocab_size > 0 {
        let table = b.param(p.type_vocab_size * c, Some((p.type_vocab_size, c)));
        let t = b.op(
            Op::Embedding,
            &[],
            seq * c,
            &[table],
            "token_type_embeddings",
        );
        e = b.binary(e, t, Pointwise::Add, false, "add_token_type");
    }
    let e = layer_norm(&mut b, e, seq, c, "LayerNorm");
    let e = b.binary(e, ones, Pointwise::MulByConstTensor, false, "mask");
    let mut h = b.dropout(e, pd, false, "dropout");
    b.scope("deberta.encoder");
    // `get_attention_mask`: (b, 1, 1, s) * (b, 1, s, 1) in fp32, used by every layer.
    let mask = b.op(Op::Constant, &[ones], seq * seq, &[], "attention_mask");
    let rel = d.relative_attention.then(|| relative(&mut b, d, c));
    let input = h;
    for l in 0..p.num_hidden_layers {
        b.scope(format!("deberta.encoder.layer.{l}"));
        b.begin_block();
        h = layer(&mut b, p, d, h, mask, rel.as_ref(), seq);
        b.end_block();
        if let (0, Some(conv)) = (l, &d.conv) {
            // In the encoder's loop, outside the checkpointed layer.
            b.scope("deberta.encoder.conv");
            h = conv_layer(&mut b, conv, [input, h, ones], c, seq, pd);
        }
    }
    b.scope("");
    let bias_in_decoder = d.legacy;
    let head = MlmHead {
        dense_bias: true,
        norm_bias: true,
        decoder: Decoder::Tied(word),
        decoder_bias: bias_in_decoder,
        upcast: false,
    };
    if bias_in_decoder {
        mlm_head(
            &mut b,
            h,
            ids,
            seq,
            c,
            p.vocab_size,
            &head,
            [
                "cls.predictions.transform.dense",
                "cls.predictions.transform.transform_act_fn",
                "cls.predictions.transform.LayerNorm",
                "cls.predictions.decoder",
            ],
        );
    } else {
        non_legacy_head(&mut b, h, ids, seq, c, p.vocab_size, word);
    }
    Ok(b.finish())
}

/// `ConvLayer(hidden_states, residual_states, input_mask)`: the convolution of the encoder's
/// input (permuted copies in and out), `masked_fill_` of the padding in place (saving a
/// (b, s) bool mask), dropout, the activation, `LayerNorm(residual + out)`, `* input_mask`.
fn conv_layer(
    b: &mut GraphBuilder,
    conv: &ConvOptions,
    [input, residual, ones]: [TensorId; 3],
    c: u64,
    seq: u64,
    pd: f64,
) -> TensorId {
    let x = b.copy(input, "permute");
    let w = b.param(c * (c / conv.groups) * conv.kernel, Some((c, c)));
    let bias = b.param(c, None);
    let out = b.op(
        Op::Conv2d {
            transposed: false,
            kernel: conv.kernel,
            groups: conv.groups,
            out_channels: c,
        },
        &[x],
        seq * c,
        &[w, bias],
        "conv",
    );
    let out = b.copy(out, "permute_back");
    let out = b.op(
        Op::Gather {
            indices: 0,
            mask: seq,
        },
        &[out],
        seq * c,
        &[],
        "masked_fill_",
    );
    let out = b.dropout(out, pd, false, "dropout");
    let act = if conv.gelu {
        Pointwise::Gelu
    } else {
        Pointwise::Tanh
    };
    let out = b.pointwise(out, act, false, "conv_act");
    let x = b.binary(residual, out, Pointwise::Add, false, "residual");
    let x = layer_norm(b, x, seq, c, "LayerNorm");
    b.binary(x, ones, Pointwise::MulByConstTensor, false, "input_mask")
}

/// `DebertaV2LMPredictionHead`: `matmul(h, word.T) + bias`, then the loss.
fn non_legacy_head(
    b: &mut GraphBuilder,
    h: TensorId,
    ids: TensorId,
    seq: u64,
    c: u64,
    vocab: u64,
    word: ParamId,
) {
    b.scope("lm_predictions.lm_head");
    let t = b.linear(h, seq, c, c, true, "dense");
    let t = b.pointwise(t, Pointwise::Gelu, false, "transform_act_fn");
    let t = layer_norm(b, t, seq, c, "LayerNorm");
    let logits = b.linear_tied(t, seq, word, c, vocab, "matmul_word_embeddings");
    let bias = b.param(vocab, None);
    let logits = b.op(
        Op::Pointwise {
            f: Pointwise::Add,
            inplace: false,
        },
        &[logits],
        seq * vocab,
        &[bias],
        "add_bias",
    );
    b.scope("");
    super::transformer::token_loss(b, logits, ids, seq, vocab, false);
}

/// What every layer reads of the relative positions, built once per forward.
struct Relative {
    /// `get_rel_embedding()`: the (2·span, hidden) table, layer-normed when `norm_rel_ebd`.
    /// (`build_relative_position`'s (1, s, s) int64 ids, batch-independent, are left out;
    /// each layer's clamped copies of them, which its gathers save, are not.)
    embeddings: TensorId,
}

fn relative(b: &mut GraphBuilder, d: &DebertaOptions, c: u64) -> Relative {
    let rows = 2 * d.att_span;
    let table = b.param(rows * c, Some((rows, c)));
    // The weight itself, as a batch-independent activation.
    let mut emb = b.fixed_op(Op::Embedding, &[], rows * c, &[table], "rel_embeddings");
    if d.norm_rel_ebd {
        let w = b.param(c, None);
        let bias = b.param(c, None);
        emb = b.fixed_op(
            Op::LayerNorm { rows },
            &[emb],
            rows * c,
            &[w, bias],
            "LayerNorm",
        );
    }
    Relative { embeddings: emb }
}

/// The weight and bias of a projection shared by the hidden states and the relative
/// embeddings (`share_att_key`).
#[derive(Clone, Copy)]
struct Proj {
    w: ParamId,
    bias: ParamId,
    c: u64,
    a: u64,
}

impl Proj {
    fn new(b: &mut GraphBuilder, c: u64, a: u64) -> Self {
        let w = b.param(c * a, Some((a, c)));
        let bias = b.param(a, None);
        Proj { w, bias, c, a }
    }

    /// Applied to `rows` per-sample rows (`fixed`: batch-independent rows).
    fn apply(
        &self,
        b: &mut GraphBuilder,
        x: TensorId,
        rows: u64,
        fixed: bool,
        name: &str,
    ) -> TensorId {
        let op = Op::Linear {
            in_features: self.c,
            out_features: self.a,
        };
        if fixed {
            b.fixed_op(op, &[x], rows * self.a, &[self.w, self.bias], name)
        } else {
            b.op(op, &[x], rows * self.a, &[self.w, self.bias], name)
        }
    }
}

/// `DebertaV2Layer`: disentangled self-attention, output dense + LayerNorm, the MLP.
fn layer(
    b: &mut GraphBuilder,
    p: &BertParams,
    d: &DebertaOptions,
    h: TensorId,
    mask: TensorId,
    rel: Option<&Relative>,
    seq: u64,
) -> TensorId {
    let c = p.hidden_size;
    let heads = p.num_attention_heads;
    let hd = d.head_size;
    let a = heads * hd;
    let pd = p.hidden_dropout_prob;
    let qp = Proj::new(b, c, a);
    let kp = Proj::new(b, c, a);
    let vp = Proj::new(b, c, a);
    // `transpose_for_scores`: permute(0, 2, 1, 3).contiguous() copies each projection.
    let q = qp.apply(b, h, seq, false, "attention.self.query_proj");
    let q = b.copy(q, "attention.self.query_layer");
    let k = kp.apply(b, h, seq, false, "attention.self.key_proj");
    let k = b.copy(k, "attention.self.key_layer");
    let v = vp.apply(b, h, seq, false, "attention.self.value_proj");
    let v = b.copy(v, "attention.self.value_layer");
    let scores = heads * seq * seq;
    // `bmm(q, k.transpose(-1, -2) / scale)`: the scaled kᵀ is a new tensor the bmm saves.
    let ks = b.pointwise(k, Pointwise::Scale, false, "attention.self.key_scaled");
    let s = b.op(
        Op::Matmul {
            batch: heads,
            m: seq,
            k: hd,
            n: seq,
        },
        &[q, ks],
        scores,
        &[],
        "attention.self.qk",
    );
    let s = match rel {
        Some(r) if d.c2p || d.p2c => {
            let bias = disentangled_bias(b, d, r, [q, k], [qp, kp], c, heads, seq, pd);
            b.binary(s, bias, Pointwise::Add, false, "attention.self.add_rel_att")
        }
        _ => s,
    };
    // `masked_fill(~mask, min)`: saves the boolean mask (s×s, broadcast over the heads);
    // backward writes a new gradient of the scores' size.
    let s = b.op(
        Op::Gather {
            indices: 0,
            mask: seq * seq,
        },
        &[s, mask],
        scores,
        &[],
        "attention.self.masked_fill",
    );
    let probs = b.op(
        Op::Softmax { fp32: false },
        &[s],
        scores,
        &[],
        "attention.self.softmax",
    );
    let probs = b.dropout(
        probs,
        p.attention_probs_dropout_prob,
        false,
        "attention.self.dropout",
    );
    let ctx = b.op(
        Op::Matmul {
            batch: heads,
            m: seq,
            k: seq,
            n: hd,
        },
        &[probs, v],
        seq * a,
        &[],
        "attention.self.av",
    );
    let ctx = b.copy(ctx, "attention.self.contiguous");
    let o = b.linear(ctx, seq, a, c, true, "attention.output.dense");
    let o = b.dropout(o, pd, false, "attention.output.dropout");
    let o = b.binary(o, h, Pointwise::Add, false, "attention.output.residual");
    let att = layer_norm(b, o, seq, c, "attention.output.LayerNorm");
    let i = p.intermediate_size;
    let m = b.linear(att, seq, c, i, true, "intermediate.dense");
    let m = b.pointwise(m, Pointwise::Gelu, false, "intermediate.act");
    let m = b.linear(m, seq, i, c, true, "output.dense");
    let m = b.dropout(m, pd, false, "output.dropout");
    let m = b.binary(m, att, Pointwise::Add, false, "output.residual");
    layer_norm(b, m, seq, c, "output.LayerNorm")
}

/// `disentangled_attention_bias`: the c2p and p2c terms, heads×s×s each, summed.
#[allow(clippy::too_many_arguments, reason = "the layer's tensors and shapes")]
fn disentangled_bias(
    b: &mut GraphBuilder,
    d: &DebertaOptions,
    r: &Relative,
    [q, k]: [TensorId; 2],
    [qp, kp]: [Proj; 2],
    c: u64,
    heads: u64,
    seq: u64,
    pd: f64,
) -> TensorId {
    let a = heads * d.head_size;
    let rows = 2 * d.att_span;
    let scores = heads * seq * seq;
    // `pos_dropout(rel_embeddings)`: batch-independent.
    let rel = if pd > 0.0 {
        b.fixed_op(
            Op::Dropout {
                p: pd,
                inplace: false,
            },
            &[r.embeddings],
            rows * c,
            &[],
            "attention.self.pos_dropout",
        )
    } else {
        r.embeddings
    };
    // Projected relative embeddings: `transpose_for_scores` (a batch-independent copy),
    // then `.repeat(batch, 1, 1)`, a per-sample copy.
    let pos = |b: &mut GraphBuilder, shared: Proj, name: &str| {
        let proj = if d.share_att_key {
            shared
        } else {
            Proj::new(b, c, a)
        };
        let x = proj.apply(b, rel, rows, true, &format!("attention.self.{name}"));
        let x = b.fixed_op(
            Op::Copy,
            &[x],
            rows * a,
            &[],
            &format!("attention.self.{name}.t"),
        );
        b.op(
            Op::Copy,
            &[x],
            rows * a,
            &[],
            &format!("attention.self.{name}.repeat"),
        )
    };
    let mut score: Option<TensorId> = None;
    for (on, term, input, shared, proj_name) in [
        (d.c2p, "c2p", q, kp, "pos_key_proj"),
        (d.p2c, "p2c", k, qp, "pos_query_proj"),
    ] {
        if !on {
            continue;
        }
        let pk = pos(b, shared, proj_name);
        let att = b.op(
            Op::Matmul {
                batch: heads,
                m: seq,
                k: d.head_size,
                n: rows,
            },
            &[input, pk],
            heads * seq * rows,
            &[],
            &format!("attention.self.{term}_att"),
        );
        // `torch.clamp(±relative_pos + span)`: a batch-independent int64 index per term,
        // which the gather saves.
        let idx = b.constant_elem(
            seq * seq,
            Elem::Int64,
            &format!("attention.self.{term}_pos"),
        );
        let g = b.op(
            Op::Gather {
                indices: 0,
                mask: 0,
            },
            &[att, idx],
            scores,
            &[],
            &format!("attention.self.{term}_gather"),
        );
        let g = b.pointwise(
            g,
            Pointwise::Scale,
            false,
            &format!("attention.self.{term}_scale"),
        );
        score = Some(match score {
            // `score = 0; score += term`: `0 + term`, a new tensor.
            None => b.pointwise(
                g,
                Pointwise::Scale,
                false,
                &format!("attention.self.{term}_sum"),
            ),
            Some(s) => b.binary(
                s,
                g,
                Pointwise::Add,
                true,
                &format!("attention.self.{term}_sum"),
            ),
        });
    }
    score.unwrap_or(r.embeddings)
}
