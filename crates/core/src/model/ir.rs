//! The model IR: a list of ops with concrete per-sample shapes.
//!
//! Every tensor's size is given in elements for ONE sample (`per_sample`) plus
//! elements independent of the batch (`fixed`); the planner multiplies by the
//! micro-batch. Floating-point dtypes are not fixed here: the planner assigns
//! them from the precision mode, the way autocast would.

use serde::Serialize;

/// Index of a tensor in [`Graph::tensors`].
pub type TensorId = usize;
/// Index of a parameter tensor in [`Graph::params`].
pub type ParamId = usize;

/// What a tensor's elements are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Elem {
    /// Floating point; dtype chosen by the precision mode.
    Float,
    /// 64-bit integers (token ids, labels, pooling indices).
    Int64,
}

/// A tensor produced by an op (or the data input).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tensor {
    /// Elements per sample.
    pub per_sample: u64,
    /// Elements independent of the batch size.
    pub fixed: u64,
    pub elem: Elem,
}

/// A parameter tensor (trainable weights), counted in elements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Param {
    pub elems: u64,
    /// The last two dimensions `(dim[-2], dim[-1])` of tensors with two or more dims
    /// (factored optimizers keep `elems/dim[-1]` row and `elems/dim[-2]` column statistics);
    /// `None` for vectors.
    pub matrix: Option<(u64, u64)>,
}

/// Pointwise ops whose saved-for-backward rule is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Pointwise {
    /// `relu`: saves its output.
    Relu,
    /// `gelu` (erf or tanh approximation, one kernel): saves its input.
    Gelu,
    /// `silu`: saves its input.
    Silu,
    /// `hardswish`: saves its input.
    Hardswish,
    /// `hardsigmoid`: saves its input.
    Hardsigmoid,
    /// `sigmoid`: saves its output.
    Sigmoid,
    /// `tanh`: saves its output.
    Tanh,
    /// `a + b` (broadcasting allowed): saves nothing.
    Add,
    /// `a * b` where both need gradients: saves both (a parameter operand in
    /// `Node::params` is saved for free).
    Mul,
    /// `a * b` where only input 0 needs a gradient: saves input 1 (small or not).
    MulByConstTensor,
    /// Multiplication or addition by a Python scalar: saves nothing.
    Scale,
    /// `x.pow(3)` — on the fp32 autocast list: saves its input.
    Pow,
    /// `x.clamp(min, max)` with Python scalars (gpt-oss's SwiGLU limit): saves its input.
    Clamp,
}

/// Operations of the IR. Shapes are per sample; see each variant for what it saves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Op {
    /// Data created on the GPU each micro-step (images or token ids).
    Input,
    /// `nn.Linear` / HF `Conv1D` (addmm): autocast lower-precision; saves input and weight.
    Linear { in_features: u64, out_features: u64 },
    /// A bitsandbytes base layer under a QLoRA adapter (`Linear4bit`, or `Linear8bitLt`
    /// when `int8`): a frozen quantized weight, dequantized per call (see
    /// `plan::rules` for what it allocates and saves).
    QuantLinear {
        in_features: u64,
        out_features: u64,
        int8: bool,
    },
    /// `nn.Conv2d` (and ConvTranspose2d): autocast lower-precision; saves input and weight.
    Conv2d {
        transposed: bool,
        kernel: u64,
        groups: u64,
        out_channels: u64,
    },
    /// Batched matmul of two activations: lower-precision; saves both inputs. Per sample:
    /// `batch` products of `(m × k) · (k × n)` (attention: one per head).
    Matmul { batch: u64, m: u64, k: u64, n: u64 },
    /// `nn.Embedding`: saves the indices; output in the weight's dtype.
    Embedding,
    /// `nn.BatchNorm2d` (train mode): saves input and per-channel statistics; output in input dtype.
    BatchNorm { channels: u64 },
    /// `nn.LayerNorm`: autocast fp32; saves input and per-row mean/rstd.
    LayerNorm { rows: u64 },
    /// Hugging Face `LlamaRMSNorm` (Python: to(fp32), pow, mean, rsqrt, mul, to(dtype), mul weight).
    RmsNorm { rows: u64 },
    /// transformers `T5LayerNorm`: the variance from `x.to(fp32).pow(2).mean`, then
    /// `x * rsqrt(var)` on the input itself (fp32 by promotion, saving `x`), cast to the
    /// weight's dtype when that is 16-bit, then `weight * x`.
    T5LayerNorm { rows: u64 },
    /// Gemma's RMSNorm: `(norm(x.float()) * (1 + weight.float())).type_as(x)`; the product
    /// is taken in fp32, so the normalised fp32 tensor is what the multiply saves.
    RmsNormOffset { rows: u64 },
    /// A pointwise op; `inplace` writes into input 0 (a clone of the input is saved where the rule needs it).
    Pointwise { f: Pointwise, inplace: bool },
    /// The Hugging Face `NewGELUActivation` ("gelu_new", Python tanh formula).
    GeluNewPython,
    /// `softmax` over the last dim: autocast fp32; saves its output. `fp32`: called with
    /// `dtype=torch.float32` (output fp32 whatever the input).
    Softmax { fp32: bool },
    /// Dropout with probability `p` (train mode): saves a bool mask; `inplace` writes into the input.
    Dropout { p: f64, inplace: bool },
    /// `max_pool2d`: saves input and int64 indices of the output's size.
    MaxPool,
    /// Average / adaptive-average pooling: saves its input.
    AvgPool,
    /// `F.interpolate` bilinear: saves nothing.
    Upsample,
    /// `torch.cat` along channels: saves nothing.
    Concat,
    /// A view (reshape of contiguous data, transpose, slice): no allocation.
    View,
    /// One output of `torch.chunk` / `split` (a view, no allocation). In backward autograd's
    /// split node waits for every chunk's gradient and concatenates them into one new
    /// gradient of the whole input (`cat`, zeros for a chunk without gradient).
    Chunk,
    /// A copy (`.contiguous()`, `.expand().reshape()`, `clone`): saves nothing.
    Copy,
    /// `attn_output.permute(2, 0, 1, 3).contiguous()` in `nn.MultiheadAttention` after SDPA:
    /// with 16-bit inputs the flash kernel writes its output in the query's layout, so the
    /// permuted tensor is already contiguous and nothing is copied; the fp32 kernel's output
    /// is copied (seen in allocator traces of ViT-B/16, H200, PyTorch 2.11).
    SdpaOutContiguous,
    /// `x.type(value.dtype)` / `.to(query.dtype)` after an fp32 softmax: a copy into the
    /// mode's compute dtype when the input is in another dtype, else the same tensor.
    ToComputeDtype,
    /// `x.to(torch.float32)` (peft's `_cast_input_dtype` before fp32 LoRA adapters): a copy
    /// when the input is in another dtype, else the same tensor; saves nothing.
    ToF32,
    /// Rotary position embedding `(x * cos) + (rotate_half(x) * sin)`: a new tensor, nothing
    /// per-sample saved (cos/sin do not need gradients), two input-sized temporaries.
    Rope,
    /// Hugging Face `DynamicCache.update` in training (`use_cache=True` unless gradient
    /// checkpointing is on): `torch.cat([empty, x])` copies K or V; the copy is held by
    /// `out.past_key_values` until the step's output is dropped. A second input sets the
    /// dtype (transformers 5.17 creates the value cache in the key's dtype).
    CacheAppend,
    /// A tensor built inside forward without gradients (an additive attention mask).
    Constant,
    /// `scaled_dot_product_attention` with a fused kernel (flash / memory-efficient):
    /// saves q, k, v, the output and the per-row logsumexp.
    /// With fp32 inputs and grouped kv heads no fused kernel applies and PyTorch runs the
    /// math path (repeated k/v, a materialised seq×seq probability tensor).
    Sdpa {
        heads: u64,
        kv_heads: u64,
        head_dim: u64,
        seq: u64,
        dropout: f64,
    },
    /// `torch._grouped_mm(x, w.transpose(-2, -1), offs)` of a mixture-of-experts block
    /// (transformers' default `grouped_mm` experts): the routed rows of every expert in one
    /// call against a 3-D expert weight `(experts, out_features, in_features)`. Not on
    /// autocast's lists: runs in the weight's dtype (`input.to(weight.dtype)` first); saves
    /// the input (for the weight gradient) and the weight.
    GroupedMm { in_features: u64, out_features: u64 },
    /// `torch.topk(probs, k)` of a router: the values (output) and int64 indices (saved
    /// for backward).
    TopK,
    /// Advanced indexing `x[idx]` with a no-grad int64 index of the output's rows (sorted
    /// token order): saves the index (`indices` extra int64 elements per sample, with
    /// `mask` bool elements of a sentinel mask held with it); backward scatters into
    /// zeros of the input's shape.
    Gather { indices: u64, mask: u64 },
    /// `x.view(tokens, k, hidden).sum(dim=1)`: the top-k rows of each token summed; its
    /// backward is an expand of the output gradient (no new tensor).
    SumTopK,
    /// `x.to(other.dtype)`: a copy into input 1's dtype when it differs, else the same
    /// tensor; saves nothing.
    TypeAs,
    /// `scaled_dot_product_attention` with an additive float `attn_mask` (T5's relative
    /// position bias, input 3, batch-independent `(1, heads, q_len, kv_len)`): the fused
    /// memory-efficient kernel (flash takes no mask). Saves q, k, v, the mask, the output and
    /// the logsumexp; when the mask trains (`bias_grad`) its backward writes a gradient of
    /// the mask expanded over the batch, `(batch, heads, q_len, kv_len)`, summed afterwards.
    /// `bias_grad` is PyTorch's math backend (`_scaled_dot_product_attention_math`), which a
    /// training mask forces; Falcon's multi-query call (one key/value head, no `enable_gqa`)
    /// takes it too, with a per-sample mask that does not train.
    SdpaBias {
        heads: u64,
        head_dim: u64,
        q_len: u64,
        kv_len: u64,
        dropout: f64,
        bias_grad: bool,
    },
    /// Cross-entropy over `classes` for `rows` positions per sample (log_softmax saves its
    /// fp32 output; Hugging Face LM losses upcast logits with `.float()` first when `upcast`).
    CrossEntropy {
        rows: u64,
        classes: u64,
        upcast: bool,
    },
}

/// Tensor or parameter ids of one op: up to [`Ids::INLINE`] stored in place (no heap
/// allocation per op), more on the heap. Reads as a slice.
#[derive(Clone, PartialEq, Eq)]
pub enum Ids {
    Inline { len: u8, ids: [usize; Ids::INLINE] },
    Heap(Vec<usize>),
}

impl Ids {
    pub const INLINE: usize = 4;
}

impl From<&[usize]> for Ids {
    fn from(ids: &[usize]) -> Ids {
        match ids.len() {
            len @ 0..=Ids::INLINE => {
                let mut inline = [0; Ids::INLINE];
                inline[..len].copy_from_slice(ids);
                Ids::Inline {
                    len: len as u8,
                    ids: inline,
                }
            }
            _ => Ids::Heap(ids.to_vec()),
        }
    }
}

impl std::ops::Deref for Ids {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        match self {
            Ids::Inline { len, ids } => &ids[..usize::from(*len)],
            Ids::Heap(ids) => ids,
        }
    }
}

impl<'a> IntoIterator for &'a Ids {
    type Item = &'a usize;
    type IntoIter = std::slice::Iter<'a, usize>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl std::fmt::Debug for Ids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Ids {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// One op applied to tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    pub op: Op,
    pub inputs: Ids,
    pub output: TensorId,
    /// Parameters this op uses (weights first, then bias).
    pub params: Ids,
    /// Checkpointable block this op belongs to (activation checkpointing unit).
    pub block: Option<u32>,
    /// Layer name for timelines ("layer3.2.conv1"): bytes of [`Graph::names`], read with
    /// [`Graph::name`] (one string for all names, no allocation per op).
    pub name: std::ops::Range<u32>,
}

/// A model: tensors, parameters and ops in forward order. The last op is the loss.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Graph {
    pub tensors: Vec<Tensor>,
    pub params: Vec<Param>,
    pub nodes: Vec<Node>,
    /// The layer names of all nodes, one after the other.
    pub names: String,
    /// Tensors Python keeps referenced past their last reader, sorted by [`Hold::node`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<Hold>,
}

/// A tensor a module's `forward` keeps referenced after the last op that reads it: its
/// argument `x`, held by the call's frame until the module returns (peft's `lora.Linear`
/// reads `x` in `dropout(x)` and returns after `result + …`). Released after `node` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Hold {
    /// The module's last op.
    pub node: usize,
    pub tensor: TensorId,
}

impl Graph {
    /// The layer name of `node` ("layer3.2.conv1").
    pub fn name(&self, node: &Node) -> &str {
        self.names
            .get(node.name.start as usize..node.name.end as usize)
            .unwrap_or_default()
    }

    /// Total trainable parameters (elements).
    pub fn param_count(&self) -> u64 {
        self.params.iter().map(|p| p.elems).sum()
    }

    /// Sum of per-sample output elements of all convolutions, and their count (tests
    /// compare these with PyTorch forward hooks).
    #[cfg(test)]
    pub fn conv_outputs(&self) -> (u64, usize) {
        let convs: Vec<u64> = self
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Conv2d { .. }))
            .map(|n| self.tensors[n.output].per_sample)
            .collect();
        (convs.iter().sum(), convs.len())
    }

    /// Number of checkpointable blocks.
    pub fn block_count(&self) -> u32 {
        self.nodes
            .iter()
            .filter_map(|n| n.block)
            .max()
            .map_or(0, |b| b + 1)
    }
}
