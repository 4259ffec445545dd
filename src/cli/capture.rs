//! `vramlab capture`: runs the embedded `runners/capture.py` with the user's Python to record
//! one training step of a PyTorch model on fake tensors (`*.vramlab-graph.json`).

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

/// The capture helper, embedded so that the binary alone can run it.
pub const CAPTURE_PY: &str = include_str!("../../runners/capture.py");
/// CUDA's autocast policy for captures on a machine without a GPU (imported by capture.py
/// from its own folder).
pub const CUDA_AUTOCAST_PY: &str = include_str!("../../runners/cuda_autocast.py");
/// CUDA's SDPA backend and fused dropout mirrored on the CPU (capture.py imports it beside itself).
pub const CUDA_COMPOSITES_PY: &str = include_str!("../../runners/cuda_composites.py");

#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// A timm model name (random init, nothing downloaded).
    #[arg(long, group = "source")]
    pub timm: Option<String>,
    /// A torchvision model name (random init).
    #[arg(long, group = "source")]
    pub torchvision: Option<String>,
    /// A Hugging Face config.json (a causal LM, random init).
    #[arg(long, group = "source")]
    pub hf: Option<PathBuf>,
    /// Your model: path/to/file.py:factory (a function that returns the nn.Module).
    #[arg(long, group = "source")]
    pub module: Option<String>,
    /// Per-sample input shape, e.g. 3x256x256 (default: 3×IMAGE×IMAGE, or SEQ tokens).
    #[arg(long)]
    pub input: Option<String>,
    /// Image side in pixels [default: 224].
    #[arg(long)]
    pub image: Option<u64>,
    /// Sequence length (token models) [default: 512].
    #[arg(long)]
    pub seq: Option<u64>,
    /// fp32, amp-bf16, amp-fp16 or bf16.
    #[arg(long, default_value = "amp-bf16")]
    pub precision: String,
    /// Activation checkpointing of the model's blocks.
    #[arg(long)]
    pub checkpointing: bool,
    /// plain or trainer (see `vramlab plan --help`).
    #[arg(long = "loop", default_value = "plain")]
    pub loop_shape: String,
    /// adamw, adam, sgd or sgd-momentum.
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// Batch sizes to capture (at least two; a third checks the fit).
    #[arg(long, default_value = "2,4,6")]
    pub batches: String,
    /// Run for real on the CPU instead of on fake tensors (for ops whose output shape
    /// depends on data; use small batches).
    #[arg(long)]
    pub real_cpu: bool,
    /// The Python with torch [default: python3].
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The graph file to write (`*.vramlab-graph.json`).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// What each exit status of capture.py means.
fn explain(code: i32) -> &'static str {
    match code {
        2 => "bad arguments",
        3 => {
            "PyTorch (or timm / transformers / torchvision) is not installed in that Python; \
              pass --python PATH to one that has it"
        }
        4 => "the model factory failed",
        5 => {
            "an op does not run under fake tensors; capture for real with --real-cpu at small batches"
        }
        6 => "the model's allocations do not scale with the batch",
        _ => "the capture failed",
    }
}

pub fn cmd_capture(a: CaptureArgs, out: &mut dyn Write) -> Result<()> {
    let python = a.python.clone().unwrap_or_else(|| "python3".into());
    let dir = std::env::temp_dir().join(format!("vramlab-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let script = dir.join("capture.py");
    std::fs::write(&script, CAPTURE_PY).with_context(|| format!("writing {}", script.display()))?;
    let policy = dir.join("cuda_autocast.py");
    std::fs::write(&policy, CUDA_AUTOCAST_PY)
        .with_context(|| format!("writing {}", policy.display()))?;
    let composites = dir.join("cuda_composites.py");
    std::fs::write(&composites, CUDA_COMPOSITES_PY)
        .with_context(|| format!("writing {}", composites.display()))?;
    let mut cmd = Command::new(&python);
    cmd.arg(&script);
    let mut opt = |flag: &str, v: Option<String>| {
        if let Some(v) = v {
            cmd.arg(flag).arg(v);
        }
    };
    opt("--timm", a.timm.clone());
    opt("--torchvision", a.torchvision.clone());
    opt("--hf", a.hf.as_ref().map(|p| p.display().to_string()));
    opt("--module", a.module.clone());
    opt("--input", a.input.clone());
    opt("--image", a.image.map(|x| x.to_string()));
    opt("--seq", a.seq.map(|x| x.to_string()));
    opt("--precision", Some(a.precision.clone()));
    opt("--loop", Some(a.loop_shape.clone()));
    opt("--optimizer", Some(a.optimizer.clone()));
    opt("--batches", Some(a.batches.clone()));
    opt("-o", Some(a.output.display().to_string()));
    if a.checkpointing {
        cmd.arg("--checkpointing");
    }
    if a.real_cpu {
        cmd.arg("--real-cpu");
    }
    if a.timm.is_none() && a.torchvision.is_none() && a.hf.is_none() && a.module.is_none() {
        bail!("one of --timm, --torchvision, --hf, --module is required");
    }
    let result = cmd.output();
    let _ = std::fs::remove_dir_all(&dir);
    let output = match result {
        Ok(o) => o,
        Err(e) => bail!(
            "--python: cannot run `{}` ({e}); install Python 3 with torch, or pass --python PATH",
            python.display()
        ),
    };
    if !output.status.success() {
        let code = output.status.code().unwrap_or(1);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last: Vec<&str> = stderr.lines().rev().take(8).collect();
        let tail: Vec<&str> = last.into_iter().rev().collect();
        bail!(
            "capture: {} (exit {code}):\n{}",
            explain(code),
            tail.join("\n")
        );
    }
    out.write_all(&output.stdout)?;
    Ok(())
}
