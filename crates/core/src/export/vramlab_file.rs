//! The `.vramlab.json` document: model, training settings, GPU, margin and the prediction
//! that was made for them, with a schema version.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::Preset;
use crate::model::preset::find_builtin;
use crate::plan::{Plan, TrainConfig};

/// Version of the document layout this build writes and reads (older ones are migrated on
/// load, see [`migrate`]).
///
/// - 1: model, training (LoRA fine-tuning as `training.finetune`), gpu, margin, prediction.
/// - 2: `training.finetune` gains QLoRA (`mode: "qlora"`, `quant`, `double_quant`), the
///   optimizers `adamw-8bit`, `paged-adamw-8bit`, `paged-adamw`.
pub const SCHEMA_VERSION: u64 = 2;
/// Largest document accepted (a config is a few KiB; anything huge is not one).
pub const MAX_BYTES: usize = 4 << 20;

/// A saved plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VramlabConfig {
    pub schema_version: u64,
    /// A built-in preset id, or a full preset document for custom models.
    pub model: ModelRef,
    pub training: TrainConfig,
    /// GPU catalog id, or "detected": the GPU of the machine that plans it (with
    /// `gpu_detected`, the card it was saved on).
    pub gpu: String,
    /// The card NVML reported when the plan was saved against the detected GPU: a file
    /// with it plans for that card everywhere. `gpu` then names the catalog card of the same
    /// name or memory, or is "detected" when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_detected: Option<DetectedCard>,
    /// Fraction of GPU memory kept free.
    pub margin: f64,
    /// What vramlab predicted when the file was written (documentation; ignored on load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
}

/// A GPU as NVML reported it when the plan was saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectedCard {
    pub name: String,
    /// Total memory in MiB as NVML reports it.
    pub memory_mib: u64,
}

impl DetectedCard {
    /// The card as a planning target, with the driver's idle reservation from the catalog.
    pub fn gpu(&self, catalog: &[crate::plan::gpus::Gpu]) -> crate::plan::gpus::Gpu {
        crate::plan::gpus::Gpu::detected(
            &self.name,
            crate::units::Bytes(self.memory_mib.saturating_mul(1 << 20)),
            catalog,
        )
    }
}

/// The model of a config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelRef {
    Preset(String),
    Custom(Value),
}

/// The numbers promised when the file was saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prediction {
    pub vramlab_version: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub nvidia_smi_bytes: u64,
    pub breakdown: std::collections::BTreeMap<String, u64>,
}

/// A config file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("not a vramlab config: {0}")]
    Malformed(String),
    #[error(
        "schema_version {found} is newer than this vramlab understands ({SCHEMA_VERSION}); update vramlab"
    )]
    TooNew { found: u64 },
    #[error("the file is larger than {MAX_BYTES} bytes")]
    TooLarge,
    #[error("model: {0}")]
    Model(#[from] crate::model::ModelError),
    /// A custom model document that is not a valid preset (the path names its field).
    #[error("model.custom: {0}")]
    Custom(crate::model::ModelError),
    #[error("training: {0}")]
    Training(#[from] crate::plan::PlanError),
}

impl VramlabConfig {
    /// A config for `preset` (built-in when `custom` is false) with the plan's prediction.
    pub fn new(
        preset: &Preset,
        custom: bool,
        training: TrainConfig,
        gpu: &str,
        margin: f64,
        plan: Option<&Plan>,
    ) -> Self {
        let model = if custom {
            ModelRef::Custom(serde_json::to_value(preset).unwrap_or(Value::Null))
        } else {
            ModelRef::Preset(preset.id.clone())
        };
        VramlabConfig {
            schema_version: SCHEMA_VERSION,
            model,
            training,
            gpu: gpu.to_string(),
            gpu_detected: None,
            margin,
            prediction: plan.map(|p| Prediction {
                vramlab_version: env!("CARGO_PKG_VERSION").to_string(),
                peak_allocated_bytes: p.peak_allocated_bytes.0,
                peak_reserved_bytes: p.peak_reserved_bytes.0,
                nvidia_smi_bytes: p.nvidia_smi_bytes.0,
                breakdown: p
                    .breakdown
                    .iter()
                    .map(|s| (s.category.clone(), s.bytes.0))
                    .collect(),
            }),
        }
    }

    /// Parses a document (bytes, so that non-UTF-8 input gets a clear error).
    pub fn from_bytes(bytes: &[u8]) -> Result<VramlabConfig, ConfigError> {
        if bytes.len() > MAX_BYTES {
            return Err(ConfigError::TooLarge);
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|e| ConfigError::Malformed(format!("not UTF-8 text ({e})")))?;
        let v: Value = serde_json::from_str(text)
            .map_err(|e| ConfigError::Malformed(format!("not valid JSON: {e}")))?;
        let found = v
            .get("schema_version")
            .ok_or_else(|| ConfigError::Malformed("missing field `schema_version`".into()))?
            .as_u64()
            .ok_or_else(|| {
                ConfigError::Malformed("schema_version must be a positive integer".into())
            })?;
        if found > SCHEMA_VERSION {
            return Err(ConfigError::TooNew { found });
        }
        if found == 0 {
            return Err(ConfigError::Malformed(
                "schema_version must be at least 1".into(),
            ));
        }
        let v = migrate(v, found);
        let cfg: VramlabConfig = serde_path_to_error::deserialize(v)
            .map_err(|e| ConfigError::Malformed(format!("{}: {}", e.path(), e.inner())))?;
        if !(0.0..1.0).contains(&cfg.margin) {
            return Err(ConfigError::Malformed(format!(
                "margin must be in [0, 1), got {}",
                cfg.margin
            )));
        }
        cfg.training.validate()?;
        cfg.preset()?;
        Ok(cfg)
    }

    /// The model this config plans.
    pub fn preset(&self) -> Result<Preset, ConfigError> {
        Ok(match &self.model {
            ModelRef::Preset(id) => find_builtin(id)?,
            ModelRef::Custom(v) => Preset::from_value(v).map_err(ConfigError::Custom)?,
        })
    }

    /// The document, pretty-printed.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Brings a document of schema `found` to [`SCHEMA_VERSION`]. Version 1 → 2 adds only
/// optional fields (their defaults: no QLoRA, double quantization on), so the migration
/// sets the version and keeps everything else: a v1 file plans exactly as before.
fn migrate(mut v: Value, found: u64) -> Value {
    if found < 2
        && let Some(o) = v.as_object_mut()
    {
        o.insert("schema_version".into(), Value::from(SCHEMA_VERSION));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset::builtin_presets;
    use crate::plan::Planner;

    #[test]
    fn round_trip_gives_the_identical_plan_for_every_preset() {
        for preset in builtin_presets().expect("presets") {
            for custom in [false, true] {
                let training = TrainConfig {
                    batch: 2,
                    size: Some(if preset.input.is_tokens() { 128 } else { 224 }),
                    ..TrainConfig::default()
                };
                let before = Planner::new(&preset, &training)
                    .expect("planner")
                    .plan(2)
                    .expect("plan");
                let doc =
                    VramlabConfig::new(&preset, custom, training, "h200", 0.05, Some(&before))
                        .to_json();
                let back = VramlabConfig::from_bytes(doc.as_bytes()).expect("parses");
                let p = back.preset().expect("preset");
                let after = Planner::new(&p, &back.training)
                    .expect("planner")
                    .plan(2)
                    .expect("plan");
                assert_eq!(
                    after.peak_allocated_bytes, before.peak_allocated_bytes,
                    "{}",
                    preset.id
                );
                assert_eq!(
                    after.peak_reserved_bytes, before.peak_reserved_bytes,
                    "{}",
                    preset.id
                );
                assert_eq!(back.training, training);
            }
        }
    }

    #[test]
    fn bad_documents_name_the_problem() {
        let ok = VramlabConfig::new(
            &find_builtin("gpt2").expect("gpt2"),
            false,
            TrainConfig::default(),
            "h200",
            0.05,
            None,
        )
        .to_json();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![0xff, 0xfe, 0x00], "UTF-8"),
            (b"{".to_vec(), "not valid JSON"),
            (b"{}".to_vec(), "schema_version"),
            (
                ok.replace("\"schema_version\": 2", "\"schema_version\": 7")
                    .into_bytes(),
                "newer",
            ),
            (
                ok.replace("\"schema_version\": 2", "\"schema_version\": \"1\"")
                    .into_bytes(),
                "schema_version",
            ),
            (
                ok.replace("\"gpu\"", "\"gpuu\"").into_bytes(),
                "unknown field `gpuu`",
            ),
            (
                ok.replace("\"batch\": 8", "\"batch\": 0").into_bytes(),
                "batch",
            ),
            (
                ok.replace("\"batch\": 8", "\"batch\": 1e99").into_bytes(),
                "training.batch",
            ),
            (
                ok.replace("\"gpt2\"", "\"gpt9\"").into_bytes(),
                "unknown model",
            ),
            (
                ok.replace("\"margin\": 0.05", "\"margin\": 3.0")
                    .into_bytes(),
                "margin",
            ),
            (
                format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
                "not valid JSON",
            ),
            (vec![b' '; MAX_BYTES + 1], "larger"),
        ];
        for (bytes, needle) in cases {
            let err = VramlabConfig::from_bytes(&bytes)
                .expect_err(needle)
                .to_string();
            assert!(err.contains(needle), "{err:?} lacks {needle:?}");
        }
    }

    /// A version-1 file (a LoRA plan saved before QLoRA existed) still opens, is migrated
    /// to the current schema, and plans exactly what it planned; a v2 QLoRA document
    /// round-trips.
    #[test]
    fn v1_documents_migrate_to_v2() {
        let v1 = r#"{
  "schema_version": 1,
  "model": {"preset": "gpt2"},
  "training": {"batch": 4, "size": 256, "precision": "amp-bf16", "optimizer": "adam8bit",
               "accum": 2, "checkpointing": true, "attention": "sdpa",
               "allocator": {"expandable_segments": false, "max_split_size_mb": null},
               "loop": "trainer",
               "finetune": {"mode": "lora", "lora_rank": 16, "lora_targets": "all-linear"}},
  "gpu": "rtx-4090",
  "margin": 0.05,
  "prediction": {"vramlab_version": "0.1.0", "peak_allocated_bytes": 1,
                 "peak_reserved_bytes": 2, "nvidia_smi_bytes": 3,
                 "breakdown": {"parameters": 1}}
}"#;
        let doc = VramlabConfig::from_bytes(v1.as_bytes()).expect("v1 opens");
        assert_eq!(doc.schema_version, SCHEMA_VERSION);
        assert_eq!(doc.training.finetune.lora_rank, 16);
        assert_eq!(
            doc.training.finetune.mode,
            crate::plan::finetune::FineTuneMode::Lora
        );
        assert!(doc.training.finetune.double_quant);
        assert!(doc.to_json().contains("\"schema_version\": 2"));
        let qlora = TrainConfig {
            finetune: crate::plan::finetune::FineTune {
                mode: crate::plan::finetune::FineTuneMode::Qlora,
                quant: crate::plan::finetune::Quant::Fp4,
                double_quant: false,
                ..doc.training.finetune
            },
            optimizer: crate::plan::Optimizer::PagedAdamW8bit,
            ..doc.training
        };
        let v2 = VramlabConfig {
            training: qlora,
            ..doc.clone()
        }
        .to_json();
        assert!(v2.contains("\"mode\": \"qlora\"") && v2.contains("\"quant\": \"fp4\""));
        let back = VramlabConfig::from_bytes(v2.as_bytes()).expect("v2 opens");
        assert_eq!(back.training, qlora);
    }

    /// A partial full fine-tune (mode `full`, embeddings and blocks frozen) is written and
    /// read back; a plain full fine-tune writes no `finetune` at all (files stay as before).
    #[test]
    fn a_partial_full_finetune_round_trips() {
        let preset = builtin_presets()
            .expect("presets")
            .into_iter()
            .find(|p| p.id == "gpt2")
            .expect("gpt2");
        let plain = TrainConfig::default();
        let doc = VramlabConfig::new(&preset, false, plain, "h200", 0.05, None);
        assert!(!doc.to_json().contains("finetune"), "{}", doc.to_json());
        let frozen = TrainConfig {
            finetune: crate::plan::finetune::FineTune {
                freeze_embeddings: true,
                freeze_blocks: 6,
                ..Default::default()
            },
            ..plain
        };
        let json = VramlabConfig {
            training: frozen,
            ..doc
        }
        .to_json();
        assert!(json.contains("\"freeze_blocks\": 6"), "{json}");
        let back = VramlabConfig::from_bytes(json.as_bytes()).expect("opens");
        assert_eq!(back.training, frozen);
    }
}
