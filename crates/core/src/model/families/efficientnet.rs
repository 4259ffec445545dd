//! torchvision EfficientNet B0–B7 (`torchvision/models/efficientnet.py`, MBConv blocks).
//!
//! Forward, op by op (torchvision 0.29):
//! - stem `Conv2dNormActivation(3, c0, k3, s2, SiLU)` (activations of
//!   `Conv2dNormActivation` are inplace);
//! - per MBConv: optional 1×1 expand (conv, BN, SiLU_), depthwise k×k (conv, BN, SiLU_),
//!   `SqueezeExcitation(activation=SiLU(inplace=True))`: avgpool → fc1 (1×1 conv, bias) →
//!   SiLU_ → fc2 → Sigmoid (not inplace) → `scale * input`; 1×1 project (conv, BN);
//!   with a residual: `StochasticDepth(p, "row")` then `result += input` (inplace);
//! - head 1×1 conv to 4·c_last (BN, SiLU_), avgpool, flatten, `Dropout(inplace=True)`, Linear.
//!
//! B5–B7 pass a BatchNorm with other eps/momentum: no structural difference.
//! Each MBConv of `features` is one checkpoint block.

use serde::{Deserialize, Serialize};

use crate::model::builder::{ConvSpec, Feat, GraphBuilder};
use crate::model::checks::{ModelError, check_positive, check_prob};
use crate::model::ir::{Graph, Pointwise};

/// Largest width / depth multiplier accepted (B7 uses 2.0 / 3.1).
const MAX_MULT: f64 = 16.0;

/// Builder parameters of an EfficientNet (B0–B7 family).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EfficientnetParams {
    pub width_mult: f64,
    pub depth_mult: f64,
    /// Classifier dropout probability.
    pub dropout: f64,
    /// Stochastic depth probability of the last block (scaled linearly by block index).
    pub stochastic_depth_prob: f64,
    pub num_classes: u64,
}

pub(crate) fn check_mult(field: &str, value: f64) -> Result<(), ModelError> {
    if !value.is_finite() || value <= 0.0 || value > MAX_MULT {
        return Err(ModelError::Invalid {
            field: field.to_string(),
            reason: format!("must be a number in (0, {MAX_MULT}], got {value}"),
        });
    }
    Ok(())
}

impl EfficientnetParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_mult("params.width_mult", self.width_mult)?;
        check_mult("params.depth_mult", self.depth_mult)?;
        check_prob("params.dropout", self.dropout)?;
        check_prob("params.stochastic_depth_prob", self.stochastic_depth_prob)?;
        check_positive("params.num_classes", self.num_classes)?;
        Ok(())
    }
}

/// torchvision `_make_divisible(v, divisor, min_value=None)`.
pub(crate) fn make_divisible(v: f64, divisor: u64) -> u64 {
    let d = divisor as f64;
    // Python: int(v + divisor / 2) // divisor * divisor (truncation toward zero; v > 0).
    let rounded = ((v + d / 2.0).trunc() as u64) / divisor * divisor;
    let mut new_v = rounded.max(divisor);
    if (new_v as f64) < 0.9 * v {
        new_v += divisor;
    }
    new_v
}

/// One row of the B0 table (`bneck_conf(expand_ratio, kernel, stride, in, out, layers)`).
struct Stage {
    expand_ratio: f64,
    kernel: u64,
    stride: u64,
    input_channels: u64,
    out_channels: u64,
    num_layers: u64,
}

const B0: [(f64, u64, u64, u64, u64, u64); 7] = [
    (1.0, 3, 1, 32, 16, 1),
    (6.0, 3, 2, 16, 24, 2),
    (6.0, 5, 2, 24, 40, 2),
    (6.0, 3, 2, 40, 80, 3),
    (6.0, 5, 1, 80, 112, 3),
    (6.0, 5, 2, 112, 192, 4),
    (6.0, 3, 1, 192, 320, 1),
];

fn stages(p: &EfficientnetParams) -> Vec<Stage> {
    let adjust = |c: u64| make_divisible(c as f64 * p.width_mult, 8);
    B0.iter()
        .map(|&(e, k, s, i, o, n)| Stage {
            expand_ratio: e,
            kernel: k,
            stride: s,
            input_channels: adjust(i),
            out_channels: adjust(o),
            // MBConvConfig.adjust_depth: int(math.ceil(num_layers * depth_mult))
            num_layers: (n as f64 * p.depth_mult).ceil() as u64,
        })
        .collect()
}

/// torchvision `SqueezeExcitation(input_channels, squeeze, activation, scale_activation)`:
/// returns `scale * input`.
pub(crate) fn squeeze_excitation(
    b: &mut GraphBuilder,
    x: Feat,
    squeeze: u64,
    act: Pointwise,
    act_inplace: bool,
    scale_act: Pointwise,
    name: &str,
) -> Feat {
    let s = b.adaptive_avgpool(x, 1, 1, &format!("{name}.avgpool"));
    let s = b.conv(
        s,
        ConvSpec::new(squeeze, 1, 1).bias(true),
        &format!("{name}.fc1"),
    );
    let s = b.act(s, act, act_inplace, &format!("{name}.activation"));
    let s = b.conv(
        s,
        ConvSpec::new(x.c, 1, 1).bias(true),
        &format!("{name}.fc2"),
    );
    let s = b.act(s, scale_act, false, &format!("{name}.scale_activation"));
    let id = b.binary(s.id, x.id, Pointwise::Mul, false, &format!("{name}.mul"));
    Feat { id, ..x }
}

/// One MBConv block (the caller opens the checkpoint block and the scope).
fn mbconv(
    b: &mut GraphBuilder,
    x: Feat,
    kernel: u64,
    stride: u64,
    expand_ratio: f64,
    out: u64,
    sd_prob: f64,
) -> Feat {
    let silu = Some(Pointwise::Silu);
    let input = x;
    let expanded = make_divisible(x.c as f64 * expand_ratio, 8);
    let mut y = x;
    let mut idx = 0;
    if expanded != x.c {
        y = b.conv_bn_act(
            y,
            ConvSpec::new(expanded, 1, 1),
            silu,
            &format!("block.{idx}"),
        );
        idx += 1;
    }
    y = b.conv_bn_act(
        y,
        ConvSpec::new(expanded, kernel, stride).groups(expanded),
        silu,
        &format!("block.{idx}"),
    );
    idx += 1;
    let squeeze = (input.c / 4).max(1);
    y = squeeze_excitation(
        b,
        y,
        squeeze,
        Pointwise::Silu,
        true,
        Pointwise::Sigmoid,
        &format!("block.{idx}"),
    );
    idx += 1;
    y = b.conv_bn_act(y, ConvSpec::new(out, 1, 1), None, &format!("block.{idx}"));
    if stride == 1 && input.c == out {
        let r = b.stochastic_depth(y.id, sd_prob, "stochastic_depth");
        let id = b.binary(r, input.id, Pointwise::Add, true, "add");
        y = Feat { id, ..y };
    }
    y
}

/// Builds an EfficientNet classifier for `image`×`image` inputs of `channels` channels.
pub fn build(p: &EfficientnetParams, image: u64, channels: u64) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.image(channels, image, image);
    let labels = b.labels(1);
    let cfg = stages(p);
    let silu = Some(Pointwise::Silu);

    b.scope("features.0");
    let first = cfg.first().map_or(32, |s| s.input_channels);
    let mut x = b.conv_bn_act(x, ConvSpec::new(first, 3, 2), silu, "0");

    let total: u64 = cfg.iter().map(|s| s.num_layers).sum();
    let mut block_id = 0u64;
    for (si, st) in cfg.iter().enumerate() {
        for i in 0..st.num_layers {
            let (cin, stride) = if i == 0 {
                (st.input_channels, st.stride)
            } else {
                (st.out_channels, 1)
            };
            debug_assert_eq!(cin, x.c);
            let sd_prob = p.stochastic_depth_prob * block_id as f64 / total as f64;
            b.scope(format!("features.{}.{i}", si + 1));
            b.begin_block();
            x = mbconv(
                &mut b,
                x,
                st.kernel,
                stride,
                st.expand_ratio,
                st.out_channels,
                sd_prob,
            );
            b.end_block();
            block_id += 1;
        }
    }

    let last_in = cfg.last().map_or(x.c, |s| s.out_channels);
    b.scope(format!("features.{}", cfg.len() + 1));
    let x = b.conv_bn_act(x, ConvSpec::new(4 * last_in, 1, 1), silu, "0");

    b.scope("head");
    let pooled = b.adaptive_avgpool(x, 1, 1, "avgpool");
    let flat = b.view(pooled.id, "flatten");
    let dropped = b.dropout(flat, p.dropout, true, "classifier.0");
    let logits = b.linear(dropped, 1, pooled.c, p.num_classes, true, "classifier.1");
    b.cross_entropy(logits, labels, 1, p.num_classes, false);
    b.finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::ir::Op;

    const TABLE: [(f64, f64, f64); 8] = [
        (1.0, 1.0, 0.2),
        (1.0, 1.1, 0.2),
        (1.1, 1.2, 0.3),
        (1.2, 1.4, 0.3),
        (1.4, 1.8, 0.4),
        (1.6, 2.2, 0.4),
        (1.8, 2.6, 0.5),
        (2.0, 3.1, 0.5),
    ];

    fn preset(i: usize) -> EfficientnetParams {
        let (w, d, dr) = TABLE[i];
        EfficientnetParams {
            width_mult: w,
            depth_mult: d,
            dropout: dr,
            stochastic_depth_prob: 0.2,
            num_classes: 1000,
        }
    }

    #[test]
    fn param_counts_match_torchvision() {
        // sum(p.numel() for p in torchvision.models.efficientnet_bN().parameters()), torchvision 0.29.
        let expected = [
            5_288_548, 7_794_184, 9_109_994, 12_233_232, 19_341_616, 30_389_784, 43_040_704,
            66_347_960,
        ];
        for (i, &n) in expected.iter().enumerate() {
            let p = preset(i);
            p.validate().unwrap();
            assert_eq!(build(&p, 224, 3).param_count(), n, "efficientnet_b{i}");
        }
        let p = EfficientnetParams {
            num_classes: 10,
            ..preset(0)
        };
        assert_eq!(build(&p, 224, 3).param_count(), 4_020_358);
    }

    #[test]
    fn make_divisible_matches_python() {
        assert_eq!(make_divisible(32.0 * 1.1, 8), 32);
        assert_eq!(make_divisible(16.0 * 1.1, 8), 16);
        assert_eq!(make_divisible(40.0 * 1.4, 8), 56);
        assert_eq!(make_divisible(3.0, 8), 8);
        assert_eq!(make_divisible(20.0, 8), 24);
        assert_eq!(make_divisible(91.0, 8), 88);
    }

    #[test]
    fn b0_structure_at_224() {
        let g = build(&preset(0), 224, 3);
        // 16 MBConv blocks, one checkpoint block each.
        assert_eq!(g.block_count(), 16);
        // Sum of per-sample elements of all Conv2d outputs (forward hooks on torchvision
        // efficientnet_b0 at 224×224).
        let conv: u64 = g
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Conv2d { .. }))
            .map(|n| g.tensors[n.output].per_sample)
            .sum();
        assert_eq!(conv, 6_747_036);
        let last_conv = g
            .nodes
            .iter()
            .rev()
            .find(|n| matches!(n.op, Op::Conv2d { .. }))
            .unwrap();
        assert_eq!(g.tensors[last_conv.output].per_sample, 1280 * 7 * 7);
        // Block 0 has stochastic-depth probability 0 and no residual; 9 residual blocks.
        let adds = g
            .nodes
            .iter()
            .filter(|n| {
                n.op == (Op::Pointwise {
                    f: Pointwise::Add,
                    inplace: true,
                })
            })
            .count();
        assert_eq!(adds, 9);
        let sd = g
            .nodes
            .iter()
            .filter(|n| g.name(n).ends_with("stochastic_depth"))
            .count();
        assert_eq!(sd, 9);
        assert!(matches!(
            g.nodes.last().unwrap().op,
            Op::CrossEntropy {
                rows: 1,
                classes: 1000,
                ..
            }
        ));
    }

    #[test]
    fn validation_names_fields() {
        let bad = |f: &dyn Fn(&mut EfficientnetParams), field: &str| {
            let mut p = preset(0);
            f(&mut p);
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e} should name {field}");
        };
        bad(&|p| p.width_mult = 0.0, "params.width_mult");
        bad(&|p| p.width_mult = f64::NAN, "params.width_mult");
        bad(&|p| p.width_mult = 1e9, "params.width_mult");
        bad(&|p| p.depth_mult = -1.0, "params.depth_mult");
        bad(&|p| p.dropout = 1.0, "params.dropout");
        bad(
            &|p| p.stochastic_depth_prob = -0.1,
            "params.stochastic_depth_prob",
        );
        bad(&|p| p.num_classes = 0, "params.num_classes");
        bad(&|p| p.num_classes = u64::MAX, "params.num_classes");
    }

    #[test]
    fn rejects_unknown_fields() {
        let v = serde_json::json!({"width_mult": 1.0, "depth_mult": 1.0, "dropout": 0.2,
            "stochastic_depth_prob": 0.2, "num_classes": 1000, "extra": 1});
        assert!(serde_json::from_value::<EfficientnetParams>(v).is_err());
    }

    #[test]
    fn builtin_presets_build() {
        for (id, n) in [
            ("efficientnet_b0", 5_288_548),
            ("efficientnet_b3", 12_233_232),
            ("efficientnet_b7", 66_347_960),
        ] {
            let preset = crate::model::preset::find_builtin(id).unwrap();
            let crate::model::preset::ModelSpec::Efficientnet(p) = &preset.spec else {
                panic!("{id}")
            };
            let g = build(p, preset.default_size(), 3);
            assert_eq!(g.param_count(), n, "{id}");
        }
    }
}
