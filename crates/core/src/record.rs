//! What a bench run measured, as plain data with no GPU types: the events an engine
//! streams to the UI / CLI, one record per trial, and a whole run. Everything is
//! serialisable, so a run can be saved, opened again, compared, and fed to the GUI in
//! tests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::TrainConfig;
use crate::units::Bytes;

/// Which engine measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vramlab's own synthetic training step on cudarc + cuBLAS.
    Native,
    /// The reference model in the user's PyTorch (`tools/torch_runner.py`).
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

    /// Parses `native` / `torch`.
    pub fn parse(s: &str) -> Option<EngineKind> {
        EngineKind::ALL.into_iter().find(|e| e.as_str() == s)
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
        }
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
        format!(
            "{} · {} · {} · {}",
            self.model,
            self.config.precision.as_str(),
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
