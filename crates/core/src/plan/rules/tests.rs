//! Unit tests of `rules` (moved beside it from an inline module).

use super::*;
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Elem, Op, Pointwise};
use crate::plan::sdpa_math::Step;

/// Builds `input → op` and returns the op's rule for `inputs` dtypes.
fn rule_of(op: Op, n_inputs: usize, with_param: bool, dtypes: &[DType], prec: Precision) -> Rule {
    let mut b = GraphBuilder::new();
    let ins: Vec<_> = (0..n_inputs).map(|_| b.input(100, Elem::Float)).collect();
    let params = if with_param {
        vec![b.param(10, Some((2, 5)))]
    } else {
        vec![]
    };
    b.op(op, &ins, 100, &params, "op");
    let g = b.finish();
    let node = g.nodes.last().expect("node");
    rule(&g, node, dtypes, prec, false)
}

const F32: DType = DType::F32;
const BF16: DType = DType::BF16;

fn conv(kernel: u64, groups: u64, cin: u64, cout: u64, hw_in: u64, hw_out: u64) -> ConvShape {
    ConvShape {
        transposed: false,
        kernel,
        groups,
        out_channels: cout,
        in_elems: cin * hw_in * hw_in,
        out_elems: cout * hw_out * hw_out,
        weight: cout * cin / groups * kernel * kernel,
    }
}

/// Bytes at batch `n` of a (per sample, fixed) pair in elements of `dt`.
fn at(n: u64, (ps, fx): (u64, u64), dt: DType) -> u64 {
    (n * ps + fx) * dt.size()
}

fn near(pred: u64, measured: u64) -> bool {
    (pred as f64 - measured as f64).abs() <= 0.02 * measured as f64
}

/// Against single-convolution measurements in tests/data/conv_workspace.jsonl.gz
/// (H100, PyTorch 2.11, cuDNN 9.19, fp32 with TF32).
#[test]
fn conv_workspace_matches_measured_convolutions() {
    // ResNet-50 layer1 3×3, batch 64: forward 102 908 051 B, weight gradient 104 972 967 B.
    let (fwd, ws) = conv_workspace(&conv(3, 1, 64, 64, 56, 56), F32);
    assert!(near(at(64, fwd, F32), 102_908_051));
    assert!(near(64 * ws.data.0 + ws.data.1, 102_908_051));
    assert!(near(64 * ws.filter.0 + ws.filter.1, 104_972_967));
    // 1×1 stride 1, 256 → 64, batch 64: only the weight gradient, 4 194 704 B.
    let (fwd, ws) = conv_workspace(&conv(1, 1, 256, 64, 56, 56), F32);
    assert_eq!(fwd, (0, 0));
    assert_eq!(ws.data, (0, 0));
    assert!(near(64 * ws.filter.0 + ws.filter.1, 4_194_704));
    // The 7×7 stem at batch 128: forward 488 149 776 B.
    let (fwd, _) = conv_workspace(&conv(7, 1, 3, 64, 224, 112), F32);
    assert!(near(at(128, fwd, F32), 488_149_776));
    // Depthwise 3×3 (EfficientNet): PyTorch's own kernel, nothing.
    let (fwd, ws) = conv_workspace(&conv(3, 32, 32, 32, 112, 112), F32);
    assert_eq!((fwd, ws), ((0, 0), ConvWorkspace::default()));
    // A 1×1 convolution on a 1×1 map (squeeze-excitation): nothing.
    let (_, ws) = conv_workspace(&conv(1, 1, 240, 10, 1, 1), BF16);
    assert_eq!(ws, ConvWorkspace::default());
    // A large 1×1 weight gradient takes the transform path: 512 → 2048 on a 6×6 map,
    // bf16, batch 96, measured 17 694 736 B (batch × weight × 4 would be 384 MiB).
    let (_, ws) = conv_workspace(&conv(1, 1, 512, 2048, 6, 6), BF16);
    assert!(near(96 * ws.filter.0 + ws.filter.1, 17_694_736));
}

/// Weight-gradient split-K partials beyond input + output, measured per convolution
/// (tests/data/conv_workspace.jsonl.gz): within 0.5 % of the measured workspace.
#[test]
fn weight_gradient_partials_match_measured_convolutions() {
    let close =
        |pred: u64, measured: u64| (pred as f64 - measured as f64).abs() <= 0.005 * measured as f64;
    let cases: &[(ConvShape, DType, u64, u64)] = &[
        // ResNet-18 layer1 3×3 64→64 at 56², fp32, batch 256: 394.11 MiB.
        (conv(3, 1, 64, 64, 56, 56), F32, 256, 413_254_311),
        // ResNet-18 layer2 3×3 128→128 at 28², fp32, batch 256: 204.44 MiB.
        (conv(3, 1, 128, 128, 28, 28), F32, 256, 214_368_935),
        // ResNet-18 layer3 3×3 256→256 at 14², fp32, batch 256: 107.0 MiB.
        (conv(3, 1, 256, 256, 14, 14), F32, 256, 112_198_239),
        // 3×3 64→64, bf16, batch 200 at 56²: 27 weights of partials.
        (conv(3, 1, 64, 64, 56, 56), BF16, 200, 162_554_535),
    ];
    for (i, (c, dt, n, measured)) in cases.iter().enumerate() {
        let (_, ws) = conv_workspace(c, *dt);
        let pred = n * ws.filter.0 + ws.filter.1;
        assert!(close(pred, *measured), "case {i}: {pred} vs {measured}");
    }
}

/// Stems pad 3 channels for NHWC kernels (ResNet 7×7, EfficientNet 3×3).
#[test]
fn stem_workspaces_match_measured_convolutions() {
    let mib = |x: f64| (x * 1_048_576.0) as u64;
    // 7×7 s2 3→64, fp32, batch 256: forward input + output + weight (931.04 MiB),
    // weight gradient 985.79 MiB.
    let (fwd, ws) = conv_workspace(&conv(7, 1, 3, 64, 224, 112), F32);
    assert!(near(at(256, fwd, F32), mib(931.04)));
    assert!(near(256 * ws.filter.0 + ws.filter.1, mib(985.79)));
    assert_eq!(ws.data, (0, 0));
    // The same in bf16: forward + the input padded to 8 channels (588.05 MiB).
    let (fwd, ws) = conv_workspace(&conv(7, 1, 3, 64, 224, 112), BF16);
    assert!(near(at(256, fwd, BF16), mib(465.5 + 122.55)));
    assert!(near(256 * ws.filter.0 + ws.filter.1, mib(593.89)));
    // 3×3 s2 3→32 (EfficientNet): nothing in fp32; the bf16 weight gradient 393.12 MiB.
    let (fwd, ws) = conv_workspace(&conv(3, 1, 3, 32, 224, 112), F32);
    assert_eq!((fwd, ws), ((0, 0), ConvWorkspace::default()));
    let (fwd, ws) = conv_workspace(&conv(3, 1, 3, 32, 224, 112), BF16);
    assert_eq!(fwd, (0, 0));
    assert!(near(256 * ws.filter.0 + ws.filter.1, mib(393.12)));
}

#[test]
fn pointwise_saved_tensor_table() {
    // (op, inplace, saves inputs, saves output, extra clone)
    let table: &[(Pointwise, bool, &[usize], bool, bool)] = &[
        (Pointwise::Relu, false, &[], true, false),
        (Pointwise::Relu, true, &[], true, false),
        (Pointwise::Gelu, false, &[0], false, false),
        (Pointwise::Silu, true, &[], false, true),
        (Pointwise::Hardswish, true, &[], false, true),
        (Pointwise::Sigmoid, false, &[], true, false),
        (Pointwise::Tanh, false, &[], true, false),
        (Pointwise::Add, false, &[], false, false),
        (Pointwise::Scale, false, &[], false, false),
    ];
    for &(f, inplace, ins, out, clone) in table {
        let r = rule_of(
            Op::Pointwise { f, inplace },
            1,
            false,
            &[F32],
            Precision::Fp32,
        );
        assert_eq!(r.saves_inputs, ins, "{f:?} inplace={inplace}");
        assert_eq!(r.saves_output, out, "{f:?}");
        assert_eq!(r.alias, inplace, "{f:?}");
        assert_eq!(r.extras.len(), usize::from(clone), "{f:?}");
    }
    let mul = rule_of(
        Op::Pointwise {
            f: Pointwise::Mul,
            inplace: false,
        },
        2,
        false,
        &[F32, F32],
        Precision::Fp32,
    );
    assert_eq!(mul.saves_inputs, vec![0, 1]);
}

#[test]
fn autocast_casts_matmul_inputs_and_weights() {
    let op = Op::Linear {
        in_features: 10,
        out_features: 10,
    };
    let amp = rule_of(op.clone(), 1, true, &[F32], Precision::AmpBf16);
    assert_eq!(amp.out_dtype, BF16);
    assert_eq!(amp.casts, vec![(0, BF16)]);
    assert!(amp.casts_params);
    assert_eq!(amp.saves_inputs, vec![0]);
    // An input already in bf16 is not cast again.
    let amp2 = rule_of(op.clone(), 1, true, &[BF16], Precision::AmpBf16);
    assert!(amp2.casts.is_empty());
    // fp32 and pure bf16: no casts, no weight copies.
    for p in [Precision::Fp32, Precision::Bf16] {
        let d = p.param_dtype();
        let r = rule_of(op.clone(), 1, true, &[d], p);
        assert!(r.casts.is_empty() && !r.casts_params, "{p}");
        assert_eq!(r.out_dtype, d);
    }
}

#[test]
fn layer_norm_and_softmax_run_in_fp32_under_autocast() {
    let ln = rule_of(
        Op::LayerNorm { rows: 1 },
        1,
        true,
        &[BF16],
        Precision::AmpBf16,
    );
    assert_eq!(ln.out_dtype, F32);
    assert_eq!(ln.casts, vec![(0, F32)]);
    assert_eq!(ln.saves_inputs, vec![0]);
    let sm = rule_of(
        Op::Softmax { fp32: false },
        1,
        false,
        &[BF16],
        Precision::AmpBf16,
    );
    assert_eq!(sm.out_dtype, F32);
    assert!(sm.saves_output);
    // Pure bf16: softmax stays bf16 unless called with dtype=float32.
    let sm = rule_of(
        Op::Softmax { fp32: false },
        1,
        false,
        &[BF16],
        Precision::Bf16,
    );
    assert_eq!(sm.out_dtype, BF16);
    let sm = rule_of(
        Op::Softmax { fp32: true },
        1,
        false,
        &[BF16],
        Precision::Bf16,
    );
    assert_eq!(sm.out_dtype, F32);
}

#[test]
fn batchnorm_dropout_pool_rules() {
    let bn = rule_of(
        Op::BatchNorm { channels: 4 },
        1,
        true,
        &[BF16],
        Precision::AmpBf16,
    );
    assert_eq!(bn.out_dtype, BF16, "batch_norm is on no autocast list");
    assert_eq!(bn.saves_inputs, vec![0]);
    let d = rule_of(
        Op::Dropout {
            p: 0.1,
            inplace: false,
        },
        1,
        false,
        &[F32],
        Precision::Fp32,
    );
    assert_eq!(d.extras[0].dtype, DType::Bool, "dropout keeps a bool mask");
    let mp = rule_of(Op::MaxPool, 1, false, &[F32], Precision::Fp32);
    assert_eq!(mp.saves_inputs, vec![0]);
    assert_eq!(
        mp.extras[0].dtype,
        DType::I64,
        "max_pool keeps int64 indices"
    );
    let v = rule_of(Op::View, 1, false, &[F32], Precision::Fp32);
    assert!(v.alias && v.saves_inputs.is_empty());
}

#[test]
fn sdpa_keeps_no_score_matrix_but_fp32_gqa_falls_back_to_math() {
    let fused = Op::Sdpa {
        heads: 4,
        kv_heads: 4,
        head_dim: 8,
        seq: 16,
        dropout: 0.0,
    };
    let r = rule_of(fused, 3, false, &[BF16, BF16, BF16], Precision::Bf16);
    assert!(r.saves_output && r.saves_inputs == vec![0, 1, 2]);
    assert!(
        r.extras.iter().all(|e| e.per_sample < 16 * 16 * 4),
        "no s×s tensor"
    );
    let gqa = Op::Sdpa {
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        seq: 16,
        dropout: 0.0,
    };
    let r = rule_of(gqa.clone(), 3, false, &[F32, F32, F32], Precision::Fp32);
    let steps = r.steps.as_ref().expect("the math path's steps");
    assert!(
        steps.forward.iter().any(|s| matches!(
            s,
            Step::Saved { size, .. } if size.per_sample == 4 * 16 * 16 * 4
        )),
        "probabilities kept"
    );
    assert!(r.extras.is_empty() && r.bwd_transient == 0);
    // Under autocast the fused kernel takes the bf16 inputs.
    let r = rule_of(gqa, 3, false, &[F32, F32, F32], Precision::AmpBf16);
    assert!(r.steps.is_none() && r.saves_output);
}

#[test]
fn t5_layer_norm_and_biased_sdpa() {
    // fp32 input and weight: saves x and the normalised fp32 tensor; output fp32.
    let r = rule_of(
        Op::T5LayerNorm { rows: 1 },
        1,
        true,
        &[F32],
        Precision::AmpBf16,
    );
    assert_eq!((r.out_dtype, r.saves_inputs.clone()), (F32, vec![0]));
    assert_eq!(r.extras.iter().filter(|e| !e.transient).count(), 1);
    // Pure bf16: the fp32 copy (pow), x itself (x * rsqrt) and the bf16 cast are kept.
    let r = rule_of(
        Op::T5LayerNorm { rows: 1 },
        1,
        true,
        &[BF16],
        Precision::Bf16,
    );
    assert_eq!((r.out_dtype, r.saves_inputs.clone()), (BF16, vec![0]));
    let kept: Vec<_> = r
        .extras
        .iter()
        .filter(|e| !e.transient)
        .map(|e| e.dtype)
        .collect();
    assert_eq!(kept, vec![F32, BF16]);
    let op = |bias_grad| Op::SdpaBias {
        heads: 4,
        head_dim: 8,
        q_len: 10,
        kv_len: 30,
        dropout: 0.1,
        bias_grad,
    };
    // A trainable mask: the math backend. Under autocast q, k, v and the mask are cast
    // to bf16, then upcast: q·√s, kᵀ·√s and v in fp32, the fp32 probabilities, the
    // dropout mask and output are saved; two fp32 score-sized gradients in backward.
    let (q, kv, scores) = (4 * 10 * 8, 4 * 30 * 8, 4 * 10 * 30);
    let r = rule_of(op(true), 4, false, &[F32; 4], Precision::AmpBf16);
    assert_eq!(r.casts.len(), 4);
    assert!(r.saves_inputs.is_empty() && !r.saves_output);
    let kept: Vec<_> = r
        .extras
        .iter()
        .filter(|e| !e.transient)
        .map(|e| (e.per_sample, e.dtype))
        .collect();
    assert_eq!(
        kept,
        vec![
            (q, F32),
            (kv, F32),
            (kv, F32),
            (scores, F32),
            (scores, DType::Bool),
            (scores, F32)
        ]
    );
    assert_eq!(r.bwd_transient, 2 * scores * 2);
    // In fp32 v is saved as it is.
    let r = rule_of(op(true), 4, false, &[F32; 4], Precision::Fp32);
    assert_eq!(r.saves_inputs, vec![2]);
    // A mask that does not train: the fused kernel, inputs and output saved.
    let r = rule_of(op(false), 4, false, &[F32; 4], Precision::Fp32);
    assert!(r.casts.is_empty() && r.bwd_transient == 0);
    assert_eq!(r.saves_inputs, vec![0, 1, 2, 3]);
}

#[test]
fn cross_entropy_upcast_and_autocast() {
    let op = |upcast| Op::CrossEntropy {
        rows: 2,
        classes: 50,
        upcast,
    };
    // HF `.float()` under pure bf16: an fp32 copy (transient) and fp32 log_softmax.
    let r = rule_of(op(true), 2, false, &[BF16, F32], Precision::Bf16);
    assert!(r.extras.iter().any(|e| e.transient && e.dtype == F32));
    assert!(r.extras.iter().any(|e| !e.transient && e.dtype == F32));
    // Plain cross_entropy in pure bf16: log_softmax in bf16.
    let r = rule_of(op(false), 2, false, &[BF16, F32], Precision::Bf16);
    assert!(r.extras.iter().all(|e| e.dtype == BF16));
}

/// The MoE ops: the grouped GEMM runs in the weights' dtype whatever autocast says;
/// `TypeAs` copies only when the dtypes differ; `Gather` saves its int64 index (and mask).
#[test]
fn moe_op_rules() {
    let mm = Op::GroupedMm {
        in_features: 10,
        out_features: 10,
    };
    let amp = rule_of(mm.clone(), 1, true, &[F32], Precision::AmpBf16);
    assert_eq!(amp.out_dtype, F32);
    assert!(amp.casts.is_empty() && !amp.casts_params);
    assert_eq!(amp.saves_inputs, vec![0]);
    let cast = rule_of(mm.clone(), 1, true, &[BF16], Precision::AmpBf16);
    assert_eq!(cast.casts, vec![(0, F32)]);
    let bf16 = rule_of(mm, 1, true, &[BF16], Precision::Bf16);
    assert_eq!(bf16.out_dtype, BF16);
    assert!(bf16.casts.is_empty());
    let same = rule_of(Op::TypeAs, 2, false, &[BF16, BF16], Precision::Bf16);
    assert!(same.alias);
    let copy = rule_of(Op::TypeAs, 2, false, &[F32, BF16], Precision::Bf16);
    assert!(!copy.alias && copy.out_dtype == BF16);
    let g = rule_of(
        Op::Gather {
            indices: 7,
            mask: 7,
        },
        1,
        false,
        &[F32],
        Precision::Fp32,
    );
    let dts: Vec<_> = g.extras.iter().map(|e| (e.per_sample, e.dtype)).collect();
    assert_eq!(dts, vec![(7, DType::I64), (7, DType::Bool)]);
    assert!(g.extras.iter().all(|e| !e.transient));
    let t = rule_of(Op::TopK, 1, false, &[F32], Precision::AmpBf16);
    assert_eq!(t.extras.len(), 1);
    assert_eq!(t.extras[0].dtype, DType::I64);
}
