//! torchvision ResNet (`torchvision/models/resnet.py`), also the backbone of DeepLabV3 / FCN.

use serde::Deserialize;

use crate::model::builder::{ConvSpec, Feat, GraphBuilder};
use crate::model::checks::{MAX_DIM, ModelError, check_layers, check_positive};
use crate::model::ir::Pointwise;

/// Builder parameters of a ResNet classifier.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResnetParams {
    /// "basic" (ResNet-18/34) or "bottleneck" (50/101/152).
    pub block: BlockKind,
    /// Blocks per stage.
    pub layers: [u64; 4],
    pub num_classes: u64,
    pub groups: u64,
    pub width_per_group: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockKind {
    Basic,
    Bottleneck,
}

impl BlockKind {
    fn expansion(self) -> u64 {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

impl ResnetParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_positive("params.num_classes", self.num_classes)?;
        check_positive("params.groups", self.groups)?;
        check_positive("params.width_per_group", self.width_per_group)?;
        for (i, &l) in self.layers.iter().enumerate() {
            check_layers(&format!("params.layers[{i}]"), l)?;
        }
        // The widest grouped convolution: layer4's `512 · width_per_group / 64 · groups`
        // channels (torchvision's `width`). Beyond MAX_DIM the shapes overflow.
        let widest = (512 * self.width_per_group / 64).saturating_mul(self.groups);
        if widest > MAX_DIM {
            return Err(ModelError::Invalid {
                field: "params.width_per_group".into(),
                reason: format!(
                    "512 · width_per_group / 64 · groups = {widest} channels exceeds the limit {MAX_DIM}"
                ),
            });
        }
        Ok(())
    }
}

/// The ResNet trunk (stem + 4 stages) with optional stride→dilation replacement per stage 2..4.
pub struct Trunk {
    pub block: BlockKind,
    pub layers: [u64; 4],
    pub groups: u64,
    pub width_per_group: u64,
    pub dilate: [bool; 3],
}

impl Trunk {
    /// Returns the output of layer4 (and layer3, used by auxiliary heads).
    pub fn build(&self, b: &mut GraphBuilder, x: Feat) -> Feat {
        b.scope("stem");
        let mut x = b.conv_bn_act(
            x,
            ConvSpec::new(64, 7, 2).padding(3),
            Some(Pointwise::Relu),
            "conv1",
        );
        x = b.maxpool(x, 3, 2, 1, "maxpool");
        let mut inplanes = 64;
        let mut dilation = 1;
        for stage in 0..4 {
            let planes = 64 << stage;
            let mut stride = if stage == 0 { 1 } else { 2 };
            let previous_dilation = dilation;
            if stage > 0 && self.dilate[stage - 1] {
                dilation *= stride;
                stride = 1;
            }
            for i in 0..self.layers[stage] {
                b.scope(format!("layer{}.{}", stage + 1, i));
                let (s, d) = if i == 0 {
                    (stride, previous_dilation)
                } else {
                    (1, dilation)
                };
                let downsample = i == 0 && (s != 1 || inplanes != planes * self.block.expansion());
                b.begin_block();
                x = self.block_fwd(b, x, planes, s, d, downsample);
                b.end_block();
                inplanes = planes * self.block.expansion();
            }
        }
        x
    }

    fn block_fwd(
        &self,
        b: &mut GraphBuilder,
        x: Feat,
        planes: u64,
        stride: u64,
        dilation: u64,
        downsample: bool,
    ) -> Feat {
        let out_c = planes * self.block.expansion();
        let relu = Some(Pointwise::Relu);
        let y = match self.block {
            BlockKind::Basic => {
                let y = b.conv_bn_act(x, ConvSpec::new(planes, 3, stride), relu, "conv1");
                let y = b.conv(
                    y,
                    ConvSpec::new(planes, 3, 1)
                        .padding(dilation)
                        .dilation(dilation),
                    "conv2",
                );
                b.batchnorm(y, "bn2")
            }
            BlockKind::Bottleneck => {
                let width = planes * self.width_per_group / 64 * self.groups;
                let y = b.conv_bn_act(x, ConvSpec::new(width, 1, 1), relu, "conv1");
                let y = b.conv_bn_act(
                    y,
                    ConvSpec::new(width, 3, stride)
                        .padding(dilation)
                        .dilation(dilation)
                        .groups(self.groups),
                    relu,
                    "conv2",
                );
                let y = b.conv(y, ConvSpec::new(out_c, 1, 1), "conv3");
                b.batchnorm(y, "bn3")
            }
        };
        let identity = if downsample {
            let d = b.conv(x, ConvSpec::new(out_c, 1, stride), "downsample.0");
            b.batchnorm(d, "downsample.1")
        } else {
            x
        };
        // `out += identity` then ReLU(inplace=True): both write into bn's output.
        let sum = b.binary(y.id, identity.id, Pointwise::Add, true, "add");
        let out = b.pointwise(sum, Pointwise::Relu, true, "relu");
        Feat { id: out, ..y }
    }
}

/// Builds a ResNet classifier for `image`×`image` RGB inputs.
pub fn build(p: &ResnetParams, image: u64, channels: u64) -> crate::model::ir::Graph {
    let mut b = GraphBuilder::new();
    let x = b.image(channels, image, image);
    let labels = b.labels(1);
    let trunk = Trunk {
        block: p.block,
        layers: p.layers,
        groups: p.groups,
        width_per_group: p.width_per_group,
        dilate: [false; 3],
    };
    let x = trunk.build(&mut b, x);
    b.scope("head");
    let pooled = b.adaptive_avgpool(x, 1, 1, "avgpool");
    let flat = b.view(pooled.id, "flatten");
    let logits = b.linear(flat, 1, pooled.c, p.num_classes, true, "fc");
    b.cross_entropy(logits, labels, 1, p.num_classes, false);
    b.finish()
}
