//! The PyTorch engine for a multi-GPU world: each trial starts `crates/device/runners/dist_runner.py`
//! (FSDP2, DDP, torch-zero1) or `crates/device/runners/ds_runner.py` (DeepSpeed ZeRO-1/2/3; DeepSpeed must
//! be importable, checked before anything starts) — both embedded, next to
//! `torch_runner.py` which they import — with one config, either under
//! `torchrun` with one rank per GPU (real NCCL, every rank measured) or as one process,
//! rank 0 of the world emulated on one GPU under PyTorch's fake process group. Every rank
//! writes its record to `rank<R>.jsonl` in the trial's folder; the engine reads them all
//! ([`super::world::parse_ranks`]). A timeout, Cancel, a crashed rank or an OOM on any
//! rank ends the trial; the whole process group is killed, never waited on.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use serde_json::Value;

use super::engine::{Control, Engine, TrialJob, cancelled_trial};
use super::py_import::{IMPORT_TIMEOUT, check_import};
use super::torch::{SAMPLE_EVERY, TRIAL_TIMEOUT, TempDir, device_info, probe};
use super::world::{
    LaunchSpec, Runner, WorldResult, check_config, deepspeed_missing_message, dist_config_line,
    launch, parse_ranks, pick_mode, rank_file_name, runner_for,
};
use crate::gpu::nvml;
use vramlab_core::plan::TrainConfig;
use vramlab_core::record::{
    DeviceInfo, EngineKind, MemSample, Outcome, Trial, WorldMode, WorldRun,
};
use vramlab_core::units::Bytes;

/// The distributed runner of one bench run.
pub struct DistEngine {
    python: String,
    device_index: usize,
    env: Vec<(String, String)>,
    info: DeviceInfo,
    mode: WorldMode,
    world: u64,
    strategy: String,
    runner: Runner,
    dir: TempDir,
}

impl DistEngine {
    /// Checks `cfg`'s world, finds how many GPUs PyTorch sees and picks the mode.
    pub fn open(
        python: Option<PathBuf>,
        device_index: usize,
        env: &[(String, String)],
        cfg: &TrainConfig,
    ) -> Result<DistEngine> {
        check_config(EngineKind::Torch, cfg).map_err(|e| anyhow!(e))?;
        let runner = runner_for(cfg.distributed.strategy).map_err(|e| anyhow!(e))?;
        let python = python
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "python3".into());
        if runner.deepspeed {
            // Before the GPU probe: a Python without DeepSpeed is refused in words that
            // say so, whatever else it lacks.
            let mut ds_env = env.to_vec();
            ds_env.push(("DS_ACCELERATOR".into(), "cuda".into()));
            check_import(&python, &ds_env, "deepspeed", IMPORT_TIMEOUT)
                .map_err(|detail| anyhow!(deepspeed_missing_message(&python, &detail)))?;
        }
        let (_, gpus) = probe(&python, env)?;
        let world = cfg.distributed.world();
        let mode = pick_mode(world, gpus);
        let dir = TempDir::named("dist")?;
        super::runners::write_all(&dir.0, "torch_runner.py")?;
        let mut cmd = Command::new(&python);
        cmd.arg(dir.0.join("torch_runner.py")).arg("--env");
        if mode == WorldMode::Emulated {
            cmd.env("CUDA_VISIBLE_DEVICES", device_index.to_string());
        }
        let out = cmd
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .with_context(|| format!("running `{python} torch_runner.py --env`"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Value = text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| {
                anyhow!(
                    "`torch_runner.py --env` printed no versions line: {}",
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                )
            })?;
        Ok(DistEngine {
            python,
            device_index,
            env: env.to_vec(),
            info: device_info(&v["versions"]),
            mode,
            world,
            strategy: cfg.distributed.strategy.as_str().to_string(),
            runner,
            dir,
        })
    }

    fn world_run(&self) -> WorldRun {
        WorldRun {
            mode: self.mode,
            size: self.world,
            strategy: self.strategy.clone(),
        }
    }

    /// The GPU whose memory the timeline samples (torchrun: GPU 0 of the world).
    fn sampled_device(&self) -> u32 {
        match self.mode {
            WorldMode::Torchrun => 0,
            WorldMode::Emulated => self.device_index as u32,
        }
    }

    /// Starts the world for `config` writing into `out_dir`.
    fn start(&self, config: &Path, out_dir: &Path) -> Result<(Child, u32)> {
        let l = launch(&LaunchSpec {
            python: &self.python,
            mode: self.mode,
            world: self.world,
            runner: self.runner,
            scripts: &self.dir.0,
            config,
            out_dir,
            device_index: self.device_index,
        });
        let log = |name: &str| {
            File::create(out_dir.join(name))
                .with_context(|| format!("creating {}", out_dir.join(name).display()))
        };
        let mut cmd = Command::new(&l.program);
        cmd.args(&l.args)
            .envs(l.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log("stdout.log")?)
            .stderr(log("stderr.log")?);
        #[cfg(unix)]
        {
            // Its own process group: torchrun and every rank are killed together.
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting `{} {}`", l.program, l.args.join(" ")))?;
        Ok((child, l.ranks))
    }
}

/// Kills the process group of `child` (torchrun and its ranks), then the child.
fn kill_world(child: &mut Child) {
    #[cfg(unix)]
    {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last `n` lines of a log file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// How a wait for the world ended.
enum Waited {
    Exited(String),
    Cancelled,
    TimedOut,
}

impl Engine for DistEngine {
    fn device(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn trial(&mut self, job: &TrialJob<'_>, ctl: &mut Control<'_>) -> Trial {
        let (index, batch) = (job.index, job.batch);
        let fail = |message: String| Trial::failed(index, batch, Outcome::Error { message });
        if ctl.cancelled() {
            return cancelled_trial(index, batch);
        }
        let out_dir = self.dir.0.join(format!("trial{index}"));
        let config = out_dir.join("config.jsonl");
        let written = std::fs::create_dir_all(&out_dir)
            .context("creating the trial's folder")
            .and_then(|()| {
                dist_config_line(job.preset, &job.planner.config, job.planner.size, batch)
            })
            .and_then(|line| {
                std::fs::write(&config, format!("{line}\n"))
                    .with_context(|| format!("writing {}", config.display()))
            });
        if let Err(e) = written {
            return fail(format!("{e:#}"));
        }
        let device = self.sampled_device();
        let baseline = nvml::device_used(device);
        let what = self.world_run().describe();
        ctl.progress(index, batch, &format!("PyTorch {what}"), 0.1);
        let (mut child, ranks) = match self.start(&config, &out_dir) {
            Ok(c) => c,
            Err(e) => return fail(format!("{e:#}")),
        };
        let started = Instant::now();
        let mut samples: Vec<MemSample> = Vec::new();
        let waited = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Waited::Exited(status.to_string()),
                Ok(None) => {}
                Err(e) => {
                    kill_world(&mut child);
                    break Waited::Exited(format!("unknown ({e})"));
                }
            }
            if ctl.cancelled() {
                kill_world(&mut child);
                break Waited::Cancelled;
            }
            if started.elapsed() > TRIAL_TIMEOUT {
                kill_world(&mut child);
                break Waited::TimedOut;
            }
            let measured = match self.mode {
                WorldMode::Emulated => nvml::process_memory(device, child.id()),
                WorldMode::Torchrun => nvml::device_used(device)
                    .map(|u| Bytes(u.0.saturating_sub(baseline.map_or(0, |b| b.0)))),
            };
            if let Some(m) = measured {
                let s = MemSample {
                    t_ms: started.elapsed().as_secs_f64() * 1e3,
                    event: None,
                    measured: m,
                    predicted_allocated: None,
                    predicted_reserved: None,
                    label: match self.mode {
                        WorldMode::Emulated => "NVML process memory (rank 0)".into(),
                        WorldMode::Torchrun => "NVML GPU 0 used beyond the baseline".into(),
                    },
                };
                if samples.len() < 5000 {
                    samples.push(s.clone());
                }
                ctl.sample(index, s);
            }
            std::thread::sleep(SAMPLE_EVERY);
        };
        let mut trial = match waited {
            Waited::Cancelled => cancelled_trial(index, batch),
            Waited::TimedOut => fail(format!(
                "the world gave no result in {} s; its process group was killed. Last \
                 messages:\n{}",
                TRIAL_TIMEOUT.as_secs(),
                tail(&out_dir.join("stderr.log"), 5)
            )),
            Waited::Exited(status) => {
                let files: Vec<(u32, Option<String>)> = (0..ranks)
                    .map(|r| {
                        let text = std::fs::read_to_string(out_dir.join(rank_file_name(r))).ok();
                        (r, text)
                    })
                    .collect();
                parse_ranks(
                    index,
                    batch,
                    self.world_run(),
                    &WorldResult {
                        files: &files,
                        exit: &status,
                        stderr_tail: &tail(&out_dir.join("stderr.log"), 5),
                    },
                )
            }
        };
        trial.world = Some(self.world_run());
        trial.timeline = samples;
        trial.baseline_before = baseline;
        trial.baseline_after = settled_used(device, baseline);
        trial
    }
}

/// The device's used memory once the world's processes are gone: the driver tears a CUDA
/// context down shortly after its process exits, so an immediate reading can still hold it
/// (seen on the H200: 1.6 GiB above the baseline right after a rank exited). Polls for up to
/// [`SETTLE`] until the reading is back at `baseline`, then returns the last reading.
fn settled_used(device: u32, baseline: Option<Bytes>) -> Option<Bytes> {
    let start = Instant::now();
    loop {
        let now = nvml::device_used(device);
        let back = match (now, baseline) {
            (Some(n), Some(b)) => n.0 <= b.0,
            _ => true,
        };
        if back || start.elapsed() >= SETTLE {
            return now;
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
}

/// Longest wait for the device memory of an exited world to come back.
const SETTLE: Duration = Duration::from_secs(5);

/// The process handling without a GPU: a fake `python` answers the probes and plays the
/// world (ranks that write, a rank that dies, a world that hangs until Cancel).
#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use vramlab_core::model::preset::find_builtin;
    use vramlab_core::plan::Planner;
    use vramlab_core::plan::distributed::{Distributed, Strategy};

    const FAKE_PYTHON: &str = r#"#!/bin/sh
case "$*" in
  *"import deepspeed"*) [ -n "$FAKE_NO_DS" ] || exit 0
    echo "ModuleNotFoundError: No module named 'deepspeed'" >&2; exit 1;;
  *" -c "*|"-c "*) echo "2.9.0 True ${FAKE_GPUS:-2}"; exit 0;;
  *--env*) echo '{"versions": {"device_name": "Fake GPU", "device_total_bytes": 1000}}'; exit 0;;
esac
out=""; prev=""
for a in "$@"; do [ "$prev" = "--out-dir" ] && out="$a"; prev="$a"; done
echo "$* DS_ACCELERATOR=$DS_ACCELERATOR" > "$out/argv.txt"
case "$FAKE_WORLD" in
  ok) for r in 0 1; do echo "{\"rank\": $r, \"oom\": false, \"peak_allocated\": $((r + 1))000}" > "$out/rank$r.jsonl"; done;;
  crash) echo '{"rank": 0, "oom": false, "peak_allocated": 5}' > "$out/rank0.jsonl"; echo "rank 1 died" >&2; exit 1;;
  hang) sleep 60 & echo $! > "$out/sleeper.pid"; wait;;
esac
"#;

    fn fake_python(dir: &Path) -> PathBuf {
        let p = dir.join("python");
        crate::testing::write_executable(&p, FAKE_PYTHON).expect("fake python");
        p
    }

    /// The trial, and the pid the world's sleeper wrote (read before the engine's folder
    /// is removed).
    fn run_world(world: &str, gpus: &str, cancel_after: Option<Duration>) -> (Trial, String) {
        let (t, pid, _) = run_world_of(Strategy::Fsdp2, world, gpus, cancel_after);
        (t, pid)
    }

    /// `run_world` for `strategy`, also giving the command line the world was started with.
    fn run_world_of(
        strategy: Strategy,
        world: &str,
        gpus: &str,
        cancel_after: Option<Duration>,
    ) -> (Trial, String, String) {
        let tmp = TempDir::named("dist-test").expect("temp dir");
        let python = fake_python(&tmp.0);
        let preset = find_builtin("gpt2").expect("gpt2");
        let cfg = TrainConfig {
            distributed: Distributed::new(2, strategy),
            ..TrainConfig::default()
        };
        let planner = Planner::new(&preset, &cfg).expect("planner");
        let env = vec![
            ("FAKE_WORLD".to_string(), world.to_string()),
            ("FAKE_GPUS".to_string(), gpus.to_string()),
        ];
        let mut engine = DistEngine::open(Some(python), 0, &env, &cfg).expect("open");
        assert_eq!(engine.device().name, "Fake GPU");
        let cancel = AtomicBool::new(false);
        let job = TrialJob {
            preset: &preset,
            planner: &planner,
            index: 0,
            batch: 4,
            steps: 1,
        };
        let trial = std::thread::scope(|s| {
            if let Some(after) = cancel_after {
                let flag = &cancel;
                s.spawn(move || {
                    std::thread::sleep(after);
                    flag.store(true, Ordering::Relaxed);
                });
            }
            let mut emit = |_| {};
            let mut ctl = Control::new(&cancel, &mut emit);
            engine.trial(&job, &mut ctl)
        });
        let pid = std::fs::read_to_string(engine.dir.0.join("trial0/sleeper.pid"));
        let argv = std::fs::read_to_string(engine.dir.0.join("trial0/argv.txt"));
        let embedded = std::fs::read_to_string(engine.dir.0.join("ds_runner.py"));
        assert_eq!(
            embedded.ok().as_deref(),
            Some(super::super::runners::DS_RUNNER)
        );
        (
            trial,
            pid.unwrap_or_default().trim().to_string(),
            argv.unwrap_or_default(),
        )
    }

    #[test]
    fn deepspeed_runs_ds_runner_under_torchrun_and_emulated() {
        let (t, _, argv) = run_world_of(Strategy::Zero2, "ok", "2", None);
        assert_eq!(t.outcome, Outcome::Ran, "{:?}", t.outcome);
        assert_eq!(t.world.as_ref().map(|w| w.strategy.as_str()), Some("zero2"));
        assert_eq!(t.world.as_ref().map(|w| w.mode), Some(WorldMode::Torchrun));
        assert_eq!(t.max_rank_allocated(), Some(Bytes(2000)));
        assert!(
            argv.contains("-m torch.distributed.run --standalone --nproc_per_node 2")
                && argv.contains("/ds_runner.py measure ")
                && argv.contains("DS_ACCELERATOR=cuda"),
            "{argv}"
        );
        let (t, _, argv) = run_world_of(Strategy::Zero3, "ok", "1", None);
        assert_eq!(t.world.as_ref().map(|w| w.mode), Some(WorldMode::Emulated));
        assert!(
            argv.starts_with("-u ") && argv.contains("/ds_runner.py measure "),
            "{argv}"
        );
        // Emulated: one process, rank 0's file is the one read.
        assert_eq!(t.ranks.len(), 1);
        assert_eq!(t.peak_allocated, Some(Bytes(1000)));
    }

    #[test]
    fn deepspeed_missing_from_the_python_is_refused_before_anything_runs() {
        let tmp = TempDir::named("dist-test").expect("temp dir");
        let python = fake_python(&tmp.0);
        let cfg = TrainConfig {
            distributed: Distributed::new(2, Strategy::Zero2),
            ..TrainConfig::default()
        };
        let env = vec![("FAKE_NO_DS".to_string(), "1".to_string())];
        let e = DistEngine::open(Some(python.clone()), 0, &env, &cfg)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(
            e.contains("DeepSpeed is not importable in")
                && e.contains("No module named 'deepspeed'")
                && e.contains("-m pip install deepspeed"),
            "{e}"
        );
        // FSDP2 does not need DeepSpeed.
        let fsdp = TrainConfig {
            distributed: Distributed::new(2, Strategy::Fsdp2),
            ..TrainConfig::default()
        };
        assert!(DistEngine::open(Some(python), 0, &env, &fsdp).is_ok());
    }

    #[test]
    fn torchrun_reads_every_rank() {
        let (t, _) = run_world("ok", "2", None);
        assert_eq!(t.outcome, Outcome::Ran, "{:?}", t.outcome);
        assert_eq!(t.world.as_ref().map(|w| w.mode), Some(WorldMode::Torchrun));
        assert_eq!(t.peak_allocated, Some(Bytes(1000)));
        assert_eq!(t.max_rank_allocated(), Some(Bytes(2000)));
    }

    #[test]
    fn a_crashed_rank_is_an_error_naming_it() {
        let (t, _) = run_world("crash", "2", None);
        let Outcome::Error { message } = &t.outcome else {
            panic!("{:?}", t.outcome)
        };
        assert!(message.contains("no result from rank 1"), "{message}");
        assert!(message.contains("rank 1 died"), "{message}");
    }

    #[test]
    fn one_gpu_emulates_rank_0_and_cancel_kills_the_process_group() {
        let start = Instant::now();
        let (t, pid) = run_world("hang", "1", Some(Duration::from_millis(500)));
        assert_eq!(t.outcome, Outcome::Cancelled);
        assert_eq!(t.world.as_ref().map(|w| w.mode), Some(WorldMode::Emulated));
        assert!(start.elapsed() < Duration::from_secs(20));
        // The world's own child (the sleeper) went with it.
        assert!(!pid.is_empty());
        std::thread::sleep(Duration::from_millis(200));
        let alive =
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "the sleeper {pid} outlived its world");
    }
}
