//! The sparse mixture-of-experts block of Mixtral, Qwen2-MoE and Qwen3-MoE under
//! `torch.no_grad()`, op by op (transformers 5.17: `models/{mixtral,qwen2_moe,qwen3_moe}/
//! modeling_*.py` and `integrations/moe.py`), in place of a decoder layer's dense MLP.
//!
//! The experts run transformers' default experts implementation, `grouped_mm`
//! (`PreTrainedModel.get_correct_experts_implementation`: `"grouped_mm"` when none is
//! requested; `grouped_mm_experts_forward`): every routed (token, expert) row of all experts
//! in one grouped GEMM against the 3-D expert weights, so the memory of a call does not depend
//! on how the router spreads the tokens. Per block, on `x` (`t` tokens per sequence):
//!
//! 1. the router (`*TopKRouter.forward`): `F.linear(x, weight)` (`t × E`), softmax in fp32
//!    (Qwen: `softmax(logits, dtype=float)`; Mixtral: `softmax(logits.float())`), `topk`
//!    (fp32 values, int64 indices), the in-place renormalisation by the top-k sum (Mixtral
//!    always, Qwen with `norm_topk_prob`), Qwen's cast of the scores back to the logits' dtype.
//!    The block keeps the logits (bound to `_`) until it returns;
//! 2. Qwen2-MoE's shared expert (a dense MLP of `shared_expert_intermediate_size`) runs
//!    first, on the block's input;
//! 3. the experts: `torch.sort` of the `t·k` expert ids (values and permutation), the rows
//!    `hidden_states[perm // k]`, `sample_weights[perm]`, `histc` of the ids as int32,
//!    `cumsum` offsets, the sentinel mask, `grouped_mm` with `gate_up_proj`, `masked_fill`,
//!    `act(gate) * up`, `grouped_mm` with `down_proj`, `masked_fill`, `× weights` (Mixtral's
//!    fp32 scores promote the product to fp32), `inv_perm` (`empty_like` + `arange`), the
//!    rows put back in token order, `view(t, k, hidden).sum(1)`, `.to(hidden.dtype)`;
//! 4. Qwen2-MoE: `sigmoid(shared_expert_gate(x)) * shared`, added to the experts' output.
//!
//! In generate's decode steps (`_optimize_model_for_decode`) the experts run
//! `batched_mm` instead: each routed row gathers its expert's weights ([`batched_experts`]).
//! Beam search's loop does not switch: in transformers 5.17 `_optimize_model_for_decode` is
//! entered only by `_sample` (`generation/utils.py`), not by `_beam_search`, so beam search's
//! decode steps are planned with `grouped_mm`, as they run (not measured on a GPU).
//!
//! Not modelled: the CUDA sort's cub scratch (`t·k` 8-byte keys and values, transient) and
//! `torch._grouped_mm`'s own argument buffer (a few bytes per expert).

use super::device_map::Sub;
use super::linear::{Call, Process, linear};
use super::program::{Buf, Prog};
use crate::model::families::moe_params::{ExpertsKind, MoeParams, RouterKind};
use crate::plan::PlanError;

/// The sizes of a model's MoE blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeShape {
    /// Experts per block (`num_experts` / `num_local_experts`).
    pub experts: u64,
    /// Experts a token is routed to (`num_experts_per_tok`).
    pub top_k: u64,
    /// One expert's width (`moe_intermediate_size`; Mixtral's `intermediate_size`).
    pub inter: u64,
    /// Qwen2-MoE's gated shared expert width.
    pub shared: Option<u64>,
    /// The top-k scores are renormalised by their sum.
    pub norm_topk: bool,
    /// Mixtral: `softmax(logits.float())` and fp32 scores to the end; Qwen: `softmax(dtype=
    /// float)` and the scores cast back to the logits' dtype.
    pub fp32_scores: bool,
    /// Per layer: whether its MLP is the sparse block (`decoder_sparse_step`,
    /// `mlp_only_layers`).
    pub sparse: Vec<bool>,
    /// gpt-oss: `GptOssTopKRouter` (a linear with bias, `topk` of the logits, softmax of the
    /// k values in their dtype) and `GptOssExperts` through the same `grouped_mm` forward
    /// with biases (`has_bias`, `is_transposed`) and its clamped SwiGLU `_apply_gate`;
    /// `GptOssMLP` returns the router scores, which the decoder layer holds (`_`).
    pub gpt_oss: bool,
}

impl MoeShape {
    /// The MoE shape of a decoder of `layers` layers, or an error naming what inference does
    /// not model yet (DeepSeek-V3's grouped sigmoid router, gpt-oss's experts).
    pub fn of(m: &MoeParams, layers: u64, model_type: &str) -> Result<MoeShape, PlanError> {
        // `ExpertsKind::ClampedSwigluLoop` is how the training graph writes gpt-oss's
        // experts; `GptOssExperts` is under `@use_experts_implementation` and runs the
        // `grouped_mm` forward by default (`experts_implementation` recorded on the device,
        // `tests/data/types30_moe_saved.jsonl`)
        let gpt_oss = matches!(
            (m.router, m.experts),
            (RouterKind::TopKSoftmax, ExpertsKind::ClampedSwigluLoop)
        );
        let unsupported = match (m.router, m.experts) {
            _ if m.shared_expert_ungated => Some("an ungated shared expert"),
            (RouterKind::Softmax, ExpertsKind::GroupedMm) => None,
            _ if gpt_oss => None,
            (RouterKind::SigmoidGrouped { .. }, _) => Some("DeepSeek-V3's grouped sigmoid router"),
            _ => Some("a router and experts that no model type pairs"),
        };
        if let Some(what) = unsupported {
            return Err(PlanError::Field {
                field: "model",
                reason: format!(
                    "inference (--step prefill|generate) of {model_type} is not modelled yet: \
                     its mixture-of-experts block has {what}; the inference planner mirrors \
                     Mixtral's and Qwen2/3-MoE's (training steps, --step train / eval, are \
                     planned)"
                ),
            });
        }
        Ok(MoeShape {
            experts: m.num_experts,
            top_k: m.num_experts_per_tok,
            inter: m.moe_intermediate_size,
            shared: m.shared_expert_intermediate_size,
            norm_topk: m.norm_topk_prob,
            fp32_scores: m.fp32_scores,
            sparse: (0..layers).map(|l| m.is_sparse(l)).collect(),
            gpt_oss,
        })
    }
}

/// A dense gated MLP of width `inter` on `x` (`down(act(gate(x)) * up(x))`, Qwen2-MoE's
/// shared expert); `x` stays.
fn dense(p: &mut Prog, proc: &mut Process, c: &Call, hidden: u64, inter: u64) -> Buf {
    let i_bytes = c.t * inter * c.d;
    let g = linear(p, proc, Sub::Gate, i_bytes);
    let act = p.act(i_bytes);
    p.free(g);
    let u = linear(p, proc, Sub::Up, i_bytes);
    let m = p.act(i_bytes);
    p.free(act);
    p.free(u);
    let out = linear(p, proc, Sub::Down, c.t * hidden * c.d);
    p.free(m);
    out
}

/// The router: returns (logits kept by the block, scores, indices).
fn router(p: &mut Prog, proc: &mut Process, m: &MoeShape, c: &Call) -> (Buf, Buf, Buf) {
    let (t, d, e, k) = (c.t, c.d, m.experts, m.top_k);
    let logits = linear(p, proc, Sub::Gate, t * e * d);
    if m.gpt_oss {
        // `topk(router_logits, k)`, `softmax(router_top_value, dim=1, dtype=its dtype)`; the
        // top values go when the router returns
        let values = p.act(t * k * d);
        let indices = p.act(t * k * 8);
        let scores = p.act(t * k * d);
        p.free(values);
        return (logits, scores, indices);
    }
    // ATen's `softmax(x, dtype=float)` converts first, except CUDA's half-to-float kernel
    // for fp16; `logits.float()` (Mixtral) is a copy for any 16-bit dtype
    let converted = if d == 4 || (!m.fp32_scores && !c.bf16) {
        Buf::NONE
    } else {
        p.act(t * e * 4)
    };
    let probs = p.act(t * e * 4);
    p.free(converted);
    let values = p.act(t * k * 4);
    let indices = p.act(t * k * 8);
    if m.norm_topk {
        // `router_top_value /= router_top_value.sum(dim=-1, keepdim=True)`
        p.scratch(t * 4, 0);
    }
    let scores = if m.fp32_scores || d == 4 {
        values
    } else {
        let cast = p.act(t * k * d);
        p.free(values);
        cast
    };
    // the router returns: its softmax goes
    p.free(probs);
    (logits, scores, indices)
}

/// The experts on `x` with the router's `scores` and `indices`: `batched_mm` in a decode
/// forward ([`Call::decode`]), `grouped_mm` otherwise. Returns the block's routed output
/// (`t × hidden` in the dtype); frees nothing of its arguments.
fn experts(p: &mut Prog, m: &MoeShape, hidden: u64, c: &Call) -> Buf {
    if c.decode {
        batched_experts(p, m, hidden, c)
    } else {
        grouped_experts(p, m, hidden, c)
    }
}

/// `batched_mm_experts_forward` (transformers 5.17 `integrations/moe.py`), which generate's
/// decode loop switches `grouped_mm` models to: every routed (token, expert) row gets its own
/// copy of its expert's weights, `gate_up_proj[expert_ids]` (`s × 2·inter × hidden`), then
/// `down_proj[expert_ids]` — evaluated before `selected_weights` is rebound, so both copies
/// are live at once — and one `bmm` per projection. With `s` rows that is `s` experts' worth
/// of weights per block, far above the rows themselves: a decode step's peak. In order:
/// `hidden_states.repeat_interleave(k)`, `expert_ids.clamp(0, E - 1)`, the gate-up weights
/// (gpt-oss: and biases) gathered, `bmm` (the bias added in place), `_apply_gate`, the down
/// weights (and biases) gathered, `bmm`, `× sample_weights` (Mixtral's fp32 scores promote
/// it), `view(t, k, hidden).sum(1)`, `.to(hidden.dtype)`.
fn batched_experts(p: &mut Prog, m: &MoeShape, hidden: u64, c: &Call) -> Buf {
    let (t, d, inter) = (c.t, c.d, m.inter);
    let s = t * m.top_k;
    let w = if m.fp32_scores { 4 } else { d };
    let rows = p.act(s * hidden * d);
    let ids = p.act(s * 8);
    let gate_up_w = p.act(s * 2 * inter * hidden * d);
    let gate_up_b = if m.gpt_oss {
        p.act(s * 2 * inter * d)
    } else {
        Buf::NONE
    };
    let gate_up = p.act(s * 2 * inter * d);
    let gated = apply_gate(p, m, s * inter * d);
    p.free(gate_up);
    let down_w = p.act(s * hidden * inter * d);
    p.free(gate_up_w);
    let down_b = if m.gpt_oss {
        p.act(s * hidden * d)
    } else {
        Buf::NONE
    };
    p.free(gate_up_b);
    let down = p.act(s * hidden * d);
    p.free(gated);
    let product_bytes = w.max(d);
    let weighted = p.act(s * hidden * product_bytes);
    // the function returns: its locals go in the order Python binds them
    sum_and_return(
        p,
        t * hidden,
        product_bytes,
        d,
        &[rows, ids, down_w, down_b, down, weighted],
    )
}

/// `grouped_mm_experts_forward` on `x` with the router's `scores` and `indices`; returns
/// the block's routed output (`t × hidden` in the dtype). Frees nothing of its arguments.
fn grouped_experts(p: &mut Prog, m: &MoeShape, hidden: u64, c: &Call) -> Buf {
    let (t, d, e) = (c.t, c.d, m.experts);
    let s = t * m.top_k;
    let w = if m.fp32_scores { 4 } else { d };
    let ids_sorted = p.act(s * 8);
    let perm = p.act(s * 8);
    let div = p.act(s * 8);
    let rows = p.act(s * hidden * d);
    p.free(div);
    let weights = p.act(s * w);
    let histc_input = p.act(s * 4);
    let per_expert = p.fixed(e * 4);
    let offsets = p.fixed(e * 4);
    let sentinel = p.act(s);
    // gpt-oss: `gate_up_proj_bias[expert_ids_g]`, added in place to the GEMM's output
    let bias = if m.gpt_oss {
        p.act(s * 2 * m.inter * d)
    } else {
        Buf::NONE
    };
    let gate_up = p.act(s * 2 * m.inter * d);
    let gate_up_masked = p.act(s * 2 * m.inter * d);
    p.free(gate_up);
    let gated = apply_gate(p, m, s * m.inter * d);
    p.free(gate_up_masked);
    // `selected_biases = down_proj_bias[expert_ids_g]` replaces the gate-up biases
    let bias = if m.gpt_oss {
        let down_bias = p.act(s * hidden * d);
        p.free(bias);
        down_bias
    } else {
        bias
    };
    let down = p.act(s * hidden * d);
    p.free(gated);
    let down_masked = p.act(s * hidden * d);
    p.free(down);
    // `proj_out * sample_weights_g.unsqueeze(-1)`: fp32 weights promote the product; the
    // masked rows (`proj_out`) live until the function returns
    let product_bytes = w.max(d);
    let weighted = p.act(s * hidden * product_bytes);
    let inv_perm = p.act(s * 8);
    p.scratch(s * 8, 0); // `torch.arange` put into `inv_perm[perm]`
    let back = p.act(s * hidden * product_bytes);
    p.free(weighted);
    // the function returns: its locals go in the order Python binds them (`expert_ids_g`,
    // `perm`, the rows, `sample_weights_g`, `histc_input`, `tokens_per_expert`, `offsets`,
    // `sentinel_mask`, `proj_out`, `weighted_out`, `inv_perm`)
    sum_and_return(
        p,
        t * hidden,
        product_bytes,
        d,
        &[
            ids_sorted,
            perm,
            rows,
            weights,
            histc_input,
            per_expert,
            offsets,
            sentinel,
            bias,
            down_masked,
            back,
            inv_perm,
        ],
    )
}

/// The end both experts functions share: `view(t, k, hidden).sum(1)` of the weighted rows
/// (`elems` = `t × hidden` elements in the product's `product_bytes`), `.to(hidden.dtype)`
/// (`d` bytes; no copy when the product is already in it), then the function returns and
/// `locals` go in the order Python binds them, and `final_hidden_states` with them unless it
/// is what `.to()` returned. Returns the block's routed output.
fn sum_and_return(p: &mut Prog, elems: u64, product_bytes: u64, d: u64, locals: &[Buf]) -> Buf {
    let summed = p.act(elems * product_bytes);
    let out = if product_bytes == d {
        Buf::NONE
    } else {
        p.act(elems * d)
    };
    for &b in locals {
        p.free(b);
    }
    if out == Buf::NONE {
        summed
    } else {
        p.free(summed);
        out
    }
}

/// `_apply_gate` on the masked gate-up rows (`n` bytes per half): the default's
/// `act_fn(gate) * up` on the two chunks, or gpt-oss's `gate.clamp(max=7)`,
/// `up.clamp(-7, 7)`, `gate * sigmoid(gate * 1.702)`, `(up + 1) * glu` on the interleaved
/// halves. Returns the gated rows.
fn apply_gate(p: &mut Prog, m: &MoeShape, n: u64) -> Buf {
    if !m.gpt_oss {
        let act = p.act(n);
        let gated = p.act(n);
        p.free(act);
        return gated;
    }
    let gate = p.act(n);
    let up = p.act(n);
    let scaled = p.act(n);
    let sig = p.act(n);
    p.free(scaled);
    let glu = p.act(n);
    p.free(sig);
    let up1 = p.act(n);
    let gated = p.act(n);
    p.free(up1);
    // the function returns: `gate`, `up`, `glu` go
    p.free(gate);
    p.free(up);
    p.free(glu);
    gated
}

/// The sparse block on `x` (the post-attention norm's output; freed when the block returns,
/// as the dense MLP frees it). Returns the output and what the decoder layer holds from it
/// (gpt-oss's router scores, bound to the layer's `_`; [`Buf::NONE`] otherwise).
pub fn block(
    p: &mut Prog,
    proc: &mut Process,
    m: &MoeShape,
    hidden: u64,
    x: Buf,
    c: &Call,
) -> (Buf, Buf) {
    let h_bytes = c.t * hidden * c.d;
    let shared = m.shared.map(|inter| dense(p, proc, c, hidden, inter));
    let (logits, scores, indices) = router(p, proc, m, c);
    let routed = experts(p, m, hidden, c);
    let out = match shared {
        Some(shared) => {
            let gate = linear(p, proc, Sub::Gate, c.t * c.d);
            let sig = p.act(c.t * c.d);
            p.free(gate);
            let gated = p.act(h_bytes);
            p.free(sig);
            p.free(shared);
            let sum = p.act(h_bytes);
            p.free(routed);
            // the block returns: `shared_expert_output` goes first (bound before `_`)
            p.free(gated);
            sum
        }
        None => routed,
    };
    // the block returns: the logits (`_`), the scores and the indices go (gpt-oss returns
    // its scores); the layer drops the block's input when `hidden_states` is rebound
    p.free(logits);
    let held = if m.gpt_oss {
        scores
    } else {
        p.free(scores);
        Buf::NONE
    };
    p.free(indices);
    p.free(x);
    (out, held)
}
