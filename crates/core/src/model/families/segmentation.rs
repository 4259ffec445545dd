//! torchvision DeepLabV3 and FCN with a ResNet bottleneck backbone
//! (`torchvision/models/segmentation/{deeplabv3,fcn,_utils}.py`).
//!
//! Backbone: `resnet50/101(replace_stride_with_dilation=[False, True, True])` up to layer4
//! (`IntermediateLayerGetter`, no avgpool / fc), output stride 8. No auxiliary head
//! (`aux_loss=None`). The head's output is `F.interpolate(.., size=input, mode="bilinear")`
//! and the loss is per-pixel cross-entropy.
//!
//! All head activations are `nn.ReLU()` (not inplace); the head dropouts (`Dropout(0.5)`
//! in ASPP's projection, `Dropout(0.1)` in FCNHead) are not inplace.
//! Each ResNet bottleneck is one checkpoint block; the heads are not checkpointed.

use serde::{Deserialize, Serialize};

use super::resnet::{BlockKind, Trunk};
use crate::model::builder::{ConvSpec, Feat, GraphBuilder};
use crate::model::checks::{ModelError, check_positive};
use crate::model::ir::{Graph, Op, Pointwise};

/// Largest number of bottlenecks accepted per stage (ResNet-152 has 36).
const MAX_BLOCKS: u64 = 1000;

/// Builder parameters of a DeepLabV3 / FCN segmentation model.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SegParams {
    /// Bottlenecks per backbone stage ([3, 4, 6, 3] = ResNet-50, [3, 4, 23, 3] = ResNet-101).
    pub backbone_layers: [u64; 4],
    pub num_classes: u64,
}

impl SegParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        for (i, &l) in self.backbone_layers.iter().enumerate() {
            let field = format!("params.backbone_layers[{i}]");
            check_positive(&field, l)?;
            if l > MAX_BLOCKS {
                return Err(ModelError::TooLarge {
                    field,
                    value: l,
                    limit: MAX_BLOCKS,
                });
            }
        }
        check_positive("params.num_classes", self.num_classes)?;
        Ok(())
    }
}

/// The input image, the per-pixel labels and the layer4 output (2048 channels, stride 8).
fn backbone(b: &mut GraphBuilder, p: &SegParams, image: u64, channels: u64) -> (Feat, usize) {
    let x = b.image(channels, image, image);
    let labels = b.labels(image * image);
    let trunk = Trunk {
        block: BlockKind::Bottleneck,
        layers: p.backbone_layers,
        groups: 1,
        width_per_group: 64,
        dilate: [false, true, true],
    };
    let x = trunk.build(b, x);
    (x, labels)
}

/// `nn.Conv2d(.., bias=False)` → `nn.BatchNorm2d` → `nn.ReLU()` (not inplace).
/// Layer names are `{name}.{idx[k]}` (just the index when `name` is empty).
fn conv_bn_relu(b: &mut GraphBuilder, x: Feat, s: ConvSpec, name: &str, idx: [u64; 3]) -> Feat {
    let n = |i: u64| {
        if name.is_empty() {
            i.to_string()
        } else {
            format!("{name}.{i}")
        }
    };
    let y = b.conv(x, s, &n(idx[0]));
    let y = b.batchnorm(y, &n(idx[1]));
    b.act(y, Pointwise::Relu, false, &n(idx[2]))
}

/// `F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)`.
fn upsample(b: &mut GraphBuilder, x: Feat, h: u64, w: u64, name: &str) -> Feat {
    let id = b.op(Op::Upsample, &[x.id], x.c * h * w, &[], name);
    Feat { id, c: x.c, h, w }
}

/// Final upsampling to the input size and the per-pixel loss.
fn finish(mut b: GraphBuilder, logits: Feat, labels: usize, image: u64, classes: u64) -> Graph {
    b.scope("");
    let out = upsample(&mut b, logits, image, image, "interpolate");
    b.cross_entropy(out.id, labels, image * image, classes, false);
    b.finish()
}

/// torchvision `deeplabv3_resnet50/101` (no auxiliary head).
pub fn build_deeplabv3(p: &SegParams, image: u64, channels: u64) -> Graph {
    let mut b = GraphBuilder::new();
    let (x, labels) = backbone(&mut b, p, image, channels);
    const OUT: u64 = 256;

    // ASPP(2048, (12, 24, 36)).
    b.scope("classifier.0");
    let mut branches = Vec::with_capacity(5);
    branches.push(conv_bn_relu(
        &mut b,
        x,
        ConvSpec::new(OUT, 1, 1),
        "convs.0",
        [0, 1, 2],
    ));
    for (i, rate) in [12u64, 24, 36].into_iter().enumerate() {
        let s = ConvSpec::new(OUT, 3, 1).padding(rate).dilation(rate);
        branches.push(conv_bn_relu(
            &mut b,
            x,
            s,
            &format!("convs.{}", i + 1),
            [0, 1, 2],
        ));
    }
    // ASPPPooling: avgpool → 1×1 conv → BN → ReLU → interpolate back.
    let pooled = b.adaptive_avgpool(x, 1, 1, "convs.4.0");
    let pooled = conv_bn_relu(
        &mut b,
        pooled,
        ConvSpec::new(OUT, 1, 1),
        "convs.4",
        [1, 2, 3],
    );
    branches.push(upsample(&mut b, pooled, x.h, x.w, "convs.4.interpolate"));
    let cat_c: u64 = branches.iter().map(|f| f.c).sum();
    let ids: Vec<usize> = branches.iter().map(|f| f.id).collect();
    let cat = b.op(Op::Concat, &ids, cat_c * x.h * x.w, &[], "cat");
    let cat = Feat {
        id: cat,
        c: cat_c,
        ..x
    };
    let y = conv_bn_relu(&mut b, cat, ConvSpec::new(OUT, 1, 1), "project", [0, 1, 2]);
    let id = b.dropout(y.id, 0.5, false, "project.3");
    let y = Feat { id, ..y };

    // DeepLabHead tail.
    b.scope("classifier");
    let y = conv_bn_relu(&mut b, y, ConvSpec::new(OUT, 3, 1), "", [1, 2, 3]);
    let logits = b.conv(y, ConvSpec::new(p.num_classes, 1, 1).bias(true), "4");
    finish(b, logits, labels, image, p.num_classes)
}

/// torchvision `fcn_resnet50/101` (no auxiliary head).
pub fn build_fcn(p: &SegParams, image: u64, channels: u64) -> Graph {
    let mut b = GraphBuilder::new();
    let (x, labels) = backbone(&mut b, p, image, channels);
    // FCNHead(2048, num_classes): inter = 2048 / 4.
    b.scope("classifier");
    let y = conv_bn_relu(&mut b, x, ConvSpec::new(x.c / 4, 3, 1), "", [0, 1, 2]);
    let id = b.dropout(y.id, 0.1, false, "3");
    let y = Feat { id, ..y };
    let logits = b.conv(y, ConvSpec::new(p.num_classes, 1, 1).bias(true), "4");
    finish(b, logits, labels, image, p.num_classes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const R50: [u64; 4] = [3, 4, 6, 3];
    const R101: [u64; 4] = [3, 4, 23, 3];

    fn params(layers: [u64; 4]) -> SegParams {
        SegParams {
            backbone_layers: layers,
            num_classes: 21,
        }
    }

    #[test]
    fn param_counts_match_torchvision() {
        // sum(p.numel() for p in torchvision.models.segmentation.X(weights=None,
        // weights_backbone=None).parameters()), torchvision 0.29.
        assert_eq!(
            build_deeplabv3(&params(R50), 512, 3).param_count(),
            39_638_869
        );
        assert_eq!(
            build_deeplabv3(&params(R101), 512, 3).param_count(),
            58_630_997
        );
        assert_eq!(build_fcn(&params(R50), 512, 3).param_count(), 32_957_013);
    }

    #[test]
    fn conv_outputs_match_forward_hooks() {
        // Per-sample elements of all Conv2d outputs, from forward hooks at 512×512.
        let g = build_deeplabv3(&params(R50), 512, 3);
        assert_eq!(g.conv_outputs(), (137_974_016, 61));
        assert_eq!(g.block_count(), 16);
        let g = build_fcn(&params(R50), 512, 3);
        assert_eq!(g.conv_outputs(), (133_779_456, 55));
    }

    #[test]
    fn output_is_upsampled_to_the_input() {
        let g = build_fcn(&params(R50), 520, 3);
        let n = g.nodes.len();
        let up = &g.nodes[n - 2];
        assert_eq!(up.op, Op::Upsample);
        assert_eq!(g.tensors[up.output].per_sample, 21 * 520 * 520);
        assert_eq!(
            g.nodes[n - 1].op,
            Op::CrossEntropy {
                rows: 520 * 520,
                classes: 21,
                upcast: false
            }
        );
        // Labels are created with the data.
        assert_eq!(g.tensors[g.nodes[n - 1].inputs[1]].per_sample, 520 * 520);
    }

    #[test]
    fn validation_names_fields() {
        let mut p = params(R50);
        p.backbone_layers[1] = 0;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.backbone_layers[1]")
        );
        let mut p = params(R50);
        p.backbone_layers[3] = 1_000_000;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("params.backbone_layers[3]")
        );
        let mut p = params(R50);
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
            ("deeplabv3_resnet50", 39_638_869),
            ("deeplabv3_resnet101", 58_630_997),
            ("fcn_resnet50", 32_957_013),
        ] {
            let preset = crate::model::preset::find_builtin(id).unwrap();
            let g = match &preset.spec {
                crate::model::preset::ModelSpec::Deeplabv3(p) => {
                    build_deeplabv3(p, preset.default_size(), 3)
                }
                crate::model::preset::ModelSpec::Fcn(p) => build_fcn(p, preset.default_size(), 3),
                _ => panic!("{id}"),
            };
            assert_eq!(g.param_count(), n, "{id}");
        }
    }
}
