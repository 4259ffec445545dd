//! The names users type for precisions, optimizers, attention kernels, export formats and
//! built-in models, with their aliases (resolved by [`crate::names`]: case- and
//! punctuation-insensitive, "did you mean" on a typo, ambiguous aliases refused). The
//! [`Parse`] of those types reads through here, so every front end accepts the same names.

use crate::parse::Parse;

use crate::names::{Choice, NameError, Partial, Resolved, resolve};
use vramlab_core::export::Format;
use vramlab_core::plan::config::{Attention, Optimizer, Precision};

/// Precision aliases. `fp16`/`half`/`16-mixed` mean autocast fp16 (`amp-fp16`: pure fp16
/// training is not modelled); `bfloat16`/`bf16-true` mean pure bf16 (`bf16`,
/// `model.to(torch.bfloat16)`); `bf16-amp`/`bf16-mixed` mean autocast bf16 (`amp-bf16`);
/// `float32`/`32`/`tf32` mean `fp32`. A bare `amp` is refused: fp16 or bf16?
pub fn precision(input: &str) -> Result<Resolved<Precision>, NameError> {
    let choices = [
        Choice::new(
            "fp32",
            &["float32", "f32", "32", "32-true", "full", "tf32"],
            Precision::Fp32,
        ),
        Choice::new(
            "amp-fp16",
            &[
                "fp16",
                "float16",
                "f16",
                "half",
                "16",
                "16-mixed",
                "fp16-amp",
                "fp16-mixed",
                "autocast-fp16",
                "amp",
                "mixed",
            ],
            Precision::AmpFp16,
        ),
        Choice::new(
            "amp-bf16",
            &["bf16-amp", "bf16-mixed", "autocast-bf16", "amp", "mixed"],
            Precision::AmpBf16,
        ),
        Choice::new(
            "bf16",
            &["bfloat16", "bf16-true", "pure-bf16", "bf16-pure"],
            Precision::Bf16,
        ),
    ];
    let mut r = resolve("precision", input, &choices, Partial::Exact, "")?;
    if let Some(note) = &mut r.note {
        note.push_str(match r.value {
            Precision::Fp32 => " (float32 weights and math; TF32 matmuls use the same memory)",
            Precision::AmpFp16 => {
                " (autocast fp16 with fp32 weights and a GradScaler; pure fp16 training is not modelled)"
            }
            Precision::AmpBf16 => " (autocast bf16 with fp32 weights)",
            Precision::Bf16 => {
                " (pure bf16: model.to(torch.bfloat16), no fp32 master weights; autocast bf16 is amp-bf16)"
            }
        });
    }
    Ok(r)
}

/// Optimizer aliases (`sgdm`, `momentum`, `adam-8bit`, `adamw8bit`, `bnb-adam8bit`, …).
pub fn optimizer(input: &str) -> Result<Resolved<Optimizer>, NameError> {
    let choices = [
        Choice::new("sgd", &["plain-sgd"], Optimizer::Sgd),
        Choice::new(
            "sgd-momentum",
            &["sgdm", "momentum", "sgd-with-momentum", "nesterov"],
            Optimizer::SgdMomentum,
        ),
        Choice::new("adam", &[], Optimizer::Adam),
        Choice::new("adamw", &["adam-w", "adamw-torch"], Optimizer::AdamW),
        Choice::new("adafactor", &[], Optimizer::Adafactor),
        Choice::new(
            "adam8bit",
            &["adam-8bit", "8bit-adam", "bnb-adam8bit"],
            Optimizer::Adam8bit,
        ),
        Choice::new(
            "adamw-8bit",
            &[
                "adamw8bit",
                "adamw_8bit",
                "8bit-adamw",
                "adamw_bnb_8bit",
                "adamw-bnb-8bit",
                "bnb-adamw8bit",
            ],
            Optimizer::AdamW8bit,
        ),
        Choice::new(
            "paged-adamw-8bit",
            &["paged_adamw_8bit", "pagedadamw8bit", "paged-adamw8bit"],
            Optimizer::PagedAdamW8bit,
        ),
        Choice::new(
            "paged-adamw",
            &[
                "paged_adamw_32bit",
                "paged-adamw-32bit",
                "paged-adamw32bit",
                "pagedadamw",
                "paged_adamw",
            ],
            Optimizer::PagedAdamW,
        ),
    ];
    resolve("optimizer", input, &choices, Partial::Exact, "")
}

/// Attention aliases (`flash`, `flash-attention-2`, `sdpa`, `math` is eager).
pub fn attention(input: &str) -> Result<Resolved<Attention>, NameError> {
    let choices = [
        Choice::new("eager", &["math", "naive"], Attention::Eager),
        Choice::new(
            "sdpa",
            &[
                "flash",
                "flash-attention",
                "flash-attention-2",
                "flash-attn",
                "fa2",
                "memory-efficient",
            ],
            Attention::Sdpa,
        ),
    ];
    resolve("attention", input, &choices, Partial::Exact, "")
}

/// Export-format aliases (`huggingface`, `ds`, `pl`, `torch`, `json`; `transformers` is the
/// inference export, [`vramlab_core::export::InferFormat`]).
pub fn format(input: &str) -> Result<Resolved<Format>, NameError> {
    let aliases = |f: Format| -> &'static [&'static str] {
        match f {
            Format::Vramlab => &["json", "vramlab-json"],
            Format::DeepSpeed => &["ds", "deepspeed-json"],
            Format::HuggingFace => &["huggingface", "training-arguments", "trainer"],
            Format::Lightning => &["pl", "pytorch-lightning", "lightning-trainer"],
            Format::PyTorch => &["torch", "pt", "python"],
            Format::Env => &["alloc-conf", "pytorch-cuda-alloc-conf", "shell"],
            Format::Accelerate => &["accelerate-yaml", "accelerate-config"],
            Format::Torchrun => &["torchrun-command", "launch"],
            Format::Fsdp2 => &["fully-shard", "fsdp-snippet"],
            Format::Peft => &["lora", "qlora", "trl", "sft", "sftconfig", "bitsandbytes"],
        }
    };
    let choices: Vec<Choice<Format>> = Format::ALL
        .into_iter()
        .chain(Format::DISTRIBUTED)
        .map(|f| Choice::new(f.as_str(), aliases(f), f))
        .collect();
    resolve("format", input, &choices, Partial::Exact, "")
}

/// A built-in model preset id by id or display name (`llama-3-8b` → `Meta-Llama-3-8B`,
/// `gpt-2` → `gpt2`, `vit-b-16` → `vit_b_16`, `bert-base` → `bert-base-uncased`).
pub fn model_id(input: &str) -> Result<Resolved<&'static str>, NameError> {
    let choices: Vec<Choice<&'static str>> = vramlab_core::model::preset::BUILTIN
        .iter()
        .map(|(id, text)| {
            let mut aliases = Vec::new();
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
                && let Some(d) = v.get("display_name").and_then(|d| d.as_str())
            {
                aliases.push(d.to_string());
            }
            let lower = id.to_ascii_lowercase();
            let bare = lower
                .trim_start_matches("meta-")
                .trim_end_matches("-hf")
                .trim_end_matches("-uncased");
            if bare != lower {
                aliases.push(bare.to_string());
            }
            Choice {
                canonical: (*id).to_string(),
                aliases,
                value: *id,
            }
        })
        .collect();
    resolve(
        "model",
        input,
        &choices,
        Partial::Exact,
        "run `vramlab presets` for the list, or pass a preset or config.json path, a model \
         folder, or a Hugging Face Hub id with its owner (`Qwen/Qwen2.5-7B`)",
    )
}

impl Parse for Precision {
    type Err = NameError;
    fn parse_word(s: &str) -> Result<Self, Self::Err> {
        Ok(precision(s)?.value)
    }
}

impl Parse for Optimizer {
    type Err = NameError;
    fn parse_word(s: &str) -> Result<Self, Self::Err> {
        Ok(optimizer(s)?.value)
    }
}

impl Parse for Attention {
    type Err = NameError;
    fn parse_word(s: &str) -> Result<Self, Self::Err> {
        Ok(attention(s)?.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabularies() {
        assert_eq!(precision("fp16").map(|r| r.value), Ok(Precision::AmpFp16));
        assert_eq!(
            precision("BF16-AMP").map(|r| r.value),
            Ok(Precision::AmpBf16)
        );
        let r = precision("bfloat16").expect("bfloat16");
        assert_eq!(r.value, Precision::Bf16);
        assert!(r.note.is_some_and(|n| n.contains("pure bf16")));
        assert!(matches!(precision("amp"), Err(NameError::Ambiguous { .. })));
        assert!(
            precision("fp61").is_err_and(|e| e.to_string().contains("did you mean `amp-fp16`"))
        );
        assert_eq!(optimizer("AdamW").map(|r| r.note), Ok(None));
        assert_eq!(
            optimizer("sgdm").map(|r| r.value),
            Ok(Optimizer::SgdMomentum)
        );
        assert_eq!(
            attention("flash_attention_2").map(|r| r.value),
            Ok(Attention::Sdpa)
        );
        assert_eq!(
            format("huggingface").map(|r| r.value),
            Ok(Format::HuggingFace)
        );
        assert!(format("deepspeeed").is_err_and(|e| e.to_string().contains("`deepspeed`")));
        assert_eq!(
            model_id("llama-3-8b").map(|r| r.value),
            Ok("Meta-Llama-3-8B")
        );
        assert_eq!(model_id("Llama 2 7B").map(|r| r.value), Ok("Llama-2-7b-hf"));
        assert_eq!(model_id("ResNet-50").map(|r| r.note), Ok(None));
        assert_eq!(model_id("vit-b-16").map(|r| r.value), Ok("vit_b_16"));
        assert_eq!(
            model_id("bert-base").map(|r| r.value),
            Ok("bert-base-uncased")
        );
        let e = model_id("gtp2").expect_err("typo");
        assert!(e.to_string().contains("did you mean `gpt2`?"), "{e}");
        let e = model_id("llama").expect_err("a part");
        assert!(e.to_string().contains("Meta-Llama-3-8B"), "{e}");
        assert_eq!(format("HF").map(|r| r.value), Ok(Format::HuggingFace));
        assert!(format("xml").is_err());
    }
}
