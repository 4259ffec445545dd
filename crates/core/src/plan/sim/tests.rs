//! Unit tests of `sim` (moved beside it from an inline module).

use super::*;
use crate::model::families::transformer::AttnImpl;
use crate::model::ir::{Op, Pointwise};
use crate::model::preset::builtin_presets;
use crate::plan::allocator::round_size;
use crate::plan::config::LoopShape;
use crate::plan::config::{Attention, Optimizer, Precision};
use crate::plan::events::Event;

/// The events of `cfg` on `g` with every parameter trained, under the default constants.
fn full_events(g: &Graph, cfg: &TrainConfig) -> Events {
    generate(
        g,
        cfg,
        &ParamPolicy::full(g, cfg.precision),
        &Constants::default(),
    )
}

#[test]
fn every_preset_gives_consistent_events() {
    for p in builtin_presets().expect("presets parse") {
        let size = p.default_size().min(256);
        let size = if p.input.is_tokens() {
            size
        } else {
            224.max(size)
        };
        let g = match p.build(size, AttnImpl::Sdpa) {
            Ok(g) => g,
            Err(e) => panic!("{}: {e}", p.id),
        };
        for prec in Precision::ALL {
            for ckpt in [false, true] {
                for accum in [1, 3] {
                    let cfg = TrainConfig {
                        precision: prec,
                        checkpointing: ckpt,
                        accum,
                        optimizer: Optimizer::AdamW,
                        attention: Attention::Sdpa,
                        ..TrainConfig::default()
                    };
                    let ev = full_events(&g, &cfg);
                    if let Err(e) = ev.check(&g) {
                        panic!("{} {prec} ckpt={ckpt} accum={accum}: {e}", p.id);
                    }
                }
            }
        }
    }
}

/// The expandable-segments bound a generation computes as it goes is the one a pass over its
/// events gives at batch 1, on every preset, with and without checkpointing and
/// accumulation; a generation for the default allocator computes none.
#[test]
fn the_bound_computed_while_generating_is_the_pass_over_the_events() {
    for p in builtin_presets().expect("presets parse") {
        let size = p.default_size().min(256);
        let size = if p.input.is_tokens() {
            size
        } else {
            224.max(size)
        };
        let g = p.build(size, AttnImpl::Sdpa).expect("graph");
        for (precision, checkpointing, accum) in
            [(Precision::AmpBf16, true, 3), (Precision::Fp32, false, 1)]
        {
            let mut cfg = TrainConfig {
                precision,
                checkpointing,
                accum,
                ..TrainConfig::default()
            };
            assert_eq!(full_events(&g, &cfg).bound_at_one, None, "{}", p.id);
            cfg.allocator.expandable_segments = true;
            let ev = full_events(&g, &cfg);
            let online = ev.bound_at_one.expect("computed for expandable segments");
            let pass = Events {
                bound_at_one: None,
                ..ev.clone()
            };
            let pass = crate::plan::eval::reserved_bound(&pass, 1, cfg.allocator);
            assert_eq!(Some(crate::units::Bytes(online)), pass, "{}", p.id);
            assert_eq!(
                crate::plan::eval::reserved_bound(&ev, 1, cfg.allocator),
                pass,
                "{}",
                p.id
            );
        }
    }
}

/// `AddBackward0` hands the same gradient to both operands: a residual add allocates
/// nothing in backward (allocator history of ResNet-18, H100, PyTorch 2.11).
#[test]
fn residual_add_passes_its_gradient_through() {
    let p = crate::model::preset::find_builtin("resnet18").expect("preset");
    let g = p.build(224, AttnImpl::Sdpa).expect("graph");
    let ev = generate(
        &g,
        &TrainConfig::default(),
        &ParamPolicy::full(&g, Precision::default()),
        &Constants::default(),
    );
    let adds: Vec<u32> = g
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            matches!(
                n.op,
                Op::Pointwise {
                    f: Pointwise::Add,
                    ..
                }
            )
        })
        .map(|(i, _)| i as u32)
        .collect();
    assert_eq!(adds.len(), 8, "one residual add per basic block");
    let in_backward = ev.events[ev.measured_start..]
        .iter()
        .filter(|e| e.alloc && e.phase == Phase::Backward && adds.contains(&e.node))
        .count();
    assert_eq!(in_backward, 0);
}

/// Tied embeddings (GPT-2's `wte` is also the LM head): at the embedding's backward its
/// gradient is summed with the head's out of place (a new tensor and the sum) in fp32,
/// in place into the fp32 gradient of autocast's weight copy under AMP.
#[test]
fn tied_weight_gradients_sum_out_of_place_unless_via_autocast() {
    let p = crate::model::preset::find_builtin("gpt2").expect("preset");
    let g = p.build(128, AttnImpl::Sdpa).expect("graph");
    let wte = g
        .nodes
        .iter()
        .position(|n| g.name(n) == "transformer.wte")
        .expect("wte") as u32;
    let bytes = g.params[0].elems * 4;
    for (precision, expect) in [(Precision::Fp32, 2), (Precision::AmpBf16, 1)] {
        let cfg = TrainConfig {
            precision,
            ..TrainConfig::default()
        };
        let ev = full_events(&g, &cfg);
        let weight_sized = ev.events[ev.measured_start..]
            .iter()
            .filter(|e| e.alloc && e.phase == Phase::Backward && e.node == wte)
            .filter(|e| ev.buffers[e.buffer as usize].fixed == bytes)
            .count();
        assert_eq!(weight_sized, expect, "{precision}");
    }
}

/// A trainer loop releases the logits when the loss is taken, a plain one at the end of
/// the micro-step.
#[test]
fn trainer_loop_frees_the_logits_before_backward() {
    let p = crate::model::preset::find_builtin("gpt2").expect("preset");
    let g = p.build(128, AttnImpl::Sdpa).expect("graph");
    let logits = g.nodes.last().map(|n| n.inputs[0]).expect("loss");
    let head = g
        .nodes
        .iter()
        .position(|n| n.output == logits)
        .expect("head") as u32;
    for (loop_shape, phase) in [
        (LoopShape::Plain, Phase::Backward),
        (LoopShape::Trainer, Phase::Forward),
    ] {
        let cfg = TrainConfig {
            loop_shape,
            precision: Precision::Fp32,
            ..TrainConfig::default()
        };
        let ev = full_events(&g, &cfg);
        let measured = &ev.events[ev.measured_start..];
        let logits_bytes = g.tensors[logits].per_sample * 4;
        let buf = measured
            .iter()
            .find(|e| {
                e.alloc
                    && e.node == head
                    && ev.buffers[e.buffer as usize].per_sample == logits_bytes
            })
            .map(|e| e.buffer)
            .expect("logits allocated");
        let freed = measured
            .iter()
            .find(|e| !e.alloc && e.buffer == buf)
            .expect("logits freed");
        assert_eq!(freed.phase, phase, "{loop_shape}");
    }
}

/// Lightning's closure runs `training_step`, then `zero_grad`, then `backward`: the last
/// step's gradients are freed after the measured step's forward (and its logits before
/// backward, as in a trainer loop); every other loop frees them before the forward.
#[test]
fn lightning_zeroes_gradients_after_the_forward() {
    let p = crate::model::preset::find_builtin("gpt2").expect("preset");
    let g = p.build(128, AttnImpl::Sdpa).expect("graph");
    for loop_shape in LoopShape::ALL {
        for accum in [1, 2] {
            let cfg = TrainConfig {
                loop_shape,
                accum,
                precision: Precision::AmpBf16,
                ..TrainConfig::default()
            };
            let ev = full_events(&g, &cfg);
            let measured = &ev.events[ev.measured_start..];
            let is_grad = |e: &Event| ev.buffers[e.buffer as usize].category == Category::Gradients;
            let first_grad_free = measured
                .iter()
                .position(|e| !e.alloc && is_grad(e))
                .expect("the last step's gradients are freed");
            let forward_events = |micro: u16| {
                measured
                    .iter()
                    .enumerate()
                    .filter(move |(_, e)| e.phase == Phase::Forward && e.micro == micro)
                    .map(|(i, _)| i)
            };
            let first_forward = forward_events(0).min().expect("forward");
            let last_forward = forward_events(0).max().expect("forward");
            let first_backward = measured
                .iter()
                .position(|e| e.phase == Phase::Backward)
                .expect("backward");
            // The gradients of the last step: all freed in one run, before any new one.
            let grads_freed = measured[first_grad_free..]
                .iter()
                .take_while(|e| !e.alloc && is_grad(e))
                .count();
            assert_eq!(
                grads_freed,
                g.params.len(),
                "{loop_shape}: one gradient per parameter"
            );
            if loop_shape == LoopShape::Lightning {
                assert!(
                    first_grad_free > last_forward && first_grad_free < first_backward,
                    "{loop_shape} accum {accum}: gradients freed at event {first_grad_free}, \
                     forward {first_forward}..={last_forward}, backward from {first_backward}"
                );
                assert_eq!(measured[first_grad_free].phase, Phase::ZeroGrad);
            } else {
                assert!(
                    first_grad_free < first_forward,
                    "{loop_shape} accum {accum}: gradients freed at {first_grad_free}, forward \
                     from {first_forward}"
                );
            }
        }
    }
}

/// `NewGELUActivation` runs as Python ops: each temporary dies when the next value exists
/// and the output comes last (GPT-2's allocator history under AMP bf16, H200): at most
/// two fp32 temporaries are live at once, never beside the output.
#[test]
fn gelu_new_allocates_in_python_order() {
    let p = crate::model::preset::find_builtin("gpt2").expect("preset");
    let g = p.build(128, AttnImpl::Sdpa).expect("graph");
    let cfg = TrainConfig {
        precision: Precision::AmpBf16,
        ..TrainConfig::default()
    };
    let ev = full_events(&g, &cfg);
    let act = g
        .nodes
        .iter()
        .position(|n| n.op == Op::GeluNewPython)
        .expect("a gelu_new") as u32;
    let seq: Vec<(bool, Category)> = ev.events[ev.measured_start..]
        .iter()
        .filter(|e| e.node == act && e.phase == Phase::Forward)
        .map(|e| (e.alloc, ev.buffers[e.buffer as usize].category))
        .collect();
    use Category::{Activations as A, Transient as T};
    let expect = [
        (true, A), // 0.5 * x
        (true, A), // x cast to fp32 for pow, saved
        (true, T), // pow
        (true, T), // 0.044715 * ·
        (false, T),
        (true, T), // x + ·
        (false, T),
        (true, T), // sqrt(2/π) * ·
        (false, T),
        (true, A), // tanh, saved
        (false, T),
        (true, A),  // 1 + tanh, saved
        (true, A),  // the output
        (false, A), // x itself, whose last reader this was
    ];
    assert_eq!(seq, expect);
}

/// `gate, up = gate_up.chunk(2, dim=-1)` (Phi-3's fused MLP, the MoE experts): the
/// activation and the product give half-size gradients, and the split node concatenates
/// them into one new gradient of the whole `gate_up` at the first chunk (the order of
/// the `mul`, `mul`, `silu_backward`, `cat` allocations in the per-op trace of Mixtral's
/// experts, H200, PyTorch 2.11).
#[test]
fn chunk_gradients_are_halves_then_one_cat() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/hf_configs_device/Phi-3-mini-4k-instruct-L3.json"
    );
    let text = std::fs::read_to_string(path).expect("config");
    let p = crate::model::hf::from_config_text(&text, "phi3").expect("preset");
    let g = p.build(64, AttnImpl::Sdpa).expect("graph");
    let cfg = TrainConfig {
        precision: Precision::Fp32,
        ..TrainConfig::default()
    };
    let ev = full_events(&g, &cfg);
    let chunks: Vec<usize> = (0..g.nodes.len())
        .filter(|&i| g.nodes[i].op == Op::Chunk)
        .collect();
    assert_eq!(chunks.len(), 2 * 3, "two chunks per layer");
    let whole = g.tensors[g.nodes[chunks[0]].inputs[0]].per_sample * 4;
    let half = whole / 2;
    let bwd_allocs = |node: usize| -> Vec<u64> {
        ev.events[ev.measured_start..]
            .iter()
            .filter(|e| e.alloc && e.phase == Phase::Backward && e.node == node as u32)
            .map(|e| ev.buffers[e.buffer as usize].per_sample)
            .collect()
    };
    // the first chunk of the first layer: the one cat
    assert_eq!(bwd_allocs(chunks[0]), vec![whole]);
    assert!(bwd_allocs(chunks[1]).is_empty());
    // between the chunks and the down projection nothing allocates a whole gradient
    for n in chunks[1] + 1..chunks[1] + 3 {
        let a = bwd_allocs(n);
        assert!(a.iter().all(|&x| x <= half), "node {n}: {a:?}");
        assert!(!a.is_empty(), "node {n} computes a gradient");
    }
}

/// `generate_unless_above` stops exactly when the bytes live at batch 1 (each buffer
/// rounded as the allocator rounds it) pass its bound at some event, and a generation it
/// stops is one whose replay at batch 1 cannot stay within that bound: the capped allocator
/// runs out (what lets the make-it-fit search drop such a combination unfinished).
#[test]
fn a_generation_stops_only_where_the_replay_at_batch_one_passes_its_bound() {
    use crate::plan::config::AllocatorConfig;
    use crate::plan::eval::reserved_within;
    use crate::units::Bytes;
    for (id, ckpt, accum) in [
        ("gpt2", false, 1),
        ("gpt2", true, 2),
        ("resnet50", false, 1),
    ] {
        let p = builtin_presets()
            .expect("presets")
            .into_iter()
            .find(|p| p.id == id)
            .expect("preset");
        let size = if p.input.is_tokens() { 256 } else { 224 };
        let g = p.build(size, AttnImpl::Sdpa).expect("graph");
        let cfg = TrainConfig {
            checkpointing: ckpt,
            accum,
            ..TrainConfig::default()
        };
        let policy = ParamPolicy::full(&g, cfg.precision);
        let k = Constants::default();
        let full = generate(&g, &cfg, &policy, &k);
        // The largest live bytes at batch 1 over every event.
        let (mut live, mut most) = (0u64, 0u64);
        for e in &full.events {
            let b = &full.buffers[e.buffer as usize];
            let size = round_size(b.per_sample + b.fixed);
            if e.alloc {
                live += size;
                most = most.max(live);
            } else {
                live -= size;
            }
        }
        let kept = generate_unless_above(&g, &cfg, &policy, &k, most).expect("within its bound");
        assert_eq!(kept.events, full.events, "{id}");
        assert_eq!(kept.buffers.len(), full.buffers.len(), "{id}");
        assert!(
            generate_unless_above(&g, &cfg, &policy, &k, most - 1).is_none(),
            "{id}: not stopped one byte under its peak"
        );
        for expandable in [false, true] {
            let alloc = AllocatorConfig {
                expandable_segments: expandable,
                ..AllocatorConfig::default()
            };
            let under = reserved_within(&full, 1, alloc, Bytes(most - 1)).expect("replay");
            assert!(
                under.is_none(),
                "{id}: the replay fits under the bound it passed"
            );
        }
    }
}

/// Every field of `Events` but the ones set after the generation.
fn assert_same_events(a: &Events, b: &Events, what: &str) {
    assert_eq!(a.buffers, b.buffers, "{what}: buffers");
    assert_eq!(a.events, b.events, "{what}: events");
    assert_eq!(a.measured_start, b.measured_start, "{what}: measured_start");
    assert_eq!(a.side_streams, b.side_streams, "{what}: side_streams");
    assert_eq!(a.bound_at_one, b.bound_at_one, "{what}: bound_at_one");
}

/// The measured step repeated from the warm-up's micro-steps (`repeat.rs`) gives the events
/// of the walk, on every preset under every precision, with and without checkpointing and
/// accumulation; and on GPT-2 and a Llama under the other loop shapes, reentrant
/// checkpointing, evaluation steps, LoRA and QLoRA, expandable segments and multi-GPU
/// strategies (which walk), and where a generation stops.
#[test]
fn the_repeated_measured_step_is_the_walked_one() {
    use crate::plan::config::AllocatorConfig;
    use crate::plan::distributed::{Distributed, Strategy};
    use crate::plan::finetune::apply;
    use crate::plan::finetune_mode::{FineTune, FineTuneMode};
    use crate::plan::step_kind::StepKind;
    let k = Constants::default();
    let same = |g: &Graph, cfg: &TrainConfig, policy: &ParamPolicy, what: &str| {
        let walked = generate_with(g, cfg, policy, &k, u64::MAX, None, false).expect("walked");
        let repeated = generate_with(g, cfg, policy, &k, u64::MAX, None, true).expect("repeated");
        assert_same_events(&repeated, &walked, what);
        // Stopped at the same bounds: the peak (in the measured step where its live bytes
        // pass the warm-up's) and half of it.
        let (mut live, mut peak) = (0u64, 0u64);
        for e in &walked.events {
            let b = &walked.buffers[e.buffer as usize];
            let size = round_size(b.per_sample + b.fixed);
            live = if e.alloc { live + size } else { live - size };
            peak = peak.max(live);
        }
        // Under a bound it never passes, the copy that moves the running figures by what
        // the warm-up's micro-steps moved them gives the walk's events and bound.
        for stop in [peak, peak + 1] {
            let kept = generate_with(g, cfg, policy, &k, stop, None, true).expect("within");
            assert_same_events(&kept, &walked, &format!("{what} under {stop}"));
        }
        for stop in [peak - 1, peak / 2] {
            let a = generate_with(g, cfg, policy, &k, stop, None, false).is_some();
            let b = generate_with(g, cfg, policy, &k, stop, None, true).is_some();
            assert_eq!(a, b, "{what}: stopped at {stop}");
        }
    };
    for p in builtin_presets().expect("presets parse") {
        let size = p.default_size().min(256);
        let size = if p.input.is_tokens() {
            size
        } else {
            224.max(size)
        };
        let g = p.build(size, AttnImpl::Sdpa).expect("graph");
        for prec in Precision::ALL {
            for ckpt in [false, true] {
                for accum in [1, 3] {
                    let cfg = TrainConfig {
                        precision: prec,
                        checkpointing: ckpt,
                        accum,
                        ..TrainConfig::default()
                    };
                    let policy = ParamPolicy::full(&g, prec);
                    same(
                        &g,
                        &cfg,
                        &policy,
                        &format!("{} {prec} {ckpt} {accum}", p.id),
                    );
                }
            }
        }
    }
    for id in ["gpt2", "Llama-2-7b-hf"] {
        let p = crate::model::preset::find_builtin(id).expect("preset");
        let g = p.build(128, AttnImpl::Sdpa).expect("graph");
        for loop_shape in [LoopShape::Plain, LoopShape::Trainer, LoopShape::Lightning] {
            for step in [StepKind::Train, StepKind::Eval, StepKind::EvalGrad] {
                for reentrant in [false, true] {
                    for expandable in [false, true] {
                        let cfg = TrainConfig {
                            precision: Precision::AmpBf16,
                            checkpointing: true,
                            checkpoint_reentrant: reentrant,
                            accum: 2,
                            loop_shape,
                            step,
                            allocator: AllocatorConfig {
                                expandable_segments: expandable,
                                ..AllocatorConfig::default()
                            },
                            ..TrainConfig::default()
                        };
                        let policy = ParamPolicy::full(&g, cfg.precision);
                        let what = format!("{id} {loop_shape:?} {step:?} {reentrant} {expandable}");
                        same(&g, &cfg, &policy, &what);
                    }
                }
            }
        }
        for mode in [FineTuneMode::Lora, FineTuneMode::Qlora] {
            for prec in Precision::ALL {
                let ft = FineTune {
                    mode,
                    lora_rank: 8,
                    ..FineTune::default()
                };
                let Ok((lg, lp)) = apply(g.clone(), &ft, prec) else {
                    continue;
                };
                for ckpt in [false, true] {
                    let cfg = TrainConfig {
                        precision: prec,
                        checkpointing: ckpt,
                        accum: 4,
                        finetune: ft,
                        ..TrainConfig::default()
                    };
                    same(&lg, &cfg, &lp, &format!("{id} {mode:?} {prec} {ckpt}"));
                }
            }
        }
        for strategy in [
            Strategy::Ddp,
            Strategy::Zero1,
            Strategy::Fsdp2,
            Strategy::Zero3,
        ] {
            let cfg = TrainConfig {
                accum: 2,
                distributed: Distributed::new(4, strategy),
                ..TrainConfig::default()
            };
            let policy = ParamPolicy::full(&g, cfg.precision);
            same(&g, &cfg, &policy, &format!("{id} {strategy:?}"));
        }
    }
}

/// Autograd's generated backward functions compute their inputs' gradients in the sorted
/// order of derivatives.yaml's names: a bias-free linear layer (`mm`: `mat2`, then `self`)
/// writes its weight's gradient before its input's, a linear layer with a bias (`addmm`:
/// `mat1`, `mat2`, `self`) its input's first (allocator histories of gemma-2 and BERT, H100).
#[test]
fn linear_gradients_follow_derivatives_yaml_sorted_names() {
    let p = crate::model::preset::find_builtin("gpt2").expect("preset");
    let g = p.build(128, AttnImpl::Sdpa).expect("graph");
    let cfg = TrainConfig {
        precision: Precision::Fp32,
        ..TrainConfig::default()
    };
    let ev = full_events(&g, &cfg);
    let measured = &ev.events[ev.measured_start..];
    // The first two tensors each linear layer's backward allocates: (input's, weight's).
    let first_two = |node: usize| -> Vec<bool> {
        measured
            .iter()
            .filter(|e| e.alloc && e.phase == Phase::Backward && e.node as usize == node)
            .take(2)
            .map(|e| ev.buffers[e.buffer as usize].per_sample > 0)
            .collect()
    };
    let linears: Vec<usize> = (g.nodes.iter().enumerate())
        .filter(|(_, n)| matches!(n.op, Op::Linear { .. }))
        .map(|(i, _)| i)
        .collect();
    let (mut biased, mut bias_free) = (0, 0);
    for n in linears {
        let order = first_two(n);
        if g.nodes[n].params.len() == 1 {
            // `mm`: the weight's gradient (no per-sample bytes), then the input's.
            assert_eq!(order, [false, true], "{}", g.name(&g.nodes[n]));
            bias_free += 1;
        } else {
            assert_eq!(order, [true, false], "{}", g.name(&g.nodes[n]));
            biased += 1;
        }
    }
    assert!(biased >= 12 && bias_free == 1, "{biased} {bias_free}");
}
