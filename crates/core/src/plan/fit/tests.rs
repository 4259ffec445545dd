use super::*;
use crate::model::preset::find_builtin;
use crate::plan::Planner;
use crate::plan::config::{Optimizer, Precision};
use crate::plan::distributed::{Distributed, FsdpMixedPrecision, Offload, Strategy};
use crate::plan::finetune_mode::{FineTuneMode, LoraDropout};
use crate::plan::gpus::{Gpu, catalog};
use crate::plan::search::fits;

/// The catalog card with this id.
fn gpu(id: &str) -> Gpu {
    catalog()
        .into_iter()
        .find(|g| g.id == id)
        .expect("a catalog id")
}

fn request(id: &str) -> FitRequest {
    FitRequest::for_gpu(&gpu(id), 0.05)
}

fn llama3_cfg() -> TrainConfig {
    TrainConfig {
        batch: 4,
        accum: 4,
        size: Some(2048),
        ..TrainConfig::default()
    }
}

/// Every returned candidate fits when planned again from its config alone, and keeps the
/// effective batch.
fn check_candidates(preset: &Preset, user: &TrainConfig, req: &FitRequest, r: &FitReport) {
    for c in &r.candidates {
        assert_eq!(
            c.config.batch * c.config.accum,
            r.effective_batch,
            "{}",
            c.summary()
        );
        assert_eq!(c.micro_batch, c.config.batch);
        let planner = Planner::new(preset, &c.config).expect("planner");
        assert!(
            fits(&planner, req.budget, c.config.batch).expect("fits"),
            "does not fit when re-planned: {}",
            c.summary()
        );
        assert!(c.nvidia_smi <= req.budget.usable(), "{}", c.summary());
        assert_eq!(c.config.size, user.size);
    }
    // Ranked by time per sample after the user's own configuration.
    let rest = if r.candidates.first().is_some_and(|c| c.is_user_config) {
        1
    } else {
        0
    };
    for w in r.candidates[rest..].windows(2) {
        assert!(w[0].time.ms_per_sample <= w[1].time.ms_per_sample);
    }
}

/// At the upper edge of the measured reserved band (llama/lora/none under-predicted reserved
/// by up to 16 % on one row) LoRA in bf16 no longer fits 24 GB at any micro-batch; QLoRA
/// does, and full fine-tuning never does.
#[test]
fn llama3_8b_on_a_4090_fits_with_qlora_at_the_band() {
    let preset = find_builtin("Meta-Llama-3-8B").expect("preset");
    let user = llama3_cfg();
    let req = request("rtx-4090");
    let r = fit(&preset, &user, &req).expect("fit");
    assert!(!r.candidates.is_empty(), "{:?}", r.reason);
    assert!(r.reason.is_none());
    check_candidates(&preset, &user, &req, &r);
    assert!(!r.candidates[0].is_user_config);
    assert!(
        r.candidates
            .iter()
            .any(|c| c.config.finetune.mode == FineTuneMode::Qlora)
    );
    for c in &r.candidates {
        assert_ne!(
            c.config.finetune.mode,
            FineTuneMode::Full,
            "{}",
            c.summary()
        );
        assert!(!c.changes.is_empty() && !c.costs.is_empty());
    }
    assert!(r.planned <= req.max_plans);
    assert!(r.pruned_dead > 0);
}

#[test]
fn the_users_config_comes_first_when_it_fits() {
    let preset = find_builtin("gpt2").expect("preset");
    let user = TrainConfig {
        batch: 4,
        size: Some(512),
        ..TrainConfig::default()
    };
    let req = request("rtx-4090");
    let r = fit(&preset, &user, &req).expect("fit");
    let first = r.candidates.first().expect("candidate");
    assert!(first.is_user_config && first.changes.is_empty());
    assert_eq!(first.config, user);
    check_candidates(&preset, &user, &req, &r);
    // Nothing slower that only adds remedies to it is listed.
    for c in &r.candidates[1..] {
        assert!(
            c.time.ms_per_sample < first.time.ms_per_sample,
            "{}",
            c.summary()
        );
    }
}

#[test]
fn an_fp32_user_is_offered_faster_precisions_with_the_effective_batch_kept() {
    let preset = find_builtin("gpt2").expect("preset");
    let user = TrainConfig {
        batch: 64,
        accum: 2,
        size: Some(1024),
        precision: Precision::Fp32,
        ..TrainConfig::default()
    };
    let req = request("rtx-4090");
    let r = fit(&preset, &user, &req).expect("fit");
    assert_eq!(r.effective_batch, 128);
    assert!(!r.candidates.is_empty());
    check_candidates(&preset, &user, &req, &r);
    // 64 × 1024 tokens of GPT-2 in fp32 do not fit 24 GB: micro-batches shrink.
    assert!(
        r.candidates
            .iter()
            .all(|c| c.micro_batch < 64 || c.config.checkpointing)
    );
    assert!(
        r.candidates
            .iter()
            .any(|c| c.config.precision != Precision::Fp32)
    );
}

#[test]
fn an_explicit_effective_batch_is_kept() {
    let preset = find_builtin("gpt2").expect("preset");
    let user = TrainConfig {
        batch: 8,
        size: Some(1024),
        precision: Precision::AmpFp16,
        ..TrainConfig::default()
    };
    let mut req = request("t4");
    req.effective_batch = Some(96);
    let r = fit(&preset, &user, &req).expect("fit");
    assert_eq!(r.effective_batch, 96);
    assert!(!r.candidates.is_empty());
    check_candidates(&preset, &user, &req, &r);
    // The T4 has no bf16 tensor cores: no bf16 compute is proposed.
    for c in &r.candidates {
        assert_ne!(c.config.precision.compute_dtype(), crate::plan::DType::BF16);
    }
}

#[test]
fn an_impossible_case_returns_none_with_a_reason() {
    let preset = find_builtin("Llama-2-13b-hf").expect("preset");
    let user = TrainConfig {
        batch: 1,
        size: Some(2048),
        ..TrainConfig::default()
    };
    let mut req = request("rtx-4090");
    req.budget.capacity = Bytes::gib(4);
    let r = fit(&preset, &user, &req).expect("fit");
    assert!(r.candidates.is_empty());
    let reason = r.reason.expect("reason");
    assert!(
        reason.contains("nothing fits") && reason.contains("short"),
        "{reason}"
    );
    // Pruning: far fewer plans than combinations.
    assert!(
        r.planned * 10 < r.combinations,
        "{} of {}",
        r.planned,
        r.combinations
    );
}

#[test]
fn optimizers_are_offered_within_their_family_with_less_state() {
    let user = TrainConfig::default();
    let axes = axes::Axes::new(&user, None);
    assert_eq!(axes.optimizer[0], Optimizer::AdamW);
    assert!(axes.optimizer.contains(&Optimizer::Adam8bit));
    assert!(!axes.optimizer.contains(&Optimizer::Sgd));
    assert!(!axes.optimizer.contains(&Optimizer::Adam));
    // Full → LoRA and QLoRA at every rank and target set.
    assert_eq!(
        axes.finetune.len(),
        1 + 2 * axes::LORA_RANKS.len() * axes::LORA_TARGETS.len()
    );
}

/// The LoRA / QLoRA settings fit proposes keep the user's `lora_dropout` (it costs memory:
/// a mask and a copy of each adapter input).
#[test]
fn proposed_lora_keeps_the_users_dropout() {
    let mut user = TrainConfig::default();
    user.finetune.lora_dropout = LoraDropout::new(0.1).expect("p");
    let axes = axes::Axes::new(&user, None);
    assert!(axes.finetune.len() > 1);
    for ft in &axes.finetune {
        assert_eq!(ft.lora_dropout, user.finetune.lora_dropout, "{ft:?}");
    }
}

#[test]
fn needs_at_least_orders_the_monotone_axes() {
    let user = Knobs::of(&TrainConfig::default());
    let lean = Knobs {
        checkpointing: true,
        ..user
    };
    assert!(user.needs_at_least(&lean));
    assert!(!lean.needs_at_least(&user));
    let bf16 = Knobs {
        precision: Precision::Bf16,
        ..user
    };
    assert!(!bf16.needs_at_least(&user) && !user.needs_at_least(&bf16));
    assert!(user.changes_subset_of(&lean, &user));
    assert!(!lean.changes_subset_of(&user, &user));
}

/// The search's speed (what `vramlab bench-fit` times):
/// `cargo test --release -p vramlab-core --lib fit::tests::search_time -- --ignored --nocapture`.
#[test]
#[ignore = "measurement"]
fn search_time() {
    let cases = [
        ("Meta-Llama-3-8B", 2048, 4, 4, "rtx-4090"),
        ("Meta-Llama-3-8B", 2048, 1, 16, "rtx-4090"),
        ("gpt2", 1024, 8, 4, "t4"),
        ("gpt2", 1024, 32, 1, "t4"),
    ];
    for (id, size, batch, accum, gpu) in cases {
        let preset = find_builtin(id).expect("preset");
        let cfg = TrainConfig {
            batch,
            accum,
            size: Some(size),
            ..TrainConfig::default()
        };
        let req = request(gpu);
        let mut ms = Vec::new();
        let mut last = None;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            last = Some(fit(&preset, &cfg, &req).expect("fit"));
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        let r = last.expect("ran");
        println!(
            "{id} seq {size} batch {batch}×{accum} on {gpu}: median {:.0} ms (min {:.0}), {} combinations, {} planned, {} pruned, {} dominated, {} fit",
            ms[2],
            ms[0],
            r.combinations,
            r.planned,
            r.pruned_dead,
            r.dominated,
            r.candidates.len()
        );
    }
}

/// Everything a one-GPU search returns, as text: the counts and every candidate.
fn fingerprint(r: &FitReport) -> String {
    let mut s = format!(
        "{} {} {} {}\n",
        r.combinations, r.planned, r.pruned_dead, r.dominated
    );
    for c in &r.candidates {
        s.push_str(&format!(
            "{} {}x{} {} | {}\n",
            c.summary(),
            c.micro_batch,
            c.accum,
            c.nvidia_smi.0,
            c.costs.join(" / ")
        ));
    }
    s
}

fn one_gpu_fingerprints() -> String {
    let mut out = String::new();
    for (model, gpu, batch, accum) in [
        ("Meta-Llama-3-8B", "rtx-4090", 4, 4),
        ("gpt2-xl", "rtx-4090", 8, 1),
        ("gpt2", "rtx-3060", 16, 2),
    ] {
        let preset = find_builtin(model).expect("preset");
        let user = TrainConfig {
            batch,
            accum,
            ..TrainConfig::default()
        };
        let r = fit(&preset, &user, &request(gpu)).expect("fit");
        out.push_str(&format!("## {model} {gpu}\n{}", fingerprint(&r)));
    }
    out
}

/// A one-GPU search is unchanged by the strategy axis: the candidates, their order, words
/// and the plan counts are those recorded before the axis existed (re-recorded once when
/// the verdict moved to the upper edge of the measured error band: Llama-3-8B's LoRA in
/// bf16 no longer fits a 4090; `UPDATE_GOLDEN=1` rewrites the file).
#[test]
fn one_gpu_searches_are_unchanged_by_the_strategy_axis() {
    let got = one_gpu_fingerprints();
    let want = include_str!("testdata/one_gpu_before_strategy_axis.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/plan/fit/testdata/one_gpu_before_strategy_axis.txt"
        );
        std::fs::write(path, &got).expect("write");
    }
    assert_eq!(got, want, "got:\n{got}");
}

fn gpt2_xl_ddp4() -> (Preset, TrainConfig) {
    let preset = find_builtin("gpt2-xl").expect("preset");
    let user = TrainConfig {
        batch: 8,
        distributed: Distributed::new(4, Strategy::Ddp),
        ..TrainConfig::default()
    };
    (preset, user)
}

#[test]
fn the_strategy_axis_is_the_users_alone_on_one_gpu_and_follows_the_other_settings() {
    assert_eq!(
        strategy::strategies(&Distributed::default()),
        [Strategy::None]
    );
    // Four GPUs with no strategy: independent replicas, nothing to switch.
    assert_eq!(
        strategy::strategies(&Distributed::new(4, Strategy::None)),
        [Strategy::None]
    );
    // One GPU under a strategy: nothing to shard over.
    assert_eq!(
        strategy::strategies(&Distributed::new(1, Strategy::Ddp)),
        [Strategy::Ddp]
    );
    assert_eq!(
        strategy::strategies(&Distributed::new(4, Strategy::Ddp)),
        Strategy::MULTI
    );
    let zero3 = strategy::strategies(&Distributed::new(2, Strategy::Zero3));
    assert_eq!(zero3[0], Strategy::Zero3);
    assert_eq!(zero3.len(), Strategy::MULTI.len());
    // Offload: only where state is sharded outside ZeroRedundancyOptimizer.
    let mut d = Distributed::new(4, Strategy::Zero2);
    d.offload = Offload::Optimizer;
    assert_eq!(
        strategy::strategies(&d),
        [
            Strategy::Zero2,
            Strategy::Zero1,
            Strategy::Zero3,
            Strategy::Fsdp2
        ]
    );
    d.strategy = Strategy::Zero3;
    d.offload = Offload::Params;
    assert_eq!(strategy::strategies(&d), [Strategy::Zero3, Strategy::Fsdp2]);
    // FSDP2's options only under FSDP2; DeepSpeed's knobs only under DeepSpeed; DDP's only
    // under the reducer.
    let mut f = Distributed::new(4, Strategy::Fsdp2);
    f.mixed_precision = FsdpMixedPrecision::Bf16;
    assert_eq!(strategy::strategies(&f), [Strategy::Fsdp2]);
    let mut z = Distributed::new(4, Strategy::Zero2);
    z.overlap_comm = Some(true);
    assert_eq!(
        strategy::strategies(&z),
        [Strategy::Zero2, Strategy::Zero1, Strategy::Zero3]
    );
    z.allgather_bucket_elems = Some(1 << 20);
    assert_eq!(strategy::strategies(&z), [Strategy::Zero2, Strategy::Zero1]);
    let mut b = Distributed::new(4, Strategy::Ddp);
    b.gradient_as_bucket_view = true;
    assert_eq!(
        strategy::strategies(&b),
        [Strategy::Ddp, Strategy::TorchZero1]
    );
    // Every candidate config the axis produces validates.
    for d in [d, f, z, b] {
        for st in strategy::strategies(&d) {
            let c = TrainConfig {
                distributed: Distributed { strategy: st, ..d },
                ..TrainConfig::default()
            };
            c.validate().expect("valid");
        }
    }
}

#[test]
fn a_ddp_plan_that_does_not_fit_is_offered_a_sharded_strategy() {
    let (preset, user) = gpt2_xl_ddp4();
    let req = request("rtx-4090");
    let r = fit(&preset, &user, &req).expect("fit");
    check_candidates(&preset, &user, &req, &r);
    assert!(!r.candidates.iter().any(|c| c.is_user_config));
    assert!(r.planned <= req.max_plans, "{}", r.planned);
    // The user's strategy keeps its candidates (LoRA under DDP).
    assert!(
        r.candidates
            .iter()
            .any(|c| c.config.distributed.strategy == Strategy::Ddp)
    );
    // A sharded strategy is offered (at the upper edge of the bands: LoRA under ZeRO; full
    // ZeRO-3 at micro-batch 1, 21.2 GiB planned, is over 22.8 GiB usable once gpt2/full/zero3's
    // −9.7 % is applied).
    assert!(
        r.candidates
            .iter()
            .any(|c| c.config.distributed.strategy.shards_params()
                || c.config.distributed.strategy.is_deepspeed())
    );
    // Full fine-tuning in the user's precision, sharded, when offered: one switch, nothing
    // else but the micro-batch.
    for st in [Strategy::Zero3, Strategy::Fsdp2] {
        let Some(c) = r
            .candidates
            .iter()
            .find(|c| c.config.distributed.strategy == st && c.config.finetune.is_full())
        else {
            continue;
        };
        assert_eq!(c.config.precision, user.precision);
        assert!(
            c.changes[0].starts_with(&format!("strategy ddp → {st}")),
            "{:?}",
            c.changes
        );
        assert!(
            c.costs.iter().any(|w| w.contains("1.5× DDP's traffic")),
            "{:?}",
            c.costs
        );
        // The other multi-GPU settings stay the user's.
        assert_eq!(c.config.distributed.world(), 4);
        assert_eq!(c.config.distributed.offload, Offload::None);
        // Under DDP the same settings do not fit.
        let mut twin = c.config;
        twin.distributed.strategy = Strategy::Ddp;
        let planner = Planner::new(&preset, &twin).expect("planner");
        assert!(!fits(&planner, req.budget, 1).expect("fits"));
    }
}

#[test]
fn a_fitting_ddp_plan_is_not_offered_a_switch_it_does_not_need() {
    let preset = find_builtin("gpt2").expect("preset");
    let user = TrainConfig {
        batch: 4,
        distributed: Distributed::new(2, Strategy::Ddp),
        ..TrainConfig::default()
    };
    let req = request("rtx-4090");
    let r = fit(&preset, &user, &req).expect("fit");
    assert!(r.candidates[0].is_user_config);
    for c in &r.candidates {
        assert_eq!(
            c.config.distributed.strategy,
            Strategy::Ddp,
            "{}",
            c.summary()
        );
    }
}

#[test]
fn pruning_never_drops_the_users_strategy() {
    let (_, user) = gpt2_xl_ddp4();
    let axes = Axes::new(&user, Some(&gpu("rtx-4090")));
    assert_eq!(axes.strategy[0], Strategy::Ddp);
    let all = axes.all();
    assert_eq!(all.len() % axes.strategy.len(), 0);
    // A dead combination of another strategy never kills one of the user's.
    let lean: Vec<Knobs> = axes
        .strategy
        .iter()
        .map(|&st| axes.leanest(user.precision, user.attention, user.finetune, st))
        .collect();
    for k in all.iter().step_by(7) {
        for d in &lean {
            if d.strategy != k.strategy {
                assert!(!k.needs_at_least(d) && !d.needs_at_least(k));
            }
        }
    }
    // With a budget far below the default, the user's strategy and the sharded ones still
    // come back.
    let (preset, user) = gpt2_xl_ddp4();
    let mut req = request("rtx-4090");
    req.max_plans = 20;
    let r = fit(&preset, &user, &req).expect("fit");
    assert!(r.planned <= 20, "{}", r.planned);
    for st in Strategy::MULTI
        .into_iter()
        .filter(|&st| st != Strategy::TorchZero1)
    {
        assert!(
            r.candidates
                .iter()
                .any(|c| c.config.distributed.strategy == st),
            "no {st} candidate in {:?}",
            r.candidates.iter().map(|c| c.summary()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn strategy_knobs_apply_compare_and_say_their_change() {
    let (_, user) = gpt2_xl_ddp4();
    let u = Knobs::of(&user);
    let k = Knobs {
        strategy: Strategy::Zero3,
        ..u
    };
    assert_eq!(k.apply(&user).distributed.strategy, Strategy::Zero3);
    assert_eq!(k.apply(&user).distributed.world(), 4);
    assert_eq!(k.changed(&u).count_ones(), 1);
    assert!(u.changes_subset_of(&k, &u));
    assert!(!k.changes_subset_of(&u, &u));
    let f = Knobs {
        strategy: Strategy::Fsdp2,
        ..u
    };
    assert!(!k.changes_subset_of(&f, &u));
    assert_eq!(
        axes::change_words(&k, &u),
        ["strategy ddp → zero3 (DeepSpeed ZeRO-3)"]
    );
    assert!(strategy::cost_words(&user.distributed, Strategy::Ddp).is_empty());
    let z1 = strategy::cost_words(&user.distributed, Strategy::Zero1).join(" ");
    assert!(
        z1.contains("same traffic as DDP") && z1.contains("DeepSpeed config"),
        "{z1}"
    );
    let mut no_reshard = Distributed::new(4, Strategy::Fsdp2);
    no_reshard.reshard_after_forward = false;
    let f2 = strategy::cost_words(&no_reshard, Strategy::Fsdp2);
    assert!(f2.is_empty());
}

/// A model without the attention projections LoRA targets (a CNN) is searched over the other
/// settings:
/// the search used to fail as a whole on the LoRA axis ("`attn` matches no linear layer").
#[test]
fn a_model_lora_cannot_target_is_searched_without_lora() {
    let preset = find_builtin("resnet50").expect("preset");
    let user = TrainConfig {
        batch: 256,
        size: Some(224),
        ..TrainConfig::default()
    };
    let req = request("rtx-3060");
    let r = fit(&preset, &user, &req).expect("fit searches without LoRA");
    assert!(!r.candidates.is_empty(), "{:?}", r.reason);
    // LoRA on attention projections is not offered (ResNet has none); all-linear adapts
    // its classifier, as the planner models it.
    assert!(
        r.candidates
            .iter()
            .all(|c| c.config.finetune.mode == FineTuneMode::Full
                || c.config.finetune.lora_targets != crate::plan::finetune::LoraTargets::Attn),
        "LoRA on attention offered for a CNN"
    );
    check_candidates(&preset, &user, &req, &r);
}

/// When the leanest miss is within the usable memory as planned but not at the upper edge of
/// its band, the reason says so instead of "0 B short", and a search that ran out of plans
/// says that a combination it did not reach may fit.
#[test]
fn nothing_fits_says_the_band_edge_and_the_plan_limit() {
    let preset = find_builtin("TinyLlama-1.1B").expect("preset");
    let user = TrainConfig {
        batch: 8,
        size: Some(2048),
        distributed: Distributed::new(2, Strategy::Zero2),
        ..TrainConfig::default()
    };
    let r = fit(&preset, &user, &request("rtx-3060")).expect("fit");
    let reason = r.reason.expect("nothing fits");
    assert!(!reason.contains(" 0 B short"), "{reason}");
    assert!(
        reason.contains("at the upper edge of its measured error band"),
        "{reason}"
    );
    assert!(
        reason.contains("stopped at its limit of 160 plans"),
        "{reason}"
    );
}

/// A candidate's figures are those `plan` gives its configuration: the search plans every
/// combination with the whole effective batch as accumulation, a candidate of one step
/// (gradients freed before its forward) is re-planned at its own.
#[test]
fn candidate_figures_are_the_plan_of_the_candidate() {
    let mut checked_single_step = false;
    for (model, gpu, batch, accum) in [("gpt2", "a100-80gb", 8, 1), ("gpt2", "rtx-3060", 16, 2)] {
        let preset = find_builtin(model).expect("preset");
        let user = TrainConfig {
            batch,
            accum,
            size: Some(1024),
            ..TrainConfig::default()
        };
        let r = fit(&preset, &user, &request(gpu)).expect("fit");
        assert!(!r.candidates.is_empty(), "{model} {gpu}");
        for c in &r.candidates {
            let plan = Planner::new(&preset, &c.config)
                .expect("planner")
                .plan(c.config.batch)
                .expect("plan");
            assert_eq!(
                c.peak_allocated,
                plan.peak_allocated_bytes,
                "{}",
                c.summary()
            );
            checked_single_step |= c.accum == 1;
        }
    }
    assert!(checked_single_step);
}

/// A model the LoRA targets match nothing in (a convolutional network) is searched without
/// the combinations it cannot take, instead of the search failing on them.
#[test]
fn a_model_without_attention_is_searched_without_lora() {
    for model in ["resnet50", "vit_b_16"] {
        let preset = find_builtin(model).expect("preset");
        let user = TrainConfig {
            batch: 64,
            ..TrainConfig::default()
        };
        let r = fit(&preset, &user, &request("t4")).expect("fit");
        assert!(!r.candidates.is_empty(), "{model}: {:?}", r.reason);
    }
}

/// The search's tuning (combinations planned at a time, generations stopped once a
/// combination is known dead and not the closest miss) changes how fast the answer comes,
/// never the answer: every figure, count and reason equal to one thread planning each
/// combination whole. Cases that fit, that fit only after many deaths, and where nothing
/// fits (the closest miss), on one GPU and on two.
#[test]
fn the_answer_does_not_depend_on_how_the_search_is_run() {
    let cases: Vec<(&str, TrainConfig, &str)> = vec![
        ("Meta-Llama-3-8B", llama3_cfg(), "rtx-4090"),
        (
            "gpt2",
            TrainConfig {
                batch: 32,
                size: Some(1024),
                ..TrainConfig::default()
            },
            "t4",
        ),
        (
            "TinyLlama-1.1B",
            TrainConfig {
                batch: 8,
                size: Some(2048),
                distributed: Distributed::new(2, Strategy::Zero2),
                ..TrainConfig::default()
            },
            "rtx-3060",
        ),
        (
            "resnet50",
            TrainConfig {
                batch: 256,
                size: Some(224),
                ..TrainConfig::default()
            },
            "rtx-3060",
        ),
    ];
    for (model, cfg, gpu) in cases {
        let preset = find_builtin(model).expect("preset");
        let req = request(gpu);
        let reference = fit_with(
            &preset,
            &cfg,
            &req,
            Tuning {
                width: 1,
                stop_early: false,
                share_events: false,
                speculate: false,
            },
        )
        .expect("fit");
        let want = serde_json::to_string(&reference).expect("json");
        for (width, stop_early, share_events, speculate) in [
            (1, true, false, false),
            (1, false, true, true),
            (2, false, false, false),
            (2, true, true, false),
            (2, true, true, true),
            (3, true, true, true),
        ] {
            let tuning = Tuning {
                width,
                stop_early,
                share_events,
                speculate,
            };
            let got = fit_with(&preset, &cfg, &req, tuning).expect("fit");
            assert_eq!(
                serde_json::to_string(&got).expect("json"),
                want,
                "{model} on {gpu}, {tuning:?}"
            );
        }
    }
}

/// What [`Tuning::share_events`] relies on: QLoRA planned in bf16 generates the events of
/// QLoRA in fp32 (it runs in fp32, [`TrainConfig::effective_precision`]), for every LoRA
/// setting and loop shape the search tries.
#[test]
fn qlora_in_bf16_generates_the_events_of_fp32() {
    let preset = find_builtin("TinyLlama-1.1B").expect("preset");
    for (rank, checkpointing, optimizer) in [
        (8, true, Optimizer::PagedAdamW),
        (64, false, Optimizer::AdamW),
    ] {
        let mut cfg = TrainConfig {
            batch: 2,
            size: Some(512),
            checkpointing,
            optimizer,
            ..TrainConfig::default()
        };
        cfg.finetune.mode = FineTuneMode::Qlora;
        cfg.finetune.lora_rank = rank;
        let plan =
            |precision| Planner::new(&preset, &TrainConfig { precision, ..cfg }).expect("planner");
        let (bf16, fp32) = (plan(Precision::Bf16), plan(Precision::Fp32));
        assert_eq!(bf16.events.buffers, fp32.events.buffers, "rank {rank}");
        assert_eq!(bf16.events.events, fp32.events.events, "rank {rank}");
        assert_eq!(bf16.events.measured_start, fp32.events.measured_start);
        assert_eq!(bf16.config, fp32.config);
        assert_eq!(bf16.mode, fp32.mode);
    }
}
