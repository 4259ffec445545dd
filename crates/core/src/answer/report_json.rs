//! [`PlanReport`] as `plan --json` writes it: the plan's fields (the breakdown as an object
//! of category → bytes, the timeline only when asked), the GPU and budget, the verdict and
//! its band, the largest micro-batch, the remedies, the fit command when nothing fits, the
//! multi-GPU figures, what was assumed and the warnings. Every object's keys are in
//! alphabetical order, nested ones included (serde_json's map), as the CLI has always
//! written them.

use std::collections::BTreeMap;

use serde::ser::Error as _;
use serde::{Serialize, Serializer};

use super::per_rank::PerRankJson;
use super::report::{PlanReport, PlanStart};
use super::verdict::PlanBand;
use crate::plan::remedies::Remedy;
use crate::plan::{Phase, TimelinePoint, TrainConfig};
use crate::units::Bytes;

/// Every top-level key of `plan --json`, in the order written.
#[derive(Serialize)]
struct PlanJson<'a> {
    assumed: BTreeMap<&'a str, &'a str>,
    breakdown: BTreeMap<&'a str, Bytes>,
    config: &'a TrainConfig,
    cuda_context_bytes: Bytes,
    effective_batch: u64,
    error_band: &'a PlanBand,
    #[serde(skip_serializing_if = "Option::is_none")]
    fit_command: Option<&'a str>,
    fits: bool,
    gpu: &'a str,
    gpu_memory_bytes: Bytes,
    max_batch: Option<u64>,
    model: &'a str,
    nvidia_smi_bytes: Bytes,
    nvidia_smi_upper_bytes: Bytes,
    #[serde(skip_serializing_if = "is_zero")]
    paged_optimizer_bytes: Bytes,
    params: u64,
    peak_allocated_bytes: Bytes,
    peak_layer: &'a str,
    peak_phase: Phase,
    peak_reserved_bytes: Bytes,
    #[serde(flatten)]
    per_rank: Option<PerRankJson>,
    remedies: &'a [Remedy],
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeline: Option<&'a [TimelinePoint]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trainable_params: Option<u64>,
    usable_bytes: Bytes,
    warnings: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    weights_split: Option<crate::plan::WeightsSplit>,
}

fn is_zero(b: &Bytes) -> bool {
    *b == Bytes::ZERO
}

impl Serialize for PlanReport {
    /// `plan --json`. A report whose max-batch search or remedies failed has no JSON form
    /// (the CLI fails on those errors before it writes).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let p = &self.plan;
        let max_batch = self
            .max_batch
            .as_ref()
            .map_err(|e| S::Error::custom(format!("max batch: {e}")))?;
        let remedies = self
            .remedies
            .as_ref()
            .map_err(|e| S::Error::custom(format!("remedies: {e}")))?;
        let json = PlanJson {
            assumed: self
                .assumed
                .iter()
                .map(|a| (a.setting.trim_start_matches('-'), a.value))
                .collect(),
            breakdown: p
                .breakdown
                .iter()
                .map(|s| (s.category.as_str(), s.bytes))
                .collect(),
            config: &p.config,
            cuda_context_bytes: p.cuda_context_bytes,
            effective_batch: p.config.effective_batch(),
            error_band: &self.verdict.error_band,
            fit_command: self.next_step.as_ref().map(|n| n.fit_command.as_str()),
            fits: self.fits(),
            gpu: &self.gpu.id,
            gpu_memory_bytes: self.gpu.memory(),
            max_batch: *max_batch,
            model: &p.model,
            nvidia_smi_bytes: p.nvidia_smi_bytes,
            nvidia_smi_upper_bytes: self.verdict.nvidia_smi_upper_bytes,
            paged_optimizer_bytes: p.paged_optimizer_bytes,
            params: p.params,
            peak_allocated_bytes: p.peak_allocated_bytes,
            peak_layer: &p.peak_layer,
            peak_phase: p.peak_phase,
            peak_reserved_bytes: p.peak_reserved_bytes,
            per_rank: self.per_rank.as_ref().map(|r| r.json()),
            remedies,
            size: p.size,
            target_seq: p.target_seq,
            timeline: self.timeline_in_json.then_some(p.timeline.as_slice()),
            trainable_params: p.trainable_params,
            usable_bytes: self.budget.usable(),
            warnings: &self.warnings,
            weights_split: p.weights_split,
        };
        // Through serde_json's sorted map: nested objects (the config, the band, each
        // remedy) keep the alphabetical key order `plan --json` has always had.
        serde_json::to_value(&json)
            .map_err(S::Error::custom)?
            .serialize(serializer)
    }
}

impl PlanStart {
    /// The keys of `plan --json` that need neither the max-batch search nor the remedies
    /// (the peaks, the breakdown, the verdict and its band, the configuration, the GPU,
    /// what was assumed, the warnings), with the values the whole report writes.
    pub fn summary_json(&self) -> serde_json::Value {
        let p = &self.plan;
        serde_json::json!({
            "assumed": self
                .assumed
                .iter()
                .map(|a| (a.setting.trim_start_matches('-'), a.value))
                .collect::<BTreeMap<_, _>>(),
            "breakdown": p
                .breakdown
                .iter()
                .map(|s| (s.category.as_str(), s.bytes))
                .collect::<BTreeMap<_, _>>(),
            "config": p.config,
            "cuda_context_bytes": p.cuda_context_bytes,
            "effective_batch": p.config.effective_batch(),
            "error_band": self.verdict.error_band,
            "fits": self.verdict.fits,
            "gpu": self.gpu.id,
            "gpu_memory_bytes": self.gpu.memory(),
            "model": p.model,
            "nvidia_smi_bytes": p.nvidia_smi_bytes,
            "nvidia_smi_upper_bytes": self.verdict.nvidia_smi_upper_bytes,
            "params": p.params,
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "peak_layer": p.peak_layer,
            "peak_phase": p.peak_phase,
            "peak_reserved_bytes": p.peak_reserved_bytes,
            "size": p.size,
            "target_seq": p.target_seq,
            "trainable_params": p.trainable_params,
            "usable_bytes": self.budget.usable(),
            "warnings": self.warnings(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::{Assumed, PlanRequest};
    use super::*;
    use crate::model::preset::find_builtin;
    use crate::plan::distributed::{Distributed, Strategy};
    use crate::plan::gpus::card as find;
    use crate::plan::search::Budget;

    fn report_json(cfg: TrainConfig, timeline: bool) -> (crate::plan::Plan, serde_json::Value) {
        let preset = find_builtin("gpt2").expect("gpt2");
        let gpu = find("rtx-4090").expect("gpu");
        let budget = Budget {
            capacity: gpu.memory(),
            margin: 0.05,
        };
        let r = PlanReport::new(PlanRequest {
            preset: &preset,
            config: cfg,
            gpu,
            budget,
            assumed: vec![Assumed {
                setting: "--optimizer",
                value: "adamw",
            }],
            fit_command: "vramlab fit".into(),
            search_next_step: false,
            timeline_in_json: timeline,
        })
        .expect("report");
        let v = serde_json::to_value(&r).expect("json");
        (r.plan, v)
    }

    /// A field added to `Plan` must reach `plan --json` (the view lists every key).
    #[test]
    fn every_field_of_the_plan_is_in_the_json() {
        let cfg = TrainConfig {
            batch: 2,
            size: Some(128),
            ..TrainConfig::default()
        };
        let (plan, v) = report_json(cfg, true);
        let plan_json = serde_json::to_value(&plan).expect("plan json");
        let keys = plan_json.as_object().expect("an object");
        for (k, value) in keys {
            let got = v.get(k).unwrap_or_else(|| panic!("plan --json lacks {k}"));
            if k != "breakdown" {
                assert_eq!(got, value, "{k}");
            }
        }
        assert_eq!(v["assumed"]["optimizer"], "adamw");
        assert_eq!(v["effective_batch"], 2);
        assert!(v.get("world").is_none(), "one GPU: no per-rank fields");
        let (_, v) = report_json(cfg, false);
        assert!(v.get("timeline").is_none());
        assert!(v.get("fit_command").is_none(), "gpt2 at batch 2 fits");
    }

    /// The summary the Python bindings answer from before the search is the whole
    /// report's values (null where the report leaves an optional key out).
    #[test]
    fn the_summary_is_the_reports_values() {
        let preset = find_builtin("gpt2").expect("gpt2");
        let gpu = find("rtx-3060").expect("gpu");
        for (batch, finetune) in [(2, false), (64, false), (4, true)] {
            let mut config = TrainConfig {
                batch,
                size: Some(512),
                ..TrainConfig::default()
            };
            if finetune {
                config.finetune.mode = crate::plan::finetune::FineTuneMode::Lora;
            }
            let start = PlanStart::new(PlanRequest {
                preset: &preset,
                config,
                gpu: gpu.clone(),
                budget: Budget {
                    capacity: gpu.memory(),
                    margin: 0.05,
                },
                assumed: vec![Assumed {
                    setting: "--precision",
                    value: "amp-bf16",
                }],
                fit_command: "vramlab fit".into(),
                search_next_step: false,
                timeline_in_json: false,
            })
            .expect("start");
            let full = serde_json::to_value(start.finish().expect("report")).expect("json");
            let summary = start.summary_json();
            let keys = summary.as_object().expect("an object");
            assert!(keys.len() >= 20);
            for (k, v) in keys {
                let want = full.get(k).unwrap_or(&serde_json::Value::Null);
                assert_eq!(v, want, "batch {batch}: {k}");
            }
        }
    }

    #[test]
    fn a_multi_gpu_plan_has_its_per_rank_fields() {
        let cfg = TrainConfig {
            batch: 2,
            size: Some(128),
            distributed: Distributed::new(4, Strategy::Ddp),
            ..TrainConfig::default()
        };
        let (_, v) = report_json(cfg, false);
        assert_eq!(v["world"], 4);
        assert_eq!(v["strategy"], "ddp");
        assert_eq!(v["per_rank"], true);
        assert_eq!(v["global_batch"], 8);
        assert!(v["nccl_buffer_bytes"].as_u64().is_some_and(|b| b > 0));
    }
}
