//! The model and training flags every planning command shares, and how they become a
//! preset, a training config and a GPU budget (also from a saved `--config` file).

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::Args;

use vramlab_core::model::Preset;
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::config::{AllocatorConfig, LoopShape};
use vramlab_core::plan::gpus::{self, Gpu};
use vramlab_core::plan::search::Budget;

/// Model and training settings shared by the planning commands.
#[derive(Debug, Args, Clone)]
pub struct TrainArgs {
    /// Preset id (see `vramlab presets`) or path to a preset JSON file.
    #[arg(long, required_unless_present = "config")]
    pub model: Option<String>,
    /// A saved `.vramlab.json` config (model, training settings, GPU, margin).
    #[arg(long, conflicts_with = "model")]
    pub config: Option<std::path::PathBuf>,
    /// Precision: fp32, amp-fp16, amp-bf16, bf16.
    #[arg(long, default_value = "amp-bf16")]
    pub precision: String,
    /// Optimizer: sgd, sgd-momentum, adam, adamw, adafactor, adam8bit.
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// Sequence length (language models).
    #[arg(long)]
    pub seq: Option<u64>,
    /// Image side in pixels (vision models).
    #[arg(long)]
    pub image: Option<u64>,
    /// Gradient-accumulation steps.
    #[arg(long, default_value_t = 1)]
    pub accum: u64,
    /// Activation checkpointing of every block.
    #[arg(long)]
    pub checkpointing: bool,
    /// Attention implementation: eager or sdpa.
    #[arg(long, default_value = "sdpa")]
    pub attention: String,
    /// Training-loop shape: plain (`out = model(x); loss = …; loss.backward()`, the output
    /// lives through backward; the default) or trainer (`loss = model(**batch).loss`, as HF
    /// Trainer and Lightning do: the output is released before backward).
    #[arg(long = "loop", value_name = "plain|trainer")]
    pub loop_shape: Option<String>,
    /// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    #[arg(long)]
    pub expandable_segments: bool,
    /// PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:N
    #[arg(long)]
    pub max_split_size_mb: Option<u64>,
    /// Target GPU from the catalog (see `vramlab presets`).
    #[arg(long, default_value = "rtx-4090")]
    pub gpu: String,
    /// Fraction of GPU memory kept free.
    #[arg(long, default_value_t = 0.05)]
    pub margin: f64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Loads a preset by id or from a file path.
pub fn load_model(name: &str) -> Result<Preset> {
    let path = Path::new(name);
    if name.ends_with(".json") || path.exists() {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading preset file {}", path.display()))?;
        if let Some(p) = vramlab_core::model::hf::from_text_if_hf(
            &text,
            &vramlab_core::model::hf::name_for_path(path),
        ) {
            return p.with_context(|| format!("Hugging Face config {}", path.display()));
        }
        return Preset::from_json(&text).with_context(|| format!("preset file {}", path.display()));
    }
    Ok(find_builtin(name)?)
}

/// A catalog GPU by id; an empty id is refused (a partial-id match would pick any GPU).
pub(crate) fn find_gpu(id: &str) -> Result<Gpu> {
    if id.trim().is_empty() {
        bail!("gpu: empty id (see `vramlab presets` for the catalog)");
    }
    Ok(gpus::find(id.trim())?)
}

/// Model, training config and budget from the flags, or from `--config FILE`
/// (`--batch` still overrides the file's batch).
pub(crate) fn resolve(
    t: &TrainArgs,
    batch: Option<u64>,
) -> Result<(Preset, TrainConfig, Gpu, Budget, bool)> {
    if let Some(path) = &t.config {
        let bytes =
            std::fs::read(path).with_context(|| format!("reading config {}", path.display()))?;
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
        cfg.validate()?;
        let gpu = find_gpu(&doc.gpu)?;
        let budget = Budget {
            capacity: gpu.memory(),
            margin: doc.margin,
        };
        let custom = matches!(
            doc.model,
            vramlab_core::export::vramlab_file::ModelRef::Custom(_)
        );
        return Ok((preset, cfg, gpu, budget, custom));
    }
    let name = t
        .model
        .as_deref()
        .context("--model or --config is required")?;
    let preset = load_model(name)?;
    let custom = find_builtin(name).is_err();
    let cfg = t.config(&preset, batch.context("--batch is required")?)?;
    let (gpu, budget) = t.budget()?;
    Ok((preset, cfg, gpu, budget, custom))
}

/// Model and training config from the flags or `--config` (the batch comes elsewhere).
pub fn resolve_model(t: &TrainArgs) -> Result<(Preset, TrainConfig)> {
    let batch = if t.config.is_some() { None } else { Some(1) };
    let (preset, cfg, ..) = resolve(t, batch)?;
    Ok((preset, cfg))
}

impl TrainArgs {
    pub(crate) fn config(&self, preset: &Preset, batch: u64) -> Result<TrainConfig> {
        let size = match (self.seq, self.image, preset.input.is_tokens()) {
            (Some(_), _, false) => bail!("--seq: {} takes images; use --image", preset.id),
            (_, Some(_), true) => bail!("--image: {} takes tokens; use --seq", preset.id),
            (s, i, _) => s.or(i),
        };
        if !(0.0..1.0).contains(&self.margin) {
            bail!(
                "--margin: must be a fraction in [0, 1), got {}",
                self.margin
            );
        }
        let cfg = TrainConfig {
            batch,
            size,
            precision: self.precision.parse()?,
            optimizer: self.optimizer.parse()?,
            accum: self.accum,
            checkpointing: self.checkpointing,
            attention: self.attention.parse()?,
            allocator: AllocatorConfig {
                expandable_segments: self.expandable_segments,
                max_split_size_mb: self.max_split_size_mb,
            },
            loop_shape: match &self.loop_shape {
                Some(l) => l.parse()?,
                None => LoopShape::default(),
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }

    pub(crate) fn budget(&self) -> Result<(Gpu, Budget)> {
        let gpu = find_gpu(&self.gpu).context("--gpu")?;
        let budget = Budget {
            capacity: gpu.memory(),
            margin: self.margin,
        };
        Ok((gpu, budget))
    }
}
