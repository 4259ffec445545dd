//! The model and training flags every planning command shares, and how they become a
//! preset, a training config and a GPU budget (also from a saved `--config` file).

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::Args;

use vramlab_core::answer::report::Assumed;
use vramlab_core::fsutil::FileKind;
use vramlab_core::model::Preset;
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::config::{AllocatorConfig, LoopShape};
use vramlab_core::plan::finetune::{FineTune, FineTuneMode, LoraDropout};
use vramlab_core::plan::gpus::{self, Gpu};
use vramlab_core::plan::search::Budget;
use vramlab_core::{names, vocabulary};

/// Model and training settings shared by the planning commands.
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
    /// Trainer and Lightning do: the output is released before backward).
    #[arg(long = "loop", value_name = "plain|trainer")]
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
    /// Inference with accelerate's device_map (not modelled yet: refused with a message).
    #[arg(long, value_name = "auto")]
    pub device_map: Option<String>,
    /// With --device-map: the GPU's max_memory (not modelled yet: refused with a message).
    #[arg(long, value_name = "SIZE")]
    pub max_gpu_memory: Option<String>,
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
pub const DEFAULT_GPU: &str = "rtx-4090";

/// Prints a note on standard error (an alias read as a canonical name, a fallback).
pub(crate) fn note(text: &str) {
    eprintln!("note: {text}");
}

/// `--batch`: a whole number of samples of at least 1, explained when it is not.
pub(crate) fn parse_batch(s: &str) -> Result<u64, String> {
    const WHAT: &str = "the batch is the number of samples in one forward/backward pass \
                        (the micro-batch; --accum multiplies it into the effective batch), \
                        a whole number of at least 1";
    match s.trim().parse::<i128>() {
        Ok(n) if n >= 1 => u64::try_from(n).map_err(|_| format!("{n} is too large; {WHAT}")),
        Ok(n) => Err(format!("must be at least 1, got {n}: {WHAT}")),
        Err(_) => Err(format!("`{s}` is not a whole number: {WHAT}")),
    }
}

/// A `--model` read: the preset, whether it is not a built-in one, and a pre-quantized
/// checkpoint's storage (a model folder's or Hub config's `quantization_config`).
#[derive(Debug, Clone)]
pub(crate) struct LoadedModel {
    pub preset: Preset,
    pub custom: bool,
    pub prequantized: Option<vramlab_hub::Prequantized>,
    /// The Hub repository (`ORG/NAME`) of a Hub id.
    pub hub_repo: Option<String>,
}

/// Loads a preset by id (or display name, case and punctuation ignored: `llama-3-8b`), from
/// a file path or a model folder, or from a Hugging Face Hub id (`ORG/NAME[@REVISION]`).
pub fn load_model(name: &str) -> Result<Preset> {
    Ok(load_source(name)?.preset)
}

/// [`load_model`] with where the model came from. An existing path wins, then a preset
/// name; `ORG/NAME` that is neither is a Hub id.
pub(crate) fn load_source(name: &str) -> Result<LoadedModel> {
    let path = Path::new(name);
    let sourced = |s: vramlab_hub::Source| LoadedModel {
        preset: s.preset,
        custom: true,
        prequantized: s.prequantized,
        hub_repo: s.hub_repo,
    };
    if path.is_dir() {
        return super::model_source::load(name).map(sourced);
    }
    if name.ends_with(".json") || path.exists() {
        return Ok(LoadedModel {
            preset: load_file(path, name)?,
            custom: true,
            prequantized: None,
            hub_repo: None,
        });
    }
    let id = match vocabulary::model_id(name) {
        Ok(id) => id,
        Err(_) if vramlab_hub::source::is_source(name) => {
            return super::model_source::load(name).map(sourced);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(n) = &id.note {
        note(n);
    }
    Ok(LoadedModel {
        preset: find_builtin(id.value)?,
        custom: find_builtin(name).is_err(),
        prequantized: None,
        hub_repo: None,
    })
}

/// A preset document, a Hugging Face `config.json` or a captured graph.
fn load_file(path: &Path, name: &str) -> Result<Preset> {
    let text = vramlab_core::fsutil::read_bounded_string(path, FileKind::Model)
        .context("--model: reading preset file")?;
    if name.ends_with(vramlab_core::model::captured::SUFFIX)
        || vramlab_core::model::captured::is_graph_text(&text)
    {
        let id = vramlab_core::model::hf::name_for_path(path);
        return Preset::from_captured(id.trim_end_matches(".vramlab-graph"), &text)
            .with_context(|| format!("captured graph {}", path.display()));
    }
    if let Some(p) = vramlab_core::model::hf::from_text_if_hf(
        &text,
        &vramlab_core::model::hf::name_for_path(path),
    ) {
        return p.with_context(|| format!("Hugging Face config {}", path.display()));
    }
    Preset::from_json(&text).with_context(|| format!("preset file {}", path.display()))
}

/// Whether `id` asks for the GPU of this machine.
pub(crate) fn is_detected(id: &str) -> bool {
    names::normalize(id) == "detected"
}

/// A catalog GPU by id or name, or `detected`: the GPU NVML reports (else the default
/// catalog card, said on standard error). The flag says whether the card was detected.
/// An empty id is refused (a partial-id match would pick any GPU).
pub(crate) fn find_gpu(id: &str) -> Result<(Gpu, bool)> {
    if id.trim().is_empty() {
        bail!("gpu: empty id (see `vramlab presets` for the catalog)");
    }
    if is_detected(id) {
        if let Some(g) = detect_gpu() {
            return Ok((g, true));
        }
        let fallback = gpus::find(DEFAULT_GPU)?;
        note(&format!(
            "gpu `detected`: no GPU found through NVML here; planning for the catalog card {} ({})",
            fallback.id, fallback.name
        ));
        return Ok((fallback, false));
    }
    let g = gpus::by_name(id.trim(), &gpus::catalog())?;
    if let Some(n) = &g.note {
        note(&format!("{n} ({})", g.value.name));
    }
    Ok((g.value, false))
}

/// The first GPU NVML sees, with the driver's idle reservation from the catalog.
#[cfg(feature = "app")]
fn detect_gpu() -> Option<Gpu> {
    vramlab_device::gpu::detect().map(|d| Gpu::detected(&d.name, d.total, &gpus::catalog()))
}

#[cfg(not(feature = "app"))]
fn detect_gpu() -> Option<Gpu> {
    None
}

/// What the model and training flags (or a saved `--config` file) resolve to.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub preset: Preset,
    pub config: TrainConfig,
    pub gpu: Gpu,
    pub budget: Budget,
    /// The model is not a built-in one (a file, or a custom model in the saved plan): it
    /// may reuse a built-in id for other weights, so exports name no Hub id for it.
    pub custom: bool,
    /// The Hub repository a `--model ORG/NAME` came from: exports name it.
    pub hub_repo: Option<String>,
}

/// Model, training config and budget from the flags, or from `--config FILE`
/// (`--batch` still overrides the file's batch).
pub(crate) fn resolve(t: &TrainArgs, batch: Option<u64>) -> Result<Resolved> {
    if let Some(path) = &t.config {
        let bytes = vramlab_core::fsutil::read_bounded(path, FileKind::SavedPlan)
            .context("--config: reading saved plan")?;
        let doc = vramlab_core::export::VramlabConfig::from_bytes(&bytes)
            .with_context(|| format!("config {}", path.display()))?;
        let preset = doc.preset()?;
        let mut cfg = doc.training;
        if let Some(b) = batch {
            cfg.batch = b;
        }
        if let Some(l) = &t.loop_shape {
            cfg.loop_shape = l.parse()?;
        }
        if let Some(k) = &t.step {
            cfg.step = k.parse()?;
        }
        if let Some(f) = t.moe_imbalance {
            cfg.moe_imbalance = f;
        }
        if let Some(n) = t.target_seq {
            cfg.target_seq = Some(n);
        }
        cfg.validate()?;
        let gpu = match &doc.gpu_detected {
            // Saved against a detected card: plan for that card, on any machine.
            Some(card) => {
                note(&format!(
                    "gpu: {} was saved for the detected {} ({} MiB); planning for that card",
                    path.display(),
                    card.name,
                    card.memory_mib
                ));
                card.gpu(&gpus::catalog())
            }
            None => find_gpu(&doc.gpu).context("gpu (in the config)")?.0,
        };
        let budget = Budget {
            capacity: gpu.memory(),
            margin: doc.margin,
        };
        let custom = matches!(
            doc.model,
            vramlab_core::export::vramlab_file::ModelRef::Custom(_)
        );
        return Ok(Resolved {
            preset,
            config: cfg,
            gpu,
            budget,
            custom,
            hub_repo: None,
        });
    }
    let name = t
        .model
        .as_deref()
        .context("--model or --config is required")?;
    let LoadedModel {
        preset,
        custom,
        prequantized,
        hub_repo,
    } = load_source(name)?;
    let t = super::model_source::as_stored(t, prequantized.as_ref(), name)?;
    let cfg = t.config(&preset, batch.context("--batch is required")?)?;
    let (gpu, budget) = t.budget()?;
    Ok(Resolved {
        preset,
        config: cfg,
        gpu,
        budget,
        custom,
        hub_repo,
    })
}

/// Model and training config from the flags or `--config` (the batch comes elsewhere).
pub fn resolve_model(t: &TrainArgs) -> Result<(Preset, TrainConfig)> {
    let batch = if t.config.is_some() { None } else { Some(1) };
    let r = resolve(t, batch)?;
    Ok((r.preset, r.config))
}

impl TrainArgs {
    pub(crate) fn config(&self, preset: &Preset, batch: u64) -> Result<TrainConfig> {
        let size = match (self.seq, self.image, preset.input.is_tokens()) {
            (Some(_), _, false) => bail!("--seq: {} takes images; use --image", preset.id),
            (_, Some(_), true) => bail!("--image: {} takes tokens; use --seq", preset.id),
            (s, i, _) => s.or(i),
        };
        if self.target_seq.is_some() && !preset.is_seq2seq() {
            bail!(
                "--target-seq: {} is not an encoder-decoder model (it has no target sequence); \
                 use --seq alone",
                preset.id
            );
        }
        if !(0.0..1.0).contains(&self.margin) {
            bail!(
                "--margin: must be a fraction in [0, 1), got {}",
                self.margin
            );
        }
        // A captured graph's own settings are the defaults (other values need a re-capture).
        let captured = match &preset.spec {
            vramlab_core::model::ModelSpec::Captured(c) => Some(&c.settings),
            _ => None,
        };
        let cfg = TrainConfig {
            batch,
            size,
            target_seq: self.target_seq,
            precision: self.name_or_default(
                self.precision.as_deref(),
                captured.map_or("amp-bf16", |c| c.precision.as_str()),
                vocabulary::precision,
            )?,
            optimizer: self.name_or_default(
                self.optimizer.as_deref(),
                captured.map_or("adamw", |c| c.optimizer.as_str()),
                vocabulary::optimizer,
            )?,
            accum: self.accum,
            checkpointing: self.checkpointing || captured.is_some_and(|c| c.checkpointing),
            checkpoint_reentrant: self.checkpointing_reentrant,
            attention: self.name_or_default(
                Some(&self.attention),
                "sdpa",
                vocabulary::attention,
            )?,
            allocator: AllocatorConfig {
                expandable_segments: self.expandable_segments,
                max_split_size_mb: self.max_split_size_mb,
            },
            loop_shape: match (&self.loop_shape, captured) {
                (Some(l), _) => l.parse()?,
                (None, Some(c)) => c.loop_shape.parse()?,
                (None, None) => LoopShape::default(),
            },
            finetune: self.finetune()?,
            step: match &self.step {
                Some(k) => k.parse()?,
                None => Default::default(),
            },
            distributed: self.dist.distributed()?,
            moe_imbalance: self.moe_imbalance.unwrap_or(1.0),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// `--finetune`, `--lora-rank`, `--lora-targets`, `--lora-dropout` (LoRA options need
    /// `--finetune lora` or `qlora`).
    fn finetune(&self) -> Result<FineTune> {
        let mut ft = FineTune::default();
        match self.finetune.as_deref() {
            None | Some("full") => {}
            Some(other) => ft.mode = other.parse()?,
        }
        if !ft.mode.has_adapters()
            && (self.lora_rank.is_some()
                || self.lora_targets.is_some()
                || self.lora_dropout.is_some())
        {
            bail!("--lora-rank / --lora-targets / --lora-dropout: need --finetune lora or qlora");
        }
        if ft.mode != FineTuneMode::Qlora && (self.quant.is_some() || self.no_double_quant) {
            bail!("--quant / --no-double-quant: need --finetune qlora");
        }
        if let Some(q) = &self.quant {
            ft.quant = q.parse()?;
        }
        ft.double_quant = !self.no_double_quant;
        if let Some(r) = self.lora_rank {
            ft.lora_rank = r;
        }
        if let Some(t) = &self.lora_targets {
            ft.lora_targets = t.parse()?;
        }
        if let Some(p) = self.lora_dropout {
            ft.lora_dropout = LoraDropout::new(p)?;
        }
        ft.freeze_embeddings = self.freeze_embeddings;
        ft.freeze_blocks = self.freeze_blocks.unwrap_or(0);
        ft.lora_merged = self.lora_merged;
        if ft.mode.has_adapters() && (ft.freeze_embeddings || ft.freeze_blocks > 0) {
            bail!(
                "--freeze-embeddings / --freeze-blocks: apply to full fine-tuning (--finetune {} \
                 already freezes the whole base model)",
                ft.mode.as_str()
            );
        }
        Ok(ft)
    }

    /// The name given (with a note when it was an alias) or the default.
    fn name_or_default<T>(
        &self,
        given: Option<&str>,
        default: &str,
        parse: fn(&str) -> Result<names::Resolved<T>, names::NameError>,
    ) -> Result<T> {
        let r = parse(given.unwrap_or(default))?;
        if let Some(n) = &r.note {
            note(n);
        }
        Ok(r.value)
    }

    /// What the plan assumed because a flag was not given.
    pub fn assumed(&self) -> Vec<Assumed> {
        if self.config.is_some() {
            return Vec::new();
        }
        let mut a = Vec::new();
        let mut default = |setting, given: bool, value| {
            if !given {
                a.push(Assumed { setting, value });
            }
        };
        default("--gpu", self.gpu.is_some(), DEFAULT_GPU);
        default("--precision", self.precision.is_some(), "amp-bf16");
        default("--optimizer", self.optimizer.is_some(), "adamw");
        a
    }

    pub(crate) fn budget(&self) -> Result<(Gpu, Budget)> {
        let (gpu, _) = find_gpu(self.gpu.as_deref().unwrap_or(DEFAULT_GPU)).context("--gpu")?;
        let budget = Budget {
            capacity: gpu.memory(),
            margin: self.margin,
        };
        Ok((gpu, budget))
    }
}
