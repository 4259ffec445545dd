//! `vramlab._vramlab`: the native module of the `vramlab` Python package. It reads the
//! settings as the CLI's words (a dict of the Python keywords, `seq`, `precision`, …),
//! resolves them with [`vramlab_words::train_words`] and answers with the core's
//! reports, serialised as the CLI's `--json`: `plan(...).to_json()` is `vramlab plan …
//! --json`, byte for byte. The Python wrappers (`python/vramlab/__init__.py`) give the
//! answers their typed attributes.

use std::path::PathBuf;
use std::sync::OnceLock;

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyDictMethods};

use vramlab_core::answer::doctor_report::{self, DoctorReport};
use vramlab_core::answer::error::AnswerError;
use vramlab_core::answer::max_batch::Outcome;
use vramlab_core::answer::report::PlanStart;
use vramlab_core::model::Preset;
use vramlab_core::plan::fit::cost::Speed;
use vramlab_core::plan::gpus::Gpu;
use vramlab_words::fit_words::FitAsk;
use vramlab_words::train_words::{self, DistWords, Remark, TrainWords};
use vramlab_words::{names, vocabulary};

/// `vramlab capture`'s helper and its siblings, embedded as the CLI embeds them:
/// `vramlab.plan_module` runs the same tracing code in-process.
const CAPTURE_SOURCES: [(&str, &str); 3] = [
    (
        "cuda_autocast",
        include_str!("../../../runners/cuda_autocast.py"),
    ),
    (
        "cuda_composites",
        include_str!("../../../runners/cuda_composites.py"),
    ),
    ("capture", include_str!("../../../runners/capture.py")),
];

/// The keywords the settings dict may hold (the CLI's flags, `-` as `_`).
const KEYWORDS: &[&str] = &[
    "model",
    "config",
    "precision",
    "optimizer",
    "seq",
    "target_seq",
    "image",
    "accum",
    "checkpointing",
    "checkpointing_reentrant",
    "attention",
    "loop",
    "step",
    "finetune",
    "lora_rank",
    "lora_targets",
    "lora_dropout",
    "freeze_embeddings",
    "freeze_blocks",
    "lora_merged",
    "quant",
    "no_double_quant",
    "moe_imbalance",
    "expandable_segments",
    "max_split_size_mb",
    "gpu",
    "margin",
    "gpus",
    "nodes",
    "strategy",
    "offload",
    "no_reshard_after_forward",
    "fsdp_mixed_precision",
    "bucket_cap_mb",
    "gradient_as_bucket_view",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
    "no_contiguous_gradients",
    "stage3_prefetch_bucket_size",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold",
    "max_gpus",
];

fn to_py(e: &AnswerError) -> PyErr {
    if e.file {
        PyOSError::new_err(e.message().to_string())
    } else {
        PyValueError::new_err(e.message().to_string())
    }
}

/// The closest keyword to an unknown one.
fn closest(key: &str) -> Option<&'static str> {
    KEYWORDS
        .iter()
        .map(|k| (names::edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

/// Reads one setting, naming it when its type is wrong.
fn get<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<T>> {
    match d.get_item(key)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => v.extract::<T>().map(Some).map_err(|_| {
            let got = v
                .get_type()
                .name()
                .map_or_else(|_| "?".to_string(), |n| n.to_string());
            PyTypeError::new_err(format!(
                "{key}: expected {}, got {got} {}",
                python_type(std::any::type_name::<T>()),
                v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string())
            ))
        }),
    }
}

/// The Python name of the Rust type a setting is read as.
fn python_type(rust: &str) -> &'static str {
    match rust.rsplit("::").next().unwrap_or(rust) {
        "u64" | "u32" => "a whole number (int) of at least 0",
        "f64" => "a number (float)",
        "bool" => "True or False",
        "PathBuf" => "a path (str or os.PathLike)",
        _ => "a str",
    }
}

fn flag(d: &Bound<'_, PyDict>, key: &str) -> PyResult<bool> {
    Ok(get::<bool>(d, key)?.unwrap_or(false))
}

/// The settings dict as `vramlab-words`' words; an unknown keyword is refused with the closest
/// known one.
fn words_of(d: &Bound<'_, PyDict>) -> PyResult<TrainWords> {
    for k in d.keys() {
        let key: String = k.extract()?;
        if !KEYWORDS.contains(&key.as_str()) {
            let hint = closest(&key).map_or(String::new(), |c| format!(" (did you mean {c}?)"));
            return Err(PyTypeError::new_err(format!(
                "unknown setting `{key}`{hint}"
            )));
        }
    }
    let defaults = TrainWords::default();
    let gpus = match d.get_item("gpus")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.extract::<u64>() {
            Ok(n) => Some(n.to_string()),
            Err(_) => Some(get::<String>(d, "gpus")?.unwrap_or_default()),
        },
    };
    let mut w = TrainWords {
        model: get(d, "model")?,
        config: get::<PathBuf>(d, "config")?,
        precision: get(d, "precision")?,
        optimizer: get(d, "optimizer")?,
        seq: get(d, "seq")?,
        target_seq: get(d, "target_seq")?,
        image: get(d, "image")?,
        accum: get(d, "accum")?.unwrap_or(defaults.accum),
        checkpointing: flag(d, "checkpointing")?,
        checkpointing_reentrant: flag(d, "checkpointing_reentrant")?,
        attention: get(d, "attention")?.unwrap_or(defaults.attention),
        loop_shape: get(d, "loop")?,
        step: get(d, "step")?,
        finetune: get(d, "finetune")?,
        lora_rank: get(d, "lora_rank")?,
        lora_targets: get(d, "lora_targets")?,
        lora_dropout: get(d, "lora_dropout")?,
        freeze_embeddings: flag(d, "freeze_embeddings")?,
        freeze_blocks: get(d, "freeze_blocks")?,
        lora_merged: flag(d, "lora_merged")?,
        quant: get(d, "quant")?,
        no_double_quant: flag(d, "no_double_quant")?,
        moe_imbalance: get(d, "moe_imbalance")?,
        expandable_segments: flag(d, "expandable_segments")?,
        max_split_size_mb: get(d, "max_split_size_mb")?,
        gpu: get(d, "gpu")?,
        margin: get(d, "margin")?.unwrap_or(defaults.margin),
        dist: defaults.dist,
        preloaded: None,
    };
    let dist = &mut w.dist;
    dist.gpus = gpus;
    dist.nodes = get(d, "nodes")?;
    dist.strategy = get(d, "strategy")?;
    dist.offload = get(d, "offload")?;
    dist.no_reshard_after_forward = flag(d, "no_reshard_after_forward")?;
    dist.fsdp_mixed_precision = get(d, "fsdp_mixed_precision")?;
    dist.bucket_cap_mb = get(d, "bucket_cap_mb")?;
    dist.gradient_as_bucket_view = flag(d, "gradient_as_bucket_view")?;
    dist.reduce_bucket_size = get(d, "reduce_bucket_size")?;
    dist.allgather_bucket_size = get(d, "allgather_bucket_size")?;
    dist.overlap_comm = get(d, "overlap_comm")?;
    dist.no_contiguous_gradients = flag(d, "no_contiguous_gradients")?;
    dist.stage3_prefetch_bucket_size = get(d, "stage3_prefetch_bucket_size")?;
    dist.stage3_max_live_parameters = get(d, "stage3_max_live_parameters")?;
    dist.stage3_max_reuse_distance = get(d, "stage3_max_reuse_distance")?;
    dist.stage3_param_persistence_threshold = get(d, "stage3_param_persistence_threshold")?;
    if let Some(m) = get(d, "max_gpus")? {
        dist.max_gpus = m;
    }
    Ok(w)
}

/// No GPU is detected in-process: `gpu="detected"` plans for the default catalog card
/// (said in the notes), as the CLI does on a machine without NVML.
fn no_detection() -> Option<vramlab_core::plan::gpus::Gpu> {
    None
}

/// The remarks in order, as the CLI prints them on standard error (`note: …`).
fn remark_text(r: Remark) -> String {
    match r {
        Remark::Note(n) => format!("note: {n}"),
        Remark::Warning(w) => format!("warning: {w}"),
    }
}

/// A planned step: the plan and its verdict, made at once; the whole `plan --json` report
/// (the max-batch search, the remedies) made on first use and kept.
#[pyclass(frozen, module = "vramlab._vramlab")]
struct Planned {
    start: PlanStart,
    notes: Vec<String>,
    report: OnceLock<String>,
}

#[pymethods]
impl Planned {
    /// The keys of `plan --json` that need no search (peaks, breakdown, verdict and band,
    /// configuration, GPU, assumed settings, warnings) as JSON text.
    fn summary_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.start.summary_json())
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// `vramlab plan … --json`'s line: the whole report (made on the first call).
    fn report_json(&self, py: Python<'_>) -> PyResult<String> {
        if let Some(j) = self.report.get() {
            return Ok(j.clone());
        }
        let json = py.detach(|| {
            let report = self
                .start
                .finish()
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            serde_json::to_string(&report).map_err(|e| PyValueError::new_err(e.to_string()))
        })?;
        Ok(self.report.get_or_init(|| json).clone())
    }

    /// The allocated bytes after every event of the step, as JSON text (`--timeline`'s).
    fn timeline_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.start.plan.timeline)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// What the CLI would say on standard error (`note: …`), in order.
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

/// The words with a captured graph (`*.vramlab-graph.json`'s text, from
/// `vramlab.plan_module`) as their model: read here, named by the `model` word.
fn with_graph(mut w: TrainWords, graph: Option<&str>) -> PyResult<TrainWords> {
    if let Some(text) = graph {
        let id = w.model.clone().unwrap_or_else(|| "captured".to_string());
        let preset = Preset::from_captured(&id, text)
            .map_err(|e| PyValueError::new_err(format!("captured graph {id}: {e}")))?;
        w.model = Some(id);
        w.preloaded = Some(Box::new(preset));
    }
    Ok(w)
}

/// Plans the settings at `batch` (`None`: the saved config's); `timeline`: keep the
/// allocated timeline in the report's JSON (`--timeline`); `graph`: a captured graph's
/// text planned as the model.
#[pyfunction]
#[pyo3(signature = (settings, batch=None, timeline=false, graph=None))]
fn plan(
    py: Python<'_>,
    settings: &Bound<'_, PyDict>,
    batch: Option<&Bound<'_, PyAny>>,
    timeline: bool,
    graph: Option<&str>,
) -> PyResult<Planned> {
    let w = with_graph(words_of(settings)?, graph)?;
    let batch = batch_arg("batch", batch)?;
    py.detach(|| {
        let mut said = Vec::new();
        let start = w
            .plan_start(batch, timeline, false, &no_detection, &mut |r| {
                said.push(remark_text(r));
            })
            .map_err(|e| to_py(&e))?;
        Ok(Planned {
            start,
            notes: said,
            report: OnceLock::new(),
        })
    })
}

/// `vramlab plan … --json` for the settings: (the JSON text, the notes said on the way).
#[pyfunction]
#[pyo3(signature = (settings, batch=None, timeline=false))]
fn plan_json(
    py: Python<'_>,
    settings: &Bound<'_, PyDict>,
    batch: Option<&Bound<'_, PyAny>>,
    timeline: bool,
) -> PyResult<(String, Vec<String>)> {
    let planned = plan(py, settings, batch, timeline, None)?;
    Ok((planned.report_json(py)?, planned.notes))
}

/// `batch=` (or another count named `name`): a whole number of at least 1, or `None`.
fn batch_arg(name: &str, batch: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    match batch {
        Some(b) if !b.is_none() => {
            let n: i128 = b.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{name}: expected a whole number (int) of at least 1, got {}",
                    b.repr().map_or_else(|_| "?".to_string(), |r| r.to_string())
                ))
            })?;
            train_words::batch_of(n)
                .map(Some)
                .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
        }
        _ => Ok(None),
    }
}

/// The catalog's speed for the card: no measured profile is read in-process (the CLI reads
/// one `vramlab profile` saved; without one the two agree).
fn catalog_speed(gpu: &Gpu) -> Speed {
    Speed::catalog(gpu)
}

/// `vramlab fit … --json` for the settings: (the JSON text, the notes and warnings, each
/// candidate's settings as the keyword dict `vramlab.plan` takes). Nothing fitting is an
/// answer (no candidates, the `reason`), not an error.
#[pyfunction]
#[pyo3(signature = (settings, batch=None, effective_batch=None, top=10))]
fn fit_json<'py>(
    py: Python<'py>,
    settings: &Bound<'py, PyDict>,
    batch: Option<&Bound<'py, PyAny>>,
    effective_batch: Option<&Bound<'py, PyAny>>,
    top: usize,
) -> PyResult<(String, Vec<String>, Vec<Bound<'py, PyDict>>)> {
    let w = words_of(settings)?;
    let batch = batch_arg("batch", batch)?;
    let effective_batch = batch_arg("effective_batch", effective_batch)?;
    let (json, said, candidates) = py.detach(|| {
        let mut said = Vec::new();
        let answer = w
            .fit_answer(
                FitAsk {
                    batch,
                    effective_batch,
                    top,
                    speed: &catalog_speed,
                },
                &no_detection,
                &mut |r| said.push(remark_text(r)),
            )
            .map_err(|e| to_py(&e))?;
        let json = answer.to_json().map_err(|e| to_py(&e))?.to_string();
        let candidates = (0..answer.report.candidates.len())
            .map(|i| answer.candidate_words(i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| to_py(&e))?;
        Ok::<_, PyErr>((json, said, candidates))
    })?;
    let dicts = candidates
        .iter()
        .map(|(w, b)| words_dict(py, w, *b))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((json, said, dicts))
}

/// The words as the keyword dict `vramlab.plan` takes (what is at its default left out),
/// with the micro-batch.
fn words_dict<'py>(py: Python<'py>, w: &TrainWords, batch: u64) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let dflt = TrainWords::default();
    let dd = DistWords::default();
    macro_rules! opt {
        ($key:literal, $v:expr) => {
            if let Some(v) = &$v {
                d.set_item($key, v)?;
            }
        };
    }
    macro_rules! flag {
        ($key:literal, $v:expr) => {
            if $v {
                d.set_item($key, true)?;
            }
        };
    }
    opt!("model", w.model);
    d.set_item("batch", batch)?;
    opt!("seq", w.seq);
    opt!("image", w.image);
    opt!("target_seq", w.target_seq);
    opt!("precision", w.precision);
    opt!("optimizer", w.optimizer);
    if w.accum != dflt.accum {
        d.set_item("accum", w.accum)?;
    }
    flag!("checkpointing", w.checkpointing);
    flag!("checkpointing_reentrant", w.checkpointing_reentrant);
    if w.attention != dflt.attention {
        d.set_item("attention", &w.attention)?;
    }
    opt!("loop", w.loop_shape);
    opt!("step", w.step);
    opt!("finetune", w.finetune);
    opt!("lora_rank", w.lora_rank);
    opt!("lora_targets", w.lora_targets);
    opt!("lora_dropout", w.lora_dropout);
    flag!("freeze_embeddings", w.freeze_embeddings);
    opt!("freeze_blocks", w.freeze_blocks);
    flag!("lora_merged", w.lora_merged);
    opt!("quant", w.quant);
    flag!("no_double_quant", w.no_double_quant);
    opt!("moe_imbalance", w.moe_imbalance);
    flag!("expandable_segments", w.expandable_segments);
    opt!("max_split_size_mb", w.max_split_size_mb);
    opt!("gpu", w.gpu);
    if w.margin != dflt.margin {
        d.set_item("margin", w.margin)?;
    }
    let t = &w.dist;
    match t.gpus.as_deref().map(str::parse::<u64>) {
        Some(Ok(n)) => d.set_item("gpus", n)?,
        Some(Err(_)) => opt!("gpus", t.gpus),
        None => {}
    }
    opt!("nodes", t.nodes);
    opt!("strategy", t.strategy);
    opt!("offload", t.offload);
    flag!("no_reshard_after_forward", t.no_reshard_after_forward);
    opt!("fsdp_mixed_precision", t.fsdp_mixed_precision);
    opt!("bucket_cap_mb", t.bucket_cap_mb);
    flag!("gradient_as_bucket_view", t.gradient_as_bucket_view);
    opt!("reduce_bucket_size", t.reduce_bucket_size);
    opt!("allgather_bucket_size", t.allgather_bucket_size);
    opt!("overlap_comm", t.overlap_comm);
    flag!("no_contiguous_gradients", t.no_contiguous_gradients);
    opt!("stage3_prefetch_bucket_size", t.stage3_prefetch_bucket_size);
    opt!("stage3_max_live_parameters", t.stage3_max_live_parameters);
    opt!("stage3_max_reuse_distance", t.stage3_max_reuse_distance);
    opt!(
        "stage3_param_persistence_threshold",
        t.stage3_param_persistence_threshold
    );
    if t.max_gpus != dd.max_gpus {
        d.set_item("max_gpus", t.max_gpus)?;
    }
    Ok(d)
}

/// `vramlab export --format FORMAT` for the settings at `batch`: (the text, the format's
/// name, the notes said on the way). `graph`: a captured graph's text as the model.
#[pyfunction]
#[pyo3(signature = (settings, format, batch=None, graph=None))]
fn export_text(
    py: Python<'_>,
    settings: &Bound<'_, PyDict>,
    format: &str,
    batch: Option<&Bound<'_, PyAny>>,
    graph: Option<&str>,
) -> PyResult<(String, String, Vec<String>)> {
    let w = with_graph(words_of(settings)?, graph)?;
    let batch = batch_arg("batch", batch)?;
    py.detach(|| {
        let mut said = Vec::new();
        let (text, name) = w
            .export(format, batch, None, &no_detection, &mut |r| {
                said.push(remark_text(r));
            })
            .map_err(|e| to_py(&e))?;
        Ok((text, name.to_string(), said))
    })
}

/// The capture's settings in the core's canonical names (`fp16` is `amp-fp16`): (precision,
/// optimizer, loop, the notes said), each refused with the closest valid name.
#[pyfunction]
fn capture_words(
    precision: &str,
    optimizer: &str,
    loop_shape: &str,
) -> PyResult<(String, String, String, Vec<String>)> {
    let p = vocabulary::precision(precision)
        .map_err(|e| PyValueError::new_err(format!("precision: {e}")))?;
    let o = vocabulary::optimizer(optimizer)
        .map_err(|e| PyValueError::new_err(format!("optimizer: {e}")))?;
    let l: vramlab_core::plan::config::LoopShape = vramlab_words::parse(loop_shape)
        .map_err(|e| PyValueError::new_err(format!("loop: {e}")))?;
    let said = [&p.note, &o.note]
        .into_iter()
        .flatten()
        .map(|n| format!("note: {n}"))
        .collect();
    Ok((
        p.value.as_str().to_string(),
        o.value.as_str().to_string(),
        l.as_str().to_string(),
        said,
    ))
}

/// The embedded capture helper and its siblings: (module name, source) in import order.
#[pyfunction]
fn capture_sources() -> Vec<(&'static str, &'static str)> {
    CAPTURE_SOURCES.to_vec()
}

/// `vramlab max-batch … --json` for the settings: (the JSON text, the notes and warnings).
/// Even batch 1 not fitting is an answer (`max_batch` null), not an error.
#[pyfunction]
#[pyo3(signature = (settings, target_batch=None))]
fn max_batch_json(
    py: Python<'_>,
    settings: &Bound<'_, PyDict>,
    target_batch: Option<u64>,
) -> PyResult<(String, Vec<String>)> {
    let w = words_of(settings)?;
    py.detach(|| {
        let mut said = Vec::new();
        let report = w
            .max_batch_report(target_batch, &no_detection, &mut |r| {
                said.push(remark_text(r));
            })
            .map_err(|e| to_py(&e))?;
        if matches!(report.outcome, Outcome::Fits(_)) {
            train_words::check_target_batch(&report, target_batch).map_err(|e| to_py(&e))?;
        }
        let json =
            serde_json::to_string(&report).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((json, said))
    })
}

/// `vramlab doctor --message TEXT --snapshot FILE --json` (without `--model`): the OOM
/// message and/or the memory snapshot diagnosed, as JSON text. `device`: the snapshot's
/// device to replay; `timeline`: keep the snapshot's timeline (`--timeline`).
#[pyfunction]
#[pyo3(signature = (message=None, snapshot=None, device=None, timeline=false))]
fn doctor_json(
    py: Python<'_>,
    message: Option<String>,
    snapshot: Option<PathBuf>,
    device: Option<usize>,
    timeline: bool,
) -> PyResult<String> {
    if message.is_none() && snapshot.is_none() {
        return Err(PyValueError::new_err(
            "doctor: give the OOM message (its text or the exception) or a snapshot file",
        ));
    }
    py.detach(|| {
        let message = message
            .as_deref()
            .map(doctor_report::parse_message)
            .transpose()
            .map_err(|e| to_py(&e))?;
        let snapshot = snapshot
            .as_deref()
            .map(|p| doctor_report::load_snapshot(p, device, &mut |_, _| true))
            .transpose()
            .map_err(|e| to_py(&e))?;
        let r = DoctorReport::new(message, snapshot, None);
        let r = if timeline { r } else { r.without_timelines() };
        serde_json::to_string(&r).map_err(|e| PyValueError::new_err(e.to_string()))
    })
}

/// The catalog: `vramlab presets --json`'s GPUs (id, name, memory) as JSON text.
#[pyfunction]
fn gpus_json() -> PyResult<String> {
    serde_json::to_string(&vramlab_core::plan::gpus::catalog())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The built-in model ids.
#[pyfunction]
fn model_ids() -> PyResult<Vec<String>> {
    let presets = vramlab_core::model::preset::builtin_presets()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(presets.into_iter().map(|p| p.id).collect())
}

/// The native module.
#[pymodule]
fn _vramlab(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Planned>()?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan_json, m)?)?;
    m.add_function(wrap_pyfunction!(max_batch_json, m)?)?;
    m.add_function(wrap_pyfunction!(fit_json, m)?)?;
    m.add_function(wrap_pyfunction!(export_text, m)?)?;
    m.add_function(wrap_pyfunction!(capture_words, m)?)?;
    m.add_function(wrap_pyfunction!(capture_sources, m)?)?;
    m.add_function(wrap_pyfunction!(doctor_json, m)?)?;
    m.add_function(wrap_pyfunction!(gpus_json, m)?)?;
    m.add_function(wrap_pyfunction!(model_ids, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("KEYWORDS", KEYWORDS.to_vec())?;
    Ok(())
}
