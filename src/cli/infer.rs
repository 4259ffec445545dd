//! `vramlab plan --step generate|prefill`, `vramlab max-batch --step generate` and
//! `vramlab export --step generate|prefill --format transformers|vllm`: the inference planner
//! (`vramlab_core::plan::inference`) behind the shared flags.

use std::io::Write;

use anyhow::{Context, Result, bail};

use vramlab_core::answer::vllm::VllmArgs;
use vramlab_core::export::inference_exports::{
    InferExport, InferFormat, ModelRef, transformers_script, vllm_command, vllm_serve,
};
use vramlab_core::model::Preset;
use vramlab_core::plan::config::{AllocatorConfig, Attention};
use vramlab_core::plan::finetune_mode::Quant;
use vramlab_core::plan::inference::decoding::DEFAULT_TOP_K;
use vramlab_core::plan::inference::device_map::MaxMemory;
use vramlab_core::plan::inference::quant::{self, DEFAULT_INITIALIZER_RANGE, Int8Outliers};
use vramlab_core::plan::inference::setting::dtype_name;
use vramlab_core::plan::inference::{
    Decoding, InferConfig, InferPlan, InferPlanner, InferStep, KvCache,
};
use vramlab_core::plan::policy::QuantStorage;
use vramlab_core::plan::search::Budget;
use vramlab_core::plan::{DEFAULT_CUDA_CONTEXT, PlanError};
use vramlab_core::units::Bytes;
use vramlab_words::max_memory_bytes;
use vramlab_words::parse_dtype;

use super::args::{TrainArgs, load_model};

/// Whether `--step` names an inference call.
pub fn is_inference(t: &TrainArgs) -> bool {
    t.step
        .as_deref()
        .is_some_and(|s| vramlab_words::parse::<InferStep>(s).is_ok())
}

/// `--device-map auto --max-gpu-memory SIZE [--max-cpu-memory SIZE]` as accelerate's
/// `max_memory`, or `None` without --device-map; the other combinations refused.
pub(super) fn device_map_budget(t: &TrainArgs) -> Result<Option<MaxMemory>> {
    let Some(map) = t.device_map.as_deref() else {
        if t.max_gpu_memory.is_some() || t.max_cpu_memory.is_some() {
            bail!(
                "--max-gpu-memory / --max-cpu-memory: accelerate's max_memory, planned with \
                 --device-map auto"
            );
        }
        return Ok(None);
    };
    if map.trim() != "auto" {
        bail!(
            "--device-map {map}: only `auto` is planned (one GPU; balanced, balanced_low_0, \
             sequential and explicit maps are not modelled)"
        );
    }
    let gpu = t.max_gpu_memory.as_deref().context(
        "--device-map auto: give --max-gpu-memory SIZE (max_memory[0], e.g. 10GiB); the \
         free-memory default of from_pretrained is not planned",
    )?;
    let gpu = max_memory_bytes(gpu).context("--max-gpu-memory")?;
    let cpu = match t.max_cpu_memory.as_deref() {
        Some(c) => Some(max_memory_bytes(c).context("--max-cpu-memory")?),
        None => None,
    };
    Ok(Some(MaxMemory { gpu, cpu }))
}

/// `--fp32-cpu-offload`: `BitsAndBytesConfig(llm_int8_enable_fp32_cpu_offload=True)`, a
/// setting of quantized weights under `--device-map auto` (refused otherwise).
pub(super) fn fp32_cpu_offload(t: &TrainArgs) -> Result<bool> {
    if t.fp32_cpu_offload && (t.quant.is_none() || t.device_map.is_none()) {
        bail!(
            "--fp32-cpu-offload: BitsAndBytesConfig's llm_int8_enable_fp32_cpu_offload, a setting \
             of bitsandbytes weights placed by accelerate; give --quant nf4|fp4|int8 and \
             --device-map auto --max-gpu-memory SIZE"
        );
    }
    Ok(t.fp32_cpu_offload)
}

/// A core error as the flag that sets its field: transformers' refusal of an offloading
/// map without `llm_int8_enable_fp32_cpu_offload` names `--fp32-cpu-offload`, the refusal of
/// 4-bit weights with offloaded modules `--quant`.
pub(super) fn flag_error(e: PlanError) -> anyhow::Error {
    match e {
        PlanError::Field {
            field: "llm_int8_enable_fp32_cpu_offload",
            reason,
        } => anyhow::anyhow!(
            "--fp32-cpu-offload: add it (llm_int8_enable_fp32_cpu_offload=True) or give a \
             larger --max-gpu-memory; with --quant and --device-map auto, {reason}"
        ),
        // 4-bit weights with offloaded modules (measured to fail at the first forward)
        PlanError::Field {
            field: "quant",
            reason,
        } => anyhow::anyhow!("--quant {reason}"),
        other => other.into(),
    }
}

/// [`InferPlanner::with_device_map_quant`] of the flags, `outliers` planned for LLM.int8.
fn device_map_planner(
    t: &TrainArgs,
    preset: &Preset,
    cfg: &InferConfig,
    dec: &Decoding,
    quant: Option<QuantStorage>,
    budget: MaxMemory,
    outliers: Int8Outliers,
) -> Result<InferPlanner> {
    let offload = fp32_cpu_offload(t)?;
    Ok(
        InferPlanner::with_device_map_quant(preset, cfg, dec, budget, quant, offload)
            .map_err(flag_error)?
            .with_int8_outliers(outliers),
    )
}

/// Refuses the flags inference does not take, naming them.
fn refuse_training_flags(t: &TrainArgs) -> Result<()> {
    device_map_budget(t)?;
    fp32_cpu_offload(t)?;
    if t.config.is_some() {
        bail!("--config: saved plans hold training steps; give --model for inference");
    }
    let training: [(&str, bool); 14] = [
        ("--optimizer", t.optimizer.is_some()),
        ("--accum", t.accum != 1),
        (
            "--checkpointing",
            t.checkpointing || t.checkpointing_reentrant,
        ),
        ("--loop", t.loop_shape.is_some()),
        ("--finetune", t.finetune.is_some()),
        ("--lora-rank", t.lora_rank.is_some()),
        ("--lora-targets", t.lora_targets.is_some()),
        ("--lora-dropout", t.lora_dropout.is_some()),
        ("--lora-merged", t.lora_merged),
        ("--freeze-embeddings", t.freeze_embeddings),
        ("--freeze-blocks", t.freeze_blocks.is_some()),
        ("--target-seq", t.target_seq.is_some()),
        ("--image", t.image.is_some()),
        ("--moe-imbalance", t.moe_imbalance.is_some()),
    ];
    if let Some((flag, _)) = training.iter().find(|(_, given)| *given) {
        bail!("{flag}: a training setting; inference (--step prefill|generate) takes none");
    }
    if t.dist.gpus.is_some() || t.dist.strategy.is_some() {
        bail!("--gpus / --strategy: inference on more than one GPU is not modelled yet");
    }
    Ok(())
}

/// The bitsandbytes quantization of the weights from `--quant` / `--no-double-quant`
/// (`BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=…,
/// bnb_4bit_use_double_quant=…, bnb_4bit_compute_dtype=dtype)` or `load_in_8bit=True`).
fn weight_quant(t: &TrainArgs) -> Result<Option<QuantStorage>> {
    let Some(word) = &t.quant else {
        if t.no_double_quant {
            bail!("--no-double-quant: a setting of 4-bit weights; give --quant nf4");
        }
        return Ok(None);
    };
    let quant: Quant = vramlab_words::parse(word).context("--quant")?;
    if !quant.is_4bit() && t.no_double_quant {
        bail!(
            "--no-double-quant: double quantization is a 4-bit setting; LLM.int8 (--quant int8) has none"
        );
    }
    Ok(Some(QuantStorage {
        quant,
        double_quant: quant.is_4bit() && !t.no_double_quant,
    }))
}

/// The decoding flags (`--do-sample`, `--temperature`, `--top-k`, `--top-p`, `--num-beams`)
/// given with a step that is not `generate`, named.
fn decoding_flag(t: &TrainArgs) -> Option<&'static str> {
    [
        ("--do-sample", t.do_sample),
        ("--temperature", t.temperature.is_some()),
        ("--top-k", t.top_k.is_some()),
        ("--top-p", t.top_p.is_some()),
        ("--num-beams", t.num_beams.is_some()),
    ]
    .iter()
    .find(|(_, given)| *given)
    .map(|(flag, _)| *flag)
}

/// Refuses the decoding flags on a training step (they are `generate` settings), and the
/// device map's (inference settings).
pub fn refuse_decoding_flags(t: &TrainArgs) -> Result<()> {
    if let Some(flag) = decoding_flag(t) {
        bail!("{flag}: a model.generate() setting; it needs --step generate");
    }
    if t.device_map.is_some() || t.max_gpu_memory.is_some() || t.max_cpu_memory.is_some() {
        bail!(
            "--device-map / --max-gpu-memory / --max-cpu-memory: accelerate's offload of an \
             inference model; it needs --step generate|prefill"
        );
    }
    if t.int8_outliers.is_some() {
        bail!("--int8-outliers: an inference setting (--step prefill|generate --quant int8)");
    }
    if t.fp32_cpu_offload {
        bail!(
            "--fp32-cpu-offload: an inference setting (--step prefill|generate --quant ... \
             --device-map auto)"
        );
    }
    Ok(())
}

/// `--int8-outliers`: LLM.int8's outlier columns of the checkpoint (`none` unless given).
pub(super) fn int8_outliers(t: &TrainArgs, quant: Option<QuantStorage>) -> Result<Int8Outliers> {
    let Some(word) = &t.int8_outliers else {
        return Ok(Int8Outliers::None);
    };
    if quant.is_none_or(|q| q.quant.is_4bit()) {
        bail!("--int8-outliers: a setting of LLM.int8 weights; give --quant int8");
    }
    match word.trim().to_ascii_lowercase().as_str() {
        "none" => Ok(Int8Outliers::None),
        "random-init" | "random" => Ok(Int8Outliers::RandomInit {
            std: DEFAULT_INITIALIZER_RANGE,
        }),
        other => bail!("--int8-outliers: unknown `{other}` (known: none, random-init)"),
    }
}

/// The decoding of `model.generate()` from the flags; transformers' defaults for what is
/// not given.
fn decoding(t: &TrainArgs, step: InferStep) -> Result<Decoding> {
    if step == InferStep::Prefill
        && let Some(flag) = decoding_flag(t)
    {
        bail!("{flag}: a prefill picks no token; decoding settings need --step generate");
    }
    if !t.do_sample
        && let Some(flag) = [
            ("--temperature", t.temperature.is_some()),
            ("--top-k", t.top_k.is_some()),
            ("--top-p", t.top_p.is_some()),
        ]
        .iter()
        .find(|(_, given)| *given)
        .map(|(flag, _)| *flag)
    {
        bail!(
            "{flag}: a sampling setting (transformers ignores it in greedy decoding); add --do-sample"
        );
    }
    let d = Decoding {
        do_sample: t.do_sample,
        temperature: t.temperature.unwrap_or(1.0),
        top_k: t.top_k.unwrap_or(DEFAULT_TOP_K),
        top_p: t.top_p.unwrap_or(1.0),
        num_beams: t.num_beams.unwrap_or(1),
    };
    d.validate()?;
    Ok(d)
}

/// The inference config from the flags (`batch` sequences).
fn config(t: &TrainArgs, step: InferStep, batch: u64) -> Result<InferConfig> {
    refuse_training_flags(t)?;
    let prompt = t
        .seq
        .context("--seq: the prompt length in tokens is required for --step prefill|generate")?;
    let new_tokens = match step {
        InferStep::Generate => t
            .new_tokens
            .context("--new-tokens: required for --step generate (max_new_tokens, at least 1)")?,
        InferStep::Prefill => {
            if t.new_tokens.is_some_and(|n| n > 0) {
                bail!("--new-tokens: a prefill generates nothing; use --step generate");
            }
            0
        }
    };
    if step == InferStep::Prefill && t.kv_cache.is_some() {
        bail!(
            "--kv-cache: a plain forward builds its own DynamicCache; the cache is a generate \
             setting (--step generate)"
        );
    }
    let kv_cache = match &t.kv_cache {
        Some(k) => vramlab_words::parse(k).context("--kv-cache")?,
        None => KvCache::Dynamic,
    };
    let dtype = parse_dtype(t.precision.as_deref().unwrap_or("bf16")).context("--precision")?;
    let attention = match t.attention.trim().to_ascii_lowercase().as_str() {
        "sdpa" => Attention::Sdpa,
        "eager" => Attention::Eager,
        other => bail!("--attention: unknown `{other}` (known: eager, sdpa)"),
    };
    let cfg = InferConfig {
        step,
        batch,
        prompt,
        new_tokens,
        dtype,
        attention,
        kv_cache,
        allocator: AllocatorConfig {
            expandable_segments: t.expandable_segments,
            max_split_size_mb: t.max_split_size_mb,
        },
    };
    cfg.validate()?;
    Ok(cfg)
}

/// The model, call and weight quantization from the flags.
pub(super) fn resolve_quant(
    t: &TrainArgs,
    batch: u64,
) -> Result<(Preset, InferConfig, Decoding, Option<QuantStorage>)> {
    let (preset, cfg, dec, quant, _) = resolve_with_source(t, batch)?;
    Ok((preset, cfg, dec, quant))
}

/// [`resolve_quant`] with where the weights are, as the exports name them: the Hub
/// repository (and pinned revision) of `--model ORG/NAME[@REV]`, the folder given, the Hub
/// id of a built-in preset, else unknown (a preset or config.json file).
fn resolve_with_source(
    t: &TrainArgs,
    batch: u64,
) -> Result<(
    Preset,
    InferConfig,
    Decoding,
    Option<QuantStorage>,
    ModelRef,
)> {
    let step: InferStep = vramlab_words::parse(t.step.as_deref().unwrap_or("generate"))?;
    let name = t.model.as_deref().context("--model is required")?;
    let mut model = ModelRef::Unknown;
    let preset = if super::args::is_hub_source(name) {
        // A Hub id or a model folder: a checkpoint stored quantized would be loaded as
        // stored, which the inference plan does not model yet — refused, not planned in
        // the --precision dtype.
        let s = super::model_source::load(name)?;
        if let Some(q) = &s.prequantized {
            bail!(
                "--model {name}: the checkpoint is stored quantized ({q}); loading a \
                 pre-quantized checkpoint for inference is not modelled yet: plan the \
                 unquantized model's config.json with --quant"
            );
        }
        let folder = name.trim();
        model = if std::path::Path::new(folder).is_dir() {
            ModelRef::Path(folder.to_string())
        } else if let Some(repo) = s.hub_repo {
            ModelRef::Hub {
                repo,
                revision: folder
                    .split_once('@')
                    .map(|(_, r)| r.to_string())
                    .filter(|r| !r.is_empty()),
            }
        } else {
            ModelRef::Unknown
        };
        s.preset
    } else {
        let preset = load_model(name)?;
        // only a built-in preset named by its id names a Hub id (a preset file may reuse an id
        // for other weights)
        if vramlab_words::vocabulary::model_id(name).is_ok()
            && let Some(id) = preset.hub_id()
        {
            model = ModelRef::Hub {
                repo: id.to_string(),
                revision: None,
            };
        }
        preset
    };
    let cfg = config(t, step, batch)?;
    let dec = decoding(t, step)?;
    let quant = weight_quant(t)?;
    Ok((preset, cfg, dec, quant, model))
}

/// `export --step generate|prefill --format transformers|vllm`: the text of the export
/// (`gpu_memory_utilization`: vLLM's, `--format vllm` only).
pub fn export_text(
    t: &TrainArgs,
    batch: Option<u64>,
    format: InferFormat,
    gpu_memory_utilization: Option<f64>,
) -> Result<String> {
    let (preset, cfg, dec, quant, model) = resolve_with_source(t, batch.unwrap_or(1))?;
    let max_memory = device_map_budget(t)?;
    let e = InferExport {
        model: &model,
        config: &cfg,
        decoding: &dec,
        quant,
        max_memory,
        fp32_cpu_offload: fp32_cpu_offload(t)?,
    };
    match format {
        InferFormat::Transformers => {
            if gpu_memory_utilization.is_some() {
                bail!("--gpu-memory-utilization: a vLLM setting; it needs --format vllm");
            }
            let plan = planner(t, &preset, &cfg, &dec, quant)?.plan(cfg.batch)?;
            Ok(transformers_script(&e, &plan))
        }
        InferFormat::Vllm => {
            if max_memory.is_some() {
                bail!(
                    "--device-map: accelerate's offload is transformers'; vLLM keeps every \
                     weight on the GPU (--format vllm takes no --device-map)"
                );
            }
            if let Some(flag) = decoding_flag(t) {
                bail!(
                    "{flag}: vLLM takes the decoding settings per request (SamplingParams), not \
                     on its command line; leave it out with --format vllm"
                );
            }
            if t.int8_outliers.is_some() {
                bail!("--int8-outliers: an LLM.int8 setting; --format vllm takes --quant nf4 only");
            }
            let (gpu, _) = t.budget()?;
            let serve = vllm_serve(
                &preset,
                &cfg,
                quant,
                gpu.memory(),
                DEFAULT_CUDA_CONTEXT,
                gpu_memory_utilization.unwrap_or(VllmArgs::default().gpu_memory_utilization),
            )
            .map_err(|e| match e {
                // the core's field as the flag that sets it
                PlanError::Field { field, reason } => {
                    let flag = match field {
                        "max_model_len" => "--seq / --new-tokens",
                        "step" => "--step",
                        "kv_cache" => "--kv-cache",
                        "attention" => "--attention",
                        "quant" => "--quant",
                        "gpu_memory_utilization" => "--gpu-memory-utilization",
                        other => other,
                    };
                    anyhow::anyhow!("{flag} (--format vllm): {reason}")
                }
                other => anyhow::anyhow!("--format vllm: {other}"),
            })?;
            Ok(vllm_command(&e, &serve, &gpu.name))
        }
    }
}

/// Flags the user left out and the values planned.
fn assumed(t: &TrainArgs, batch_given: bool) -> Vec<(&'static str, &'static str)> {
    let mut a = Vec::new();
    if !batch_given {
        a.push(("--batch", "1"));
    }
    if t.precision.is_none() {
        a.push(("--precision", "bf16"));
    }
    if t.gpu.is_none() {
        a.push(("--gpu", super::args::DEFAULT_GPU));
    }
    a
}

/// `plan --step prefill|generate`.
/// The planner of the flags: with `--device-map auto`, the model offloaded as accelerate
/// places it.
fn planner(
    t: &TrainArgs,
    preset: &Preset,
    cfg: &InferConfig,
    dec: &Decoding,
    quant: Option<QuantStorage>,
) -> Result<InferPlanner> {
    Ok(match device_map_budget(t)? {
        Some(m) => device_map_planner(t, preset, cfg, dec, quant, m, int8_outliers(t, quant)?)?,
        None => InferPlanner::with_quant(preset, cfg, dec, quant)?
            .with_int8_outliers(int8_outliers(t, quant)?),
    })
}

/// What `bench --step generate|prefill` measures: the model, the inference planner of the
/// flags (built once; it predicts every trial) and, when `--model` is a config.json file or
/// a folder holding one, that file's object (the runner builds the model from it as the lab
/// did). The runner's weights are random, so LLM.int8 (`--quant int8`) is planned with the
/// outlier columns of random-init weights unless `--int8-outliers` says otherwise.
#[cfg(feature = "app")]
pub(super) fn bench_planner(
    t: &TrainArgs,
) -> Result<(Preset, InferPlanner, Option<serde_json::Value>)> {
    let (preset, cfg, dec, quant) = resolve_quant(t, 1)?;
    let outliers = match (&t.int8_outliers, quant) {
        (None, Some(q)) if !q.quant.is_4bit() => Int8Outliers::RandomInit {
            std: DEFAULT_INITIALIZER_RANGE,
        },
        _ => int8_outliers(t, quant)?,
    };
    let planner = match device_map_budget(t)? {
        Some(m) => device_map_planner(t, &preset, &cfg, &dec, quant, m, outliers)?,
        None => InferPlanner::with_quant(&preset, &cfg, &dec, quant)?.with_int8_outliers(outliers),
    };
    Ok((preset, planner, config_json(t)?))
}

/// The config.json object `--model` names (a file with `model_type`, or a folder's
/// config.json), `None` for a preset or a Hub id.
#[cfg(feature = "app")]
fn config_json(t: &TrainArgs) -> Result<Option<serde_json::Value>> {
    let Some(name) = t.model.as_deref() else {
        return Ok(None);
    };
    let path = std::path::Path::new(name.trim());
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if !file.is_file() {
        return Ok(None);
    }
    let text =
        vramlab_core::fsutil::read_bounded_string(&file, vramlab_core::fsutil::FileKind::Model)
            .with_context(|| format!("--model: reading {}", file.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--model: {} is not JSON", file.display()))?;
    Ok((v.get("model_type").is_some() && v.get("family").is_none()).then_some(v))
}

pub fn cmd_plan(t: &TrainArgs, batch: Option<u64>, out: &mut dyn Write) -> Result<()> {
    let (preset, cfg, dec, quant) = resolve_quant(t, batch.unwrap_or(1))?;
    let (gpu, budget) = t.budget()?;
    let planner = planner(t, &preset, &cfg, &dec, quant)?;
    let plan = planner.plan(cfg.batch)?;
    let fits = vramlab_core::answer::inference::fits(&planner, &plan, budget)?;
    let freeing = vramlab_core::answer::inference::fits_only_by_freeing_cache(&plan, budget, fits);
    let assumed = assumed(t, batch.is_some());
    if t.json {
        let v = vramlab_core::answer::inference_json::plan(
            &plan, &gpu, budget, fits, freeing, &assumed,
        )?;
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
        return Ok(());
    }
    write_plan(out, &plan, &gpu.name, budget, fits)?;
    if freeing {
        writeln!(
            out,
            "  ({}{})",
            super::plan_text::RUNS_BY_FREEING_CACHE,
            super::plan_text::RETRIES_COUNTED
        )?;
    }
    if !assumed.is_empty() {
        let list: Vec<String> = assumed.iter().map(|(f, v)| format!("{f} {v}")).collect();
        writeln!(out, "  assumed (not given): {}", list.join(", "))?;
    }
    Ok(())
}

fn write_plan(
    out: &mut dyn Write,
    p: &InferPlan,
    gpu: &str,
    budget: Budget,
    fits: bool,
) -> Result<()> {
    let c = &p.config;
    writeln!(
        out,
        "{} ({}, {} params) — {}",
        p.model,
        p.model_type,
        p.params,
        c.step.describe()
    )?;
    let tokens = match c.step {
        InferStep::Generate => format!(
            "prompt {} + {} new tokens, {} KV cache",
            c.prompt,
            c.new_tokens,
            c.kv_cache.as_str()
        ),
        InferStep::Prefill => format!("prompt {} tokens", c.prompt),
    };
    writeln!(
        out,
        "  batch {}, {tokens}, {} weights, {} attention",
        c.batch,
        dtype_name(c.dtype),
        c.attention.as_str()
    )?;
    if let Some(d) = &p.decoding {
        writeln!(out, "  decoding: {}", d.describe())?;
    }
    if let Some(q) = p.quant {
        writeln!(
            out,
            "  quantized linears: {}; lm_head, embeddings and norms in {}",
            quant::describe(q),
            dtype_name(c.dtype)
        )?;
    }
    match &p.device_map {
        Some(pl) => {
            let o = &pl.offload;
            writeln!(out, "  device_map: {}", pl.summary())?;
            if let Some(q) = &o.quantizer {
                writeln!(
                    out,
                    "  placed against max_memory × 0.90 (bitsandbytes' adjust_max_memory): 0: {}; \
                     offloaded layers stay quantized, llm_int8_enable_fp32_cpu_offload={}",
                    Bytes(q.inferred_max_gpu_memory_bytes as u64),
                    if q.llm_int8_enable_fp32_cpu_offload {
                        "True"
                    } else {
                        "False"
                    }
                )?;
            }
            writeln!(
                out,
                "  weights on GPU 0 {:>12}   (cpu {}, disk {}; max_memory 0: {}, cpu: {})",
                p.weights_bytes,
                Bytes(o.cpu_bytes),
                Bytes(o.disk_bytes),
                Bytes(o.max_gpu_memory_bytes),
                o.max_cpu_memory_bytes
                    .map_or_else(|| "no limit".to_string(), |c| Bytes(c).to_string())
            )?;
        }
        None => writeln!(out, "  weights          {:>12}", p.weights_bytes)?,
    }
    writeln!(out, "  KV cache (peak)  {:>12}", p.kv_cache_bytes)?;
    writeln!(
        out,
        "  peak allocated   {:>12}   (at the {})",
        p.peak_allocated_bytes, p.peak_at
    )?;
    writeln!(out, "  peak reserved    {:>12}", p.peak_reserved_bytes)?;
    writeln!(
        out,
        "  nvidia-smi       {:>12}   (reserved + {} CUDA context)",
        p.nvidia_smi_bytes, p.cuda_context_bytes
    )?;
    let verdict = if fits { "fits" } else { "does NOT fit" };
    writeln!(
        out,
        "  on {gpu} ({} usable): {verdict} (largest batch: vramlab max-batch --step {})",
        budget.usable(),
        c.step
    )?;
    Ok(())
}

/// `max-batch --step generate|prefill`.
pub fn cmd_max_batch(t: &TrainArgs, out: &mut dyn Write) -> Result<()> {
    let (preset, cfg, dec, quant) = resolve_quant(t, 1)?;
    let (gpu, budget) = t.budget()?;
    let planner = planner(t, &preset, &cfg, &dec, quant)?;
    let max = vramlab_core::answer::inference::max_batch(&planner, budget)?;
    let at = match max {
        Some(m) => Some(planner.plan(m)?),
        None => None,
    };
    if t.json {
        let v = vramlab_core::answer::inference_json::max_batch(
            &preset.id,
            cfg.step,
            &gpu,
            budget,
            &planner,
            max,
            at.as_ref(),
            &dec,
            quant,
        )?;
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
        return Ok(());
    }
    if let Some(pl) = &planner.placement {
        writeln!(out, "device_map: {}", pl.summary())?;
    }
    match (max, at) {
        (Some(m), Some(p)) => writeln!(
            out,
            "{}: largest batch for {}{}{} on {} ({} usable): {m} ({} nvidia-smi, KV cache {})",
            preset.id,
            cfg.step,
            if dec.is_greedy() {
                String::new()
            } else {
                format!(" with {}", dec.describe())
            },
            quant.map_or(String::new(), |q| format!(
                " ({} weights)",
                quant::describe(q)
            )),
            gpu.name,
            budget.usable(),
            p.nvidia_smi_bytes,
            p.kv_cache_bytes
        )?,
        _ => writeln!(
            out,
            "{}: even batch 1 does not fit on {} ({} usable)",
            preset.id,
            gpu.name,
            Bytes(budget.usable().0)
        )?,
    }
    Ok(())
}
