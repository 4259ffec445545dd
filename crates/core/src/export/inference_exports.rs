//! Inference exports (issue 29): the planned call as a runnable transformers script
//! (`--format transformers`) and vLLM's `vllm serve` command line sized from
//! [`crate::plan::inference::vllm`] (`--format vllm`). Both take the typed inference settings
//! ([`InferConfig`], [`Decoding`], [`QuantStorage`], [`MaxMemory`]), never CLI words.
//!
//! The script mirrors what `lab/device/infer_runner.py` measured and the inference plan models:
//! `from_pretrained(MODEL, dtype=…, attn_implementation=…[, quantization_config=…]
//! [, device_map="auto", max_memory=…])`, `model.eval()`, random input ids of the planned
//! batch × prompt, one warm-up call, `torch.cuda.reset_peak_memory_stats()`, the measured call
//! (`model.generate(…, disable_compile=True)` or a forward under `torch.no_grad()`), then
//! `max_memory_allocated()` / `max_memory_reserved()` beside the planned figures. Without a GPU
//! it still runs (on the CPU, unquantized and not offloaded: bitsandbytes' kernels and
//! accelerate's GPU budget need CUDA) and says so.

use crate::model::Preset;
use crate::plan::PlanError;
use crate::plan::config::{Attention, DType};
use crate::plan::finetune_mode::Quant;
use crate::plan::inference::device_map::MaxMemory;
use crate::plan::inference::quant::describe as describe_quant;
use crate::plan::inference::setting::dtype_name;
use crate::plan::inference::vllm::{self, PLANNED_NOTE, VLLM_SOURCE, VllmArgs, VllmCapacity};
use crate::plan::inference::{Decoding, InferConfig, InferPlan, InferStep, KvCache};
use crate::plan::policy::QuantStorage;
use crate::units::Bytes;

use super::python::py_bool;

/// The inference export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InferFormat {
    /// A runnable transformers script of the planned call.
    Transformers,
    /// The `vllm serve` command line.
    Vllm,
}

impl InferFormat {
    pub const ALL: [InferFormat; 2] = [InferFormat::Transformers, InferFormat::Vllm];

    pub fn as_str(self) -> &'static str {
        match self {
            InferFormat::Transformers => "transformers",
            InferFormat::Vllm => "vllm",
        }
    }

    /// The names, for messages: `transformers, vllm`.
    pub fn choices() -> String {
        InferFormat::ALL.map(InferFormat::as_str).join(", ")
    }
}

/// The model an export loads: a Hub repository, a local folder, or unknown (a placeholder
/// the user sets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// `ORG/NAME`, with the revision the user pinned (`ORG/NAME@REV`).
    Hub {
        repo: String,
        revision: Option<String>,
    },
    /// A model folder the user gave.
    Path(String),
    /// vramlab does not know where the weights are (a preset file, a config.json, a custom
    /// preset): the export writes a placeholder and says to set it.
    Unknown,
}

/// The placeholder written for [`ModelRef::Unknown`].
pub const MODEL_PLACEHOLDER: &str = "your/model-id";

impl ModelRef {
    /// The name `from_pretrained` / `vllm serve` take.
    fn name(&self) -> &str {
        match self {
            ModelRef::Hub { repo, .. } => repo,
            ModelRef::Path(p) => p,
            ModelRef::Unknown => MODEL_PLACEHOLDER,
        }
    }

    fn revision(&self) -> Option<&str> {
        match self {
            ModelRef::Hub { revision, .. } => revision.as_deref(),
            _ => None,
        }
    }

    /// What the `MODEL` line's comment says.
    fn comment(&self) -> &'static str {
        match self {
            ModelRef::Hub { .. } => "the Hugging Face model this plan is for",
            ModelRef::Path(_) => "the model folder this plan is for",
            ModelRef::Unknown => {
                "SET THIS: the Hugging Face id or folder of the model (vramlab does not know \
                 where its weights are)"
            }
        }
    }
}

/// A Python string literal of `s` (JSON's escapes are Python's).
fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{}\"", s.escape_default()))
}

/// `s` as one shell word (single-quoted when it holds anything but `[A-Za-z0-9_./@:=+-]`).
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./@:=+-".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `torch.bfloat16` / `torch.float16` / `torch.float32`.
pub fn torch_dtype(d: DType) -> &'static str {
    match d {
        DType::BF16 => "torch.bfloat16",
        DType::F16 => "torch.float16",
        _ => "torch.float32",
    }
}

/// vLLM's `--dtype` word.
pub fn vllm_dtype(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

/// An accelerate size string that reads back as exactly `bytes`
/// (`convert_file_size_to_int`): whole GiB or MiB when it is one, else the integer.
pub fn accelerate_size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes > 0 && bytes.is_multiple_of(GIB) {
        format!("\"{}GiB\"", bytes / GIB)
    } else if bytes > 0 && bytes.is_multiple_of(MIB) {
        format!("\"{}MiB\"", bytes / MIB)
    } else {
        bytes.to_string()
    }
}

/// The `BitsAndBytesConfig(...)` of the planned weights (compute dtype: the plan's dtype;
/// `fp32_cpu_offload`: `llm_int8_enable_fp32_cpu_offload=True`, which transformers requires
/// once `device_map="auto"` puts a module on the CPU or disk).
fn bnb_config(q: QuantStorage, dtype: DType, fp32_cpu_offload: bool) -> String {
    let offload = if fp32_cpu_offload {
        ", llm_int8_enable_fp32_cpu_offload=True"
    } else {
        ""
    };
    match q.quant {
        Quant::Int8 => format!("BitsAndBytesConfig(load_in_8bit=True{offload})"),
        k => format!(
            "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"{}\", \
             bnb_4bit_use_double_quant={}, bnb_4bit_compute_dtype={}{offload})",
            k.as_str(),
            py_bool(q.double_quant),
            torch_dtype(dtype)
        ),
    }
}

/// `max_memory={0: …, "cpu": …}`. Without `--max-cpu-memory` the plan gives the CPU what
/// accelerate gives it when no `max_memory` is passed (`get_max_memory(None)`:
/// `psutil.virtual_memory().available`), written out: given a `max_memory` without a `"cpu"`
/// key, accelerate 1.15 places what GPU 0 cannot hold on the disk, and an LLM.int8 model
/// whose layers went there fails at its first forward (session 31, `lab/device/session31c.sh`:
/// bitsandbytes 0.50.2 `int8_mm_dequant` with no row scales, `'NoneType' object has no
/// attribute 'dtype'`).
fn max_memory_arg(m: MaxMemory) -> String {
    let cpu = m.cpu.map_or_else(
        || "psutil.virtual_memory().available".to_string(),
        accelerate_size,
    );
    format!(
        "max_memory={{0: {}, \"cpu\": {cpu}}}",
        accelerate_size(m.gpu)
    )
}

/// The keyword arguments of `model.generate()` after `input_ids`, as planned.
pub fn generate_kwargs(cfg: &InferConfig, dec: &Decoding) -> String {
    let mut kw = vec![
        format!("max_new_tokens={}", cfg.new_tokens),
        format!("min_new_tokens={}", cfg.new_tokens),
        format!("do_sample={}", py_bool(dec.do_sample)),
    ];
    if dec.do_sample {
        kw.push(format!("temperature={:?}", dec.temperature));
        kw.push(format!("top_k={}", dec.top_k));
        kw.push(format!("top_p={:?}", dec.top_p));
    }
    if dec.num_beams > 1 {
        kw.push(format!("num_beams={}", dec.num_beams));
    }
    if cfg.kv_cache == KvCache::Static {
        kw.push("cache_implementation=\"static\"".into());
    }
    kw.push("disable_compile=True".into());
    kw.join(", ")
}

/// The `PYTORCH_CUDA_ALLOC_CONF` of the planned allocator options, if any.
fn alloc_conf(cfg: &InferConfig) -> Option<String> {
    let mut parts = Vec::new();
    if cfg.allocator.expandable_segments {
        parts.push("expandable_segments:True".to_string());
    }
    if let Some(mb) = cfg.allocator.max_split_size_mb {
        parts.push(format!("max_split_size_mb:{mb}"));
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// The settings of one inference export: the model, the call and how the weights load.
#[derive(Debug, Clone, Copy)]
pub struct InferExport<'a> {
    pub model: &'a ModelRef,
    pub config: &'a InferConfig,
    pub decoding: &'a Decoding,
    /// The bitsandbytes quantization of the linears.
    pub quant: Option<QuantStorage>,
    /// `device_map="auto"` with this `max_memory`.
    pub max_memory: Option<MaxMemory>,
    /// With `quant` and `max_memory`: `BitsAndBytesConfig(...,
    /// llm_int8_enable_fp32_cpu_offload=True)`.
    pub fp32_cpu_offload: bool,
}

/// The transformers script of the planned call, with `plan`'s peaks written in.
pub fn transformers_script(e: &InferExport<'_>, plan: &InferPlan) -> String {
    let cfg = e.config;
    let dtype = torch_dtype(cfg.dtype);
    let attention = match cfg.attention {
        Attention::Eager => "eager",
        _ => "sdpa",
    };
    let mut s = String::new();
    s.push_str(&format!(
        "# vramlab inference plan: {} — {}\n",
        plan.model,
        cfg.step.describe()
    ));
    let tokens = match cfg.step {
        InferStep::Generate => format!(
            "prompt {} + {} new tokens, {} KV cache",
            cfg.prompt,
            cfg.new_tokens,
            cfg.kv_cache.as_str()
        ),
        InferStep::Prefill => format!("prompt {} tokens", cfg.prompt),
    };
    s.push_str(&format!(
        "# batch {}, {tokens}, {} weights, {attention} attention",
        cfg.batch,
        dtype_name(cfg.dtype)
    ));
    if let Some(q) = e.quant {
        s.push_str(&format!(", {}", describe_quant(q)));
    }
    if e.max_memory.is_some() {
        s.push_str(", device_map=\"auto\"");
    }
    s.push('\n');
    s.push_str(&format!(
        "# planned: peak allocated {}, peak reserved {} (torch.cuda.max_memory_allocated() /\n\
         # max_memory_reserved() over the call after a warm-up call), nvidia-smi {}\n",
        plan.peak_allocated_bytes, plan.peak_reserved_bytes, plan.nvidia_smi_bytes
    ));
    if let Some(conf) = alloc_conf(cfg) {
        s.push_str(&format!(
            "import os\n\nos.environ.setdefault(\"PYTORCH_CUDA_ALLOC_CONF\", \"{conf}\")  # before torch starts CUDA\n"
        ));
    }
    if e.max_memory.is_some_and(|m| m.cpu.is_none()) {
        s.push_str("import psutil  # accelerate's own dependency: the CPU's budget below\n");
    }
    s.push_str("import torch\n");
    if e.quant.is_some() {
        s.push_str("from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n");
    } else {
        s.push_str("from transformers import AutoModelForCausalLM\n");
    }
    s.push('\n');
    s.push_str(&format!(
        "MODEL = {}  # {}\n",
        py_str(e.model.name()),
        e.model.comment()
    ));
    let revision = e
        .model
        .revision()
        .map_or(String::new(), |r| format!(", revision={}", py_str(r)));
    s.push_str(&format!(
        "BATCH, PROMPT = {}, {}  # input_ids: BATCH sequences of PROMPT tokens\n",
        cfg.batch, cfg.prompt
    ));
    s.push_str(&format!(
        "PLANNED_PEAK_ALLOCATED = {}  # bytes, {}\nPLANNED_PEAK_RESERVED = {}  # bytes, {}\n\n",
        plan.peak_allocated_bytes.0,
        plan.peak_allocated_bytes,
        plan.peak_reserved_bytes.0,
        plan.peak_reserved_bytes
    ));
    s.push_str("cuda = torch.cuda.is_available()\ndevice = \"cuda\" if cuda else \"cpu\"\n");
    let common = format!("MODEL{revision}, dtype={dtype}, attn_implementation=\"{attention}\"");
    let gpu_only = match (e.quant, e.max_memory) {
        (Some(q), Some(m)) => Some((
            format!(
                "quantization_config={},\n        device_map=\"auto\", {}",
                bnb_config(q, cfg.dtype, e.fp32_cpu_offload),
                max_memory_arg(m)
            ),
            "bitsandbytes' quantized linears need CUDA: on the CPU the model loads unquantized \
             and whole, not offloaded",
        )),
        (Some(q), None) => Some((
            format!("quantization_config={}", bnb_config(q, cfg.dtype, false)),
            "bitsandbytes' quantized linears need CUDA: on the CPU the model loads unquantized",
        )),
        (None, Some(m)) => Some((
            format!("device_map=\"auto\", {}", max_memory_arg(m)),
            "max_memory[0] budgets GPU 0: on the CPU the model loads whole, not offloaded",
        )),
        (None, None) => None,
    };
    match gpu_only {
        Some((args, why)) => {
            s.push_str(&format!(
                "if cuda:\n    model = AutoModelForCausalLM.from_pretrained(\n        {common},\n        {args},\n    )\nelse:\n    # {why}\n    # (a dry run of the script; the plan is for the GPU)\n    model = AutoModelForCausalLM.from_pretrained({common})\n"
            ));
        }
        None => s.push_str(&format!(
            "model = AutoModelForCausalLM.from_pretrained({common}).to(device)\n"
        )),
    }
    s.push_str("model.eval()\n\n");
    s.push_str(
        "vocab = model.config.get_text_config(decoder=True).vocab_size\n\
         gen = torch.Generator(device=\"cpu\").manual_seed(29)\n\
         input_ids = torch.randint(0, vocab, (BATCH, PROMPT), generator=gen).to(device)\n\n\n",
    );
    match cfg.step {
        InferStep::Generate => {
            s.push_str("def call():\n");
            if e.decoding.do_sample {
                s.push_str("    torch.manual_seed(29)  # the same draws in both calls\n");
            }
            s.push_str(&format!(
                "    # disable_compile=True: the eager decode step vramlab plans (on CUDA transformers\n    # otherwise compiles a static cache's decode step with CUDA graphs)\n    out = model.generate(input_ids, {})\n    assert out.shape[1] - PROMPT == {}, \"generated fewer tokens than planned\"\n\n\n",
                generate_kwargs(cfg, e.decoding),
                cfg.new_tokens
            ));
        }
        InferStep::Prefill => s.push_str(
            "def call():\n    # a plain forward: every position's logits and the forward's own DynamicCache\n    with torch.no_grad():\n        out = model(input_ids)\n    del out\n\n\n",
        ),
    }
    s.push_str(
        "call()  # warm-up: the caching allocator keeps what it reserved, as planned\n\
         if cuda:\n    torch.cuda.synchronize()\n    torch.cuda.reset_peak_memory_stats()\n\
         call()\n\
         gib = 2**30\n\
         if cuda:\n    torch.cuda.synchronize()\n    \
         allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()\n    \
         print(f\"peak allocated {allocated / gib:.2f} GiB (planned {PLANNED_PEAK_ALLOCATED / gib:.2f} GiB)\")\n    \
         print(f\"peak reserved  {reserved / gib:.2f} GiB (planned {PLANNED_PEAK_RESERVED / gib:.2f} GiB)\")\n\
         else:\n    print(\n        f\"no CUDA device: the call ran on the CPU; planned on the GPU: peak allocated \"\n        \
         f\"{PLANNED_PEAK_ALLOCATED / gib:.2f} GiB, peak reserved {PLANNED_PEAK_RESERVED / gib:.2f} GiB\"\n    )\n",
    );
    s
}

/// The `vllm serve` settings: the capacity [`vllm::capacity`] computes at the chosen
/// `--max-num-seqs`, and that number.
#[derive(Debug, Clone)]
pub struct VllmServe {
    pub capacity: VllmCapacity,
    /// The most `max_model_len`-token requests the KV cache holds at once (the floor of the
    /// concurrency at this very `max_num_seqs`, whose sampler run it sizes).
    pub max_num_seqs: u64,
}

/// vLLM's engine arguments of an export: `--max-model-len` = prompt + new tokens, vLLM's
/// defaults for the block size and batched tokens, `max_num_seqs` as given.
pub fn vllm_args(cfg: &InferConfig, gpu_memory_utilization: f64, max_num_seqs: u64) -> VllmArgs {
    VllmArgs {
        gpu_memory_utilization,
        max_model_len: Some(cfg.total_tokens()),
        max_num_seqs,
        dtype: cfg.dtype,
        ..VllmArgs::default()
    }
}

/// Sizes `vllm serve` for the planned call: `--max-model-len` = prompt + new tokens and
/// `--max-num-seqs` the largest S whose own capacity holds S such requests (vLLM profiles the
/// sampler over `max_num_seqs` rows, so S changes the KV cache: searched, at most
/// `max_num_batched_tokens`, which vLLM requires). Errors name the field.
pub fn vllm_serve(
    preset: &Preset,
    cfg: &InferConfig,
    quant: Option<QuantStorage>,
    total: Bytes,
    context: Bytes,
    gpu_memory_utilization: f64,
) -> Result<VllmServe, PlanError> {
    if cfg.step != InferStep::Generate {
        return Err(PlanError::Field {
            field: "step",
            reason: "vLLM serves generation: export --step generate (--seq prompt tokens, \
                     --new-tokens N; --max-model-len is their sum)"
                .into(),
        });
    }
    if cfg.kv_cache == KvCache::Static {
        return Err(PlanError::Field {
            field: "kv_cache",
            reason: "vLLM keeps its own paged KV cache; the static cache is transformers' \
                     (leave out --kv-cache)"
                .into(),
        });
    }
    if cfg.attention == Attention::Eager {
        return Err(PlanError::Field {
            field: "attention",
            reason: "eager is transformers' attention; vLLM runs its own attention backend \
                     (leave out --attention)"
                .into(),
        });
    }
    if let Some(q) = quant
        && q.quant != Quant::Nf4
    {
        return Err(PlanError::Field {
            field: "quant",
            reason: format!(
                "{}: vLLM's in-flight bitsandbytes quantization is 4-bit NF4; export --quant \
                 nf4 or unquantized weights",
                q.quant.as_str()
            ),
        });
    }
    let at = |seqs: u64| {
        vllm::capacity(
            preset,
            vllm_args(cfg, gpu_memory_utilization, seqs),
            total,
            context,
        )
    };
    let fits = |c: &VllmCapacity, seqs: u64| c.max_concurrency.floor() >= seqs as f64;
    let one = at(1)?;
    if !fits(&one, 1) {
        return Err(PlanError::Field {
            field: "max_model_len",
            reason: format!(
                "vLLM would refuse to start: one {}-token request (--seq + --new-tokens) needs \
                 more KV cache than is left ({} of {} requested); estimated maximum model \
                 length {}",
                one.max_model_len,
                one.available_kv_bytes,
                one.requested_bytes,
                one.estimated_max_model_len.unwrap_or(0)
            ),
        });
    }
    // fits(S) holds for S = 1 and, the concurrency falling as S grows, for every S up to the
    // largest: a bisection over [1, upper].
    let upper =
        (one.max_concurrency.floor() as u64).clamp(1, VllmArgs::default().max_num_batched_tokens);
    let (mut lo, mut hi) = (1u64, upper);
    let mut best = one;
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        let c = at(mid)?;
        if fits(&c, mid) {
            lo = mid;
            best = c;
        } else {
            hi = mid - 1;
        }
    }
    Ok(VllmServe {
        capacity: if best.args.max_num_seqs == lo {
            best
        } else {
            at(lo)?
        },
        max_num_seqs: lo,
    })
}

/// The `vllm serve` command line of `serve`, with the header that says it was planned, not
/// measured.
pub fn vllm_command(e: &InferExport<'_>, serve: &VllmServe, gpu_name: &str) -> String {
    let c = &serve.capacity;
    let cfg = e.config;
    let mut s = format!(
        "# vllm serve for {} on {gpu_name} — {PLANNED_NOTE} on a GPU\n# ({VLLM_SOURCE})\n",
        c.model
    );
    s.push_str(&format!(
        "# KV cache {} ({} requested − {} weights, activations, sampler and CUDA context): {} blocks of {} tokens = {} tokens\n",
        c.available_kv_bytes,
        c.requested_bytes,
        c.non_kv_peak_bytes,
        c.num_blocks,
        c.args.block_size,
        c.kv_tokens
    ));
    s.push_str(&format!(
        "# max concurrency of {}-token requests (prompt {} + {} new): {:.2}x -> --max-num-seqs {}\n",
        c.max_model_len, cfg.prompt, cfg.new_tokens, c.max_concurrency, serve.max_num_seqs
    ));
    let seqs = if cfg.batch == 1 {
        "1 sequence".to_string()
    } else {
        format!("{} sequences", cfg.batch)
    };
    s.push_str(&if cfg.batch <= serve.max_num_seqs {
        format!("# the planned batch of {seqs} runs at once\n")
    } else {
        format!(
            "# the planned batch of {seqs} does NOT run at once: vLLM runs {} and queues the rest\n",
            serve.max_num_seqs
        )
    });
    if e.quant.is_some() {
        s.push_str(
            "# --quantization bitsandbytes: vLLM quantizes the weights to NF4 as it loads them; the\n\
             # KV cache above is planned with unquantized weights, so vLLM has at least as much\n",
        );
    }
    if let ModelRef::Unknown = e.model {
        s.push_str(&format!(
            "# SET THE MODEL: replace {MODEL_PLACEHOLDER} by its Hugging Face id or folder (vramlab does not know where its weights are)\n"
        ));
    }
    s.push_str(&format!("vllm serve {}", shell_word(e.model.name())));
    let mut flags: Vec<String> = Vec::new();
    if let Some(r) = e.model.revision() {
        flags.push(format!("--revision {}", shell_word(r)));
    }
    flags.push(format!("--dtype {}", vllm_dtype(cfg.dtype)));
    flags.push(format!("--max-model-len {}", c.max_model_len));
    flags.push(format!(
        "--gpu-memory-utilization {}",
        c.args.gpu_memory_utilization
    ));
    flags.push(format!("--max-num-seqs {}", serve.max_num_seqs));
    flags.push(format!(
        "--max-num-batched-tokens {}",
        c.args.max_num_batched_tokens
    ));
    if e.quant.is_some() {
        flags.push("--quantization bitsandbytes".into());
    }
    for f in flags {
        s.push_str(" \\\n    ");
        s.push_str(&f);
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset::find_builtin;
    use crate::plan::DEFAULT_CUDA_CONTEXT;
    use crate::plan::config::AllocatorConfig;
    use crate::plan::inference::InferPlanner;

    fn cfg(step: InferStep) -> InferConfig {
        InferConfig {
            step,
            batch: 4,
            prompt: 128,
            new_tokens: if step == InferStep::Generate { 32 } else { 0 },
            dtype: DType::BF16,
            attention: Attention::Sdpa,
            kv_cache: KvCache::Dynamic,
            allocator: AllocatorConfig::default(),
        }
    }

    fn llama() -> Preset {
        find_builtin("TinyLlama-1.1B").expect("TinyLlama")
    }

    fn script(
        c: &InferConfig,
        d: &Decoding,
        q: Option<QuantStorage>,
        m: Option<MaxMemory>,
    ) -> (String, InferPlan) {
        let p = llama();
        let planner = match m {
            Some(m) => {
                InferPlanner::with_device_map_quant(&p, c, d, m, q, q.is_some()).expect("planner")
            }
            None => InferPlanner::with_quant(&p, c, d, q).expect("planner"),
        };
        let plan = planner.plan(c.batch).expect("plan");
        let model = ModelRef::Hub {
            repo: "TinyLlama/TinyLlama-1.1B".into(),
            revision: None,
        };
        let e = InferExport {
            model: &model,
            config: c,
            decoding: d,
            quant: q,
            max_memory: m,
            fp32_cpu_offload: q.is_some() && m.is_some(),
        };
        (transformers_script(&e, &plan), plan)
    }

    #[test]
    fn the_format_names_are_listed() {
        assert_eq!(InferFormat::choices(), "transformers, vllm");
    }

    #[test]
    fn generate_script_loads_and_calls_as_planned() {
        let c = cfg(InferStep::Generate);
        let (s, plan) = script(&c, &Decoding::default(), None, None);
        assert!(s.contains("MODEL = \"TinyLlama/TinyLlama-1.1B\""), "{s}");
        assert!(
            s.contains(
                "AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation=\"sdpa\").to(device)"
            ),
            "{s}"
        );
        assert!(!s.contains("torch_dtype"), "deprecated keyword: {s}");
        assert!(s.contains("model.eval()"));
        assert!(s.contains("BATCH, PROMPT = 4, 128"));
        assert!(
            s.contains(
                "model.generate(input_ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, disable_compile=True)"
            ),
            "{s}"
        );
        assert!(!s.contains("cache_implementation"));
        assert!(!s.contains("BitsAndBytesConfig"));
        assert!(!s.contains("device_map"));
        assert!(s.contains(&format!(
            "PLANNED_PEAK_ALLOCATED = {}  #",
            plan.peak_allocated_bytes.0
        )));
        assert!(s.contains(&format!(
            "PLANNED_PEAK_RESERVED = {}  #",
            plan.peak_reserved_bytes.0
        )));
        assert!(s.contains("torch.cuda.max_memory_allocated()"));
        assert!(s.contains("if cuda:"), "the CUDA calls are guarded");
    }

    #[test]
    fn static_cache_sampling_fp16_eager_variants_appear() {
        let mut c = cfg(InferStep::Generate);
        c.kv_cache = KvCache::Static;
        c.dtype = DType::F16;
        c.attention = Attention::Eager;
        let d = Decoding {
            do_sample: true,
            temperature: 0.7,
            top_k: 20,
            top_p: 0.9,
            num_beams: 1,
        };
        let (s, _) = script(&c, &d, None, None);
        assert!(
            s.contains("dtype=torch.float16, attn_implementation=\"eager\""),
            "{s}"
        );
        assert!(
            s.contains(
                "max_new_tokens=32, min_new_tokens=32, do_sample=True, temperature=0.7, top_k=20, top_p=0.9, cache_implementation=\"static\", disable_compile=True)"
            ),
            "{s}"
        );
        assert!(s.contains("torch.manual_seed(29)"));
        c.dtype = DType::F32;
        let (s, _) = script(&c, &Decoding::default(), None, None);
        assert!(s.contains("dtype=torch.float32"), "{s}");
    }

    #[test]
    fn prefill_is_a_no_grad_forward() {
        let c = cfg(InferStep::Prefill);
        let (s, _) = script(&c, &Decoding::default(), None, None);
        assert!(
            s.contains("    with torch.no_grad():\n        out = model(input_ids)\n"),
            "{s}"
        );
        assert!(!s.contains("generate("), "{s}");
    }

    #[test]
    fn quantized_weights_write_bitsandbytes_config() {
        let c = cfg(InferStep::Generate);
        let nf4 = QuantStorage {
            quant: Quant::Nf4,
            double_quant: false,
        };
        let (s, _) = script(&c, &Decoding::default(), Some(nf4), None);
        assert!(s.contains("from transformers import AutoModelForCausalLM, BitsAndBytesConfig"));
        assert!(
            s.contains(
                "quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype=torch.bfloat16),"
            ),
            "{s}"
        );
        let int8 = QuantStorage {
            quant: Quant::Int8,
            double_quant: false,
        };
        let (s, _) = script(&c, &Decoding::default(), Some(int8), None);
        assert!(
            s.contains("quantization_config=BitsAndBytesConfig(load_in_8bit=True),"),
            "{s}"
        );
        assert!(
            s.contains("loads unquantized"),
            "the CPU fallback is said: {s}"
        );
    }

    #[test]
    fn device_map_writes_max_memory_exactly() {
        let c = cfg(InferStep::Generate);
        let m = MaxMemory {
            gpu: 1 << 30,
            cpu: Some(1536 << 20),
        };
        let (s, _) = script(&c, &Decoding::default(), None, Some(m));
        assert!(
            s.contains("device_map=\"auto\", max_memory={0: \"1GiB\", \"cpu\": \"1536MiB\"},"),
            "{s}"
        );
        let m = MaxMemory {
            gpu: 1_000_000_001,
            cpu: None,
        };
        let (s, _) = script(&c, &Decoding::default(), None, Some(m));
        assert!(
            s.contains("max_memory={0: 1000000001, \"cpu\": psutil.virtual_memory().available},"),
            "{s}"
        );
        assert!(s.contains("import psutil"), "{s}");
        assert_eq!(accelerate_size(3 << 30), "\"3GiB\"");
    }

    #[test]
    fn unknown_model_and_revision() {
        let c = cfg(InferStep::Generate);
        let p = llama();
        let d = Decoding::default();
        let plan = InferPlanner::new(&p, &c)
            .expect("planner")
            .plan(4)
            .expect("plan");
        let unknown = ModelRef::Unknown;
        let e = InferExport {
            model: &unknown,
            config: &c,
            decoding: &d,
            quant: None,
            max_memory: None,
            fp32_cpu_offload: false,
        };
        let s = transformers_script(&e, &plan);
        assert!(s.contains("MODEL = \"your/model-id\"  # SET THIS"), "{s}");
        let pinned = ModelRef::Hub {
            repo: "org/m".into(),
            revision: Some("v1".into()),
        };
        let e = InferExport {
            model: &pinned,
            ..e
        };
        assert!(transformers_script(&e, &plan).contains("MODEL, revision=\"v1\", dtype="));
        assert_eq!(shell_word("a b'c"), "'a b'\\''c'");
        assert_eq!(shell_word("org/m"), "org/m");
    }

    #[test]
    fn vllm_numbers_are_answer_vllms() {
        let p = llama();
        let c = cfg(InferStep::Generate);
        let total = Bytes(24 << 30);
        let serve = vllm_serve(&p, &c, None, total, DEFAULT_CUDA_CONTEXT, 0.9).expect("serve");
        let s = serve.max_num_seqs;
        let again = vllm::capacity(&p, vllm_args(&c, 0.9, s), total, DEFAULT_CUDA_CONTEXT)
            .expect("capacity");
        assert_eq!(again.max_model_len, 160);
        assert_eq!(again.num_blocks, serve.capacity.num_blocks);
        assert_eq!(
            s,
            again.max_concurrency.floor() as u64,
            "S is the floor at S"
        );
        let next = vllm::capacity(&p, vllm_args(&c, 0.9, s + 1), total, DEFAULT_CUDA_CONTEXT)
            .expect("capacity");
        assert!(
            s == 8192 || next.max_concurrency.floor() < (s + 1) as f64,
            "S is the largest"
        );
        let model = ModelRef::Hub {
            repo: "TinyLlama/TinyLlama-1.1B".into(),
            revision: None,
        };
        let d = Decoding::default();
        let e = InferExport {
            model: &model,
            config: &c,
            decoding: &d,
            quant: None,
            max_memory: None,
            fp32_cpu_offload: false,
        };
        let text = vllm_command(&e, &serve, "RTX 4090");
        assert!(
            text.contains("planned from vLLM's source, not measured on a GPU"),
            "{text}"
        );
        assert!(text.contains("vllm serve TinyLlama/TinyLlama-1.1B \\\n    --dtype bfloat16 \\\n    --max-model-len 160 \\\n    --gpu-memory-utilization 0.9 \\\n"), "{text}");
        assert!(text.contains(&format!("--max-num-seqs {s} \\")), "{text}");
        assert!(
            text.contains(&format!("{} blocks of 16 tokens", again.num_blocks)),
            "{text}"
        );
        assert!(!text.contains("--quantization"));
        let nf4 = QuantStorage {
            quant: Quant::Nf4,
            double_quant: true,
        };
        let e = InferExport {
            quant: Some(nf4),
            ..e
        };
        assert!(vllm_command(&e, &serve, "x").ends_with("--quantization bitsandbytes\n"));
    }

    #[test]
    fn vllm_refuses_what_it_does_not_serve() {
        let p = llama();
        let ctx = DEFAULT_CUDA_CONTEXT;
        let total = Bytes(24 << 30);
        let pre = cfg(InferStep::Prefill);
        let e = vllm_serve(&p, &pre, None, total, ctx, 0.9).expect_err("prefill");
        assert!(e.to_string().contains("step"), "{e}");
        let mut st = cfg(InferStep::Generate);
        st.kv_cache = KvCache::Static;
        let e = vllm_serve(&p, &st, None, total, ctx, 0.9).expect_err("static");
        assert!(e.to_string().contains("kv_cache"), "{e}");
        let int8 = QuantStorage {
            quant: Quant::Int8,
            double_quant: false,
        };
        let g = cfg(InferStep::Generate);
        let e = vllm_serve(&p, &g, Some(int8), total, ctx, 0.9).expect_err("int8");
        assert!(e.to_string().contains("quant"), "{e}");
        let e = vllm_serve(&p, &g, None, Bytes(2 << 30), ctx, 0.9).expect_err("no room");
        assert!(e.to_string().contains("max_model_len"), "{e}");
    }
}
