//! The planner's Inference mode (issue 29): what the user set ([`InferSettings`], persisted
//! with the planner state) and what follows from it ([`InferCache`]: the inference planner,
//! the largest batch and the answer at the current batch, rebuilt only when what they depend
//! on changes). The answers come from `vramlab_core::answer::inference`, as the CLI's
//! `plan --step generate|prefill` and `max-batch --step …` do.

use serde::{Deserialize, Serialize};

use super::background_job::BackgroundJob;
use vramlab_core::answer::inference::{self, InferAnswer};
use vramlab_core::answer::max_context::{MaxContext, Searched, Weights, max_context_weights};
use vramlab_core::model::Preset;
use vramlab_core::plan::config::{AllocatorConfig, Attention};
use vramlab_core::plan::finetune_mode::Quant;
use vramlab_core::plan::inference::device_map::MaxMemory;
use vramlab_core::plan::inference::quant::Int8Outliers;
use vramlab_core::plan::inference::{Decoding, InferConfig, InferPlanner, InferStep, KvCache};
use vramlab_core::plan::policy::QuantStorage;
use vramlab_core::plan::search::Budget;
use vramlab_words::max_memory_bytes;
use vramlab_words::parse_dtype;

/// Most points drawn for a step timeline, training's and inference's (min/max decimation
/// keeps the spikes).
pub const TIMELINE_POINTS: usize = 2400;

/// Training steps or inference calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum PlannerMode {
    #[default]
    Training,
    Inference,
}

/// The inference call the user set up (`vramlab plan --step …` flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct InferSettings {
    pub step: InferStep,
    /// Sequences in the batch.
    pub batch: u64,
    /// Prompt tokens (`--seq`).
    pub prompt: u64,
    /// `max_new_tokens` (generate only; a prefill generates nothing).
    pub new_tokens: u64,
    /// The dtype the weights are loaded in: `bf16`, `fp16` or `fp32`.
    pub precision: String,
    pub attention: Attention,
    /// Generate only (a plain forward builds its own `DynamicCache`).
    pub kv_cache: KvCache,
    /// Loaded with `device_map="auto"` (`--device-map auto`).
    pub device_map: bool,
    /// `max_memory[0]` (`--max-gpu-memory`), as accelerate reads it.
    pub max_gpu_memory: String,
    /// `max_memory["cpu"]` (`--max-cpu-memory`); empty: no CPU limit.
    pub max_cpu_memory: String,
    /// bitsandbytes weights (`--quant`): `None` loads every weight in the precision.
    pub quant: Option<Quant>,
    /// 4-bit double quantization (`bnb_4bit_use_double_quant`; `--no-double-quant` off).
    pub double_quant: bool,
}

impl Default for InferSettings {
    fn default() -> Self {
        InferSettings {
            step: InferStep::Generate,
            batch: 1,
            prompt: 512,
            new_tokens: 128,
            precision: "bf16".into(),
            attention: Attention::Sdpa,
            kv_cache: KvCache::Dynamic,
            device_map: false,
            max_gpu_memory: "1GiB".into(),
            max_cpu_memory: String::new(),
            quant: None,
            double_quant: true,
        }
    }
}

/// The precisions offered (inference loads the weights in one; no autocast).
pub const PRECISIONS: [&str; 3] = ["bf16", "fp16", "fp32"];

impl InferSettings {
    /// The weights' quantization, as `--quant` / `--no-double-quant` give it.
    pub fn weight_quant(&self) -> Option<QuantStorage> {
        self.quant.map(|quant| QuantStorage {
            quant,
            double_quant: quant.is_4bit() && self.double_quant,
        })
    }

    /// `max_memory` with the device map on (`None` without it).
    pub fn max_memory(&self) -> Result<Option<MaxMemory>, String> {
        if !self.device_map {
            return Ok(None);
        }
        let gpu =
            max_memory_bytes(&self.max_gpu_memory).map_err(|e| format!("max GPU memory: {e:#}"))?;
        let cpu = match self.max_cpu_memory.trim() {
            "" => None,
            c => Some(max_memory_bytes(c).map_err(|e| format!("max CPU memory: {e:#}"))?),
        };
        Ok(Some(MaxMemory { gpu, cpu }))
    }

    /// The core's config: a prefill takes no new tokens and no cache choice (as the CLI
    /// refuses them), so those settings are kept for generate but not planned.
    pub fn config(&self) -> Result<InferConfig, String> {
        let dtype = parse_dtype(&self.precision).map_err(|e| format!("{e:#}"))?;
        let generate = self.step == InferStep::Generate;
        let cfg = InferConfig {
            step: self.step,
            batch: self.batch,
            prompt: self.prompt,
            new_tokens: if generate { self.new_tokens } else { 0 },
            dtype,
            attention: self.attention,
            kv_cache: if generate {
                self.kv_cache
            } else {
                KvCache::Dynamic
            },
            allocator: AllocatorConfig::default(),
        };
        cfg.validate().map_err(|e| format!("{e:#}"))?;
        Ok(cfg)
    }
}

type Built = Result<InferPlanner, String>;
/// What a planner is built from: the model, the batch-1 config, the device map's budgets and
/// the weights' quantization.
type PlannerKey = (Preset, InferConfig, Option<MaxMemory>, Option<QuantStorage>);
/// The longest prompt at the current batch (`answer::max_context`, as `vramlab max-context`
/// answers it), searched on a worker thread: the search plans whole calls at a few dozen
/// lengths (about a second for a 1 B model in a release build), so the panel says
/// "searching…" until it arrives. Keyed by planner generation, batch and budget.
pub type ContextKey = (u64, u64, Budget);
pub type ContextJob = BackgroundJob<ContextKey, Result<MaxContext, String>>;
/// The largest batch, keyed by planner generation and budget.
type MaxBatchEntry = ((u64, Budget), Result<Option<u64>, String>);
/// The answer, keyed by planner generation, batch and budget.
type AnswerEntry = ((u64, u64, Budget), Result<InferAnswer, String>);

/// The inference planner and its answers, cached; see the module docs.
#[derive(Default)]
pub struct InferCache {
    /// The planner and what it was built for.
    planner: Option<(PlannerKey, Built)>,
    /// A failure before a planner (the model, or a setting).
    error: Option<String>,
    /// Bumped on every planner rebuild; keys the caches below.
    generation: u64,
    max_batch: Option<MaxBatchEntry>,
    answer: Option<AnswerEntry>,
    /// The longest prompt at the current batch, searched on a worker thread.
    pub context: ContextJob,
    /// What [`InferCache::longest_prompt`] asks for: the key, or why there is none.
    context_key: Option<ContextKey>,
}

impl InferCache {
    /// Brings the planner and answers up to date; cheap when nothing changed.
    pub fn refresh(&mut self, preset: Result<&Preset, &str>, s: &InferSettings, budget: Budget) {
        let (preset, cfg, mm) = match (preset, s.config(), s.max_memory()) {
            (Ok(p), Ok(c), Ok(m)) => (p, c, m),
            (Err(e), _, _) => return self.fail(format!("model: {e}")),
            (_, Err(e), _) | (_, _, Err(e)) => return self.fail(e),
        };
        self.error = None;
        self.context_key = None;
        let mut key_cfg = cfg;
        key_cfg.batch = 1;
        let quant = s.weight_quant();
        let fresh = self.planner.as_ref().is_some_and(|((p, c, m, q), _)| {
            *c == key_cfg && *m == mm && *q == quant && p == preset
        });
        if !fresh {
            let built = match mm {
                // quantized weights under a device map load only with
                // `llm_int8_enable_fp32_cpu_offload=True` (transformers refuses the offload
                // without it): the GUI plans them with it
                Some(m) => InferPlanner::with_device_map_quant(
                    preset,
                    &key_cfg,
                    &Decoding::default(),
                    m,
                    quant,
                    quant.is_some(),
                ),
                None => InferPlanner::with_quant(preset, &key_cfg, &Decoding::default(), quant),
            }
            .map_err(|e| format!("{e:#}"));
            self.planner = Some(((preset.clone(), key_cfg, mm, quant), built));
            self.generation += 1;
        }
        let Some((_, Ok(planner))) = &self.planner else {
            return;
        };
        let gen_ = self.generation;
        if self.max_batch.as_ref().map(|(k, _)| *k) != Some((gen_, budget)) {
            let m = inference::max_batch(planner, budget).map_err(|e| format!("{e:#}"));
            self.max_batch = Some(((gen_, budget), m));
        }
        if self.answer.as_ref().map(|(k, _)| *k) != Some((gen_, cfg.batch, budget)) {
            let answer = match self.max_batch.as_ref().map(|(_, m)| m) {
                Some(Ok(max)) => {
                    InferAnswer::with_max_batch(planner, cfg.batch, budget, *max, TIMELINE_POINTS)
                        .map_err(|e| format!("{e:#}"))
                }
                Some(Err(e)) => Err(e.clone()),
                None => Err("the largest batch was not searched".into()),
            };
            self.answer = Some(((gen_, cfg.batch, budget), answer));
        }
        let key = (gen_, cfg.batch, budget);
        if self.context.wants(&key) {
            let preset = preset.clone();
            let weights = match mm {
                Some(m) => match quant {
                    Some(q) => Weights::QuantDeviceMap {
                        max_memory: m,
                        quant: q,
                        fp32_cpu_offload: true,
                        outliers: Int8Outliers::None,
                    },
                    None => Weights::DeviceMap(m),
                },
                None => Weights::OnGpu {
                    quant,
                    outliers: Int8Outliers::None,
                },
            };
            self.context.start(key, move || {
                max_context_weights(
                    &preset,
                    &cfg,
                    &Decoding::default(),
                    weights,
                    Searched::Prompt,
                    budget,
                )
                .map_err(|e| format!("{e:#}"))
            });
        }
        self.context_key = Some(key);
    }

    /// The longest prompt at the current batch: `None` while it is searched.
    pub fn longest_prompt(&self) -> Option<&Result<MaxContext, String>> {
        let key = self.context_key?;
        match self.context.done() {
            Some((k, answer)) if *k == key => Some(answer),
            _ => None,
        }
    }

    fn fail(&mut self, e: String) {
        self.error = Some(e);
        self.context_key = None;
    }

    /// The answer at the current settings, or why there is none.
    pub fn result(&self) -> Result<&InferAnswer, &str> {
        if let Some(e) = &self.error {
            return Err(e);
        }
        match (&self.planner, &self.answer) {
            (Some((_, Err(e))), _) => Err(e),
            (Some((_, Ok(_))), Some((_, Ok(a)))) => Ok(a),
            (Some((_, Ok(_))), Some((_, Err(e)))) => Err(e),
            _ => Err("nothing planned yet"),
        }
    }

    /// The planner of the current settings (`None` while they are invalid or it failed):
    /// the Run tab benches it.
    pub fn planner(&self) -> Option<&InferPlanner> {
        if self.error.is_some() {
            return None;
        }
        match &self.planner {
            Some((_, Ok(p))) => Some(p),
            _ => None,
        }
    }

    /// The largest batch on the target GPU, where searched (the Run tab's sweep seed and
    /// proposed batches).
    pub fn max_batch(&self) -> Option<u64> {
        match &self.max_batch {
            Some((_, Ok(m))) if self.error.is_none() => *m,
            _ => None,
        }
    }

    /// How many times the inference planner was rebuilt (tests: a batch change must not).
    pub fn builds(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_plans_no_new_tokens_and_a_dynamic_cache() {
        let s = InferSettings {
            step: InferStep::Prefill,
            kv_cache: KvCache::Static,
            ..InferSettings::default()
        };
        let c = s.config().expect("config");
        assert_eq!((c.new_tokens, c.kv_cache), (0, KvCache::Dynamic));
        let bad = InferSettings {
            precision: "int8".into(),
            ..InferSettings::default()
        };
        let e = bad.config().expect_err("int8 is not a dtype here");
        assert!(e.contains("precision") && e.contains("bf16"), "{e}");
    }
}
