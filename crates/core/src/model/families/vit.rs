//! torchvision `VisionTransformer` (`torchvision/models/vision_transformer.py`).

use serde::{Deserialize, Serialize};

use super::transformer::{AttnImpl, AttnShape, attention, layer_norm};
use crate::model::builder::{ConvSpec, GraphBuilder};
use crate::model::checks::{ModelError, check_layers, check_positive, check_prob};
use crate::model::ir::{Graph, Op, Pointwise};

/// Builder parameters of a ViT classifier (the image size comes from the input).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VitParams {
    pub patch_size: u64,
    pub num_layers: u64,
    pub num_heads: u64,
    pub hidden_dim: u64,
    pub mlp_dim: u64,
    pub dropout: f64,
    pub attention_dropout: f64,
    pub num_classes: u64,
}

impl VitParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_positive("params.patch_size", self.patch_size)?;
        check_layers("params.num_layers", self.num_layers)?;
        check_positive("params.num_heads", self.num_heads)?;
        check_positive("params.hidden_dim", self.hidden_dim)?;
        check_positive("params.mlp_dim", self.mlp_dim)?;
        check_positive("params.num_classes", self.num_classes)?;
        if !self.hidden_dim.is_multiple_of(self.num_heads) {
            return Err(ModelError::Invalid {
                field: "params.num_heads".into(),
                reason: format!(
                    "hidden_dim {} is not divisible by num_heads {}",
                    self.hidden_dim, self.num_heads
                ),
            });
        }
        check_prob("params.dropout", self.dropout)?;
        check_prob("params.attention_dropout", self.attention_dropout)
    }
}

/// Builds a ViT for `image`×`image` inputs.
pub fn build(p: &VitParams, image: u64, channels: u64) -> Result<Graph, ModelError> {
    if !image.is_multiple_of(p.patch_size) {
        return Err(ModelError::Invalid {
            field: "image_size".into(),
            reason: format!(
                "{image} is not divisible by the patch size {}",
                p.patch_size
            ),
        });
    }
    let d = p.hidden_dim;
    let n = (image / p.patch_size) * (image / p.patch_size);
    let seq = n + 1;
    let mut b = GraphBuilder::new();
    let x = b.image(channels, image, image);
    let labels = b.labels(1);
    let x = b.conv(
        x,
        ConvSpec::new(d, p.patch_size, p.patch_size)
            .padding(0)
            .bias(true),
        "conv_proj",
    );
    let x = b.view(x.id, "reshape_permute");
    let class_token = b.param(d, None);
    // torch.cat([class_token.expand(b, -1, -1), x], dim=1)
    let x = b.op(Op::Concat, &[x], seq * d, &[class_token], "cat_class_token");
    let pos = b.param(seq * d, Some((seq, d)));
    b.scope("encoder");
    let h = b.op(
        Op::Pointwise {
            f: Pointwise::Add,
            inplace: false,
        },
        &[x],
        seq * d,
        &[pos],
        "add_pos_embedding",
    );
    let mut h = b.dropout(h, p.dropout, false, "dropout");
    let shape = AttnShape {
        seq,
        heads: p.num_heads,
        kv_heads: p.num_heads,
        head_dim: d / p.num_heads,
        dropout: p.attention_dropout,
        softmax_fp32: false,
        causal: false,
        softcap: false,
    };
    for l in 0..p.num_layers {
        b.scope(format!("encoder.layers.encoder_layer_{l}"));
        b.begin_block();
        let x = layer_norm(&mut b, h, seq, d, "ln_1");
        // nn.MultiheadAttention (training path): packed in-projection, then
        // unflatten/transpose/contiguous copies the 3·D projection.
        let proj = b.linear(x, seq, d, 3 * d, true, "self_attention.in_proj");
        let qkv = b.copy(proj, "self_attention.in_proj_contiguous");
        let a = attention(&mut b, &[qkv], shape, AttnImpl::Sdpa, "self_attention");
        // permute(2, 0, 1, 3).contiguous()
        let a = b.sdpa_out_contiguous(a, "self_attention.out_contiguous");
        let a = b.linear(a, seq, d, d, true, "self_attention.out_proj");
        let a = b.dropout(a, p.dropout, false, "dropout");
        let y = b.binary(a, h, Pointwise::Add, false, "residual_1");
        let z = layer_norm(&mut b, y, seq, d, "ln_2");
        let z = b.linear(z, seq, d, p.mlp_dim, true, "mlp.0");
        let z = b.pointwise(z, Pointwise::Gelu, false, "mlp.1");
        let z = b.dropout(z, p.dropout, false, "mlp.2");
        let z = b.linear(z, seq, p.mlp_dim, d, true, "mlp.3");
        let z = b.dropout(z, p.dropout, false, "mlp.4");
        h = b.binary(y, z, Pointwise::Add, false, "residual_2");
        b.end_block();
    }
    b.scope("encoder");
    let h = layer_norm(&mut b, h, seq, d, "ln");
    b.scope("heads");
    // x[:, 0] is a view.
    let cls = b.op(Op::View, &[h], d, &[], "class_token_slice");
    let logits = b.linear(cls, 1, d, p.num_classes, true, "head");
    b.cross_entropy(logits, labels, 1, p.num_classes, false);
    Ok(b.finish())
}
