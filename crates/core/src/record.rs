//! What a bench run measured, as plain data with no GPU types: the events an engine
//! streams to the UI / CLI, one record per trial, and a whole run. Everything is
//! serialisable, so a run can be saved, opened again, compared, and fed to the GUI in
//! tests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::TrainConfig;
use crate::plan::inference::setting::dtype_name;
use crate::plan::inference::{InferPlanner, InferStep, KvCache};
use crate::units::Bytes;

/// Which engine measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vramlab's own synthetic training step on cudarc + cuBLAS.
    Native,
    /// The reference model in the user's PyTorch (`crates/device/runners/torch_runner.py`).
    Torch,
}

impl EngineKind {
    pub const ALL: [EngineKind; 2] = [EngineKind::Native, EngineKind::Torch];

    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Native => "native",
            EngineKind::Torch => "torch",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            EngineKind::Native => "Native (cudarc + cuBLAS)",
            EngineKind::Torch => "PyTorch (reference model)",
        }
    }
}

/// The GPU a run used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub total_bytes: Bytes,
    /// NVIDIA driver version, where known.
    #[serde(default)]
    pub driver: Option<String>,
    /// Library versions (CUDA, cuBLAS, PyTorch, …).
    #[serde(default)]
    pub versions: BTreeMap<String, String>,
}

/// What the planner predicted for a trial's batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    pub allocated: Bytes,
    pub reserved: Bytes,
    pub nvidia_smi: Bytes,
}

impl From<crate::plan::eval::Peaks> for Predicted {
    /// A plan's peaks at a batch, as a trial records them.
    fn from(p: crate::plan::eval::Peaks) -> Self {
        Predicted {
            allocated: p.allocated,
            reserved: p.reserved,
            nvidia_smi: p.nvidia_smi,
        }
    }
}

/// How a trial ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    Ran,
    /// CUDA out of memory (caught; the trial's memory was released).
    Oom {
        message: String,
    },
    Error {
        message: String,
    },
    Cancelled,
}

impl Outcome {
    pub fn ran(&self) -> bool {
        matches!(self, Outcome::Ran)
    }

    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Ran => "ran",
            Outcome::Oom { .. } => "OOM",
            Outcome::Error { .. } => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// One sample of device memory during a trial's step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemSample {
    /// Milliseconds since the trial started.
    pub t_ms: f64,
    /// Position in the planned step (event index of the measured step), where known.
    #[serde(default)]
    pub event: Option<u32>,
    /// Device memory this run holds beyond the baseline before the trial.
    pub measured: Bytes,
    /// The planner's allocated bytes at this point, where known.
    #[serde(default)]
    pub predicted_allocated: Option<Bytes>,
    /// The planner's reserved bytes at this point, where known.
    #[serde(default)]
    pub predicted_reserved: Option<Bytes>,
    /// Op or phase label ("layer3.2.conv1 backward").
    #[serde(default)]
    pub label: String,
}

/// One batch size tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// 0-based index within the run.
    pub index: u32,
    pub batch: u64,
    pub outcome: Outcome,
    /// `max_memory_allocated` (PyTorch) or the planned block bytes the native engine held.
    #[serde(default)]
    pub peak_allocated: Option<Bytes>,
    /// `max_memory_reserved` (PyTorch) or the segment bytes the native engine allocated.
    #[serde(default)]
    pub peak_reserved: Option<Bytes>,
    /// NVML memory of the process (what nvidia-smi shows), where known.
    #[serde(default)]
    pub process_bytes: Option<Bytes>,
    /// Peak device used memory (`cuMemGetInfo` / NVML) minus the baseline before the trial.
    #[serde(default)]
    pub device_used_peak: Option<Bytes>,
    /// Device used memory before the trial and after it was released.
    #[serde(default)]
    pub baseline_before: Option<Bytes>,
    #[serde(default)]
    pub baseline_after: Option<Bytes>,
    /// Median step time.
    #[serde(default)]
    pub step_ms: Option<f64>,
    /// FLOPs executed per step and the throughput achieved.
    #[serde(default)]
    pub flops_per_step: Option<f64>,
    #[serde(default)]
    pub tflops: Option<f64>,
    #[serde(default)]
    pub predicted: Option<Predicted>,
    #[serde(default)]
    pub timeline: Vec<MemSample>,
    /// How a multi-GPU world ran (absent: one GPU, no strategy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<WorldRun>,
    /// Every rank's measurement, rank 0 first (empty: one GPU). The trial's headline
    /// peaks are rank 0's, the rank the planner plans.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankPeak>,
}

/// How the ranks of a multi-GPU trial ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorldMode {
    /// One process per rank under `torchrun` (real NCCL), every rank measured.
    Torchrun,
    /// Rank 0 of the world alone on one GPU under PyTorch's fake process group
    /// (collectives are no-ops, their buffers are allocated).
    Emulated,
}

impl WorldMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WorldMode::Torchrun => "torchrun",
            WorldMode::Emulated => "emulated",
        }
    }
}

/// The world a trial ran: its size, the strategy and how the ranks ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldRun {
    pub mode: WorldMode,
    /// Ranks in the world (`nodes × gpus_per_node`).
    pub size: u64,
    /// The strategy's name (`fsdp2`, `ddp`, `torch-zero1`, …).
    pub strategy: String,
}

impl WorldRun {
    /// "world 4 · fsdp2 · torchrun: 4 processes on 4 GPUs, NCCL" or "… rank 0 of 4
    /// emulated on 1 GPU, collectives are no-ops".
    pub fn describe(&self) -> String {
        let how = match self.mode {
            WorldMode::Torchrun => {
                format!("torchrun: {n} processes on {n} GPUs, NCCL", n = self.size)
            }
            WorldMode::Emulated => format!(
                "rank 0 of {} emulated on 1 GPU, collectives are no-ops",
                self.size
            ),
        };
        format!("world {} · {} · {how}", self.size, self.strategy)
    }
}

/// What one rank measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPeak {
    pub rank: u32,
    /// `max_memory_allocated` on this rank (before the OOM where it ran out).
    #[serde(default)]
    pub peak_allocated: Option<Bytes>,
    #[serde(default)]
    pub peak_reserved: Option<Bytes>,
    /// NVML memory of this rank's process, where pynvml is installed.
    #[serde(default)]
    pub nvml_used: Option<Bytes>,
    /// Whether this rank ran out of memory.
    #[serde(default)]
    pub oom: bool,
}

impl Trial {
    /// A trial that did not run (OOM, error, cancel) with nothing measured yet.
    pub fn failed(index: u32, batch: u64, outcome: Outcome) -> Trial {
        Trial {
            index,
            batch,
            outcome,
            peak_allocated: None,
            peak_reserved: None,
            process_bytes: None,
            device_used_peak: None,
            baseline_before: None,
            baseline_after: None,
            step_ms: None,
            flops_per_step: None,
            tflops: None,
            predicted: None,
            timeline: Vec::new(),
            world: None,
            ranks: Vec::new(),
        }
    }

    /// The largest peak allocated over the ranks (rank 0's alone for one GPU or an
    /// emulated world).
    pub fn max_rank_allocated(&self) -> Option<Bytes> {
        self.ranks
            .iter()
            .filter_map(|r| r.peak_allocated)
            .max()
            .or(self.peak_allocated)
    }

    /// The largest peak reserved over the ranks.
    pub fn max_rank_reserved(&self) -> Option<Bytes> {
        self.ranks
            .iter()
            .filter_map(|r| r.peak_reserved)
            .max()
            .or(self.peak_reserved)
    }

    /// Signed error of the prediction in percent, `(predicted − measured) / measured`,
    /// for peak allocated, peak reserved and the process (nvidia-smi) figure.
    pub fn errors_pct(&self) -> TrialErrors {
        let p = self.predicted;
        let err = |pred: Option<Bytes>, meas: Option<Bytes>| match (pred, meas) {
            (Some(p), Some(m)) if m.0 > 0 && self.outcome.ran() => {
                Some((p.0 as f64 - m.0 as f64) / m.0 as f64 * 100.0)
            }
            _ => None,
        };
        TrialErrors {
            allocated: err(p.map(|p| p.allocated), self.peak_allocated),
            reserved: err(p.map(|p| p.reserved), self.peak_reserved),
            nvidia_smi: err(p.map(|p| p.nvidia_smi), self.process_bytes),
        }
    }

    /// Whether the device memory came back to its baseline (within `tolerance` bytes).
    pub fn memory_returned(&self, tolerance: Bytes) -> Option<bool> {
        match (self.baseline_before, self.baseline_after) {
            (Some(b), Some(a)) => Some(a.0 <= b.0.saturating_add(tolerance.0)),
            _ => None,
        }
    }
}

/// Prediction errors of one trial, in percent (`None` where not measured).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TrialErrors {
    pub allocated: Option<f64>,
    pub reserved: Option<f64>,
    pub nvidia_smi: Option<f64>,
}

/// A whole bench run: the trials and what they show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Layout version of this record.
    pub schema_version: u32,
    pub engine: EngineKind,
    pub device: DeviceInfo,
    pub model: String,
    pub config: TrainConfig,
    /// Sequence length or image side.
    pub size: u64,
    /// Unix seconds at the start.
    pub started_unix: u64,
    pub vramlab_version: String,
    /// The planner's max batch for this device (the sweep's seed), where computed.
    #[serde(default)]
    pub predicted_max_batch: Option<u64>,
    pub trials: Vec<Trial>,
    /// How the run ended early, if it did (cancelled, engine failure).
    #[serde(default)]
    pub stopped: Option<String>,
    /// The inference call measured (`--step generate|prefill`); absent for a training step,
    /// which `config` describes (an inference run's `config` holds only its allocator
    /// settings and `size` its prompt length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference: Option<Box<InferRun>>,
}

/// The inference call a run measured, as the run record keeps it (the planner's
/// [`crate::plan::inference::InferPlanner`] is rebuilt from the model and these words).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferRun {
    pub step: InferStep,
    /// Prompt tokens per sequence.
    pub prompt: u64,
    /// Tokens generated per sequence (0 for a prefill).
    pub new_tokens: u64,
    /// The weights' dtype: `bf16`, `fp16` or `fp32`.
    pub precision: String,
    /// `sdpa` or `eager`.
    pub attention: String,
    pub kv_cache: KvCache,
    /// The decoding of a `generate` that is not greedy ("multinomial sampling, top-k 50").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoding: Option<String>,
    /// bitsandbytes weights ("nf4, double quantization").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<String>,
    /// accelerate's `device_map="auto"`: where the modules went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_map: Option<String>,
}

impl InferRun {
    /// What `planner` plans, as a run records it.
    pub fn of(planner: &InferPlanner) -> InferRun {
        let c = &planner.config;
        InferRun {
            step: c.step,
            prompt: c.prompt,
            new_tokens: c.new_tokens,
            precision: dtype_name(c.dtype).to_string(),
            attention: c.attention.as_str().to_string(),
            kv_cache: c.kv_cache,
            decoding: (!planner.decoding.is_greedy()).then(|| planner.decoding.describe()),
            quant: planner
                .quant
                .as_ref()
                .map(|q| crate::plan::inference::quant::describe(q.quant)),
            device_map: planner.placement.as_ref().map(|p| p.summary()),
        }
    }

    /// "generate · prompt 128 + 8 new · bf16 · dynamic KV cache" (and the quantization,
    /// decoding or device map where set).
    pub fn describe(&self) -> String {
        let mut parts = vec![self.step.as_str().to_string()];
        match self.step {
            InferStep::Generate => {
                parts.push(format!("prompt {} + {} new", self.prompt, self.new_tokens));
            }
            InferStep::Prefill => parts.push(format!("prompt {}", self.prompt)),
        }
        parts.push(self.precision.clone());
        parts.push(self.attention.clone());
        if self.step == InferStep::Generate {
            parts.push(format!("{} KV cache", self.kv_cache.as_str()));
        }
        parts.extend(self.decoding.clone());
        parts.extend(self.quant.clone());
        parts.extend(self.device_map.as_ref().map(|d| format!("device_map {d}")));
        parts.join(" · ")
    }
}

/// Layout version of [`Run`].
pub const RUN_SCHEMA_VERSION: u32 = 1;

impl Run {
    /// The largest batch that ran.
    pub fn max_batch_ran(&self) -> Option<u64> {
        self.trials
            .iter()
            .filter(|t| t.outcome.ran())
            .map(|t| t.batch)
            .max()
    }

    /// The smallest batch that ran out of memory.
    pub fn first_oom(&self) -> Option<u64> {
        self.trials
            .iter()
            .filter(|t| matches!(t.outcome, Outcome::Oom { .. }))
            .map(|t| t.batch)
            .min()
    }

    /// Short title for lists: "gpt2 · amp-bf16 · native · H200".
    pub fn title(&self) -> String {
        let what = match &self.inference {
            Some(i) => format!("{} {}", i.step.as_str(), i.precision),
            None => self.config.precision.as_str().to_string(),
        };
        format!(
            "{} · {what} · {} · {}",
            self.model,
            self.engine.as_str(),
            self.device.name
        )
    }
}

/// What an engine streams while it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BenchEvent {
    /// The engine is up on this device; `planned` trials (None for a sweep).
    Started {
        engine: EngineKind,
        device: DeviceInfo,
        planned: Option<u32>,
    },
    /// Trial `trial` (batch `batch`) entered `phase`; `fraction` of the trial done.
    Progress {
        trial: u32,
        batch: u64,
        phase: String,
        fraction: f32,
    },
    /// A memory sample of the running trial.
    Sample { trial: u32, sample: MemSample },
    /// A trial finished (ran, OOM, error or cancelled).
    TrialDone { trial: Trial },
    /// The run is over; the full record.
    Finished { run: Run },
    /// The engine could not start or failed outside a trial.
    Failed { message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist_trial() -> Trial {
        let mut t = Trial::failed(0, 4, Outcome::Ran);
        t.peak_allocated = Some(Bytes(3 << 30));
        t.world = Some(WorldRun {
            mode: WorldMode::Torchrun,
            size: 2,
            strategy: "fsdp2".into(),
        });
        t.ranks = vec![
            RankPeak {
                rank: 0,
                peak_allocated: Some(Bytes(3 << 30)),
                peak_reserved: Some(Bytes(4 << 30)),
                nvml_used: Some(Bytes(5 << 30)),
                oom: false,
            },
            RankPeak {
                rank: 1,
                peak_allocated: Some(Bytes(7 << 30)),
                peak_reserved: Some(Bytes(2 << 30)),
                nvml_used: None,
                oom: false,
            },
        ];
        t
    }

    #[test]
    fn per_rank_measurements_round_trip_and_give_the_max() {
        let t = dist_trial();
        let text = serde_json::to_string(&t).expect("serialise");
        assert!(text.contains("\"mode\":\"torchrun\""), "{text}");
        let back: Trial = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, t);
        assert_eq!(t.max_rank_allocated(), Some(Bytes(7 << 30)));
        assert_eq!(t.max_rank_reserved(), Some(Bytes(4 << 30)));
        let one = Trial::failed(1, 4, Outcome::Ran);
        let text = serde_json::to_string(&one).expect("serialise");
        assert!(!text.contains("ranks") && !text.contains("world"), "{text}");
    }

    #[test]
    fn a_run_file_from_before_the_ranks_still_loads() {
        let old = include_str!("../../../tests/data/bench/gpt2-torch.json");
        assert!(!old.contains("\"ranks\""));
        let run =
            crate::export::results::run_from_json(old.as_bytes()).expect("an old run file loads");
        assert!(!run.trials.is_empty());
        assert!(
            run.trials
                .iter()
                .all(|t| t.ranks.is_empty() && t.world.is_none())
        );
        let t = &run.trials[0];
        assert_eq!(t.max_rank_allocated(), t.peak_allocated);
    }

    #[test]
    fn the_world_says_how_it_ran() {
        let mut w = WorldRun {
            mode: WorldMode::Emulated,
            size: 4,
            strategy: "torch-zero1".into(),
        };
        assert_eq!(
            w.describe(),
            "world 4 · torch-zero1 · rank 0 of 4 emulated on 1 GPU, collectives are no-ops"
        );
        w.mode = WorldMode::Torchrun;
        assert!(w.describe().contains("torchrun: 4 processes on 4 GPUs"));
    }
}
