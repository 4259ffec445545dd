//! The sparse mixture-of-experts block of Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 and
//! gpt-oss (transformers 5.17, `models/{mixtral,qwen2_moe,qwen3_moe,deepseek_v3,gpt_oss}/
//! modeling_*.py`), in place of the decoder's dense MLP. The router ([`RouterKind`]), the
//! experts ([`ExpertsKind`]) and the shared expert (gated or not) are options; below the
//! softmax router and `grouped_mm` experts, the others at their functions. The experts run transformers' default experts implementation, `grouped_mm`
//! (`integrations/moe.py`, `grouped_mm_experts_forward`): every routed (token, expert) row
//! of all experts in one grouped GEMM against the fused 3-D expert weights, so the memory
//! of a step does not depend on how the router spreads the tokens.
//!
//! Per MoE layer, `x` = the post-attention norm's output (`seq` rows of `hidden`):
//!
//! 1. router: `gate` linear (no bias) → softmax in fp32 (Mixtral: of `logits.float()`;
//!    Qwen: `softmax(dtype=float)`) → `topk` → renormalised by the top-k sum (Mixtral
//!    always, Qwen with `norm_topk_prob`) → Qwen casts the scores back to the logits' dtype;
//! 2. `hidden[perm // k]`: the routed rows sorted by expert (`seq·k` rows), and the scores
//!    in the same order (`scores[perm]`);
//! 3. `_grouped_mm` with `gate_up_proj` → `masked_fill` → `act(gate) * up` →
//!    `_grouped_mm` with `down_proj` → `masked_fill` → `× scores` → `[inv_perm]` →
//!    `view(tokens, k, hidden).sum(1)` → `.to(hidden.dtype)`;
//! 4. Qwen2-MoE adds its shared expert (a dense MLP) gated by `sigmoid(shared_expert_gate(x))`.
//!
//! `moe_imbalance` ≥ 1 sizes the routed rows for a worst case: every expert's buffer as
//! large as the busiest expert's, which receives `imbalance ×` its `seq·k/E` share (the
//! padded per-expert buffers of capacity-style dispatch); 1 is transformers' exact count.
//! The router logits kept for the auxiliary loss (`output_router_logits`) add one fp32
//! softmax per MoE layer, saved for backward.

use super::llama::LlamaParams;
pub use super::moe_params::{ExpertsKind, MoeParams, RouterKind};
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Op, ParamId, Pointwise, TensorId};

/// Mixtral's / Qwen's dense MLP (`gate_proj`, `up_proj`, `down_proj`, no bias) of width
/// `inter` on `x`; `act` applies the activation.
pub fn dense_mlp(
    b: &mut GraphBuilder,
    x: TensorId,
    seq: u64,
    hidden: u64,
    inter: u64,
    prefix: &str,
    act: &dyn Fn(&mut GraphBuilder, TensorId, u64, &str) -> TensorId,
) -> TensorId {
    let g = b.linear(x, seq, hidden, inter, false, &format!("{prefix}.gate_proj"));
    let g = act(b, g, seq * inter, &format!("{prefix}.act_fn"));
    let u = b.linear(x, seq, hidden, inter, false, &format!("{prefix}.up_proj"));
    let m = b.binary(g, u, Pointwise::Mul, false, &format!("{prefix}.mul"));
    b.linear(m, seq, inter, hidden, false, &format!("{prefix}.down_proj"))
}

/// The sparse MoE block on `x` (`seq` rows of `hidden` per sample); returns its output.
pub fn block(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    m: &MoeParams,
    x: TensorId,
    seq: u64,
    imbalance: f64,
    act: &dyn Fn(&mut GraphBuilder, TensorId, u64, &str) -> TensorId,
) -> TensorId {
    let c = p.hidden_size;
    let rows = m.routed_rows(seq, imbalance);
    // Qwen2-MoE runs its gated shared expert first; DeepSeek-V3 its shared experts last.
    let gated_shared = match m.shared_expert_intermediate_size {
        Some(s) if !m.shared_expert_ungated => {
            Some(dense_mlp(b, x, seq, c, s, "mlp.shared_expert", act))
        }
        _ => None,
    };
    let scores = match m.router {
        RouterKind::Softmax => softmax_router(b, m, x, seq, c),
        RouterKind::SigmoidGrouped {
            n_group,
            topk_group,
        } => sigmoid_grouped_router(b, m, x, seq, c, (n_group, topk_group)),
        RouterKind::TopKSoftmax => topk_softmax_router(b, m, x, seq, c),
    };
    let out = match m.experts {
        ExpertsKind::GroupedMm => grouped_mm_experts(b, m, x, scores, seq, c, rows, act),
        ExpertsKind::ClampedSwigluLoop => clamped_swiglu_loop(b, m, x, scores, seq, c, rows),
    };
    if let Some(shared_out) = gated_shared {
        let gate = b.linear(x, seq, c, 1, false, "mlp.shared_expert_gate");
        let gate = b.pointwise(
            gate,
            Pointwise::Sigmoid,
            false,
            "mlp.shared_expert_gate.sigmoid",
        );
        let gated = b.binary(
            shared_out,
            gate,
            Pointwise::Mul,
            false,
            "mlp.shared_expert.mul",
        );
        return b.binary(out, gated, Pointwise::Add, false, "mlp.add_shared");
    }
    match m.shared_expert_intermediate_size {
        Some(s) if m.shared_expert_ungated => {
            let shared = dense_mlp(b, x, seq, c, s, "mlp.shared_experts", act);
            b.binary(out, shared, Pointwise::Add, false, "mlp.add_shared")
        }
        _ => out,
    }
}

/// The load-balancing loss's `softmax` of a layer's router logits (`output_router_logits`).
fn aux_loss_softmax(b: &mut GraphBuilder, m: &MoeParams, logits: TensorId, seq: u64) {
    if m.output_router_logits {
        b.op(
            Op::Softmax { fp32: true },
            &[logits],
            seq * m.num_experts,
            &[],
            "aux_loss.softmax",
        );
    }
}

/// Mixtral's / Qwen's router: `gate` → softmax (fp32) → top-k → renormalised → (Qwen) cast
/// back to the logits' dtype. Returns the `seq·k` scores.
fn softmax_router(b: &mut GraphBuilder, m: &MoeParams, x: TensorId, seq: u64, c: u64) -> TensorId {
    let e = m.num_experts;
    let k = m.num_experts_per_tok;
    let logits = b.linear(x, seq, c, e, false, "mlp.gate");
    let probs_in = if m.fp32_scores {
        b.op(Op::ToF32, &[logits], seq * e, &[], "mlp.gate.float")
    } else {
        logits
    };
    let probs = b.op(
        Op::Softmax { fp32: true },
        &[probs_in],
        seq * e,
        &[],
        "mlp.gate.softmax",
    );
    aux_loss_softmax(b, m, logits, seq);
    let mut scores = b.op(Op::TopK, &[probs], seq * k, &[], "mlp.gate.topk");
    if m.norm_topk_prob {
        // `router_top_value /= router_top_value.sum(-1, keepdim=True)` (k values per token).
        scores = b.pointwise(scores, Pointwise::Scale, true, "mlp.gate.renorm");
    }
    if !m.fp32_scores {
        scores = b.op(Op::ToComputeDtype, &[scores], seq * k, &[], "mlp.gate.to");
    }
    scores
}

/// `DeepseekV3TopkRouter` (transformers 5.17, the choice is not under `no_grad`):
/// `F.linear(x.type(float32), weight.type(float32))` (under autocast the linear still runs
/// in the low precision), `sigmoid`, `scores + e_score_correction_bias`, the per-group
/// `topk(2)` (saves int64 indices) summed, the `topk_group` best groups (`topk`, saves its
/// indices), `masked_fill` of the other groups' experts (saves the bool mask), `topk(k)` (its
/// indices saved once more by the `gather` of the chosen scores), renormalised
/// (`norm_topk_prob`: the in-place division saves the denominator and the weights), `×
/// routed_scaling_factor`. The fp32 copy of the router weight that `weight.type(float32)`
/// makes under pure 16-bit training (`E × hidden`, saved, batch-independent) is not
/// modelled.
fn sigmoid_grouped_router(
    b: &mut GraphBuilder,
    m: &MoeParams,
    x: TensorId,
    seq: u64,
    c: u64,
    (n_group, topk_group): (u64, u64),
) -> TensorId {
    let e = m.num_experts;
    let k = m.num_experts_per_tok;
    let xf = b.op(Op::ToF32, &[x], seq * c, &[], "mlp.gate.float");
    let logits = b.linear(xf, seq, c, e, false, "mlp.gate");
    let scores = b.pointwise(logits, Pointwise::Sigmoid, false, "mlp.gate.sigmoid");
    let choice = b.pointwise(scores, Pointwise::Add, false, "mlp.gate.add_bias");
    let top2 = b.op(
        Op::TopK,
        &[choice],
        seq * n_group * 2,
        &[],
        "mlp.gate.group_top2",
    );
    let groups = b.op(
        Op::SumTopK,
        &[top2],
        seq * n_group,
        &[],
        "mlp.gate.group_sum",
    );
    b.op(
        Op::TopK,
        &[groups],
        seq * topk_group,
        &[],
        "mlp.gate.group_topk",
    );
    // `masked_fill(~score_mask, -inf)`: a new `seq × E` tensor, the bool mask saved.
    let masked = b.op(
        Op::Gather {
            indices: 0,
            mask: seq * e,
        },
        &[choice],
        seq * e,
        &[],
        "mlp.gate.masked_fill",
    );
    b.op(Op::TopK, &[masked], seq * k, &[], "mlp.gate.topk");
    let mut w = b.op(
        Op::Gather {
            indices: 0,
            mask: 0,
        },
        &[scores],
        seq * k,
        &[],
        "mlp.gate.gather",
    );
    if m.norm_topk_prob {
        // `topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20`
        let sum = b.op(Op::SumTopK, &[w], seq, &[], "mlp.gate.sum");
        let denom = b.pointwise(sum, Pointwise::Scale, false, "mlp.gate.eps");
        w = b.binary(w, denom, Pointwise::Mul, false, "mlp.gate.renorm");
    }
    b.pointwise(w, Pointwise::Scale, false, "mlp.gate.routed_scaling_factor")
}

/// `GptOssTopKRouter`: `F.linear(x, weight, bias)`, `topk` of the logits, `softmax` of the
/// k values (`dtype=` their own dtype).
fn topk_softmax_router(
    b: &mut GraphBuilder,
    m: &MoeParams,
    x: TensorId,
    seq: u64,
    c: u64,
) -> TensorId {
    let k = m.num_experts_per_tok;
    let logits = b.linear(x, seq, c, m.num_experts, true, "mlp.router");
    aux_loss_softmax(b, m, logits, seq);
    let top = b.op(Op::TopK, &[logits], seq * k, &[], "mlp.router.topk");
    b.op(
        Op::Softmax { fp32: false },
        &[top],
        seq * k,
        &[],
        "mlp.router.softmax",
    )
}

/// transformers' `grouped_mm` experts on the routed rows (see the module docs).
#[allow(clippy::too_many_arguments)]
fn grouped_mm_experts(
    b: &mut GraphBuilder,
    m: &MoeParams,
    x: TensorId,
    scores: TensorId,
    seq: u64,
    c: u64,
    rows: u64,
    act: &dyn Fn(&mut GraphBuilder, TensorId, u64, &str) -> TensorId,
) -> TensorId {
    let e = m.num_experts;
    let inter = m.moe_intermediate_size;
    // Experts (grouped_mm): rows sorted by expert.
    let routed = b.op(
        Op::Gather {
            indices: rows,
            mask: rows,
        },
        &[x],
        rows * c,
        &[],
        "mlp.experts.gather",
    );
    let scores = b.op(
        Op::Gather {
            indices: rows,
            mask: 0,
        },
        &[scores],
        rows,
        &[],
        "mlp.experts.scores",
    );
    let w1 = b.param(e * 2 * inter * c, Some((2 * inter, c)));
    let gu = b.op(
        Op::GroupedMm {
            in_features: c,
            out_features: 2 * inter,
        },
        &[routed],
        rows * 2 * inter,
        &[w1],
        "mlp.experts.gate_up_proj",
    );
    let gu = b.copy(gu, "mlp.experts.masked_fill");
    // `gate, up = gate_up.chunk(2, dim=-1)`; `act(gate) * up`.
    let parts = b.chunks(gu, 2, "mlp.experts.chunk");
    let g = act(b, parts[0], rows * inter, "mlp.experts.act_fn");
    let h = b.binary(g, parts[1], Pointwise::Mul, false, "mlp.experts.mul");
    let w2 = b.param(e * c * inter, Some((c, inter)));
    let d = b.op(
        Op::GroupedMm {
            in_features: inter,
            out_features: c,
        },
        &[h],
        rows * c,
        &[w2],
        "mlp.experts.down_proj",
    );
    let d = b.copy(d, "mlp.experts.masked_fill_down");
    let wtd = b.binary(d, scores, Pointwise::Mul, false, "mlp.experts.weighted");
    let back = b.op(
        Op::Gather {
            indices: rows,
            mask: 0,
        },
        &[wtd],
        rows * c,
        &[],
        "mlp.experts.inv_perm",
    );
    let summed = b.op(Op::SumTopK, &[back], seq * c, &[], "mlp.experts.sum");
    b.op(Op::TypeAs, &[summed, x], seq * c, &[], "mlp.experts.to")
}

/// `GptOssExperts.forward` in training: a Python loop over the experts hit. Each op below
/// stands for that op summed over the experts (the `rows` routed rows split between them),
/// so the saved tensors are exact and the per-expert temporaries are counted as if every
/// expert's were alive at once. Per expert: `x[token_idx]`, `@ gate_up_proj[e]` (autocast:
/// the weight slice cast and saved, all experts' together = the whole weight), `+ bias`
/// (an fp32 parameter: promotes under autocast), the clamped SwiGLU on the strided
/// `[..., ::2]` / `[..., 1::2]` halves, `@ down_proj[e] + bias`, `× routing_weights[...]`,
/// `.to(x.dtype)`, `index_add_` into `zeros_like(x)`.
fn clamped_swiglu_loop(
    b: &mut GraphBuilder,
    m: &MoeParams,
    x: TensorId,
    scores: TensorId,
    seq: u64,
    c: u64,
    rows: u64,
) -> TensorId {
    let e = m.num_experts;
    let inter = m.moe_intermediate_size;
    let routed = b.op(
        Op::Gather {
            indices: rows,
            mask: 0,
        },
        &[x],
        rows * c,
        &[],
        "mlp.experts.current_state",
    );
    let w1 = b.param(e * c * 2 * inter, Some((c, 2 * inter)));
    let gu = b.op(
        Op::Linear {
            in_features: c,
            out_features: 2 * inter,
        },
        &[routed],
        rows * 2 * inter,
        &[w1],
        "mlp.experts.gate_up_proj",
    );
    let b1 = b.param(e * 2 * inter, None);
    let gu = add_param(b, gu, b1, "mlp.experts.gate_up_proj_bias");
    let n = rows * inter;
    let gate = b.op(
        Op::Pointwise {
            f: Pointwise::Clamp,
            inplace: false,
        },
        &[gu],
        n,
        &[],
        "mlp.experts.gate_clamp",
    );
    let up = b.op(
        Op::Pointwise {
            f: Pointwise::Clamp,
            inplace: false,
        },
        &[gu],
        n,
        &[],
        "mlp.experts.up_clamp",
    );
    let ga = b.pointwise(gate, Pointwise::Scale, false, "mlp.experts.gate_alpha");
    let sig = b.pointwise(ga, Pointwise::Sigmoid, false, "mlp.experts.sigmoid");
    let glu = b.binary(gate, sig, Pointwise::Mul, false, "mlp.experts.glu");
    let up1 = b.pointwise(up, Pointwise::Scale, false, "mlp.experts.up_plus_one");
    let h = b.binary(up1, glu, Pointwise::Mul, false, "mlp.experts.gated_output");
    let w2 = b.param(e * inter * c, Some((inter, c)));
    let d = b.op(
        Op::Linear {
            in_features: inter,
            out_features: c,
        },
        &[h],
        rows * c,
        &[w2],
        "mlp.experts.down_proj",
    );
    let b2 = b.param(e * c, None);
    let d = add_param(b, d, b2, "mlp.experts.down_proj_bias");
    let wts = b.op(
        Op::Gather {
            indices: rows,
            mask: 0,
        },
        &[scores],
        rows,
        &[],
        "mlp.experts.routing_weights",
    );
    let wtd = b.binary(d, wts, Pointwise::Mul, false, "mlp.experts.weighted");
    let wtd = b.op(Op::TypeAs, &[wtd, x], rows * c, &[], "mlp.experts.to");
    // `index_add_` into `zeros_like(x)`: its backward selects the rows of the gradient.
    b.op(
        Op::Gather {
            indices: rows,
            mask: 0,
        },
        &[wtd],
        seq * c,
        &[],
        "mlp.experts.index_add",
    )
}

/// `x + bias[e]` with a parameter operand (promoted to its dtype under autocast).
fn add_param(b: &mut GraphBuilder, x: TensorId, bias: ParamId, name: &str) -> TensorId {
    let n = b.elems(x);
    b.op(
        Op::Pointwise {
            f: Pointwise::Add,
            inplace: false,
        },
        &[x],
        n,
        &[bias],
        name,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moe() -> MoeParams {
        MoeParams {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 64,
            norm_topk_prob: true,
            fp32_scores: true,
            shared_expert_intermediate_size: None,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            output_router_logits: false,
            router: RouterKind::Softmax,
            experts: ExpertsKind::GroupedMm,
            shared_expert_ungated: false,
        }
    }

    #[test]
    fn routed_rows_scale_with_the_imbalance_up_to_every_expert() {
        let m = moe();
        assert_eq!(m.routed_rows(100, 1.0), 200);
        assert_eq!(m.routed_rows(100, 1.5), 300);
        assert_eq!(m.routed_rows(100, 1.001), 201);
        assert_eq!(m.routed_rows(100, 100.0), 800);
    }

    #[test]
    fn sparse_layers_follow_step_and_mlp_only_layers() {
        let mut m = moe();
        m.decoder_sparse_step = 2;
        m.mlp_only_layers = vec![3];
        let sparse: Vec<u64> = (0..6).filter(|&l| m.is_sparse(l)).collect();
        assert_eq!(sparse, vec![1, 5]);
    }

    #[test]
    fn validation_names_the_field() {
        let mut m = moe();
        m.num_experts_per_tok = 9;
        let err = m.validate().expect_err("k > E").to_string();
        assert!(err.contains("num_experts_per_tok"), "{err}");
        let mut m = moe();
        m.num_experts = 0;
        let err = m.validate().expect_err("zero").to_string();
        assert!(err.contains("num_experts"), "{err}");
    }
}
