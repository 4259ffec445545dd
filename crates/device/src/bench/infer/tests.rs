//! Inference trials without a GPU: the runner's config line from a planner, the refusals,
//! the reply of `infer_runner.py` as a trial, and a scripted engine through the sweep.

use super::*;
use crate::bench::engine::cancelled_trial;
use serde_json::Value;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::config::{AllocatorConfig, Attention, DType};
use vramlab_core::plan::distributed::{Distributed, Strategy};
use vramlab_core::plan::finetune_mode::Quant;
use vramlab_core::plan::inference::InferPlanner;
use vramlab_core::plan::inference::device_map::MaxMemory;
use vramlab_core::plan::inference::{Decoding, InferConfig, KvCache};
use vramlab_core::plan::policy::QuantStorage;
use vramlab_core::units::Bytes;

fn preset(name: &str) -> Preset {
    let path = format!(
        "{}/../../tests/data/hf_configs/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).expect("config");
    vramlab_core::model::hf::from_config_text(&text, name).expect("preset")
}

fn cfg(step: InferStep) -> InferConfig {
    InferConfig {
        step,
        batch: 1,
        prompt: 128,
        new_tokens: if step == InferStep::Generate { 8 } else { 0 },
        dtype: DType::BF16,
        attention: Attention::Sdpa,
        kv_cache: KvCache::Dynamic,
        allocator: AllocatorConfig::default(),
    }
}

fn request(engine: EngineKind, bench: &InferBench, batches: BatchPlan) -> BenchRequest {
    BenchRequest {
        preset: preset("Qwen2.5-0.5B"),
        config: TrainConfig::default(),
        engine,
        batches,
        steps: 1,
        python: None,
        device_index: 0,
        predicted_max_batch: None,
        runner_env: Vec::new(),
        inference: Some(bench.clone()),
    }
}

fn line(bench: &InferBench, batch: u64) -> Value {
    let text = config_line(&preset("Qwen2.5-0.5B"), bench, batch).expect("line");
    serde_json::from_str(&text).expect("json")
}

/// The config line has the lab's row keys, the planned call's values and nothing a prefill
/// does not take.
#[test]
fn the_config_line_is_the_lab_row_of_the_planned_call() {
    let p = preset("Qwen2.5-0.5B");
    let g = InferBench::new(InferPlanner::new(&p, &cfg(InferStep::Generate)).expect("plan"));
    let v = line(&g, 4);
    assert_eq!(v["step"], "generate");
    assert_eq!(v["batch"], 4);
    assert_eq!(v["prompt"], 128);
    assert_eq!(v["new_tokens"], 8);
    assert_eq!(v["precision"], "bf16");
    assert_eq!(v["attention"], "sdpa");
    assert_eq!(v["kv_cache"], "dynamic");
    assert_eq!(v["model_id"], "Qwen2.5-0.5B");
    assert_eq!(v["model"]["params"]["model_type"], "qwen2");
    for absent in ["do_sample", "num_beams", "quant", "device_map", "hf_config"] {
        assert!(v.get(absent).is_none(), "{absent}: {v}");
    }
    let f = InferBench::new(InferPlanner::new(&p, &cfg(InferStep::Prefill)).expect("plan"));
    let v = line(&f, 2);
    assert_eq!(v["step"], "prefill");
    assert!(
        v.get("new_tokens").is_none() && v.get("kv_cache").is_none(),
        "{v}"
    );
}

/// Sampling, beams, 4-bit weights and a device map reach the runner as the planner has
/// them (sizes in bytes, as accelerate reads them).
#[test]
fn decoding_quant_and_device_map_reach_the_runner() {
    let p = preset("Qwen2.5-0.5B");
    let sampled = Decoding {
        do_sample: true,
        temperature: 0.7,
        top_k: 20,
        top_p: 0.9,
        num_beams: 1,
    };
    let mut c = cfg(InferStep::Generate);
    c.kv_cache = KvCache::Static;
    c.dtype = DType::F16;
    let q = QuantStorage {
        quant: Quant::Nf4,
        double_quant: false,
    };
    let planner = InferPlanner::with_quant(&p, &c, &sampled, Some(q)).expect("plan");
    let v = line(&InferBench::new(planner), 1);
    assert_eq!(v["do_sample"], true);
    assert_eq!(v["temperature"], 0.7);
    assert_eq!(v["top_k"], 20);
    assert_eq!(v["top_p"], 0.9);
    assert_eq!(v["kv_cache"], "static");
    assert_eq!(v["precision"], "fp16");
    assert_eq!(v["quant"], "nf4");
    assert_eq!(v["double_quant"], false);
    let mm = MaxMemory {
        gpu: 300 << 20,
        cpu: Some(8 << 30),
    };
    let planner =
        InferPlanner::with_device_map(&p, &cfg(InferStep::Generate), &Decoding::default(), mm)
            .expect("device map");
    let mut bench = InferBench::new(planner);
    bench.hf_config = Some(serde_json::json!({"model_type": "qwen2", "eos_token_id": 151643}));
    let v = line(&bench, 1);
    assert_eq!(v["device_map"], "auto");
    assert_eq!(v["max_gpu_memory"], 300u64 << 20);
    assert_eq!(v["max_cpu_memory"], 8u64 << 30);
    assert_eq!(v["hf_config"]["eos_token_id"], 151643);
    assert!(v.get("quant").is_none());
}

/// The refusals name the flag: the native engine, several GPUs, LLM.int8 planned without
/// the random-init outliers the runner's weights have.
#[test]
fn what_the_engine_cannot_run_is_refused_naming_the_flag() {
    let p = preset("Qwen2.5-0.5B");
    let bench = InferBench::new(InferPlanner::new(&p, &cfg(InferStep::Generate)).expect("plan"));
    let native = request(EngineKind::Native, &bench, BatchPlan::List(vec![1]));
    let e = check(EngineKind::Native, &native, &bench).expect_err("native");
    assert!(
        e.starts_with("--engine native") && e.contains("--engine torch"),
        "{e}"
    );
    let mut dist = request(EngineKind::Torch, &bench, BatchPlan::List(vec![1]));
    dist.config.distributed = Distributed::new(2, Strategy::Ddp);
    let e = check(EngineKind::Torch, &dist, &bench).expect_err("two GPUs");
    assert!(e.contains("--gpus"), "{e}");
    let int8 = QuantStorage {
        quant: Quant::Int8,
        double_quant: false,
    };
    let planner = InferPlanner::with_quant(
        &p,
        &cfg(InferStep::Generate),
        &Decoding::default(),
        Some(int8),
    )
    .expect("int8");
    let trained = InferBench::new(planner.clone());
    let req = request(EngineKind::Torch, &trained, BatchPlan::List(vec![1]));
    let e = check(EngineKind::Torch, &req, &trained).expect_err("outliers");
    assert!(e.contains("--int8-outliers"), "{e}");
    let random = InferBench::new(planner.with_int8_outliers(Int8Outliers::RandomInit {
        std: vramlab_core::plan::inference::quant::DEFAULT_INITIALIZER_RANGE,
    }));
    let req = request(EngineKind::Torch, &random, BatchPlan::List(vec![1]));
    check(EngineKind::Torch, &req, &random).expect("random-init int8 runs");
    // refused before any process starts
    let mut events = Vec::new();
    let err = run_blocking(&native, &bench, &AtomicBool::new(false), &mut |e| {
        events.push(e)
    })
    .expect_err("native refused");
    assert!(format!("{err:#}").contains("--engine torch"));
    assert!(matches!(events.as_slice(), [BenchEvent::Failed { .. }]));
}

/// A recorded reply of `infer_runner.py serve` (Qwen2.5-0.5B, generate) becomes a trial
/// that compares with the plan; an OOM reply is an OOM (not an error); a failure an error.
#[test]
fn runner_replies_become_trials() {
    let ran: Value = serde_json::from_str(
        r#"{"id": "bench-b2", "step": "generate", "batch": 2, "prompt": 128, "new_tokens": 8,
            "precision": "bf16", "peak_allocated": 1050000000, "peak_reserved": 1100000000,
            "nvml_process_bytes": 1700000000, "step_ms": 412.5, "step_s": 0.41, "oom": false}"#,
    )
    .expect("json");
    let t = crate::bench::torch::parse_reply(0, 2, &ran);
    assert!(t.outcome.ran());
    assert_eq!(t.peak_allocated, Some(Bytes(1_050_000_000)));
    assert_eq!(t.peak_reserved, Some(Bytes(1_100_000_000)));
    assert_eq!(t.process_bytes, Some(Bytes(1_700_000_000)));
    assert_eq!(t.step_ms, Some(412.5));
    let oom: Value = serde_json::from_str(
        r#"{"oom": true, "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
            "peak_allocated_before_oom": 70000000000, "peak_reserved_before_oom": 71000000000}"#,
    )
    .expect("json");
    let t = crate::bench::torch::parse_reply(1, 512, &oom);
    assert!(matches!(&t.outcome, Outcome::Oom { message } if message.contains("2.00 GiB")));
    assert_eq!(t.peak_allocated, Some(Bytes(70_000_000_000)));
    let err: Value =
        serde_json::from_str(r#"{"error": "ImportError: no module named transformers"}"#)
            .expect("json");
    let t = crate::bench::torch::parse_reply(2, 1, &err);
    assert!(matches!(&t.outcome, Outcome::Error { message } if message.contains("transformers")));
}

/// Answers with the planned allocated bytes scaled by `ratio`; OOM beyond `cap`.
struct Scripted {
    cap: u64,
    ratio: f64,
    seen: Vec<Value>,
}

impl InferEngine for Scripted {
    fn device(&self) -> DeviceInfo {
        DeviceInfo {
            name: "scripted".into(),
            total_bytes: Bytes(80 << 30),
            ..Default::default()
        }
    }

    fn trial(&mut self, job: &InferJob<'_>, ctl: &mut Control<'_>) -> Trial {
        if ctl.cancelled() {
            return cancelled_trial(job.index, job.batch);
        }
        let line = config_line(job.preset, job.bench, job.batch).expect("line");
        self.seen.push(serde_json::from_str(&line).expect("json"));
        if job.batch > self.cap {
            return Trial::failed(
                job.index,
                job.batch,
                Outcome::Oom {
                    message: "CUDA out of memory".into(),
                },
            );
        }
        let p = job.bench.planner.peaks(job.batch).expect("peaks");
        let mut t = Trial::failed(job.index, job.batch, Outcome::Ran);
        t.peak_allocated = Some(Bytes((p.allocated.0 as f64 * self.ratio) as u64));
        t.peak_reserved = Some(p.reserved);
        t
    }
}

/// A batch list runs every batch; each trial carries the inference planner's prediction
/// (not a training step's) and the run records the call.
#[test]
fn trials_carry_the_inference_plan() {
    let p = preset("Qwen2.5-0.5B");
    let bench = InferBench::new(InferPlanner::new(&p, &cfg(InferStep::Generate)).expect("plan"));
    let req = request(EngineKind::Torch, &bench, BatchPlan::List(vec![1, 4, 1024]));
    let mut engine = Scripted {
        cap: 64,
        ratio: 1.01,
        seen: Vec::new(),
    };
    let mut events = Vec::new();
    let run = run_with(
        &req,
        &bench,
        &mut engine,
        &AtomicBool::new(false),
        &mut |e| events.push(e),
    )
    .expect("run");
    assert_eq!(run.trials.len(), 3);
    let inf = run.inference.as_ref().expect("inference recorded");
    assert_eq!(
        (inf.step, inf.prompt, inf.new_tokens),
        (InferStep::Generate, 128, 8)
    );
    assert_eq!(run.size, 128);
    for t in &run.trials[..2] {
        let planned = bench.planner.peaks(t.batch).expect("peaks");
        assert_eq!(t.predicted.map(|p| p.allocated), Some(planned.allocated));
        let e = t.errors_pct().allocated.expect("error");
        assert!((e + 0.99).abs() < 0.05, "{e}");
    }
    assert!(matches!(run.trials[2].outcome, Outcome::Oom { .. }));
    let batches: Vec<u64> = engine
        .seen
        .iter()
        .filter_map(|v| v["batch"].as_u64())
        .collect();
    assert_eq!(batches, vec![1, 4, 1024]);
    assert!(matches!(events.first(), Some(BenchEvent::Started { .. })));
    assert!(matches!(events.last(), Some(BenchEvent::Finished { .. })));
    // the record round-trips with its inference call
    let text = serde_json::to_string(&run).expect("serialise");
    let back: Run = serde_json::from_str(&text).expect("parse");
    assert_eq!(back, run);
    assert!(run.title().contains("generate bf16"), "{}", run.title());
}

/// A sweep seeds from the inference planner's max batch on the engine's device and bisects
/// to the boundary.
#[test]
fn a_sweep_finds_the_boundary_from_the_inference_plan() {
    let p = preset("Qwen2.5-0.5B");
    let bench = InferBench::new(InferPlanner::new(&p, &cfg(InferStep::Prefill)).expect("plan"));
    let req = request(
        EngineKind::Torch,
        &bench,
        BatchPlan::UntilOom {
            seed: 0,
            limit: 4096,
        },
    );
    let mut engine = Scripted {
        cap: 37,
        ratio: 1.0,
        seen: Vec::new(),
    };
    let run = run_with(
        &req,
        &bench,
        &mut engine,
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .expect("run");
    let budget = Budget {
        capacity: Bytes(80 << 30),
        margin: 0.0,
    };
    let seed = bench.planner.max_batch(budget, 4096).expect("max batch");
    assert_eq!(run.predicted_max_batch, seed);
    assert_eq!(run.max_batch_ran(), Some(37));
    assert_eq!(run.first_oom(), Some(38));
}
