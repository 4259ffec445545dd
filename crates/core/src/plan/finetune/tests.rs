//! Unit tests of `finetune` (moved beside it from an inline module).

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
        lora_targets: LoraTargets::Names(LoraTargets::mask_of(&["c_attn", "c_fc"])),
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
    // (The words users type for it are read in `crates/words/src/settings.rs`, tested there.)
    for p in [0.0, 0.05, 0.1, 0.5] {
        let d = LoraDropout::new(p).expect("p");
        assert_eq!(d.p(), p);
        assert_eq!(d.is_zero(), p == 0.0);
    }
    for bad in [1.0, 1.5, -0.1, f64::NAN, f64::INFINITY] {
        let err = LoraDropout::new(bad).expect_err("p").to_string();
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
    // (The words users type for the targets are read in `crates/words/src/settings.rs`, tested
    // there; the saved form round-trips.)
    for t in [
        LoraTargets::Attn,
        LoraTargets::AllLinear,
        LoraTargets::Names(LoraTargets::mask_of(&["c_attn", "c_fc"])),
        LoraTargets::Names(LoraTargets::mask_of(&["q_proj", "v_proj", "down_proj"])),
    ] {
        let json = serde_json::to_string(&t).expect("json");
        assert_eq!(json, format!("\"{t}\""));
        assert_eq!(serde_json::from_str::<LoraTargets>(&json).expect("back"), t);
    }
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
