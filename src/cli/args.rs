//! The model and training flags every planning command shares, and how they become a
//! preset, a training config and a GPU budget (also from a saved `--config` file).
//!

//! The resolution itself is `vramlab-words`' ([`vramlab_words::train_words`]), shared with
//! the GUI's fields and the Python bindings; this file is the flags and where the remarks
//! are printed.

use std::borrow::Cow;

use anyhow::{Result, bail};
use clap::Args;

use vramlab_core::model::Preset;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::gpus::Gpu;
use vramlab_hub::Prequantized;
use vramlab_words::train_words::{self, TrainWords};

// Model and training settings shared by the planning commands. (A plain comment: a doc
// comment would be every flattening subcommand's about, the subcommands being deferred.)
#[derive(Debug, Args, Clone)]
pub struct TrainArgs {
    /// Preset id (see `vramlab presets`), a preset / config.json / captured-graph file, a
    /// model folder (its config.json), or a Hugging Face Hub id ORG/NAME[@REVISION].
    #[arg(long, required_unless_present = "config")]
    pub model: Option<String>,
    /// A saved `.vramlab.json` config (model, training settings, GPU, margin).
    #[arg(long, conflicts_with = "model")]
    pub config: Option<std::path::PathBuf>,
    /// Precision: fp32, amp-fp16, amp-bf16, bf16 [default: amp-bf16]. Aliases: fp16 and
    /// half mean amp-fp16, bf16-amp amp-bf16, bfloat16 pure bf16.
    #[arg(long)]
    pub precision: Option<String>,
    /// Optimizer: sgd, sgd-momentum, adam, adamw, adafactor, adam8bit [default: adamw].
    #[arg(long)]
    pub optimizer: Option<String>,
    /// Sequence length (language models).
    #[arg(long)]
    pub seq: Option<u64>,
    /// Target (decoder) length of an encoder-decoder model (T5) [default: 128]; the source
    /// length is --seq.
    #[arg(long, value_name = "N")]
    pub target_seq: Option<u64>,
    /// Image side in pixels (vision models).
    #[arg(long)]
    pub image: Option<u64>,
    /// Gradient-accumulation steps.
    #[arg(long, default_value_t = 1)]
    pub accum: u64,
    /// Activation checkpointing of every block.
    #[arg(long)]
    pub checkpointing: bool,
    /// With --checkpointing: reentrant checkpointing (`use_reentrant=True`, as HF Trainer /
    /// peft users often set); with adapters, `enable_input_require_grads` is planned too.
    #[arg(long)]
    pub checkpointing_reentrant: bool,
    /// Attention implementation: eager or sdpa.
    #[arg(long, default_value = "sdpa")]
    pub attention: String,
    /// Training-loop shape: plain (`out = model(x); loss = …; loss.backward()`, the output
    /// lives through backward; the default) or trainer (`loss = model(**batch).loss`, as HF
    /// Trainer does: the output is released before backward) or lightning (as trainer, and
    /// Lightning's closure zeroes the gradients after the forward, so they live through it).
    #[arg(long = "loop", value_name = "plain|trainer|lightning")]
    pub loop_shape: Option<String>,
    /// The step to plan: train (the default), eval (a validation forward under
    /// `torch.no_grad()` after training) or eval-grad (the same forward without `no_grad`:
    /// autograd keeps the graph); inference: prefill (`model(input_ids)` under no_grad, every
    /// position's logits) or generate (`model.generate()`, --seq prompt tokens, --new-tokens).
    #[arg(long, value_name = "train|eval|eval-grad|prefill|generate")]
    pub step: Option<String>,
    /// With --step generate: tokens generated per sequence (max_new_tokens), at least 1.
    #[arg(long, value_name = "N")]
    pub new_tokens: Option<u64>,
    /// With --step generate: the KV cache, dynamic (DynamicCache, the default) or static
    /// (StaticCache preallocated to prompt + new tokens).
    #[arg(long, value_name = "dynamic|static")]
    pub kv_cache: Option<String>,
    /// With --step generate: multinomial sampling (`do_sample=True`: the logits warpers,
    /// softmax and torch.multinomial) instead of greedy decoding.
    #[arg(long)]
    pub do_sample: bool,
    /// With --do-sample: the temperature (changes no memory; a TemperatureLogitsWarper when
    /// not 1.0) [default: 1.0].
    #[arg(long, value_name = "T")]
    pub temperature: Option<f64>,
    /// With --do-sample: top-k filtering, 0 = off [default: 50, transformers' default].
    #[arg(long, value_name = "K")]
    pub top_k: Option<u64>,
    /// With --do-sample: nucleus (top-p) filtering, in (0, 1]; 1.0 = off [default: 1.0].
    #[arg(long, value_name = "P")]
    pub top_p: Option<f64>,
    /// With --step generate: beam search with B beams (transformers' `num_beams`; without
    /// --do-sample) [default: 1, greedy].
    #[arg(long, value_name = "B")]
    pub num_beams: Option<u64>,
    /// Inference (--step generate|prefill) of a model loaded with accelerate's
    /// `device_map="auto"`: the modules that do not fit --max-gpu-memory stay on the CPU (or
    /// disk) and their weights are copied to the GPU as they run. Only `auto`.
    #[arg(long, value_name = "auto")]
    pub device_map: Option<String>,
    /// With --device-map auto: `max_memory[0]`, GPU 0's budget for weights, as accelerate
    /// reads it (10GiB, 500MB, 1.5GB, or bytes). Required with --device-map.
    #[arg(long, value_name = "SIZE")]
    pub max_gpu_memory: Option<String>,
    /// With --device-map auto: `max_memory["cpu"]`; what exceeds it goes to disk
    /// [default: no CPU limit; note that transformers itself sends to disk whatever does not
    /// fit GPU 0 when max_memory names no "cpu"].
    #[arg(long, value_name = "SIZE")]
    pub max_cpu_memory: Option<String>,
    /// Fine-tuning: full (every parameter trains; the default), lora (peft 0.21 LoRA
    /// adapters in fp32, the base model frozen) or qlora (the same adapters on a
    /// bitsandbytes 4-bit base, see --quant).
    #[arg(long, value_name = "full|lora|qlora")]
    pub finetune: Option<String>,
    /// LoRA rank r (with --finetune lora) [default: 8].
    #[arg(long)]
    pub lora_rank: Option<u64>,
    /// LoRA target modules: attn (peft's default: GPT-2 c_attn, Llama q_proj,v_proj),
    /// all-linear (every linear but the output layer), or names (c_attn,c_fc) [default: attn].
    #[arg(long, value_name = "attn|all-linear|NAME,NAME")]
    pub lora_targets: Option<String>,
    /// LoRA dropout probability P, 0 ≤ P < 1 (peft's lora_dropout; each adapter runs
    /// nn.Dropout on its input) [default: 0].
    #[arg(long, value_name = "P")]
    pub lora_dropout: Option<f64>,
    /// Full fine-tuning with the embeddings frozen (every embedding lookup's weight, so a
    /// tied output head too).
    #[arg(long)]
    pub freeze_embeddings: bool,
    /// Full fine-tuning with the first N blocks (layers) frozen.
    #[arg(long, value_name = "N")]
    pub freeze_blocks: Option<u32>,
    /// With --step eval|eval-grad and --finetune lora|qlora: the adapters merged into the base
    /// weights (peft's merge_and_unload) before the evaluation: no adapter ops run.
    #[arg(long)]
    pub lora_merged: bool,
    /// QLoRA base storage (with --finetune qlora): nf4 (the default), fp4 or int8 (LLM.int8).
    #[arg(long, value_name = "nf4|fp4|int8")]
    pub quant: Option<String>,
    /// QLoRA: turn bitsandbytes double quantization of the 4-bit block scales off.
    #[arg(long)]
    pub no_double_quant: bool,
    /// Inference with --quant int8: the checkpoint's LLM.int8 outlier columns — none (a
    /// trained checkpoint; the default) or random-init (from_config's random weights, whose
    /// MLP down_proj inputs cross the 6.0 threshold in many columns).
    #[arg(long, value_name = "none|random-init")]
    pub int8_outliers: Option<String>,
    /// Inference with --quant and --device-map auto: `BitsAndBytesConfig(...,
    /// llm_int8_enable_fp32_cpu_offload=True)`, which transformers requires as soon as a
    /// module is placed on the CPU or disk (without it from_pretrained raises). Under
    /// device_map="auto" the offloaded layers stay quantized and are copied to GPU 0 as they run.
    #[arg(long)]
    pub fp32_cpu_offload: bool,
    /// Mixture-of-experts routing imbalance F ≥ 1 (mixtral, qwen2_moe, qwen3_moe): every
    /// expert's routed rows sized for the busiest expert receiving F× its uniform
    /// tokens·k/E share [default: 1, uniform routing].
    #[arg(long, value_name = "F")]
    pub moe_imbalance: Option<f64>,
    /// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    #[arg(long)]
    pub expandable_segments: bool,
    /// PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:N
    #[arg(long)]
    pub max_split_size_mb: Option<u64>,
    /// Target GPU: a catalog id or name (see `vramlab presets`), or `detected` (NVML)
    /// [default: rtx-4090].
    #[arg(long)]
    pub gpu: Option<String>,
    /// Fraction of GPU memory kept free.
    #[arg(long, default_value_t = 0.05)]
    pub margin: f64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub dist: super::dist_args::DistArgs,
}

/// The GPU planned for when `--gpu` is not given.
pub const DEFAULT_GPU: &str = train_words::DEFAULT_GPU;

pub(crate) use super::stderr::{note, say};

/// `--batch`: a whole number of samples of at least 1, explained when it is not.
pub(crate) fn parse_batch(s: &str) -> Result<u64, String> {
    train_words::parse_batch(s)
}

/// Loads a preset by id (or display name, case and punctuation ignored: `llama-3-8b`) or
/// from a file path.
pub fn load_model(name: &str) -> Result<Preset> {
    if is_hub_source(name) {
        return Ok(super::model_source::load(name)?.preset);
    }
    Ok(train_words::load_model(name, &mut say)?)
}

/// Whether `--model` is for `vramlab-hub`: an existing folder, or neither a file nor a
/// preset name and shaped like a Hub id `ORG/NAME[@REVISION]` (`vramlab-words` reads the
/// rest; the core has no network code).
pub(crate) fn is_hub_source(name: &str) -> bool {
    let path = std::path::Path::new(name);
    path.is_dir()
        || (!name.ends_with(".json")
            && !path.exists()
            && vramlab_hub::source::is_source(name)
            && vramlab_words::vocabulary::model_id(name).is_err())
}

/// A catalog GPU by id or name, or `detected`: the GPU NVML reports (else the default
/// catalog card, said on standard error). The flag says whether the card was detected.
#[cfg(feature = "app")]
pub(crate) fn find_gpu(id: &str) -> Result<(Gpu, bool)> {
    Ok(train_words::find_gpu(id, &detect_gpu, &mut say)?)
}

/// The first GPU NVML sees, with the driver's idle reservation from the catalog.
#[cfg(feature = "app")]
pub(crate) fn detect_gpu() -> Option<Gpu> {
    vramlab_device::gpu::detect()
        .map(|d| Gpu::detected(&d.name, d.total, &vramlab_core::plan::gpus::catalog()))
}

#[cfg(not(feature = "app"))]
pub(crate) fn detect_gpu() -> Option<Gpu> {
    None
}

/// Model and training config from the flags or `--config` (the batch comes elsewhere).
pub fn resolve_model(t: &TrainArgs) -> Result<(Preset, TrainConfig)> {
    let (w, _) = t.words_loaded()?;
    Ok(w.resolve_model(&detect_gpu, &mut say)?)
}

impl TrainArgs {
    /// The flags as `vramlab-words`' words.
    pub fn words(&self) -> TrainWords {
        let d = &self.dist;
        TrainWords {
            model: self.model.clone(),
            config: self.config.clone(),
            precision: self.precision.clone(),
            optimizer: self.optimizer.clone(),
            seq: self.seq,
            target_seq: self.target_seq,
            image: self.image,
            accum: self.accum,
            checkpointing: self.checkpointing,
            checkpointing_reentrant: self.checkpointing_reentrant,
            attention: self.attention.clone(),
            loop_shape: self.loop_shape.clone(),
            step: self.step.clone(),
            finetune: self.finetune.clone(),
            lora_rank: self.lora_rank,
            lora_targets: self.lora_targets.clone(),
            lora_dropout: self.lora_dropout,
            freeze_embeddings: self.freeze_embeddings,
            freeze_blocks: self.freeze_blocks,
            lora_merged: self.lora_merged,
            quant: self.quant.clone(),
            no_double_quant: self.no_double_quant,
            moe_imbalance: self.moe_imbalance,
            expandable_segments: self.expandable_segments,
            max_split_size_mb: self.max_split_size_mb,
            gpu: self.gpu.clone(),
            margin: self.margin,
            dist: d.words(),
            preloaded: None,
        }
    }

    /// The flags as `vramlab-words`' words, a Hub id or a model folder read here (through
    /// `vramlab-hub`: the core has no network code) and a pre-quantized checkpoint planned
    /// as stored; with the Hub repository a `--model ORG/NAME` came from.
    pub(crate) fn words_loaded(&self) -> Result<(TrainWords, Option<String>)> {
        let Some(name) = self.model.as_deref().filter(|_| self.config.is_none()) else {
            return Ok((self.words(), None));
        };
        if !is_hub_source(name) {
            return Ok((self.words(), None));
        }
        let s = super::model_source::load(name)?;
        let t = as_stored(self, s.prequantized.as_ref(), name)?;
        let mut w = t.words();
        w.preloaded = Some(Box::new(s.preset));
        Ok((w, s.hub_repo))
    }

    /// The GPU and the budget on it (`--gpu`, `--margin`).
    pub(crate) fn budget(&self) -> Result<(Gpu, vramlab_core::plan::search::Budget)> {
        Ok(self.words().budget(&detect_gpu, &mut say)?)
    }
}

/// The flags with a pre-quantized checkpoint planned as it is stored: a bitsandbytes 4-bit
/// or 8-bit base is QLoRA's base (`--finetune qlora --quant …`), the only way such a base
/// trains; other methods are not modelled, said on standard error.
fn as_stored<'a>(
    t: &'a TrainArgs,
    q: Option<&Prequantized>,
    model: &str,
) -> Result<Cow<'a, TrainArgs>> {
    let Some(q) = q else {
        return Ok(Cow::Borrowed(t));
    };
    let Some((quant, double)) = q.qlora_base() else {
        note(&format!(
            "--model {model}: quantization_config says the checkpoint is pre-quantized ({q}); \
             that storage is not modelled: the plan holds unquantized weights in the dtype \
             --precision gives"
        ));
        return Ok(Cow::Borrowed(t));
    };
    let quant = quant.as_str();
    match t.finetune.as_deref() {
        None => {
            let mut planned = t.clone();
            planned.finetune = Some("qlora".to_string());
            planned.quant = Some(quant.to_string());
            planned.no_double_quant = !double;
            note(&format!(
                "--model {model}: the checkpoint is pre-quantized ({q}); planned as stored: \
                 --finetune qlora --quant {quant}{} (adapters on the quantized base)",
                if double { "" } else { " --no-double-quant" }
            ));
            Ok(Cow::Owned(planned))
        }
        Some("qlora") => {
            if t.quant.as_deref().is_some_and(|given| given != quant) {
                note(&format!(
                    "--model {model}: the checkpoint stores {q}; planning the --quant given"
                ));
            }
            Ok(Cow::Borrowed(t))
        }
        Some(other) => bail!(
            "--finetune {other}: --model {model} is pre-quantized ({q}): its base weights stay \
             quantized and cannot train as {other}; plan it with --finetune qlora (LoRA \
             adapters on the quantized base), or use the unquantized checkpoint"
        ),
    }
}
