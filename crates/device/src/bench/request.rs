//! What a bench run is asked to do: the model, the settings, the engine and batches
//! ([`BenchRequest`]), and, for an inference call, its planner ([`InferBench`]). Data only:
//! [`super::runner`] runs training requests, [`super::infer`] inference ones.

use std::path::PathBuf;

use serde_json::Value;
use vramlab_core::model::Preset;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::inference::InferPlanner;
use vramlab_core::record::EngineKind;
use vramlab_core::sweep::BatchPlan;

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct BenchRequest {
    pub preset: Preset,
    /// Training settings; `batch` is ignored (the plan's batches are used).
    pub config: TrainConfig,
    pub engine: EngineKind,
    pub batches: BatchPlan,
    /// Timed steps per trial (after one warm-up step).
    pub steps: u32,
    /// Python interpreter for the PyTorch engine (default `python3`).
    pub python: Option<PathBuf>,
    /// CUDA device ordinal.
    pub device_index: usize,
    /// The planner's max batch for this device, recorded with the run.
    pub predicted_max_batch: Option<u64>,
    /// Extra environment for the PyTorch runner process (tests inject faults with it).
    pub runner_env: Vec<(String, String)>,
    /// An inference call (`--step generate|prefill`) instead of a training step: its
    /// planner predicts every trial and `infer_runner.py` measures it (PyTorch engine only;
    /// `config` then gives only the allocator settings).
    pub inference: Option<InferBench>,
}

/// An inference call to bench: the planner that predicts it (built once, by the caller,
/// from the same flags or fields as `vramlab plan --step …`) and, when the model came from
/// a config.json, that file's object (the runner builds it as is; else it rebuilds the
/// config from the preset, as `torch_runner.py` does for training).
#[derive(Debug, Clone)]
pub struct InferBench {
    pub planner: InferPlanner,
    pub hf_config: Option<Value>,
}

impl InferBench {
    pub fn new(planner: InferPlanner) -> InferBench {
        InferBench {
            planner,
            hf_config: None,
        }
    }
}
