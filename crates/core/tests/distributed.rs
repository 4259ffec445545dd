//! More than one GPU: DeepSpeed's model-state estimators (numbers recorded by running
//! DeepSpeed 0.19.8's own functions, `tools/check_ds_zero.py`), the planner's per-rank
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

/// The planner's per-rank model states (parameters + gradients + optimizer state at the
/// peak) against DeepSpeed's estimate for ZeRO-2 without offload, pure bf16 training.
/// DeepSpeed counts 16-bit parameters whole (2 bytes per parameter) and 18 bytes per
/// parameter partitioned: 16-bit and fp32 gradients, fp32 master weights, Adam's fp32
/// moments. vramlab plans a bf16 model (`model.to(torch.bfloat16)`, no master copy): bf16
/// parameters whole (2), bf16 gradients partitioned (2/N) and Adam's bf16 moments
/// partitioned (4/N): 2 + 6/N. The difference is exactly DeepSpeed's fp32 copies, 12/N
/// per parameter (fp32 master 4 + fp32 gradient partition 4 + fp32 instead of bf16
/// moments 4); where both count the same tensors (the 16-bit parameters) they agree.
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
        let states: u64 = [
            Category::Parameters,
            Category::Gradients,
            Category::OptimizerState,
        ]
        .iter()
        .map(|&c| plan.category_bytes(c).0)
        .sum();
        let ours = 2 * n + 6 * n / w;
        let rel = |a: u64, b: u64| (a as f64 - b as f64).abs() / b as f64;
        assert!(
            rel(states, ours) < 0.01,
            "world {world}: {states} vs {ours}"
        );
        let (_, ds_gpu) = ds_zero2_model_states(n, w, 1, false);
        // The 16-bit parameters: DeepSpeed's whole-model term.
        assert_eq!(params, 2 * n, "world {world}");
        assert!(
            rel(ds_gpu - states, 12 * n / w) < 0.01,
            "world {world}: DeepSpeed {ds_gpu} − vramlab {states} vs 12N/world"
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

/// The README's multi-GPU table, regenerated here: Llama-2-7B and Llama-3-8B full training
/// (AMP bf16, AdamW, activation checkpointing, sequence 2048, trainer loop; FSDP2 with
/// `MixedPrecisionPolicy(bf16, reduce fp32)`) on 1–8 × 24 / 40 / 80 GB cards, the best
/// strategy and its largest micro-batch per GPU. The README
/// holds exactly this output (`cargo test -p vramlab-core --test tests readme_multi_gpu_table
/// -- --nocapture` prints it).
#[test]
fn readme_multi_gpu_table() {
    use vramlab_core::plan::config::LoopShape;
    use vramlab_core::plan::gpus;
    let models: Vec<_> = ["Llama-2-7b-hf", "Meta-Llama-3-8B"]
        .iter()
        .map(|id| find_builtin(id).expect("preset"))
        .collect();
    let cards: Vec<_> = ["rtx-4090", "a100-40gb", "a100-80gb"]
        .iter()
        .map(|id| gpus::find(id).expect("card"))
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
    let readme = std::fs::read_to_string(crate::data("../../README.md")).expect("README");
    assert!(
        readme.contains(&table),
        "README's multi-GPU table differs from the planner's; paste the printed table"
    );
}

/// (model, precision, checkpointing, world, peak allocated, peak reserved) of ZeRO-3 at
/// DeepSpeed's defaults as planned before the coordinator (per-block gathering).
const PER_BLOCK_PLANS: [(&str, Precision, bool, u32, u64, u64); 24] = [
    ("gpt2", Precision::Fp32, false, 2, 11243872768, 11708399616),
    ("gpt2", Precision::Fp32, false, 8, 10684104192, 11559501824),
    ("gpt2", Precision::Fp32, true, 2, 6786376192, 7455375360),
    ("gpt2", Precision::Fp32, true, 8, 6226607616, 6536822784),
    ("gpt2", Precision::Bf16, false, 2, 6932627456, 7646216192),
    ("gpt2", Precision::Bf16, false, 8, 6652749312, 7593787392),
    ("gpt2", Precision::Bf16, true, 2, 4664557568, 5416943616),
    ("gpt2", Precision::Bf16, true, 8, 4384679424, 5343543296),
    (
        "gpt2-medium",
        Precision::Fp32,
        false,
        2,
        21237038080,
        21638414336,
    ),
    (
        "gpt2-medium",
        Precision::Fp32,
        false,
        8,
        19640816128,
        20317208576,
    ),
    (
        "gpt2-medium",
        Precision::Fp32,
        true,
        2,
        9350904832,
        9988734976,
    ),
    (
        "gpt2-medium",
        Precision::Fp32,
        true,
        8,
        7754682880,
        8654946304,
    ),
    (
        "gpt2-medium",
        Precision::Bf16,
        false,
        2,
        11994963456,
        12547260416,
    ),
    (
        "gpt2-medium",
        Precision::Bf16,
        false,
        8,
        11196940288,
        12413042688,
    ),
    (
        "gpt2-medium",
        Precision::Bf16,
        true,
        2,
        5947301376,
        6304038912,
    ),
    (
        "gpt2-medium",
        Precision::Bf16,
        true,
        8,
        5149278208,
        6169821184,
    ),
    (
        "TinyLlama-1.1B",
        Precision::Fp32,
        false,
        2,
        40475120640,
        43304091648,
    ),
    (
        "TinyLlama-1.1B",
        Precision::Fp32,
        false,
        8,
        35525041152,
        37675335680,
    ),
    (
        "TinyLlama-1.1B",
        Precision::Fp32,
        true,
        2,
        14380602368,
        17523802112,
    ),
    (
        "TinyLlama-1.1B",
        Precision::Fp32,
        true,
        8,
        8868158464,
        10500440064,
    ),
    (
        "TinyLlama-1.1B",
        Precision::Bf16,
        false,
        2,
        15181343232,
        15843983360,
    ),
    (
        "TinyLlama-1.1B",
        Precision::Bf16,
        false,
        8,
        12706303488,
        13644070912,
    ),
    (
        "TinyLlama-1.1B",
        Precision::Bf16,
        true,
        2,
        7431318016,
        8554283008,
    ),
    (
        "TinyLlama-1.1B",
        Precision::Bf16,
        true,
        8,
        4956278272,
        6023020544,
    ),
];

/// ZeRO-3 at DeepSpeed's defaults against the plans before the coordinator was mirrored
/// (per-block gathering, one block prefetched in backward; these numbers), seq 512 × 8
/// (GPT-2), 1024 × 4 (the others). Models whose parameters are all gathered by the default
/// prefetch (under `stage3_max_live_parameters` = 1e9: GPT-2, GPT-2 medium) keep their peak
/// allocated exactly (reserved within 11 %: gathers now sit on the all-gather stream, per
/// module). TinyLlama (1.1e9 elements, more than max live) moves up 4.7–27 %: the prefetcher
/// now runs ahead to 1e9 gathered elements in forward, as `fetch_sub_module` does. Not
/// measured yet (`tools/ds_configs.jsonl` is waiting for the device).
#[test]
fn zero3_defaults_against_the_per_block_plans() {
    for (model, precision, ckpt, world, alloc, reserved) in PER_BLOCK_PLANS {
        let preset = find_builtin(model).expect("preset");
        let (seq, batch) = if model == "gpt2" { (512, 8) } else { (1024, 4) };
        let cfg = TrainConfig {
            batch,
            size: Some(seq),
            precision,
            checkpointing: ckpt,
            distributed: Distributed::new(world, Strategy::Zero3),
            ..TrainConfig::default()
        };
        let p = Planner::new(&preset, &cfg)
            .expect("planner")
            .plan(batch)
            .expect("plan");
        let a = p.peak_allocated_bytes.0 as f64 / alloc as f64 - 1.0;
        let r = p.peak_reserved_bytes.0 as f64 / reserved as f64 - 1.0;
        let what = format!(
            "{model} {precision:?} ckpt {ckpt} world {world}: alloc {a:+.4}, reserved {r:+.4}"
        );
        if model.starts_with("gpt2") {
            assert_eq!(p.peak_allocated_bytes.0, alloc, "{what}");
            assert!(r.abs() <= 0.11, "{what}");
        } else {
            assert!((0.0..=0.28).contains(&a), "{what}");
            assert!((0.0..=0.31).contains(&r), "{what}");
        }
    }
}
