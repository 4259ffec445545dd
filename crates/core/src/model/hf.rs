//! Hugging Face `config.json` import: a model repository's config becomes a preset of the
//! family builder that mirrors its transformers 5 implementation.
//!
//! Missing keys take the transformers config class's default (as
//! `AutoConfig.for_model(model_type, **config)` does); a key of the wrong type is an error
//! naming it. The architecture-defining sizes have no sensible default and are required.

use serde_json::{Map, Value};

use super::checks::{ModelError, check_positive};
use super::families::{
    bert::BertParams,
    deberta::{ConvOptions, DebertaOptions},
    gpt_neox::GptNeoxParams,
    gpt2::Gpt2Params,
    llama::{FalconLayout, LlamaParams, Multipliers, NormKind},
    mla::MlaParams,
    modernbert::ModernBertOptions,
    moe::{ExpertsKind, MoeParams, RouterKind},
    t5::T5Params,
};
use super::preset::{InputSpec, ModelSpec, Preset};

/// `model_type`s this import understands.
pub const SUPPORTED: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt2",
    "gpt_neox",
    "bert",
    "roberta",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "t5",
    "olmo2",
    "granite",
    "starcoder2",
    "smollm3",
    "falcon",
    "bart",
    "modernbert",
    "deberta-v2",
    "deepseek_v3",
    "gpt_oss",
];

/// Default sequence length of an imported model (its `max_position_embeddings` when smaller).
pub const DEFAULT_SEQ: u64 = 2048;

/// Whether a JSON document is a Hugging Face model config rather than a vramlab preset.
pub fn is_hf_config(v: &Value) -> bool {
    v.get("model_type").is_some() && v.get("family").is_none()
}

fn invalid(field: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Invalid {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// Typed reads of config keys; errors name the key.
struct Keys<'a> {
    obj: &'a Map<String, Value>,
}

impl Keys<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn u64_or(&self, key: &str, default: Option<u64>) -> Result<u64, ModelError> {
        match self.get(key) {
            Some(v) => v
                .as_u64()
                .ok_or_else(|| invalid(key, format!("must be a non-negative integer, got {v}"))),
            None => default.ok_or_else(|| invalid(key, "missing (required)")),
        }
    }

    fn req(&self, key: &str) -> Result<u64, ModelError> {
        let v = self.u64_or(key, None)?;
        check_positive(key, v)?;
        Ok(v)
    }

    /// A positive integer with a default when absent.
    fn req_or(&self, key: &str, default: u64) -> Result<u64, ModelError> {
        let v = self.u64_or(key, Some(default))?;
        check_positive(key, v)?;
        Ok(v)
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>, ModelError> {
        match self.get(key) {
            Some(_) => self.u64_or(key, None).map(Some),
            None => Ok(None),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(key) {
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid(key, format!("must be true or false, got {v}"))),
            None => Ok(default),
        }
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        match self.get(key) {
            Some(v) => v
                .as_f64()
                .ok_or_else(|| invalid(key, format!("must be a number, got {v}"))),
            None => Ok(default),
        }
    }

    /// A dropout probability in [0, 1); absent gives `default`.
    fn prob(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        let v = self.f64_or(key, default)?;
        if !(0.0..1.0).contains(&v) {
            return Err(invalid(key, format!("{v} is not a probability in [0, 1)")));
        }
        Ok(v)
    }

    /// A number that may be explicitly `null` (then `None`); absent gives `default`.
    fn nullable_f64(&self, key: &str, default: Option<f64>) -> Result<Option<f64>, ModelError> {
        match self.obj.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| invalid(key, format!("must be a number or null, got {v}"))),
        }
    }

    /// A list of non-negative integers (`mlp_only_layers`); absent or null is empty.
    fn u64_list(&self, key: &str) -> Result<Vec<u64>, ModelError> {
        let Some(v) = self.get(key) else {
            return Ok(Vec::new());
        };
        let bad = || {
            invalid(
                key,
                format!("must be a list of non-negative integers, got {v}"),
            )
        };
        v.as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|x| x.as_u64().ok_or_else(bad))
            .collect()
    }

    fn str_or(&self, key: &str, default: &str) -> Result<String, ModelError> {
        match self.get(key) {
            Some(v) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| invalid(key, format!("must be a string, got {v}"))),
            None => Ok(default.to_string()),
        }
    }
}

/// Levenshtein distance, for the "closest supported model_type" hint.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The supported `model_type` nearest to `t`.
pub fn closest(t: &str) -> &'static str {
    let t = t.to_ascii_lowercase();
    SUPPORTED
        .iter()
        .min_by_key(|s| {
            // A shared prefix ("qwen2_vl" → qwen2) counts as close.
            let prefix = if t.starts_with(*s) || s.starts_with(t.as_str()) {
                0
            } else {
                1
            };
            (prefix, distance(&t, s))
        })
        .copied()
        .unwrap_or("llama")
}

/// `Some` when `text` is a Hugging Face config (a JSON object with `model_type` and no
/// `family`): the import's result; `None` for anything else (a vramlab preset, bad JSON).
pub fn from_text_if_hf(text: &str, name: &str) -> Option<Result<Preset, ModelError>> {
    let v: Value = serde_json::from_str(text).ok()?;
    is_hf_config(&v).then(|| from_config(&v, name))
}

/// The family a preset reports in tables: the imported `model_type` when there is one
/// (`qwen3`), else the builder family (`llama`).
pub fn family_label(p: &Preset) -> String {
    let imported = match &p.spec {
        ModelSpec::Llama(l) => l.model_type.clone(),
        ModelSpec::Bert(b) => b.model_type.clone(),
        ModelSpec::T5(t) if t.bart.is_some() => Some("bart".to_string()),
        ModelSpec::T5(_) => Some("t5".to_string()),
        _ => None,
    };
    imported.unwrap_or_else(|| p.spec.family().to_string())
}

/// The name of an imported config file: its folder (the model repository) when the file is
/// called `config.json`, else the file stem.
pub fn name_for_path(path: &std::path::Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    if stem == "config"
        && let Some(dir) = path
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|d| d.to_str())
    {
        return dir.to_string();
    }
    stem.to_string()
}

/// Parses a `config.json` text into a preset named `name`.
pub fn from_config_text(text: &str, name: &str) -> Result<Preset, ModelError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ModelError::Malformed(format!("config.json: not valid JSON: {e}")))?;
    from_config(&v, name)
}

/// Converts a parsed `config.json` into a preset named `name`.
pub fn from_config(v: &Value, name: &str) -> Result<Preset, ModelError> {
    let obj = v
        .as_object()
        .ok_or_else(|| ModelError::Malformed("config.json: must be a JSON object".into()))?;
    let k = Keys { obj };
    let model_type = match k.get("model_type") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(invalid(
                "model_type",
                format!("must be a string, got {other}"),
            ));
        }
        None => return Err(invalid("model_type", "missing (required)")),
    };
    let spec = match model_type.as_str() {
        "llama" | "mistral" | "qwen2" | "qwen3" | "gemma" | "gemma2" | "gemma3_text" | "phi3"
        | "mixtral" | "qwen2_moe" | "qwen3_moe" | "olmo2" | "granite" | "starcoder2"
        | "smollm3" | "deepseek_v3" | "gpt_oss" => {
            ModelSpec::Llama(Box::new(decoder_params(&k, &model_type)?))
        }
        "falcon" => ModelSpec::Llama(Box::new(falcon_params(&k)?)),
        "gpt2" => ModelSpec::Gpt2(gpt2_params(&k)?),
        "gpt_neox" => ModelSpec::GptNeox(gpt_neox_params(&k)?),
        "bert" | "roberta" => ModelSpec::Bert(bert_params(&k, &model_type)?),
        "modernbert" => ModelSpec::Bert(modernbert_params(&k)?),
        "deberta-v2" => ModelSpec::Bert(deberta_params(&k)?),
        "t5" => ModelSpec::T5(t5_params(&k)?),
        "bart" => ModelSpec::T5(bart_params(&k)?),
        "gemma3" => {
            return Err(invalid(
                "model_type",
                "gemma3 is the multimodal model: use its text model's config (model_type \
                 gemma3_text, the `text_config` section)",
            ));
        }
        other => {
            return Err(invalid(
                "model_type",
                format!(
                    "`{other}` is not supported (supported: {}); the closest is {}",
                    SUPPORTED.join(", "),
                    closest(other)
                ),
            ));
        }
    };
    let max_pos = match &spec {
        // Falcon's rotary embedding has no position table: `max_position_embeddings` is
        // only the default length.
        ModelSpec::Llama(p) => p.max_position_embeddings,
        ModelSpec::Gpt2(p) => p.n_positions,
        ModelSpec::GptNeox(p) => p.max_position_embeddings,
        ModelSpec::Bert(p) => p.max_position_embeddings - p.position_offset,
        ModelSpec::T5(p) if let Some(o) = &p.bart => o.max_position_embeddings,
        // Relative positions: no table limits the length; `n_positions` is the usual one.
        ModelSpec::T5(_) => k.u64_or("n_positions", Some(512))?,
        _ => DEFAULT_SEQ,
    };
    let display = match k.get("_name_or_path").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => name.to_string(),
    };
    let preset = Preset {
        id: name.to_string(),
        display_name: display,
        reference: format!("transformers {model_type} (config.json)"),
        input: InputSpec::Tokens {
            seq_len: max_pos.clamp(1, DEFAULT_SEQ),
        },
        spec,
    };
    let v = serde_json::to_value(&preset)
        .map_err(|e| ModelError::Malformed(format!("config.json: {e}")))?;
    // Round trip through the preset parser: the same validation as any preset.
    Preset::from_value(&v)
}

/// transformers 5 config-class defaults of the decoder families for the keys that matter.
struct DecoderDefaults {
    tie: bool,
    kv_heads_from_heads: bool,
    max_pos: u64,
    head_dim: Option<u64>,
    act: &'static str,
}

/// The config class's defaults of `model_type` (transformers 5.17).
fn decoder_defaults(model_type: &str) -> DecoderDefaults {
    match model_type {
        "llama" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: true,
            max_pos: 2048,
            head_dim: None,
            act: "silu",
        },
        "mistral" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: false,
            max_pos: 4096 * 32,
            head_dim: None,
            act: "silu",
        },
        "qwen2" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: true,
            max_pos: 32768,
            head_dim: None,
            act: "silu",
        },
        "qwen3" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: true,
            max_pos: 32768,
            head_dim: Some(128),
            act: "silu",
        },
        "gemma" => DecoderDefaults {
            tie: true,
            kv_heads_from_heads: true,
            max_pos: 8192,
            head_dim: Some(256),
            act: "gelu_pytorch_tanh",
        },
        "gemma2" => DecoderDefaults {
            tie: true,
            kv_heads_from_heads: false,
            max_pos: 8192,
            head_dim: Some(256),
            act: "gelu_pytorch_tanh",
        },
        "gemma3_text" => DecoderDefaults {
            tie: true,
            kv_heads_from_heads: false,
            max_pos: 131072,
            head_dim: Some(256),
            act: "gelu_pytorch_tanh",
        },
        "mixtral" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: false,
            max_pos: 4096 * 32,
            head_dim: None,
            act: "silu",
        },
        "qwen2_moe" | "qwen3_moe" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: false,
            max_pos: 32768,
            head_dim: None,
            act: "silu",
        },
        "olmo2" | "granite" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: true,
            max_pos: 2048,
            head_dim: None,
            act: "silu",
        },
        "starcoder2" => DecoderDefaults {
            tie: true,
            kv_heads_from_heads: false,
            max_pos: 4096,
            head_dim: None,
            act: "gelu_pytorch_tanh",
        },
        "smollm3" => DecoderDefaults {
            tie: true,
            kv_heads_from_heads: false,
            max_pos: 32768,
            head_dim: None,
            act: "silu",
        },
        "deepseek_v3" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: true,
            max_pos: 4096,
            head_dim: None,
            act: "silu",
        },
        "gpt_oss" => DecoderDefaults {
            tie: false,
            kv_heads_from_heads: false,
            max_pos: 131072,
            head_dim: Some(64),
            act: "silu",
        },
        _ => DecoderDefaults {
            // phi3
            tie: false,
            kv_heads_from_heads: true,
            max_pos: 4096,
            head_dim: None,
            act: "silu",
        },
    }
}

fn decoder_params(k: &Keys, model_type: &str) -> Result<LlamaParams, ModelError> {
    let d = decoder_defaults(model_type);
    let heads = k.req("num_attention_heads")?;
    let kv_default = if d.kv_heads_from_heads {
        heads
    } else {
        match model_type {
            "mistral" | "mixtral" => 8,
            "qwen2_moe" => 16,
            "starcoder2" => 2,
            "gpt_oss" => 8,
            // SmolLM3: 4, an explicit null means one per query head (`__post_init__`).
            "smollm3" if k.obj.get("num_key_value_heads") == Some(&Value::Null) => heads,
            _ => 4,
        }
    };
    let kv_heads = k.u64_or("num_key_value_heads", Some(kv_default))?;
    if kv_heads > 0 && !heads.is_multiple_of(kv_heads) {
        let given = if k.get("num_key_value_heads").is_some() {
            "".to_string()
        } else {
            format!(" (the {model_type} default)")
        };
        return Err(invalid(
            "num_key_value_heads",
            format!(
                "`num_key_value_heads` {kv_heads}{given} does not divide num_attention_heads {heads}"
            ),
        ));
    }
    let gemma = model_type.starts_with("gemma");
    // Gemma configs name the activation `hidden_activation` (transformers reads that first).
    // Gemma reads `hidden_activation`; a legacy `hidden_act: "gelu"` is replaced by the tanh
    // form with a warning, so only `hidden_activation` counts.
    let act_key = if gemma {
        "hidden_activation"
    } else {
        "hidden_act"
    };
    let act = k.str_or(act_key, d.act)?;
    if !super::families::llama::ACTIVATIONS.contains(&act.as_str()) {
        return Err(invalid(
            act_key,
            format!(
                "`{act}` is not supported ({})",
                super::families::llama::ACTIVATIONS.join(", ")
            ),
        ));
    }
    let head_dim = match model_type {
        // Llama and Phi-3 derive it; Mistral's `head_dim: null` means derived as well.
        "phi3" => None,
        // `DeepseekV3Config.__post_init__`: head_dim = qk_rope_head_dim (unused by MLA).
        "deepseek_v3" => Some(k.req_or("qk_rope_head_dim", 64)?),
        _ => k.opt_u64("head_dim")?.or(d.head_dim),
    };
    // StarCoder2's `use_bias` puts biases on every projection, MLP included.
    let use_bias = model_type == "starcoder2" && k.bool_or("use_bias", true)?;
    let (attention_bias, qkv_bias) = match model_type {
        "starcoder2" => (use_bias, false),
        "qwen2" => (false, true),
        "qwen2_moe" => (false, k.bool_or("qkv_bias", true)?),
        "mistral" | "phi3" | "mixtral" => (false, false),
        "gpt_oss" => (k.bool_or("attention_bias", true)?, false),
        _ => (k.bool_or("attention_bias", false)?, false),
    };
    let gemma2 = model_type == "gemma2";
    let layers = k.req("num_hidden_layers")?;
    Ok(LlamaParams {
        vocab_size: k.req("vocab_size")?,
        hidden_size: k.req("hidden_size")?,
        intermediate_size: k.req("intermediate_size")?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        max_position_embeddings: k.u64_or("max_position_embeddings", Some(d.max_pos))?,
        tie_word_embeddings: k.bool_or("tie_word_embeddings", d.tie)?,
        attention_dropout: k.f64_or("attention_dropout", 0.0)?,
        model_type: Some(model_type.to_string()),
        head_dim,
        attention_bias,
        qkv_bias,
        mlp_bias: match model_type {
            "llama" | "granite" | "smollm3" => k.bool_or("mlp_bias", false)?,
            "starcoder2" => use_bias,
            _ => false,
        },
        qk_norm: matches!(model_type, "qwen3" | "gemma3_text" | "qwen3_moe" | "olmo2"),
        hidden_act: Some(act),
        gemma,
        sandwich_norm: matches!(model_type, "gemma2" | "gemma3_text"),
        // Only the Gemmas read the soft-capping keys.
        attn_logit_softcapping: match gemma {
            true => k.nullable_f64("attn_logit_softcapping", gemma2.then_some(50.0))?,
            false => None,
        },
        final_logit_softcapping: match gemma {
            true => k.nullable_f64("final_logit_softcapping", gemma2.then_some(30.0))?,
            false => None,
        },
        fused_projections: model_type == "phi3",
        moe: moe_params(k, model_type)?,
        sliding_window: sliding_window(k, model_type)?,
        full_attention_every: match model_type {
            "gemma2" => Some(2),
            "gemma3_text" => Some(k.req_or("sliding_window_pattern", 6)?),
            _ => None,
        },
        norm: match model_type {
            "starcoder2" => Some(NormKind::LayerNorm),
            "olmo2" | "gpt_oss" => Some(NormKind::RmsFp32Product),
            _ => None,
        },
        post_norm: model_type == "olmo2",
        qk_norm_full_width: model_type == "olmo2",
        plain_mlp: model_type == "starcoder2",
        embedding_dropout: match model_type {
            "starcoder2" => k.f64_or("embedding_dropout", 0.0)?,
            _ => 0.0,
        },
        residual_dropout: match model_type {
            "starcoder2" => k.f64_or("residual_dropout", 0.0)?,
            _ => 0.0,
        },
        nope_layers: match model_type {
            "smollm3" => smollm3_nope_layers(k, layers)?,
            _ => Vec::new(),
        },
        sliding_layers: sliding_layers(k, model_type, layers)?,
        falcon: None,
        mla: match model_type {
            "deepseek_v3" => Some(mla_params(k)?),
            _ => None,
        },
        attention_sinks: model_type == "gpt_oss",
        // Checkpoints stored quantized other than by bitsandbytes (DeepSeek-V3's fp8,
        // gpt-oss's MXFP4) are planned dequantized, and the plan says so; a bitsandbytes
        // checkpoint is planned as stored (QLoRA on its nf4 / int8 base: the CLI's `--model` reading in
        // `src/cli/args.rs`, the GUI's `model_source.rs`).
        quantization: k
            .get("quantization_config")
            .map(|q| match q.get("quant_method").and_then(Value::as_str) {
                Some(m) => m.to_string(),
                None => "quantization_config".to_string(),
            })
            .filter(|m| m != "bitsandbytes"),
        multipliers: match model_type {
            "granite" => Some(Multipliers {
                embedding_multiplier: k.f64_or("embedding_multiplier", 1.0)?,
                residual_multiplier: k.f64_or("residual_multiplier", 1.0)?,
                attention_multiplier: k.f64_or("attention_multiplier", 1.0)?,
                logits_scaling: k.f64_or("logits_scaling", 1.0)?,
            }),
            _ => None,
        },
    })
}

/// `FalconConfig` (transformers 5.17) as the decoder's Falcon layout: `n_embed` is read as
/// `hidden_size`; `num_kv_heads` counts with `new_decoder_architecture`, one key/value head
/// with `multi_query` (the default) otherwise, else one per query head; `ffn_hidden_size`
/// defaults to 4 × hidden; `bias` is on every projection. ALiBi (`alibi: true`, Falcon-RW)
/// is refused: its bias tensor and the fp32 score path it takes are not modelled.
fn falcon_params(k: &Keys) -> Result<LlamaParams, ModelError> {
    if k.bool_or("alibi", false)? {
        return Err(invalid(
            "alibi",
            "ALiBi Falcon models (falcon-rw) are not modelled yet: their (batch, heads, 1, seq) \
             bias, the float mask built from it and the fp32 score path change memory; the \
             rotary models (alibi: false) are",
        ));
    }
    let hidden = match k.get("n_embed") {
        Some(_) => k.req("n_embed")?,
        None => k.req_or("hidden_size", 4544)?,
    };
    let heads = k.req_or("num_attention_heads", 71)?;
    let layers = k.req_or("num_hidden_layers", 32)?;
    let new_arch = k.bool_or("new_decoder_architecture", false)?;
    let multi_query = k.bool_or("multi_query", true)?;
    let kv_heads = if new_arch {
        let kv = k.req_or("num_kv_heads", heads)?;
        if !heads.is_multiple_of(kv) {
            return Err(invalid(
                "num_kv_heads",
                format!("num_attention_heads {heads} is not a multiple of num_kv_heads {kv}"),
            ));
        }
        kv
    } else if multi_query {
        1
    } else {
        heads
    };
    if !hidden.is_multiple_of(heads) {
        return Err(invalid(
            "num_attention_heads",
            format!("hidden_size {hidden} is not divisible by num_attention_heads {heads}"),
        ));
    }
    let parallel_attn = k.bool_or("parallel_attn", true)?;
    let num_ln = match k.opt_u64("num_ln_in_parallel_attn")? {
        Some(n) => n,
        None if new_arch => 2,
        None => 1,
    };
    let bias = k.bool_or("bias", false)?;
    let act = k.str_or("activation", "gelu")?;
    if !super::families::llama::ACTIVATIONS.contains(&act.as_str()) {
        return Err(invalid(
            "activation",
            format!(
                "`{act}` is not supported ({})",
                super::families::llama::ACTIVATIONS.join(", ")
            ),
        ));
    }
    Ok(LlamaParams {
        vocab_size: k.req_or("vocab_size", 65024)?,
        hidden_size: hidden,
        intermediate_size: k.req_or("ffn_hidden_size", hidden.saturating_mul(4))?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        max_position_embeddings: k.u64_or("max_position_embeddings", Some(2048))?,
        tie_word_embeddings: k.bool_or("tie_word_embeddings", true)?,
        attention_dropout: k.f64_or("attention_dropout", 0.0)?,
        model_type: Some("falcon".to_string()),
        head_dim: None,
        attention_bias: bias,
        qkv_bias: false,
        mlp_bias: bias,
        qk_norm: false,
        hidden_act: Some(act),
        gemma: false,
        sandwich_norm: false,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        fused_projections: false,
        moe: None,
        sliding_window: None,
        full_attention_every: None,
        norm: Some(NormKind::LayerNorm),
        post_norm: false,
        qk_norm_full_width: false,
        plain_mlp: true,
        embedding_dropout: 0.0,
        residual_dropout: 0.0,
        nope_layers: Vec::new(),
        sliding_layers: None,
        multipliers: None,
        falcon: Some(FalconLayout {
            new_decoder_architecture: new_arch,
            parallel_attn,
            num_ln_in_parallel_attn: num_ln,
            hidden_dropout: k.f64_or("hidden_dropout", 0.0)?,
        }),
        mla: None,
        attention_sinks: false,
        quantization: None,
    })
}

/// SmolLM3's `no_rope_layers` (1: the layer applies RoPE, 0: it does not), default
/// `int((i + 1) % no_rope_layer_interval != 0)`; returned as the indices without RoPE.
fn smollm3_nope_layers(k: &Keys, layers: u64) -> Result<Vec<u64>, ModelError> {
    if k.get("no_rope_layers").is_some() {
        let flags = k.u64_list("no_rope_layers")?;
        if flags.len() as u64 != layers || flags.iter().any(|&f| f > 1) {
            return Err(invalid(
                "no_rope_layers",
                format!(
                    "must hold one 0 or 1 per layer ({layers} layers, num_hidden_layers), got {} \
                     entries",
                    flags.len()
                ),
            ));
        }
        return Ok((0..layers).filter(|&i| flags[i as usize] == 0).collect());
    }
    let every = k.req_or("no_rope_layer_interval", 4)?;
    Ok((0..layers)
        .filter(|i| (i + 1).is_multiple_of(every))
        .collect())
}

/// SmolLM3's sliding layers: only with `use_sliding_window` and a `sliding_window`, the
/// layers `layer_types` calls `"sliding_attention"` (default: those without RoPE).
fn smollm3_sliding_layers(k: &Keys, layers: u64) -> Result<Option<Vec<u64>>, ModelError> {
    if !k.bool_or("use_sliding_window", false)? || k.get("sliding_window").is_none() {
        return Ok(None);
    }
    match layer_types(k, layers)? {
        Some(sliding) => Ok(Some(sliding)),
        None => smollm3_nope_layers(k, layers).map(Some),
    }
}

/// The layers that slide, where the config lists them: SmolLM3's `no_rope`-style list,
/// gpt-oss's `layer_types` (default: every even layer), and an explicit `layer_types` of the
/// types whose transformers 5.17 configs take one (when absent they derive it from
/// `sliding_window_pattern` / `use_sliding_window`, read elsewhere).
fn sliding_layers(k: &Keys, model_type: &str, layers: u64) -> Result<Option<Vec<u64>>, ModelError> {
    Ok(match model_type {
        "smollm3" => smollm3_sliding_layers(k, layers)?,
        "gpt_oss" => match layer_types(k, layers)? {
            Some(sliding) => Some(sliding),
            None => Some((0..layers).filter(|i| i % 2 == 0).collect()),
        },
        "gemma2" | "gemma3_text" | "mistral" | "qwen2" | "qwen3" | "qwen2_moe" => {
            layer_types(k, layers)?
        }
        _ => None,
    })
}

/// The layers `layer_types` calls `"sliding_attention"`, or `None` when the key is absent.
fn layer_types(k: &Keys, layers: u64) -> Result<Option<Vec<u64>>, ModelError> {
    let Some(v) = k.get("layer_types") else {
        return Ok(None);
    };
    let bad = || {
        invalid(
            "layer_types",
            format!(
                "must be a list of {layers} \"sliding_attention\" / \"full_attention\" (one per \
                 layer, as num_hidden_layers says), got {}",
                v.as_array()
                    .map_or_else(|| v.to_string(), |a| format!("{} entries", a.len()))
            ),
        )
    };
    let types = v.as_array().ok_or_else(bad)?;
    if types.len() as u64 != layers {
        return Err(bad());
    }
    let mut sliding = Vec::new();
    for (i, t) in types.iter().enumerate() {
        match t.as_str() {
            Some("sliding_attention") => sliding.push(i as u64),
            Some("full_attention") => {}
            _ => return Err(bad()),
        }
    }
    Ok(Some(sliding))
}

/// The sliding window of the config classes (transformers 5.17): Mistral's defaults to 4096
/// (an explicit `null` turns it off, as in v0.2+), Gemma 2/3's to 4096, Phi-3's and
/// Mixtral's to none; Qwen's (only with `use_sliding_window`, on the layers from
/// `max_window_layers` on) is not modelled: those layers are planned as full attention.
fn sliding_window(k: &Keys, model_type: &str) -> Result<Option<u64>, ModelError> {
    let default = match model_type {
        "mistral" | "gemma2" | "gemma3_text" => Some(4096.0),
        // StarCoder2: every layer slides when it is set; SmolLM3: the layers of
        // `sliding_layers`, only with `use_sliding_window`.
        "phi3" | "mixtral" | "starcoder2" => None,
        "gpt_oss" => Some(128.0),
        "smollm3" if k.bool_or("use_sliding_window", false)? => None,
        _ => return Ok(None),
    };
    match k.nullable_f64("sliding_window", default)? {
        None => Ok(None),
        Some(w) if w >= 1.0 && w.fract() == 0.0 => Ok(Some(w as u64)),
        Some(w) => Err(invalid(
            "sliding_window",
            format!("must be a positive integer or null, got {w}"),
        )),
    }
}

/// The MoE keys of `mixtral`, `qwen2_moe`, `qwen3_moe`, `deepseek_v3` and `gpt_oss` (transformers 5.17 config
/// classes); `None` for the dense decoders. Sizes are required, flags take the defaults.
fn moe_params(k: &Keys, model_type: &str) -> Result<Option<MoeParams>, ModelError> {
    let m = match model_type {
        // MixtralSparseMoeBlock: every layer sparse, experts of `intermediate_size`, the
        // top-k always renormalised, fp32 scores (`softmax(logits.float())`).
        "mixtral" => MoeParams {
            num_experts: k.req("num_local_experts")?,
            num_experts_per_tok: k.req("num_experts_per_tok")?,
            moe_intermediate_size: k.req("intermediate_size")?,
            norm_topk_prob: true,
            fp32_scores: true,
            shared_expert_intermediate_size: None,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            output_router_logits: k.bool_or("output_router_logits", false)?,
            router: RouterKind::Softmax,
            experts: ExpertsKind::GroupedMm,
            shared_expert_ungated: false,
        },
        "qwen2_moe" | "qwen3_moe" => MoeParams {
            num_experts: k.req("num_experts")?,
            num_experts_per_tok: k.req("num_experts_per_tok")?,
            moe_intermediate_size: k.req("moe_intermediate_size")?,
            norm_topk_prob: k.bool_or("norm_topk_prob", false)?,
            fp32_scores: false,
            shared_expert_intermediate_size: match model_type {
                "qwen2_moe" => Some(k.req("shared_expert_intermediate_size")?),
                _ => None,
            },
            decoder_sparse_step: k.req_or("decoder_sparse_step", 1)?,
            mlp_only_layers: k.u64_list("mlp_only_layers")?,
            output_router_logits: k.bool_or("output_router_logits", false)?,
            router: RouterKind::Softmax,
            experts: ExpertsKind::GroupedMm,
            shared_expert_ungated: false,
        },
        "deepseek_v3" => deepseek_moe(k)?,
        // GptOssMLP: every layer sparse, experts of `intermediate_size` with biases, the
        // router's bias, top-k then softmax; the load-balancing loss with
        // `output_router_logits`.
        "gpt_oss" => MoeParams {
            num_experts: k.req("num_local_experts")?,
            num_experts_per_tok: k.req("num_experts_per_tok")?,
            moe_intermediate_size: k.req("intermediate_size")?,
            norm_topk_prob: false,
            fp32_scores: false,
            shared_expert_intermediate_size: None,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            output_router_logits: k.bool_or("output_router_logits", false)?,
            router: RouterKind::TopKSoftmax,
            experts: ExpertsKind::ClampedSwigluLoop,
            shared_expert_ungated: false,
        },
        _ => return Ok(None),
    };
    if m.num_experts_per_tok > m.num_experts {
        let key = match model_type {
            "mixtral" | "gpt_oss" => "num_local_experts",
            "deepseek_v3" => "n_routed_experts",
            _ => "num_experts",
        };
        return Err(invalid(
            "num_experts_per_tok",
            format!(
                "{} is more than {key} {}",
                m.num_experts_per_tok, m.num_experts
            ),
        ));
    }
    Ok(Some(m))
}

/// `DeepseekV3MoE` (transformers 5.17): `n_routed_experts` experts of
/// `moe_intermediate_size` (grouped_mm), the sigmoid group-limited router, ungated shared
/// experts `moe_intermediate_size × n_shared_experts` wide; the first
/// `first_k_dense_replace` layers keep the dense MLP (`intermediate_size`). DeepSeek-V3 has
/// no load-balancing loss in transformers (`output_router_logits` is not read).
fn deepseek_moe(k: &Keys) -> Result<MoeParams, ModelError> {
    let inter = k.req("moe_intermediate_size")?;
    let dense = k.u64_or("first_k_dense_replace", Some(3))?;
    let layers = k.req("num_hidden_layers")?;
    Ok(MoeParams {
        num_experts: k.req("n_routed_experts")?,
        num_experts_per_tok: k.req("num_experts_per_tok")?,
        moe_intermediate_size: inter,
        norm_topk_prob: k.bool_or("norm_topk_prob", true)?,
        fp32_scores: false,
        shared_expert_intermediate_size: Some({
            let shared = inter.saturating_mul(k.req_or("n_shared_experts", 1)?);
            check_positive("n_shared_experts × moe_intermediate_size", shared)?;
            shared
        }),
        decoder_sparse_step: 1,
        mlp_only_layers: (0..dense.min(layers)).collect(),
        output_router_logits: false,
        router: RouterKind::SigmoidGrouped {
            n_group: k.req_or("n_group", 8)?,
            topk_group: k.req_or("topk_group", 4)?,
        },
        experts: ExpertsKind::GroupedMm,
        shared_expert_ungated: true,
    })
}

/// `DeepseekV3Config`'s attention keys (defaults of transformers 5.17); an explicit
/// `q_lora_rank: null` means one full `q_proj`.
fn mla_params(k: &Keys) -> Result<MlaParams, ModelError> {
    let q_lora_rank = match k.obj.get("q_lora_rank") {
        None => Some(1536),
        Some(Value::Null) => None,
        Some(_) => Some(k.req("q_lora_rank")?),
    };
    Ok(MlaParams {
        q_lora_rank,
        kv_lora_rank: k.req_or("kv_lora_rank", 512)?,
        qk_nope_head_dim: k.req_or("qk_nope_head_dim", 128)?,
        qk_rope_head_dim: k.req_or("qk_rope_head_dim", 64)?,
        v_head_dim: k.req_or("v_head_dim", 128)?,
    })
}

fn gpt2_params(k: &Keys) -> Result<Gpt2Params, ModelError> {
    Ok(Gpt2Params {
        vocab_size: k.req("vocab_size")?,
        n_positions: k.u64_or("n_positions", Some(1024))?,
        n_embd: k.req("n_embd")?,
        n_layer: k.req("n_layer")?,
        n_head: k.req("n_head")?,
        n_inner: k.opt_u64("n_inner")?,
        activation_function: k.str_or("activation_function", "gelu_new")?,
        resid_pdrop: k.f64_or("resid_pdrop", 0.1)?,
        embd_pdrop: k.f64_or("embd_pdrop", 0.1)?,
        attn_pdrop: k.f64_or("attn_pdrop", 0.1)?,
        tie_word_embeddings: k.bool_or("tie_word_embeddings", true)?,
    })
}

fn gpt_neox_params(k: &Keys) -> Result<GptNeoxParams, ModelError> {
    Ok(GptNeoxParams {
        vocab_size: k.req("vocab_size")?,
        hidden_size: k.req("hidden_size")?,
        num_hidden_layers: k.req("num_hidden_layers")?,
        num_attention_heads: k.req("num_attention_heads")?,
        intermediate_size: k.req("intermediate_size")?,
        max_position_embeddings: k.u64_or("max_position_embeddings", Some(2048))?,
        use_parallel_residual: k.bool_or("use_parallel_residual", true)?,
        attention_bias: k.bool_or("attention_bias", true)?,
        tie_word_embeddings: k.bool_or("tie_word_embeddings", false)?,
        hidden_dropout: k.f64_or("hidden_dropout", 0.0)?,
        attention_dropout: k.f64_or("attention_dropout", 0.0)?,
        hidden_act: k.str_or("hidden_act", "gelu")?,
    })
}

/// `T5Config` (transformers 5.17): `feed_forward_proj` decides the activation and the
/// gating (`dense_act_fn` / `is_gated_act` in a config.json are overwritten by it);
/// `tie_word_embeddings: false` only turns off the decoder-output scaling (the head stays
/// tied: `T5Config.__post_init__` sets `tie_word_embeddings = True`).
fn t5_params(k: &Keys) -> Result<T5Params, ModelError> {
    let proj = k.str_or("feed_forward_proj", "relu")?;
    let parts: Vec<&str> = proj.split('-').collect();
    let (gated, act) = match parts.as_slice() {
        [act] => (false, *act),
        ["gated", act] => (true, *act),
        _ => {
            return Err(invalid(
                "feed_forward_proj",
                format!("`{proj}` is not `gated-{{ACT}}` or `{{ACT}}` (e.g. relu, gated-gelu)"),
            ));
        }
    };
    let act = if proj == "gated-gelu" {
        "gelu_new"
    } else {
        act
    };
    let act = if act == "swish" { "silu" } else { act };
    if !super::families::t5::ACTIVATIONS.contains(&act) {
        return Err(invalid(
            "feed_forward_proj",
            format!(
                "activation `{act}` is not supported ({})",
                super::families::t5::ACTIVATIONS.join(", ")
            ),
        ));
    }
    let num_layers = k.req("num_layers")?;
    Ok(T5Params {
        vocab_size: k.req("vocab_size")?,
        d_model: k.req("d_model")?,
        d_kv: k.req("d_kv")?,
        d_ff: k.req("d_ff")?,
        num_layers,
        num_decoder_layers: k.u64_or("num_decoder_layers", Some(num_layers))?,
        num_heads: k.req("num_heads")?,
        relative_attention_num_buckets: k.u64_or("relative_attention_num_buckets", Some(32))?,
        dropout_rate: k.f64_or("dropout_rate", 0.1)?,
        is_gated_act: gated,
        dense_act_fn: act.to_string(),
        scale_decoder_outputs: k.bool_or("tie_word_embeddings", true)?,
        bart: None,
    })
}

/// `BartConfig` (transformers 5.17) as the encoder-decoder builder's BART options. The
/// encoder and decoder must agree in width (`*_ffn_dim`, `*_attention_heads`): the builder
/// has one of each; `*_layerdrop` (layers skipped at random in training) and an untied
/// `lm_head` are refused, naming the key. Legacy keys that `BartConfig` keeps but
/// `modeling_bart.py` never reads (`normalize_before`, `add_final_layer_norm`,
/// `static_position_embeddings`, …) are ignored, as transformers does.
fn bart_params(k: &Keys) -> Result<T5Params, ModelError> {
    let d = k.req("d_model")?;
    let heads = k.req("encoder_attention_heads")?;
    let ffn = k.req("encoder_ffn_dim")?;
    for (key, enc_key, enc) in [
        ("decoder_attention_heads", "encoder_attention_heads", heads),
        ("decoder_ffn_dim", "encoder_ffn_dim", ffn),
    ] {
        let dec = k.req(key)?;
        if dec != enc {
            return Err(invalid(
                key,
                format!(
                    "{dec} differs from {enc_key} {enc}: encoder and decoder of different \
                     widths are not modelled"
                ),
            ));
        }
    }
    if !d.is_multiple_of(heads) {
        return Err(invalid(
            "encoder_attention_heads",
            format!("d_model {d} is not divisible by encoder_attention_heads {heads}"),
        ));
    }
    for key in ["encoder_layerdrop", "decoder_layerdrop"] {
        let v = k.f64_or(key, 0.0)?;
        if v != 0.0 {
            return Err(invalid(
                key,
                format!(
                    "{v} is not modelled: LayerDrop skips layers at random in training, so \
                     the step's memory varies (plan it as 0)"
                ),
            ));
        }
    }
    if !k.bool_or("tie_word_embeddings", true)? {
        return Err(invalid(
            "tie_word_embeddings",
            "false is not modelled for bart (an lm_head of its own)",
        ));
    }
    let act = k.str_or("activation_function", "gelu")?;
    if !super::families::t5::ACTIVATIONS.contains(&act.as_str()) {
        return Err(invalid(
            "activation_function",
            format!(
                "`{act}` is not supported ({})",
                super::families::t5::ACTIVATIONS.join(", ")
            ),
        ));
    }
    let prob = |key: &str, default: f64| k.prob(key, default);
    let layers = |key: &str| -> Result<u64, ModelError> {
        let v = k.req(key)?;
        super::checks::check_layers(key, v)?;
        Ok(v)
    };
    Ok(T5Params {
        vocab_size: k.req_or("vocab_size", 50265)?,
        d_model: d,
        d_kv: d / heads,
        d_ff: ffn,
        num_layers: layers("encoder_layers")?,
        num_decoder_layers: layers("decoder_layers")?,
        num_heads: heads,
        relative_attention_num_buckets: 0,
        dropout_rate: prob("dropout", 0.1)?,
        is_gated_act: false,
        dense_act_fn: act,
        scale_decoder_outputs: false,
        bart: Some(super::families::t5::BartOptions {
            max_position_embeddings: k.req_or("max_position_embeddings", 1024)?,
            attention_dropout: prob("attention_dropout", 0.0)?,
            activation_dropout: prob("activation_dropout", 0.0)?,
            scale_embedding: k.bool_or("scale_embedding", false)?,
        }),
    })
}

fn bert_params(k: &Keys, model_type: &str) -> Result<BertParams, ModelError> {
    let act = k.str_or("hidden_act", "gelu")?;
    if act != "gelu" {
        return Err(invalid(
            "hidden_act",
            format!("`{act}` is not supported (gelu)"),
        ));
    }
    let roberta = model_type == "roberta";
    // RoBERTa numbers positions from padding_idx + 1 (`create_position_ids_from_input_ids`).
    let offset = if roberta {
        let pad = k.u64_or("pad_token_id", Some(1))?;
        pad.checked_add(1)
            .ok_or_else(|| invalid("pad_token_id", format!("{pad} is too large")))?
    } else {
        0
    };
    let max_pos = k.u64_or("max_position_embeddings", Some(512))?;
    if max_pos <= offset {
        return Err(invalid(
            "max_position_embeddings",
            format!(
                "{max_pos} leaves no position after the padding offset {offset} (pad_token_id + 1)"
            ),
        ));
    }
    Ok(BertParams {
        vocab_size: k.req("vocab_size")?,
        hidden_size: k.req("hidden_size")?,
        num_hidden_layers: k.req("num_hidden_layers")?,
        num_attention_heads: k.req("num_attention_heads")?,
        intermediate_size: k.req("intermediate_size")?,
        max_position_embeddings: max_pos,
        type_vocab_size: k.u64_or("type_vocab_size", Some(2))?,
        hidden_dropout_prob: k.f64_or("hidden_dropout_prob", 0.1)?,
        attention_probs_dropout_prob: k.f64_or("attention_probs_dropout_prob", 0.1)?,
        model_type: roberta.then(|| "roberta".to_string()),
        position_offset: offset,
        modernbert: None,
        deberta: None,
    })
}

/// An activation key that must be `gelu` (the encoders' MLP and head).
fn require_gelu(k: &Keys, key: &str) -> Result<(), ModelError> {
    let act = k.str_or(key, "gelu")?;
    if act == "gelu" {
        Ok(())
    } else {
        Err(invalid(key, format!("`{act}` is not supported (gelu)")))
    }
}

/// A signed integer key (DeBERTa's `-1` = "unset" values).
fn i64_or(k: &Keys, key: &str, default: i64) -> Result<i64, ModelError> {
    match k.get(key) {
        Some(v) => v
            .as_i64()
            .ok_or_else(|| invalid(key, format!("must be an integer, got {v}"))),
        None => Ok(default),
    }
}

/// `ModernBertConfig` (transformers 5.17 defaults) as BERT parameters with ModernBERT's
/// options.
fn modernbert_params(k: &Keys) -> Result<BertParams, ModelError> {
    require_gelu(k, "hidden_activation")?;
    require_gelu(k, "classifier_activation")?;
    if k.bool_or("sparse_prediction", false)? {
        return Err(invalid(
            "sparse_prediction",
            "true is not modelled: the head then runs on the masked tokens only \
             (`last_hidden_state[labels != -100]`), a data-dependent row count; plan with \
             false (every position, the upper bound)",
        ));
    }
    let layers = k.req("num_hidden_layers")?;
    let sliding_layers = match k.get("layer_types") {
        Some(Value::Array(types)) => {
            if types.len() as u64 != layers {
                return Err(invalid(
                    "layer_types",
                    format!("has {} entries for {layers} layers", types.len()),
                ));
            }
            let mut sliding = Vec::new();
            for (l, t) in (0u64..).zip(types) {
                match t.as_str() {
                    Some("sliding_attention") => sliding.push(l),
                    Some("full_attention") => {}
                    _ => {
                        return Err(invalid(
                            "layer_types",
                            format!("`{t}`: expected full_attention or sliding_attention"),
                        ));
                    }
                }
            }
            sliding
        }
        Some(other) => {
            return Err(invalid(
                "layer_types",
                format!("must be a list, got {other}"),
            ));
        }
        None => {
            let every = k.req_or("global_attn_every_n_layers", 3)?;
            (0..layers).filter(|l| l % every != 0).collect()
        }
    };
    Ok(BertParams {
        vocab_size: k.req("vocab_size")?,
        hidden_size: k.req("hidden_size")?,
        num_hidden_layers: layers,
        num_attention_heads: k.req("num_attention_heads")?,
        intermediate_size: k.req("intermediate_size")?,
        max_position_embeddings: k.req_or("max_position_embeddings", 8192)?,
        type_vocab_size: 0,
        hidden_dropout_prob: 0.0,
        attention_probs_dropout_prob: k.prob("attention_dropout", 0.0)?,
        model_type: Some("modernbert".to_string()),
        position_offset: 0,
        modernbert: Some(ModernBertOptions {
            sliding_layers,
            local_attention: k.u64_or("local_attention", Some(128))?,
            attention_bias: k.bool_or("attention_bias", false)?,
            mlp_bias: k.bool_or("mlp_bias", false)?,
            norm_bias: k.bool_or("norm_bias", false)?,
            classifier_bias: k.bool_or("classifier_bias", false)?,
            decoder_bias: k.bool_or("decoder_bias", true)?,
            tie_word_embeddings: k.bool_or("tie_word_embeddings", true)?,
            embedding_dropout: k.f64_or("embedding_dropout", 0.0)?,
            mlp_dropout: k.f64_or("mlp_dropout", 0.0)?,
        }),
        deberta: None,
    })
}

/// `DebertaV2Config` (transformers 5.17 defaults, and the `getattr` defaults of the
/// modelling code) as BERT parameters with DeBERTa's options.
fn deberta_params(k: &Keys) -> Result<BertParams, ModelError> {
    require_gelu(k, "hidden_act")?;
    let hidden = k.req("hidden_size")?;
    let heads = k.req("num_attention_heads")?;
    if let Some(e) = k.opt_u64("embedding_size")?
        && e != hidden
    {
        return Err(invalid(
            "embedding_size",
            format!(
                "{e} differs from hidden_size {hidden}: the `embed_proj` projection is not \
                 modelled"
            ),
        ));
    }
    let kernel = k.u64_or("conv_kernel_size", Some(0))?;
    let conv = if kernel > 0 {
        check_positive("conv_kernel_size", kernel)?;
        let act = k.str_or("conv_act", "tanh")?;
        if act != "tanh" && act != "gelu" {
            return Err(invalid(
                "conv_act",
                format!("`{act}` is not supported (tanh, gelu)"),
            ));
        }
        Some(ConvOptions {
            kernel,
            groups: k.req_or("conv_groups", 1)?,
            gelu: act == "gelu",
        })
    } else {
        None
    };
    if !k.bool_or("tie_word_embeddings", true)? {
        return Err(invalid(
            "tie_word_embeddings",
            "false is not modelled (the masked-LM decoder uses the word embedding)",
        ));
    }
    let max_pos = k.req_or("max_position_embeddings", 512)?;
    let types: Vec<String> = match k.get("pos_att_type") {
        None => Vec::new(),
        Some(Value::String(s)) => s
            .to_lowercase()
            .split('|')
            .map(|x| x.trim().to_string())
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| invalid("pos_att_type", format!("`{x}` is not a string")))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(invalid(
                "pos_att_type",
                format!("must be a string like \"p2c|c2p\" or a list, got {other}"),
            ));
        }
    };
    let buckets = i64_or(k, "position_buckets", -1)?;
    let max_rel = i64_or(k, "max_relative_positions", -1)?;
    let att_span = if buckets > 0 {
        check_positive("position_buckets", buckets.unsigned_abs())?;
        buckets.unsigned_abs()
    } else if max_rel >= 1 {
        check_positive("max_relative_positions", max_rel.unsigned_abs())?;
        max_rel.unsigned_abs()
    } else {
        max_pos
    };
    let norm_rel_ebd = k
        .str_or("norm_rel_ebd", "none")?
        .to_lowercase()
        .split('|')
        .any(|x| x.trim() == "layer_norm");
    Ok(BertParams {
        vocab_size: k.req("vocab_size")?,
        hidden_size: hidden,
        num_hidden_layers: k.req("num_hidden_layers")?,
        num_attention_heads: heads,
        intermediate_size: k.req("intermediate_size")?,
        max_position_embeddings: max_pos,
        type_vocab_size: k.u64_or("type_vocab_size", Some(0))?,
        hidden_dropout_prob: k.f64_or("hidden_dropout_prob", 0.1)?,
        attention_probs_dropout_prob: k.f64_or("attention_probs_dropout_prob", 0.1)?,
        model_type: Some("deberta-v2".to_string()),
        position_offset: 0,
        modernbert: None,
        deberta: Some(DebertaOptions {
            relative_attention: k.bool_or("relative_attention", false)?,
            att_span,
            c2p: types.iter().any(|t| t == "c2p"),
            p2c: types.iter().any(|t| t == "p2c"),
            share_att_key: k.bool_or("share_att_key", false)?,
            norm_rel_ebd,
            position_biased_input: k.bool_or("position_biased_input", true)?,
            head_size: match k.opt_u64("attention_head_size")? {
                Some(_) => k.req("attention_head_size")?,
                None if hidden < heads => {
                    return Err(invalid(
                        "num_attention_heads",
                        format!(
                            "{heads} heads of hidden_size {hidden} leave a head size of 0 \
                             (set attention_head_size)"
                        ),
                    ));
                }
                None => hidden / heads,
            },
            legacy: k.bool_or("legacy", true)?,
            conv,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_type_names_the_supported_and_the_closest() {
        let err = from_config_text(r#"{"model_type": "qwen2_vl"}"#, "x")
            .expect_err("unsupported")
            .to_string();
        assert!(err.contains("model_type"), "{err}");
        assert!(err.contains("llama, mistral"), "{err}");
        assert!(err.contains("closest is qwen2"), "{err}");
        let err = from_config_text(r#"{"model_type": "lama"}"#, "x")
            .expect_err("unsupported")
            .to_string();
        assert!(err.contains("closest is llama"), "{err}");
    }

    #[test]
    fn missing_and_wrong_typed_keys_are_named() {
        let base = r#"{"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}"#;
        assert!(from_config_text(base, "x").is_ok());
        let err = from_config_text(&base.replace(r#""hidden_size": 64,"#, ""), "x")
            .expect_err("missing")
            .to_string();
        assert!(
            err.contains("hidden_size") && err.contains("missing"),
            "{err}"
        );
        let err = from_config_text(&base.replace("1000", "\"big\""), "x")
            .expect_err("wrong type")
            .to_string();
        assert!(err.contains("vocab_size"), "{err}");
        let bad = base.replace("}", r#", "tie_word_embeddings": "yes"}"#);
        let err = from_config_text(&bad, "x")
            .expect_err("wrong type")
            .to_string();
        assert!(err.contains("tie_word_embeddings"), "{err}");
        let bad = base.replace("}", r#", "hidden_act": "mish"}"#);
        let err = from_config_text(&bad, "x")
            .expect_err("unknown act")
            .to_string();
        assert!(err.contains("hidden_act"), "{err}");
    }

    #[test]
    fn t5_keys_are_named() {
        let base = r#"{"model_type": "t5", "vocab_size": 1000, "d_model": 64, "d_kv": 16,
            "d_ff": 128, "num_layers": 2, "num_heads": 4}"#;
        let p = from_config_text(base, "tiny-t5").expect("import");
        assert!(p.is_seq2seq());
        let err = from_config_text(&base.replace(r#""d_model": 64,"#, ""), "x")
            .expect_err("missing")
            .to_string();
        assert!(err.contains("d_model") && err.contains("missing"), "{err}");
        let err = from_config_text(&base.replace("64", "\"wide\""), "x")
            .expect_err("wrong type")
            .to_string();
        assert!(err.contains("d_model"), "{err}");
        let bad = base.replace("}", r#", "feed_forward_proj": "gated-mish"}"#);
        let err = from_config_text(&bad, "x").expect_err("act").to_string();
        assert!(err.contains("feed_forward_proj"), "{err}");
        let bad = base.replace("}", r#", "feed_forward_proj": "a-b-c"}"#);
        let err = from_config_text(&bad, "x").expect_err("form").to_string();
        assert!(err.contains("feed_forward_proj"), "{err}");
        let bad = base.replace("}", r#", "dropout_rate": "high"}"#);
        let err = from_config_text(&bad, "x").expect_err("type").to_string();
        assert!(err.contains("dropout_rate"), "{err}");
        // d_kv need not be d_model / num_heads; the decoder depth defaults to the encoder's.
        let ModelSpec::T5(t) = &p.spec else {
            panic!("t5")
        };
        assert_eq!((t.d_kv, t.num_decoder_layers), (16, 2));
        let back = Preset::from_json(&p.to_json()).expect("round trip");
        assert_eq!(back, p);
    }

    #[test]
    fn imported_presets_round_trip_through_the_preset_format() {
        let text = r#"{"model_type": "gemma2", "vocab_size": 1000, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32}"#;
        let p = from_config_text(text, "tiny-gemma2").expect("import");
        let back = Preset::from_json(&p.to_json()).expect("round trip");
        assert_eq!(back, p);
    }
}
