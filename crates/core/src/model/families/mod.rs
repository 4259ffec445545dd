//! One builder per model family; each mirrors its reference implementation op by op.

pub mod bert;
pub mod convnext;
pub mod deberta;
pub mod decoder;
pub mod decoder_norm;
pub mod efficientnet;
pub mod encoder;
pub mod encoder_options;
pub mod gpt2;
pub mod gpt_neox;
pub mod llama;
pub mod mla;
pub mod mla_params;
pub mod mobilenet;
pub mod modernbert;
pub mod moe;
pub mod moe_params;
pub mod resnet;
pub mod segmentation;
pub mod sinks;
pub mod t5;
pub mod transformer;
pub mod unet;
pub mod vit;
