//! `vramlab._vramlab`: the native module of the `vramlab` Python package. It reads the
//! settings as the CLI's words (a dict of the Python keywords, `seq`, `precision`, …),
//! resolves them with the core's [`vramlab_core::answer::words`] and answers with the core's
//! reports, serialised as the CLI's `--json`: `plan(...).to_json()` is `vramlab plan …
//! --json`, byte for byte. The Python wrappers (`python/vramlab/__init__.py`) give the
//! answers their typed attributes.

use std::path::PathBuf;
use std::sync::OnceLock;

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyDictMethods};

use vramlab_core::answer::doctor_report::{self, DoctorReport};
use vramlab_core::answer::max_batch::Outcome;
use vramlab_core::answer::report::PlanStart;
use vramlab_core::answer::words::{self, Remark, TrainWords, WordsError};
use vramlab_core::names;

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

fn to_py(e: &WordsError) -> PyErr {
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

/// The settings dict as the core's words; an unknown keyword is refused with the closest
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

/// Plans the settings at `batch` (`None`: the saved config's); `timeline`: keep the
/// allocated timeline in the report's JSON (`--timeline`).
#[pyfunction]
#[pyo3(signature = (settings, batch=None, timeline=false))]
fn plan(
    py: Python<'_>,
    settings: &Bound<'_, PyDict>,
    batch: Option<&Bound<'_, PyAny>>,
    timeline: bool,
) -> PyResult<Planned> {
    let w = words_of(settings)?;
    let batch = batch_arg(batch)?;
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
    let planned = plan(py, settings, batch, timeline)?;
    Ok((planned.report_json(py)?, planned.notes))
}

/// `batch=`: a whole number of at least 1, or `None`.
fn batch_arg(batch: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    match batch {
        Some(b) if !b.is_none() => {
            let n: i128 = b.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "batch: expected a whole number (int) of at least 1, got {}",
                    b.repr().map_or_else(|_| "?".to_string(), |r| r.to_string())
                ))
            })?;
            words::batch_of(n)
                .map(Some)
                .map_err(|e| PyValueError::new_err(format!("batch: {e}")))
        }
        _ => Ok(None),
    }
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
            words::check_target_batch(&report, target_batch).map_err(|e| to_py(&e))?;
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
    m.add_function(wrap_pyfunction!(doctor_json, m)?)?;
    m.add_function(wrap_pyfunction!(gpus_json, m)?)?;
    m.add_function(wrap_pyfunction!(model_ids, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("KEYWORDS", KEYWORDS.to_vec())?;
    Ok(())
}
