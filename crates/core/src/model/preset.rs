//! Model presets: JSON documents of builder parameters (see `presets/README.md`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::checks::{ModelError, check_positive};
use super::families::transformer::AttnImpl;
use super::families::{
    bert, convnext, decoder, efficientnet, encoder, gpt_neox, gpt2, llama, mobilenet, resnet,
    segmentation, t5, unet, vit,
};
use super::ir::Graph;

/// Family names accepted in a preset's `family` field.
pub const FAMILIES: &[&str] = &[
    "resnet",
    "efficientnet",
    "mobilenet_v3",
    "convnext",
    "vit",
    "deeplabv3",
    "fcn",
    "unet",
    "gpt2",
    "bert",
    "llama",
    "gpt_neox",
    "t5",
];

/// Builder parameters of one model family.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "family", content = "params", rename_all = "snake_case")]
pub enum ModelSpec {
    Resnet(resnet::ResnetParams),
    Efficientnet(efficientnet::EfficientnetParams),
    MobilenetV3(mobilenet::MobilenetParams),
    Convnext(convnext::ConvnextParams),
    Vit(vit::VitParams),
    Deeplabv3(segmentation::SegParams),
    Fcn(segmentation::SegParams),
    Unet(unet::UnetParams),
    Gpt2(gpt2::Gpt2Params),
    Bert(bert::BertParams),
    /// Boxed: the decoder options make it the largest variant by far.
    Llama(Box<llama::LlamaParams>),
    GptNeox(gpt_neox::GptNeoxParams),
    /// An encoder-decoder (`T5ForConditionalGeneration`): source length from the plan's
    /// size, target length from `target_seq`.
    T5(t5::T5Params),
    /// A training step captured by `runners/capture.py` (`*.vramlab-graph.json`): planned from
    /// its events, not built (see [`super::captured`]).
    Captured(Box<super::captured::CapturedGraph>),
}

/// What the model consumes per sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum InputSpec {
    /// Square RGB-like images.
    Image { image_size: u64, channels: u64 },
    /// Token sequences.
    Tokens { seq_len: u64 },
}

impl InputSpec {
    pub fn is_tokens(&self) -> bool {
        matches!(self, InputSpec::Tokens { .. })
    }
}

/// A named model: builder parameters plus the default input size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preset {
    pub id: String,
    pub display_name: String,
    /// What the parameter count is checked against (e.g. `torchvision.models.resnet50`).
    pub reference: String,
    pub input: InputSpec,
    #[serde(flatten)]
    pub spec: ModelSpec,
}

fn field<'a>(obj: &'a serde_json::Map<String, Value>, name: &str) -> Result<&'a Value, ModelError> {
    obj.get(name)
        .ok_or_else(|| ModelError::Malformed(format!("missing field `{name}`")))
}

fn string_field(obj: &serde_json::Map<String, Value>, name: &str) -> Result<String, ModelError> {
    field(obj, name)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| ModelError::Malformed(format!("field `{name}` must be a string")))
}

/// Deserialises the document's `section`; errors name the field inside it
/// (`params.layers[2]: invalid type ...`).
fn section<T: serde::de::DeserializeOwned>(section: &str, v: &Value) -> Result<T, ModelError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            section.to_string()
        } else {
            format!("{section}.{path}")
        };
        ModelError::Malformed(format!("{at}: {}", e.inner()))
    })
}

fn params<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, ModelError> {
    section("params", v)
}

/// The `input` section. Not through serde's internally tagged enum, which loses the path
/// of the field inside (`input.channels: invalid type` would read `input: invalid type`).
fn input_spec(v: &Value) -> Result<InputSpec, ModelError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Image {
        image_size: u64,
        channels: u64,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Tokens {
        seq_len: u64,
    }
    let mut rest = v
        .as_object()
        .cloned()
        .ok_or_else(|| ModelError::Malformed("input: must be a JSON object".into()))?;
    let kind = rest.remove("kind");
    let rest = Value::Object(rest);
    match kind.as_ref().map(|k| k.as_str()) {
        Some(Some("image")) => {
            let i: Image = section("input", &rest)?;
            Ok(InputSpec::Image {
                image_size: i.image_size,
                channels: i.channels,
            })
        }
        Some(Some("tokens")) => {
            let t: Tokens = section("input", &rest)?;
            Ok(InputSpec::Tokens { seq_len: t.seq_len })
        }
        Some(Some(other)) => Err(ModelError::Malformed(format!(
            "input.kind: unknown kind `{other}` (known: image, tokens)"
        ))),
        Some(None) => Err(ModelError::Malformed(
            "input.kind: must be a string (image or tokens)".into(),
        )),
        None => Err(ModelError::Malformed("input: missing field `kind`".into())),
    }
}

/// An optional string field: absent or `null` is `None`, another type is an error.
fn optional_string(
    obj: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<String>, ModelError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ModelError::Malformed(format!(
            "field `{name}` must be a string"
        ))),
    }
}

impl ModelSpec {
    /// Parses `params` for `family`.
    pub fn from_family(family: &str, p: &Value) -> Result<ModelSpec, ModelError> {
        Ok(match family {
            "resnet" => ModelSpec::Resnet(params(p)?),
            "efficientnet" => ModelSpec::Efficientnet(params(p)?),
            "mobilenet_v3" => ModelSpec::MobilenetV3(params(p)?),
            "convnext" => ModelSpec::Convnext(params(p)?),
            "vit" => ModelSpec::Vit(params(p)?),
            "deeplabv3" => ModelSpec::Deeplabv3(params(p)?),
            "fcn" => ModelSpec::Fcn(params(p)?),
            "unet" => ModelSpec::Unet(params(p)?),
            "gpt2" => ModelSpec::Gpt2(params(p)?),
            "bert" => ModelSpec::Bert(params(p)?),
            "llama" => ModelSpec::Llama(params(p)?),
            "gpt_neox" => ModelSpec::GptNeox(params(p)?),
            "t5" => ModelSpec::T5(params(p)?),
            "captured" => {
                return Err(ModelError::Invalid {
                    field: "family".into(),
                    reason: "a captured model is planned from its graph file, which a saved \
                             config does not hold: pass it with --model x.vramlab-graph.json"
                        .into(),
                });
            }
            other => {
                return Err(ModelError::UnknownFamily {
                    family: other.to_string(),
                    known: FAMILIES,
                });
            }
        })
    }

    /// The family name as written in presets.
    pub fn family(&self) -> &'static str {
        match self {
            ModelSpec::Resnet(_) => "resnet",
            ModelSpec::Efficientnet(_) => "efficientnet",
            ModelSpec::MobilenetV3(_) => "mobilenet_v3",
            ModelSpec::Convnext(_) => "convnext",
            ModelSpec::Vit(_) => "vit",
            ModelSpec::Deeplabv3(_) => "deeplabv3",
            ModelSpec::Fcn(_) => "fcn",
            ModelSpec::Unet(_) => "unet",
            ModelSpec::Gpt2(_) => "gpt2",
            ModelSpec::Bert(_) => "bert",
            ModelSpec::Llama(_) => "llama",
            ModelSpec::GptNeox(_) => "gpt_neox",
            ModelSpec::T5(_) => "t5",
            ModelSpec::Captured(_) => "captured",
        }
    }

    /// Checks every parameter; errors name the field.
    pub fn validate(&self) -> Result<(), ModelError> {
        match self {
            ModelSpec::Resnet(p) => p.validate(),
            ModelSpec::Efficientnet(p) => p.validate(),
            ModelSpec::MobilenetV3(p) => p.validate(),
            ModelSpec::Convnext(p) => p.validate(),
            ModelSpec::Vit(p) => p.validate(),
            ModelSpec::Deeplabv3(p) | ModelSpec::Fcn(p) => p.validate(),
            ModelSpec::Unet(p) => p.validate(),
            ModelSpec::Gpt2(p) => p.validate(),
            ModelSpec::Bert(p) => p.validate(),
            ModelSpec::Llama(p) => p.validate(),
            ModelSpec::GptNeox(p) => p.validate(),
            ModelSpec::T5(p) => p.validate(),
            ModelSpec::Captured(_) => Ok(()),
        }
    }
}

impl Preset {
    /// Parses a preset document; every problem names the field.
    pub fn from_json(text: &str) -> Result<Preset, ModelError> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Malformed(format!("not valid JSON: {e}")))?;
        Self::from_value(&v)
    }

    pub fn from_value(v: &Value) -> Result<Preset, ModelError> {
        let obj = v
            .as_object()
            .ok_or_else(|| ModelError::Malformed("a preset must be a JSON object".into()))?;
        if super::captured::is_graph_value(v) {
            let c = super::captured::CapturedGraph::from_value(v)?;
            return Ok(Self::captured(c.model.clone(), c));
        }
        for key in obj.keys() {
            if ![
                "id",
                "family",
                "display_name",
                "reference",
                "input",
                "params",
            ]
            .contains(&key.as_str())
            {
                return Err(ModelError::Malformed(format!("unknown field `{key}`")));
            }
        }
        let id = string_field(obj, "id")?;
        let family = string_field(obj, "family")?;
        let display_name = optional_string(obj, "display_name")?.unwrap_or_else(|| id.clone());
        let reference = optional_string(obj, "reference")?.unwrap_or_default();
        let input = input_spec(field(obj, "input")?)?;
        let spec = ModelSpec::from_family(&family, field(obj, "params")?)?;
        let preset = Preset {
            id,
            display_name,
            reference,
            input,
            spec,
        };
        preset.validate()?;
        Ok(preset)
    }

    /// Serialises back to the preset document format.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    fn validate(&self) -> Result<(), ModelError> {
        if matches!(self.spec, ModelSpec::Captured(_)) {
            return Ok(());
        }
        match self.input {
            InputSpec::Image {
                image_size,
                channels,
            } => {
                check_positive("input.image_size", image_size)?;
                check_positive("input.channels", channels)?;
                if matches!(
                    self.spec,
                    ModelSpec::Gpt2(_)
                        | ModelSpec::Bert(_)
                        | ModelSpec::Llama(_)
                        | ModelSpec::GptNeox(_)
                        | ModelSpec::T5(_)
                ) {
                    return Err(ModelError::Invalid {
                        field: "input.kind".into(),
                        reason: format!("family {} takes tokens, not images", self.spec.family()),
                    });
                }
            }
            InputSpec::Tokens { seq_len } => {
                check_positive("input.seq_len", seq_len)?;
                if !matches!(
                    self.spec,
                    ModelSpec::Gpt2(_)
                        | ModelSpec::Bert(_)
                        | ModelSpec::Llama(_)
                        | ModelSpec::GptNeox(_)
                        | ModelSpec::T5(_)
                ) {
                    return Err(ModelError::Invalid {
                        field: "input.kind".into(),
                        reason: format!("family {} takes images, not tokens", self.spec.family()),
                    });
                }
            }
        }
        self.spec.validate()
    }

    /// Whether the model is an encoder-decoder (a target length of its own).
    pub fn is_seq2seq(&self) -> bool {
        matches!(self.spec, ModelSpec::T5(_))
    }

    /// The target length an encoder-decoder is planned with: `given`, else
    /// [`t5::DEFAULT_TARGET_SEQ`]; `None` for every other model.
    pub fn target_seq(&self, given: Option<u64>) -> Option<u64> {
        self.is_seq2seq()
            .then(|| given.unwrap_or(t5::DEFAULT_TARGET_SEQ))
    }

    /// Builds the graph for an input of `size` (image side in pixels or sequence length);
    /// `attention` applies to the Hugging Face families. An encoder-decoder gets the
    /// default target length.
    pub fn build(&self, size: u64, attention: AttnImpl) -> Result<Graph, ModelError> {
        self.build_full(size, None, attention, 1.0)
    }

    /// Whether the model has mixture-of-experts layers.
    pub fn is_moe(&self) -> bool {
        matches!(&self.spec, ModelSpec::Llama(p) if p.moe.is_some())
    }

    /// [`build`](Self::build) with the target length of an encoder-decoder
    /// (`target_seq`); giving one for any other model is an error naming the field.
    pub fn build_with(
        &self,
        size: u64,
        target_seq: Option<u64>,
        attention: AttnImpl,
    ) -> Result<Graph, ModelError> {
        self.build_full(size, target_seq, attention, 1.0)
    }

    /// The graph with every training-shape setting: the encoder-decoder target length and
    /// the MoE routing imbalance (`TrainConfig::moe_imbalance`; 1 = uniform routing; ignored
    /// by dense models).
    pub fn build_full(
        &self,
        size: u64,
        target_seq: Option<u64>,
        attention: AttnImpl,
        moe_imbalance: f64,
    ) -> Result<Graph, ModelError> {
        if let Some(t) = target_seq {
            if !self.is_seq2seq() {
                return Err(ModelError::Invalid {
                    field: "target_seq".into(),
                    reason: format!(
                        "{} is not an encoder-decoder model (family {}): it has no target \
                         sequence; use the sequence length alone",
                        self.id,
                        self.spec.family()
                    ),
                });
            }
            check_positive("target_seq", t)?;
        }
        let field = if self.input.is_tokens() {
            "seq_len"
        } else {
            "image_size"
        };
        check_positive(field, size)?;
        let channels = match self.input {
            InputSpec::Image { channels, .. } => channels,
            InputSpec::Tokens { .. } => 0,
        };
        let graph = match &self.spec {
            ModelSpec::Resnet(p) => Ok(resnet::build(p, size, channels)),
            ModelSpec::Efficientnet(p) => Ok(efficientnet::build(p, size, channels)),
            ModelSpec::MobilenetV3(p) => Ok(mobilenet::build(p, size, channels)),
            ModelSpec::Convnext(p) => Ok(convnext::build(p, size, channels)),
            ModelSpec::Vit(p) => vit::build(p, size, channels),
            ModelSpec::Deeplabv3(p) => Ok(segmentation::build_deeplabv3(p, size, channels)),
            ModelSpec::Fcn(p) => Ok(segmentation::build_fcn(p, size, channels)),
            ModelSpec::Unet(p) => unet::build(p, size),
            ModelSpec::Gpt2(p) => gpt2::build(p, size, attention),
            ModelSpec::Bert(p) => encoder::build(p, size, attention),
            ModelSpec::Llama(p) => decoder::build(p, size, attention, moe_imbalance),
            ModelSpec::GptNeox(p) => gpt_neox::build(p, size, attention),
            ModelSpec::T5(p) => t5::build(
                p,
                size,
                target_seq.unwrap_or(t5::DEFAULT_TARGET_SEQ),
                attention,
            ),
            ModelSpec::Captured(c) => Err(ModelError::Invalid {
                field: "model".into(),
                reason: format!(
                    "{} is a captured graph: it is planned from its events, not built",
                    c.model
                ),
            }),
        }?;
        super::checks::check_graph_size(&graph)?;
        Ok(graph)
    }

    /// What a training step at `size` with `attention` runs that the plan does not model,
    /// one sentence each naming the config key and why (shown with the plan's warnings).
    pub fn unmodelled(&self, size: u64, attention: AttnImpl) -> Vec<String> {
        match &self.spec {
            ModelSpec::Llama(p) => p.unmodelled(size, attention == AttnImpl::Sdpa),
            ModelSpec::Bert(p) => p.unmodelled(attention),
            _ => Vec::new(),
        }
    }

    /// The default input size (image side or sequence length).
    pub fn default_size(&self) -> u64 {
        match self.input {
            InputSpec::Image { image_size, .. } => image_size,
            InputSpec::Tokens { seq_len } => seq_len,
        }
    }
}

macro_rules! builtin {
    ($($id:literal),* $(,)?) => {
        /// Presets shipped in `presets/models/`, compiled in.
        pub const BUILTIN: &[(&str, &str)] = &[
            $(($id, include_str!(concat!("../../../../presets/models/", $id, ".json")))),*
        ];
    };
}

builtin!(
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnet_b6",
    "efficientnet_b7",
    "mobilenet_v3_small",
    "mobilenet_v3_large",
    "convnext_tiny",
    "convnext_small",
    "convnext_base",
    "vit_b_16",
    "vit_b_32",
    "vit_l_16",
    "vit_h_14",
    "deeplabv3_resnet50",
    "deeplabv3_resnet101",
    "fcn_resnet50",
    "unet",
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "bert-base-uncased",
    "bert-large-uncased",
    "TinyLlama-1.1B",
    "Llama-2-7b-hf",
    "Llama-2-13b-hf",
    "Meta-Llama-3-8B",
);

/// All built-in presets, parsed. A broken built-in is a bug, reported as an error.
pub fn builtin_presets() -> Result<Vec<Preset>, ModelError> {
    BUILTIN
        .iter()
        .map(|(id, text)| {
            Preset::from_json(text)
                .map_err(|e| ModelError::Malformed(format!("built-in preset {id}: {e}")))
        })
        .collect()
}

impl Preset {
    /// A preset for a captured graph file (`*.vramlab-graph.json`); `id` names it.
    pub fn from_captured(id: &str, text: &str) -> Result<Preset, ModelError> {
        let c = super::captured::CapturedGraph::from_json(text)?;
        Ok(Self::captured(id.to_string(), c))
    }

    fn captured(id: String, c: super::captured::CapturedGraph) -> Preset {
        let input = if c.tokens {
            InputSpec::Tokens { seq_len: c.size }
        } else {
            InputSpec::Image {
                image_size: c.size,
                channels: 3,
            }
        };
        Preset {
            id,
            display_name: c.model.clone(),
            reference: format!("captured with torch {}", c.torch),
            input,
            spec: ModelSpec::Captured(Box::new(c)),
        }
    }
}

/// The Hugging Face Hub ids of the built-in presets that mirror a Hub checkpoint (their
/// `reference` names the config), for the exports' `from_pretrained(MODEL)`.
const HUB_IDS: [(&str, &str); 10] = [
    ("gpt2", "openai-community/gpt2"),
    ("gpt2-medium", "openai-community/gpt2-medium"),
    ("gpt2-large", "openai-community/gpt2-large"),
    ("gpt2-xl", "openai-community/gpt2-xl"),
    ("bert-base-uncased", "google-bert/bert-base-uncased"),
    ("bert-large-uncased", "google-bert/bert-large-uncased"),
    ("Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B"),
    ("Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf"),
    ("Llama-2-13b-hf", "meta-llama/Llama-2-13b-hf"),
    (
        "TinyLlama-1.1B",
        "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
    ),
];

impl Preset {
    /// The Hugging Face Hub id of the checkpoint this preset mirrors, where vramlab knows
    /// it (the built-in transformer presets); `None` for vision models, custom presets,
    /// captured graphs and imported `config.json` files.
    pub fn hub_id(&self) -> Option<&'static str> {
        HUB_IDS
            .iter()
            .find(|(id, _)| *id == self.id)
            .map(|(_, hub)| *hub)
    }
}

/// Finds a built-in preset by id (case-insensitive).
pub fn find_builtin(id: &str) -> Result<Preset, ModelError> {
    let text = BUILTIN
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(id))
        .map(|(_, t)| *t)
        .ok_or_else(|| ModelError::UnknownModel(id.to_string()))?;
    Preset::from_json(text)
}
