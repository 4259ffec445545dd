//! Unit tests of `world` (moved beside it from an inline module).

use super::*;
use std::path::PathBuf;
use vramlab_core::model::preset::find_builtin;

fn cfg(gpus: u32, strategy: Strategy) -> TrainConfig {
    TrainConfig {
        distributed: Distributed::new(gpus, strategy),
        ..TrainConfig::default()
    }
}

fn world(mode: WorldMode) -> WorldRun {
    WorldRun {
        mode,
        size: 2,
        strategy: "fsdp2".into(),
    }
}

fn ok_line(rank: u32, alloc: u64) -> String {
    format!(
        "{{\"index\": 0, \"rank\": {rank}, \"oom\": false, \"peak_allocated\": {alloc}, \
         \"peak_reserved\": {}, \"nvml_process_bytes\": {}, \"step_ms\": 12.5}}\n",
        alloc + 10,
        alloc + 20
    )
}

fn parse(files: &[(u32, Option<String>)]) -> Trial {
    parse_ranks(
        3,
        8,
        world(WorldMode::Torchrun),
        &WorldResult {
            files,
            exit: "exit status: 1",
            stderr_tail: "Traceback: boom",
        },
    )
}

#[test]
fn strategies_map_to_runners() {
    assert_eq!(runner_for(Strategy::Fsdp2).map(|r| r.mode), Ok("fsdp"));
    assert_eq!(runner_for(Strategy::Ddp).map(|r| r.mode), Ok("ddp"));
    assert_eq!(
        runner_for(Strategy::TorchZero1).map(|r| r.mode),
        Ok("zero1")
    );
    for s in [Strategy::Fsdp2, Strategy::Ddp, Strategy::TorchZero1] {
        let r = runner_for(s).expect("torch");
        assert_eq!((r.script, r.deepspeed), ("dist_runner.py", false));
    }
    for s in [Strategy::Zero1, Strategy::Zero2, Strategy::Zero3] {
        assert_eq!(
            runner_for(s),
            Ok(Runner {
                script: "ds_runner.py",
                mode: "measure",
                deepspeed: true
            })
        );
    }
    assert!(runner_for(Strategy::None).is_err());
    // The embedded runner is the one that writes rank files under torchrun.
    assert!(DS_RUNNER.contains("--out-dir") && DS_RUNNER.contains("init_distributed"));
}

#[test]
fn deepspeed_worlds_are_checked_and_may_offload() {
    for s in [Strategy::Zero1, Strategy::Zero2, Strategy::Zero3] {
        assert_eq!(check_config(EngineKind::Torch, &cfg(2, s)), Ok(()));
        let mut off = cfg(2, s);
        off.distributed.offload = Offload::Optimizer;
        assert_eq!(check_config(EngineKind::Torch, &off), Ok(()), "{s}");
    }
    let mut params = cfg(2, Strategy::Zero3);
    params.distributed.offload = Offload::Params;
    assert_eq!(check_config(EngineKind::Torch, &params), Ok(()));
    params.distributed.strategy = Strategy::Zero2;
    let e = check_config(EngineKind::Torch, &params).expect_err("params under zero2");
    assert!(e.contains("--offload params") && e.contains("zero2"), "{e}");
    let mut sgd = cfg(2, Strategy::Zero2);
    sgd.optimizer = Optimizer::Sgd;
    let e = check_config(EngineKind::Torch, &sgd).expect_err("sgd");
    assert!(e.contains("--optimizer sgd") && e.contains("adamw"), "{e}");
    // The other refusals stand for DeepSpeed too.
    let mut multi = cfg(4, Strategy::Zero3);
    multi.distributed.nodes = 2;
    let e = check_config(EngineKind::Torch, &multi).expect_err("multi-node");
    assert!(
        e.contains("crates/device/runners/ds_runner.py measure CONFIG.jsonl"),
        "{e}"
    );
    // Its config line: 2 nodes × 4 GPUs, the world gpus × nodes as ds_runner reads it.
    let preset = vramlab_core::model::preset::find_builtin("gpt2").expect("gpt2");
    let v: Value = serde_json::from_str(&dist_config_line(&preset, &multi, 128, 1).expect("line"))
        .expect("json");
    assert_eq!(
        (v["gpus"].as_u64(), v["nodes"].as_u64()),
        (Some(4), Some(2))
    );
    let e = check_config(EngineKind::Native, &cfg(2, Strategy::Zero1)).expect_err("native");
    assert!(e.contains("--engine torch"), "{e}");
    let m = deepspeed_missing_message("/venv/bin/python", "No module named 'deepspeed'");
    assert!(
        m.contains("DeepSpeed is not importable in `/venv/bin/python`")
            && m.contains("/venv/bin/python -m pip install deepspeed")
            && m.contains("DS_BUILD_OPS=0"),
        "{m}"
    );
}

#[test]
fn configs_the_bench_cannot_run_are_refused_with_what_to_do() {
    assert_eq!(
        check_config(EngineKind::Native, &TrainConfig::default()),
        Ok(())
    );
    let e = check_config(EngineKind::Native, &cfg(4, Strategy::Fsdp2)).expect_err("native");
    assert!(
        e.contains("the native engine runs one GPU; use --engine torch"),
        "{e}"
    );
    assert_eq!(
        check_config(EngineKind::Torch, &cfg(4, Strategy::Fsdp2)),
        Ok(())
    );
    let mut multi = cfg(4, Strategy::Ddp);
    multi.distributed.nodes = 2;
    let e = check_config(EngineKind::Torch, &multi).expect_err("multi-node");
    assert!(
        e.contains("--nnodes 2 --nproc_per_node 4") && e.contains("dist_runner.py ddp"),
        "{e}"
    );
    assert!(e.contains("--gpus 8"), "{e}");
    let mut off = cfg(4, Strategy::Fsdp2);
    off.distributed.offload = Offload::Optimizer;
    let e = check_config(EngineKind::Torch, &off).expect_err("offload");
    assert!(
        e.contains("--offload optimizer") && e.contains("DeepSpeed only"),
        "{e}"
    );
}

#[test]
fn torchrun_when_the_gpus_are_there_else_rank_0_emulated() {
    assert_eq!(pick_mode(4, 8), WorldMode::Torchrun);
    assert_eq!(pick_mode(4, 4), WorldMode::Torchrun);
    assert_eq!(pick_mode(4, 1), WorldMode::Emulated);
    assert_eq!(pick_mode(1, 1), WorldMode::Torchrun);
    assert_eq!(pick_mode(2, 0), WorldMode::Emulated);
}

#[test]
fn launch_commands() {
    let (scripts, config, out) = (
        PathBuf::from("/t"),
        PathBuf::from("/t/c.jsonl"),
        PathBuf::from("/t/o"),
    );
    let spec = |mode| LaunchSpec {
        python: "py",
        mode,
        world: 4,
        runner: Runner {
            script: "dist_runner.py",
            mode: "fsdp",
            deepspeed: false,
        },
        scripts: &scripts,
        config: &config,
        out_dir: &out,
        device_index: 2,
    };
    let t = launch(&spec(WorldMode::Torchrun));
    assert_eq!(t.program, "py");
    assert_eq!(
        t.args,
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "4",
            "/t/dist_runner.py",
            "fsdp",
            "/t/c.jsonl",
            "--out-dir",
            "/t/o"
        ]
    );
    assert_eq!(t.ranks, 4);
    assert!(!t.env.iter().any(|(k, _)| k == "CUDA_VISIBLE_DEVICES"));
    let e = launch(&spec(WorldMode::Emulated));
    assert_eq!(
        e.args,
        [
            "-u",
            "/t/dist_runner.py",
            "fsdp",
            "/t/c.jsonl",
            "--out-dir",
            "/t/o"
        ]
    );
    assert_eq!(e.ranks, 1);
    assert!(
        e.env
            .contains(&("CUDA_VISIBLE_DEVICES".to_string(), "2".to_string()))
    );
}

#[test]
fn deepspeed_launches_ds_runner_in_both_modes() {
    let (scripts, config, out) = (
        PathBuf::from("/t"),
        PathBuf::from("/t/c.jsonl"),
        PathBuf::from("/t/o"),
    );
    let runner = runner_for(Strategy::Zero2).expect("zero2");
    let spec = |mode| LaunchSpec {
        python: "/venv/py",
        mode,
        world: 2,
        runner,
        scripts: &scripts,
        config: &config,
        out_dir: &out,
        device_index: 1,
    };
    let t = launch(&spec(WorldMode::Torchrun));
    assert_eq!(t.program, "/venv/py");
    assert_eq!(
        t.args,
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "/t/ds_runner.py",
            "measure",
            "/t/c.jsonl",
            "--out-dir",
            "/t/o"
        ]
    );
    assert_eq!(t.ranks, 2);
    let ds = ("DS_ACCELERATOR".to_string(), "cuda".to_string());
    assert!(t.env.contains(&ds), "{:?}", t.env);
    assert!(!t.env.iter().any(|(k, _)| k == "CUDA_VISIBLE_DEVICES"));
    let e = launch(&spec(WorldMode::Emulated));
    assert_eq!(
        e.args,
        [
            "-u",
            "/t/ds_runner.py",
            "measure",
            "/t/c.jsonl",
            "--out-dir",
            "/t/o"
        ]
    );
    assert_eq!(e.ranks, 1);
    assert!(e.env.contains(&ds));
    assert!(
        e.env
            .contains(&("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string()))
    );
}

#[test]
fn the_deepspeed_config_line_carries_the_zero_knobs() {
    let preset = find_builtin("gpt2").expect("gpt2");
    let line = |c: &TrainConfig| -> Value {
        serde_json::from_str(&dist_config_line(&preset, c, 128, 8).expect("line")).expect("json")
    };
    let v = line(&cfg(2, Strategy::Zero2));
    // The runner gets the export's DeepSpeed config for the trial's micro-batch, as is.
    let mut at = cfg(2, Strategy::Zero2);
    at.batch = 8;
    assert_eq!(
        v["ds_config"],
        vramlab_core::export::frameworks::deepspeed_config(&at)
    );
    assert_eq!(v["ds_config"]["train_micro_batch_size_per_gpu"], 8);
    assert_eq!(v["ds_config"]["zero_optimization"]["stage"], 2);
    assert_eq!(v["strategy"], "zero2");
    assert_eq!(v["gpus"], 2);
    assert_eq!(v["offload"], Value::Null);
    assert_eq!(v["reduce_bucket_size"], 500_000_000);
    assert_eq!(v["contiguous_gradients"], true);
    // Absent: DeepSpeed's defaults (overlap_comm False for stage 1/2).
    assert!(v.get("overlap_comm").is_none() && v.get("allgather_bucket_size").is_none());
    assert!(v.get("stage3_max_live_parameters").is_none());
    assert!(v.get("bucket_cap_mb").is_none() && v.get("fsdp_mixed_precision").is_none());
    let mut c = cfg(4, Strategy::Zero3);
    c.distributed.offload = Offload::Params;
    c.distributed.overlap_comm = Some(false);
    c.distributed.max_reuse_distance = Some(123);
    c.distributed.prefetch_elems = 7;
    let v = line(&c);
    let z = &v["ds_config"]["zero_optimization"];
    assert_eq!(z["stage"], 3);
    assert_eq!(z["stage3_prefetch_bucket_size"], 7);
    assert_eq!(z["stage3_max_reuse_distance"], 123);
    assert_eq!(z["overlap_comm"], false);
    assert_eq!(z["offload_param"]["device"], "cpu");
    assert_eq!(v["offload"], "params");
    assert_eq!(v["overlap_comm"], false);
    assert_eq!(v["stage3_prefetch_bucket_size"], 7);
    assert_eq!(v["stage3_max_live_parameters"], 1_000_000_000);
    assert_eq!(v["stage3_param_persistence_threshold"], 100_000);
    assert_eq!(v["stage3_max_reuse_distance"], 123);
}

/// A record `ds_runner.py` writes (the fields the bench reads, plus DeepSpeed's own).
#[test]
fn a_ds_runner_record_parses_like_the_others() {
    let rec = "{\"index\": 0, \"rank\": 0, \"world_size\": 2, \"world_mode\": \"emulated\", \
               \"strategy\": \"zero2\", \"zero_stage\": 2, \"ds_optimizer\": \"DeepSpeedZeroOptimizer\", \
               \"ds_config\": {\"zero_optimization\": {\"stage\": 2}}, \"oom\": false, \
               \"peak_allocated\": 2000, \"peak_reserved\": 3000, \"nvml_process_bytes\": null, \
               \"step_ms\": 40.25, \"host_rss_delta_bytes\": 123, \
               \"versions\": {\"deepspeed\": \"0.19.8\"}}\n";
    let t = parse(&[(0, Some(rec.into()))]);
    assert_eq!(t.outcome, Outcome::Ran, "{:?}", t.outcome);
    assert_eq!(t.peak_allocated, Some(Bytes(2000)));
    assert_eq!(t.peak_reserved, Some(Bytes(3000)));
    assert_eq!(t.process_bytes, None);
    assert_eq!(t.step_ms, Some(40.25));
    let oom = "{\"index\": 0, \"rank\": 1, \"world_mode\": \"torchrun\", \"oom\": true, \
               \"message\": \"CUDA out of memory. Tried to allocate 2.00 GiB\", \
               \"peak_allocated_before_oom\": 9000, \"peak_reserved_before_oom\": 9500}\n";
    let t = parse(&[(0, Some(rec.into())), (1, Some(oom.into()))]);
    assert!(
        matches!(&t.outcome, Outcome::Oom { message } if message.starts_with("rank 1: CUDA out of memory")),
        "{:?}",
        t.outcome
    );
    assert_eq!(t.ranks[1].peak_reserved, Some(Bytes(9500)));
    let err = "{\"index\": 0, \"rank\": 0, \"oom\": false, \
               \"error\": \"ValueError: optimizer 'sgd': the runner uses DeepSpeed's Adam / AdamW\"}\n";
    let t = parse(&[(0, Some(err.into()))]);
    assert!(
        matches!(&t.outcome, Outcome::Error { message } if message.starts_with("rank 0: ValueError")),
        "{:?}",
        t.outcome
    );
}

#[test]
fn the_config_line_carries_the_world_and_the_strategy_knobs() {
    let preset = find_builtin("gpt2").expect("gpt2");
    let mut c = cfg(4, Strategy::Fsdp2);
    c.distributed.mixed_precision = FsdpMixedPrecision::Bf16;
    let v: Value =
        serde_json::from_str(&dist_config_line(&preset, &c, 128, 8).expect("line")).expect("json");
    assert_eq!(v["gpus"], 4);
    assert_eq!(v["strategy"], "fsdp2");
    assert_eq!(v["fsdp_mixed_precision"], "bf16");
    assert_eq!(v["reshard_after_forward"], true);
    assert_eq!(v["batch"], 8);
    assert!(v.get("bucket_cap_mb").is_none());
    let v: Value = serde_json::from_str(
        &dist_config_line(&preset, &cfg(2, Strategy::TorchZero1), 128, 8).expect("line"),
    )
    .expect("json");
    assert_eq!(v["bucket_cap_mb"], 25);
    assert_eq!(v["gradient_as_bucket_view"], false);
}

#[test]
fn every_rank_reported_gives_rank_0_as_the_headline() {
    let t = parse(&[(0, Some(ok_line(0, 1000))), (1, Some(ok_line(1, 3000)))]);
    assert_eq!(t.outcome, Outcome::Ran);
    assert_eq!(t.peak_allocated, Some(Bytes(1000)));
    assert_eq!(t.peak_reserved, Some(Bytes(1010)));
    assert_eq!(t.process_bytes, Some(Bytes(1020)));
    assert_eq!(t.step_ms, Some(12.5));
    assert_eq!(t.ranks.len(), 2);
    assert_eq!(t.max_rank_allocated(), Some(Bytes(3000)));
    assert_eq!(t.world.as_ref().map(|w| w.mode), Some(WorldMode::Torchrun));
}

#[test]
fn a_missing_rank_is_an_error_naming_it() {
    let t = parse(&[(0, Some(ok_line(0, 1000))), (1, None)]);
    let Outcome::Error { message } = &t.outcome else {
        panic!("{:?}", t.outcome)
    };
    assert!(message.contains("no result from rank 1"), "{message}");
    assert!(
        message.contains("exit status: 1") && message.contains("boom"),
        "{message}"
    );
    assert_eq!(t.ranks.len(), 1);
    // An empty file (the rank died before writing) is missing too.
    let t = parse(&[(0, Some(String::new())), (1, Some(ok_line(1, 5)))]);
    assert!(matches!(&t.outcome, Outcome::Error { message } if message.contains("rank 0")));
}

#[test]
fn malformed_json_names_the_rank_and_the_file() {
    let t = parse(&[
        (0, Some(ok_line(0, 1000))),
        (1, Some("{\"peak\": 1".into())),
    ]);
    let Outcome::Error { message } = &t.outcome else {
        panic!("{:?}", t.outcome)
    };
    assert!(
        message.contains("rank 1") && message.contains("rank1.jsonl"),
        "{message}"
    );
    let t = parse(&[(0, Some("[1, 2]".into()))]);
    assert!(matches!(&t.outcome, Outcome::Error { message } if message.contains("rank0.jsonl")));
}

#[test]
fn oom_on_any_rank_is_an_oom_of_that_rank() {
    let oom = "{\"index\": 0, \"rank\": 1, \"oom\": true, \"message\": \"CUDA out of memory. Tried\", \
               \"peak_allocated_before_oom\": 77}\n";
    // Rank 1 ran out; torchrun stopped rank 0 before it wrote anything.
    let t = parse(&[(0, None), (1, Some(oom.into()))]);
    let Outcome::Oom { message } = &t.outcome else {
        panic!("{:?}", t.outcome)
    };
    assert!(
        message.starts_with("rank 1: CUDA out of memory"),
        "{message}"
    );
    assert_eq!(t.ranks[0].peak_allocated, Some(Bytes(77)));
    assert!(t.ranks[0].oom);
    let err = "{\"index\": 0, \"rank\": 0, \"error\": \"ValueError: bad\"}\n";
    let t = parse(&[(0, Some(err.into())), (1, Some(ok_line(1, 5)))]);
    assert!(
        matches!(&t.outcome, Outcome::Error { message } if message == "rank 0: ValueError: bad")
    );
}
