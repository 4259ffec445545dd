//! torchvision ConvNeXt (`torchvision/models/convnext.py`).
//!
//! Forward, op by op (torchvision 0.29):
//! - stem: Conv2d(3, c0, k4, s4, bias) → `LayerNorm2d` (permute to NHWC, `F.layer_norm`
//!   over C, permute back);
//! - per `CNBlock`: depthwise 7×7 conv (bias) → permute → LayerNorm(C) → Linear(C, 4C) →
//!   GELU → Linear(4C, C) → permute → `layer_scale * x` → `StochasticDepth(p, "row")` →
//!   `result += input` (inplace);
//! - between stages: `LayerNorm2d` → Conv2d(k2, s2, bias);
//! - head: avgpool → `LayerNorm2d` → flatten → Linear.
//!
//! Layout (CUDA): the stem conv output is NCHW-contiguous, so its `permute(0, 2, 3, 1)` is
//! not contiguous and `layer_norm` copies it (`expect_contiguous`); that copy is modelled.
//! The LayerNorm output permuted back is channels-last, the convolutions that follow keep
//! channels-last, and every later permute is already contiguous: no further copies.
//! Each `CNBlock` is one checkpoint block.

use serde::{Deserialize, Serialize};

use crate::model::builder::{ConvSpec, Feat, GraphBuilder};
use crate::model::checks::{ModelError, check_positive, check_prob};
use crate::model::ir::{Graph, Op, Pointwise, TensorId};

/// Largest number of blocks accepted per stage (ConvNeXt-B has 27).
const MAX_BLOCKS: u64 = 1000;

/// Builder parameters of a ConvNeXt classifier.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConvnextParams {
    /// Channels of the four stages.
    pub channels: [u64; 4],
    /// Blocks of the four stages.
    pub depths: [u64; 4],
    /// Stochastic depth probability of the last block (scaled linearly by block index).
    pub stochastic_depth_prob: f64,
    pub num_classes: u64,
}

impl ConvnextParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        for (i, &c) in self.channels.iter().enumerate() {
            check_positive(&format!("params.channels[{i}]"), c)?;
        }
        for (i, &d) in self.depths.iter().enumerate() {
            let field = format!("params.depths[{i}]");
            check_positive(&field, d)?;
            if d > MAX_BLOCKS {
                return Err(ModelError::TooLarge {
                    field,
                    value: d,
                    limit: MAX_BLOCKS,
                });
            }
        }
        check_prob("params.stochastic_depth_prob", self.stochastic_depth_prob)?;
        check_positive("params.num_classes", self.num_classes)?;
        Ok(())
    }
}

/// `nn.LayerNorm(dim)` (affine) over the last dim of `rows` rows per sample.
fn layer_norm(b: &mut GraphBuilder, x: TensorId, rows: u64, dim: u64, name: &str) -> TensorId {
    let w = b.param(dim, None);
    let bias = b.param(dim, None);
    b.op(Op::LayerNorm { rows }, &[x], rows * dim, &[w, bias], name)
}

/// torchvision `LayerNorm2d`: permute → `F.layer_norm` → permute. `copy` marks an NCHW
/// contiguous input, whose permute `layer_norm` makes contiguous first.
fn layer_norm_2d(b: &mut GraphBuilder, x: Feat, copy: bool, name: &str) -> Feat {
    let rows = x.h * x.w;
    let mut t = b.view(x.id, &format!("{name}.permute"));
    if copy {
        t = b.copy(t, &format!("{name}.contiguous"));
    }
    let t = layer_norm(b, t, rows, x.c, name);
    let id = b.view(t, &format!("{name}.permute_back"));
    Feat { id, ..x }
}

/// One `CNBlock` (the caller opens the checkpoint block and the scope).
fn cn_block(b: &mut GraphBuilder, x: Feat, sd_prob: f64) -> Feat {
    let dim = x.c;
    let rows = x.h * x.w;
    let y = b.conv(
        x,
        ConvSpec::new(dim, 7, 1).groups(dim).bias(true),
        "block.0",
    );
    let t = b.view(y.id, "block.1");
    let t = layer_norm(b, t, rows, dim, "block.2");
    let t = b.linear(t, rows, dim, 4 * dim, true, "block.3");
    let t = b.pointwise(t, Pointwise::Gelu, false, "block.4");
    let t = b.linear(t, rows, 4 * dim, dim, true, "block.5");
    let t = b.view(t, "block.6");
    let scale = b.param(dim, None);
    let t = b.mul_param(t, scale, "layer_scale");
    let t = b.stochastic_depth(t, sd_prob, "stochastic_depth");
    let id = b.binary(t, x.id, Pointwise::Add, true, "add");
    Feat { id, ..x }
}

/// Builds a ConvNeXt classifier for `image`×`image` inputs of `channels` channels.
pub fn build(p: &ConvnextParams, image: u64, channels: u64) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.image(channels, image, image);
    let labels = b.labels(1);

    b.scope("features.0");
    let x = b.conv(
        x,
        ConvSpec::new(p.channels[0], 4, 4).padding(0).bias(true),
        "0",
    );
    let mut x = layer_norm_2d(&mut b, x, true, "1");

    let total: u64 = p.depths.iter().sum();
    let denom = (total as f64 - 1.0).max(1.0);
    let mut block_id = 0u64;
    for stage in 0..4 {
        for i in 0..p.depths[stage] {
            // torchvision: stochastic_depth_prob * stage_block_id / (total_stage_blocks - 1.0)
            let sd_prob = p.stochastic_depth_prob * block_id as f64 / denom;
            b.scope(format!("features.{}.{i}", 2 * stage + 1));
            b.begin_block();
            x = cn_block(&mut b, x, sd_prob);
            b.end_block();
            block_id += 1;
        }
        if stage < 3 {
            b.scope(format!("features.{}", 2 * stage + 2));
            let y = layer_norm_2d(&mut b, x, false, "0");
            x = b.conv(
                y,
                ConvSpec::new(p.channels[stage + 1], 2, 2)
                    .padding(0)
                    .bias(true),
                "1",
            );
        }
    }

    b.scope("head");
    let pooled = b.adaptive_avgpool(x, 1, 1, "avgpool");
    let normed = layer_norm_2d(&mut b, pooled, false, "classifier.0");
    let flat = b.view(normed.id, "classifier.1");
    let logits = b.linear(flat, 1, pooled.c, p.num_classes, true, "classifier.2");
    b.cross_entropy(logits, labels, 1, p.num_classes, false);
    b.finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn preset(name: &str) -> ConvnextParams {
        let (channels, depths, sd) = match name {
            "tiny" => ([96, 192, 384, 768], [3, 3, 9, 3], 0.1),
            "small" => ([96, 192, 384, 768], [3, 3, 27, 3], 0.4),
            _ => ([128, 256, 512, 1024], [3, 3, 27, 3], 0.5),
        };
        ConvnextParams {
            channels,
            depths,
            stochastic_depth_prob: sd,
            num_classes: 1000,
        }
    }

    #[test]
    fn param_counts_match_torchvision() {
        // sum(p.numel() for p in torchvision.models.convnext_*().parameters()), torchvision 0.29.
        for (name, n) in [
            ("tiny", 28_589_128),
            ("small", 50_223_688),
            ("base", 88_591_464),
        ] {
            let p = preset(name);
            p.validate().unwrap();
            assert_eq!(build(&p, 224, 3).param_count(), n, "convnext_{name}");
        }
    }

    #[test]
    fn tiny_outputs_match_forward_hooks() {
        // Per-sample output elements of all Conv2d and all Linear modules (forward hooks on
        // torchvision convnext_tiny at 224×224).
        let g = build(&preset("tiny"), 224, 3);
        let sum = |pred: &dyn Fn(&Op) -> bool| -> (u64, usize) {
            let v: Vec<u64> = g
                .nodes
                .iter()
                .filter(|n| pred(&n.op))
                .map(|n| g.tensors[n.output].per_sample)
                .collect();
            (v.iter().sum(), v.len())
        };
        assert_eq!(sum(&|o| matches!(o, Op::Conv2d { .. })), (2_709_504, 22));
        assert_eq!(sum(&|o| matches!(o, Op::Linear { .. })), (10_726_120, 37));
        assert_eq!(g.block_count(), 18);
        // The first block has stochastic-depth probability 0 (identity).
        let sd = g
            .nodes
            .iter()
            .filter(|n| g.name(n).ends_with("stochastic_depth"))
            .count();
        assert_eq!(sd, 17);
        let copies = g.nodes.iter().filter(|n| n.op == Op::Copy).count();
        assert_eq!(copies, 1);
    }

    #[test]
    fn validation_names_fields() {
        let mut p = preset("tiny");
        p.channels[2] = 0;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.channels[2]")
        );
        let mut p = preset("tiny");
        p.depths[3] = 5000;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.depths[3]")
        );
        let mut p = preset("tiny");
        p.stochastic_depth_prob = 1.5;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.stochastic_depth_prob")
        );
        let mut p = preset("tiny");
        p.num_classes = 0;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.num_classes")
        );
    }

    #[test]
    fn builtin_presets_build() {
        for (id, n) in [
            ("convnext_tiny", 28_589_128),
            ("convnext_small", 50_223_688),
            ("convnext_base", 88_591_464),
        ] {
            let preset = crate::model::preset::find_builtin(id).unwrap();
            let crate::model::preset::ModelSpec::Convnext(p) = &preset.spec else {
                panic!("{id}")
            };
            let g = build(p, preset.default_size(), 3);
            assert_eq!(g.param_count(), n, "{id}");
        }
    }
}
