//! Framework configs generated from a plan: DeepSpeed JSON, Hugging Face
//! `TrainingArguments`, PyTorch Lightning `Trainer` arguments, a plain PyTorch training
//! loop, and the allocator environment line.

use serde_json::{Value, json};

use crate::plan::config::{Attention, LoopShape, Optimizer, Precision};
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

    pub fn parse(s: &str) -> Option<Format> {
        Format::ALL
            .into_iter()
            .chain(Format::DISTRIBUTED)
            .find(|f| f.as_str().eq_ignore_ascii_case(s))
    }
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

fn deepspeed(cfg: &TrainConfig) -> Value {
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

fn pytorch(cfg: &TrainConfig) -> String {
    let opt = match cfg.optimizer {
        Optimizer::Sgd => "torch.optim.SGD(model.parameters(), lr=1e-3)",
        Optimizer::SgdMomentum => "torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)",
        Optimizer::Adam => "torch.optim.Adam(model.parameters(), lr=1e-4)",
        Optimizer::AdamW => "torch.optim.AdamW(model.parameters(), lr=1e-4)",
        Optimizer::Adafactor => "torch.optim.Adafactor(model.parameters(), lr=1e-3)",
        Optimizer::Adam8bit => {
            "bnb.optim.Adam8bit(model.parameters(), lr=1e-4)  # import bitsandbytes as bnb"
        }
        Optimizer::AdamW8bit => {
            "bnb.optim.AdamW8bit(model.parameters(), lr=1e-4)  # import bitsandbytes as bnb"
        }
        Optimizer::PagedAdamW8bit => {
            "bnb.optim.PagedAdamW8bit(model.parameters(), lr=1e-4)  # import bitsandbytes as bnb"
        }
        Optimizer::PagedAdamW => {
            "bnb.optim.PagedAdamW32bit(model.parameters(), lr=1e-4)  # import bitsandbytes as bnb"
        }
    };
    let (autocast, scaler) = match cfg.precision {
        Precision::AmpFp16 => ("torch.autocast(\"cuda\", dtype=torch.float16)", true),
        Precision::AmpBf16 => ("torch.autocast(\"cuda\", dtype=torch.bfloat16)", false),
        _ => ("contextlib.nullcontext()", false),
    };
    let mut s = String::from("import contextlib\nimport torch\n\n");
    s.push_str(&format!(
        "# vramlab plan: micro-batch {} x {} accumulation steps = effective batch {}\n",
        cfg.batch,
        cfg.accum,
        cfg.effective_batch()
    ));
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
    if cfg.precision == Precision::Bf16 {
        s.push_str(
            "model = model.to(torch.bfloat16)  # pure bf16: weights, grads and optimizer state\n",
        );
    }
    if cfg.checkpointing && cfg.checkpoint_reentrant {
        s.push_str("model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": True})  # HF; else torch.utils.checkpoint(block, x, use_reentrant=True) per block\n");
        if !cfg.finetune.is_full() || cfg.finetune.freeze_embeddings {
            s.push_str("model.enable_input_require_grads()  # reentrant over a frozen embedding: its output must require grad\n");
        }
    } else if cfg.checkpointing {
        s.push_str("model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})  # HF; else torch.utils.checkpoint per block\n");
    }
    if cfg.attention == Attention::Sdpa {
        s.push_str("# Hugging Face models: from_pretrained(..., attn_implementation=\"sdpa\")\n");
    }
    s.push_str(&format!("optimizer = {opt}\n"));
    if scaler {
        s.push_str("scaler = torch.amp.GradScaler(\"cuda\")\n");
    }
    s.push_str("\noptimizer.zero_grad(set_to_none=True)\nfor i, (data, target) in enumerate(dataloader):\n");
    s.push_str(&format!("    with {autocast}:\n"));
    // The output is never bound to a name: it is freed before backward (the planned
    // `trainer` loop shape), not held through it as `output = model(x)` would.
    s.push_str("        # output not kept: freed before backward (vramlab --loop trainer)\n");
    s.push_str("        loss = criterion(model(data.to(\"cuda\")), target.to(\"cuda\")) / accumulation_steps\n");
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
/// and the PyTorch loop this module writes release the model output before backward.
pub fn implied_loop(format: Format) -> Option<LoopShape> {
    match format {
        Format::HuggingFace | Format::Lightning | Format::PyTorch => Some(LoopShape::Trainer),
        Format::Vramlab
        | Format::DeepSpeed
        | Format::Env
        | Format::Accelerate
        | Format::Torchrun
        | Format::Fsdp2 => None,
        Format::Peft => Some(LoopShape::Trainer),
    }
}

/// Renders `format` for `cfg` (`vramlab_doc` is the `.vramlab.json` text for that format).
pub fn render(format: Format, cfg: &TrainConfig, plan: &Plan, vramlab_doc: &str) -> String {
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    match format {
        Format::Vramlab => vramlab_doc.to_string(),
        Format::DeepSpeed => pretty(&deepspeed(cfg)),
        Format::HuggingFace => pretty(&huggingface(cfg)),
        Format::Lightning => pretty(&lightning(cfg)),
        Format::PyTorch => {
            let mut s = pytorch(cfg);
            if let Some(conf) = alloc_conf(cfg, plan) {
                s.insert_str(0, &format!("# run with: PYTORCH_CUDA_ALLOC_CONF={conf}\n"));
            }
            s
        }
        Format::Accelerate => super::distributed_exports::accelerate_yaml(cfg),
        Format::Torchrun => super::distributed_exports::torchrun(cfg),
        Format::Fsdp2 => super::distributed_exports::fsdp2_snippet(cfg),
        Format::Peft => super::peft::render(cfg),
        Format::Env => match alloc_conf(cfg, plan) {
            Some(conf) => format!("export PYTORCH_CUDA_ALLOC_CONF={conf}\n"),
            None => "# the allocator model shows little fragmentation: no PYTORCH_CUDA_ALLOC_CONF needed\n".to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset::find_builtin;
    use crate::plan::Planner;

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
        let ds: Value =
            serde_json::from_str(&render(Format::DeepSpeed, &cfg, &p, "")).expect("json");
        assert_eq!(ds["train_micro_batch_size_per_gpu"], 6);
        assert_eq!(ds["gradient_accumulation_steps"], 4);
        assert_eq!(ds["train_batch_size"], 24);
        assert_eq!(ds["fp16"]["enabled"], true);
        assert_eq!(ds["optimizer"]["type"], "AdamW");
        let hf: Value =
            serde_json::from_str(&render(Format::HuggingFace, &cfg, &p, "")).expect("json");
        assert_eq!(hf["per_device_train_batch_size"], 6);
        assert_eq!(hf["fp16"], true);
        assert_eq!(hf["bf16"], false);
        assert_eq!(hf["gradient_checkpointing"], true);
        assert!(hf.get("gradient_checkpointing_kwargs").is_none(), "{hf}");
        let reentrant = TrainConfig {
            checkpoint_reentrant: true,
            finetune: crate::plan::finetune::FineTune {
                mode: crate::plan::finetune::FineTuneMode::Lora,
                ..Default::default()
            },
            ..cfg
        };
        let rp = plan(&reentrant);
        let hf: Value =
            serde_json::from_str(&render(Format::HuggingFace, &reentrant, &rp, "")).expect("json");
        assert_eq!(hf["gradient_checkpointing_kwargs"]["use_reentrant"], true);
        let py = render(Format::PyTorch, &reentrant, &rp, "");
        assert!(
            py.contains("{\"use_reentrant\": True}") && py.contains("enable_input_require_grads()"),
            "{py}"
        );
        let pl: Value =
            serde_json::from_str(&render(Format::Lightning, &cfg, &p, "")).expect("json");
        assert_eq!(pl["precision"], "16-mixed");
        assert_eq!(pl["accumulate_grad_batches"], 4);
        let py = render(Format::PyTorch, &cfg, &p, "");
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

    #[test]
    fn env_line_follows_allocator_settings() {
        let mut cfg = TrainConfig::default();
        cfg.allocator.max_split_size_mb = Some(128);
        let p = plan(&cfg);
        assert!(render(Format::Env, &cfg, &p, "").contains("max_split_size_mb:128"));
        assert!(Format::parse("HF") == Some(Format::HuggingFace));
        assert!(Format::parse("xml").is_none());
    }
}
