//! One forward of a Llama-lineage decoder under `torch.no_grad()` (transformers 5.17
//! `modeling_llama.py` and its relatives), op by op in Python's order: what each op
//! allocates and when the last reference to each tensor goes.
//!
//! `LlamaModel.forward`: the embedding, the masks (`create_causal_mask` /
//! `create_sliding_window_causal_mask`), the rotary `cos`/`sin`, the layers, the final norm;
//! `LlamaForCausalLM.forward`: `lm_head` over the last `logits_to_keep` positions.
//! A layer: `residual = h; h = input_layernorm(h)`; q/k/v projections (q/k norms), RoPE,
//! `past_key_values.update` (the cache's own tensors replace k and v), attention, `o_proj`,
//! `h = residual + h`; `post_attention_layernorm`, the MLP
//! (`down(act(gate(x)) * up(x))`), `h = residual + h`.

use super::attention::{AttnCall, AttnOut, attention};
use super::device_map::Sub;
use super::kv::{dynamic_tokens, static_tokens};
pub use super::linear::{CUBLAS_WORKSPACE, Call, Process};
use super::linear::{linear, weights_out};
use super::program::{Buf, Prog};
use super::quant;
use super::setting::KvCache;
use super::shape::DecoderShape;
use crate::plan::config::Attention;
use crate::plan::events::Category;

/// One layer's cached keys and values.
#[derive(Debug, Clone, Copy)]
struct LayerKv {
    k: Buf,
    v: Buf,
}

/// The KV cache across the calls of one `generate` (or one forward).
#[derive(Debug)]
pub struct Cache {
    kind: KvCache,
    /// `max_cache_len` of a static cache.
    max_len: u64,
    layers: Vec<Option<LayerKv>>,
    /// Tokens seen so far (`cumulative_length`).
    pub seen: u64,
}

impl Cache {
    pub fn new(kind: KvCache, max_len: u64, layers: u64) -> Cache {
        Cache {
            kind,
            max_len,
            layers: vec![None; layers as usize],
            seen: 0,
        }
    }

    /// Beam search's `reorder_cache(beam_idx)` (`CacheLayerMixin.reorder_cache`): per layer
    /// `self.keys = self.keys.index_select(0, beam_idx)`, then the values: a new tensor of
    /// what the layer holds, the old one freed. A dynamic sliding layer holds a view of its
    /// last `window − 1` tokens (of `row` bytes each, per sequence): the copy is that view's.
    pub fn reorder(&mut self, p: &mut Prog, windows: &[Option<u64>], row: u64) {
        for (l, slot) in self.layers.iter_mut().enumerate() {
            let Some(kv) = slot else { continue };
            let copy = |p: &mut Prog, b: Buf| match (self.kind, windows.get(l).copied().flatten()) {
                (KvCache::Dynamic, Some(w)) => {
                    // per-sample bytes count every sequence of a prompt
                    let held = p.per_sample_of(b) / (row * p.per_prompt.max(1)).max(1);
                    let kept = held.min(w.saturating_sub(1));
                    if kept == held {
                        p.copy_of(b, Category::KvCache)
                    } else {
                        p.alloc(kept * row, 0, Category::KvCache)
                    }
                }
                _ => p.copy_of(b, Category::KvCache),
            };
            let k = copy(p, kv.k);
            p.free(kv.k);
            let v = copy(p, kv.v);
            p.free(kv.v);
            *slot = Some(LayerKv { k, v });
        }
    }

    /// Frees every layer's keys and values (the cache object dropped).
    pub fn release(&mut self, p: &mut Prog) {
        for l in self.layers.iter_mut() {
            if let Some(kv) = l.take() {
                p.free(kv.k);
                p.free(kv.v);
            }
        }
    }
}

/// A decoder layer's projection `sub` of `k` to `n` features over the call's tokens:
/// `nn.Linear`, or bitsandbytes' `Linear4bit` / `Linear8bitLt` ([`quant::linear`]). An
/// offloaded one (a device map with `llm_int8_enable_fp32_cpu_offload`) stays quantized
/// (transformers 5.17 converts the linears while `device_map` is still `"auto"`): its
/// quantized tensors are copied in before the product and dropped after it.
fn proj(p: &mut Prog, proc: &mut Process, c: &Call, sub: Sub, k: u64, n: u64) -> Buf {
    match c.quant {
        Some(q) => quant_proj(p, proc, q, c, sub, (k, n), 0),
        None => linear(p, proc, sub, c.t * n * c.d),
    }
}

/// [`quant::linear`] of `sub` with an offloaded module's weights copied in around it.
fn quant_proj(
    p: &mut Prog,
    proc: &mut Process,
    q: crate::plan::policy::QuantStorage,
    c: &Call,
    sub: Sub,
    kn: (u64, u64),
    outliers: u64,
) -> Buf {
    let mut w = proc.weights_in(p, sub);
    if !q.quant.is_4bit() && w.len() >= 2 {
        // `init_8bit_state`: the module's state takes the new int8 weight and row scales (the
        // first two copies), dropping the last call's; they outlive this call's post_forward
        let weight: Vec<Buf> = w.drain(..2).collect();
        if let Some(old) = proc.int8_held.insert((proc.layer, sub), weight) {
            for b in old {
                p.free(b);
            }
        }
    }
    let out = quant::linear(p, proc, q, c, kn, outliers);
    weights_out(p, w);
    out
}

/// The MLP's `down_proj` (`k` = intermediate): a quantized one's input may hold LLM.int8
/// outlier columns.
fn down_proj(p: &mut Prog, proc: &mut Process, s: &DecoderShape, c: &Call) -> Buf {
    let k = s.intermediate;
    match c.quant {
        Some(q) if !q.quant.is_4bit() => {
            let m = c.batch.saturating_mul(c.t);
            let cols = c.outliers.down_proj_columns(s.hidden, s.gemma, m, k);
            quant_proj(p, proc, q, c, Sub::Down, (k, s.hidden), cols)
        }
        _ => proj(p, proc, c, Sub::Down, k, s.hidden),
    }
}

/// [`rms_norm`] of the norm module `sub` (an offloaded one's weight copied in around it).
#[allow(clippy::too_many_arguments)]
fn norm(
    p: &mut Prog,
    proc: &Process,
    sub: Sub,
    s: &DecoderShape,
    n: u64,
    rows: u64,
    d: u64,
) -> Buf {
    let w = proc.weights_in(p, sub);
    let out = rms_norm(p, s, n, rows, d);
    weights_out(p, w);
    out
}

/// RMSNorm over `n` elements per sequence (`rows` rows): Llama's `x.to(fp32)`, `pow`,
/// `mean`, `x * rsqrt`, `.to(dtype)`, `weight *`; Gemma's `x.float()`, the same, `* (1 +
/// w.float())` in fp32, `.type_as(x)`. `to` of a tensor already in the dtype is the tensor.
fn rms_norm(p: &mut Prog, s: &DecoderShape, n: u64, rows: u64, d: u64) -> Buf {
    if s.fp32_product_norm {
        return rms_norm_fp32_product(p, n, rows, d);
    }
    let up = if d == 4 { Buf::NONE } else { p.act(n * 4) };
    let sq = p.act(n * 4);
    let var = p.act(rows * 4);
    p.free(sq);
    if !s.gemma {
        // `rsqrt(variance + eps)`: the sum and the root, per row (traced on the CPU,
        // `crates/core/tests/infer_moe.rs`)
        let eps = p.act(rows * 4);
        let rs = p.act(rows * 4);
        p.free(eps);
        let normed = p.act(n * 4);
        p.free(rs);
        // `hidden_states = hidden_states * rsqrt(...)` replaces the fp32 copy; `variance`
        // and the normalised tensor live until `return self.weight * hidden_states.to(dtype)`
        p.free(up);
        let cast = if d == 4 { Buf::NONE } else { p.act(n * d) };
        let out = p.act(n * d);
        p.free(cast);
        p.free(normed);
        p.free(var);
        return out;
    }
    // Gemma's `_norm(x.float())`: `x * rsqrt(x.pow(2).mean(-1) + eps)`, each a temporary;
    // `_norm` returns and its argument `x.float()` goes
    let eps = p.act(rows * 4);
    p.free(var);
    let rs = p.act(rows * 4);
    p.free(eps);
    let normed = p.act(n * 4);
    p.free(rs);
    p.free(up);
    // `output * (1.0 + self.weight.float())`: the weight's fp32 copy (none in fp32) and the
    // sum, one element per feature
    let width = n / rows.max(1);
    let wf = if d == 4 {
        Buf::NONE
    } else {
        p.fixed(width * 4)
    };
    let w1 = p.fixed(width * 4);
    p.free(wf);
    let scaled = p.act(n * 4);
    p.free(w1);
    p.free(normed);
    if d == 4 {
        return scaled;
    }
    let out = p.act(n * d);
    p.free(scaled);
    out
}

/// gpt-oss's RMSNorm (`GptOssRMSNorm.forward`), every op: `x.to(fp32)`, `pow(2)`,
/// `mean`, `+ eps`, `rsqrt`, `x * rsqrt` (the fp32 copy dropped), `(weight * x).to(dtype)`;
/// the normalised tensor and `variance` go when it returns.
fn rms_norm_fp32_product(p: &mut Prog, n: u64, rows: u64, d: u64) -> Buf {
    let up = if d == 4 { Buf::NONE } else { p.act(n * 4) };
    let sq = p.act(n * 4);
    let var = p.act(rows * 4);
    p.free(sq);
    let eps = p.act(rows * 4);
    let rs = p.act(rows * 4);
    p.free(eps);
    let normed = p.act(n * 4);
    p.free(rs);
    p.free(up);
    let scaled = p.act(n * 4);
    let out = if d == 4 {
        scaled
    } else {
        let out = p.act(n * d);
        p.free(scaled);
        out
    };
    p.free(normed);
    p.free(var);
    out
}

/// `(x * cos) + (rotate_half(x) * sin)` over `x_bytes` per sequence.
fn rope(p: &mut Prog, x_bytes: u64) -> Buf {
    let a = p.act(x_bytes);
    let neg = p.act(x_bytes / 2);
    let rot = p.act(x_bytes);
    p.free(neg);
    let b = p.act(x_bytes);
    p.free(rot);
    let out = p.act(x_bytes);
    p.free(a);
    p.free(b);
    out
}

/// gpt-oss's `_apply_rotary_emb` over `x_bytes` per sequence: the halves of `chunk(x, 2)`,
/// `first_ = first * cos - second * sin`, `second_ = second * cos + first * sin`,
/// `cat((first_, second_))` (a contiguous result); `first_`, `second_` go when it returns.
fn rope_chunked(p: &mut Prog, x_bytes: u64) -> Buf {
    let half = x_bytes / 2;
    let mut parts = [Buf::NONE; 2];
    for part in parts.iter_mut() {
        let a = p.act(half);
        let b = p.act(half);
        *part = p.act(half);
        p.free(a);
        p.free(b);
    }
    let out = p.act(x_bytes);
    p.free(parts[0]);
    p.free(parts[1]);
    out
}

/// The rotary embedding's `cos`, `sin` for `t` positions, computed in fp32 and cast to the
/// dtype: batch-independent for `position_ids` of shape (1, t) (a plain forward), per
/// sequence for generate's (batch, t) ids (`_prepare_position_ids_for_generation`).
fn rotary(p: &mut Prog, s: &DecoderShape, c: &Call) -> (Buf, Buf) {
    let (t, d) = (c.t, c.d);
    let hd = s.head_dim;
    let alloc = |p: &mut Prog, bytes: u64| {
        if c.padding_mask {
            p.act(bytes)
        } else {
            p.fixed(bytes)
        }
    };
    let pos = alloc(p, t * 4);
    let freqs = alloc(p, t * hd / 2 * 4);
    // `emb = torch.cat((freqs, freqs))`; gpt-oss takes `emb = freqs` (its RoPE rotates the
    // two halves with the same angles)
    let (emb, hd) = if s.chunked_rope {
        (Buf::NONE, hd / 2)
    } else {
        (alloc(p, t * hd * 4), hd)
    };
    let mut pair = [Buf::NONE; 2];
    for slot in pair.iter_mut() {
        let raw = alloc(p, t * hd * 4);
        let scaled = alloc(p, t * hd * 4);
        p.free(raw);
        *slot = scaled;
    }
    let out = if d == 4 {
        (pair[0], pair[1])
    } else {
        let cos = alloc(p, t * hd * d);
        let sin = alloc(p, t * hd * d);
        p.free(pair[0]);
        p.free(pair[1]);
        (cos, sin)
    };
    p.free(emb);
    p.free(freqs);
    p.free(pos);
    out
}

/// The kv length a layer's mask is built for and whether the mask is materialized
/// (`masking_utils.sdpa_mask` / `eager_mask`, `_ignore_causal_mask_sdpa`).
fn mask_of(cache: &Cache, window: Option<u64>, c: &Call) -> (u64, bool) {
    let cached = cache.seen;
    let kv = match (cache.kind, window) {
        (KvCache::Dynamic, None) => cached + c.t,
        (KvCache::Dynamic, Some(w)) => {
            if cached >= w {
                w - 1 + c.t
            } else {
                cached + c.t
            }
        }
        (KvCache::Static, None) => cache.max_len,
        (KvCache::Static, Some(w)) => {
            let wc = static_tokens(Some(w), cache.max_len);
            if cached >= wc {
                wc + c.t - 1
            } else if cached + c.t > wc {
                cached + c.t
            } else {
                wc
            }
        }
    };
    if c.imp == Attention::Eager {
        return (kv, true);
    }
    // A compileable (static) cache never skips the mask of a one-token query.
    if cache.kind == KvCache::Static && c.t == 1 {
        return (kv, true);
    }
    if let Some(w) = window
        && kv >= w
    {
        return (kv, true);
    }
    // No padding: skipped when the query is one token or covers every key, or (from
    // position 0) the keys past the query are all padding of a static cache.
    let skip = c.t == 1 || kv == c.t || cached == 0;
    (kv, !skip)
}

/// Builds a materialized mask of `t × kv` (per sequence with a padding mask, else one
/// expanded over the batch); eager converts it to the dtype (always per sequence).
fn build_mask(p: &mut Prog, t: u64, kv: u64, c: &Call) -> Buf {
    let causal = p.fixed(t * kv);
    let mask = if c.padding_mask {
        let m = p.act(t * kv);
        p.free(causal);
        m
    } else {
        causal
    };
    if c.imp == Attention::Eager {
        let f = p.act(t * kv * c.d);
        p.free(mask);
        f
    } else {
        mask
    }
}

/// One forward: returns the logits (`keep` positions); the cache keeps its tensors.
pub fn forward(
    p: &mut Prog,
    proc: &mut Process,
    s: &DecoderShape,
    cache: &mut Cache,
    c: Call,
) -> Buf {
    let (t, d) = (c.t, c.d);
    let h_bytes = t * s.hidden * d;
    proc.layer = None;
    let w = proc.weights_in(p, Sub::Embed);
    let mut h = p.act(h_bytes);
    if s.gemma {
        let scaled = p.act(h_bytes);
        p.free(h);
        h = scaled;
    }
    weights_out(p, w);
    // `hidden_states = inputs_embeds`: the local `inputs_embeds` keeps the embedding until
    // the model's forward returns.
    let embeds = h;
    // Masks, one per kind of layer present (full / sliding), built once per forward.
    let mut masks: Vec<(Option<u64>, u64, bool, Buf)> = Vec::new();
    for &w in &s.windows {
        if masks.iter().any(|m| m.0 == w) {
            continue;
        }
        let (kv, on) = mask_of(cache, w, &c);
        let b = if on {
            build_mask(p, t, kv, &c)
        } else {
            Buf::NONE
        };
        masks.push((w, kv, on, b));
    }
    let mut rotaries = vec![rotary(p, s, &c)];
    if s.two_rotaries {
        rotaries.push(rotary(p, s, &c));
    }
    let cached = cache.seen;
    for l in 0..s.layers as usize {
        let window = s.windows[l];
        let mask_on = masks.iter().find(|m| m.0 == window).is_some_and(|m| m.2);
        let h3 = layer(p, proc, s, cache, l, &c, mask_on);
        // the layer returns: the caller's `hidden_states` (its input) is replaced
        if h != embeds {
            p.free(h);
        }
        h = h3;
    }
    cache.seen = cached + t;
    proc.layer = None;
    for (_, _, _, b) in masks {
        p.free(b);
    }
    for (cos, sin) in rotaries {
        p.free(cos);
        p.free(sin);
    }
    let hn = norm(p, proc, Sub::FinalNorm, s, t * s.hidden, t, d);
    p.free(h);
    if h != embeds {
        p.free(embeds);
    }
    let mut logits = linear(p, proc, Sub::LmHead, c.keep * s.vocab * d);
    if s.final_softcap {
        logits = p.soft_cap(logits, c.keep * s.vocab * d);
    }
    p.free(hn);
    logits
}

/// Decoder layer `l` on the hidden states of the call (`c.t` tokens of `hidden` per
/// sequence; the caller's buffer, not freed here), with `cache.seen` tokens cached before
/// this forward and its mask materialized or not (`mask_on`; built by the caller, as are the
/// rotary `cos`/`sin`). Returns the layer's output.
pub fn layer(
    p: &mut Prog,
    proc: &mut Process,
    s: &DecoderShape,
    cache: &mut Cache,
    l: usize,
    c: &Call,
    mask_on: bool,
) -> Buf {
    let c = *c;
    let (t, d) = (c.t, c.d);
    let h_bytes = t * s.hidden * d;
    let window = s.windows[l];
    let cached = cache.seen;
    proc.layer = Some(l as u64);
    let x = norm(p, proc, Sub::InputNorm, s, t * s.hidden, t, d);
    let (q_bytes, kv_bytes) = (t * s.q_width() * d, t * s.kv_width() * d);
    let (q, k, v, fused) = if s.fused {
        let qkv_width = s.q_width() + 2 * s.kv_width();
        let qkv = proj(p, proc, &c, Sub::Qkv, s.hidden, qkv_width);
        (Buf::NONE, Buf::NONE, Buf::NONE, qkv)
    } else if s.qk_norm && !s.gemma {
        // Qwen3: `q_norm(q_proj(x).view(...))`, then k's, then `v_proj`: each projection goes
        // once its norm returns
        let q = proj(p, proc, &c, Sub::Q, s.hidden, s.q_width());
        let qn = norm(p, proc, Sub::QNorm, s, t * s.q_width(), t * s.heads, d);
        p.free(q);
        let k = proj(p, proc, &c, Sub::K, s.hidden, s.kv_width());
        let kn = norm(p, proc, Sub::KNorm, s, t * s.kv_width(), t * s.kv_heads, d);
        p.free(k);
        let v = proj(p, proc, &c, Sub::V, s.hidden, s.kv_width());
        (qn, kn, v, Buf::NONE)
    } else {
        let q = proj(p, proc, &c, Sub::Q, s.hidden, s.q_width());
        let k = proj(p, proc, &c, Sub::K, s.hidden, s.kv_width());
        let v = proj(p, proc, &c, Sub::V, s.hidden, s.kv_width());
        (q, k, v, Buf::NONE)
    };
    let (q, k) = if s.qk_norm && s.gemma {
        let qn = norm(p, proc, Sub::QNorm, s, t * s.q_width(), t * s.heads, d);
        p.free(q);
        let kn = norm(p, proc, Sub::KNorm, s, t * s.kv_width(), t * s.kv_heads, d);
        p.free(k);
        (qn, kn)
    } else {
        (q, k)
    };
    let (q_e, k_e) = if s.chunked_rope {
        (rope_chunked(p, q_bytes), rope_chunked(p, kv_bytes))
    } else if s.rope_cat {
        // Phi-3's `apply_rotary_pos_emb`: `cat([rotated q_rot, q_pass])` (partial rotary; an
        // empty pass-through at the full factor), the rotated half going once it is joined
        let mut pair = [Buf::NONE; 2];
        for (slot, bytes) in pair.iter_mut().zip([q_bytes, kv_bytes]) {
            let r = rope(p, bytes);
            *slot = p.act(bytes);
            p.free(r);
        }
        (pair[0], pair[1])
    } else {
        (rope(p, q_bytes), rope(p, kv_bytes))
    };
    p.free(q);
    p.free(k);
    let (kv_len, k_e_kept) = update(p, s, cache, l, window, t, cached, d);
    // the cache's tensors replace k and v, unless it returns the new ones themselves (a
    // static sliding layer's prefill longer than its window): then they are the attention
    // module's `key_states` / `value_states` until it returns
    if !k_e_kept {
        p.free(k_e);
        p.free(v);
    }
    // SDPA's causal path without a mask slices the keys to the query's length (a
    // static cache's prefill)
    let kv_len = if c.imp == Attention::Sdpa && !mask_on && t > 1 {
        kv_len.min(t)
    } else {
        kv_len
    };
    let AttnOut { out, held } = attention(
        p,
        s,
        AttnCall {
            t,
            kv: kv_len,
            mask: mask_on,
            d,
            bf16: c.bf16,
            imp: c.imp,
            v_strided: s.fused && k_e_kept,
        },
    );
    let a = proj(p, proc, &c, Sub::O, s.q_width(), s.hidden);
    // the attention module returns: its output (rebound to `o_proj`'s), then its locals in
    // binding order — a fused `qkv` before q — and the layer drops its input
    p.free(out);
    if k_e_kept {
        // a fused `qkv` lives on in the returned values, a view of it
        p.free(q_e);
        p.free(k_e);
        p.free(v);
        p.free(fused);
    } else {
        p.free(fused);
        p.free(q_e);
    }
    p.free(x);
    let a = if s.sandwich_norm {
        let n = norm(p, proc, Sub::PostAttnNorm, s, t * s.hidden, t, d);
        p.free(a);
        n
    } else {
        a
    };
    let h2 = p.act(h_bytes);
    p.free(a);
    let pre_mlp = if s.sandwich_norm {
        Sub::PreFfNorm
    } else {
        Sub::PostAttnNorm
    };
    let x2 = norm(p, proc, pre_mlp, s, t * s.hidden, t, d);
    let (m, mlp_held) = match &s.moe {
        Some(moe) if moe.sparse[l] => super::moe::block(p, proc, moe, s.hidden, x2, &c),
        _ => (mlp(p, proc, s, x2, &c), Buf::NONE),
    };
    // gpt-oss: `hidden_states, _ = self.mlp(...)` rebinds `_`, dropping the attention's
    // probabilities; the router scores take their place until the layer returns
    let (held, mlp_held) = if s.sinks {
        p.free(held);
        (mlp_held, Buf::NONE)
    } else {
        (held, mlp_held)
    };
    let m = if s.sandwich_norm {
        let n = norm(p, proc, Sub::PostFfNorm, s, t * s.hidden, t, d);
        p.free(m);
        n
    } else {
        m
    };
    let h3 = p.act(h_bytes);
    p.free(m);
    p.free(h2);
    p.free(held);
    p.free(mlp_held);
    h3
}

/// The MLP on `x2`; frees `x2` when the MLP returns.
fn mlp(p: &mut Prog, proc: &mut Process, s: &DecoderShape, x2: Buf, c: &Call) -> Buf {
    let i_bytes = c.t * s.intermediate * c.d;
    let (h, i) = (s.hidden, s.intermediate);
    let out = if s.fused {
        // gate_up_proj; gate, up = chunk(2); up * act(gate); down_proj
        let gu = proj(p, proc, c, Sub::GateUp, h, 2 * i);
        let act = p.act(i_bytes);
        let m = p.act(i_bytes);
        p.free(act);
        let out = down_proj(p, proc, s, c);
        p.free(m);
        p.free(gu);
        out
    } else {
        let g = proj(p, proc, c, Sub::Gate, h, i);
        let act = p.act(i_bytes);
        p.free(g);
        let u = proj(p, proc, c, Sub::Up, h, i);
        let m = p.act(i_bytes);
        p.free(act);
        p.free(u);
        let out = down_proj(p, proc, s, c);
        p.free(m);
        out
    };
    p.free(x2);
    out
}

/// `past_key_values.update(k, v, layer)`: returns the key length the attention sees and
/// whether the new keys themselves are what it returns (a static sliding layer's prefill
/// longer than its window), so they live until the attention returns.
#[allow(clippy::too_many_arguments)]
fn update(
    p: &mut Prog,
    s: &DecoderShape,
    cache: &mut Cache,
    l: usize,
    window: Option<u64>,
    t: u64,
    cached: u64,
    d: u64,
) -> (u64, bool) {
    let row = s.kv_width() * d;
    match cache.kind {
        KvCache::Dynamic => {
            let tokens = dynamic_tokens(window, cached, t);
            let old = cache.layers[l];
            let (k, v) = if window.is_some() {
                // `DynamicSlidingWindowLayer.update`: `full_key_states = cat(...)`,
                // `full_value_states = cat(...)`, then `self.keys` / `self.values` become
                // views of them: both old tensors go after both new ones exist
                let k = p.alloc(tokens * row, 0, Category::KvCache);
                let v = p.alloc(tokens * row, 0, Category::KvCache);
                if let Some(o) = old {
                    p.free(o.k);
                    p.free(o.v);
                }
                (k, v)
            } else {
                // `DynamicLayer.update`: `self.keys = cat(...)` drops the old keys before the
                // values are concatenated
                let k = p.alloc(tokens * row, 0, Category::KvCache);
                if let Some(o) = old {
                    p.free(o.k);
                }
                let v = p.alloc(tokens * row, 0, Category::KvCache);
                if let Some(o) = old {
                    p.free(o.v);
                }
                (k, v)
            };
            cache.layers[l] = Some(LayerKv { k, v });
            (tokens, false)
        }
        KvCache::Static => {
            let len = static_tokens(window, cache.max_len);
            if cache.layers[l].is_none() {
                let k = p.alloc(len * row, 0, Category::KvCache);
                let v = p.alloc(len * row, 0, Category::KvCache);
                cache.layers[l] = Some(LayerKv { k, v });
            }
            match window {
                Some(_) if cached >= len => {
                    // full: roll(-1) copies of keys and values, written back with copy_
                    let nk = p.act(len * row);
                    let nv = p.act(len * row);
                    // `index = torch.tensor([-1], device=...)`, put into with `[:, :, index]`
                    let index = p.fixed(8);
                    p.free(nk);
                    p.free(nv);
                    p.free(index);
                    (len, false)
                }
                Some(_) if cached + t > len => {
                    if cached == 0 {
                        (t, true)
                    } else {
                        let fk = p.act((cached + t) * row);
                        let fv = p.act((cached + t) * row);
                        p.free(fk);
                        p.free(fv);
                        (cached + t, false)
                    }
                }
                _ => {
                    // `cache_position = torch.arange(t) + self.cumulative_length` (two int64
                    // tensors, the first a temporary); `index_copy_` in place
                    let arange = p.fixed(t * 8);
                    let position = p.fixed(t * 8);
                    p.free(arange);
                    p.free(position);
                    (len, false)
                }
            }
        }
    }
}
