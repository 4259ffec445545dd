//! The reference UNet of `crates/device/runners/torch_runner.py` (see presets/README.md, "UNet reference").
//!
//! - `DoubleConv(cin, cout)` = (Conv2d 3×3 pad 1 no bias → BatchNorm2d → ReLU(inplace)) × 2;
//! - `inc = DoubleConv(in_channels, c)`; `depth` × `Down` = MaxPool2d(2) → DoubleConv(c·2^i, c·2^(i+1));
//! - decoder from the bottom: ConvTranspose2d(c·2^(i+1), c·2^i, k2, s2, bias) →
//!   `torch.cat([skip, up], dim=1)` → DoubleConv(c·2^(i+1), c·2^i);
//! - `outc` = Conv2d(c, num_classes, 1, bias); per-pixel cross-entropy.
//!
//! Each `DoubleConv` is one checkpoint block (the pooling of `Down` is outside it).

use serde::{Deserialize, Serialize};

use crate::model::builder::{ConvSpec, Feat, GraphBuilder};
use crate::model::checks::{MAX_DIM, ModelError, check_positive};
use crate::model::ir::{Graph, Op, Pointwise};

/// Deepest UNet accepted.
const MAX_DEPTH: u64 = 16;

/// Builder parameters of the reference UNet.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UnetParams {
    /// Number of down / up levels.
    pub depth: u64,
    /// Channels of the first level (doubled per level).
    pub base_channels: u64,
    pub in_channels: u64,
    pub num_classes: u64,
}

impl UnetParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_positive("params.depth", self.depth)?;
        if self.depth > MAX_DEPTH {
            return Err(ModelError::TooLarge {
                field: "params.depth".into(),
                value: self.depth,
                limit: MAX_DEPTH,
            });
        }
        check_positive("params.base_channels", self.base_channels)?;
        let widest = self.base_channels << self.depth;
        if widest > MAX_DIM {
            return Err(ModelError::Invalid {
                field: "params.base_channels".into(),
                reason: format!(
                    "base_channels · 2^depth = {widest} channels at the bottom exceeds the limit {MAX_DIM}"
                ),
            });
        }
        check_positive("params.in_channels", self.in_channels)?;
        check_positive("params.num_classes", self.num_classes)?;
        Ok(())
    }
}

/// One `DoubleConv` as a checkpoint block.
fn double_conv(b: &mut GraphBuilder, x: Feat, out: u64, scope: &str) -> Feat {
    let relu = Some(Pointwise::Relu);
    b.scope(scope);
    b.begin_block();
    let y = b.conv_bn_act(x, ConvSpec::new(out, 3, 1), relu, "0");
    let y = b.conv_bn_act(y, ConvSpec::new(out, 3, 1), relu, "3");
    b.end_block();
    y
}

/// Builds the UNet for `image`×`image` inputs of `in_channels` channels. The image side
/// must be divisible by 2^depth (the skips would not line up otherwise).
pub fn build(p: &UnetParams, image: u64) -> Result<Graph, ModelError> {
    p.validate()?;
    let step = 1u64 << p.depth;
    if !image.is_multiple_of(step) {
        return Err(ModelError::Invalid {
            field: "image_size".into(),
            reason: format!(
                "{image} is not divisible by 2^depth = {step} (UNet depth {})",
                p.depth
            ),
        });
    }
    let c = p.base_channels;
    let mut b = GraphBuilder::new();
    let x = b.image(p.in_channels, image, image);
    let labels = b.labels(image * image);

    let mut x = double_conv(&mut b, x, c, "inc");
    let mut skips = vec![x];
    for i in 0..p.depth {
        b.scope(format!("downs.{i}"));
        let pooled = b.maxpool(x, 2, 2, 0, "0");
        x = double_conv(&mut b, pooled, c << (i + 1), &format!("downs.{i}.1"));
        skips.push(x);
    }
    skips.pop(); // the bottom output is x itself
    for (j, i) in (0..p.depth).rev().enumerate() {
        b.scope("");
        let up = b.conv_transpose(x, c << i, 2, &format!("ups.{j}"));
        let skip = skips.pop().unwrap_or(up);
        let cat_c = skip.c + up.c;
        let id = b.op(
            Op::Concat,
            &[skip.id, up.id],
            cat_c * up.h * up.w,
            &[],
            &format!("cat.{j}"),
        );
        let cat = Feat { id, c: cat_c, ..up };
        x = double_conv(&mut b, cat, c << i, &format!("up_convs.{j}"));
    }
    b.scope("");
    let logits = b.conv(x, ConvSpec::new(p.num_classes, 1, 1).bias(true), "outc");
    b.cross_entropy(logits.id, labels, image * image, p.num_classes, false);
    Ok(b.finish())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn preset() -> UnetParams {
        UnetParams {
            depth: 4,
            base_channels: 64,
            in_channels: 3,
            num_classes: 2,
        }
    }

    #[test]
    fn param_counts_match_the_reference() {
        // sum(p.numel() for p in crates/device/runners/torch_runner.py UNet(...).parameters()).
        assert_eq!(build(&preset(), 256).unwrap().param_count(), 31_037_698);
        let p = UnetParams {
            depth: 3,
            base_channels: 32,
            in_channels: 1,
            num_classes: 5,
        };
        assert_eq!(build(&p, 64).unwrap().param_count(), 1_926_565);
        let p = UnetParams {
            depth: 5,
            base_channels: 16,
            in_channels: 3,
            num_classes: 2,
        };
        assert_eq!(build(&p, 64).unwrap().param_count(), 7_778_626);
    }

    #[test]
    fn conv_outputs_match_forward_hooks() {
        // Per-sample elements of all Conv2d / ConvTranspose2d outputs at 64×64.
        let g = build(&preset(), 64).unwrap();
        assert_eq!(g.conv_outputs(), (2_498_560, 23));
        assert_eq!(g.block_count(), 9);
        let last = g.nodes.last().unwrap();
        assert_eq!(
            last.op,
            Op::CrossEntropy {
                rows: 64 * 64,
                classes: 2,
                upcast: false
            }
        );
    }

    #[test]
    fn image_must_divide_by_two_to_the_depth() {
        let e = build(&preset(), 100).unwrap_err().to_string();
        assert!(e.contains("image_size"), "{e}");
        assert!(build(&preset(), 112).is_ok());
    }

    #[test]
    fn validation_names_fields() {
        let bad = |f: &dyn Fn(&mut UnetParams), field: &str| {
            let mut p = preset();
            f(&mut p);
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e} should name {field}");
        };
        bad(&|p| p.depth = 0, "params.depth");
        bad(&|p| p.depth = 64, "params.depth");
        bad(&|p| p.base_channels = 0, "params.base_channels");
        bad(&|p| p.base_channels = 1 << 22, "params.base_channels");
        bad(&|p| p.in_channels = 0, "params.in_channels");
        bad(&|p| p.num_classes = 0, "params.num_classes");
    }

    #[test]
    fn builtin_presets_build() {
        let preset = crate::model::preset::find_builtin("unet").unwrap();
        let crate::model::preset::ModelSpec::Unet(p) = &preset.spec else {
            panic!("unet preset has family {}", preset.spec.family())
        };
        let g = build(p, preset.default_size()).unwrap();
        assert_eq!(g.param_count(), 31_037_698);
    }
}
