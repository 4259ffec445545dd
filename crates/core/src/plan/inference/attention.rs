//! What one attention call allocates under `torch.no_grad()` (transformers 5.17
//! `integrations/sdpa_attention.py` and `eager_attention_forward`; PyTorch 2.11's
//! `scaled_dot_product_attention` dispatch):
//!
//! - SDPA without a 4-D mask: grouped kv heads go to the kernel as they are
//!   (`enable_gqa=True`). 16-bit: the flash kernel (output, fp32 logsumexp). fp32 with
//!   grouped heads: no fused kernel takes it, so the math path
//!   (`_scaled_dot_product_attention_math`): `q·√s`, k and v repeated, `kᵀ·√s`, the fp32
//!   scores, then `_safe_softmax` (softmax, an `isneginf` bool, `where_out` into the
//!   softmax's storage), the output, copied by `transpose(1, 2).contiguous()`. fp32 without
//!   grouping: the memory-efficient kernel.
//! - SDPA with a 4-D bool mask (a static cache's decode steps, sliding layers past their
//!   window): `repeat_kv` copies k and v to every head; PyTorch converts the mask to the
//!   query's dtype (`convert_boolean_attn_mask`: zeros of its shape and a `logical_not`), the
//!   memory-efficient kernel pads its last dimension to a multiple of 16 (`preprocess_mask`).
//! - Eager: `repeat_kv`, `q @ kᵀ`, `* scaling` (Gemma 2: then `/ cap`, `tanh`, `* cap`), `+ mask`,
//!   `softmax(dtype=float32)`,
//!   `.to(dtype)`, `@ v`, `transpose(1, 2).contiguous()`; the probabilities are returned and
//!   held by the decoder layer's `_` until the layer returns.
//! - Eager with attention sinks (gpt-oss's own `eager_attention_forward`, the only one it
//!   runs): `repeat_kv`, `q @ kᵀ` (q is contiguous: its RoPE ends in a `cat`), `* scaling`,
//!   `+ mask`, `cat([scores, sinks])`, `- max(dim=-1).values`, `softmax` in the scores'
//!   dtype, the probabilities without the sink column (a view) `@ v`,
//!   `transpose(1, 2).contiguous()`.

use super::program::{Buf, Prog};
use super::shape::DecoderShape;
use crate::plan::config::Attention;

/// One attention call: `t` query tokens over `kv` key/value tokens of one sequence.
#[derive(Debug, Clone, Copy)]
pub struct AttnCall {
    pub t: u64,
    pub kv: u64,
    /// Whether a 4-D mask reaches the kernel.
    pub mask: bool,
    /// Bytes of the dtype.
    pub d: u64,
    /// bf16 (fp16 has its own half-to-float softmax kernel; bf16 is converted first).
    pub bf16: bool,
    pub imp: Attention,
    /// The values are a strided view (Phi-3's slice of the fused `qkv`, returned as they are
    /// by a static sliding layer's long prefill): eager's `matmul` copies them.
    pub v_strided: bool,
}

/// The attention output (`b × t × heads × head_dim`) and a tensor held until the decoder
/// layer returns (eager's probabilities).
#[derive(Debug, Clone, Copy)]
pub struct AttnOut {
    pub out: Buf,
    pub held: Buf,
}

/// gpt-oss's eager attention with sinks (see the module docs).
fn eager_with_sinks(p: &mut Prog, s: &DecoderShape, c: AttnCall) -> AttnOut {
    let (t, k, d) = (c.t, c.kv, c.d);
    let heads = s.heads;
    let rep = heads * k * s.head_dim * d;
    let out_bytes = t * heads * s.head_dim * d;
    let scores = heads * t * k;
    let (kr, vr) = repeat_kv(p, s, rep);
    let raw = p.act(scores * d);
    let scaled = p.act(scores * d);
    p.free(raw);
    // `attn_weights` holds the masked scores until it is rebound to the probabilities
    let weights = if c.mask {
        let masked = p.act(scores * d);
        p.free(scaled);
        masked
    } else {
        scaled
    };
    let joined = p.act(heads * t * (k + 1) * d);
    // `max(dim=-1, keepdim=True)`: values and int64 indices; the named tuple goes (with its
    // indices) once `.values` is read, the values after the subtraction
    let max_values = p.act(heads * t * d);
    let max_indices = p.act(heads * t * 8);
    p.free(max_indices);
    let shifted = p.act(heads * t * (k + 1) * d);
    p.free(max_values);
    p.free(joined);
    let probs = p.act(heads * t * (k + 1) * d);
    p.free(weights);
    let o = p.act(out_bytes);
    // `transpose(1, 2).contiguous()` copies unless the query is one token (then the
    // transposed tensor is already contiguous)
    let o = if t > 1 {
        let o2 = p.act(out_bytes);
        p.free(o);
        o2
    } else {
        o
    };
    // the function returns: the repeated keys and values and the shifted logits go; the
    // probabilities stay with the returned view
    p.free(kr);
    p.free(vr);
    p.free(shifted);
    AttnOut {
        out: o,
        held: probs,
    }
}

/// Emits the attention call's allocations.
pub fn attention(p: &mut Prog, s: &DecoderShape, c: AttnCall) -> AttnOut {
    let (t, k, d) = (c.t, c.kv, c.d);
    let heads = s.heads;
    let hd = s.head_dim;
    let rep = heads * k * hd * d;
    let out_bytes = t * heads * hd * d;
    let scores = heads * t * k;
    match c.imp {
        Attention::Eager if s.sinks => eager_with_sinks(p, s, c),
        Attention::Eager => {
            let (kr, vr) = repeat_kv(p, s, rep);
            // `matmul(q, kᵀ)`: q (a transposed view of the RoPE output) is copied contiguous
            // for the batched GEMM when it has more than one position; an MQA key (a stride-0
            // expand) is materialised for the call
            // (Phi-3's q is the contiguous output of a `cat`: no copy)
            let qc = if t > 1 && !s.rope_cat {
                p.act(out_bytes)
            } else {
                Buf::NONE
            };
            let kc = if s.kv_heads == 1 && s.heads > 1 {
                p.act(rep)
            } else {
                Buf::NONE
            };
            let raw = p.act(scores * d);
            // `at::matmul`'s folded operands go in reverse order (C++ locals)
            p.free(kc);
            p.free(qc);
            let mut scaled = p.act(scores * d);
            p.free(raw);
            if s.attn_softcap {
                // Gemma 2, bound to `attn_weights`
                scaled = p.soft_cap(scaled, scores * d);
            }
            let masked = p.act(scores * d);
            p.free(scaled);
            // `softmax(w, dtype=float32).to(dtype)`: ATen converts bf16 scores to fp32 first
            // (fp16 has a half-to-float kernel); the scores go when the result is bound
            let conv = if c.bf16 { p.act(scores * 4) } else { Buf::NONE };
            let p32 = p.act(scores * 4);
            p.free(conv);
            let probs = if d == 4 {
                p32
            } else {
                let pd = p.act(scores * d);
                p.free(p32);
                pd
            };
            p.free(masked);
            let vc = if (s.kv_heads == 1 && s.heads > 1) || (c.v_strided && !s.grouped()) {
                p.act(rep)
            } else {
                Buf::NONE
            };
            let o = p.act(out_bytes);
            p.free(vc);
            // `transpose(1, 2).contiguous()` of one query position is already contiguous
            let o = if t > 1 {
                let o2 = p.act(out_bytes);
                p.free(o);
                o2
            } else {
                o
            };
            p.free(kr);
            p.free(vr);
            AttnOut {
                out: o,
                held: probs,
            }
        }
        Attention::Sdpa if c.mask => {
            let (kr, vr) = repeat_kv(p, s, rep);
            let fm = p.act(t * k * d);
            let not = p.act(t * k);
            p.free(not);
            let padded = if k.is_multiple_of(16) {
                Buf::NONE
            } else {
                p.act(t * k.div_ceil(16) * 16 * d)
            };
            let out = p.act(out_bytes);
            // the memory-efficient kernel keeps an fp32 output accumulator when one pass
            // over the keys does not hold a head (head_dim > 128) and the output is 16-bit
            if d != 4 && hd > 128 {
                p.scratch(t * heads * hd * 4, 0);
            }
            p.free(padded);
            p.free(fm);
            p.free(kr);
            p.free(vr);
            AttnOut {
                out,
                held: Buf::NONE,
            }
        }
        Attention::Sdpa if d == 4 && s.grouped() => {
            // The math path with enable_gqa.
            let q_s = p.act(t * heads * hd * 4);
            let qc = if t > 1 {
                p.act(t * heads * hd * 4)
            } else {
                Buf::NONE
            };
            let causal = if t > 1 {
                let ones = p.fixed(t * k);
                let tril = p.fixed(t * k);
                p.free(ones);
                let fm = p.fixed(t * k * 4);
                let not = p.fixed(t * k);
                p.free(not);
                p.free(tril);
                fm
            } else {
                Buf::NONE
            };
            let kr = p.act(k * heads * hd * 4);
            let vr = p.act(k * heads * hd * 4);
            let ks = p.act(k * heads * hd * 4);
            let raw = p.act(scores * 4);
            p.free(qc);
            p.free(ks);
            // `_safe_softmax`: `softmax` (a new tensor), `isneginf` (a bool of the scores'
            // shape), `all(.., keepdim)` per row, then `where_out(out, rows, 0, out)` into the
            // softmax's own storage; the raw scores go when `attn` is reassigned
            let probs = p.act(scores * 4);
            let neginf = p.act(scores);
            let rows = p.act(heads * t);
            p.free(rows);
            p.free(neginf);
            p.free(raw);
            let o = p.act(out_bytes);
            p.free(probs);
            p.free(kr);
            p.free(vr);
            p.free(q_s);
            p.free(causal);
            let o2 = p.act(out_bytes);
            p.free(o);
            AttnOut {
                out: o2,
                held: Buf::NONE,
            }
        }
        Attention::Sdpa => {
            let out = p.act(out_bytes);
            if d != 4 {
                // flash: the fp32 logsumexp (batch, heads, t)
                p.scratch(heads * t * 4, 0);
            }
            AttnOut {
                out,
                held: Buf::NONE,
            }
        }
    }
}

/// `repeat_kv(key)`, `repeat_kv(value)`: `expand(...).reshape(...)` copies when several kv
/// heads are shared; one kv head (MQA) reshapes to a stride-0 view.
fn repeat_kv(p: &mut Prog, s: &DecoderShape, bytes: u64) -> (Buf, Buf) {
    if s.grouped() && s.kv_heads > 1 {
        (p.act(bytes), p.act(bytes))
    } else {
        (Buf::NONE, Buf::NONE)
    }
}
