//! Compares the planner with measured training steps (JSON lines written by
//! `crates/device/runners/torch_runner.py measure`).

use serde::{Deserialize, Serialize};

use crate::model::ModelError;
use crate::model::Preset;
use crate::model::preset::find_builtin;
use crate::plan::config::AllocatorConfig;
use crate::plan::distributed::{Distributed, Strategy, ZeroKnobs};
use crate::plan::finetune::{FineTune, LoraDropout, LoraTargets};
use crate::plan::{PlanError, Planner, TrainConfig};

/// A measured row the planner cannot predict.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error("measured model `{model}`: {source}")]
    Model { model: String, source: ModelError },
    #[error("measured model file {path}: {message}")]
    ModelFile { path: String, message: String },
    #[error("measured row {row}: {source}")]
    Plan { row: String, source: PlanError },
}

/// One measured configuration as the runner prints it.
#[derive(Debug, Clone, Deserialize)]
pub struct Measured {
    pub model: String,
    pub batch: u64,
    #[serde(default)]
    pub image: Option<u64>,
    #[serde(default)]
    pub seq: Option<u64>,
    /// Target (decoder) length of encoder-decoder rows (T5).
    #[serde(default)]
    pub target_seq: Option<u64>,
    pub precision: String,
    pub optimizer: String,
    #[serde(default = "one")]
    pub accum: u64,
    #[serde(default)]
    pub checkpointing: bool,
    /// `use_reentrant=True` checkpointing (the runner's `checkpoint_reentrant` key).
    #[serde(default)]
    pub checkpoint_reentrant: bool,
    #[serde(default = "sdpa")]
    pub attention: String,
    /// Training-loop shape; rows measured before the runner had it kept the output: plain.
    #[serde(default, rename = "loop")]
    pub loop_shape: crate::plan::config::LoopShape,
    /// `"eval"` / `"eval-grad"` for evaluation-step rows (absent: a training step).
    #[serde(default)]
    pub step: crate::plan::step_kind::StepKind,
    #[serde(default)]
    pub peak_allocated: Option<u64>,
    #[serde(default)]
    pub peak_reserved: Option<u64>,
    #[serde(default)]
    pub nvml_process_bytes: Option<u64>,
    #[serde(default)]
    pub allocated_start: Option<u64>,
    #[serde(default)]
    pub oom: Option<bool>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub cap_gib: Option<f64>,
    /// `"lora"` for peft LoRA rows (absent: full training).
    #[serde(default)]
    pub finetune: Option<String>,
    #[serde(default)]
    pub lora_rank: Option<u64>,
    #[serde(default)]
    pub lora_targets: Option<String>,
    /// LoRA dropout (absent: 0, peft's default, `nn.Identity`).
    #[serde(default)]
    pub lora_dropout: Option<f64>,
    /// peft's `get_nb_trainable_parameters()` on the measured model.
    #[serde(default)]
    pub trainable_params: Option<u64>,
    /// Distributed rows (`crates/device/runners/dist_runner.py`): the world this rank belongs to.
    #[serde(default)]
    pub gpus: Option<u32>,
    #[serde(default)]
    pub nodes: Option<u32>,
    /// `"fsdp2"` or `"ddp"` (absent: one GPU).
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub reshard_after_forward: Option<bool>,
    /// `"bf16"` / `"fp16"`, or null for no `MixedPrecisionPolicy`.
    #[serde(default)]
    pub fsdp_mixed_precision: Option<String>,
    #[serde(default)]
    pub bucket_cap_mb: Option<u64>,
    #[serde(default)]
    pub gradient_as_bucket_view: Option<bool>,
    /// DeepSpeed rows (`crates/device/runners/ds_runner.py`, strategy `zero1`-`zero3`): `"optimizer"` /
    /// `"params"` offload, and the `zero_optimization` knobs they set (absent: DeepSpeed's
    /// defaults).
    #[serde(default)]
    pub offload: Option<String>,
    #[serde(default)]
    pub reduce_bucket_size: Option<u64>,
    #[serde(default)]
    pub allgather_bucket_size: Option<u64>,
    #[serde(default)]
    pub overlap_comm: Option<bool>,
    #[serde(default)]
    pub contiguous_gradients: Option<bool>,
    #[serde(default)]
    pub stage3_prefetch_bucket_size: Option<u64>,
    #[serde(default)]
    pub stage3_max_live_parameters: Option<u64>,
    #[serde(default)]
    pub stage3_max_reuse_distance: Option<u64>,
    #[serde(default)]
    pub stage3_param_persistence_threshold: Option<u64>,
    /// QLoRA rows: `nf4`, `fp4` or `int8`.
    #[serde(default)]
    pub quant: Option<String>,
    /// QLoRA rows: bitsandbytes double quantization.
    #[serde(default)]
    pub double_quant: Option<bool>,
    /// Partial full fine-tuning rows (`lab/grids/freeze_configs.jsonl`).
    #[serde(default)]
    pub freeze_embeddings: bool,
    #[serde(default)]
    pub freeze_blocks: u32,
    /// Evaluation rows with the adapters merged (`merge_and_unload`).
    #[serde(default)]
    pub lora_merged: bool,
    /// Rows of a captured model (`tests/data/captured.jsonl`): its graph file, relative to
    /// `tests/data/captured/` (or a path with a `/`, as given).
    #[serde(default)]
    pub graph: Option<String>,
}

fn one() -> u64 {
    1
}

fn sdpa() -> String {
    "sdpa".into()
}

/// Measured next to predicted for one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub model: String,
    pub family: String,
    pub config: String,
    pub measured_allocated: u64,
    pub predicted_allocated: u64,
    pub measured_reserved: u64,
    pub predicted_reserved: u64,
    pub measured_nvml: Option<u64>,
    pub predicted_nvml: u64,
    /// Trainable parameters (rows that record them: fine-tuning).
    pub measured_trainable: Option<u64>,
    pub predicted_trainable: u64,
    /// The mode whose error band this row measures.
    #[serde(skip)]
    pub mode: Option<crate::plan::band::ModeKey>,
}

impl Row {
    /// Relative error of peak allocated, in percent (predicted − measured).
    pub fn allocated_error(&self) -> f64 {
        rel(self.predicted_allocated, self.measured_allocated)
    }

    pub fn reserved_error(&self) -> f64 {
        rel(self.predicted_reserved, self.measured_reserved)
    }

    pub fn nvml_error(&self) -> Option<f64> {
        self.measured_nvml.map(|m| rel(self.predicted_nvml, m))
    }
}

fn rel(pred: u64, meas: u64) -> f64 {
    if meas == 0 {
        return 0.0;
    }
    100.0 * (pred as f64 - meas as f64) / meas as f64
}

/// A setting as the runners and the capture write it: its saved name (the serde name of
/// its type), read as a format is read; the aliases users type are `vramlab-words`'.
fn saved<T: serde::de::DeserializeOwned>(field: &'static str, name: &str) -> Result<T, PlanError> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).map_err(|_| {
        PlanError::Field {
            field,
            reason: format!("unknown `{name}` (a saved name is expected)"),
        }
    })
}

impl Measured {
    /// The training config this row measured.
    pub fn config(&self) -> Result<TrainConfig, PlanError> {
        Ok(TrainConfig {
            batch: self.batch,
            size: self.image.or(self.seq),
            target_seq: self.target_seq,
            precision: saved("precision", &self.precision)?,
            optimizer: saved("optimizer", &self.optimizer)?,
            accum: self.accum,
            checkpointing: self.checkpointing,
            checkpoint_reentrant: self.checkpoint_reentrant,
            attention: saved("attention", &self.attention)?,
            allocator: AllocatorConfig::default(),
            loop_shape: self.loop_shape,
            finetune: self.finetune()?,
            step: self.step,
            distributed: self.distributed()?,
            // Measured MoE rows route with random-init routers: about uniform.
            moe_imbalance: 1.0,
        })
    }

    /// The multi-GPU setup this row measured (one GPU when the row has no strategy).
    pub fn distributed(&self) -> Result<Distributed, PlanError> {
        let mut d = Distributed::default();
        let Some(st) = &self.strategy else {
            return Ok(d);
        };
        d.strategy = saved::<Strategy>("strategy", st)?;
        d.gpus_per_node = self.gpus.unwrap_or(1);
        d.nodes = self.nodes.unwrap_or(1);
        if let Some(r) = self.reshard_after_forward {
            d.reshard_after_forward = r;
        }
        if let Some(mp) = &self.fsdp_mixed_precision {
            d.mixed_precision = saved("fsdp_mixed_precision", mp)?;
        }
        if let Some(b) = self.bucket_cap_mb {
            d.bucket_cap_mb = b;
        }
        if let Some(v) = self.gradient_as_bucket_view {
            d.gradient_as_bucket_view = v;
        }
        if let Some(o) = &self.offload {
            d.offload = saved("offload", o)?;
        }
        ZeroKnobs {
            reduce_bucket_size: self.reduce_bucket_size,
            allgather_bucket_size: self.allgather_bucket_size,
            overlap_comm: self.overlap_comm,
            contiguous_gradients: self.contiguous_gradients,
            stage3_prefetch_bucket_size: self.stage3_prefetch_bucket_size,
            stage3_max_live_parameters: self.stage3_max_live_parameters,
            stage3_max_reuse_distance: self.stage3_max_reuse_distance,
            stage3_param_persistence_threshold: self.stage3_param_persistence_threshold,
        }
        .apply(&mut d);
        d.validate()?;
        Ok(d)
    }

    /// The fine-tuning mode this row measured.
    pub fn finetune(&self) -> Result<FineTune, PlanError> {
        let mut ft = FineTune::default();
        match self.finetune.as_deref() {
            None | Some("full") => {}
            Some(other) => ft.mode = saved("finetune", other)?,
        }
        if let Some(q) = &self.quant {
            ft.quant = saved("quant", q)?;
        }
        if let Some(d) = self.double_quant {
            ft.double_quant = d;
        }
        if let Some(p) = self.lora_dropout {
            ft.lora_dropout = LoraDropout::new(p)?;
        }
        if let Some(r) = self.lora_rank {
            ft.lora_rank = r;
        }
        if let Some(t) = &self.lora_targets {
            ft.lora_targets = LoraTargets::from_saved(t)?;
        }
        ft.freeze_embeddings = self.freeze_embeddings;
        ft.freeze_blocks = self.freeze_blocks;
        ft.lora_merged = self.lora_merged;
        Ok(ft)
    }

    /// Whether this row holds a completed measurement.
    pub fn usable(&self) -> bool {
        self.error.is_none() && self.oom != Some(true) && self.peak_allocated.is_some()
    }

    pub fn describe(&self) -> String {
        let size = match (self.image, self.seq) {
            (Some(i), _) => format!("{i}px"),
            (_, Some(s)) => format!("seq {s}"),
            _ => String::new(),
        };
        let size = match self.target_seq {
            Some(t) => format!("{size}→{t}"),
            None => size,
        };
        let mut s = format!(
            "b{} {} {} {}",
            self.batch, size, self.precision, self.optimizer
        );
        if self.accum > 1 {
            s.push_str(&format!(" accum{}", self.accum));
        }
        if self.checkpointing {
            s.push_str(" ckpt");
        }
        if self.attention == "eager" {
            s.push_str(" eager");
        }
        match self.loop_shape {
            crate::plan::config::LoopShape::Trainer => s.push_str(" trainer-loop"),
            crate::plan::config::LoopShape::Lightning => s.push_str(" lightning-loop"),
            crate::plan::config::LoopShape::Plain => {}
        }
        if self.step.is_eval() {
            s.push_str(&format!(" {}-step", self.step));
        }
        if let Some(st) = &self.strategy {
            s.push_str(&format!(" {st}×{}", self.gpus.unwrap_or(1)));
            if let Some(mp) = &self.fsdp_mixed_precision {
                s.push_str(&format!(" mp-{mp}"));
            }
            if self.reshard_after_forward == Some(false) {
                s.push_str(" no-reshard");
            }
            if self.gradient_as_bucket_view == Some(true) {
                s.push_str(" bucket-view");
            }
        }
        if let Some(m @ ("lora" | "qlora")) = self.finetune.as_deref() {
            s.push_str(&format!(
                " {m} r{} {}",
                self.lora_rank.unwrap_or(8),
                self.lora_targets.as_deref().unwrap_or("attn")
            ));
            if let Some(p) = self.lora_dropout.filter(|&p| p != 0.0) {
                s.push_str(&format!(" dropout {p}"));
            }
        }
        if self.freeze_embeddings {
            s.push_str(" freeze-emb");
        }
        if self.freeze_blocks > 0 {
            s.push_str(&format!(" freeze-{}", self.freeze_blocks));
        }
        if self.checkpoint_reentrant {
            s.push_str(" reentrant");
        }
        if self.lora_merged {
            s.push_str(" merged");
        }
        if let Some(q) = &self.quant {
            s.push_str(&format!(" {q}"));
            if self.double_quant == Some(false) {
                s.push_str(" no-dq");
            }
        }
        s
    }
}

/// A model given by file in a measurement row: a Hugging Face `config.json` (named by its
/// file stem) or a preset document.
pub fn model_file(path: &str) -> Result<Preset, ValidateError> {
    let err = |message: String| ValidateError::ModelFile {
        path: path.to_string(),
        message,
    };
    let text = crate::fsutil::read_bounded_string(
        std::path::Path::new(path),
        crate::fsutil::FileKind::Model,
    )
    .map_err(|e| err(e.to_string()))?;
    let stem = std::path::Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(path);
    match crate::model::hf::from_text_if_hf(&text, stem) {
        Some(p) => p.map_err(|e| err(format!("{e:#}"))),
        None => Preset::from_json(&text).map_err(|e| err(e.to_string())),
    }
}

/// The training step a graph was captured with, at `batch` (its rows measured that step).
fn captured_config(
    c: &crate::model::captured::CapturedGraph,
    batch: u64,
) -> Result<TrainConfig, PlanError> {
    Ok(TrainConfig {
        batch,
        precision: saved("precision", &c.settings.precision)?,
        optimizer: saved("optimizer", &c.settings.optimizer)?,
        checkpointing: c.settings.checkpointing,
        loop_shape: saved("loop", &c.settings.loop_shape)?,
        ..TrainConfig::default()
    })
}

/// A captured graph named by a measured row.
fn captured_file(graph: &str) -> Result<Preset, ValidateError> {
    let path = if graph.contains('/') {
        graph.to_string()
    } else {
        format!("tests/data/captured/{graph}")
    };
    let text = std::fs::read_to_string(&path).map_err(|e| ValidateError::ModelFile {
        path: path.clone(),
        message: e.to_string(),
    })?;
    Preset::from_captured(graph, &text).map_err(|e| ValidateError::ModelFile {
        path,
        message: e.to_string(),
    })
}

/// Whether a file of `tests/data/` may feed the error bands: every `*.jsonl` except a
/// pre-registered held-out set (a name with `untouched`), which must stay unseen.
pub fn feeds_bands(file_name: &str) -> bool {
    file_name.ends_with(".jsonl") && !file_name.contains("untouched")
}

/// Every measured row of the `*.jsonl` files in `dir` ([`feeds_bands`]) replayed through
/// the planner, with the name of its file. Paths inside rows are relative to the repository
/// root, the working directory this runs in.
pub fn replay_dir(dir: &std::path::Path) -> Result<Vec<(String, Row)>, ValidateError> {
    replay_files(dir, feeds_bands)
}

/// [`replay_dir`] of the files in `dir` whose names `keep` takes (the untouched thirds, say).
pub fn replay_files(
    dir: &std::path::Path,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<(String, Row)>, ValidateError> {
    let io = |e: std::io::Error| ValidateError::ModelFile {
        path: dir.display().to_string(),
        message: e.to_string(),
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| keep(n))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let text = std::fs::read_to_string(dir.join(&name)).map_err(io)?;
        out.extend(
            compare(&parse_lines(&text))?
                .into_iter()
                .map(|r| (name.clone(), r)),
        );
    }
    Ok(out)
}

/// The rows of [`replay_dir`] as the error bands need them: file, mode, errors.
pub fn band_rows(rows: &[(String, Row)]) -> Vec<crate::plan::band::BandRow> {
    rows.iter()
        .filter_map(|(file, r)| {
            Some(crate::plan::band::BandRow {
                file: file.clone(),
                mode: r.mode.clone()?,
                allocated_error: r.allocated_error(),
                reserved_error: r.reserved_error(),
            })
        })
        .collect()
}

/// Parses runner output (JSON lines; lines that are not measurements are skipped).
pub fn parse_lines(text: &str) -> Vec<Measured> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Measured>(l).ok())
        .collect()
}

/// Predicts every usable measured row.
pub fn compare(rows: &[Measured]) -> Result<Vec<Row>, ValidateError> {
    let mut out = Vec::new();
    let mut cache: Vec<(String, Preset)> = Vec::new();
    for m in rows.iter().filter(|m| m.usable()) {
        // A captured model can have several graphs (precisions, loop shapes): keyed by file.
        let id = m.graph.as_ref().unwrap_or(&m.model);
        let preset = match cache.iter().find(|(k, _)| k == id) {
            Some((_, p)) => p.clone(),
            None => {
                let p = if let Some(g) = &m.graph {
                    captured_file(g)?
                } else if m.model.ends_with(".json") {
                    model_file(&m.model)?
                } else {
                    find_builtin(&m.model).map_err(|source| ValidateError::Model {
                        model: m.model.clone(),
                        source,
                    })?
                };
                cache.push((id.clone(), p.clone()));
                p
            }
        };
        let row = |source| ValidateError::Plan {
            row: format!("{} {}", m.model, m.describe()),
            source,
        };
        let cfg = match &preset.spec {
            crate::model::ModelSpec::Captured(c) => captured_config(c, m.batch).map_err(row)?,
            _ => m.config().map_err(row)?,
        };
        let planner = Planner::new(&preset, &cfg).map_err(row)?;
        let p = planner.peaks(cfg.batch).map_err(row)?;
        out.push(Row {
            model: m.model.clone(),
            family: crate::model::hf::family_label(&preset),
            config: m.describe(),
            measured_allocated: m.peak_allocated.unwrap_or(0),
            predicted_allocated: p.allocated.0,
            measured_reserved: m.peak_reserved.unwrap_or(0),
            predicted_reserved: p.reserved.0,
            measured_nvml: m.nvml_process_bytes,
            predicted_nvml: p.nvidia_smi.0,
            measured_trainable: m.trainable_params,
            predicted_trainable: planner.trainable,
            mode: Some(planner.mode.clone()),
        });
    }
    Ok(out)
}

/// Median of absolute values.
pub fn median_abs(v: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.into_iter().map(f64::abs).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Largest absolute value.
pub fn max_abs(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().map(f64::abs).fold(0.0, f64::max)
}

/// A markdown table of the rows plus a summary line.
pub fn markdown(rows: &[Row]) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut s = String::from(
        "| model | config | measured alloc (GiB) | predicted | error | measured reserved | predicted | error |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:+.1} % | {:.3} | {:.3} | {:+.1} % |\n",
            r.model,
            r.config,
            gib(r.measured_allocated),
            gib(r.predicted_allocated),
            r.allocated_error(),
            gib(r.measured_reserved),
            gib(r.predicted_reserved),
            r.reserved_error()
        ));
    }
    s.push_str(&format!("\n{}\n", summary(rows)));
    s
}

/// "N rows: allocated median …, worst …; reserved median …".
pub fn summary(rows: &[Row]) -> String {
    format!(
        "{} rows: peak allocated median |error| {:.2} %, worst {:.2} %; peak reserved median {:.2} %, worst {:.2} %",
        rows.len(),
        median_abs(rows.iter().map(Row::allocated_error)),
        max_abs(rows.iter().map(Row::allocated_error)),
        median_abs(rows.iter().map(Row::reserved_error)),
        max_abs(rows.iter().map(Row::reserved_error)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepspeed_runner_rows_carry_their_zero_knobs() {
        let path = format!(
            "{}/../../lab/grids/ds_configs.jsonl",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("rows");
        let rows = parse_lines(&text);
        assert_eq!(
            rows.len(),
            text.lines().filter(|l| !l.trim().is_empty()).count()
        );
        let mut seen = [false; 4];
        for m in &rows {
            let d = m.config().expect("config").distributed;
            assert!(d.strategy.is_deepspeed(), "{}", m.describe());
            assert_eq!(Some(d.gpus_per_node), m.gpus);
            seen[0] |= d.prefetch_elems == 0;
            seen[1] |= d.max_reuse_distance == Some(0) && d.max_live_params == 10_000_000;
            seen[2] |= d.zero_bucket_elems == 50_000_000 && d.allgather_bucket_elems.is_some();
            seen[3] |= d.offload == crate::plan::distributed::Offload::Optimizer;
        }
        assert_eq!(seen, [true; 4]);
        let bad = r#"{"model":"gpt2","batch":1,"precision":"bf16","optimizer":"adamw","strategy":"zero2","gpus":2,"offload":"gpu"}"#;
        let e = parse_lines(bad)[0]
            .config()
            .expect_err("offload")
            .to_string();
        assert!(e.contains("offload"), "{e}");
    }

    #[test]
    fn median_and_max() {
        assert_eq!(median_abs([1.0, -3.0, 2.0]), 2.0);
        assert_eq!(median_abs([1.0, -3.0, 2.0, 10.0]), 2.5);
        assert_eq!(max_abs([1.0, -3.0]), 3.0);
        assert_eq!(median_abs(Vec::new()), 0.0);
    }

    #[test]
    fn skips_oom_and_errors() {
        let text = r#"{"model":"resnet18","batch":2,"image":64,"precision":"fp32","optimizer":"sgd","peak_allocated":100,"peak_reserved":200}
{"model":"resnet18","batch":2,"image":64,"precision":"fp32","optimizer":"sgd","oom":true}
{"model":"resnet18","batch":2,"image":64,"precision":"fp32","optimizer":"sgd","error":"x"}
not json"#;
        let rows = parse_lines(text);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows.iter().filter(|r| r.usable()).count(), 1);
    }

    /// Every row the lead will measure for reentrant checkpointing and merged adapters reads
    /// as a measured row and gives a valid config carrying its new setting.
    #[test]
    fn reentrant_and_merged_runner_rows_give_valid_configs() {
        for (file, key) in [
            ("reentrant_configs.jsonl", "checkpoint_reentrant"),
            ("merged_configs.jsonl", "lora_merged"),
        ] {
            let path = format!("{}/../../lab/grids/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).expect("rows");
            let mut with_key = 0;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let row: Measured = serde_json::from_str(line).expect(line);
                let cfg = row.config().expect(line);
                cfg.validate().expect(line);
                if (key == "checkpoint_reentrant" && cfg.checkpoint_reentrant)
                    || (key == "lora_merged" && cfg.finetune.lora_merged)
                {
                    with_key += 1;
                }
            }
            assert!(with_key >= 3, "{file}: {with_key} rows with {key}");
        }
    }
}
