//! More than one GPU: DeepSpeed's model-state estimators (numbers recorded by running
//! DeepSpeed 0.19.8's own functions, `lab/cpu/check_ds_zero.py`), the planner's per-rank
//! model states against them, and the fewest-GPU search.

use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::distributed::{Distributed, Offload, Strategy};
use vramlab_core::plan::multi_gpu::{ds_zero2_model_states, ds_zero3_model_states, fewest_gpus};
use vramlab_core::plan::search::Budget;
use vramlab_core::plan::{Category, Planner, Precision, TrainConfig};
use vramlab_core::units::Bytes;

fn estimates() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(crate::data("deepspeed_estimates.jsonl"))
        .expect("deepspeed_estimates.jsonl");
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("fn").is_some())
        .collect()
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// vramlab's mirror of DeepSpeed's estimators gives DeepSpeed's numbers, byte for byte.
#[test]
fn deepspeed_estimators_match_deepspeed() {
    let rows = estimates();
    assert!(rows.len() >= 100, "{} estimator rows", rows.len());
    for r in &rows {
        let (total, gpn, nodes) = (u(r, "total_params"), u(r, "gpus_per_node"), u(r, "nodes"));
        let (cpu, gpu) = match r["fn"].as_str() {
            Some("zero2") => ds_zero2_model_states(total, gpn, nodes, r["cpu_offload"] == true),
            Some("zero3") => {
                let offload = match (r["cpu_offload"] == true, r["cpu_offload_params"] == true) {
                    (true, true) => Offload::Params,
                    (true, false) => Offload::Optimizer,
                    _ => Offload::None,
                };
                ds_zero3_model_states(
                    total,
                    u(r, "largest_layer_params"),
                    gpn,
                    nodes,
                    offload,
                    r["zero_init"] == true,
                )
            }
            other => panic!("unknown fn {other:?}"),
        };
        assert_eq!(gpu, u(r, "gpu_bytes"), "gpu {r}");
        assert_eq!(cpu, u(r, "cpu_bytes"), "cpu {r}");
    }
}

/// The planner's per-rank model states against DeepSpeed's estimate for ZeRO-2 without
/// offload, bf16 training. DeepSpeed's estimator counts the 16-bit parameters whole (2
/// bytes per parameter) and 18 bytes per parameter partitioned: 16-bit and fp32 gradients,
/// fp32 master weights, Adam's fp32 moments. vramlab plans what `DeepSpeedZeroOptimizer`
/// holds between steps (`runtime/zero/stage_1_and_2.py`): the bf16 parameters whole (the
/// flat `bit16_groups_flat`), the fp32 master partition (`single_partition_of_fp32_groups`)
/// and Adam's two fp32 moments of it: 2 + 12/N. The gradient partitions (2/N bf16
/// `grads_in_partition`, 4/N fp32 copy in `step`) are planned where they live, in the
/// backward and the step, not among the states: the difference is exactly those 6/N.
#[test]
fn zero2_model_states_agree_with_deepspeed_where_both_apply() {
    let preset = find_builtin("gpt2").expect("gpt2");
    for world in [2u32, 4, 8] {
        let cfg = TrainConfig {
            batch: 1,
            size: Some(64),
            precision: Precision::Bf16,
            distributed: Distributed::new(world, Strategy::Zero2),
            ..TrainConfig::default()
        };
        let plan = Planner::new(&preset, &cfg)
            .expect("planner")
            .plan(1)
            .expect("plan");
        let n = plan.params;
        let w = u64::from(world);
        let params = plan.category_bytes(Category::Parameters).0;
        let state = plan.category_bytes(Category::OptimizerState).0;
        // The flat buffer padded to a multiple of 2 × world (`nccl_start_alignment_factor`).
        let part = n.div_ceil(2 * w) * 2;
        let rel = |a: u64, b: u64| (a as f64 - b as f64).abs() / b as f64;
        assert_eq!(params, 2 * n, "world {world}");
        // Three fp32 tensors of the partition, each rounded to 512 bytes.
        assert!(
            state >= 12 * part && state < 12 * part + 3 * 512,
            "world {world}: {state} vs {}",
            12 * part
        );
        let (_, ds_gpu) = ds_zero2_model_states(n, w, 1, false);
        assert!(
            rel(ds_gpu - params - state, 6 * n / w) < 0.01,
            "world {world}: DeepSpeed {ds_gpu} − vramlab {} vs 6N/world",
            params + state
        );
    }
}

/// "The fewest GPUs of this card that fit": Llama-2-7B full training in AMP bf16 with
/// checkpointing does not fit one 80 GB card; FSDP2 finds a world that does, and more
/// GPUs never need more memory per rank.
#[test]
fn fewest_gpus_finds_a_world_and_sharding_shrinks_the_rank() {
    let preset = find_builtin("Llama-2-7b-hf").expect("llama");
    let cfg = TrainConfig {
        batch: 1,
        size: Some(2048),
        precision: Precision::AmpBf16,
        checkpointing: true,
        ..TrainConfig::default()
    };
    let budget = Budget {
        capacity: Bytes(80 * 1_000_000_000),
        margin: 0.05,
    };
    let single = Planner::new(&preset, &cfg).expect("planner");
    assert!(!vramlab_core::plan::search::fits(&single, budget, 1).expect("fits"));
    let f = fewest_gpus(&preset, &cfg, Strategy::Fsdp2, 8, 64, budget)
        .expect("search")
        .expect("some world fits");
    assert!(f.gpus >= 2 && f.gpus <= 8, "{f:?}");
    let mut last = u64::MAX;
    for world in [2u32, 4, 8] {
        let mut c = cfg;
        c.distributed = Distributed::new(world, Strategy::Fsdp2);
        let a = Planner::new(&preset, &c)
            .expect("planner")
            .peaks(1)
            .expect("peaks")
            .allocated
            .0;
        assert!(a < last, "world {world}: {a} ≥ {last}");
        last = a;
    }
}

/// `docs/multi-gpu.md`'s table, regenerated here: Llama-2-7B and Llama-3-8B full training
/// (AMP bf16, AdamW, activation checkpointing, sequence 2048, trainer loop; FSDP2 with
/// `MixedPrecisionPolicy(bf16, reduce fp32)`) on 1–8 × 24 / 40 / 80 GB cards, the best
/// strategy and its largest micro-batch per GPU. The page
/// holds exactly this output (`cargo test -p vramlab-core --test tests docs_multi_gpu_table
/// -- --nocapture` prints it).
#[test]
fn docs_multi_gpu_table() {
    use vramlab_core::plan::config::LoopShape;
    let models: Vec<_> = ["Llama-2-7b-hf", "Meta-Llama-3-8B"]
        .iter()
        .map(|id| find_builtin(id).expect("preset"))
        .collect();
    let cards: Vec<_> = ["rtx-4090", "a100-40gb", "a100-80gb"]
        .iter()
        .map(|id| vramlab_words::find_gpu(id).expect("card"))
        .collect();
    let cfg = TrainConfig {
        batch: 1,
        size: Some(2048),
        precision: Precision::AmpBf16,
        checkpointing: true,
        loop_shape: LoopShape::Trainer,
        distributed: Distributed {
            mixed_precision: vramlab_core::plan::distributed::FsdpMixedPrecision::Bf16,
            ..Distributed::default()
        },
        ..TrainConfig::default()
    };
    let table =
        vramlab_core::plan::multi_gpu::fit_table(&models, &cards, &[1, 2, 4, 8], &cfg, 0.05)
            .expect("table");
    println!("{table}");
    let page = std::fs::read_to_string(crate::data("../../docs/multi-gpu.md")).expect("page");
    assert!(
        page.contains(&table),
        "docs/multi-gpu.md's table differs from the planner's; paste the printed table"
    );
}
