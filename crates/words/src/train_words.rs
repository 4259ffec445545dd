//! The words a front end takes for a configuration — the CLI's flags, the Python bindings'
//! keyword arguments — and how they become a preset, a training config and a GPU budget
//! (also from a saved `.vramlab.json`): one implementation, so `vramlab plan … --json` and
//! `vramlab.plan(…).to_json()` resolve the same words to the same plan. The names of the
//! settings in errors and notes are the CLI's flags (`--seq`), which the Python keywords
//! mirror (`seq=`).
//!
//! What resolving says on the way (an alias read as its canonical name, a fallback) goes to
//! a [`Remark`] sink in order, so a front end can print it before an error that follows.

use std::path::{Path, PathBuf};

use crate::{names, vocabulary};
use vramlab_core::answer::error::{AnswerError, Ctx};
use vramlab_core::answer::max_batch::{MaxBatchReport, Outcome};
use vramlab_core::answer::report::{Assumed, PlanReport, PlanRequest, PlanStart};
use vramlab_core::answer::warnings;
use vramlab_core::fsutil::FileKind;
use vramlab_core::model::Preset;
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::config::{AllocatorConfig, LoopShape, MAX_ACCUM};
use vramlab_core::plan::distributed::{
    Distributed, FsdpMixedPrecision, Offload, Strategy, ZeroKnobs,
};
use vramlab_core::plan::finetune::{FineTune, FineTuneMode, LoraDropout};
use vramlab_core::plan::gpus::{self, Gpu};
use vramlab_core::plan::search::Budget;
use vramlab_core::plan::{Planner, TrainConfig, multi_gpu};

/// The GPU planned for when none is given.
pub const DEFAULT_GPU: &str = "rtx-4090";
/// The precision planned for when none is given.
pub const DEFAULT_PRECISION: &str = "amp-bf16";
/// The optimizer planned for when none is given.
pub const DEFAULT_OPTIMIZER: &str = "adamw";
/// The attention kernel planned for when none is given.
pub const DEFAULT_ATTENTION: &str = "sdpa";
/// The fraction of GPU memory kept free when none is given.
pub const DEFAULT_MARGIN: f64 = 0.05;
/// The largest world `gpus=auto` tries when none is given.
pub const DEFAULT_MAX_GPUS: u64 = 64;

macro_rules! bail {
    ($($t:tt)*) => { return Err(AnswerError::new(format!($($t)*))) };
}

/// What resolving says on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remark {
    /// An alias read as its canonical name, a fallback (the CLI prints `note: …`).
    Note(String),
    /// A setting the card runs badly or not at all (the CLI prints `warning: …`).
    Warning(String),
}

/// Where remarks go, in the order they are made.
pub type Sink<'a> = &'a mut dyn FnMut(Remark);

fn note(sink: Sink<'_>, text: impl Into<String>) {
    sink(Remark::Note(text.into()));
}

/// The GPU of this machine, when the front end can see one (the CLI through NVML).
pub type Detect<'a> = &'a dyn Fn() -> Option<Gpu>;

/// The model and training settings every planning command shares, as words (`None`: not
/// given, the default applies). The CLI's flags of the same names fill it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainWords {
    /// Preset id or display name, a preset/config.json/captured-graph file.
    pub model: Option<String>,
    /// A saved `.vramlab.json` (instead of `model` and the training words).
    pub config: Option<PathBuf>,
    pub precision: Option<String>,
    pub optimizer: Option<String>,
    pub seq: Option<u64>,
    pub target_seq: Option<u64>,
    pub image: Option<u64>,
    pub accum: u64,
    pub checkpointing: bool,
    pub checkpointing_reentrant: bool,
    pub attention: String,
    /// `plain` or `trainer`.
    pub loop_shape: Option<String>,
    /// `train`, `eval` or `eval-grad`.
    pub step: Option<String>,
    /// `full`, `lora` or `qlora`.
    pub finetune: Option<String>,
    pub lora_rank: Option<u64>,
    pub lora_targets: Option<String>,
    pub lora_dropout: Option<f64>,
    pub freeze_embeddings: bool,
    pub freeze_blocks: Option<u32>,
    pub lora_merged: bool,
    pub quant: Option<String>,
    pub no_double_quant: bool,
    pub moe_imbalance: Option<f64>,
    pub expandable_segments: bool,
    pub max_split_size_mb: Option<u64>,
    pub gpu: Option<String>,
    pub margin: f64,
    pub dist: DistWords,
    /// The model already read by the caller (a Hub id or a model folder, through
    /// `vramlab-hub`: the core has no network code), used instead of reading `model`.
    pub preloaded: Option<Box<Preset>>,
}

impl Default for TrainWords {
    fn default() -> TrainWords {
        TrainWords {
            model: None,
            config: None,
            precision: None,
            optimizer: None,
            seq: None,
            target_seq: None,
            image: None,
            accum: 1,
            checkpointing: false,
            checkpointing_reentrant: false,
            attention: DEFAULT_ATTENTION.to_string(),
            loop_shape: None,
            step: None,
            finetune: None,
            lora_rank: None,
            lora_targets: None,
            lora_dropout: None,
            freeze_embeddings: false,
            freeze_blocks: None,
            lora_merged: false,
            quant: None,
            no_double_quant: false,
            moe_imbalance: None,
            expandable_segments: false,
            max_split_size_mb: None,
            gpu: None,
            margin: DEFAULT_MARGIN,
            dist: DistWords::default(),
            preloaded: None,
        }
    }
}

/// The multi-GPU settings, as words (the CLI's `--gpus`, `--strategy`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistWords {
    /// GPUs per node, or `auto`.
    pub gpus: Option<String>,
    pub nodes: Option<u32>,
    pub strategy: Option<String>,
    pub offload: Option<String>,
    pub no_reshard_after_forward: bool,
    pub fsdp_mixed_precision: Option<String>,
    pub bucket_cap_mb: Option<u64>,
    pub gradient_as_bucket_view: bool,
    pub reduce_bucket_size: Option<u64>,
    pub allgather_bucket_size: Option<u64>,
    pub overlap_comm: Option<bool>,
    pub no_contiguous_gradients: bool,
    pub stage3_prefetch_bucket_size: Option<u64>,
    pub stage3_max_live_parameters: Option<u64>,
    pub stage3_max_reuse_distance: Option<u64>,
    pub stage3_param_persistence_threshold: Option<u64>,
    pub max_gpus: u64,
}

impl Default for DistWords {
    fn default() -> DistWords {
        DistWords {
            gpus: None,
            nodes: None,
            strategy: None,
            offload: None,
            no_reshard_after_forward: false,
            fsdp_mixed_precision: None,
            bucket_cap_mb: None,
            gradient_as_bucket_view: false,
            reduce_bucket_size: None,
            allgather_bucket_size: None,
            overlap_comm: None,
            no_contiguous_gradients: false,
            stage3_prefetch_bucket_size: None,
            stage3_max_live_parameters: None,
            stage3_max_reuse_distance: None,
            stage3_param_persistence_threshold: None,
            max_gpus: DEFAULT_MAX_GPUS,
        }
    }
}

/// Loads a preset by id (or display name, case and punctuation ignored: `llama-3-8b`) or
/// from a file path (a preset JSON, a Hugging Face config.json, a captured graph).
pub fn load_model(name: &str, sink: Sink<'_>) -> Result<Preset, AnswerError> {
    let path = Path::new(name);
    if name.ends_with(".json") || path.exists() {
        let text = vramlab_core::fsutil::read_bounded_string(path, FileKind::Model)
            .ctx("--model: reading preset file")?;
        if name.ends_with(vramlab_core::model::captured::SUFFIX)
            || vramlab_core::model::captured::is_graph_text(&text)
        {
            let id = vramlab_core::model::hf::name_for_path(path);
            return Preset::from_captured(id.trim_end_matches(".vramlab-graph"), &text)
                .ctx(format!("captured graph {}", path.display()));
        }
        if let Some(p) = vramlab_core::model::hf::from_text_if_hf(
            &text,
            &vramlab_core::model::hf::name_for_path(path),
        ) {
            return p.ctx(format!("Hugging Face config {}", path.display()));
        }
        return Preset::from_json(&text).ctx(format!("preset file {}", path.display()));
    }
    let id = vocabulary::model_id(name).plain()?;
    if let Some(n) = &id.note {
        note(sink, n.clone());
    }
    find_builtin(id.value).plain()
}

/// Whether `id` asks for the GPU of this machine.
pub fn is_detected(id: &str) -> bool {
    names::normalize(id) == "detected"
}

/// A catalog GPU by id or name, or `detected`: what `detect` sees (else the default
/// catalog card, said as a note). The flag says whether the card was detected. An empty id
/// is refused (a partial-id match would pick any GPU).
pub fn find_gpu(id: &str, detect: Detect<'_>, sink: Sink<'_>) -> Result<(Gpu, bool), AnswerError> {
    if id.trim().is_empty() {
        bail!("gpu: empty id (see `vramlab presets` for the catalog)");
    }
    if is_detected(id) {
        if let Some(g) = detect() {
            return Ok((g, true));
        }
        let fallback = crate::gpus::find_gpu(DEFAULT_GPU).plain()?;
        note(
            sink,
            format!(
                "gpu `detected`: no GPU found through NVML here; planning for the catalog card {} ({})",
                fallback.id, fallback.name
            ),
        );
        return Ok((fallback, false));
    }
    let g = crate::gpus::gpu_by_name(id.trim(), &gpus::catalog()).plain()?;
    if let Some(n) = &g.note {
        note(sink, format!("{n} ({})", g.value.name));
    }
    Ok((g.value, false))
}

/// What the words (or a saved config file) resolve to.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub preset: Preset,
    pub config: TrainConfig,
    pub gpu: Gpu,
    pub budget: Budget,
    /// The model is not a built-in one (a file, or a custom model in the saved plan): it
    /// may reuse a built-in id for other weights, so exports name no Hub id for it.
    pub custom: bool,
}

impl TrainWords {
    /// Model, training config and budget from the words, or from the saved `config` file
    /// (`batch` still overrides the file's batch).
    pub fn resolve(
        &self,
        batch: Option<u64>,
        detect: Detect<'_>,
        sink: Sink<'_>,
    ) -> Result<Resolved, AnswerError> {
        if let Some(path) = &self.config {
            return self.resolve_saved(path, batch, detect, sink);
        }
        let Some(name) = self.model.as_deref() else {
            bail!("--model or --config is required");
        };
        let preset = match &self.preloaded {
            Some(p) => (**p).clone(),
            None => load_model(name, sink)?,
        };
        let custom = self.preloaded.is_some() || find_builtin(name).is_err();
        let Some(batch) = batch else {
            bail!("--batch is required");
        };
        let cfg = self.config(&preset, batch, sink)?;
        let (gpu, budget) = self.budget(detect, sink)?;
        Ok(Resolved {
            preset,
            config: cfg,
            gpu,
            budget,
            custom,
        })
    }

    fn resolve_saved(
        &self,
        path: &Path,
        batch: Option<u64>,
        detect: Detect<'_>,
        sink: Sink<'_>,
    ) -> Result<Resolved, AnswerError> {
        let bytes = vramlab_core::fsutil::read_bounded(path, FileKind::SavedPlan)
            .ctx("--config: reading saved plan")?;
        let doc = vramlab_core::export::VramlabConfig::from_bytes(&bytes)
            .ctx(format!("config {}", path.display()))?;
        let preset = doc.preset().plain()?;
        let mut cfg = doc.training;
        if let Some(b) = batch {
            cfg.batch = b;
        }
        if let Some(l) = &self.loop_shape {
            cfg.loop_shape = crate::parse::parse(l).plain()?;
        }
        if let Some(k) = &self.step {
            cfg.step = crate::parse::parse(k).plain()?;
        }
        if let Some(f) = self.moe_imbalance {
            cfg.moe_imbalance = f;
        }
        if let Some(n) = self.target_seq {
            cfg.target_seq = Some(n);
        }
        cfg.validate().plain()?;
        let gpu = match &doc.gpu_detected {
            // Saved against a detected card: plan for that card, on any machine.
            Some(card) => {
                note(
                    sink,
                    format!(
                        "gpu: {} was saved for the detected {} ({} MiB); planning for that card",
                        path.display(),
                        card.name,
                        card.memory_mib
                    ),
                );
                card.gpu(&gpus::catalog())
            }
            None => {
                find_gpu(&doc.gpu, detect, sink)
                    .ctx("gpu (in the config)")?
                    .0
            }
        };
        let budget = Budget {
            capacity: gpu.memory(),
            margin: doc.margin,
        };
        let custom = matches!(
            doc.model,
            vramlab_core::export::vramlab_file::ModelRef::Custom(_)
        );
        Ok(Resolved {
            preset,
            config: cfg,
            gpu,
            budget,
            custom,
        })
    }

    /// Model and training config (the batch comes elsewhere: 1 unless a saved config
    /// gives it).
    pub fn resolve_model(
        &self,
        detect: Detect<'_>,
        sink: Sink<'_>,
    ) -> Result<(Preset, TrainConfig), AnswerError> {
        let batch = if self.config.is_some() { None } else { Some(1) };
        let r = self.resolve(batch, detect, sink)?;
        Ok((r.preset, r.config))
    }

    /// The training config of `preset` at `batch` from the words.
    pub fn config(
        &self,
        preset: &Preset,
        batch: u64,
        sink: Sink<'_>,
    ) -> Result<TrainConfig, AnswerError> {
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
            precision: name_or_default(
                self.precision.as_deref(),
                captured.map_or(DEFAULT_PRECISION, |c| c.precision.as_str()),
                vocabulary::precision,
                sink,
            )?,
            optimizer: name_or_default(
                self.optimizer.as_deref(),
                captured.map_or(DEFAULT_OPTIMIZER, |c| c.optimizer.as_str()),
                vocabulary::optimizer,
                sink,
            )?,
            accum: self.accum,
            checkpointing: self.checkpointing || captured.is_some_and(|c| c.checkpointing),
            checkpoint_reentrant: self.checkpointing_reentrant,
            attention: name_or_default(
                Some(&self.attention),
                DEFAULT_ATTENTION,
                vocabulary::attention,
                sink,
            )?,
            allocator: AllocatorConfig {
                expandable_segments: self.expandable_segments,
                max_split_size_mb: self.max_split_size_mb,
            },
            loop_shape: match (&self.loop_shape, captured) {
                (Some(l), _) => crate::parse::parse(l).plain()?,
                (None, Some(c)) => crate::parse::parse(&c.loop_shape).plain()?,
                (None, None) => LoopShape::default(),
            },
            finetune: self.finetune()?,
            step: match &self.step {
                Some(k) => crate::parse::parse(k).plain()?,
                None => Default::default(),
            },
            distributed: self.dist.distributed()?,
            moe_imbalance: self.moe_imbalance.unwrap_or(1.0),
        };
        cfg.validate().plain()?;
        Ok(cfg)
    }

    /// `--finetune`, `--lora-rank`, `--lora-targets`, `--lora-dropout` (LoRA options need
    /// `--finetune lora` or `qlora`).
    fn finetune(&self) -> Result<FineTune, AnswerError> {
        let mut ft = FineTune::default();
        match self.finetune.as_deref() {
            None | Some("full") => {}
            Some(other) => ft.mode = crate::parse::parse(other).plain()?,
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
            ft.quant = crate::parse::parse(q).plain()?;
        }
        ft.double_quant = !self.no_double_quant;
        if let Some(r) = self.lora_rank {
            ft.lora_rank = r;
        }
        if let Some(t) = &self.lora_targets {
            ft.lora_targets = crate::parse::parse(t).plain()?;
        }
        if let Some(p) = self.lora_dropout {
            ft.lora_dropout = LoraDropout::new(p).plain()?;
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

    /// What the plan assumed because a setting was not given.
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
        default("--precision", self.precision.is_some(), DEFAULT_PRECISION);
        default("--optimizer", self.optimizer.is_some(), DEFAULT_OPTIMIZER);
        a
    }

    /// The GPU and the budget on it.
    pub fn budget(&self, detect: Detect<'_>, sink: Sink<'_>) -> Result<(Gpu, Budget), AnswerError> {
        let (gpu, _) =
            find_gpu(self.gpu.as_deref().unwrap_or(DEFAULT_GPU), detect, sink).ctx("--gpu")?;
        let budget = Budget {
            capacity: gpu.memory(),
            margin: self.margin,
        };
        Ok((gpu, budget))
    }

    /// The `vramlab fit …` command for the same model, training words and GPU (what
    /// `plan` and `max-batch` show when nothing fits).
    pub fn fit_command(&self, batch: Option<u64>) -> String {
        let mut parts = vec!["vramlab fit".to_string()];
        let mut flag = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                parts.push(format!("--{name} {}", quote(&v)));
            }
        };
        flag(
            "config",
            self.config.as_ref().map(|p| p.display().to_string()),
        );
        flag("model", self.model.clone());
        flag("seq", self.seq.map(|v| v.to_string()));
        flag("image", self.image.map(|v| v.to_string()));
        flag("batch", batch.map(|v| v.to_string()));
        flag("accum", (self.accum != 1).then(|| self.accum.to_string()));
        flag("precision", self.precision.clone());
        flag("optimizer", self.optimizer.clone());
        flag(
            "attention",
            (self.attention != DEFAULT_ATTENTION).then(|| self.attention.clone()),
        );
        flag("loop", self.loop_shape.clone());
        flag("finetune", self.finetune.clone());
        flag("lora-rank", self.lora_rank.map(|v| v.to_string()));
        flag("lora-targets", self.lora_targets.clone());
        flag("lora-dropout", self.lora_dropout.map(|v| v.to_string()));
        flag("quant", self.quant.clone());
        flag("freeze-blocks", self.freeze_blocks.map(|v| v.to_string()));
        flag(
            "max-split-size-mb",
            self.max_split_size_mb.map(|v| v.to_string()),
        );
        flag("gpu", self.gpu.clone());
        flag(
            "margin",
            (self.margin != DEFAULT_MARGIN).then(|| self.margin.to_string()),
        );
        if self.checkpointing {
            parts.push("--checkpointing".into());
        }
        if self.freeze_embeddings {
            parts.push("--freeze-embeddings".into());
        }
        if self.no_double_quant {
            parts.push("--no-double-quant".into());
        }
        if self.expandable_segments {
            parts.push("--expandable-segments".into());
        }
        parts.join(" ")
    }

    /// `vramlab plan`'s report: the words resolved at `batch`, `gpus=auto` searched, and
    /// the plan with everything that follows from it. `search_next_step`: run the fit search
    /// for its best combination when nothing fits (the CLI's text shows it); `timeline`:
    /// keep the allocated timeline in the JSON.
    pub fn plan_report(
        &self,
        batch: Option<u64>,
        timeline: bool,
        search_next_step: bool,
        detect: Detect<'_>,
        sink: Sink<'_>,
    ) -> Result<PlanReport, AnswerError> {
        self.plan_start(batch, timeline, search_next_step, detect, sink)?
            .finish()
            .plain()
    }

    /// The first part of [`TrainWords::plan_report`]: the words resolved, the plan and its
    /// verdict ([`PlanStart::finish`] gives the whole report).
    pub fn plan_start(
        &self,
        batch: Option<u64>,
        timeline: bool,
        search_next_step: bool,
        detect: Detect<'_>,
        sink: Sink<'_>,
    ) -> Result<PlanStart, AnswerError> {
        let Resolved {
            preset,
            config: cfg,
            gpu,
            budget,
            ..
        } = self.resolve(batch, detect, sink)?;
        let cfg = self.dist.resolve_auto(&preset, cfg, budget, sink)?;
        PlanStart::new(PlanRequest {
            preset: &preset,
            config: cfg,
            gpu,
            budget,
            assumed: self.assumed(),
            fit_command: self.fit_command(batch),
            search_next_step,
            timeline_in_json: timeline,
        })
        .plain()
    }

    /// `vramlab max-batch`'s report: the words resolved at batch 1, `gpus=auto` searched
    /// (the fewest GPUs where batch 1 fits), the warnings said, and the largest micro-batch.
    /// `target_batch`: an effective batch to reach with accumulation (check it with
    /// [`check_target_batch`] once the report is shown).
    pub fn max_batch_report(
        &self,
        target_batch: Option<u64>,
        detect: Detect<'_>,
        sink: Sink<'_>,
    ) -> Result<MaxBatchReport, AnswerError> {
        let Resolved {
            preset,
            config: cfg,
            gpu,
            budget,
            ..
        } = self.resolve(Some(1), detect, sink)?;
        let cfg = self.dist.resolve_auto(&preset, cfg, budget, sink)?;
        for w in warnings::for_config(&cfg, &gpu) {
            sink(Remark::Warning(w));
        }
        let planner = Planner::new(&preset, &cfg).plain()?;
        for w in &planner.unmodelled {
            sink(Remark::Warning(w.clone()));
        }
        MaxBatchReport::new(
            &planner,
            gpu,
            budget,
            target_batch.filter(|t| *t > 0),
            self.fit_command(None),
        )
        .plain()
    }
}

/// The target effective batch of `max-batch` against the largest micro-batch: at least 1,
/// and reachable within the accumulation limit. Nothing to check when nothing fits.
pub fn check_target_batch(
    report: &MaxBatchReport,
    target_batch: Option<u64>,
) -> Result<(), AnswerError> {
    let Outcome::Fits(l) = &report.outcome else {
        return Ok(());
    };
    if target_batch == Some(0) {
        bail!("--target-batch: must be at least 1");
    }
    if let Some((t, steps)) = l.target
        && steps > MAX_ACCUM
    {
        bail!(
            "--target-batch: {t} needs {steps} accumulation steps of micro-batch {}, more than the limit {MAX_ACCUM}",
            l.max_batch
        );
    }
    Ok(())
}

/// What a batch is, said when one is refused.
const BATCH_IS: &str = "the batch is the number of samples in one forward/backward pass \
                        (the micro-batch; --accum multiplies it into the effective batch), \
                        a whole number of at least 1";

/// A micro-batch of at least 1, explained when it is not (the CLI's `--batch`, the
/// bindings' `batch=`).
pub fn batch_of(n: i128) -> Result<u64, String> {
    match n {
        1.. => u64::try_from(n).map_err(|_| format!("{n} is too large; {BATCH_IS}")),
        _ => Err(format!("must be at least 1, got {n}: {BATCH_IS}")),
    }
}

/// `--batch` as typed: a whole number of at least 1.
pub fn parse_batch(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i128>() {
        Ok(n) => batch_of(n),
        Err(_) => Err(format!("`{s}` is not a whole number: {BATCH_IS}")),
    }
}

/// The name given (with a note when it was an alias) or the default.
fn name_or_default<T>(
    given: Option<&str>,
    default: &str,
    parse: fn(&str) -> Result<names::Resolved<T>, names::NameError>,
    sink: Sink<'_>,
) -> Result<T, AnswerError> {
    let r = parse(given.unwrap_or(default)).plain()?;
    if let Some(n) = &r.note {
        note(sink, n.clone());
    }
    Ok(r.value)
}

/// Single-quotes a shell word that needs it.
fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./,:=+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

impl DistWords {
    /// Whether a DeepSpeed knob of every stage was given.
    fn deepspeed_given(&self) -> bool {
        self.reduce_bucket_size.is_some()
            || self.allgather_bucket_size.is_some()
            || self.overlap_comm.is_some()
            || self.no_contiguous_gradients
    }

    /// Whether a DeepSpeed stage-3 knob was given.
    fn stage3_given(&self) -> bool {
        self.stage3_prefetch_bucket_size.is_some()
            || self.stage3_max_live_parameters.is_some()
            || self.stage3_max_reuse_distance.is_some()
            || self.stage3_param_persistence_threshold.is_some()
    }

    /// Whether `--gpus auto` was given.
    pub fn auto(&self) -> bool {
        self.gpus
            .as_deref()
            .is_some_and(|g| g.trim().eq_ignore_ascii_case("auto"))
    }

    /// The setup from the words (`--gpus auto` plans one GPU here; the search is
    /// [`DistWords::resolve_auto`]).
    pub fn distributed(&self) -> Result<Distributed, AnswerError> {
        let mut d = Distributed::default();
        let gpus = match self.gpus.as_deref() {
            None => None,
            Some(_) if self.auto() => Some(1),
            Some(g) => match g.trim().parse::<u32>() {
                Ok(n) if n >= 1 => Some(n),
                _ => bail!("--gpus: `{g}` is not a whole number of at least 1 or `auto`"),
            },
        };
        let given = gpus.is_some()
            || self.nodes.is_some()
            || self.strategy.is_some()
            || self.offload.is_some()
            || self.no_reshard_after_forward
            || self.fsdp_mixed_precision.is_some()
            || self.bucket_cap_mb.is_some()
            || self.gradient_as_bucket_view
            || self.deepspeed_given()
            || self.stage3_given();
        if !given {
            return Ok(d);
        }
        d.gpus_per_node = gpus.unwrap_or(1);
        d.nodes = self.nodes.unwrap_or(1);
        d.strategy = match &self.strategy {
            Some(s) => crate::parse::parse::<Strategy>(s).plain()?,
            None => Strategy::Fsdp2,
        };
        if let Some(o) = &self.offload {
            d.offload = crate::parse::parse::<Offload>(o).plain()?;
        }
        d.reshard_after_forward = !self.no_reshard_after_forward;
        if let Some(mp) = &self.fsdp_mixed_precision {
            d.mixed_precision = crate::parse::parse::<FsdpMixedPrecision>(mp).plain()?;
        }
        if let Some(b) = self.bucket_cap_mb {
            d.bucket_cap_mb = b;
        }
        d.gradient_as_bucket_view = self.gradient_as_bucket_view;
        ZeroKnobs {
            reduce_bucket_size: self.reduce_bucket_size,
            allgather_bucket_size: self.allgather_bucket_size,
            overlap_comm: self.overlap_comm,
            contiguous_gradients: Some(!self.no_contiguous_gradients),
            stage3_prefetch_bucket_size: self.stage3_prefetch_bucket_size,
            stage3_max_live_parameters: self.stage3_max_live_parameters,
            stage3_max_reuse_distance: self.stage3_max_reuse_distance,
            stage3_param_persistence_threshold: self.stage3_param_persistence_threshold,
        }
        .apply(&mut d);
        let fsdp_only = self.no_reshard_after_forward || self.fsdp_mixed_precision.is_some();
        if fsdp_only && d.strategy != Strategy::Fsdp2 {
            bail!(
                "--no-reshard-after-forward / --fsdp-mixed-precision: need --strategy fsdp2, not {}",
                d.strategy
            );
        }
        let ddp_only = self.bucket_cap_mb.is_some() || self.gradient_as_bucket_view;
        if ddp_only && !d.strategy.uses_ddp() {
            bail!(
                "--bucket-cap-mb / --gradient-as-bucket-view: need --strategy ddp or torch-zero1, not {}",
                d.strategy
            );
        }
        if self.deepspeed_given() && !d.strategy.is_deepspeed() {
            bail!(
                "--reduce-bucket-size / --allgather-bucket-size / --overlap-comm / --no-contiguous-gradients: need --strategy zero1, zero2 or zero3, not {}",
                d.strategy
            );
        }
        if self.stage3_given() && d.strategy != Strategy::Zero3 {
            bail!("--stage3-*: need --strategy zero3, not {}", d.strategy);
        }
        if self.allgather_bucket_size.is_some() && d.strategy == Strategy::Zero3 {
            bail!(
                "--allgather-bucket-size: stages 1/2 only (zero3 gathers with --stage3-prefetch-bucket-size)"
            );
        }
        d.validate().plain()?;
        Ok(d)
    }

    /// With `--gpus auto`: `cfg` with the fewest GPUs that fit its batch (an error when
    /// even `max_gpus` do not); otherwise `cfg` unchanged.
    pub fn resolve_auto(
        &self,
        preset: &Preset,
        cfg: TrainConfig,
        budget: Budget,
        sink: Sink<'_>,
    ) -> Result<TrainConfig, AnswerError> {
        if !self.auto() {
            return Ok(cfg);
        }
        let d = cfg.distributed;
        let per_node = 8;
        match multi_gpu::fewest_gpus(preset, &cfg, d.strategy, per_node, self.max_gpus, budget)
            .plain()?
        {
            Some(f) => {
                let mut c = cfg;
                c.distributed.nodes = f.nodes;
                c.distributed.gpus_per_node = f.gpus_per_node;
                note(
                    sink,
                    format!(
                        "--gpus auto: {} GPU(s) ({} node(s) × {}) is the fewest that fit batch {} with {}",
                        f.gpus,
                        f.nodes,
                        f.gpus_per_node,
                        cfg.batch,
                        d.strategy.label()
                    ),
                );
                Ok(c)
            }
            None => bail!(
                "--gpus auto: batch {} does not fit on up to {} GPUs with {} (try --checkpointing, a smaller --batch, --offload, or a larger --max-gpus)",
                cfg.batch,
                self.max_gpus,
                d.strategy.label()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_gpu() -> Option<Gpu> {
        None
    }

    #[test]
    fn defaults_and_aliases_resolve_with_notes_in_order() {
        let w = TrainWords {
            model: Some("gpt2".into()),
            precision: Some("fp16".into()),
            gpu: Some("detected".into()),
            seq: Some(128),
            ..TrainWords::default()
        };
        let mut said = Vec::new();
        let r = w
            .resolve(Some(2), &no_gpu, &mut |r| said.push(r))
            .expect("resolves");
        assert_eq!(r.config.batch, 2);
        assert_eq!(r.gpu.id, DEFAULT_GPU);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(matches!(&said[0], Remark::Note(n) if n.contains("amp-fp16")));
        assert!(matches!(&said[1], Remark::Note(n) if n.contains("detected")));
        let assumed: Vec<_> = w.assumed().iter().map(|a| a.setting).collect();
        assert_eq!(assumed, ["--optimizer"]);
    }

    #[test]
    fn errors_name_the_setting_and_the_closest_value() {
        let w = TrainWords {
            model: Some("gpt2".into()),
            optimizer: Some("adamww".into()),
            ..TrainWords::default()
        };
        let e = w
            .resolve(Some(1), &no_gpu, &mut |_| {})
            .expect_err("a typo");
        assert!(e.message().contains("adamw"), "{e}");
        assert!(!e.file);
        let w = TrainWords {
            model: Some("/nonexistent/dir/config.json".into()),
            ..TrainWords::default()
        };
        let e = w
            .resolve(Some(1), &no_gpu, &mut |_| {})
            .expect_err("no file");
        assert!(e.file, "{e}");
        assert!(
            e.message().starts_with("--model: reading preset file"),
            "{e}"
        );
        let w = TrainWords {
            model: Some("gpt2".into()),
            ..TrainWords::default()
        };
        let e = w.resolve(None, &no_gpu, &mut |_| {}).expect_err("no batch");
        assert_eq!(e.message(), "--batch is required");
    }

    #[test]
    fn the_fit_command_quotes_and_skips_defaults() {
        let w = TrainWords {
            model: Some("my model.json".into()),
            margin: 0.1,
            checkpointing: true,
            ..TrainWords::default()
        };
        assert_eq!(
            w.fit_command(Some(4)),
            "vramlab fit --model 'my model.json' --batch 4 --margin 0.1 --checkpointing"
        );
    }
}
