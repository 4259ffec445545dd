//! The PyTorch engine: runs the same configuration with the reference implementation
//! (torchvision / transformers, random init) in the user's Python, through
//! `crates/device/runners/torch_runner.py serve` (embedded in the binary). One subprocess per run keeps
//! the model between trials; each trial is one JSON line in and one out. NVML samples
//! the subprocess's memory while a trial runs. Cancel kills the subprocess.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use super::engine::{Control, Engine, TrialJob, cancelled_trial};
use crate::gpu::nvml;
use vramlab_core::model::Preset;
use vramlab_core::plan::TrainConfig;
use vramlab_core::record::{DeviceInfo, MemSample, Outcome, Trial};
use vramlab_core::units::Bytes;

/// The reference runner, shipped inside the binary (with its siblings: [`super::runners`]).
pub const RUNNER: &str = super::runners::TORCH_RUNNER;

/// Longest a single trial may take before the subprocess is killed.
pub const TRIAL_TIMEOUT: Duration = Duration::from_secs(900);
/// How often NVML is sampled during a trial.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// Whether `python` can import torch with CUDA (`Ok(version)`), else why not.
pub fn detect(python: &str) -> Result<String> {
    probe(python, &[]).map(|(version, _)| version)
}

/// PyTorch's version and how many CUDA GPUs it sees with the extra environment `env`
/// (`CUDA_VISIBLE_DEVICES`), or why it cannot run.
pub fn probe(python: &str, env: &[(String, String)]) -> Result<(String, usize)> {
    let out = Command::new(python)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .args([
            "-c",
            "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())",
        ])
        .output()
        .with_context(|| {
            format!("running `{python}` (set the Python path of the PyTorch engine)")
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").to_string();
        bail!("`{python} -c 'import torch'` failed: {last}");
    }
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut parts = text.split_whitespace();
    let version = parts.next().unwrap_or("?").to_string();
    if parts.next() != Some("True") {
        bail!(
            "PyTorch {version} in `{python}` cannot see a CUDA GPU (torch.cuda.is_available() is False)"
        );
    }
    let count = parts.next().and_then(|c| c.parse().ok()).unwrap_or(1);
    Ok((version, count))
}

/// A running `torch_runner.py serve`.
pub struct TorchEngine {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr_tail: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    info: DeviceInfo,
    pid: u32,
    python: String,
    device_index: usize,
    /// Whether a first, unreported batch-1 step has run in this process (see `prime`).
    primed: bool,
    /// Extra environment of the runner process (kept for restarts).
    env: Vec<(String, String)>,
    /// The runner started (`torch_runner.py`, or `infer_runner.py` for inference).
    script: &'static str,
    /// Whether this process has answered a trial (an inference trial wants a fresh one).
    pub(crate) used: bool,
    _dir: TempDir,
}

/// A private temporary folder, removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new() -> Result<TempDir> {
        TempDir::named("torch")
    }

    /// `vramlab-<what>-<pid>-<n>` in the system's temporary folder.
    pub(crate) fn named(what: &str) -> Result<TempDir> {
        let base = std::env::temp_dir();
        for i in 0..100u32 {
            let p = base.join(format!("vramlab-{what}-{}-{i}", std::process::id()));
            if std::fs::create_dir(&p).is_ok() {
                return Ok(TempDir(p));
            }
        }
        bail!("could not create a temporary folder in {}", base.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The device a runner's `versions()` object describes.
pub(crate) fn device_info(versions: &Value) -> DeviceInfo {
    DeviceInfo {
        name: versions["device_name"]
            .as_str()
            .unwrap_or("CUDA device")
            .into(),
        total_bytes: Bytes(versions["device_total_bytes"].as_u64().unwrap_or(0)),
        driver: versions["driver"].as_str().map(str::to_string),
        versions: versions_map(versions),
    }
}

fn versions_map(v: &Value) -> std::collections::BTreeMap<String, String> {
    v.as_object()
        .map(|o| {
            o.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| {
                    let s = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    (k.clone(), s)
                })
                .collect()
        })
        .unwrap_or_default()
}

impl TorchEngine {
    /// Starts the runner with `python` (default `python3`) on CUDA device `device_index`.
    pub fn open(
        python: Option<PathBuf>,
        device_index: usize,
        env: &[(String, String)],
    ) -> Result<TorchEngine> {
        TorchEngine::open_runner(python, device_index, env, "torch_runner.py")
    }

    /// Starts `script serve` (one of the shipped runners speaking this protocol) with
    /// `python` on CUDA device `device_index`.
    pub(crate) fn open_runner(
        python: Option<PathBuf>,
        device_index: usize,
        env: &[(String, String)],
        script: &'static str,
    ) -> Result<TorchEngine> {
        let python = python
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "python3".into());
        detect(&python)?;
        let dir = TempDir::new()?;
        let path = super::runners::write_all(&dir.0, script)?;
        let mut child = Command::new(&python)
            .arg("-u")
            .arg(&path)
            .args(["serve", "--device", "cuda"])
            .env("CUDA_VISIBLE_DEVICES", device_index.to_string())
            .env("PYTHONUNBUFFERED", "1")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting `{python} {script} serve`"))?;
        let stdout = child.stdout.take().context("runner stdout")?;
        let stderr = child.stderr.take().context("runner stderr")?;
        let stdin = child.stdin.take();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let tail = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let tail_w = tail.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut buf = String::new();
            while r.read_line(&mut buf).is_ok_and(|n| n > 0) {
                if let Ok(mut t) = tail_w.lock() {
                    t.push(buf.trim_end().to_string());
                    let n = t.len();
                    if n > 40 {
                        t.drain(..n - 40);
                    }
                }
                buf.clear();
            }
        });
        let mut engine = TorchEngine {
            child: Some(child),
            stdin,
            lines,
            stderr_tail: tail,
            info: DeviceInfo::default(),
            pid: 0,
            python,
            device_index,
            primed: false,
            env: env.to_vec(),
            script,
            used: false,
            _dir: dir,
        };
        let ready = engine
            .next_line(Duration::from_secs(120), None)
            .context("waiting for the PyTorch runner to start")?;
        let v: Value = serde_json::from_str(&ready)
            .with_context(|| format!("the runner's first line is not JSON: {ready}"))?;
        engine.pid = v["pid"].as_u64().unwrap_or(0) as u32;
        engine.info = device_info(&v["versions"]);
        Ok(engine)
    }

    fn stderr_tail(&self) -> String {
        self.stderr_tail
            .lock()
            .map(|t| {
                t.iter()
                    .rev()
                    .take(5)
                    .rev()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    }

    /// The next stdout line; `sample` is called every [`SAMPLE_EVERY`] while waiting and
    /// may return `false` to stop waiting (cancel).
    fn next_line(
        &mut self,
        timeout: Duration,
        mut sample: Option<&mut dyn FnMut() -> bool>,
    ) -> Result<String> {
        let start = Instant::now();
        loop {
            match self.lines.recv_timeout(SAMPLE_EVERY) {
                Ok(line) if line.trim_start().starts_with('{') => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(f) = sample.as_mut()
                        && !f()
                    {
                        self.kill();
                        bail!("cancelled");
                    }
                    if start.elapsed() > timeout {
                        self.kill();
                        bail!(
                            "the PyTorch runner gave no answer in {} s",
                            timeout.as_secs()
                        );
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self
                        .child
                        .as_mut()
                        .and_then(|c| c.wait().ok())
                        .map_or("unknown".to_string(), |s| s.to_string());
                    self.child = None;
                    bail!(
                        "the PyTorch runner exited ({status}); last messages:\n{}",
                        self.stderr_tail()
                    );
                }
            }
        }
    }

    fn send(&mut self, line: &str) -> Result<()> {
        let s = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("the runner's stdin is closed"))?;
        writeln!(s, "{line}")
            .and_then(|()| s.flush())
            .context("sending the config to the runner")
    }

    fn kill(&mut self) {
        self.stdin = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn device_used(&self) -> Option<u64> {
        nvml::device_used(self.device_index as u32).map(|b| b.0)
    }

    /// Restarts a runner that died (crash, kill) so the next trial can run, or one that
    /// answered a trial when the next wants a fresh process.
    pub(crate) fn restart(&mut self) -> Result<()> {
        let python = PathBuf::from(&self.python);
        let env = std::mem::take(&mut self.env);
        self.kill();
        *self = TorchEngine::open_runner(Some(python), self.device_index, &env, self.script)?;
        Ok(())
    }

    /// Whether the runner process is alive.
    pub(crate) fn alive(&self) -> bool {
        self.child.is_some()
    }

    /// Sends one config `line` and waits for its reply while NVML samples the process's
    /// memory: the trial it measured, with the device's used memory before and after.
    pub(crate) fn exchange(
        &mut self,
        index: u32,
        batch: u64,
        line: &str,
        phase: &str,
        ctl: &mut Control<'_>,
    ) -> Trial {
        let fail = |message: String| Trial::failed(index, batch, Outcome::Error { message });
        let baseline = self.device_used();
        ctl.progress(index, batch, phase, 0.1);
        if let Err(e) = self.send(line) {
            self.kill();
            return fail(format!("{e:#}"));
        }
        self.used = true;
        let started = Instant::now();
        let mut samples: Vec<MemSample> = Vec::new();
        let (device_index, pid) = (self.device_index, self.pid);
        let reply = {
            let mut sampler = || {
                if let Some(used) = nvml::process_memory(device_index as u32, pid) {
                    let s = MemSample {
                        t_ms: started.elapsed().as_secs_f64() * 1e3,
                        event: None,
                        measured: used,
                        predicted_allocated: None,
                        predicted_reserved: None,
                        label: "NVML process memory".into(),
                    };
                    if samples.len() < 5000 {
                        samples.push(s.clone());
                    }
                    ctl.sample(index, s);
                }
                !ctl.cancelled()
            };
            self.next_line(TRIAL_TIMEOUT, Some(&mut sampler))
        };
        let mut trial = match reply {
            Ok(text) => match serde_json::from_str::<Value>(&text) {
                Ok(v) => parse_reply(index, batch, &v),
                Err(e) => fail(format!("runner reply is not JSON ({e}): {text}")),
            },
            Err(_) if ctl.cancelled() => cancelled_trial(index, batch),
            Err(e) => fail(format!("{e:#}")),
        };
        trial.timeline = samples;
        trial.baseline_before = baseline.map(Bytes);
        trial.baseline_after = self.device_used().map(Bytes);
        trial
    }
}

impl Drop for TorchEngine {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The runner's config line for `cfg` at `batch`.
pub fn config_line(preset: &Preset, cfg: &TrainConfig, size: u64, batch: u64) -> Result<String> {
    let preset_json = serde_json::to_value(preset).context("serialising the preset")?;
    let mut c = json!({
        "model": preset_json,
        "batch": batch,
        "precision": cfg.precision.as_str(),
        "optimizer": cfg.optimizer.as_str(),
        "accum": cfg.accum,
        "checkpointing": cfg.checkpointing,
        "attention": cfg.attention.as_str(),
        "loop": cfg.loop_shape.as_str(),
    });
    let key = if preset.input.is_tokens() {
        "seq"
    } else {
        "image"
    };
    c[key] = json!(size);
    if let Some(t) = preset.target_seq(cfg.target_seq) {
        // Encoder-decoder: labels of their own length (crates/device/runners/torch_runner.py).
        c["target_seq"] = json!(t);
    }
    let ft = &cfg.finetune;
    if !ft.is_full() {
        // peft LoRA / QLoRA as the plan has it (lora_alpha does not change the memory; the
        // runner's default 16 is used).
        c["finetune"] = json!(ft.mode.as_str());
        c["lora_rank"] = json!(ft.lora_rank);
        c["lora_targets"] = json!(ft.lora_targets.to_string());
        c["lora_dropout"] = json!(ft.lora_dropout.p());
        if ft.mode == vramlab_core::plan::finetune::FineTuneMode::Qlora {
            c["quant"] = json!(ft.quant.as_str());
            c["double_quant"] = json!(ft.double_quant);
        }
    }
    Ok(c.to_string())
}

fn bytes(v: &Value, key: &str) -> Option<Bytes> {
    v.get(key).and_then(Value::as_u64).map(Bytes)
}

impl Engine for TorchEngine {
    fn device(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn trial(&mut self, job: &TrialJob<'_>, ctl: &mut Control<'_>) -> Trial {
        let (index, batch) = (job.index, job.batch);
        let fail = |message: String| Trial::failed(index, batch, Outcome::Error { message });
        if ctl.cancelled() {
            return cancelled_trial(index, batch);
        }
        if self.child.is_none()
            && let Err(e) = self.restart()
        {
            return fail(format!("restarting the PyTorch runner: {e:#}"));
        }
        let line = match config_line(job.preset, &job.planner.config, job.planner.size, batch) {
            Ok(l) => l,
            Err(e) => return fail(format!("{e:#}")),
        };
        if !self.primed {
            // The first step in a process loads CUDA kernels and library state (cuDNN,
            // cuBLASLt) that stay for the process's life; run it once at batch 1 so the
            // trials' baselines include it.
            ctl.progress(index, batch, "PyTorch: first step (loading kernels)", 0.05);
            if let Ok(prime) = config_line(job.preset, &job.planner.config, job.planner.size, 1)
                && self.send(&prime).is_ok()
            {
                let _ = self.next_line(TRIAL_TIMEOUT, None);
            }
            self.primed = true;
        }
        self.exchange(
            index,
            batch,
            &line,
            "PyTorch: building the model and running steps",
            ctl,
        )
    }
}

/// Turns one runner reply into a trial.
pub fn parse_reply(index: u32, batch: u64, v: &Value) -> Trial {
    if let Some(err) = v.get("error").and_then(Value::as_str) {
        return Trial::failed(
            index,
            batch,
            Outcome::Error {
                message: err.to_string(),
            },
        );
    }
    if v.get("oom").and_then(Value::as_bool) == Some(true) {
        let mut t = Trial::failed(
            index,
            batch,
            Outcome::Oom {
                message: v
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("CUDA out of memory")
                    .to_string(),
            },
        );
        t.peak_allocated = bytes(v, "peak_allocated_before_oom");
        t.peak_reserved = bytes(v, "peak_reserved_before_oom");
        return t;
    }
    let mut t = Trial::failed(index, batch, Outcome::Ran);
    t.peak_allocated = bytes(v, "peak_allocated");
    t.peak_reserved = bytes(v, "peak_reserved");
    t.process_bytes = bytes(v, "nvml_process_bytes");
    t.step_ms = v.get("step_ms").and_then(Value::as_f64);
    t
}
