//! Framework configs generated from a plan: DeepSpeed JSON, Hugging Face
//! `TrainingArguments`, PyTorch Lightning `Trainer` arguments, a plain PyTorch training
//! loop, and the allocator environment line.

use serde_json::{Value, json};

use crate::plan::config::{Attention, LoopShape, Optimizer, Precision};
use crate::plan::finetune::FineTuneMode;
use crate::plan::{Plan, TrainConfig};

use super::python::hf_optim;

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Vramlab,
    DeepSpeed,
    HuggingFace,
    Lightning,
    PyTorch,
    Env,
    /// accelerate config YAML (FSDP / DeepSpeed / MULTI_GPU).
    Accelerate,
    /// The `torchrun` command line.
    Torchrun,
    /// An FSDP2 `fully_shard` snippet.
    Fsdp2,
    /// peft `LoraConfig` + `BitsAndBytesConfig` + TRL `SFTConfig` (see [`super::peft`]).
    Peft,
}

impl Format {
    pub const ALL: [Format; 7] = [
        Format::Vramlab,
        Format::DeepSpeed,
        Format::HuggingFace,
        Format::Lightning,
        Format::PyTorch,
        Format::Env,
        Format::Peft,
    ];

    /// The multi-GPU formats (listed apart from [`Format::ALL`]).
    pub const DISTRIBUTED: [Format; 3] = [Format::Accelerate, Format::Torchrun, Format::Fsdp2];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Accelerate => "accelerate",
            Format::Torchrun => "torchrun",
            Format::Fsdp2 => "fsdp2",
            Format::Vramlab => "vramlab",
            Format::DeepSpeed => "deepspeed",
            Format::HuggingFace => "hf",
            Format::Lightning => "lightning",
            Format::PyTorch => "pytorch",
            Format::Env => "env",
            Format::Peft => "peft",
        }
    }
}

/// An export that cannot say what the plan trains.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// A LoRA / QLoRA plan exported to a format that holds only trainer arguments: written
    /// as is, it would train every parameter of the model, which is not what was planned.
    #[error(
        "--format {format}: {holds} cannot hold the {mode} adapters this plan trains (the base \
         model frozen, only the adapters train); written as is it would train every parameter. \
         Export --format peft (LoraConfig + get_peft_model + SFTConfig, {fields}) or \
         --format pytorch (a loop with the adapters)"
    )]
    AdaptersNotCarried {
        format: &'static str,
        holds: &'static str,
        fields: &'static str,
        mode: &'static str,
    },
}

/// The `PYTORCH_CUDA_ALLOC_CONF` the plan recommends: the configured allocator options,
/// else `expandable_segments:True` when the allocator model shows more than 10 % of the
/// reserved bytes cached but unused (fragmentation risk).
pub fn alloc_conf(cfg: &TrainConfig, plan: &Plan) -> Option<String> {
    let mut parts = Vec::new();
    if cfg.allocator.expandable_segments {
        parts.push("expandable_segments:True".to_string());
    }
    if let Some(mb) = cfg.allocator.max_split_size_mb {
        parts.push(format!("max_split_size_mb:{mb}"));
    }
    let reserved = plan.peak_reserved_bytes.0 as f64;
    let waste = reserved - plan.peak_allocated_bytes.0 as f64;
    if parts.is_empty() && reserved > 0.0 && waste / reserved > 0.10 {
        parts.push("expandable_segments:True".to_string());
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// The DeepSpeed config `vramlab export --format deepspeed` writes; the bench sends the same
/// object to `ds_runner.py`, so what is measured is what users export.
pub fn deepspeed_config(cfg: &TrainConfig) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("train_micro_batch_size_per_gpu".into(), json!(cfg.batch));
    o.insert("gradient_accumulation_steps".into(), json!(cfg.accum));
    // DeepSpeed checks train_batch_size = micro × accumulation × world.
    o.insert("train_batch_size".into(), json!(cfg.global_batch()));
    o.insert("gradient_clipping".into(), json!(1.0));
    match cfg.precision {
        Precision::AmpFp16 => {
            o.insert(
                "fp16".into(),
                json!({"enabled": true, "loss_scale": 0, "initial_scale_power": 16}),
            );
        }
        Precision::AmpBf16 | Precision::Bf16 => {
            o.insert("bf16".into(), json!({"enabled": true}));
        }
        Precision::Fp32 => {}
    }
    // Optimizers DeepSpeed builds itself; others are passed to deepspeed.initialize().
    match cfg.optimizer {
        Optimizer::Adam => {
            o.insert(
                "optimizer".into(),
                json!({"type": "Adam", "params": {"lr": 1e-4, "weight_decay": 0.0}}),
            );
        }
        Optimizer::AdamW => {
            o.insert(
                "optimizer".into(),
                json!({"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}),
            );
        }
        Optimizer::Sgd
        | Optimizer::SgdMomentum
        | Optimizer::Adafactor
        | Optimizer::Adam8bit
        | Optimizer::AdamW8bit
        | Optimizer::PagedAdamW8bit
        | Optimizer::PagedAdamW => {}
    }
    if cfg.checkpointing {
        o.insert(
            "activation_checkpointing".into(),
            json!({"partition_activations": false, "contiguous_memory_optimization": false}),
        );
    }
    o.insert(
        "zero_optimization".into(),
        super::distributed_exports::zero_optimization(&cfg.distributed),
    );
    Value::Object(o)
}

fn huggingface(cfg: &TrainConfig) -> Value {
    let mut v = json!({
        "output_dir": "out",
        "per_device_train_batch_size": cfg.batch,
        "gradient_accumulation_steps": cfg.accum,
        "bf16": matches!(cfg.precision, Precision::AmpBf16 | Precision::Bf16),
        "fp16": cfg.precision == Precision::AmpFp16,
        "gradient_checkpointing": cfg.checkpointing,
        "optim": hf_optim(cfg.optimizer),
    });
    // transformers 5.17 defaults to `use_reentrant=False`: written only when it differs.
    if cfg.checkpointing && cfg.checkpoint_reentrant {
        v["gradient_checkpointing_kwargs"] = json!({"use_reentrant": true});
    }
    v
}

fn lightning(cfg: &TrainConfig) -> Value {
    let precision = match cfg.precision {
        Precision::Fp32 => "32-true",
        Precision::AmpFp16 => "16-mixed",
        Precision::AmpBf16 => "bf16-mixed",
        Precision::Bf16 => "bf16-true",
    };
    json!({
        "precision": precision,
        "accumulate_grad_batches": cfg.accum,
        "accelerator": "gpu",
        "devices": 1,
    })
}

fn pytorch(cfg: &TrainConfig, hub_id: Option<&str>) -> String {
    let adapters = cfg.finetune.mode.has_adapters();
    // With adapters only they train: the optimizer gets the trainable parameters.
    let params = if adapters {
        "trainable"
    } else {
        "model.parameters()"
    };
    let opt = match cfg.optimizer {
        Optimizer::Sgd => format!("torch.optim.SGD({params}, lr=1e-3)"),
        Optimizer::SgdMomentum => format!("torch.optim.SGD({params}, lr=1e-3, momentum=0.9)"),
        Optimizer::Adam => format!("torch.optim.Adam({params}, lr=1e-4)"),
        Optimizer::AdamW => format!("torch.optim.AdamW({params}, lr=1e-4)"),
        Optimizer::Adafactor => format!("torch.optim.Adafactor({params}, lr=1e-3)"),
        Optimizer::Adam8bit => format!("bnb.optim.Adam8bit({params}, lr=1e-4)"),
        Optimizer::AdamW8bit => format!("bnb.optim.AdamW8bit({params}, lr=1e-4)"),
        Optimizer::PagedAdamW8bit => format!("bnb.optim.PagedAdamW8bit({params}, lr=1e-4)"),
        Optimizer::PagedAdamW => format!("bnb.optim.PagedAdamW32bit({params}, lr=1e-4)"),
    };
    let bnb = matches!(
        cfg.optimizer,
        Optimizer::Adam8bit
            | Optimizer::AdamW8bit
            | Optimizer::PagedAdamW8bit
            | Optimizer::PagedAdamW
    );
    let (autocast, scaler) = match cfg.precision {
        Precision::AmpFp16 => ("torch.autocast(\"cuda\", dtype=torch.float16)", true),
        Precision::AmpBf16 => ("torch.autocast(\"cuda\", dtype=torch.bfloat16)", false),
        _ => ("contextlib.nullcontext()", false),
    };
    let mut s = String::from("import contextlib\n");
    if adapters {
        s.push_str(super::peft::SETUP_IMPORTS);
    } else {
        s.push_str("import torch\n");
    }
    if bnb {
        s.push_str("import bitsandbytes as bnb\n");
    }
    s.push('\n');
    s.push_str(&format!(
        "# vramlab plan: micro-batch {} x {} accumulation steps = effective batch {}\n",
        cfg.batch,
        cfg.accum,
        cfg.effective_batch()
    ));
    if adapters {
        s.push_str(&format!(
            "# {}: the base model frozen, only the adapters train\n",
            cfg.finetune.mode.as_str()
        ));
        s.push_str(&super::peft::model_setup(cfg, hub_id));
    }
    s.push_str(&format!(
        "batch_size = {}  # DataLoader(..., batch_size=batch_size)\n",
        cfg.batch
    ));
    s.push_str(&format!("accumulation_steps = {}\n", cfg.accum));
    if cfg.finetune.freeze_embeddings {
        s.push_str(
            "for m in model.modules():  # frozen embeddings: every lookup table (token, \
             position, type; a tied output head too)\n    if isinstance(m, torch.nn.Embedding):\n        \
             m.requires_grad_(False)\n",
        );
    }
    if cfg.finetune.freeze_blocks > 0 {
        s.push_str(&format!(
            "for block in blocks[:{}]:  # the model's layer list: model.model.layers, \
             model.transformer.h, ...\n    block.requires_grad_(False)\n",
            cfg.finetune.freeze_blocks
        ));
    }
    if cfg.precision == Precision::Bf16 && !adapters {
        s.push_str(
            "model = model.to(torch.bfloat16)  # pure bf16: weights, grads and optimizer state\n",
        );
    }
    let qlora = cfg.finetune.mode == FineTuneMode::Qlora;
    if qlora {
        // prepare_model_for_kbit_training has enabled checkpointing as planned.
    } else if cfg.checkpointing && cfg.checkpoint_reentrant {
        s.push_str("model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": True})  # HF; else torch.utils.checkpoint(block, x, use_reentrant=True) per block\n");
        if !adapters && (!cfg.finetune.is_full() || cfg.finetune.freeze_embeddings) {
            s.push_str("model.enable_input_require_grads()  # reentrant over a frozen embedding: its output must require grad\n");
        }
    } else if cfg.checkpointing {
        s.push_str("model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})  # HF; else torch.utils.checkpoint per block\n");
    }
    if cfg.attention == Attention::Sdpa && !adapters {
        s.push_str("# Hugging Face models: from_pretrained(..., attn_implementation=\"sdpa\")\n");
    }
    if adapters {
        s.push_str("trainable = [p for p in model.parameters() if p.requires_grad]\n");
    }
    s.push_str(&format!("optimizer = {opt}\n"));
    if scaler {
        s.push_str("scaler = torch.amp.GradScaler(\"cuda\")\n");
    }
    s.push_str("\noptimizer.zero_grad(set_to_none=True)\n");
    if adapters {
        s.push_str("for i, batch in enumerate(dataloader):  # batches of input_ids and labels\n");
    } else {
        s.push_str("for i, (data, target) in enumerate(dataloader):\n");
    }
    s.push_str(&format!("    with {autocast}:\n"));
    // The output is never bound to a name: it is freed before backward (the planned
    // `trainer` loop shape), not held through it as `output = model(x)` would.
    s.push_str("        # output not kept: freed before backward (vramlab --loop trainer)\n");
    if adapters {
        s.push_str("        loss = model(input_ids=batch[\"input_ids\"].to(\"cuda\"), labels=batch[\"labels\"].to(\"cuda\")).loss / accumulation_steps\n");
    } else {
        s.push_str("        loss = criterion(model(data.to(\"cuda\")), target.to(\"cuda\")) / accumulation_steps\n");
    }
    if scaler {
        s.push_str("    scaler.scale(loss).backward()\n");
    } else {
        s.push_str("    loss.backward()\n");
    }
    s.push_str("    if (i + 1) % accumulation_steps == 0:\n");
    if scaler {
        s.push_str("        scaler.step(optimizer)\n        scaler.update()\n");
    } else {
        s.push_str("        optimizer.step()\n");
    }
    s.push_str("        optimizer.zero_grad(set_to_none=True)\n");
    s
}

/// The loop shape a framework's training loop has, where it fixes one: HF `Trainer`
/// (`compute_loss` returns only the loss), a Lightning `training_step` returning the loss,
/// and the PyTorch loop this module writes release the model output before backward; a
/// Lightning `Trainer` also zeroes the gradients only after the forward
/// ([`LoopShape::Lightning`]).
pub fn implied_loop(format: Format) -> Option<LoopShape> {
    match format {
        Format::Lightning => Some(LoopShape::Lightning),
        Format::HuggingFace | Format::PyTorch => Some(LoopShape::Trainer),
        Format::Vramlab
        | Format::DeepSpeed
        | Format::Env
        | Format::Accelerate
        | Format::Torchrun
        | Format::Fsdp2 => None,
        Format::Peft => Some(LoopShape::Trainer),
    }
}

/// Refuses a trainer-arguments format for a plan whose adapters it cannot hold.
fn check_adapters(format: Format, cfg: &TrainConfig) -> Result<(), ExportError> {
    if !cfg.finetune.mode.has_adapters() {
        return Ok(());
    }
    let (holds, fields) = match format {
        Format::HuggingFace => (
            "TrainingArguments JSON",
            "the same TrainingArguments fields",
        ),
        Format::Lightning => (
            "Lightning Trainer arguments",
            "for your LightningModule's __init__",
        ),
        _ => return Ok(()),
    };
    Err(ExportError::AdaptersNotCarried {
        format: format.as_str(),
        holds,
        fields,
        mode: match cfg.finetune.mode {
            FineTuneMode::Qlora => "QLoRA",
            _ => "LoRA",
        },
    })
}

/// Renders `format` for `cfg` (`vramlab_doc` is the `.vramlab.json` text for that format;
/// `hub_id` the model's Hugging Face id where known, written into the Python scripts).
/// A LoRA / QLoRA plan's PyTorch and peft exports carry the adapters; the HF and Lightning
/// argument files, which cannot, are refused ([`ExportError`]).
pub fn render(
    format: Format,
    cfg: &TrainConfig,
    plan: &Plan,
    vramlab_doc: &str,
    hub_id: Option<&str>,
) -> Result<String, ExportError> {
    check_adapters(format, cfg)?;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    Ok(match format {
        Format::Vramlab => vramlab_doc.to_string(),
        Format::DeepSpeed => pretty(&deepspeed_config(cfg)),
        Format::HuggingFace => pretty(&huggingface(cfg)),
        Format::Lightning => pretty(&lightning(cfg)),
        Format::PyTorch => {
            let mut s = pytorch(cfg, hub_id);
            if let Some(conf) = alloc_conf(cfg, plan) {
                s.insert_str(0, &format!("# run with: PYTORCH_CUDA_ALLOC_CONF={conf}\n"));
            }
            s
        }
        Format::Accelerate => super::distributed_exports::accelerate_yaml(cfg),
        Format::Torchrun => super::distributed_exports::torchrun(cfg),
        Format::Fsdp2 => super::distributed_exports::fsdp2_snippet(cfg),
        Format::Peft => super::peft::render(cfg, hub_id),
        Format::Env => match alloc_conf(cfg, plan) {
            Some(conf) => format!("export PYTORCH_CUDA_ALLOC_CONF={conf}\n"),
            None => "# the allocator model shows little fragmentation: no PYTORCH_CUDA_ALLOC_CONF needed\n".to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset::find_builtin;
    use crate::plan::Planner;

    fn r(format: Format, cfg: &TrainConfig, plan: &Plan, doc: &str) -> String {
        render(format, cfg, plan, doc, None).expect("export")
    }

    fn plan(cfg: &TrainConfig) -> Plan {
        let p = find_builtin("gpt2").expect("gpt2");
        Planner::new(&p, cfg)
            .expect("planner")
            .plan(cfg.batch)
            .expect("plan")
    }

    #[test]
    fn exports_carry_the_plan_settings() {
        let cfg = TrainConfig {
            batch: 6,
            accum: 4,
            precision: Precision::AmpFp16,
            checkpointing: true,
            ..TrainConfig::default()
        };
        let p = plan(&cfg);
        let ds: Value = serde_json::from_str(&r(Format::DeepSpeed, &cfg, &p, "")).expect("json");
        assert_eq!(ds["train_micro_batch_size_per_gpu"], 6);
        assert_eq!(ds["gradient_accumulation_steps"], 4);
        assert_eq!(ds["train_batch_size"], 24);
        assert_eq!(ds["fp16"]["enabled"], true);
        assert_eq!(ds["optimizer"]["type"], "AdamW");
        let hf: Value = serde_json::from_str(&r(Format::HuggingFace, &cfg, &p, "")).expect("json");
        assert_eq!(hf["per_device_train_batch_size"], 6);
        assert_eq!(hf["fp16"], true);
        assert_eq!(hf["bf16"], false);
        assert_eq!(hf["gradient_checkpointing"], true);
        assert!(hf.get("gradient_checkpointing_kwargs").is_none(), "{hf}");
        let reentrant = TrainConfig {
            checkpoint_reentrant: true,
            finetune: crate::plan::finetune::FineTune {
                freeze_embeddings: true,
                ..Default::default()
            },
            ..cfg
        };
        let rp = plan(&reentrant);
        let hf: Value =
            serde_json::from_str(&r(Format::HuggingFace, &reentrant, &rp, "")).expect("json");
        assert_eq!(hf["gradient_checkpointing_kwargs"]["use_reentrant"], true);
        let py = r(Format::PyTorch, &reentrant, &rp, "");
        assert!(
            py.contains("{\"use_reentrant\": True}") && py.contains("enable_input_require_grads()"),
            "{py}"
        );
        let pl: Value = serde_json::from_str(&r(Format::Lightning, &cfg, &p, "")).expect("json");
        assert_eq!(pl["precision"], "16-mixed");
        assert_eq!(pl["accumulate_grad_batches"], 4);
        let py = r(Format::PyTorch, &cfg, &p, "");
        assert!(
            py.contains("GradScaler")
                && py.contains("accumulation_steps = 4")
                && py.contains("/ accumulation_steps")
        );
        // The loop releases the output before backward: no `output = model(...)` binding.
        assert!(py.contains("loss = criterion(model(") && !py.contains("output = model("));
        assert_eq!(implied_loop(Format::HuggingFace), Some(LoopShape::Trainer));
        assert_eq!(implied_loop(Format::DeepSpeed), None);
    }

    /// A LoRA / QLoRA plan: the PyTorch loop builds the adapters (and the 4-bit base), the
    /// trainer-argument files are refused with the formats that carry them, the id is known.
    #[test]
    fn adapters_are_carried_or_refused() {
        use crate::plan::finetune::FineTune;
        let lora = TrainConfig {
            batch: 2,
            checkpointing: true,
            checkpoint_reentrant: true,
            finetune: FineTune {
                mode: FineTuneMode::Lora,
                ..FineTune::default()
            },
            ..TrainConfig::default()
        };
        let p = plan(&lora);
        let py = render(
            Format::PyTorch,
            &lora,
            &p,
            "",
            Some("openai-community/gpt2"),
        )
        .expect("py");
        for want in [
            "MODEL = \"openai-community/gpt2\"",
            "lora_config = LoraConfig(r=8",
            "model = get_peft_model(model, lora_config)",
            "model.enable_input_require_grads()",
            "trainable = [p for p in model.parameters() if p.requires_grad]",
            "torch.optim.AdamW(trainable",
        ] {
            assert!(py.contains(want), "{want} missing in\n{py}");
        }
        assert_eq!(
            py.matches("enable_input_require_grads()").count(),
            1,
            "{py}"
        );
        for f in [Format::HuggingFace, Format::Lightning] {
            let e = render(f, &lora, &p, "", None).expect_err("refused");
            let msg = e.to_string();
            assert!(
                msg.contains("--format peft") && msg.contains("LoRA"),
                "{msg}"
            );
        }
        let qlora = TrainConfig {
            finetune: FineTune {
                mode: FineTuneMode::Qlora,
                ..FineTune::default()
            },
            ..lora
        };
        let py = r(Format::PyTorch, &qlora, &p, "");
        for want in [
            "MODEL = \"your/model-id\"",
            "bnb_4bit_quant_type=\"nf4\"",
            "bnb_4bit_use_double_quant=True",
            "prepare_model_for_kbit_training(model, use_gradient_checkpointing=True",
            "get_peft_model(model, lora_config)",
        ] {
            assert!(py.contains(want), "{want} missing in\n{py}");
        }
        assert!(!py.contains("gradient_checkpointing_enable"), "{py}");
        assert!(r(Format::DeepSpeed, &qlora, &p, "").contains("zero_optimization"));
    }

    #[test]
    fn env_line_follows_allocator_settings() {
        let mut cfg = TrainConfig::default();
        cfg.allocator.max_split_size_mb = Some(128);
        let p = plan(&cfg);
        assert!(r(Format::Env, &cfg, &p, "").contains("max_split_size_mb:128"));
    }
}
