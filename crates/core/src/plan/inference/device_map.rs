//! `from_pretrained(..., device_map="auto", max_memory={0: GPU, "cpu": CPU})` (issue 29): which
//! modules of a Llama-lineage decoder transformers 5.17 puts on GPU 0, on the CPU or on disk,
//! and which tensors the dispatched model copies to the GPU at each call.
//!
//! The placement mirrors transformers 5.17 `integrations/accelerate.py`, `_get_device_map` for
//! a string device map: `get_balanced_memory` (one GPU with `max_memory` given: the budgets
//! unchanged; `get_max_memory` takes the minimum of the user's budget and the free plus
//! reserved-but-unused memory, which is the user's budget whenever it is below the free
//! memory), no quantizer, then its copy of accelerate's `infer_auto_device_map`:
//! - module sizes from `compute_module_sizes`: every parameter and buffer (non-persistent
//!   ones too: the rotary `inv_freq` / `original_inv_freq` in fp32, Gemma's `embed_scale` in
//!   the dtype) at its dtype, tied keys (`lm_head.weight` of a tied model) not counted;
//! - the modules treated in order (`named_children`: `model` then `lm_head`), a module that
//!   does not fit split into its children unless it has none or is in `_no_split_modules`
//!   (the decoder layer class), which then goes with everything after it to the next device
//!   (0, "cpu", "disk");
//! - on the main devices (0 and "cpu") the largest remaining unsplittable layer
//!   (`get_max_layer_size`) is kept free: the budget is `max_memory − max_layer_size`, and a
//!   device left behind counts that reserve as used;
//! - tied parameters: a module holding one of a tied group is placed together with the
//!   modules holding the others (`get_module_size_with_ties`), so a tied `lm_head` follows
//!   `model.embed_tokens`;
//! - "disk" takes what exceeds the CPU budget;
//! - `clean_device_map` (accelerate 1.15 `utils/modeling.py`) merges every subtree whose
//!   entries share one device into its name (`{"": 0}` when everything fits).
//!
//! The budgets come in bytes ([`MaxMemory`]); the sizes users type (`10GiB`) are read at the
//! edge, by `vramlab-words`' `max_memory_bytes`, as accelerate's `convert_file_size_to_int`
//! reads them.
//!
//! With `quantization_config=BitsAndBytesConfig(...)` ([`Placement::of_quant`], transformers
//! 5.17.0 as released): `from_pretrained` runs the quantizer's `preprocess_model`
//! (`replace_with_bnb_linear`) before `_get_device_map`, while `device_map` is the string
//! `"auto"`, so every decoder-layer `nn.Linear` is `Linear4bit` / `Linear8bitLt` when the map is
//! computed (the CPU / disk keys join `modules_to_not_convert` only for a `device_map` dict:
//! `_process_model_before_weight_loading`, `if isinstance(device_map, dict)`), the offloaded ones
//! too; `compute_module_sizes` counts `numel × hf_quantizer.param_element_size` (0.5 for a 4-bit
//! weight, 1 for an int8 one, [`ModelTensors::counted`]); `_get_device_map` multiplies the
//! budgets by 0.90 (`adjust_max_memory`, [`BNB_MAX_MEMORY_FACTOR`]) and, on the map,
//! `validate_environment` refuses modules on "cpu" / "disk" without
//! `llm_int8_enable_fp32_cpu_offload` ([`BNB_OFFLOAD_REFUSAL`]).

use std::fmt;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::program::{Buf, Prog};
use crate::model::families::llama::{LlamaParams, head_dim};
use crate::plan::PlanError;
use crate::plan::events::Category;
use crate::plan::policy::QuantStorage;

/// A device of accelerate's device map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// GPU 0 (written `0`).
    Gpu0,
    Cpu,
    Disk,
}

impl Device {
    const ORDER: [Device; 3] = [Device::Gpu0, Device::Cpu, Device::Disk];

    pub fn as_str(self) -> &'static str {
        match self {
            Device::Gpu0 => "0",
            Device::Cpu => "cpu",
            Device::Disk => "disk",
        }
    }

    /// Whether the module's weights live off the GPU and are copied in at each call.
    pub fn offloaded(self) -> bool {
        self != Device::Gpu0
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Device::Gpu0 => s.serialize_u64(0),
            other => s.serialize_str(other.as_str()),
        }
    }
}

/// A parameter-holding submodule of the model, for the tensors a dispatched model copies to
/// the GPU when the module runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sub {
    Embed,
    Q,
    K,
    V,
    O,
    Qkv,
    QNorm,
    KNorm,
    Gate,
    Up,
    Down,
    GateUp,
    InputNorm,
    PostAttnNorm,
    PreFfNorm,
    PostFfNorm,
    FinalNorm,
    LmHead,
}

/// The sizes the placement and the streamed weights depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTensors {
    pub layers: u64,
    hidden: u64,
    intermediate: u64,
    q_width: u64,
    kv_width: u64,
    head_dim: u64,
    vocab: u64,
    /// Bytes per element of the weights.
    d: u64,
    qkv_bias: bool,
    o_bias: bool,
    mlp_bias: bool,
    qk_norm: bool,
    sandwich: bool,
    fused: bool,
    gemma: bool,
    tied: bool,
    /// Rotary embeddings (Gemma 3: local and global).
    rotaries: u64,
    /// bitsandbytes' quantization of the decoder layers' projections (`None`: every weight
    /// in the dtype).
    quant: Option<QuantStorage>,
}

impl ModelTensors {
    /// The tensors of `p` with weights of `d` bytes per element.
    pub fn new(p: &LlamaParams, d: u64) -> ModelTensors {
        let hd = head_dim(p);
        let model_type = p.model_type.as_deref().unwrap_or("llama");
        ModelTensors {
            layers: p.num_hidden_layers,
            hidden: p.hidden_size,
            intermediate: p.intermediate_size,
            q_width: p.num_attention_heads * hd,
            kv_width: p.num_key_value_heads * hd,
            head_dim: hd,
            vocab: p.vocab_size,
            d,
            qkv_bias: p.attention_bias || p.qkv_bias,
            o_bias: p.attention_bias,
            mlp_bias: p.mlp_bias,
            qk_norm: p.qk_norm,
            sandwich: p.sandwich_norm,
            fused: p.fused_projections,
            gemma: p.gemma,
            tied: p.tie_word_embeddings,
            rotaries: if model_type == "gemma3_text" { 2 } else { 1 },
            quant: None,
        }
    }

    /// [`ModelTensors::new`] of a model loaded with `quantization_config` (`quant`): after
    /// `replace_with_bnb_linear` every `nn.Linear` of the decoder layers is a
    /// `bnb.nn.Linear4bit` / `Linear8bitLt` (`lm_head` is in `get_keys_to_not_convert`).
    pub fn with_quant(p: &LlamaParams, d: u64, quant: Option<QuantStorage>) -> ModelTensors {
        ModelTensors {
            quant,
            ..ModelTensors::new(p, d)
        }
    }

    /// The weight of `sub` as (output features, input features) when it is a projection
    /// bitsandbytes quantizes (`None`: the embedding, `lm_head`, the norms, or no quantizer).
    fn quantized(&self, sub: Sub) -> Option<(QuantStorage, u64, u64)> {
        let q = self.quant?;
        let (h, i, qw, kv) = (self.hidden, self.intermediate, self.q_width, self.kv_width);
        let (rows, cols) = match sub {
            Sub::Q => (qw, h),
            Sub::K | Sub::V => (kv, h),
            Sub::Qkv => (qw + 2 * kv, h),
            Sub::O => (h, qw),
            Sub::Gate | Sub::Up => (i, h),
            Sub::GateUp => (2 * i, h),
            Sub::Down => (h, i),
            _ => return None,
        };
        Some((q, rows, cols))
    }

    /// The bytes of `sub`'s parameters as transformers 5.17 `compute_module_sizes` counts
    /// them with a quantizer (`integrations/accelerate.py`: `numel ×
    /// hf_quantizer.param_element_size`): a quantized weight 0.5 byte per element
    /// (`Bnb4BitHfQuantizer.param_element_size`) or 1 (`Bnb8BitHfQuantizer`), a bias and
    /// everything else its dtype's size. (Every Llama-lineage projection has an even element
    /// count, so the 4-bit sizes are whole bytes.)
    pub fn counted(&self, sub: Sub) -> Vec<u64> {
        let mut v = self.tensors(sub);
        if let Some((q, rows, cols)) = self.quantized(sub) {
            let elems = rows * cols;
            v[0] = if q.quant.is_4bit() {
                elems.div_ceil(2)
            } else {
                elems
            };
        }
        v
    }

    /// The GPU tensors of each of `sub`'s parameters (weight, then bias) once loaded, in the
    /// order accelerate's hook copies them in: a quantized weight's
    /// [`QuantStorage::tensors`], everything else one tensor in the dtype.
    pub fn stored_params(&self, sub: Sub) -> Vec<Vec<u64>> {
        let mut v: Vec<Vec<u64>> = self.tensors(sub).into_iter().map(|b| vec![b]).collect();
        if let Some((q, rows, cols)) = self.quantized(sub) {
            v[0] = q.tensors(rows * cols, rows);
        }
        v
    }

    /// [`ModelTensors::stored_params`], flattened.
    pub fn stored(&self, sub: Sub) -> Vec<u64> {
        self.stored_params(sub).concat()
    }

    /// The bytes of `sub`'s parameters in `named_parameters` order (weight, then bias); a
    /// tied `lm_head` has none of its own.
    pub fn tensors(&self, sub: Sub) -> Vec<u64> {
        let (h, i, q, kv) = (self.hidden, self.intermediate, self.q_width, self.kv_width);
        let lin = |w: u64, out: u64, bias: bool| {
            let mut v = vec![w * self.d];
            if bias {
                v.push(out * self.d);
            }
            v
        };
        match sub {
            Sub::Embed => vec![self.vocab * h * self.d],
            Sub::LmHead if self.tied => Vec::new(),
            Sub::LmHead => vec![self.vocab * h * self.d],
            Sub::Q => lin(h * q, q, self.qkv_bias),
            Sub::K | Sub::V => lin(h * kv, kv, self.qkv_bias),
            Sub::Qkv => lin(h * (q + 2 * kv), q + 2 * kv, self.qkv_bias),
            Sub::O => lin(q * h, h, self.o_bias),
            Sub::Gate | Sub::Up => lin(h * i, i, self.mlp_bias),
            Sub::GateUp => lin(h * 2 * i, 2 * i, self.mlp_bias),
            Sub::Down => lin(i * h, h, self.mlp_bias),
            Sub::QNorm | Sub::KNorm => vec![self.head_dim * self.d],
            Sub::InputNorm
            | Sub::PostAttnNorm
            | Sub::PreFfNorm
            | Sub::PostFfNorm
            | Sub::FinalNorm => vec![h * self.d],
        }
    }

    /// The parameter-holding submodules of one decoder layer.
    pub fn layer_subs(&self) -> Vec<Sub> {
        let mut v = if self.fused {
            vec![Sub::Qkv, Sub::O]
        } else {
            vec![Sub::Q, Sub::K, Sub::V, Sub::O]
        };
        if self.qk_norm {
            v.extend([Sub::QNorm, Sub::KNorm]);
        }
        if self.fused {
            v.extend([Sub::GateUp, Sub::Down]);
        } else {
            v.extend([Sub::Gate, Sub::Up, Sub::Down]);
        }
        v.extend([Sub::InputNorm, Sub::PostAttnNorm]);
        if self.sandwich {
            v.extend([Sub::PreFfNorm, Sub::PostFfNorm]);
        }
        v
    }

    /// One decoder layer's bytes as `compute_module_sizes` counts them ([`ModelTensors::counted`]).
    pub fn layer_bytes(&self) -> u64 {
        self.layer_subs()
            .iter()
            .flat_map(|&s| self.counted(s))
            .sum()
    }

    /// Buffers that stay on the GPU whatever the map says (`offload_buffers=False`: the
    /// dispatch moves an offloaded module's buffers to the execution device): the rotary
    /// `inv_freq` and `original_inv_freq` (fp32, `head_dim / 2` each) and Gemma's
    /// `embed_scale` (a scalar in the dtype).
    pub fn resident_buffers(&self) -> Vec<u64> {
        let mut v = vec![self.head_dim / 2 * 4; 2 * self.rotaries as usize];
        if self.gemma {
            v.push(self.d);
        }
        v
    }

    /// The module tree `infer_auto_device_map` walks, with `compute_module_sizes`' bytes.
    pub fn tree(&self) -> Module {
        let leaf = |name: &str, bytes: u64| Module {
            name: name.to_string(),
            bytes,
            children: Vec::new(),
            no_split: false,
        };
        let embed = self.tensors(Sub::Embed)[0] + if self.gemma { self.d } else { 0 };
        let layer = self.layer_bytes();
        let layers: Vec<Module> = (0..self.layers)
            .map(|l| Module {
                name: format!("model.layers.{l}"),
                bytes: layer,
                // the decoder layer has submodules but is in `_no_split_modules`
                children: vec![leaf(&format!("model.layers.{l}.self_attn"), 0)],
                no_split: true,
            })
            .collect();
        let rotary = self.head_dim / 2 * 4 * 2 * self.rotaries;
        let norm = self.hidden * self.d;
        let layers = Module {
            name: "model.layers".into(),
            bytes: layer * self.layers,
            children: layers,
            no_split: false,
        };
        let model = Module {
            name: "model".into(),
            bytes: embed + layers.bytes + norm + rotary,
            children: vec![
                leaf("model.embed_tokens", embed),
                layers,
                leaf("model.norm", norm),
                leaf("model.rotary_emb", rotary),
            ],
            no_split: false,
        };
        let head: u64 = self.tensors(Sub::LmHead).iter().sum();
        Module {
            name: String::new(),
            bytes: model.bytes + head,
            children: vec![model, leaf("lm_head", head)],
            no_split: false,
        }
    }

    /// `model.all_tied_weights_keys` as `infer_auto_device_map`'s groups.
    pub fn tied_groups(&self) -> Vec<Vec<String>> {
        if self.tied {
            vec![vec![
                "lm_head.weight".to_string(),
                "model.embed_tokens.weight".to_string(),
            ]]
        } else {
            Vec::new()
        }
    }
}

/// A module of the tree `infer_auto_device_map` walks.
#[derive(Debug, Clone, PartialEq)]
pub struct Module {
    /// Its name in `named_modules` (`""` for the model).
    pub name: String,
    /// Parameters and buffers, tied keys not counted.
    pub bytes: u64,
    pub children: Vec<Module>,
    /// Its class is in `_no_split_modules`.
    pub no_split: bool,
}

/// `get_max_layer_size`: the largest module that is not split (no children, or a no-split
/// class) under `modules`, and the names that reach it.
fn max_layer_size(modules: &[(String, &Module)]) -> (u64, Vec<String>) {
    let mut max = 0u64;
    let mut names: Vec<String> = Vec::new();
    let mut todo: Vec<&Module> = modules.iter().rev().map(|(_, m)| *m).collect();
    while let Some(m) = todo.pop() {
        if m.children.is_empty() || m.no_split {
            if m.bytes > max {
                max = m.bytes;
                names = vec![m.name.clone()];
            } else if m.bytes == max {
                names.push(m.name.clone());
            }
        } else {
            todo.extend(m.children.iter().rev());
        }
    }
    (max, names)
}

/// accelerate's device map, in its naming and grouping.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceMap {
    pub entries: Vec<(String, Device)>,
}

impl Serialize for DeviceMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.entries.len()))?;
        for (k, v) in &self.entries {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl DeviceMap {
    /// The device of module `name`: the entry naming it or its closest ancestor.
    pub fn device_of(&self, name: &str) -> Option<Device> {
        self.entries
            .iter()
            .filter(|(k, _)| {
                k.is_empty()
                    || name == k
                    || (name.starts_with(k.as_str()) && name.as_bytes().get(k.len()) == Some(&b'.'))
            })
            .max_by_key(|(k, _)| k.len())
            .map(|(_, d)| *d)
    }

    /// The entries with consecutive decoder layers on one device merged, for display:
    /// `("model.layers.0–8", 0)`, `("model.layers.9–21", cpu)`, the other entries as they are.
    pub fn runs(&self) -> Vec<(String, Device)> {
        let layer = |k: &str| {
            k.strip_prefix("model.layers.")
                .and_then(|n| n.parse::<u64>().ok())
        };
        let mut out: Vec<(String, Device)> = Vec::new();
        let mut run: Option<(u64, u64, Device)> = None;
        let close = |run: &mut Option<(u64, u64, Device)>, out: &mut Vec<(String, Device)>| {
            if let Some((a, b, d)) = run.take() {
                let name = if a == b {
                    format!("model.layers.{a}")
                } else {
                    format!("model.layers.{a}–{b}")
                };
                out.push((name, d));
            }
        };
        for (k, d) in &self.entries {
            match (layer(k), run) {
                (Some(n), Some((a, b, rd))) if rd == *d && n == b + 1 => run = Some((a, n, rd)),
                (Some(n), _) => {
                    close(&mut run, &mut out);
                    run = Some((n, n, *d));
                }
                (None, _) => {
                    close(&mut run, &mut out);
                    out.push((k.clone(), *d));
                }
            }
        }
        close(&mut run, &mut out);
        out
    }

    /// Whether any module is off the GPU (the model is then dispatched with hooks).
    pub fn offloads(&self) -> bool {
        self.entries.iter().any(|(_, d)| d.offloaded())
    }
}

/// `clean_device_map`: every subtree whose entries share one device becomes one entry.
fn clean(map: &mut Vec<(String, Device)>, module: &str) {
    let prefix = if module.is_empty() {
        String::new()
    } else {
        format!("{module}.")
    };
    let values: Vec<Device> = map
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(_, v)| *v)
        .collect();
    if values.len() > 1 && values.iter().all(|v| *v == values[0]) {
        map.retain(|(k, _)| !k.starts_with(&prefix));
        map.push((module.to_string(), values[0]));
    }
    let depth = if module.is_empty() {
        1
    } else {
        module.split('.').count() + 1
    };
    let mut children: Vec<String> = Vec::new();
    for (k, _) in map.iter() {
        if k.starts_with(&prefix) && k.len() > module.len() {
            let c = k.split('.').take(depth).collect::<Vec<_>>().join(".");
            if !children.contains(&c) {
                children.push(c);
            }
        }
    }
    for c in children {
        clean(map, &c);
    }
}

/// The GPU and CPU budgets of `max_memory` (bytes); `cpu: None` is no CPU limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MaxMemory {
    pub gpu: u64,
    pub cpu: Option<u64>,
}

/// `Bnb4BitHfQuantizer.adjust_max_memory` / `Bnb8BitHfQuantizer.adjust_max_memory`
/// (transformers 5.17 `quantizers/quantizer_bnb_4bit.py`, `quantizer_bnb_8bit.py`): "need more
/// space for buffers that are created during quantization", `{key: val * 0.90 for key, val in
/// max_memory.items()}`, every device's budget (GPU and CPU) as a Python float.
pub const BNB_MAX_MEMORY_FACTOR: f64 = 0.90;

impl MaxMemory {
    /// The budgets `infer_auto_device_map` receives: as given, or with a bitsandbytes
    /// quantizer times [`BNB_MAX_MEMORY_FACTOR`] (in f64, as Python computes them).
    pub fn inferred(self, quantizer: bool) -> (f64, Option<f64>) {
        let f = if quantizer {
            BNB_MAX_MEMORY_FACTOR
        } else {
            1.0
        };
        // budgets are below 2^53 bytes: exact as f64
        #[allow(clippy::cast_precision_loss)]
        let scale = |b: u64| if quantizer { b as f64 * f } else { b as f64 };
        (scale(self.gpu), self.cpu.map(scale))
    }
}

/// transformers' `infer_auto_device_map` over `root` (see the module doc), cleaned.
/// `quantizer`: a bitsandbytes quantizer's `adjust_max_memory` applies to `budget`
/// ([`MaxMemory::inferred`]). Sizes and budgets are compared in f64 as Python compares them
/// (the sizes are whole bytes below 2^53, so without a quantizer the comparisons are the
/// integers').
#[allow(clippy::cast_precision_loss)]
pub fn infer_auto_device_map(
    root: &Module,
    tied: &[Vec<String>],
    budget: MaxMemory,
    quantizer: bool,
) -> Result<DeviceMap, PlanError> {
    let (gpu, cpu) = budget.inferred(quantizer);
    let limit = |d: Device| -> Option<f64> {
        match d {
            Device::Gpu0 => Some(gpu),
            Device::Cpu => cpu,
            Device::Disk => None,
        }
    };
    let main = |d: Device| d != Device::Disk;
    let mut todo: Vec<(String, &Module)> =
        root.children.iter().map(|m| (m.name.clone(), m)).collect();
    let mut map: Vec<(String, Device)> = Vec::new();
    let mut used = [0f64; 3];
    let mut current = 0usize;
    let (mut max_layer, mut max_names) = max_layer_size(&todo);
    while !todo.is_empty() {
        let (name, module) = todo.remove(0);
        max_names.retain(|n| *n != name && !n.starts_with(&format!("{name}.")));
        if max_names.is_empty() {
            (max_layer, max_names) = max_layer_size(&todo);
        }
        let dot = format!("{name}.");
        let inside = |k: &String| format!("{k}.").contains(&dot);
        let tied_params: Vec<&String> = tied
            .iter()
            .filter(|g| g.iter().any(inside) && !g.iter().all(inside))
            .flat_map(|g| g.iter().filter(|k| !inside(k)))
            .collect();
        let device = Device::ORDER[current];
        let mut max_size = limit(device);
        let mut reserved = 0f64;
        if main(device) {
            max_size = max_size.map(|m| m - max_layer as f64);
            reserved = max_layer as f64;
        }
        // `get_module_size_with_ties`
        let mut with_ties = module.bytes as f64;
        let mut tied_names: Vec<String> = Vec::new();
        for p in tied_params {
            let Some((n, m)) = todo.iter().find(|(n, _)| p.starts_with(&format!("{n}."))) else {
                return Err(PlanError::Field {
                    field: "device_map",
                    reason: format!("the module holding the tied {p} is already placed"),
                });
            };
            if !tied_names.contains(n) {
                tied_names.push(n.clone());
                with_ties += m.bytes as f64;
            }
        }
        let slot = device as usize;
        if max_size.is_none_or(|m| used[slot] + with_ties <= m) {
            used[slot] += with_ties;
            map.push((name, device));
            for t in tied_names {
                todo.retain(|(n, _)| *n != t);
                map.push((t, device));
            }
            continue;
        }
        // (The split of a tied module that does not fit with its ties is never reached
        // here: the tied `lm_head` counts no bytes of its own, so a module fits with its
        // ties whenever it fits alone.)
        if !module.children.is_empty() && !module.no_split {
            let mut next: Vec<(String, &Module)> = module
                .children
                .iter()
                .map(|m| (m.name.clone(), m))
                .collect();
            next.append(&mut todo);
            todo = next;
            (max_layer, max_names) = max_layer_size(&todo);
            continue;
        }
        used[slot] += reserved;
        current += 1;
        if current >= Device::ORDER.len() {
            return Err(PlanError::Field {
                field: "device_map",
                reason: format!("{name} fits on no device"),
            });
        }
        todo.insert(0, (name, module));
    }
    clean(&mut map, "");
    Ok(DeviceMap { entries: map })
}

/// The placement of a model under `device_map="auto"` (serialized as `device_map`, the map
/// in accelerate's naming, and `offload`, the budgets and the bytes per device).
#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    /// The map in accelerate's naming (what `model.hf_device_map` holds when something is
    /// offloaded).
    pub device_map: DeviceMap,
    pub offload: Offload,
    #[serde(skip)]
    pub tensors: ModelTensors,
}

/// transformers 5.17's refusal of a quantized model with modules on "cpu" / "disk" and no
/// `llm_int8_enable_fp32_cpu_offload` (`Bnb4BitHfQuantizer.validate_environment`,
/// `Bnb8BitHfQuantizer.validate_environment`, called by `_get_device_map` on the map
/// `infer_auto_device_map` returned), word for word.
pub const BNB_OFFLOAD_REFUSAL: &str = "Some modules are dispatched on the CPU or the disk. Make \
    sure you have enough GPU RAM to fit the quantized model. If you want to dispatch the model \
    on the CPU or the disk while keeping these modules in 32-bit, you need to set \
    `llm_int8_enable_fp32_cpu_offload=True` and pass a custom `device_map` to \
    `from_pretrained`. Check \
    https://huggingface.co/docs/transformers/main/en/main_classes/quantization#offload-between-cpu-and-gpu \
    for more details.";

/// The versions in which 4-bit weights (`Linear4bit`) with offloaded modules were measured
/// to fail (session 30b, H100 80GB HBM3, driver 580.159.04, `tests/data/infer/grid30q.jsonl`).
pub const BNB_4BIT_OFFLOAD_VERSIONS: &str =
    "torch 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0, bitsandbytes 0.50.2";

/// What the first forward of a 4-bit model with offloaded modules raised on the GPU in
/// [`BNB_4BIT_OFFLOAD_VERSIONS`] (g30q-003: nf4 without double quantization, prefill;
/// g30q-004: nf4 with it, generate). The mechanism, from the sources: `dispatch_model`'s
/// `AlignDevicesHook(offload=True).init_hook` moves every parameter of an offloaded module to
/// meta (`set_module_tensor_to_device(module, name, "meta")` → `Params4bit.to("meta")`), and
/// bitsandbytes 0.50.2 `Params4bit.to` calls `self.quant_state.to(device)`, which moves the
/// `QuantState` (`absmax`, `code`, with double quantization `offset` / `state2`) in place; the
/// state is shared with the CPU copy in `weights_map`, so at `pre_forward` the weight comes
/// back with its state on meta. The errors fit that (a meta `absmax` copied without double
/// quantization, `.item()` of the meta nested `offset` with it); the tracebacks were not
/// recorded. LLM.int8 with offloaded layers runs (g30q-002 / -006 / -008).
pub const BNB_4BIT_OFFLOAD_ERRORS: [&str; 2] = [
    "NotImplementedError: Cannot copy out of meta tensor; no data!",
    "RuntimeError: Tensor.item() cannot be called on meta tensors",
];

/// What a bitsandbytes quantizer changes in a placement (`offload.quantizer` in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct QuantOffload {
    /// The budgets `infer_auto_device_map` placed against: `max_memory` × 0.90
    /// (`adjust_max_memory`), as Python's floats.
    pub inferred_max_gpu_memory_bytes: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inferred_max_cpu_memory_bytes: Option<f64>,
    /// `BitsAndBytesConfig(llm_int8_enable_fp32_cpu_offload=...)`.
    pub llm_int8_enable_fp32_cpu_offload: bool,
}

/// The budgets of a placement and what it puts on each device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Offload {
    /// `max_memory[0]` in bytes.
    pub max_gpu_memory_bytes: u64,
    /// `max_memory["cpu"]` in bytes (absent: no CPU limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cpu_memory_bytes: Option<u64>,
    /// Weights and buffers per device, as `compute_module_sizes` counts them.
    pub gpu_bytes: u64,
    pub cpu_bytes: u64,
    pub disk_bytes: u64,
    /// Decoder layers, and those per device.
    pub layers: u64,
    pub layers_gpu: u64,
    pub layers_cpu: u64,
    pub layers_disk: u64,
    /// With `quantization_config` (absent without).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantizer: Option<QuantOffload>,
}

impl Placement {
    /// The placement of `p` in weights of `d` bytes per element within `budget`.
    pub fn of(p: &LlamaParams, d: u64, budget: MaxMemory) -> Result<Placement, PlanError> {
        Placement::of_quant(p, d, budget, None, false)
    }

    /// [`Placement::of`] for a model loaded with `quantization_config=BitsAndBytesConfig(...)`
    /// (`quant`; `None`: no quantizer) and `llm_int8_enable_fp32_cpu_offload`
    /// (`fp32_cpu_offload`). transformers 5.17 `modeling_utils.from_pretrained` runs the
    /// quantizer's `preprocess_model` (`replace_with_bnb_linear`) before `_get_device_map`,
    /// while `device_map` is still the string `"auto"`, so the sizes are the quantized
    /// model's ([`ModelTensors::counted`]); `_get_device_map` then applies
    /// `adjust_max_memory` (× 0.90, [`MaxMemory::inferred`]) and, on the map, the
    /// quantizer's `validate_environment`: a map with a module on "cpu" or "disk" (and not
    /// everything on "cpu") is refused with [`BNB_OFFLOAD_REFUSAL`] unless
    /// `llm_int8_enable_fp32_cpu_offload=True`.
    pub fn of_quant(
        p: &LlamaParams,
        d: u64,
        budget: MaxMemory,
        quant: Option<QuantStorage>,
        fp32_cpu_offload: bool,
    ) -> Result<Placement, PlanError> {
        let tensors = ModelTensors::with_quant(p, d, quant);
        let tree = tensors.tree();
        let device_map =
            infer_auto_device_map(&tree, &tensors.tied_groups(), budget, quant.is_some())?;
        if quant.is_some() && !fp32_cpu_offload {
            let all_cpu = device_map.entries.iter().all(|(_, d)| *d == Device::Cpu);
            if !all_cpu && device_map.offloads() {
                return Err(PlanError::Field {
                    field: "llm_int8_enable_fp32_cpu_offload",
                    reason: format!(
                        "device_map {}: transformers 5.17 refuses it (the bitsandbytes \
                         quantizer's validate_environment): \"{BNB_OFFLOAD_REFUSAL}\" With \
                         device_map=\"auto\" BitsAndBytesConfig(..., \
                         llm_int8_enable_fp32_cpu_offload=True) is enough; give more GPU \
                         memory to keep every module on GPU 0",
                        serde_json::to_string(&device_map).unwrap_or_default()
                    ),
                });
            }
        }
        let (inferred_gpu, inferred_cpu) = budget.inferred(true);
        let mut bytes = [0u64; 3];
        let mut walk = vec![&tree];
        while let Some(m) = walk.pop() {
            if m.children.is_empty() || m.no_split {
                if let Some(d) = device_map.device_of(&m.name) {
                    bytes[d as usize] += m.bytes;
                }
            } else {
                walk.extend(m.children.iter());
            }
        }
        let mut layers = [0u64; 3];
        for l in 0..tensors.layers {
            if let Some(d) = device_map.device_of(&format!("model.layers.{l}")) {
                layers[d as usize] += 1;
            }
        }
        Ok(Placement {
            device_map,
            offload: Offload {
                max_gpu_memory_bytes: budget.gpu,
                max_cpu_memory_bytes: budget.cpu,
                gpu_bytes: bytes[0],
                cpu_bytes: bytes[1],
                disk_bytes: bytes[2],
                layers: tensors.layers,
                layers_gpu: layers[0],
                layers_cpu: layers[1],
                layers_disk: layers[2],
                quantizer: quant.map(|_| QuantOffload {
                    inferred_max_gpu_memory_bytes: inferred_gpu,
                    inferred_max_cpu_memory_bytes: inferred_cpu,
                    llm_int8_enable_fp32_cpu_offload: fp32_cpu_offload,
                }),
            },
            tensors,
        })
    }

    /// The device of a module (`"model.layers.3"`, `"lm_head"`, …).
    pub fn device_of(&self, name: &str) -> Device {
        self.device_map.device_of(name).unwrap_or(Device::Gpu0)
    }

    /// The device of decoder layer `l`.
    pub fn layer(&self, l: u64) -> Device {
        self.device_of(&format!("model.layers.{l}"))
    }

    /// One line: "12 of 16 layers on GPU 0, 4 on cpu; embed_tokens 0, lm_head cpu".
    pub fn summary(&self) -> String {
        let o = &self.offload;
        let mut parts = vec![format!("{} of {} layers on GPU 0", o.layers_gpu, o.layers)];
        if o.layers_cpu > 0 {
            parts.push(format!("{} on cpu", o.layers_cpu));
        }
        if o.layers_disk > 0 {
            parts.push(format!("{} on disk", o.layers_disk));
        }
        format!(
            "{}; embed_tokens {}, norm {}, lm_head {}",
            parts.join(", "),
            self.device_of("model.embed_tokens"),
            self.device_of("model.norm"),
            self.device_of("lm_head")
        )
    }
}

impl Placement {
    /// The tensors resident on GPU 0 once the model is dispatched, in the order they are
    /// loaded: the parameters of the modules the map puts on 0 (`model.embed_tokens`, the
    /// layers, `model.norm`, an untied `lm_head`), then the buffers, which stay on the GPU
    /// whatever the map says (`offload_buffers=False`).
    pub fn resident(&self) -> Vec<u64> {
        let mut v = self.resident_params();
        v.extend(self.tensors.resident_buffers());
        v
    }

    /// The parameters of the modules on GPU 0 (a tied `lm_head` has none of its own), in
    /// the order they are loaded.
    pub fn resident_params(&self) -> Vec<u64> {
        let t = &self.tensors;
        let mut v = Vec::new();
        if !self.device_of("model.embed_tokens").offloaded() {
            v.extend(t.tensors(Sub::Embed));
        }
        for l in 0..t.layers {
            if !self.layer(l).offloaded() {
                for sub in t.layer_subs() {
                    v.extend(t.stored(sub));
                }
            }
        }
        if !self.device_of("model.norm").offloaded() {
            v.extend(t.tensors(Sub::FinalNorm));
        }
        if !self.device_of("lm_head").offloaded() {
            v.extend(t.tensors(Sub::LmHead));
        }
        v
    }

    /// The bytes on GPU 0 after dispatch (what [`Placement::resident`] lists).
    pub fn resident_bytes(&self) -> u64 {
        self.resident().iter().sum()
    }

    /// Whether the model runs on the CPU: no module on GPU 0 (`dispatch_model` then uses the
    /// CPU as the main device, or the map is `{"": "cpu"}` and nothing is dispatched).
    pub fn nothing_on_gpu(&self) -> bool {
        !self
            .device_map
            .entries
            .iter()
            .any(|(_, d)| *d == Device::Gpu0)
    }
}

/// What accelerate's hooks copy to the GPU while the dispatched model runs (accelerate 1.15
/// `hooks.py`): `attach_align_device_hook_on_blocks` gives every submodule with direct
/// parameters of an offloaded entry an `AlignDevicesHook(offload=True)` (so each `nn.Linear`
/// and norm of an offloaded decoder layer separately, `place_submodules=False`). Its
/// `pre_forward` copies each parameter from `weights_map` (the CPU state dict; for "disk",
/// the offload folder's safetensors, read onto the execution device) to GPU 0 with
/// `set_module_tensor_to_device`, which calls `torch.cuda.empty_cache()` after each tensor
/// (`clear_cache=True`, the device is not "cpu" / "meta"); its `post_forward` sets them back
/// to meta once the module's output exists, freeing the copies. Inputs and outputs already
/// sit on GPU 0, the execution device of every module (`send_to_device` is then a no-op;
/// `past_key_values` is in `_skip_keys_device_placement`), so the KV cache of an offloaded
/// layer is on the GPU with the others. A tied `lm_head` on the CPU copies its weight at its
/// own call, as the embedding does at its own (`tied_params_map` shares a copy only while
/// both are loaded at once, which they never are).
///
/// An offloaded decoder layer of a quantized model keeps its `Linear4bit` / `Linear8bitLt`
/// (see the module doc): its CPU copy was quantized at load, and the hook copies the quantized
/// tensors ([`ModelTensors::stored_params`]: `set_module_tensor_to_device` →
/// `param_cls(value, **kwargs).to(0)`; bitsandbytes 0.50.2 `Params4bit.to` moves the
/// `QuantState` then the packed weight, `Int8Params.to` the int8 weight, then the row scales
/// passed as `fp16_statistics`), one `empty_cache()` per parameter. (4-bit: modelled, but the
/// planner refuses it — the first forward fails in [`BNB_4BIT_OFFLOAD_VERSIONS`], see
/// [`BNB_4BIT_OFFLOAD_ERRORS`].)
#[derive(Debug, Clone)]
pub struct Streams {
    tensors: ModelTensors,
    layers: Vec<bool>,
    embed: bool,
    norm: bool,
    lm_head: bool,
}

impl Streams {
    /// The streamed modules of `pl` (`None` when nothing is offloaded: no hooks).
    pub fn of(pl: &Placement) -> Option<Streams> {
        if !pl.device_map.offloads() {
            return None;
        }
        Some(Streams {
            tensors: pl.tensors.clone(),
            layers: (0..pl.tensors.layers)
                .map(|l| pl.layer(l).offloaded())
                .collect(),
            embed: pl.device_of("model.embed_tokens").offloaded(),
            norm: pl.device_of("model.norm").offloaded(),
            lm_head: pl.device_of("lm_head").offloaded(),
        })
    }

    /// The pre-forward of `sub` (in decoder layer `layer`, or outside the layers): its
    /// parameters' GPU copies, each followed by `empty_cache()`; none when it is on GPU 0.
    pub fn load(&self, p: &mut Prog, layer: Option<u64>, sub: Sub) -> Vec<Buf> {
        let streamed = match (layer, sub) {
            (_, Sub::Embed) => self.embed,
            (_, Sub::FinalNorm) => self.norm,
            (_, Sub::LmHead) => self.lm_head,
            (Some(l), _) => self.layers.get(l as usize).copied().unwrap_or(false),
            (None, _) => false,
        };
        if !streamed {
            return Vec::new();
        }
        let params = match sub {
            // the tied weight is in the state dict under `lm_head.weight` too
            Sub::LmHead => vec![self.tensors.tensors(Sub::Embed)],
            other => self.tensors.stored_params(other),
        };
        // one `set_module_tensor_to_device` per parameter, each ending in `empty_cache()`
        let mut bufs = Vec::new();
        for tensors in params {
            for b in tensors {
                bufs.push(p.alloc(0, b, Category::Parameters));
            }
            p.empty_cache();
        }
        bufs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::inference::call::device_map_session as session;
    use crate::plan::inference::decoding::Decoding;
    use crate::plan::inference::setting::InferConfig;
    use crate::plan::inference::shape::DecoderShape;

    /// `tests/data/hf_configs/{name}.json` imported.
    fn preset(name: &str) -> crate::model::Preset {
        let path = format!(
            "{}/../../tests/data/hf_configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).expect("config");
        crate::model::hf::from_config_text(&text, name).expect("preset")
    }

    fn llama(name: &str) -> LlamaParams {
        match preset(name).spec {
            crate::model::ModelSpec::Llama(p) => *p,
            _ => panic!("{name}: not a Llama-lineage decoder"),
        }
    }

    /// A bf16 `generate()` with transformers' defaults.
    fn generate(batch: u64, prompt: u64, new_tokens: u64) -> InferConfig {
        InferConfig::generate(batch, prompt, new_tokens, crate::plan::config::DType::BF16)
    }

    /// Llama 3.2 1B in bf16: GPU 0 keeps the largest unsplittable module still to place
    /// free: the embedding (tied to `lm_head`) while it is unplaced, then a decoder layer.
    #[test]
    fn gpu_keeps_the_largest_layer_free() {
        let p = llama("Llama-3.2-1B");
        let t = ModelTensors::new(&p, 2);
        let embed = 128_256 * 2048 * 2;
        let layer = t.layer_bytes();
        assert_eq!(layer, 60_821_504 * 2);
        // the embedding fits beside its own reserve (4.5 layers > its size); then the
        // embedding + 3 layers + a layer's reserve, plus half a layer: 3 layers on GPU 0
        assert!(embed < 4 * layer + layer / 2);
        let gpu = embed + 4 * layer + layer / 2;
        let pl = Placement::of(&p, 2, MaxMemory { gpu, cpu: None }).expect("placement");
        assert_eq!(pl.offload.layers_gpu, 3, "{:?}", pl.device_map);
        assert_eq!(
            pl.device_of("lm_head"),
            Device::Gpu0,
            "tied to the embedding"
        );
        assert_eq!(pl.device_of("model.layers.3"), Device::Cpu);
        assert_eq!(pl.device_of("model.norm"), Device::Cpu);
        // everything fits: one entry
        let all = Placement::of(
            &p,
            2,
            MaxMemory {
                gpu: 1 << 40,
                cpu: None,
            },
        )
        .expect("all");
        assert_eq!(all.device_map.entries, vec![(String::new(), Device::Gpu0)]);
        assert!(Streams::of(&all).is_none());
    }

    /// The dispatched model's events: what the measured call copies in, each copy followed
    /// by `empty_cache()`, and every buffer freed once.
    #[test]
    fn offloaded_weights_are_copied_in_at_each_forward() {
        let p = llama("Qwen2.5-0.5B");
        let shape = DecoderShape::from_params(&p).expect("shape");
        let cfg = generate(2, 64, 3);
        let pl = Placement::of(
            &p,
            2,
            MaxMemory {
                gpu: 455 << 20,
                cpu: None,
            },
        )
        .expect("pl");
        let off = pl.offload;
        assert!(off.layers_cpu > 0 && off.layers_gpu > 0, "{off:?}");
        let ev = session(&shape, &cfg, &Decoding::default(), &pl);
        let mut state = vec![0u8; ev.buffers.len()];
        for e in &ev.events {
            let st = &mut state[e.buffer as usize];
            assert_eq!(*st, u8::from(!e.alloc));
            *st += 1;
        }
        let measured = &ev.events[ev.measured_start..];
        let copied: Vec<u64> = measured
            .iter()
            .filter(|e| e.alloc && ev.buffers[e.buffer as usize].category == Category::Parameters)
            .map(|e| ev.buffers[e.buffer as usize].fixed)
            .collect();
        // per forward: the offloaded layers' tensors and the final norm's weight
        let per_layer = pl
            .tensors
            .layer_subs()
            .iter()
            .map(|&s| pl.tensors.tensors(s).len())
            .sum::<usize>();
        let per_forward = off.layers_cpu as usize * per_layer + 1;
        assert_eq!(copied.len(), 3 * per_forward, "3 forwards");
        let bytes_per_forward = off.layers_cpu * pl.tensors.layer_bytes() + 896 * 2;
        assert_eq!(copied.iter().sum::<u64>(), 3 * bytes_per_forward);
        // one empty_cache after each copy (warm-up and measured call) and one at dispatch
        assert_eq!(ev.empty_cache.len(), 2 * 3 * per_forward + 1);
        // resident: the embedding (tied lm_head), the layers on GPU 0 and the buffers
        let resident = 151_936 * 896 * 2 + off.layers_gpu * pl.tensors.layer_bytes() + 2 * 32 * 4;
        assert_eq!(pl.resident_bytes(), resident);
    }

    fn nf4() -> QuantStorage {
        QuantStorage {
            quant: crate::plan::finetune_mode::Quant::Nf4,
            double_quant: true,
        }
    }

    /// Llama 3.1 8B loaded with `BitsAndBytesConfig(load_in_4bit=True)` (nf4) in bf16 under
    /// `max_memory={0: "4GiB"}`: `compute_module_sizes` counts a quantized projection 0.5
    /// byte per element (`Bnb4BitHfQuantizer.param_element_size`), `lm_head` and the
    /// embedding 2; `adjust_max_memory` leaves 0.9 × 4 GiB. GPU 0 keeps the untied embedding
    /// and `lm_head`'s size free (the largest unsplittable module still to place), so after
    /// the embedding (1 050 673 152 B) it takes ⌊(0.9 × 4 GiB − 2 × 1 050 673 152) / layer⌋ =
    /// ⌊1 764 124 262.4 / 109 068 288⌋ = 16 layers; without the × 0.90 it would take 20, in
    /// bf16 weights 5; LLM.int8 (1 byte per element) 8.
    #[test]
    fn quantized_sizes_and_the_quantizers_max_memory() {
        let p = llama("Llama-3.1-8B");
        let gib4 = MaxMemory {
            gpu: 4 << 30,
            cpu: None,
        };
        let t = ModelTensors::with_quant(&p, 2, Some(nf4()));
        let linears = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336;
        assert_eq!(t.layer_bytes(), linears / 2 + 2 * 4096 * 2);
        assert_eq!(t.layer_bytes(), 109_068_288);
        let pl = Placement::of_quant(&p, 2, gib4, Some(nf4()), true).expect("placement");
        assert_eq!(pl.offload.layers_gpu, 16, "{:?}", pl.device_map);
        assert_eq!(pl.device_of("model.embed_tokens"), Device::Gpu0);
        assert_eq!(pl.device_of("model.layers.15"), Device::Gpu0);
        assert_eq!(pl.device_of("model.layers.16"), Device::Cpu);
        assert_eq!(pl.device_of("lm_head"), Device::Cpu);
        let q = pl.offload.quantizer.expect("quantizer");
        assert!((q.inferred_max_gpu_memory_bytes - 3_865_470_566.4).abs() < 1e-3);
        assert!(q.llm_int8_enable_fp32_cpu_offload);
        // the map in accelerate's naming: consecutive entries merged by clean_device_map
        let json = serde_json::to_value(&pl.device_map).expect("json");
        assert_eq!(json["model.embed_tokens"], 0);
        assert_eq!(json["model.layers.15"], 0);
        assert_eq!(json["model.layers.16"], "cpu");
        assert_eq!(json["lm_head"], "cpu");
        assert_eq!(json["model.norm"], "cpu");
        // the bytes per device are the quantized sizes (the rotary buffers, after the final
        // norm in `named_children`, are mapped to the CPU with it)
        let embed = 128_256 * 4096 * 2;
        assert_eq!(pl.offload.gpu_bytes, embed + 16 * 109_068_288);
        assert_eq!(
            pl.offload.cpu_bytes,
            16 * 109_068_288 + 4096 * 2 + 64 * 4 * 2 + embed
        );
        // the same budget: no quantizer factor → 20 layers; bf16 weights → 5
        let tree = t.tree();
        let plain = infer_auto_device_map(&tree, &t.tied_groups(), gib4, false).expect("map");
        let layers_on_0 = (0..32)
            .filter(|l| plain.device_of(&format!("model.layers.{l}")) == Some(Device::Gpu0))
            .count();
        assert_eq!(layers_on_0, 20);
        assert_eq!(
            Placement::of(&p, 2, gib4).expect("bf16").offload.layers_gpu,
            5
        );
        let int8 = QuantStorage {
            quant: crate::plan::finetune_mode::Quant::Int8,
            double_quant: false,
        };
        let pl8 = Placement::of_quant(&p, 2, gib4, Some(int8), true).expect("int8");
        assert_eq!(pl8.offload.layers_gpu, 8);
        // a CPU budget is scaled too: 0.9 × 3 GiB beside its reserve (the embedding-sized
        // lm_head still to place) holds ⌊1 848 429 772.8 / 218 120 192⌋ = 8 int8 layers; the
        // rest goes to disk
        let small_cpu = MaxMemory {
            gpu: 4 << 30,
            cpu: Some(3 << 30),
        };
        let d = Placement::of_quant(&p, 2, small_cpu, Some(int8), true).expect("disk");
        assert_eq!(d.offload.layers_cpu, 8, "{:?}", d.device_map);
        assert!(d.offload.layers_disk > 0);
    }

    /// transformers 5.17 refuses a quantized model with modules on "cpu" or "disk" unless
    /// `llm_int8_enable_fp32_cpu_offload=True`; a map that keeps everything on GPU 0 needs no
    /// flag.
    #[test]
    fn offloading_a_quantized_model_needs_the_fp32_cpu_offload_flag() {
        let p = llama("Llama-3.1-8B");
        let gib4 = MaxMemory {
            gpu: 4 << 30,
            cpu: None,
        };
        let err = Placement::of_quant(&p, 2, gib4, Some(nf4()), false).expect_err("refused");
        match err {
            PlanError::Field { field, reason } => {
                assert_eq!(field, "llm_int8_enable_fp32_cpu_offload");
                assert!(reason.contains(BNB_OFFLOAD_REFUSAL), "{reason}");
                assert!(reason.contains("\"model.layers.16\":\"cpu\""), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let roomy = MaxMemory {
            gpu: 40 << 30,
            cpu: None,
        };
        let all = Placement::of_quant(&p, 2, roomy, Some(nf4()), false).expect("fits");
        assert_eq!(all.device_map.entries, vec![(String::new(), Device::Gpu0)]);
        // the unquantized model offloads without any flag
        assert!(Placement::of(&p, 2, gib4).is_ok());
    }

    /// A quantized model's offloaded layers stay `Linear4bit` (transformers 5.17 converts
    /// before the map exists): each pre-forward copies a projection's quantized tensors —
    /// the `QuantState` (code, uint8 absmax, offset, nested absmax, nested code) and the
    /// packed weight — then one `empty_cache()` per parameter; the GPU 0 keys load as
    /// `QuantModel::load` loads them.
    #[test]
    fn offloaded_quantized_layers_copy_their_quantized_tensors() {
        use crate::plan::inference::InferPlanner;
        let preset = preset("Llama-3.1-8B");
        let cfg = generate(2, 64, 3);
        let gib4 = MaxMemory {
            gpu: 4 << 30,
            cpu: None,
        };
        // refused: the first forward fails in transformers 5.17 / accelerate 1.15 /
        // bitsandbytes 0.50.2 (measured, g30q-003 / -004)
        let refused = InferPlanner::with_device_map_quant(
            &preset,
            &cfg,
            &Decoding::default(),
            gib4,
            Some(nf4()),
            true,
        )
        .expect_err("refused");
        let PlanError::Field { field, reason } = &refused else {
            panic!("{refused}")
        };
        assert_eq!(*field, "quant");
        assert!(reason.contains(BNB_4BIT_OFFLOAD_ERRORS[0]), "{reason}");
        assert!(reason.contains("--quant int8"), "{reason}");
        // what it would copy, for when a release runs it
        let planner = InferPlanner::device_map_planner(
            &preset,
            &cfg,
            &Decoding::default(),
            gib4,
            Some(nf4()),
            true,
            false,
        )
        .expect("planner");
        let pl = planner.placement.as_ref().expect("placement");
        let off = pl.offload;
        assert_eq!((off.layers_gpu, off.layers_cpu), (16, 16));
        let ev = &planner.events;
        let mut state = vec![0u8; ev.buffers.len()];
        for e in &ev.events {
            let st = &mut state[e.buffer as usize];
            assert_eq!(*st, u8::from(!e.alloc));
            *st += 1;
        }
        let copied: Vec<u64> = ev.events[ev.measured_start..]
            .iter()
            .filter(|e| e.alloc && ev.buffers[e.buffer as usize].category == Category::Parameters)
            .map(|e| ev.buffers[e.buffer as usize].fixed)
            .collect();
        // per offloaded layer: 7 projections × 6 tensors + 2 norms; then model.norm, lm_head
        let per_forward = 16 * (7 * 6 + 2) + 2;
        assert_eq!(copied.len(), 3 * per_forward, "3 forwards");
        let t = &pl.tensors;
        let layer_stored: u64 = t.layer_subs().iter().flat_map(|&s| t.stored(s)).sum();
        let q_proj = nf4().tensors(4096 * 4096, 4096);
        assert_eq!(q_proj, vec![64, 262_144, 4, 4096, 1024, 8_388_608]);
        let embed = 128_256 * 4096 * 2;
        assert_eq!(
            copied.iter().sum::<u64>(),
            3 * (16 * layer_stored + 4096 * 2 + embed)
        );
        // one empty_cache per parameter copied, in the warm-up and the measured call, and
        // one at dispatch
        assert_eq!(ev.empty_cache.len(), 2 * 3 * (16 * 9 + 2) + 1);
        // weights on GPU 0: the quantized storage of the layers there, the embedding, the
        // rotary buffers
        let per_layer: u64 = t
            .layer_subs()
            .iter()
            .map(|&s| match t.quantized(s) {
                Some((q, rows, cols)) => q.bytes(rows * cols, rows),
                None => t.tensors(s).iter().sum(),
            })
            .sum();
        assert_eq!(planner.weights.0, embed + 16 * per_layer + 2 * 64 * 4);
        // the plan serializes the quantizer's budgets beside the map
        let plan = planner.plan(2).expect("plan");
        let v = serde_json::to_value(&plan).expect("json");
        assert_eq!(v["device_map"]["model.layers.16"], "cpu");
        assert_eq!(
            v["offload"]["quantizer"]["llm_int8_enable_fp32_cpu_offload"],
            true
        );
        assert_eq!(v["quant"]["quant"], "nf4");
        assert_eq!(v["weights_bytes"], planner.weights.0);
    }

    /// An offloaded `Linear8bitLt` keeps its last GPU copy (int8 weight and row scales) in its
    /// `MatMul8bitLtState` past `post_forward` (`init_8bit_state`), until its next call
    /// replaces it: after any call, every offloaded int8 projection holds one copy on the GPU.
    #[test]
    fn offloaded_int8_layers_keep_their_last_copy() {
        use crate::plan::inference::InferPlanner;
        let preset = preset("Llama-3.1-8B");
        let cfg = generate(1, 32, 2);
        let int8 = QuantStorage {
            quant: crate::plan::finetune_mode::Quant::Int8,
            double_quant: false,
        };
        let budget = MaxMemory {
            gpu: 4 << 30,
            cpu: None,
        };
        let planner = InferPlanner::with_device_map_quant(
            &preset,
            &cfg,
            &Decoding::default(),
            budget,
            Some(int8),
            true,
        )
        .expect("planner");
        let off = planner.placement.as_ref().expect("placement").offload;
        assert_eq!((off.layers_gpu, off.layers_cpu), (8, 24));
        let ev = &planner.events;
        let mut alive = vec![false; ev.buffers.len()];
        for e in &ev.events {
            alive[e.buffer as usize] = e.alloc;
        }
        let measured = &ev.events[ev.measured_start..];
        let streamed = |e: &&crate::plan::events::Event| {
            e.alloc && ev.buffers[e.buffer as usize].category == Category::Parameters
        };
        // per forward: 24 layers × (7 projections × (CB, SCB) + 2 norms), model.norm, lm_head
        assert_eq!(measured.iter().filter(streamed).count(), 2 * (24 * 16 + 2));
        // left on the GPU: the last forward's int8 copies, one per offloaded projection
        let kept: Vec<u64> = measured
            .iter()
            .filter(streamed)
            .filter(|e| alive[e.buffer as usize])
            .map(|e| ev.buffers[e.buffer as usize].fixed)
            .collect();
        assert_eq!(kept.len(), 24 * 7 * 2);
        let per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336;
        let scales = 4 * (4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096);
        assert_eq!(kept.iter().sum::<u64>(), 24 * (per_layer + scales));
    }

    #[test]
    fn runs_merge_consecutive_layers() {
        let m = DeviceMap {
            entries: vec![
                ("model.embed_tokens".into(), Device::Gpu0),
                ("model.layers.0".into(), Device::Gpu0),
                ("model.layers.1".into(), Device::Gpu0),
                ("model.layers.2".into(), Device::Cpu),
                ("model.layers.3".into(), Device::Cpu),
                ("model.layers.4".into(), Device::Disk),
                ("model.norm".into(), Device::Disk),
            ],
        };
        let names: Vec<String> = m
            .runs()
            .into_iter()
            .map(|(k, d)| format!("{k} {d}"))
            .collect();
        assert_eq!(
            names,
            [
                "model.embed_tokens 0",
                "model.layers.0–1 0",
                "model.layers.2–3 cpu",
                "model.layers.4 disk",
                "model.norm disk"
            ]
        );
    }

    #[test]
    fn clean_merges_subtrees_on_one_device() {
        let mut m = vec![
            ("model.embed_tokens".to_string(), Device::Gpu0),
            ("model.layers.0".to_string(), Device::Cpu),
            ("model.layers.1".to_string(), Device::Cpu),
            ("model.norm".to_string(), Device::Cpu),
            ("lm_head".to_string(), Device::Gpu0),
        ];
        clean(&mut m, "");
        let mut keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "lm_head",
                "model.embed_tokens",
                "model.layers",
                "model.norm"
            ]
        );
        let mut all = vec![
            ("model".to_string(), Device::Gpu0),
            ("lm_head".to_string(), Device::Gpu0),
        ];
        clean(&mut all, "");
        assert_eq!(all, vec![(String::new(), Device::Gpu0)]);
    }
}
