//! Fine-tuning modes: which parameters train, and the LoRA adapters peft 0.21 adds to the
//! graph, op by op as `lora.Linear.forward` runs them (unmerged, one adapter):
//!
//! ```text
//! result = base_layer(x)                       # frozen weight
//! x = x.to(lora_A.weight.dtype)                # _cast_input_dtype: fp32 adapters
//! result = result + lora_B(lora_A(dropout(x))) * scaling
//! result = result.to(torch_result_dtype)
//! ```
//!
//! peft keeps the adapters in fp32 on a bf16/fp16 base (`autocast_adapter_dtype=True`).
//! `dropout` is each adapted module's own `lora_dropout[adapter]`: `nn.Identity` when
//! `lora_dropout == 0`, else `nn.Dropout(p)` ([`Op::Dropout`], train mode): a new tensor in
//! its input's dtype and a saved bool mask, and `lora_A` saves the dropout output instead of
//! `x`. Modules reading the same `x` (q, k, v) each run their own.
//!
//! QLoRA: every linear but the output embedding becomes a bitsandbytes base layer
//! ([`Op::QuantLinear`], its storage a [`QuantStorage`] of the policy), and peft's
//! `lora/bnb.py` forward runs instead (under autocast no input cast, and for 4-bit a
//! defensive `result.clone()`):
//!
//! ```text
//! result = self.base_layer(x).clone()          # Linear4bit: output in x's dtype
//! result = result + lora_B(lora_A(dropout(x))) * scaling
//! ```
//!
//! `prepare_model_for_kbit_training` leaves every other base parameter in fp32; the
//! 4-bit layers' biases are cast to the bf16 compute dtype by their first forward.

use super::config::{DType, Precision};
use super::error::PlanError;
use super::policy::{ParamPolicy, QuantStorage};
use crate::model::ir::{Elem, Graph, Hold, Node, Op, Param, Pointwise, Tensor};

pub use super::finetune_mode::{
    FineTune, FineTuneMode, LORA_MODULES, LoraDropout, LoraTargets, MAX_LORA_RANK, Quant,
};

/// The graph to simulate and its parameter policy under `ft`.
pub fn apply(g: Graph, ft: &FineTune, prec: Precision) -> Result<(Graph, ParamPolicy), PlanError> {
    match ft.mode {
        FineTuneMode::Full => {
            let mut p = ParamPolicy::full(&g, prec);
            freeze_parts(&g, ft, &mut p)?;
            Ok((g, p))
        }
        FineTuneMode::Lora => lora(g, ft, prec, None),
        FineTuneMode::Qlora => {
            let q = QuantStorage {
                quant: ft.quant,
                double_quant: ft.double_quant,
            };
            lora(g, ft, prec, Some(q))
        }
    }
}

/// Full fine-tuning of part of the model: the embeddings (every parameter an embedding
/// lookup uses) and/or the parameters of the first `freeze_blocks` blocks stop training. A
/// parameter shared with a trainable op (a tied head) is frozen all the same, as
/// `requires_grad_(False)` on the tensor does.
fn freeze_parts(g: &Graph, ft: &FineTune, p: &mut ParamPolicy) -> Result<(), PlanError> {
    if !ft.freeze_embeddings && ft.freeze_blocks == 0 {
        return Ok(());
    }
    let blocks = g
        .nodes
        .iter()
        .filter_map(|n| n.block)
        .max()
        .map_or(0, |b| b + 1);
    if ft.freeze_blocks > blocks {
        return Err(PlanError::Field {
            field: "freeze_blocks",
            reason: format!(
                "{} is more than the model's {blocks} blocks",
                ft.freeze_blocks
            ),
        });
    }
    if ft.freeze_embeddings && !g.nodes.iter().any(|n| matches!(n.op, Op::Embedding)) {
        return Err(PlanError::Field {
            field: "freeze_embeddings",
            reason: "this model has no embedding lookup (an image model?): nothing to freeze"
                .into(),
        });
    }
    for n in &g.nodes {
        let embedding = ft.freeze_embeddings && matches!(n.op, Op::Embedding);
        let early = n.block.is_some_and(|b| b < ft.freeze_blocks);
        if embedding || early {
            for &q in n.params.iter() {
                p.freeze(q);
            }
        }
    }
    Ok(())
}

/// Whether a linear named `name` keeps its dtype under QLoRA (the output embedding:
/// transformers' `get_keys_to_not_convert`).
fn keeps_dtype(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    matches!(last, "lm_head" | "decoder")
}

fn lora(
    mut g: Graph,
    ft: &FineTune,
    prec: Precision,
    quant: Option<QuantStorage>,
) -> Result<(Graph, ParamPolicy), PlanError> {
    let base_params = g.params.len();
    let mut quantized: Vec<(usize, bool)> = Vec::new();
    let old = std::mem::take(&mut g.nodes);
    let old_holds = std::mem::take(&mut g.holds);
    // Room for every layer adapted, so that the lists are not copied as they grow (the fit
    // search builds a graph per LoRA setting; each copy's pages are faults).
    // Each added op's name is its layer's and a suffix (".lora_scaling", the longest: 13 bytes).
    let (added_ops, adapted_layers, added_names) = old
        .iter()
        .filter_map(|n| match n.op {
            Op::Linear { out_features, .. } if adapts(ft, g.name(n), out_features) => {
                let q = layer_quant(quant, n, g.name(n));
                Some((adapter_ops(ft, q), n.name.len()))
            }
            _ => None,
        })
        .fold((0, 0, 0), |(ops, layers, bytes), (o, name)| {
            (ops + o, layers + 1, bytes + o * (name + 13))
        });
    let room = old.len() + added_ops;
    let mut nodes: Vec<Node> = Vec::with_capacity(room);
    g.tensors.reserve(added_ops);
    g.params.reserve(2 * adapted_layers);
    g.holds.reserve(2 * adapted_layers + old_holds.len());
    g.names.reserve(added_names);
    // Each old node's last op in the new list (an adapted layer's is its adapter's last),
    // where the graph's holds move.
    let mut moved = Vec::with_capacity(old.len());
    let mut adapted = 0usize;
    for (i, mut node) in old.into_iter().enumerate() {
        // (The previous node's, now that it is in.)
        if i > 0 {
            moved.push(nodes.len() - 1);
        }
        let Op::Linear {
            in_features,
            out_features,
        } = node.op
        else {
            nodes.push(node);
            continue;
        };
        let name = g.name(&node).to_string();
        let q = layer_quant(quant, &node, &name);
        if let Some(q) = q {
            node.op = Op::QuantLinear {
                in_features,
                out_features,
                int8: !q.quant.is_4bit(),
            };
            for (k, &p) in node.params.iter().enumerate() {
                quantized.push((p, k == 0));
            }
        }
        if !adapts(ft, &name, out_features) {
            nodes.push(node);
            continue;
        }
        if ft.lora_targets == LoraTargets::Attn && name.rsplit('.').next() == Some("qkv_proj") {
            // Phi-3's fused projection: peft 0.21's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
            // has no "phi3" entry, so `LoraConfig()` without target_modules raises there.
            return Err(PlanError::Field {
                field: "lora_targets",
                reason: "peft has no default LoRA targets for this model type (phi3):                          LoraConfig() without target_modules raises; name them, e.g.                          qkv_proj (--lora-targets qkv_proj) or all-linear"
                    .into(),
            });
        }
        adapted += 1;
        let mut e = Emit {
            g: &mut g,
            nodes: &mut nodes,
            name,
            block: node.block,
        };
        e.adapter(node, (in_features, out_features), ft, q);
    }
    debug_assert!(
        nodes.len() <= room,
        "adapter_ops undercounts an adapter's ops"
    );
    if !nodes.is_empty() {
        moved.push(nodes.len() - 1);
    }
    g.holds.extend(old_holds.into_iter().map(|h| Hold {
        node: moved.get(h.node).copied().unwrap_or(h.node),
        ..h
    }));
    g.nodes = nodes;
    g.holds.sort_by_key(|h| h.node);
    if adapted == 0 {
        return Err(PlanError::Field {
            field: "lora_targets",
            reason: format!(
                "`{}` matches no linear layer of this model",
                ft.lora_targets
            ),
        });
    }
    let policy = adapter_policy(&g, prec, base_params, quant, &quantized);
    Ok((g, policy))
}

/// Whether LoRA adapts the linear named `name` with `out_features` outputs.
fn adapts(ft: &FineTune, name: &str, out_features: u64) -> bool {
    out_features > 0 && ft.lora_targets.matches(name)
}

/// How the linear `node` named `name` is stored under `quant`: quantized unless it has no
/// weight or keeps its dtype ([`keeps_dtype`]).
fn layer_quant(quant: Option<QuantStorage>, node: &Node, name: &str) -> Option<QuantStorage> {
    quant.filter(|_| !node.params.is_empty() && !keeps_dtype(name))
}

/// Ops an adapted layer adds beside its base op ([`Emit::adapter`]), at most: the input cast
/// (not for a quantized base), dropout, A, B, the scaling, the sum, and the cast back (the
/// base's clone for a 4-bit base, nothing for an 8-bit one).
fn adapter_ops(ft: &FineTune, quant: Option<QuantStorage>) -> usize {
    let dropout = usize::from(!ft.lora_dropout.is_zero());
    let cast = usize::from(quant.is_none());
    dropout + cast + 5
}

/// Appends the ops of one adapted layer named `name` to `nodes`.
struct Emit<'a> {
    g: &'a mut Graph,
    nodes: &'a mut Vec<Node>,
    name: String,
    block: Option<u32>,
}

impl Emit<'_> {
    fn tensor(&mut self, per_sample: u64) -> usize {
        self.g.tensors.push(Tensor {
            per_sample,
            fixed: 0,
            elem: Elem::Float,
        });
        self.g.tensors.len() - 1
    }

    fn push(&mut self, op: Op, inputs: &[usize], output: usize, params: &[usize], suffix: &str) {
        let start = self.g.names.len();
        self.g.names.push_str(&self.name);
        self.g.names.push_str(suffix);
        let at = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
        self.nodes.push(Node {
            op,
            inputs: inputs.into(),
            output,
            params: params.into(),
            block: self.block,
            name: at(start)..at(self.g.names.len()),
        });
    }

    fn param(&mut self, rows: u64, cols: u64) -> usize {
        self.g.params.push(Param {
            elems: rows * cols,
            matrix: Some((rows, cols)),
        });
        self.g.params.len() - 1
    }

    /// The base layer `node` (its output renamed) and peft's adapter ops after it, writing
    /// the layer's old output tensor; `q`: the base is a bitsandbytes layer.
    fn adapter(
        &mut self,
        mut node: Node,
        (in_features, out_features): (u64, u64),
        ft: &FineTune,
        q: Option<QuantStorage>,
    ) {
        let rank = ft.lora_rank;
        let result = node.output;
        let out_elems = self.g.tensors[result].per_sample;
        let rows = out_elems / out_features;
        let x = node.inputs[0];
        let base = self.tensor(out_elems);
        node.output = base;
        self.nodes.push(node);
        let x_elems = self.g.tensors[x].per_sample;
        // peft's bnb layers cast nothing under autocast; their fp32 base (after
        // prepare_model_for_kbit_training) needs no cast otherwise.
        let mut xa = x;
        if q.is_none() {
            xa = self.tensor(x_elems);
            self.push(Op::ToF32, &[x], xa, &[], ".lora_cast");
        }
        let cast = xa;
        if !ft.lora_dropout.is_zero() {
            let d = self.tensor(x_elems);
            let op = Op::Dropout {
                p: ft.lora_dropout.p(),
                inplace: false,
            };
            self.push(op, &[xa], d, &[], ".lora_dropout");
            xa = d;
        }
        let pa = self.param(rank, in_features);
        let pb = self.param(out_features, rank);
        let a = self.tensor(rows * rank);
        let linear = |in_features, out_features| Op::Linear {
            in_features,
            out_features,
        };
        self.push(linear(in_features, rank), &[xa], a, &[pa], ".lora_A");
        let b = self.tensor(out_elems);
        self.push(linear(rank, out_features), &[a], b, &[pb], ".lora_B");
        let s = self.tensor(out_elems);
        let pw = |f| Op::Pointwise { f, inplace: false };
        self.push(pw(Pointwise::Scale), &[b], s, &[], ".lora_scaling");
        if let Some(q) = q {
            let mut base = base;
            if q.quant.is_4bit() {
                let c = self.tensor(out_elems);
                self.push(Op::Copy, &[base], c, &[], ".base_clone");
                base = c;
            }
            self.push(pw(Pointwise::Add), &[base, s], result, &[], ".lora_add");
            self.hold(&[x]);
            return;
        }
        let sum = self.tensor(out_elems);
        self.push(pw(Pointwise::Add), &[base, s], sum, &[], ".lora_add");
        self.push(Op::ToComputeDtype, &[sum], result, &[], ".lora_to");
        self.hold(&[x, cast]);
    }

    /// `lora.Linear.forward(x)` keeps its argument `x` (in its caller's frame) and the
    /// input cast it rebinds `x` to until it returns, after the last op pushed.
    fn hold(&mut self, tensors: &[usize]) {
        let node = self.nodes.len() - 1;
        for (k, &tensor) in tensors.iter().enumerate() {
            if !tensors[..k].contains(&tensor) {
                self.g.holds.push(Hold { node, tensor });
            }
        }
    }
}

/// The base frozen, the adapters (parameters from `base_params` on) in fp32; with QLoRA
/// the `quantized` layers' weights (`true`) and biases stored as bitsandbytes leaves them,
/// the rest of the base in fp32 (`prepare_model_for_kbit_training`).
fn adapter_policy(
    g: &Graph,
    prec: Precision,
    base_params: usize,
    quant: Option<QuantStorage>,
    quantized: &[(usize, bool)],
) -> ParamPolicy {
    let mut policy = ParamPolicy::full(g, prec);
    for p in 0..base_params {
        policy.freeze(p);
    }
    for p in base_params..g.params.len() {
        policy.set_storage(p, DType::F32);
    }
    if let Some(q) = quant {
        for p in 0..base_params {
            policy.set_storage(p, DType::F32);
        }
        for &(p, weight) in quantized {
            if weight {
                policy.set_quant(p, q);
            } else if q.quant.is_4bit() {
                policy.set_storage(p, DType::BF16);
            }
        }
    }
    policy
}

#[cfg(test)]
mod tests;
