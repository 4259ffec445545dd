//! torchvision MobileNetV3 small / large (`torchvision/models/mobilenetv3.py`).
//!
//! Forward, op by op (torchvision 0.29):
//! - stem `Conv2dNormActivation(3, 16, k3, s2, Hardswish)` (inplace activation);
//! - per `InvertedResidual`: optional 1×1 expand (conv, BN, ReLU_/Hardswish_), depthwise
//!   (conv, BN, act_), optional `SqueezeExcitation(scale_activation=Hardsigmoid)` whose
//!   `ReLU` and `Hardsigmoid` are *not* inplace, then `scale * input`; 1×1 project
//!   (conv, BN); `result += input` (inplace) when stride 1 and in == out (no stochastic depth);
//! - head 1×1 conv to 6·c_last (BN, Hardswish_), avgpool, flatten,
//!   Linear → Hardswish(inplace) → Dropout(inplace) → Linear.
//!
//! Each `InvertedResidual` of `features` is one checkpoint block.

use serde::{Deserialize, Serialize};

use super::efficientnet::{check_mult, make_divisible, squeeze_excitation};
use crate::model::builder::{ConvSpec, Feat, GraphBuilder};
use crate::model::checks::{ModelError, check_positive, check_prob};
use crate::model::ir::{Graph, Pointwise};

/// Which MobileNetV3 table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MobilenetArch {
    Small,
    Large,
}

/// Builder parameters of a MobileNetV3 classifier.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MobilenetParams {
    pub arch: MobilenetArch,
    pub width_mult: f64,
    /// Classifier dropout probability.
    pub dropout: f64,
    pub num_classes: u64,
}

impl MobilenetParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_mult("params.width_mult", self.width_mult)?;
        check_prob("params.dropout", self.dropout)?;
        check_positive("params.num_classes", self.num_classes)?;
        Ok(())
    }
}

/// `bneck_conf(input, kernel, expanded, out, use_se, activation == "HS", stride)` (dilation 1).
type Row = (u64, u64, u64, u64, bool, bool, u64);

const LARGE: [Row; 15] = [
    (16, 3, 16, 16, false, false, 1),
    (16, 3, 64, 24, false, false, 2),
    (24, 3, 72, 24, false, false, 1),
    (24, 5, 72, 40, true, false, 2),
    (40, 5, 120, 40, true, false, 1),
    (40, 5, 120, 40, true, false, 1),
    (40, 3, 240, 80, false, true, 2),
    (80, 3, 200, 80, false, true, 1),
    (80, 3, 184, 80, false, true, 1),
    (80, 3, 184, 80, false, true, 1),
    (80, 3, 480, 112, true, true, 1),
    (112, 3, 672, 112, true, true, 1),
    (112, 5, 672, 160, true, true, 2),
    (160, 5, 960, 160, true, true, 1),
    (160, 5, 960, 160, true, true, 1),
];

const SMALL: [Row; 11] = [
    (16, 3, 16, 16, true, false, 2),
    (16, 3, 72, 24, false, false, 2),
    (24, 3, 88, 24, false, false, 1),
    (24, 5, 96, 40, true, true, 2),
    (40, 5, 240, 40, true, true, 1),
    (40, 5, 240, 40, true, true, 1),
    (40, 5, 120, 48, true, true, 1),
    (48, 5, 144, 48, true, true, 1),
    (48, 5, 288, 96, true, true, 2),
    (96, 5, 576, 96, true, true, 1),
    (96, 5, 576, 96, true, true, 1),
];

/// One `InvertedResidual` (the caller opens the checkpoint block and the scope).
fn inverted_residual(b: &mut GraphBuilder, x: Feat, row: Row, width_mult: f64) -> Feat {
    let adjust = |c: u64| make_divisible(c as f64 * width_mult, 8);
    let (_, kernel, expanded, out, use_se, use_hs, stride) = row;
    let (expanded, out) = (adjust(expanded), adjust(out));
    let act = Some(if use_hs {
        Pointwise::Hardswish
    } else {
        Pointwise::Relu
    });
    let input = x;
    let mut y = x;
    let mut idx = 0;
    if expanded != x.c {
        y = b.conv_bn_act(
            y,
            ConvSpec::new(expanded, 1, 1),
            act,
            &format!("block.{idx}"),
        );
        idx += 1;
    }
    y = b.conv_bn_act(
        y,
        ConvSpec::new(expanded, kernel, stride).groups(expanded),
        act,
        &format!("block.{idx}"),
    );
    idx += 1;
    if use_se {
        let squeeze = make_divisible((expanded / 4) as f64, 8);
        y = squeeze_excitation(
            b,
            y,
            squeeze,
            Pointwise::Relu,
            false,
            Pointwise::Hardsigmoid,
            &format!("block.{idx}"),
        );
        idx += 1;
    }
    y = b.conv_bn_act(y, ConvSpec::new(out, 1, 1), None, &format!("block.{idx}"));
    if stride == 1 && input.c == out {
        let id = b.binary(y.id, input.id, Pointwise::Add, true, "add");
        y = Feat { id, ..y };
    }
    y
}

/// Builds a MobileNetV3 classifier for `image`×`image` inputs of `channels` channels.
pub fn build(p: &MobilenetParams, image: u64, channels: u64) -> Graph {
    let adjust = |c: u64| make_divisible(c as f64 * p.width_mult, 8);
    let (rows, last_channel): (&[Row], u64) = match p.arch {
        MobilenetArch::Large => (&LARGE, adjust(1280)),
        MobilenetArch::Small => (&SMALL, adjust(1024)),
    };
    let mut b = GraphBuilder::new();
    let x = b.image(channels, image, image);
    let labels = b.labels(1);

    b.scope("features.0");
    let first = rows.first().map_or(16, |r| adjust(r.0));
    let mut x = b.conv_bn_act(
        x,
        ConvSpec::new(first, 3, 2),
        Some(Pointwise::Hardswish),
        "0",
    );

    for (i, &row) in rows.iter().enumerate() {
        b.scope(format!("features.{}", i + 1));
        b.begin_block();
        x = inverted_residual(&mut b, x, row, p.width_mult);
        b.end_block();
    }

    b.scope(format!("features.{}", rows.len() + 1));
    let x = b.conv_bn_act(
        x,
        ConvSpec::new(6 * x.c, 1, 1),
        Some(Pointwise::Hardswish),
        "0",
    );

    b.scope("head");
    let pooled = b.adaptive_avgpool(x, 1, 1, "avgpool");
    let flat = b.view(pooled.id, "flatten");
    let h = b.linear(flat, 1, pooled.c, last_channel, true, "classifier.0");
    let h = b.pointwise(h, Pointwise::Hardswish, true, "classifier.1");
    let h = b.dropout(h, p.dropout, true, "classifier.2");
    let logits = b.linear(h, 1, last_channel, p.num_classes, true, "classifier.3");
    b.cross_entropy(logits, labels, 1, p.num_classes, false);
    b.finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::ir::Op;

    fn preset(arch: MobilenetArch) -> MobilenetParams {
        MobilenetParams {
            arch,
            width_mult: 1.0,
            dropout: 0.2,
            num_classes: 1000,
        }
    }

    #[test]
    fn param_counts_match_torchvision() {
        // sum(p.numel() for p in torchvision.models.mobilenet_v3_*().parameters()), torchvision 0.29.
        let small = build(&preset(MobilenetArch::Small), 224, 3);
        assert_eq!(small.param_count(), 2_542_856);
        let large = build(&preset(MobilenetArch::Large), 224, 3);
        assert_eq!(large.param_count(), 5_483_032);
        let p = MobilenetParams {
            width_mult: 0.75,
            ..preset(MobilenetArch::Large)
        };
        assert_eq!(build(&p, 224, 3).param_count(), 3_377_576);
    }

    #[test]
    fn conv_outputs_match_forward_hooks() {
        // Per-sample elements of all Conv2d outputs, from forward hooks at 224×224.
        let large = build(&preset(MobilenetArch::Large), 224, 3);
        assert_eq!(large.conv_outputs(), (4_404_888, 62));
        assert_eq!(large.block_count(), 15);
        let small = build(&preset(MobilenetArch::Small), 224, 3);
        assert_eq!(small.conv_outputs(), (1_415_656, 52));
        assert_eq!(small.block_count(), 11);
    }

    #[test]
    fn se_activations_are_not_inplace() {
        let g = build(&preset(MobilenetArch::Large), 224, 3);
        let se_relu = g
            .nodes
            .iter()
            .find(|n| g.name(n).ends_with("block.2.activation"))
            .unwrap();
        assert_eq!(
            se_relu.op,
            Op::Pointwise {
                f: Pointwise::Relu,
                inplace: false
            }
        );
    }

    #[test]
    fn validation_names_fields() {
        let mut p = preset(MobilenetArch::Small);
        p.width_mult = 0.0;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.width_mult")
        );
        let mut p = preset(MobilenetArch::Small);
        p.dropout = 2.0;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.dropout")
        );
        let mut p = preset(MobilenetArch::Small);
        p.num_classes = 0;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.num_classes")
        );
        let v = serde_json::json!({"arch": "medium", "width_mult": 1.0, "dropout": 0.2, "num_classes": 10});
        assert!(serde_json::from_value::<MobilenetParams>(v).is_err());
        let v = serde_json::json!({"arch": "small", "width_mult": 1.0, "dropout": 0.2, "num_classes": 10});
        assert_eq!(
            serde_json::from_value::<MobilenetParams>(v).unwrap().arch,
            MobilenetArch::Small
        );
    }

    #[test]
    fn builtin_presets_build() {
        for (id, n) in [
            ("mobilenet_v3_small", 2_542_856),
            ("mobilenet_v3_large", 5_483_032),
        ] {
            let preset = crate::model::preset::find_builtin(id).unwrap();
            let crate::model::preset::ModelSpec::MobilenetV3(p) = &preset.spec else {
                panic!("{id}")
            };
            let g = build(p, preset.default_size(), 3);
            assert_eq!(g.param_count(), n, "{id}");
        }
    }
}
