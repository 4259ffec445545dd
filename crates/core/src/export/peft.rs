//! The fine-tuning export: a Python snippet with peft's `LoraConfig`, transformers'
//! `BitsAndBytesConfig` (QLoRA), `prepare_model_for_kbit_training`, and TRL's `SFTConfig`
//! (a `TrainingArguments` subclass) with the plan's `optim`, gradient checkpointing,
//! micro-batch and accumulation — the setup the planner models.

use crate::plan::TrainConfig;
use crate::plan::config::Precision;
use crate::plan::finetune::{FineTuneMode, LoraTargets, Quant};

use super::python::{hf_optim, py_bool};

/// `target_modules=` of a `LoraConfig`: `None` lets peft pick its default per model type
/// (what `attn` plans).
fn target_modules(t: LoraTargets) -> String {
    match t {
        LoraTargets::Attn => "None".into(),
        LoraTargets::AllLinear => "\"all-linear\"".into(),
        LoraTargets::Names(_) => {
            let names: Vec<String> = t
                .to_string()
                .split(',')
                .map(|n| format!("\"{n}\""))
                .collect();
            format!("[{}]", names.join(", "))
        }
    }
}

fn bnb_config(q: Quant, double_quant: bool) -> String {
    match q {
        Quant::Int8 => "bnb_config = BitsAndBytesConfig(load_in_8bit=True)  # LLM.int8\n".into(),
        Quant::Nf4 | Quant::Fp4 => format!(
            "bnb_config = BitsAndBytesConfig(\n    load_in_4bit=True,\n    bnb_4bit_quant_type=\"{}\",\n    bnb_4bit_use_double_quant={},\n    bnb_4bit_compute_dtype=torch.bfloat16,\n)\n",
            q.as_str(),
            py_bool(double_quant)
        ),
    }
}

/// The `MODEL = …` line: the Hugging Face id when the plan's model has one.
pub(crate) fn model_line(hub_id: Option<&str>) -> String {
    match hub_id {
        Some(id) => format!("MODEL = \"{id}\"  # the Hugging Face model this plan is for\n"),
        None => "MODEL = \"your/model-id\"  # the Hugging Face model this plan is for (vramlab does not know its id)\n".into(),
    }
}

/// The imports [`model_setup`] needs.
pub(crate) const SETUP_IMPORTS: &str = "import torch\nfrom peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training\nfrom transformers import AutoModelForCausalLM, BitsAndBytesConfig\n";

/// Loading the model the way the plan trains it: `MODEL`, the bitsandbytes base and
/// `prepare_model_for_kbit_training` (QLoRA), the input-grad hook of reentrant checkpointing
/// over a frozen base (LoRA), the `LoraConfig` and `get_peft_model` (LoRA and QLoRA).
pub(crate) fn model_setup(cfg: &TrainConfig, hub_id: Option<&str>) -> String {
    let ft = &cfg.finetune;
    let qlora = ft.mode == FineTuneMode::Qlora;
    let reentrant = cfg.checkpointing && cfg.checkpoint_reentrant;
    let mut s = model_line(hub_id);
    if qlora {
        s.push_str(&bnb_config(ft.quant, ft.double_quant));
        s.push_str("model = AutoModelForCausalLM.from_pretrained(MODEL, quantization_config=bnb_config, dtype=torch.bfloat16, attn_implementation=\"sdpa\")\n");
        if reentrant {
            s.push_str("# other params -> fp32; calls enable_input_require_grads\nmodel = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={\"use_reentrant\": True})\n");
        } else {
            s.push_str(&format!(
                "model = prepare_model_for_kbit_training(model, use_gradient_checkpointing={})  # other params -> fp32\n",
                py_bool(cfg.checkpointing)
            ));
        }
    } else {
        let dtype = match cfg.precision {
            Precision::Bf16 => "torch.bfloat16",
            _ => "torch.float32",
        };
        s.push_str(&format!(
            "model = AutoModelForCausalLM.from_pretrained(MODEL, dtype={dtype}, attn_implementation=\"sdpa\")\n"
        ));
    }
    if ft.mode == FineTuneMode::Lora && reentrant {
        s.push_str("# reentrant checkpointing over a frozen base: the embedding output must require grad\nmodel.enable_input_require_grads()\n");
    }
    s.push_str(&adapters(cfg));
    s
}

/// The `LoraConfig` and `get_peft_model` lines of a LoRA / QLoRA plan (empty for a full
/// fine-tune).
pub(crate) fn adapters(cfg: &TrainConfig) -> String {
    let ft = &cfg.finetune;
    let mut s = String::new();
    if !ft.mode.has_adapters() {
        return s;
    }
    if ft.lora_targets == LoraTargets::Attn {
        // On its own line: a comment inside the call would swallow its closing parenthesis.
        s.push_str(
            "# target_modules=None: peft's default for the model type (attention projections)\n",
        );
    }
    s.push_str(&format!(
        "lora_config = LoraConfig(r={}, lora_alpha={}, lora_dropout={:?}, target_modules={}, task_type=\"CAUSAL_LM\")\n",
        ft.lora_rank,
        2 * ft.lora_rank,
        ft.lora_dropout.p(),
        target_modules(ft.lora_targets)
    ));
    s.push_str("model = get_peft_model(model, lora_config)\nmodel.print_trainable_parameters()\n");
    s
}

/// The snippet for `cfg` (`hub_id`: the model's Hugging Face id, when known).
pub fn render(cfg: &TrainConfig, hub_id: Option<&str>) -> String {
    let qlora = cfg.finetune.mode == FineTuneMode::Qlora;
    let reentrant = cfg.checkpointing && cfg.checkpoint_reentrant;
    let mut s = String::from(SETUP_IMPORTS);
    s.push_str("from trl import SFTConfig  # or transformers.TrainingArguments, same fields\n\n");
    s.push_str(&format!(
        "# vramlab plan: micro-batch {} x {} accumulation steps = effective batch {}\n",
        cfg.batch,
        cfg.accum,
        cfg.effective_batch()
    ));
    s.push_str(&model_setup(cfg, hub_id));
    let bf16 = matches!(cfg.precision, Precision::AmpBf16 | Precision::Bf16) || qlora;
    s.push_str(&format!(
        "\nargs = SFTConfig(\n    output_dir=\"out\",\n    per_device_train_batch_size={},\n    gradient_accumulation_steps={},\n    gradient_checkpointing={},\n    gradient_checkpointing_kwargs={{\"use_reentrant\": {}}},\n    optim=\"{}\",\n    bf16={},\n    fp16={},\n)\n",
        cfg.batch,
        cfg.accum,
        py_bool(cfg.checkpointing),
        py_bool(reentrant),
        hf_optim(cfg.optimizer),
        py_bool(bf16),
        py_bool(cfg.precision == Precision::AmpFp16 && !qlora),
    ));
    if cfg.optimizer.is_paged() {
        s.push_str("# paged optimizer: its large states live in unified memory, evictable to host RAM under pressure\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_t(cfg: &TrainConfig) -> String {
        render(cfg, None)
    }
    use crate::plan::Optimizer;
    use crate::plan::finetune::{FineTune, LoraDropout, LoraTargets};

    #[test]
    fn qlora_snippet_names_bnb_peft_and_trl_settings() {
        let cfg = TrainConfig {
            batch: 2,
            accum: 8,
            checkpointing: true,
            optimizer: Optimizer::PagedAdamW8bit,
            finetune: FineTune {
                mode: FineTuneMode::Qlora,
                lora_rank: 16,
                lora_targets: LoraTargets::AllLinear,
                ..FineTune::default()
            },
            ..TrainConfig::default()
        };
        let s = render_t(&cfg);
        for want in [
            "bnb_4bit_quant_type=\"nf4\"",
            "bnb_4bit_use_double_quant=True",
            "prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)",
            "LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=\"all-linear\"",
            "per_device_train_batch_size=2",
            "gradient_accumulation_steps=8",
            "gradient_checkpointing=True",
            "optim=\"paged_adamw_8bit\"",
            "bf16=True",
        ] {
            assert!(s.contains(want), "{want} missing in\n{s}");
        }
        let int8 = TrainConfig {
            finetune: FineTune {
                quant: Quant::Int8,
                ..cfg.finetune
            },
            optimizer: Optimizer::AdamW8bit,
            ..cfg
        };
        let s = render_t(&int8);
        assert!(s.contains("load_in_8bit=True") && s.contains("optim=\"adamw_bnb_8bit\""));
        let lora = TrainConfig {
            finetune: FineTune {
                mode: FineTuneMode::Lora,
                lora_targets: LoraTargets::from_saved("q_proj,v_proj").expect("names"),
                ..FineTune::default()
            },
            ..TrainConfig::default()
        };
        let s = render_t(&lora);
        assert!(!s.contains("BitsAndBytesConfig("), "{s}");
        assert!(s.contains("target_modules=[\"q_proj\", \"v_proj\"]"), "{s}");
        let dropout = TrainConfig {
            finetune: FineTune {
                lora_dropout: LoraDropout::new(0.05).expect("p"),
                ..lora.finetune
            },
            ..lora
        };
        let s = render_t(&dropout);
        assert!(
            s.contains("lora_alpha=16, lora_dropout=0.05, target"),
            "{s}"
        );
    }

    /// Reentrant checkpointing: `use_reentrant: True` in the SFTConfig, LoRA calls
    /// `enable_input_require_grads` before `get_peft_model`, QLoRA passes the kwargs to
    /// `prepare_model_for_kbit_training` (which calls it).
    #[test]
    fn reentrant_snippets_enable_input_grads() {
        let lora = TrainConfig {
            checkpointing: true,
            checkpoint_reentrant: true,
            finetune: FineTune {
                mode: FineTuneMode::Lora,
                ..FineTune::default()
            },
            ..TrainConfig::default()
        };
        let s = render_t(&lora);
        let hook = s.find("model.enable_input_require_grads()").expect(&s);
        let peft = s.find("get_peft_model(model").expect(&s);
        assert!(hook < peft, "{s}");
        assert!(
            s.contains("gradient_checkpointing_kwargs={\"use_reentrant\": True}"),
            "{s}"
        );
        let plain = render_t(&TrainConfig {
            checkpoint_reentrant: false,
            ..lora
        });
        assert!(!plain.contains("enable_input_require_grads"), "{plain}");
        assert!(plain.contains("{\"use_reentrant\": False}"), "{plain}");
        let q = render_t(&TrainConfig {
            finetune: FineTune {
                mode: FineTuneMode::Qlora,
                ..FineTune::default()
            },
            ..lora
        });
        assert!(
            q.contains("prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={\"use_reentrant\": True})"),
            "{q}"
        );
    }
}
