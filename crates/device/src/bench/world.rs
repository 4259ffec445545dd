//! A multi-GPU world for the PyTorch engine, as pure logic (tested without a GPU): which
//! runner measures a strategy ([`runner_for`], the seam where DeepSpeed plugs in), whether
//! a configuration can run at all ([`check_config`]), how the world runs on this machine
//! ([`pick_mode`]: `torchrun` with N GPUs, else rank 0 emulated), the command that starts
//! it ([`launch`]), the config line ([`dist_config_line`]) and the per-rank result files
//! turned into a trial ([`parse_ranks`]). `dist.rs` runs the processes.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use vramlab_core::model::Preset;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::distributed::{Distributed, FsdpMixedPrecision, Offload, Strategy};
use vramlab_core::record::{EngineKind, Outcome, RankPeak, Trial, WorldMode, WorldRun};
use vramlab_core::units::Bytes;

/// The distributed runner, shipped inside the binary next to `torch_runner.py` (which it
/// imports).
pub const DIST_RUNNER: &str = include_str!("../../../../tools/dist_runner.py");

/// The script that measures a strategy and its mode argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runner {
    /// File name in the engine's temporary folder.
    pub script: &'static str,
    /// Its first argument.
    pub mode: &'static str,
}

/// Which runner measures `strategy`. DeepSpeed's stages need `tools/ds_runner.py`, not
/// plugged in yet: this is the one place that maps a strategy to a runner.
pub fn runner_for(strategy: Strategy) -> Result<Runner, String> {
    let dist = |mode| {
        Ok(Runner {
            script: "dist_runner.py",
            mode,
        })
    };
    match strategy {
        Strategy::Fsdp2 => dist("fsdp"),
        Strategy::Ddp => dist("ddp"),
        Strategy::TorchZero1 => dist("zero1"),
        Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => Err(format!(
            "strategy {s} runs under DeepSpeed, and the bench has no DeepSpeed runner yet \
             (tools/ds_runner.py is not plugged in); bench fsdp2, ddp or torch-zero1, or plan \
             {s} without running it",
            s = strategy.as_str()
        )),
        Strategy::None => Err("no strategy: one GPU runs with the single-GPU runner".into()),
    }
}

/// Whether `engine` can run `cfg`'s world (no GPU needed); the error says what to do.
pub fn check_config(engine: EngineKind, cfg: &TrainConfig) -> Result<(), String> {
    let d = &cfg.distributed;
    if !d.active() {
        return Ok(());
    }
    if engine == EngineKind::Native {
        return Err(format!(
            "the native engine runs one GPU; use --engine torch (this plan is rank 0 of a \
             world of {} with {})",
            d.world(),
            d.strategy.as_str()
        ));
    }
    let runner = runner_for(d.strategy)?;
    if d.nodes > 1 {
        return Err(multi_node_message(d, runner));
    }
    if d.offload != Offload::None {
        return Err(format!(
            "--offload {}: the distributed runner does not offload to the CPU; bench without \
             offload",
            d.offload.as_str()
        ));
    }
    if !cfg.finetune.trains_everything() {
        return Err(
            "the distributed runner trains the whole model: LoRA, QLoRA and frozen parts are \
             not run distributed; bench them on one GPU"
                .into(),
        );
    }
    Ok(())
}

/// The refusal of a multi-node world, with the command to run on each node.
fn multi_node_message(d: &Distributed, runner: Runner) -> String {
    format!(
        "a world of {} nodes × {} GPUs is not launched by the bench. Run the runner under \
         torchrun on each node yourself (node_rank 0..{}):\n  python -m torch.distributed.run \
         --nnodes {} --nproc_per_node {} --node_rank <this node> --rdzv_backend c10d \
         --rdzv_endpoint <node 0 host>:29500 tools/{} {} CONFIG.jsonl --out-dir results\n\
         (every rank writes results/rank<R>.jsonl); or plan --nodes 1 --gpus {} to measure \
         rank 0 of the same world emulated on one GPU",
        d.nodes,
        d.gpus_per_node,
        d.nodes - 1,
        d.nodes,
        d.gpus_per_node,
        runner.script,
        runner.mode,
        d.world()
    )
}

/// How a world of `world` runs on a machine whose PyTorch sees `gpus_visible` GPUs.
pub fn pick_mode(world: u64, gpus_visible: usize) -> WorldMode {
    if gpus_visible as u64 >= world {
        WorldMode::Torchrun
    } else {
        WorldMode::Emulated
    }
}

/// A process to start: program, arguments, extra environment, and how many rank files
/// it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub ranks: u32,
}

/// What a launch needs to know.
pub struct LaunchSpec<'a> {
    pub python: &'a str,
    pub mode: WorldMode,
    pub world: u64,
    pub runner: Runner,
    /// The folder holding the runner scripts.
    pub scripts: &'a Path,
    pub config: &'a Path,
    pub out_dir: &'a Path,
    /// The CUDA device an emulated rank uses.
    pub device_index: usize,
}

/// The command that runs one config: `torchrun` (every GPU the process sees, one rank per
/// GPU) or one process, rank 0 of the world, on `device_index`.
pub fn launch(s: &LaunchSpec<'_>) -> Launch {
    let script = s.scripts.join(s.runner.script).display().to_string();
    let tail = [
        script,
        s.runner.mode.to_string(),
        s.config.display().to_string(),
        "--out-dir".to_string(),
        s.out_dir.display().to_string(),
    ];
    let mut env = vec![("PYTHONUNBUFFERED".to_string(), "1".to_string())];
    let (mut args, ranks) = match s.mode {
        WorldMode::Torchrun => (
            vec![
                "-m".to_string(),
                "torch.distributed.run".to_string(),
                "--standalone".to_string(),
                "--nproc_per_node".to_string(),
                s.world.to_string(),
            ],
            u32::try_from(s.world).unwrap_or(u32::MAX),
        ),
        WorldMode::Emulated => {
            env.push((
                "CUDA_VISIBLE_DEVICES".to_string(),
                s.device_index.to_string(),
            ));
            (vec!["-u".to_string()], 1)
        }
    };
    args.extend(tail);
    Launch {
        program: s.python.to_string(),
        args,
        env,
        ranks,
    }
}

/// The runner's config line: `torch_runner`'s plus the world (`gpus`, `nodes`,
/// `strategy`) and the strategy's knobs.
pub fn dist_config_line(
    preset: &Preset,
    cfg: &TrainConfig,
    size: u64,
    batch: u64,
) -> Result<String> {
    let line = super::torch::config_line(preset, cfg, size, batch)?;
    let mut v: Value = serde_json::from_str(&line).context("the runner's config line")?;
    let d = &cfg.distributed;
    v["gpus"] = json!(d.world());
    v["nodes"] = json!(d.nodes);
    v["strategy"] = json!(d.strategy.as_str());
    if d.strategy == Strategy::Fsdp2 {
        v["reshard_after_forward"] = json!(d.reshard_after_forward);
        v["fsdp_mixed_precision"] = match d.mixed_precision {
            FsdpMixedPrecision::None => Value::Null,
            mp => json!(mp.as_str()),
        };
    }
    if d.strategy.uses_ddp() {
        v["bucket_cap_mb"] = json!(d.bucket_cap_mb);
        v["gradient_as_bucket_view"] = json!(d.gradient_as_bucket_view);
    }
    Ok(v.to_string())
}

/// The name of rank `rank`'s result file under the trial's folder (`dist_runner.py`
/// `rank_file`).
pub fn rank_file_name(rank: u32) -> String {
    format!("rank{rank}.jsonl")
}

/// One rank's record, parsed.
struct RankRecord {
    peak: RankPeak,
    error: Option<String>,
    oom_message: Option<String>,
    step_ms: Option<f64>,
}

fn bytes(v: &Value, key: &str) -> Option<Bytes> {
    v.get(key).and_then(Value::as_u64).map(Bytes)
}

fn parse_rank(rank: u32, text: &str) -> Result<Option<RankRecord>, String> {
    let Some(line) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
        return Ok(None);
    };
    let file = rank_file_name(rank);
    let v: Value = serde_json::from_str(line)
        .map_err(|e| format!("rank {rank}: the result file {file} is not JSON ({e})"))?;
    if !v.is_object() {
        return Err(format!(
            "rank {rank}: the result file {file} holds no JSON object"
        ));
    }
    let oom = v.get("oom").and_then(Value::as_bool) == Some(true);
    let (alloc, reserved) = if oom {
        ("peak_allocated_before_oom", "peak_reserved_before_oom")
    } else {
        ("peak_allocated", "peak_reserved")
    };
    Ok(Some(RankRecord {
        peak: RankPeak {
            rank,
            peak_allocated: bytes(&v, alloc),
            peak_reserved: bytes(&v, reserved),
            nvml_used: bytes(&v, "nvml_process_bytes"),
            oom,
        },
        error: v.get("error").and_then(Value::as_str).map(str::to_string),
        oom_message: oom.then(|| {
            v.get("message")
                .and_then(Value::as_str)
                .unwrap_or("CUDA out of memory")
                .to_string()
        }),
        step_ms: v.get("step_ms").and_then(Value::as_f64),
    }))
}

/// What a finished world left behind: each rank's result file (`None`: not written),
/// how the process ended, and its last messages.
pub struct WorldResult<'a> {
    pub files: &'a [(u32, Option<String>)],
    pub exit: &'a str,
    pub stderr_tail: &'a str,
}

/// The trial of a world: OOM on any rank is an OOM (the rank named), an error on any rank
/// or a rank that wrote nothing is an error; otherwise it ran. The headline peaks are
/// rank 0's; every rank that reported is in `ranks`.
pub fn parse_ranks(index: u32, batch: u64, world: WorldRun, r: &WorldResult<'_>) -> Trial {
    let mut records = Vec::new();
    let mut missing = Vec::new();
    let mut malformed = Vec::new();
    for (rank, text) in r.files {
        match text.as_deref().map(|t| parse_rank(*rank, t)) {
            Some(Ok(Some(rec))) => records.push(rec),
            Some(Ok(None)) | None => missing.push(rank.to_string()),
            Some(Err(e)) => malformed.push(e),
        }
    }
    records.sort_by_key(|r| r.peak.rank);
    let outcome = if let Some(rec) = records.iter().find(|r| r.oom_message.is_some()) {
        Outcome::Oom {
            message: format!(
                "rank {}: {}",
                rec.peak.rank,
                rec.oom_message.as_deref().unwrap_or("CUDA out of memory")
            ),
        }
    } else if let Some(rec) = records.iter().find(|r| r.error.is_some()) {
        Outcome::Error {
            message: format!(
                "rank {}: {}",
                rec.peak.rank,
                rec.error.as_deref().unwrap_or("")
            ),
        }
    } else if let Some(e) = malformed.first() {
        Outcome::Error { message: e.clone() }
    } else if !missing.is_empty() {
        let tail = if r.stderr_tail.is_empty() {
            String::new()
        } else {
            format!("; last messages:\n{}", r.stderr_tail)
        };
        Outcome::Error {
            message: format!(
                "no result from rank {} (the world exited: {}){tail}",
                missing.join(", "),
                r.exit
            ),
        }
    } else {
        Outcome::Ran
    };
    let mut t = Trial::failed(index, batch, outcome);
    if let Some(r0) = records.iter().find(|r| r.peak.rank == 0) {
        t.peak_allocated = r0.peak.peak_allocated;
        t.peak_reserved = r0.peak.peak_reserved;
        t.process_bytes = r0.peak.nvml_used;
        t.step_ms = r0.step_ms;
    }
    t.ranks = records.into_iter().map(|r| r.peak).collect();
    t.world = Some(world);
    t
}

#[cfg(test)]
mod tests {
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
    fn strategies_map_to_runners_and_deepspeed_is_refused() {
        assert_eq!(runner_for(Strategy::Fsdp2).map(|r| r.mode), Ok("fsdp"));
        assert_eq!(runner_for(Strategy::Ddp).map(|r| r.mode), Ok("ddp"));
        assert_eq!(
            runner_for(Strategy::TorchZero1).map(|r| r.mode),
            Ok("zero1")
        );
        for s in [Strategy::Zero1, Strategy::Zero2, Strategy::Zero3] {
            let e = runner_for(s).expect_err("DeepSpeed");
            assert!(e.contains("DeepSpeed") && e.contains(s.as_str()), "{e}");
        }
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
        assert!(
            check_config(EngineKind::Torch, &off)
                .expect_err("offload")
                .contains("--offload optimizer")
        );
        let e = check_config(EngineKind::Torch, &cfg(4, Strategy::Zero3)).expect_err("zero3");
        assert!(e.contains("DeepSpeed"), "{e}");
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
    fn the_config_line_carries_the_world_and_the_strategy_knobs() {
        let preset = find_builtin("gpt2").expect("gpt2");
        let mut c = cfg(4, Strategy::Fsdp2);
        c.distributed.mixed_precision = FsdpMixedPrecision::Bf16;
        let v: Value = serde_json::from_str(&dist_config_line(&preset, &c, 128, 8).expect("line"))
            .expect("json");
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
        assert!(
            matches!(&t.outcome, Outcome::Error { message } if message.contains("rank0.jsonl"))
        );
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
}
