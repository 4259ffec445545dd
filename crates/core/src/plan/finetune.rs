//! Fine-tuning modes: which parameters train, and the LoRA adapters peft 0.21 adds to the
//! graph, op by op as `lora.Linear.forward` runs them (unmerged, one adapter):
//!
//! ```text
//! result = base_layer(x)                       # frozen weight
//! x = x.to(lora_A.weight.dtype)                # _cast_input_dtype: fp32 adapters
//! result = result + lora_B(lora_A(dropout(x))) * scaling   # dropout p=0: nn.Identity
//! result = result.to(torch_result_dtype)
//! ```
//!
//! peft keeps the adapters in fp32 on a bf16/fp16 base (`autocast_adapter_dtype=True`).

use serde::{Deserialize, Serialize};

use super::PlanError;
use super::config::{DType, Precision};
use super::policy::ParamPolicy;
use crate::model::ir::{Elem, Graph, Node, Op, Param, Pointwise, Tensor};

/// Module names LoRA targets match (the last component of a layer name, as peft matches
/// `target_modules` entries).
pub const LORA_MODULES: [&str; 14] = [
    "c_attn",
    "c_proj",
    "c_fc",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "qkv_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "gate_up_proj",
    "query",
    "value",
];

/// peft's default targets (`LoraConfig()` without `target_modules`) of the families here:
/// GPT-2 `c_attn`; Llama, Mistral, Qwen `q_proj`, `v_proj`; Phi-3 `qkv_proj`; BERT
/// `query`, `value`.
const ATTN_DEFAULT: [&str; 6] = ["c_attn", "q_proj", "v_proj", "qkv_proj", "query", "value"];

/// Which layers get adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LoraTargets {
    /// peft's default targets for the model type (the attention projections it picks).
    #[default]
    Attn,
    /// peft's `"all-linear"`: every Linear / `Conv1D` except the output layer.
    AllLinear,
    /// Explicit module names: a bit per entry of [`LORA_MODULES`].
    Names(u16),
}

impl LoraTargets {
    fn mask_of(names: &[&str]) -> u16 {
        names
            .iter()
            .filter_map(|n| LORA_MODULES.iter().position(|m| m == n))
            .fold(0, |m, i| m | (1 << i))
    }

    /// Whether a Linear named `name` (full layer name) is a target.
    fn matches(self, name: &str) -> bool {
        let last = name.rsplit('.').next().unwrap_or(name);
        if matches!(last, "lm_head" | "decoder") {
            return false;
        }
        match self {
            LoraTargets::AllLinear => true,
            LoraTargets::Attn => ATTN_DEFAULT.contains(&last),
            LoraTargets::Names(m) => LORA_MODULES
                .iter()
                .position(|&n| n == last)
                .is_some_and(|i| m & (1 << i) != 0),
        }
    }
}

impl std::str::FromStr for LoraTargets {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        match s {
            "attn" => Ok(LoraTargets::Attn),
            "all-linear" => Ok(LoraTargets::AllLinear),
            _ => {
                let names: Vec<&str> = s
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect();
                if let Some(bad) = names.iter().find(|n| !LORA_MODULES.contains(n)) {
                    return Err(PlanError::Field {
                        field: "lora_targets",
                        reason: format!(
                            "unknown module `{bad}` (attn, all-linear or names among {})",
                            LORA_MODULES.join(", ")
                        ),
                    });
                }
                if names.is_empty() {
                    return Err(PlanError::Field {
                        field: "lora_targets",
                        reason: "no module named".into(),
                    });
                }
                Ok(LoraTargets::Names(LoraTargets::mask_of(&names)))
            }
        }
    }
}

impl std::fmt::Display for LoraTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoraTargets::Attn => f.write_str("attn"),
            LoraTargets::AllLinear => f.write_str("all-linear"),
            LoraTargets::Names(m) => {
                let names: Vec<&str> = LORA_MODULES
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| m & (1 << i) != 0)
                    .map(|(_, n)| *n)
                    .collect();
                f.write_str(&names.join(","))
            }
        }
    }
}

impl Serialize for LoraTargets {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LoraTargets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Which parameters train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FineTuneMode {
    /// Every parameter trains.
    #[default]
    Full,
    /// peft LoRA adapters train, the base model is frozen.
    Lora,
}

impl FineTuneMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FineTuneMode::Full => "full",
            FineTuneMode::Lora => "lora",
        }
    }
}

/// The fine-tuning part of a config; absent in older files, which means full training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FineTune {
    pub mode: FineTuneMode,
    /// LoRA rank `r`.
    pub lora_rank: u64,
    pub lora_targets: LoraTargets,
}

impl Default for FineTune {
    fn default() -> Self {
        FineTune {
            mode: FineTuneMode::Full,
            lora_rank: 8,
            lora_targets: LoraTargets::Attn,
        }
    }
}

/// Largest LoRA rank accepted.
pub const MAX_LORA_RANK: u64 = 1 << 16;

impl FineTune {
    pub fn is_full(&self) -> bool {
        self.mode == FineTuneMode::Full
    }

    pub fn validate(&self) -> Result<(), PlanError> {
        if self.mode == FineTuneMode::Lora && !(1..=MAX_LORA_RANK).contains(&self.lora_rank) {
            return Err(PlanError::Field {
                field: "lora_rank",
                reason: format!("{} is not between 1 and {MAX_LORA_RANK}", self.lora_rank),
            });
        }
        Ok(())
    }
}

/// The graph to simulate and its parameter policy under `ft`.
pub fn apply(g: Graph, ft: &FineTune, prec: Precision) -> Result<(Graph, ParamPolicy), PlanError> {
    match ft.mode {
        FineTuneMode::Full => {
            let p = ParamPolicy::full(&g, prec);
            Ok((g, p))
        }
        FineTuneMode::Lora => lora(g, ft.lora_rank, ft.lora_targets, prec),
    }
}

fn lora(
    mut g: Graph,
    rank: u64,
    targets: LoraTargets,
    prec: Precision,
) -> Result<(Graph, ParamPolicy), PlanError> {
    let base_params = g.params.len();
    let old = std::mem::take(&mut g.nodes);
    let mut nodes: Vec<Node> = Vec::with_capacity(old.len() * 2);
    let mut adapted = 0usize;
    for mut node in old {
        let Op::Linear {
            in_features,
            out_features,
        } = node.op
        else {
            nodes.push(node);
            continue;
        };
        let name = g.name(&node).to_string();
        if !targets.matches(&name) || out_features == 0 {
            nodes.push(node);
            continue;
        }
        adapted += 1;
        let result = node.output;
        let shape = g.tensors[result].clone();
        let rows = shape.per_sample / out_features;
        let x = node.inputs[0];
        let block = node.block;
        let tensor = |g: &mut Graph, per_sample: u64| {
            g.tensors.push(Tensor {
                per_sample,
                fixed: 0,
                elem: Elem::Float,
            });
            g.tensors.len() - 1
        };
        let base = tensor(&mut g, shape.per_sample);
        node.output = base;
        nodes.push(node);
        let mut push = |g: &mut Graph,
                        op: Op,
                        inputs: &[usize],
                        output: usize,
                        params: &[usize],
                        suffix: &str| {
            let start = g.names.len();
            g.names.push_str(&name);
            g.names.push_str(suffix);
            let at = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
            nodes.push(Node {
                op,
                inputs: inputs.into(),
                output,
                params: params.into(),
                block,
                name: at(start)..at(g.names.len()),
            });
        };
        let x_elems = g.tensors[x].per_sample;
        let xa = tensor(&mut g, x_elems);
        push(&mut g, Op::ToF32, &[x], xa, &[], ".lora_cast");
        g.params.push(Param {
            elems: rank * in_features,
            matrix: Some((rank, in_features)),
        });
        let pa = g.params.len() - 1;
        g.params.push(Param {
            elems: out_features * rank,
            matrix: Some((out_features, rank)),
        });
        let pb = g.params.len() - 1;
        let a = tensor(&mut g, rows * rank);
        push(
            &mut g,
            Op::Linear {
                in_features,
                out_features: rank,
            },
            &[xa],
            a,
            &[pa],
            ".lora_A",
        );
        let b = tensor(&mut g, shape.per_sample);
        push(
            &mut g,
            Op::Linear {
                in_features: rank,
                out_features,
            },
            &[a],
            b,
            &[pb],
            ".lora_B",
        );
        let s = tensor(&mut g, shape.per_sample);
        let pw = |f| Op::Pointwise { f, inplace: false };
        push(&mut g, pw(Pointwise::Scale), &[b], s, &[], ".lora_scaling");
        let sum = tensor(&mut g, shape.per_sample);
        push(
            &mut g,
            pw(Pointwise::Add),
            &[base, s],
            sum,
            &[],
            ".lora_add",
        );
        push(&mut g, Op::ToComputeDtype, &[sum], result, &[], ".lora_to");
    }
    g.nodes = nodes;
    if adapted == 0 {
        return Err(PlanError::Field {
            field: "lora_targets",
            reason: format!("`{targets}` matches no linear layer of this model"),
        });
    }
    let mut policy = ParamPolicy::full(&g, prec);
    for p in 0..base_params {
        policy.freeze(p);
    }
    for p in base_params..g.params.len() {
        policy.set_storage(p, DType::F32);
    }
    Ok((g, policy))
}
