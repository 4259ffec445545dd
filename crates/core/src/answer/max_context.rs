//! "How long a context fits?" (`vramlab max-context`): the longest prompt (with the new
//! tokens fixed) — or, with the prompt fixed, the most new tokens — whose inference call at
//! a given batch runs on a GPU, by the same rule as `max-batch --step generate`
//! ([`InferPlanner::fits`]: the whole session simulated through the caching-allocator model,
//! capped at the usable memory minus the CUDA context).
//!
//! Every length is a new event list (the prompt and the decode steps change the shapes),
//! so each probe builds an [`InferPlanner`]. Peak memory grows with the length for these
//! decoders but not smoothly (the allocator rounds blocks to 2 MiB / 20 MiB segments and
//! reuses cached ones), so the search brackets by doubling, bisects, then checks the
//! [`NEIGHBOURS`] lengths above the boundary; if one of them fits, the search goes on from
//! it. The answer `L` fits and `L + 1 ..= L + NEIGHBOURS` do not (or pass the cap). The
//! cap is the model's `max_position_embeddings`: prompt + new tokens never exceed it.

use serde::Serialize;

use crate::model::Preset;
use crate::plan::inference::device_map::MaxMemory;
use crate::plan::inference::quant::Int8Outliers;
use crate::plan::inference::{
    DecoderShape, Decoding, InferConfig, InferPlan, InferPlanner, InferStep,
};
use crate::plan::policy::QuantStorage;
use crate::plan::search::Budget;
use crate::plan::{PlanError, eval};
use crate::units::Bytes;

/// Lengths above the bisection's boundary that are planned too (allocator rounding can
/// make a longer call fit where a shorter one did not).
pub const NEIGHBOURS: u64 = 4;

/// Which length is searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Searched {
    /// The prompt, with the new tokens fixed (`--new-tokens N`; 0 for a prefill).
    #[serde(rename = "prompt")]
    Prompt,
    /// The new tokens (`max_new_tokens`) of `generate`, with the prompt fixed (`--prompt P`).
    #[serde(rename = "new_tokens")]
    NewTokens,
}

impl Searched {
    pub fn as_str(self) -> &'static str {
        match self {
            Searched::Prompt => "prompt",
            Searched::NewTokens => "new_tokens",
        }
    }
}

/// What stops the length: the GPU's memory, or the model's `max_position_embeddings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Limit {
    #[serde(rename = "memory")]
    Memory,
    #[serde(rename = "max_position_embeddings")]
    MaxPositions,
}

/// The answer of `vramlab max-context`.
#[derive(Debug, Clone, Serialize)]
pub struct MaxContext {
    pub model: String,
    pub searched: Searched,
    /// The largest length that fits; `None` when even 1 token does not.
    pub max_length: Option<u64>,
    /// The largest length the model takes: `max_position_embeddings` minus the fixed part.
    pub length_cap: u64,
    pub max_position_embeddings: u64,
    /// What stops the length (`None` when nothing fits).
    pub limited_by: Option<Limit>,
    /// The plan at `max_length`.
    pub plan: Option<InferPlan>,
    /// `max_length + 1` when it is within the cap: it does not fit.
    pub next_length: Option<u64>,
    /// nvidia-smi bytes on this GPU at `max_length`: near the cap PyTorch frees cached
    /// segments and retries before it runs out, so this can be below the plan's uncapped
    /// `nvidia_smi_bytes` (which may exceed the usable memory; it runs, slower).
    pub nvidia_smi_on_gpu_bytes: Option<Bytes>,
    /// Lengths planned by the search.
    pub probes: u32,
}

impl MaxContext {
    /// What stops the length, in words (`None` when nothing fits): the model's
    /// `max_position_embeddings`, or memory — the next length does not fit, and where the
    /// answer's peak is.
    pub fn limit_words(&self) -> Option<String> {
        let l = self.max_length?;
        Some(match self.limited_by? {
            Limit::MaxPositions => format!(
                "limited by the model's max_position_embeddings {}, not by memory",
                self.max_position_embeddings
            ),
            Limit::Memory => format!(
                "limited by memory: {} does not fit (the peak of {l} is at the {})",
                l + 1,
                self.plan.as_ref().map_or("call", |p| p.peak_at.as_str())
            ),
        })
    }
}

/// Builds the event list of the call with the searched length set to `length`.
fn with_length(cfg: &InferConfig, searched: Searched, length: u64) -> InferConfig {
    let mut c = *cfg;
    match searched {
        Searched::Prompt => c.prompt = length,
        Searched::NewTokens => c.new_tokens = length,
    }
    c
}

/// The largest `searched` length of `cfg` (its other length fixed, its batch the batch)
/// that runs on `budget`'s GPU. Errors name the field: `batch` 0, a fixed length that
/// leaves no room under `max_position_embeddings` (`new_tokens` / `prompt`), a model the
/// inference planner does not model (`model`), `new_tokens` searched for a prefill (`step`).
pub fn max_context(
    preset: &Preset,
    cfg: &InferConfig,
    searched: Searched,
    budget: Budget,
) -> Result<MaxContext, PlanError> {
    max_context_decoding(preset, cfg, &Decoding::default(), searched, budget)
}

/// [`max_context`] for a `generate` call decoding with `dec` (greedy or sampling, as
/// `plan --do-sample` plans it).
pub fn max_context_decoding(
    preset: &Preset,
    cfg: &InferConfig,
    dec: &Decoding,
    searched: Searched,
    budget: Budget,
) -> Result<MaxContext, PlanError> {
    max_context_weights(preset, cfg, dec, Weights::DTYPE, searched, budget)
}

/// How the searched calls' weights are loaded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weights {
    /// On GPU 0: in the dtype (`quant` `None`) or quantized by bitsandbytes as `plan --quant`
    /// plans it, LLM.int8's outlier columns planned as `outliers`.
    OnGpu {
        quant: Option<QuantStorage>,
        outliers: Int8Outliers,
    },
    /// `device_map="auto"` under `max_memory` (`plan --device-map auto`): the placement
    /// depends on the budget only, so every probe has the same map.
    DeviceMap(MaxMemory),
    /// `device_map="auto"` with bitsandbytes-quantized linears (`plan --device-map auto
    /// --quant ... [--fp32-cpu-offload]`, [`InferPlanner::with_device_map_quant`]).
    QuantDeviceMap {
        max_memory: MaxMemory,
        quant: QuantStorage,
        fp32_cpu_offload: bool,
        outliers: Int8Outliers,
    },
}

impl Weights {
    /// The weights in the dtype, on GPU 0.
    pub const DTYPE: Weights = Weights::OnGpu {
        quant: None,
        outliers: Int8Outliers::None,
    };

    fn planner(
        self,
        preset: &Preset,
        c: &InferConfig,
        dec: &Decoding,
    ) -> Result<InferPlanner, PlanError> {
        match self {
            Weights::OnGpu { quant, outliers } => InferPlanner::with_quant(preset, c, dec, quant)
                .map(|p| p.with_int8_outliers(outliers)),
            Weights::DeviceMap(m) => InferPlanner::with_device_map(preset, c, dec, m),
            Weights::QuantDeviceMap {
                max_memory,
                quant,
                fp32_cpu_offload,
                outliers,
            } => InferPlanner::with_device_map_quant(
                preset,
                c,
                dec,
                max_memory,
                Some(quant),
                fp32_cpu_offload,
            )
            .map(|p| p.with_int8_outliers(outliers)),
        }
    }
}

/// [`max_context_decoding`] with the weights loaded as `weights` (quantized, or offloaded by
/// accelerate).
pub fn max_context_weights(
    preset: &Preset,
    cfg: &InferConfig,
    dec: &Decoding,
    weights: Weights,
    searched: Searched,
    budget: Budget,
) -> Result<MaxContext, PlanError> {
    let make = |c: &InferConfig| weights.planner(preset, c, dec);
    let shape = DecoderShape::of(preset)?;
    if cfg.batch == 0 {
        return Err(PlanError::Field {
            field: "batch",
            reason: "must be at least 1 sequence".into(),
        });
    }
    let max_pos = shape.max_positions;
    let (fixed, fixed_field) = match searched {
        Searched::Prompt => (cfg.new_tokens, "new_tokens"),
        Searched::NewTokens => {
            if cfg.step != InferStep::Generate {
                return Err(PlanError::Field {
                    field: "step",
                    reason: "only generate has new tokens to search; a prefill's length is \
                             the prompt (leave --prompt out)"
                        .into(),
                });
            }
            (cfg.prompt, "prompt")
        }
    };
    if fixed >= max_pos {
        let room = max_pos.saturating_sub(1);
        return Err(PlanError::Field {
            field: fixed_field,
            reason: format!(
                "{fixed} leaves no room under {}'s max_position_embeddings {max_pos} (at most \
                 {room}, so that 1 token of the searched {} fits)",
                preset.id,
                searched.as_str()
            ),
        });
    }
    let cap = max_pos - fixed;
    let mut probes = 0u32;
    let mut fits = |length: u64| -> Result<bool, PlanError> {
        probes += 1;
        let c = with_length(cfg, searched, length);
        make(&c)?.fits(budget, c.batch)
    };
    let found = search(&mut fits, cap)?;
    let mut on_gpu = None;
    let (plan, limited_by, next) = match found {
        None => (None, None, None),
        Some(l) => {
            let c = with_length(cfg, searched, l);
            let planner = make(&c)?;
            let plan = planner.plan(c.batch)?;
            let capped = eval::reserved_within(
                &planner.events,
                c.batch,
                c.allocator,
                budget.allocator_cap(planner.context),
            )?;
            on_gpu = capped.and_then(|r| r.checked_add(planner.context));
            let limit = if l == cap {
                Limit::MaxPositions
            } else {
                Limit::Memory
            };
            (Some(plan), Some(limit), (l < cap).then_some(l + 1))
        }
    };
    Ok(MaxContext {
        model: preset.id.clone(),
        searched,
        max_length: found,
        length_cap: cap,
        max_position_embeddings: max_pos,
        limited_by,
        plan,
        next_length: next,
        nvidia_smi_on_gpu_bytes: on_gpu,
        probes,
    })
}

/// The largest `x` in `1..=cap` with `fits(x)` such that none of `x + 1 ..= x +`
/// [`NEIGHBOURS`] (within the cap) fits, found from below: doubling, bisection, then the
/// neighbours; `None` when `fits(1)` is false.
pub fn search(
    fits: &mut dyn FnMut(u64) -> Result<bool, PlanError>,
    cap: u64,
) -> Result<Option<u64>, PlanError> {
    if cap == 0 || !fits(1)? {
        return Ok(None);
    }
    let mut lo = 1u64;
    loop {
        // bracket: the first doubling step from `lo` that does not fit (or passes the cap)
        let mut step = 1u64;
        let mut bad = None;
        while lo < cap {
            let probe = lo.saturating_add(step).min(cap);
            if fits(probe)? {
                lo = probe;
                step = step.saturating_mul(2);
            } else {
                bad = Some(probe);
                break;
            }
        }
        let Some(bad) = bad else {
            return Ok(Some(lo)); // the cap fits
        };
        lo = crate::plan::search::bisect(lo, bad, fits)?;
        // `lo` fits, `lo + 1` does not: the neighbours above
        let mut further = None;
        for x in (lo + 2)..=lo.saturating_add(1 + NEIGHBOURS).min(cap) {
            if fits(x)? {
                further = Some(x);
            }
        }
        match further {
            Some(x) => lo = x,
            None => return Ok(Some(lo)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: impl Fn(u64) -> bool, cap: u64) -> Option<u64> {
        let mut g = |x: u64| Ok(f(x));
        search(&mut g, cap).expect("search")
    }

    #[test]
    fn monotone_boundaries_and_the_cap() {
        for limit in [1u64, 2, 3, 7, 100, 1000, 4095, 4096, 131_071] {
            assert_eq!(run(|x| x <= limit, 131_072), Some(limit), "{limit}");
        }
        assert_eq!(run(|_| true, 8192), Some(8192));
        assert_eq!(run(|_| true, 1), Some(1));
        assert_eq!(run(|_| false, 8192), None);
        assert_eq!(run(|_| true, 0), None);
    }

    /// A hole just above the boundary (allocator rounding) is crossed; one further than the
    /// neighbours is not.
    #[test]
    fn neighbours_cross_a_small_hole() {
        assert_eq!(run(|x| x <= 1000 || x == 1003, 4096), Some(1003));
        assert_eq!(
            run(|x| x <= 1000 || x == 1000 + 2 + NEIGHBOURS, 4096),
            Some(1000)
        );
    }
}
