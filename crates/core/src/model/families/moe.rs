//! The sparse mixture-of-experts block of Mixtral, Qwen2-MoE and Qwen3-MoE (transformers
//! 5.17, `models/{mixtral,qwen2_moe,qwen3_moe}/modeling_*.py`), in place of the decoder's
//! dense MLP. The experts run transformers' default experts implementation, `grouped_mm`
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
pub use super::moe_params::MoeParams;
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Op, Pointwise, TensorId};

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
    let e = m.num_experts;
    let k = m.num_experts_per_tok;
    let inter = m.moe_intermediate_size;
    let rows = m.routed_rows(seq, imbalance);
    let shared = m.shared_expert_intermediate_size.map(|s| {
        let out = dense_mlp(b, x, seq, c, s, "mlp.shared_expert", act);
        (out, s)
    });
    // Router.
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
    if m.output_router_logits {
        // load_balancing_loss_func: softmax(layer_gate) of each layer's logits.
        b.op(
            Op::Softmax { fp32: true },
            &[logits],
            seq * e,
            &[],
            "aux_loss.softmax",
        );
    }
    let mut scores = b.op(Op::TopK, &[probs], seq * k, &[], "mlp.gate.topk");
    if m.norm_topk_prob {
        // `router_top_value /= router_top_value.sum(-1, keepdim=True)` (k values per token).
        scores = b.pointwise(scores, Pointwise::Scale, true, "mlp.gate.renorm");
    }
    if !m.fp32_scores {
        scores = b.op(Op::ToComputeDtype, &[scores], seq * k, &[], "mlp.gate.to");
    }
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
    let out = b.op(Op::TypeAs, &[summed, x], seq * c, &[], "mlp.experts.to");
    let Some((shared_out, _)) = shared else {
        return out;
    };
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
    b.binary(out, gated, Pointwise::Add, false, "mlp.add_shared")
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
