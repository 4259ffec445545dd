//! The GPU commands of the CLI: `bench`, `gpus`, `profile`. Without a GPU each exits
//! non-zero with a message saying what is missing.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use clap::Args;

use super::args::{TrainArgs, resolve_model};
use vramlab_core::plan::Planner;
use vramlab_core::plan::config::MAX_BATCH;
use vramlab_core::plan::search::{Budget, max_batch};
use vramlab_core::record::{BenchEvent, EngineKind, Outcome, Run};
use vramlab_core::sweep::BatchPlan;
use vramlab_core::units::Bytes;
use vramlab_device::bench::InferBench;
use vramlab_device::bench::runner::{BenchRequest, run_blocking};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// native (cudarc + cuBLAS) or torch (the reference model in PyTorch).
    #[arg(long, default_value = "native")]
    pub engine: String,
    /// Batch sizes to run, e.g. 4,8,16.
    #[arg(long, conflicts_with = "sweep")]
    pub batch: Option<String>,
    /// Find the largest batch that runs: start at the predicted max batch, then bisect.
    /// With --gpus N --strategy S: the largest per-rank micro-batch (an OOM on any rank is
    /// an OOM).
    #[arg(long)]
    pub sweep: bool,
    /// Largest batch a sweep tries.
    #[arg(long, default_value_t = 8192)]
    pub limit: u64,
    /// Timed steps per trial.
    #[arg(long, default_value_t = 3)]
    pub steps: u32,
    /// Python interpreter for the torch engine.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Also write the run as JSON (every trial, measured and predicted).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the trials as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print no progress on stderr.
    #[arg(long)]
    pub quiet: bool,
}

fn gib(b: Option<Bytes>) -> String {
    b.map_or("—".into(), |b| {
        format!("{:.2}", b.0 as f64 / (1u64 << 30) as f64)
    })
}

fn pct(p: Option<f64>) -> String {
    p.map_or("—".into(), |p| format!("{p:+.1}%"))
}

/// The predicted max batch on the device the bench will use (NVML), else on `--gpu`.
fn predicted_max(planner: &Planner, train: &TrainArgs) -> Result<Option<u64>> {
    let budget = Budget {
        capacity: bench_capacity(train)?,
        margin: 0.0,
    };
    Ok(max_batch(planner, budget, MAX_BATCH)?)
}

/// The memory of the device the bench will use (NVML), else of `--gpu`.
fn bench_capacity(train: &TrainArgs) -> Result<Bytes> {
    Ok(match vramlab_device::gpu::detect() {
        Some(g) => vramlab_core::plan::gpus::Gpu::detected(
            &g.name,
            g.total,
            &vramlab_core::plan::gpus::catalog(),
        )
        .memory(),
        None => super::args::find_gpu(train.gpu.as_deref().unwrap_or(super::args::DEFAULT_GPU))?
            .0
            .memory(),
    })
}

/// `--batch 4,8,16` or `--sweep` as a batch plan.
fn batch_plan(a: &BenchArgs) -> Result<BatchPlan> {
    Ok(match (&a.batch, a.sweep) {
        (Some(list), false) => {
            vramlab_words::batches::batch_list(list).map_err(anyhow::Error::msg)?
        }
        (None, true) => BatchPlan::UntilOom {
            // 0: the runner seeds from the device the engine opens.
            seed: 0,
            limit: a.limit.clamp(1, MAX_BATCH),
        },
        _ => bail!("give --batch 4,8,16 or --sweep"),
    })
}

pub fn cmd_bench(a: BenchArgs, out: &mut dyn Write) -> Result<()> {
    let engine = vramlab_words::parse::<EngineKind>(&a.engine)
        .ok()
        .with_context(|| {
            format!(
                "--engine: unknown engine `{}` (known: native, torch)",
                a.engine
            )
        })?;
    if a.steps == 0 || a.steps > 1000 {
        bail!("--steps: must be between 1 and 1000, got {}", a.steps);
    }
    if super::infer::is_inference(&a.train) {
        return cmd_bench_infer(&a, engine, out);
    }
    let (preset, cfg) = resolve_model(&a.train)?;
    let planner = Planner::new(&preset, &cfg)?;
    if let Err(e) = vramlab_device::bench::world::check_config(engine, &cfg) {
        if e.contains("--nnodes") {
            // The command needs a config file: give its line.
            let line =
                vramlab_device::bench::world::dist_config_line(&preset, &cfg, planner.size, 1)?;
            bail!("{e}\nCONFIG.jsonl (one line; set \"batch\"):\n{line}");
        }
        bail!("{e}");
    }
    let predicted = predicted_max(&planner, &a.train)?;
    let batches = batch_plan(&a)?;
    let req = BenchRequest {
        preset,
        config: cfg,
        engine,
        batches,
        steps: a.steps,
        python: a.python.clone(),
        device_index: a.device,
        predicted_max_batch: predicted,
        runner_env: Vec::new(),
        inference: None,
    };
    run_and_write(&a, req, out)
}

/// `bench --step generate|prefill`: the inference planner of the flags predicts, the
/// shipped `infer_runner.py` measures (PyTorch engine only).
fn cmd_bench_infer(a: &BenchArgs, engine: EngineKind, out: &mut dyn Write) -> Result<()> {
    let (preset, planner, hf_config) = super::infer::bench_planner(&a.train)?;
    let capacity = bench_capacity(&a.train)?;
    let predicted = planner.max_batch(
        Budget {
            capacity,
            margin: 0.0,
        },
        MAX_BATCH,
    )?;
    let mut config = vramlab_core::plan::TrainConfig::default();
    config.allocator = planner.config.allocator;
    let req = BenchRequest {
        preset,
        config,
        engine,
        batches: batch_plan(a)?,
        steps: 1,
        python: a.python.clone(),
        device_index: a.device,
        predicted_max_batch: predicted,
        runner_env: Vec::new(),
        inference: Some(InferBench { planner, hf_config }),
    };
    if let Some(bench) = &req.inference {
        vramlab_device::bench::infer::check(engine, &req, bench).map_err(anyhow::Error::msg)?;
    }
    run_and_write(a, req, out)
}

/// Runs `req` with progress on stderr, writes `--out` / `--csv`, prints the table or the
/// JSON.
fn run_and_write(a: &BenchArgs, req: BenchRequest, out: &mut dyn Write) -> Result<()> {
    let engine = req.engine;
    let cancel = AtomicBool::new(false);
    let quiet = a.quiet || a.train.json;
    let mut last_phase = String::new();
    let mut emit = |e: BenchEvent| {
        if quiet {
            return;
        }
        match e {
            BenchEvent::Started { device, .. } => {
                eprintln!(
                    "[bench] {} on {} ({})",
                    engine.label(),
                    device.name,
                    device.total_bytes
                )
            }
            BenchEvent::TrialDone { trial } if trial.world.is_some() => {
                let world = trial
                    .world
                    .as_ref()
                    .map(|w| w.describe())
                    .unwrap_or_default();
                eprintln!(
                    "[bench] batch {}: {} ({world}; {} rank(s) reported)",
                    trial.batch,
                    trial.outcome.label(),
                    trial.ranks.len()
                )
            }
            BenchEvent::Progress {
                trial,
                batch,
                phase,
                ..
            } => {
                let line = format!("[bench] trial {} batch {batch}: {phase}", trial + 1);
                if line != last_phase {
                    eprintln!("{line}");
                    last_phase = line;
                }
            }
            BenchEvent::TrialDone { trial } => {
                eprintln!("[bench] batch {}: {}", trial.batch, trial.outcome.label())
            }
            BenchEvent::Failed { message } => eprintln!("[bench] failed: {message}"),
            BenchEvent::Sample { .. } | BenchEvent::Finished { .. } => {}
        }
    };
    let run = run_blocking(&req, &cancel, &mut emit)?;
    if let Some(path) = &a.out {
        let text = vramlab_core::export::results::run_to_json(&run);
        vramlab_core::fsutil::write_atomic(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.csv {
        vramlab_core::fsutil::write_atomic(
            path,
            vramlab_core::export::results::run_to_csv(&run).as_bytes(),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    if a.train.json {
        let mut v = serde_json::to_value(&run).context("serialising the run")?;
        v["max_batch_ran"] = serde_json::json!(run.max_batch_ran());
        v["first_oom_batch"] = serde_json::json!(run.first_oom());
        writeln!(out, "{v}")?;
    } else {
        write_run(&run, out)?;
    }
    if run
        .trials
        .iter()
        .all(|t| matches!(t.outcome, Outcome::Error { .. }))
        && !run.trials.is_empty()
    {
        bail!("every trial failed (see the table above)");
    }
    Ok(())
}

/// A run's first two lines: the model, what ran (`what`: the precision, or the inference
/// call), the engine and the predicted max batch; then the device.
fn write_head(run: &Run, what: &str, out: &mut dyn Write) -> Result<()> {
    writeln!(
        out,
        "{} · {what} · {} · batch plan {}",
        run.model,
        run.engine.label(),
        run.predicted_max_batch
            .map_or("(no prediction)".into(), |m| format!(
                "(predicted max batch {m})"
            ))
    )?;
    writeln!(
        out,
        "device: {} ({}), driver {}",
        run.device.name,
        run.device.total_bytes,
        run.device.driver.as_deref().unwrap_or("?")
    )?;
    Ok(())
}

fn write_run(run: &Run, out: &mut dyn Write) -> Result<()> {
    if let Some(inf) = &run.inference {
        return write_infer_run(run, inf, out);
    }
    write_head(run, run.config.precision.as_str(), out)?;
    let d = &run.config.distributed;
    if d.active() {
        let how = run
            .trials
            .iter()
            .find_map(|t| t.world.as_ref())
            .map_or("no trial ran".to_string(), |w| w.describe());
        writeln!(
            out,
            "world {} · strategy {} · {how}; the headline peaks are rank 0's (what the plan \
             predicts)",
            d.world(),
            d.strategy.as_str()
        )?;
    }
    if run.engine == EngineKind::Native {
        write_native_trials(run, out)?;
    } else {
        write_torch_trials(run, out)?;
    }
    write_end(run, out)
}

/// The largest batch that ran, the first OOM and how the run stopped.
fn write_end(run: &Run, out: &mut dyn Write) -> Result<()> {
    match run.max_batch_ran() {
        Some(m) => writeln!(
            out,
            "largest batch that ran: {m}{}",
            run.first_oom()
                .map_or(String::new(), |o| format!("; first OOM at {o}"))
        )?,
        None => writeln!(out, "no batch ran")?,
    }
    if let Some(s) = &run.stopped {
        writeln!(out, "stopped: {s}")?;
    }
    Ok(())
}

/// An inference run: the call, then measured next to the inference planner's prediction per
/// batch, with the errors of allocated, reserved and the process (nvidia-smi).
fn write_infer_run(
    run: &Run,
    inf: &vramlab_core::record::InferRun,
    out: &mut dyn Write,
) -> Result<()> {
    write_head(run, &inf.describe(), out)?;
    writeln!(
        out,
        "each trial: a fresh infer_runner.py process builds the model (random weights), runs \
         the call once to warm up, then measures one call; predicted: vramlab's inference plan"
    )?;
    writeln!(
        out,
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10}",
        "batch",
        "outcome",
        "alloc",
        "reserved",
        "process",
        "pred.all",
        "pred.res",
        "pred.smi",
        "err.all",
        "err.res",
        "err.smi",
        "call ms"
    )?;
    writeln!(
        out,
        "{:>6} {:>9} {:>29} {:>29}",
        "", "", "measured (GiB)", "predicted (GiB)"
    )?;
    for t in &run.trials {
        let e = t.errors_pct();
        writeln!(
            out,
            "{:>6} {:>9} {} {:>8} {:>8} {:>8} {:>10}",
            t.batch,
            t.outcome.label(),
            measured_and_predicted(t),
            pct(e.allocated),
            pct(e.reserved),
            pct(e.nvidia_smi),
            t.step_ms.map_or("—".into(), |v| format!("{v:.1}")),
        )?;
        write_failure(t, out)?;
    }
    write_end(run, out)
}

/// A PyTorch trial's six memory cells (GiB): measured allocated, reserved and process bytes,
/// then the plan's allocated, reserved and nvidia-smi bytes.
fn measured_and_predicted(t: &vramlab_core::record::Trial) -> String {
    let p = t.predicted;
    format!(
        "{:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        gib(t.peak_allocated),
        gib(t.peak_reserved),
        gib(t.process_bytes),
        gib(p.map(|p| p.allocated)),
        gib(p.map(|p| p.reserved)),
        gib(p.map(|p| p.nvidia_smi)),
    )
}

/// Under a trial that ran out of memory or failed, the first line of why.
fn write_failure(t: &vramlab_core::record::Trial, out: &mut dyn Write) -> Result<()> {
    if let Outcome::Oom { message } | Outcome::Error { message } = &t.outcome {
        writeln!(out, "       {}", message.lines().next().unwrap_or(""))?;
    }
    Ok(())
}

/// The native engine replays the plan with real buffers: its allocated/reserved are the plan
/// itself, so the table shows what it checks (fits, device used vs predicted nvidia-smi,
/// step time, TFLOP/s).
fn write_native_trials(run: &Run, out: &mut dyn Write) -> Result<()> {
    writeln!(
        out,
        "native engine: the planned allocations replayed with real buffers (not a measurement \
         of PyTorch; --engine torch measures PyTorch)"
    )?;
    writeln!(
        out,
        "{:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>5}",
        "batch", "planned", "used", "pred.smi", "used/pred", "step ms", "TFLOP/s", "freed"
    )?;
    writeln!(out, "{:>6} {:>10} {:>19}", "", "memory", "device (GiB)")?;
    for t in &run.trials {
        let used = t.process_bytes.or(t.device_used_peak);
        let pred = t.predicted.map(|p| p.nvidia_smi);
        let vs = match (used, pred) {
            (Some(u), Some(p)) if p.0 > 0 => Some(100.0 * (u.0 as f64 - p.0 as f64) / p.0 as f64),
            _ => None,
        };
        let planned = match t.outcome {
            Outcome::Ran => "fits",
            Outcome::Oom { .. } => "OOM",
            _ => t.outcome.label(),
        };
        writeln!(
            out,
            "{:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>5}",
            t.batch,
            planned,
            gib(used),
            gib(pred),
            pct(vs),
            t.step_ms.map_or("—".into(), |v| format!("{v:.2}")),
            t.tflops.map_or("—".into(), |v| format!("{v:.1}")),
            freed(t)
        )?;
        write_failure(t, out)?;
    }
    Ok(())
}

fn freed(t: &vramlab_core::record::Trial) -> &'static str {
    match t.memory_returned(Bytes(8 << 20)) {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "—",
    }
}

/// The PyTorch engine measures PyTorch: measured next to predicted, with the errors.
fn write_torch_trials(run: &Run, out: &mut dyn Write) -> Result<()> {
    writeln!(
        out,
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>5}",
        "batch",
        "outcome",
        "alloc",
        "reserved",
        "process",
        "pred.all",
        "pred.res",
        "pred.smi",
        "err.res",
        "err.smi",
        "step ms",
        "TFLOP/s",
        "freed"
    )?;
    writeln!(
        out,
        "{:>6} {:>9} {:>29} {:>29}",
        "", "", "measured (GiB)", "predicted (GiB)"
    )?;
    for t in &run.trials {
        let e = t.errors_pct();
        let freed = freed(t);
        writeln!(
            out,
            "{:>6} {:>9} {} {:>8} {:>8} {:>9} {:>8} {:>5}",
            t.batch,
            t.outcome.label(),
            measured_and_predicted(t),
            pct(e.reserved),
            pct(e.nvidia_smi),
            t.step_ms.map_or("—".into(), |v| format!("{v:.2}")),
            t.tflops.map_or("—".into(), |v| format!("{v:.1}")),
            freed
        )?;
        write_failure(t, out)?;
        write_ranks(t, out)?;
    }
    Ok(())
}

/// One line per rank of a multi-GPU trial, and the max over the ranks.
fn write_ranks(t: &vramlab_core::record::Trial, out: &mut dyn Write) -> Result<()> {
    for r in &t.ranks {
        writeln!(
            out,
            "       rank {:>3}: alloc {} GiB, reserved {} GiB, nvml {} GiB{}",
            r.rank,
            gib(r.peak_allocated),
            gib(r.peak_reserved),
            gib(r.nvml_used),
            if r.oom { " (OOM)" } else { "" }
        )?;
    }
    if t.ranks.len() > 1 {
        writeln!(
            out,
            "       max over {} ranks: alloc {} GiB, reserved {} GiB",
            t.ranks.len(),
            gib(t.max_rank_allocated()),
            gib(t.max_rank_reserved())
        )?;
    }
    Ok(())
}

pub fn cmd_gpus(json: bool, out: &mut dyn Write) -> Result<()> {
    let gpus = vramlab_device::gpu::detect_all().context("listing GPUs")?;
    if json {
        writeln!(out, "{}", serde_json::to_string(&gpus)?)?;
        return Ok(());
    }
    if gpus.is_empty() {
        bail!("NVML sees no GPU");
    }
    for g in &gpus {
        writeln!(
            out,
            "{}: {} — {} total, {} used, {} free",
            g.index,
            g.name,
            g.total,
            g.used(),
            g.free
        )?;
    }
    Ok(())
}

pub fn cmd_profile(device: usize, json: bool, out: &mut dyn Write) -> Result<()> {
    let p = vramlab_device::bench::profile::measure(device, &mut |what| {
        if !json {
            eprintln!("[profile] {what}");
        }
    })?;
    let saved = vramlab_device::bench::profile::save(&p);
    if json {
        let mut v = serde_json::to_value(&p)?;
        v["saved_to"] = serde_json::json!(saved.as_ref().ok().map(|p| p.display().to_string()));
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{} ({})", p.device, p.total_bytes)?;
        writeln!(
            out,
            "  GEMM TFLOP/s  fp32 {:.1}  tf32 {:.1}  fp16 {:.1}  bf16 {:.1}",
            p.fp32_tflops, p.tf32_tflops, p.fp16_tflops, p.bf16_tflops
        )?;
        writeln!(
            out,
            "  bandwidth     device-to-device {:.0} GB/s, host-to-device {:.1} GB/s",
            p.d2d_gbps, p.h2d_gbps
        )?;
        writeln!(out, "  usable memory {}", p.usable_bytes)?;
        match &saved {
            Ok(path) => writeln!(out, "  saved to {}", path.display())?,
            Err(e) => writeln!(out, "  not saved: {e:#}")?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use vramlab_core::plan::inference::quant::Int8Outliers;
    use vramlab_device::bench::infer::config_line;

    const QWEN: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/hf_configs/Qwen2.5-0.5B.json"
    );

    /// `vramlab bench ARGS` as clap parses it.
    fn bench_args(args: &[&str]) -> BenchArgs {
        use clap::Parser;
        let argv = ["vramlab", "bench"].iter().chain(args.iter()).copied();
        match crate::cli::Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Some(crate::cli::Command::Bench(a))) => a,
            other => panic!("not a bench command: {other:?}"),
        }
    }

    /// The runner's config line of `bench ARGS` at `batch`, and the planner behind it.
    fn runner_line(args: &[&str], batch: u64) -> (Value, InferBench) {
        let a = bench_args(args);
        let (preset, planner, hf_config) =
            super::super::infer::bench_planner(&a.train).expect("planner");
        let bench = InferBench { planner, hf_config };
        let line = config_line(&preset, &bench, batch).expect("config line");
        (serde_json::from_str(&line).expect("json"), bench)
    }

    /// The inference flags reach the runner as the planner plans them: the call, the cache,
    /// the dtype, the attention, the decoding, the config.json given (its EOS token too).
    #[test]
    fn inference_flags_become_the_runner_config() {
        let (v, bench) = runner_line(
            &[
                "--engine",
                "torch",
                "--model",
                QWEN,
                "--step",
                "generate",
                "--seq",
                "256",
                "--new-tokens",
                "16",
                "--kv-cache",
                "static",
                "--precision",
                "fp16",
                "--attention",
                "eager",
                "--do-sample",
                "--top-k",
                "20",
                "--batch",
                "1,4",
            ],
            4,
        );
        assert_eq!(v["step"], "generate");
        assert_eq!(v["batch"], 4);
        assert_eq!(v["prompt"], 256);
        assert_eq!(v["new_tokens"], 16);
        assert_eq!(v["kv_cache"], "static");
        assert_eq!(v["precision"], "fp16");
        assert_eq!(v["attention"], "eager");
        assert_eq!(v["do_sample"], true);
        assert_eq!(v["top_k"], 20);
        assert_eq!(v["hf_config"]["model_type"], "qwen2");
        assert_eq!(v["hf_config"]["eos_token_id"], 151643);
        assert!(
            v.get("quant").is_none() && v.get("device_map").is_none(),
            "{v}"
        );
        assert_eq!(bench.planner.config.prompt, 256);

        // a prefill takes neither new tokens nor a cache; LLM.int8 weights are planned with
        // the outlier columns of the runner's random-init weights
        let (v, bench) = runner_line(
            &[
                "--engine", "torch", "--model", QWEN, "--step", "prefill", "--seq", "128",
                "--quant", "int8", "--batch", "2",
            ],
            2,
        );
        assert_eq!(v["step"], "prefill");
        assert!(
            v.get("new_tokens").is_none() && v.get("kv_cache").is_none(),
            "{v}"
        );
        assert_eq!(v["quant"], "int8");
        assert!(v.get("double_quant").is_none());
        let q = bench.planner.quant.as_ref().expect("quantized");
        assert!(matches!(q.outliers, Int8Outliers::RandomInit { .. }));

        // accelerate's budget in bytes; a built-in preset sends no config.json
        let (v, _) = runner_line(
            &[
                "--engine",
                "torch",
                "--model",
                "TinyLlama-1.1B",
                "--step",
                "generate",
                "--seq",
                "64",
                "--new-tokens",
                "4",
                "--device-map",
                "auto",
                "--max-gpu-memory",
                "1GiB",
                "--max-cpu-memory",
                "8GiB",
                "--batch",
                "1",
            ],
            1,
        );
        assert_eq!(v["device_map"], "auto");
        assert_eq!(v["max_gpu_memory"], 1u64 << 30);
        assert_eq!(v["max_cpu_memory"], 8u64 << 30);
        assert_eq!(v["model"]["id"], "TinyLlama-1.1B");
        assert!(v.get("hf_config").is_none(), "{v}");
    }

    /// An inference run's table: the call, measured beside the inference plan with the
    /// errors of allocated, reserved and the process; no training columns.
    #[test]
    fn an_inference_run_prints_measured_against_the_inference_plan() {
        use vramlab_core::record::{InferRun, Predicted, Trial};
        let (_, bench) = runner_line(
            &[
                "--engine",
                "torch",
                "--model",
                QWEN,
                "--step",
                "generate",
                "--seq",
                "128",
                "--new-tokens",
                "8",
                "--batch",
                "1",
            ],
            1,
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/bench/gpt2-torch.json");
        let bytes = std::fs::read(path).expect("saved run");
        let mut run = vramlab_core::export::results::run_from_json(&bytes).expect("run");
        run.model = "Qwen2.5-0.5B".into();
        run.inference = Some(Box::new(InferRun::of(&bench.planner)));
        let p = bench.planner.peaks(2).expect("peaks");
        let mut t = Trial::failed(0, 2, Outcome::Ran);
        t.peak_allocated = Some(Bytes(p.allocated.0 * 100 / 98));
        t.peak_reserved = Some(p.reserved);
        t.process_bytes = Some(p.nvidia_smi);
        t.step_ms = Some(321.0);
        t.predicted = Some(Predicted::from(p));
        run.trials = vec![t];
        run.stopped = None;
        let mut out = Vec::new();
        write_run(&run, &mut out).expect("table");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.contains("Qwen2.5-0.5B · generate · prompt 128 + 8 new · bf16 · sdpa"),
            "{text}"
        );
        assert!(
            text.contains("err.all") && text.contains("err.smi"),
            "{text}"
        );
        assert!(text.contains("-2.0%") && text.contains("+0.0%"), "{text}");
        assert!(text.contains("fresh infer_runner.py process"), "{text}");
        assert!(
            !text.contains("TFLOP/s") && !text.contains("freed"),
            "{text}"
        );
        assert!(text.contains("largest batch that ran: 2"), "{text}");
    }

    fn table_of(file: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let bytes = std::fs::read(&path).expect("saved run");
        let run = vramlab_core::export::results::run_from_json(&bytes).expect("run");
        let mut out = Vec::new();
        write_run(&run, &mut out).expect("table");
        String::from_utf8(out).expect("utf-8")
    }

    /// The native table shows what the engine checks; the PyTorch one compares.
    #[test]
    fn each_engine_table_shows_what_it_measures() {
        let native = table_of("tests/data/bench/gpt2-native.json");
        assert!(native.contains("not a measurement of PyTorch"), "{native}");
        assert!(
            native.contains("used/pred") && native.contains("planned"),
            "{native}"
        );
        assert!(!native.contains("err.res"), "{native}");
        assert!(native.lines().any(|l| l.contains(" fits ")), "{native}");
        let torch = table_of("tests/data/bench/gpt2-torch.json");
        assert!(
            torch.contains("err.res") && torch.contains("pred.all"),
            "{torch}"
        );
        assert!(!torch.contains("used/pred"), "{torch}");
        assert!(!torch.contains("rank"), "{torch}");
    }

    /// A multi-GPU run says its world, how it ran, and every rank.
    #[test]
    fn a_distributed_run_prints_the_world_and_every_rank() {
        use vramlab_core::plan::distributed::{Distributed, Strategy};
        use vramlab_core::record::{RankPeak, WorldMode, WorldRun};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/bench/gpt2-torch.json");
        let bytes = std::fs::read(path).expect("saved run");
        let mut run = vramlab_core::export::results::run_from_json(&bytes).expect("run");
        run.config.distributed = Distributed::new(2, Strategy::Fsdp2);
        run.trials.truncate(1);
        let t = &mut run.trials[0];
        t.world = Some(WorldRun {
            mode: WorldMode::Torchrun,
            size: 2,
            strategy: "fsdp2".into(),
        });
        t.ranks = (0..2)
            .map(|rank| RankPeak {
                rank,
                peak_allocated: Some(Bytes((u64::from(rank) + 1) << 30)),
                peak_reserved: Some(Bytes(3 << 30)),
                nvml_used: None,
                oom: false,
            })
            .collect();
        let mut out = Vec::new();
        write_run(&run, &mut out).expect("table");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.contains("world 2 · strategy fsdp2 · world 2 · fsdp2 · torchrun: 2 processes"),
            "{text}"
        );
        assert!(text.contains("rank   0: alloc 1.00 GiB"), "{text}");
        assert!(text.contains("rank   1: alloc 2.00 GiB"), "{text}");
        assert!(text.contains("max over 2 ranks: alloc 2.00 GiB"), "{text}");
    }
}
