//! A multi-GPU world for the PyTorch engine, as pure logic (tested without a GPU): which
//! runner measures a strategy ([`runner_for`]: `dist_runner.py` for FSDP2 / DDP /
//! torch-zero1, `ds_runner.py` for DeepSpeed's ZeRO-1/2/3), whether a configuration can run
//! at all ([`check_config`]), how the world runs on this machine ([`pick_mode`]: `torchrun`
//! with N GPUs, else rank 0 emulated), the command that starts it ([`launch`]), the config
//! line ([`dist_config_line`]) and the per-rank result files turned into a trial
//! ([`parse_ranks`]). `dist.rs` runs the processes.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use vramlab_core::model::Preset;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::config::Optimizer;
use vramlab_core::plan::distributed::{Distributed, FsdpMixedPrecision, Offload, Strategy};
use vramlab_core::record::{EngineKind, Outcome, RankPeak, Trial, WorldMode, WorldRun};
use vramlab_core::units::Bytes;

pub use super::runners::{DIST_RUNNER, DS_RUNNER};

/// The script that measures a strategy and its mode argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runner {
    /// File name in the engine's temporary folder.
    pub script: &'static str,
    /// Its first argument.
    pub mode: &'static str,
    /// Whether it runs DeepSpeed (which must be importable in the engine's Python).
    pub deepspeed: bool,
}

/// Which runner measures `strategy`: the one place that maps a strategy to a runner.
pub fn runner_for(strategy: Strategy) -> Result<Runner, String> {
    let dist = |mode| {
        Ok(Runner {
            script: "dist_runner.py",
            mode,
            deepspeed: false,
        })
    };
    match strategy {
        Strategy::Fsdp2 => dist("fsdp"),
        Strategy::Ddp => dist("ddp"),
        Strategy::TorchZero1 => dist("zero1"),
        Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => Ok(Runner {
            script: "ds_runner.py",
            mode: "measure",
            deepspeed: true,
        }),
        Strategy::None => Err("no strategy: one GPU runs with the single-GPU runner".into()),
    }
}

/// Why DeepSpeed cannot run in `python` (`detail`: the import's last message), and how to
/// get it.
pub fn deepspeed_missing_message(python: &str, detail: &str) -> String {
    format!(
        "DeepSpeed is not importable in `{python}` ({detail}); the bench runs zero1/zero2/zero3 \
         with DeepSpeed in that Python. Install it there: `{python} -m pip install deepspeed` \
         (DS_BUILD_OPS=0, the default, builds no CUDA ops: the runner needs none), or give \
         --python a Python that has it"
    )
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
    if d.offload != Offload::None && !runner.deepspeed {
        return Err(format!(
            "--offload {}: the bench offloads to the CPU under DeepSpeed only (zero1/zero2/\
             zero3); bench {} without offload",
            d.offload.as_str(),
            d.strategy.as_str()
        ));
    }
    if d.offload == Offload::Params && d.strategy != Strategy::Zero3 {
        return Err(format!(
            "--offload params: DeepSpeed offloads parameters under zero3 only, not {}",
            d.strategy.as_str()
        ));
    }
    if runner.deepspeed && !matches!(cfg.optimizer, Optimizer::Adam | Optimizer::AdamW) {
        return Err(format!(
            "--optimizer {}: the DeepSpeed runner steps DeepSpeed's Adam / AdamW (the optimizer \
             block of vramlab's DeepSpeed export); bench adam or adamw",
            cfg.optimizer.as_str()
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
         --rdzv_endpoint <node 0 host>:29500 crates/device/runners/{} {} CONFIG.jsonl --out-dir results\n\
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
    if s.runner.deepspeed {
        // DeepSpeed picks CUDA itself when torch sees a GPU; say so (no CPU op builders).
        env.push(("DS_ACCELERATOR".to_string(), "cuda".to_string()));
    }
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
    // dist_runner.py reads `gpus` as the world (torchrun's WORLD_SIZE); ds_runner.py, like
    // the measured rows (`vramlab validate`), as GPUs per node, the world gpus × nodes.
    v["gpus"] = if d.strategy.is_deepspeed() {
        json!(d.gpus_per_node)
    } else {
        json!(d.world())
    };
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
    if d.strategy.is_deepspeed() {
        deepspeed_keys(d, &mut v);
        // The config itself, as `vramlab export --format deepspeed` writes it for this
        // micro-batch: the runner takes it as it is instead of rebuilding it.
        let mut at = *cfg;
        at.batch = batch;
        v["ds_config"] = vramlab_core::export::frameworks::deepspeed_config(&at);
    }
    Ok(v.to_string())
}

/// DeepSpeed's knobs as `ds_runner.py` checks them (the config it runs is `ds_config`, the
/// export's); an absent optional knob is DeepSpeed's default there too.
fn deepspeed_keys(d: &Distributed, v: &mut Value) {
    v["offload"] = match d.offload {
        Offload::None => Value::Null,
        o => json!(o.as_str()),
    };
    v["reduce_bucket_size"] = json!(d.zero_bucket_elems);
    v["contiguous_gradients"] = json!(d.contiguous_gradients);
    if let Some(a) = d.allgather_bucket_elems {
        v["allgather_bucket_size"] = json!(a);
    }
    if let Some(o) = d.overlap_comm {
        v["overlap_comm"] = json!(o);
    }
    if d.strategy == Strategy::Zero3 {
        v["stage3_prefetch_bucket_size"] = json!(d.prefetch_elems);
        v["stage3_max_live_parameters"] = json!(d.max_live_params);
        v["stage3_param_persistence_threshold"] = json!(d.persistence_threshold);
        if let Some(r) = d.max_reuse_distance {
            v["stage3_max_reuse_distance"] = json!(r);
        }
    }
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
mod tests;
