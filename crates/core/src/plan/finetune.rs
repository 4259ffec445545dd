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

use super::PlanError;
use super::config::{DType, Precision};
use super::policy::{ParamPolicy, QuantStorage};
use crate::model::ir::{Elem, Graph, Node, Op, Param, Pointwise, Tensor};

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
        let q = quant.filter(|_| !node.params.is_empty() && !keeps_dtype(&name));
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
        if !ft.lora_targets.matches(&name) || out_features == 0 {
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
    g.nodes = nodes;
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
            return;
        }
        let sum = self.tensor(out_elems);
        self.push(pw(Pointwise::Add), &[base, s], sum, &[], ".lora_add");
        self.push(Op::ToComputeDtype, &[sum], result, &[], ".lora_to");
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
mod tests {
    use super::*;
    use crate::model::families::transformer::AttnImpl;
    use crate::model::preset::find_builtin;
    use crate::plan::config::TrainConfig;
    use crate::plan::events::{Constants, Phase};
    use crate::plan::rules::{SavedFor, saved_for};
    use crate::plan::sim::generate;

    fn graph(id: &str) -> Graph {
        find_builtin(id)
            .expect(id)
            .build(128, AttnImpl::Sdpa)
            .expect("graph")
    }

    /// Per-sample bytes the measured step's forward leaves allocated (saved tensors and
    /// the kept output).
    fn forward_bytes(g: &Graph, policy: &ParamPolicy) -> i128 {
        let cfg = TrainConfig {
            precision: Precision::Fp32,
            ..TrainConfig::default()
        };
        let ev = generate(g, &cfg, policy, &Constants::default());
        ev.check(g).expect("events");
        ev.events[ev.measured_start..]
            .iter()
            .filter(|e| e.phase == Phase::Forward)
            .map(|e| {
                let s = i128::from(ev.buffers[e.buffer as usize].per_sample);
                if e.alloc { s } else { -s }
            })
            .sum()
    }

    #[test]
    fn saved_inputs_serve_the_gradients_of_derivatives_yaml() {
        let g = graph("gpt2");
        let linear = g
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::Linear { .. }) && !n.params.is_empty())
            .expect("linear");
        assert_eq!(saved_for(linear, 0), SavedFor::Params);
        let layer_norm = g
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::LayerNorm { .. }))
            .expect("layer norm");
        assert_eq!(saved_for(layer_norm, 0), SavedFor::Output);
        let eager = find_builtin("gpt2")
            .expect("gpt2")
            .build(128, AttnImpl::Eager)
            .expect("graph");
        let mm = eager
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::Matmul { .. }) && n.inputs.len() == 2)
            .expect("matmul");
        assert_eq!(saved_for(mm, 0), SavedFor::Input(1));
        assert_eq!(saved_for(mm, 1), SavedFor::Input(0));
    }

    /// A frozen body saves nothing for backward: only the trainable head keeps its input;
    /// LoRA keeps the adapters' inputs and the frozen layers' other saves, not the base
    /// layers' inputs.
    #[test]
    fn frozen_layers_save_only_what_remaining_gradients_need() {
        let g = graph("TinyLlama-1.1B");
        let full = forward_bytes(&g, &ParamPolicy::full(&g, Precision::Fp32));
        let mut head_only = ParamPolicy::full(&g, Precision::Fp32);
        let head = g
            .nodes
            .iter()
            .rev()
            .find(|n| matches!(n.op, Op::Linear { .. }))
            .expect("lm_head");
        for p in 0..g.params.len() {
            if !head.params.contains(&p) {
                head_only.freeze(p);
            }
        }
        let frozen = forward_bytes(&g, &head_only);
        // What stays: the head's input, the logits and log-softmax output (fp32, vocab-wide).
        let vocab_bytes = 2 * 128 * 32000 * 4;
        assert!(
            frozen >= vocab_bytes && frozen < vocab_bytes + full / 50,
            "{frozen} vs {full}"
        );
        let ft = FineTune {
            mode: FineTuneMode::Lora,
            lora_rank: 8,
            lora_targets: LoraTargets::Attn,
            ..FineTune::default()
        };
        let (lg, lp) = apply(g.clone(), &ft, Precision::Fp32).expect("lora");
        let lora = forward_bytes(&lg, &lp);
        assert!(frozen < lora && lora < full, "{frozen} < {lora} < {full}");
        // q_proj and v_proj inputs are the same normed hidden state as k_proj's: what LoRA
        // keeps of each block is the saves of norms, attention, MLP (all needed for the
        // input gradient), and the rank-8 adapter activations.
        assert!(lora * 10 > full * 7, "{lora} vs {full}");
    }

    #[test]
    fn lora_adds_fp32_adapters_and_freezes_the_base() {
        let g = graph("gpt2");
        let base = g.param_count();
        let ft = FineTune {
            mode: FineTuneMode::Lora,
            lora_rank: 4,
            lora_targets: "c_attn,c_fc".parse().expect("targets"),
            ..FineTune::default()
        };
        let (lg, lp) = apply(g.clone(), &ft, Precision::Bf16).expect("lora");
        let layers = g.block_count() as u64;
        let adapters = layers * 4 * ((768 + 3 * 768) + (768 + 4 * 768));
        assert_eq!(lg.param_count(), base + adapters);
        assert_eq!(lp.trainable_elems(&lg), adapters);
        assert_eq!(lp.state(0).storage, DType::BF16);
        assert_eq!(lp.state(lg.params.len() - 1).storage, DType::F32);
        assert!(!lp.trainable(0));
        // The layer's consumers still read the same tensor: the adapter's last op writes it.
        let c_attn = g
            .nodes
            .iter()
            .position(|n| g.name(n).ends_with("attn.c_attn"))
            .expect("c_attn");
        let out = g.nodes[c_attn].output;
        let writer = lg.nodes.iter().find(|n| n.output == out).expect("writer");
        assert!(lg.name(writer).ends_with("c_attn.lora_to"));
    }

    /// QLoRA quantizes every linear but the output embedding; the other base parameters
    /// stay fp32; the adapters are the LoRA ones.
    #[test]
    fn qlora_quantizes_the_linears_and_keeps_lora_adapters() {
        let g = graph("TinyLlama-1.1B");
        let lora = FineTune {
            mode: FineTuneMode::Lora,
            lora_targets: LoraTargets::AllLinear,
            ..FineTune::default()
        };
        let qlora = FineTune {
            mode: FineTuneMode::Qlora,
            ..lora
        };
        let (lg, lp) = apply(g.clone(), &lora, Precision::AmpBf16).expect("lora");
        let (qg, qp) = apply(g.clone(), &qlora, Precision::AmpBf16).expect("qlora");
        assert_eq!(lp.trainable_elems(&lg), qp.trainable_elems(&qg));
        assert_eq!(lg.param_count(), qg.param_count());
        let quant = qg
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::QuantLinear { int8: false, .. }))
            .count();
        assert_eq!(quant, 7 * g.block_count() as usize);
        let head = qg
            .nodes
            .iter()
            .rev()
            .find(|n| matches!(n.op, Op::Linear { .. }) && !n.params.is_empty())
            .expect("lm_head");
        assert!(qg.name(head).ends_with("lm_head"), "{}", qg.name(head));
        // A 2048×5632 NF4 weight with double quantization: 4 bits per weight plus about
        // 1/64 byte of scale per weight.
        let (frozen, trainable) = qp.frozen_trainable_bytes(&qg);
        let (lfrozen, ltrainable) = lp.frozen_trainable_bytes(&lg);
        assert_eq!(trainable, ltrainable);
        assert!(frozen * 3 < lfrozen, "{frozen} vs {lfrozen}");
        let w = QuantStorage {
            quant: Quant::Nf4,
            double_quant: true,
        };
        let n = 2048 * 5632;
        assert_eq!(
            w.bytes(n, 5632),
            // packed, code, 8-bit absmax, fp32 absmax of 704 blocks of 256 (2816 → 3072),
            // the 256-entry code, the offset
            n / 2 + 512 + n / 64 + 3072 + 1024 + 512
        );
        let single = QuantStorage {
            double_quant: false,
            ..w
        };
        assert_eq!(single.bytes(n, 5632), n / 2 + 512 + 4 * n / 64);
        let int8 = QuantStorage {
            quant: Quant::Int8,
            ..w
        };
        assert_eq!(int8.bytes(n, 5632), n + 4 * 5632);
        // QLoRA "bf16" (a model loaded in bf16) runs in fp32 after prepare_model_for_kbit_training.
        let cfg = TrainConfig {
            precision: Precision::Bf16,
            finetune: qlora,
            ..TrainConfig::default()
        };
        cfg.validate().expect("qlora in bf16 is planned");
        assert_eq!(cfg.effective_precision(), Precision::Fp32);
    }

    /// `lora_dropout > 0`: every adapted module runs its own `nn.Dropout` on its (cast) input
    /// and `lora_A` reads its output; q_proj and v_proj each keep a dropout output and a
    /// bool mask where without dropout they shared one saved input.
    #[test]
    fn lora_dropout_runs_one_dropout_per_adapted_module() {
        let g = graph("TinyLlama-1.1B");
        let ft = FineTune {
            mode: FineTuneMode::Lora,
            ..FineTune::default()
        };
        let with = FineTune {
            lora_dropout: LoraDropout::new(0.05).expect("p"),
            ..ft
        };
        let (lg, lp) = apply(g.clone(), &ft, Precision::Fp32).expect("lora");
        let (dg, dp) = apply(g.clone(), &with, Precision::Fp32).expect("dropout");
        let dropouts: Vec<&Node> = dg
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Dropout { p, inplace: false } if p == 0.05))
            .collect();
        let layers = g.block_count() as usize;
        assert_eq!(dropouts.len(), 2 * layers);
        assert!(!lg.nodes.iter().any(|n| matches!(n.op, Op::Dropout { .. })));
        // q_proj's and v_proj's dropouts read the same normed hidden state (through their
        // own casts, aliases in fp32), and each feeds its lora_A.
        for d in &dropouts {
            assert!(dg.name(d).ends_with("proj.lora_dropout"), "{}", dg.name(d));
            let a = dg
                .nodes
                .iter()
                .find(|n| n.inputs.contains(&d.output))
                .expect("reader");
            assert!(dg.name(a).ends_with(".lora_A"), "{}", dg.name(a));
        }
        assert_eq!(dp.trainable_elems(&dg), lp.trainable_elems(&lg));
        // Per block and token: two fp32 dropout outputs and two bool masks instead of the
        // one fp32 input both adapters saved. The first block's input (frozen embeddings)
        // needs no gradient: autograd records no dropout there, and keeps no mask.
        let hidden = 2048;
        let grown = forward_bytes(&dg, &dp) - forward_bytes(&lg, &lp);
        let per_block = 128 * hidden * (2 * (4 + 1) - 4);
        assert_eq!(
            grown,
            (layers as i128 - 1) * per_block + 128 * hidden * (2 * 4 - 4)
        );
        // The eval step's model.eval() turns them back into identities (checked in
        // sim/eval_step.rs for every Op::Dropout).
    }

    #[test]
    fn lora_dropout_is_checked_and_written_as_users_write_it() {
        for (s, p) in [("0", 0.0), ("0.05", 0.05), ("0.1", 0.1), (" 0.5 ", 0.5)] {
            let d: LoraDropout = s.parse().expect(s);
            assert_eq!(d.p(), p, "{s}");
            assert_eq!(d.is_zero(), p == 0.0);
        }
        for bad in ["1", "1.5", "-0.1", "NaN", "inf", "abc", ""] {
            let err = bad.parse::<LoraDropout>().expect_err(bad).to_string();
            assert!(err.starts_with("lora_dropout: "), "{bad}: {err}");
        }
        // Tiny and near-1 probabilities stay dropouts in [0, 1).
        let tiny = LoraDropout::new(1e-9).expect("tiny");
        assert!(!tiny.is_zero());
        assert!(LoraDropout::new(0.999_999_9).expect("near 1").p() < 1.0);
        let ft = FineTune {
            mode: FineTuneMode::Lora,
            lora_dropout: LoraDropout::new(0.05).expect("p"),
            ..FineTune::default()
        };
        let text = serde_json::to_string(&ft).expect("json");
        assert!(text.contains(r#""lora_dropout":0.05,"#), "{text}");
        assert_eq!(serde_json::from_str::<FineTune>(&text).expect("back"), ft);
        let err = serde_json::from_str::<FineTune>(r#"{"mode":"lora","lora_dropout":1.0}"#)
            .expect_err("p = 1")
            .to_string();
        assert!(err.contains("lora_dropout"), "{err}");
        assert!(serde_json::from_str::<FineTune>(r#"{"lora_dropout":"0.1"}"#).is_err());
    }

    #[test]
    fn targets_and_ranks_are_checked_and_round_trip() {
        for s in [
            "attn",
            "all-linear",
            "c_attn,c_fc",
            "q_proj,v_proj,down_proj",
        ] {
            let t: LoraTargets = s.parse().expect(s);
            assert_eq!(t.to_string(), s);
        }
        let err = "c_attn,nope".parse::<LoraTargets>().expect_err("unknown");
        assert!(
            err.to_string()
                .starts_with("lora_targets: unknown module `nope`")
        );
        assert!("".parse::<LoraTargets>().is_err());
        let bad = FineTune {
            mode: FineTuneMode::Lora,
            lora_rank: 0,
            ..FineTune::default()
        };
        assert!(
            bad.validate()
                .expect_err("rank 0")
                .to_string()
                .starts_with("lora_rank:")
        );
        // No layer of a CNN is a LoRA target.
        let r = apply(
            graph("resnet18"),
            &FineTune {
                mode: FineTuneMode::Lora,
                ..FineTune::default()
            },
            Precision::Fp32,
        );
        assert!(matches!(
            r,
            Err(PlanError::Field {
                field: "lora_targets",
                ..
            })
        ));
    }

    #[test]
    fn config_files_without_finetune_mean_full_training() {
        let cfg: TrainConfig = serde_json::from_str(r#"{"batch": 4}"#).expect("old file");
        assert!(cfg.finetune.is_full());
        let text = serde_json::to_string(&cfg).expect("json");
        assert!(!text.contains("finetune"), "{text}");
        let lora = TrainConfig {
            finetune: FineTune {
                mode: FineTuneMode::Lora,
                lora_rank: 32,
                lora_targets: LoraTargets::AllLinear,
                ..FineTune::default()
            },
            ..cfg
        };
        let text = serde_json::to_string(&lora).expect("json");
        assert!(
            text.contains(
                r#""finetune":{"mode":"lora","lora_rank":32,"lora_targets":"all-linear","quant":"nf4","double_quant":true}"#
            ),
            "{text}"
        );
        let back: TrainConfig = serde_json::from_str(&text).expect("round trip");
        assert_eq!(back, lora);
    }

    /// Partial full fine-tuning: freezing the embeddings stops their gradient and state
    /// (GPT-2's head is tied to `wte`: frozen with it); freezing the first blocks as well
    /// removes what autograd saved for them, since nothing before them needs a gradient.
    /// Freezing only early blocks keeps most activations (the embeddings still train, so
    /// the gradient flows back through the frozen blocks).
    #[test]
    fn frozen_embeddings_and_blocks_train_less_and_save_less() {
        let g = graph("gpt2");
        let policy = |ft: FineTune| apply(g.clone(), &ft, Precision::Fp32).expect("apply").1;
        let full = policy(FineTune::default());
        let total = full.trainable_elems(&g);
        let emb = policy(FineTune {
            freeze_embeddings: true,
            ..FineTune::default()
        });
        // wte (50257 × 768, tied head) and wpe (1024 × 768) stop training.
        assert_eq!(total - emb.trainable_elems(&g), (50257 + 1024) * 768);
        let early = policy(FineTune {
            freeze_blocks: 6,
            ..FineTune::default()
        });
        let both = policy(FineTune {
            freeze_embeddings: true,
            freeze_blocks: 6,
            ..FineTune::default()
        });
        assert!(early.trainable_elems(&g) < total);
        assert_eq!(
            total - both.trainable_elems(&g),
            (total - emb.trainable_elems(&g)) + (total - early.trainable_elems(&g))
        );
        let (f_full, f_early, f_both) = (
            forward_bytes(&g, &full),
            forward_bytes(&g, &early),
            forward_bytes(&g, &both),
        );
        assert!(f_early <= f_full, "{f_early} > {f_full}");
        // Half the blocks need no gradient at all: roughly half the saved activations go.
        assert!(f_both * 10 < f_full * 7, "{f_both} vs {f_full}");
        // Errors name the field.
        let e = apply(
            g.clone(),
            &FineTune {
                freeze_blocks: 13,
                ..FineTune::default()
            },
            Precision::Fp32,
        )
        .expect_err("13 of 12 blocks");
        assert!(e.to_string().contains("freeze_blocks"), "{e}");
        let lora = FineTune {
            mode: FineTuneMode::Lora,
            freeze_embeddings: true,
            ..FineTune::default()
        };
        assert!(
            lora.validate()
                .expect_err("lora")
                .to_string()
                .contains("freeze_embeddings")
        );
        let resnet = find_builtin("resnet50")
            .expect("resnet")
            .build(64, AttnImpl::Sdpa)
            .expect("graph");
        let e = apply(
            resnet,
            &FineTune {
                freeze_embeddings: true,
                ..FineTune::default()
            },
            Precision::Fp32,
        )
        .expect_err("no embeddings");
        assert!(e.to_string().contains("freeze_embeddings"), "{e}");
    }
}
