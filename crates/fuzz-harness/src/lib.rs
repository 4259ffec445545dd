//! The bodies of the fuzz targets in `fuzz/`, as plain functions: the targets call them,
//! and `tests/replay.rs` runs every input of their corpora (and every past crash) through
//! them in an ordinary `cargo test`, so CI replays what the fuzzers found.
//!
//! Each function returns quietly on input that is rejected with an error; a panic is a bug.

use arbitrary::{Arbitrary, Unstructured};
use clap::Parser as _;
use serde_json::Value;
use vramlab::cli::{Cli, Command, run};
use vramlab_core::doctor::pickle::{Limits, read_pickle_bytes};
use vramlab_core::doctor::{Snapshot, analyze, diagnose, parse_message};
use vramlab_core::export::{Format, VramlabConfig, render};
use vramlab_core::model::Preset;
use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::preset::{BUILTIN, find_builtin};
use vramlab_core::plan::config::{AllocatorConfig, LoopShape, MAX_ACCUM, MAX_BATCH};
use vramlab_core::plan::search::{Budget, max_batch_capped, sweep_allocated};
use vramlab_core::plan::step_kind::StepKind;
use vramlab_core::plan::{Attention, Gpu, Optimizer, Planner, Precision, TrainConfig};
use vramlab_core::units::Bytes;

/// A fuzz target's body: any bytes in, a panic only on a bug.
pub type Target = fn(&[u8]);

/// The fuzz targets, by the names `fuzz/Cargo.toml` gives them.
pub const TARGETS: [(&str, Target); 10] = [
    ("captured_graph", captured_graph),
    ("cli_args", cli_args),
    ("hf_config", hf_config),
    ("hostile_preset", hostile_preset),
    ("preset_json", preset_json),
    ("safetensors_header", safetensors_header),
    ("safetensors_index", safetensors_index),
    ("snapshot_pickle", snapshot_pickle),
    ("units", units),
    ("vramlab_config", vramlab_config),
];

/// Plans `preset` under `cfg` at a small batch; any error is fine, a panic is a bug.
pub fn plan_small(preset: &Preset, cfg: &TrainConfig) {
    let Ok(planner) = Planner::new(preset, cfg) else {
        return;
    };
    let batch = cfg.batch.clamp(1, 8);
    if let Ok(plan) = planner.plan(batch) {
        assert!(plan.peak_reserved_bytes >= plan.peak_allocated_bytes);
        for f in Format::ALL {
            let _ = render(f, cfg, &plan, "{}", preset.hub_id());
        }
    }
    let _ = sweep_allocated(&planner, [1, 2, 1 << 20, u64::MAX]);
    let _ = max_batch_capped(&planner, Bytes::gib(24), 64);
    let budget = Budget {
        capacity: Bytes::gib(80),
        margin: 0.05,
    };
    let _ = vramlab_core::plan::search::fits(&planner, budget, batch);
}

/// Command lines: clap parsing of every subcommand, then `plan` and `max-batch` for real
/// (built-in models only: file paths would make the fuzzer read or write files).
pub fn cli_args(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args = std::iter::once("vramlab").chain(text.split('\n'));
    let Ok(cli) = Cli::try_parse_from(args) else {
        return;
    };
    let train = match &cli.command {
        Some(Command::Plan(a)) => &a.train,
        Some(Command::MaxBatch(a)) => &a.train,
        _ => return,
    };
    let builtin = train
        .model
        .as_deref()
        .is_some_and(|m| find_builtin(m).is_ok());
    if train.config.is_some() || !builtin {
        return;
    }
    if let Some(cmd) = cli.command {
        let _ = run(cmd, &mut std::io::sink());
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    model: u8,
    /// (which numeric field, new value); floats are taken from the bits.
    overrides: Vec<(u8, u64)>,
    size: Option<u64>,
    batch: u64,
    accum: u64,
    precision: u8,
    optimizer: u8,
    checkpointing: bool,
    eager: bool,
    split: Option<u64>,
    /// Last, so that the corpus kept before it existed decodes as it did.
    trainer_loop: bool,
}

/// Paths of the numeric leaves of `v`.
fn numbers(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Number(_) => out.push(path.clone()),
        Value::Object(m) => {
            for (k, c) in m {
                path.push(k.clone());
                numbers(c, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                path.push(i.to_string());
                numbers(c, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn leaf<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| match v {
        Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        other => other.get_mut(k.as_str()),
    })
}

/// Built-in presets with numbers overridden by the fuzzer (any u64, any float): the JSON
/// parser is bypassed so that every input is a parseable model with hostile sizes, and the
/// graph builder and planner see it.
pub fn hostile_preset(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let (_, text) = BUILTIN[usize::from(input.model) % BUILTIN.len()];
    let Ok(mut doc) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let mut paths = Vec::new();
    numbers(&doc, &mut Vec::new(), &mut paths);
    if paths.is_empty() {
        return;
    }
    for &(which, value) in input.overrides.iter().take(8) {
        let path = &paths[usize::from(which) % paths.len()];
        if let Some(slot) = leaf(&mut doc, path) {
            *slot = if slot.is_f64() {
                serde_json::json!(f64::from_bits(value))
            } else {
                serde_json::json!(value)
            };
        }
    }
    let Ok(preset) = Preset::from_value(&doc) else {
        return;
    };
    let cfg = TrainConfig {
        // Mostly within the limits, so that the model's numbers are what is hostile.
        batch: input.batch % (MAX_BATCH + 2),
        size: input.size,
        target_seq: None,
        precision: Precision::ALL[usize::from(input.precision) % Precision::ALL.len()],
        optimizer: Optimizer::ALL[usize::from(input.optimizer) % Optimizer::ALL.len()],
        accum: input.accum % (MAX_ACCUM + 2),
        checkpointing: input.checkpointing,
        // Reentrant on some checkpointed inputs (no new byte: corpora stay valid).
        checkpoint_reentrant: input.checkpointing && input.eager,
        attention: if input.eager {
            Attention::Eager
        } else {
            Attention::Sdpa
        },
        allocator: AllocatorConfig {
            expandable_segments: false,
            max_split_size_mb: input.split,
        },
        loop_shape: if input.trainer_loop {
            LoopShape::Trainer
        } else {
            LoopShape::Plain
        },
        finetune: Default::default(),
        // The precision byte's high bits pick the step (its low bits pick the precision).
        step: StepKind::ALL[usize::from(input.precision >> 4) % StepKind::ALL.len()],
        distributed: Default::default(),
        moe_imbalance: 1.0,
    };
    plan_small(&preset, &cfg);
}

/// Preset documents (custom model files): parse, build the graph at a few sizes, plan.
pub fn preset_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(preset) = Preset::from_json(text) else {
        return;
    };
    // The document must survive a round trip.
    let back = Preset::from_json(&preset.to_json()).expect("a parsed preset re-parses");
    assert_eq!(back, preset);
    let size = preset.default_size();
    for s in [1, size.min(64), size] {
        let _ = preset.build(s, AttnImpl::Eager);
    }
    // Plan at the default size and at a small one, in two precisions.
    for (size, precision, checkpointing) in [
        (None, Precision::AmpBf16, false),
        (Some(size.min(32)), Precision::Fp32, true),
    ] {
        let cfg = TrainConfig {
            batch: 2,
            size,
            precision,
            checkpointing,
            attention: Attention::Eager,
            ..TrainConfig::default()
        };
        plan_small(&preset, &cfg);
    }
}

/// Number and name parsers of the CLI and the GUI: byte sizes with units, precision,
/// optimizer, attention, export format, GPU ids, and GPU catalog entries.
pub fn units(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(b) = vramlab_words::sizes::bytes(text) {
        // Display and the round trip through the display form never panic.
        let shown = b.to_string();
        let _ = vramlab_words::sizes::bytes(&shown.replace(' ', ""));
        let _ = b.as_gib_f64();
    }
    let _ = vramlab_words::parse::<Precision>(text);
    let _ = vramlab_words::parse::<Optimizer>(text);
    let _ = vramlab_words::parse::<Attention>(text);
    let _ = vramlab_words::vocabulary::format(text);
    let _ = vramlab_words::find_gpu(text);
    let _ = text.parse::<u64>();
    if let Ok(gpu) = serde_json::from_str::<Gpu>(text) {
        for margin in [0.0, 0.05, 0.999, f64::NAN, -1.0] {
            let budget = Budget {
                capacity: gpu.memory(),
                margin,
            };
            let _ = budget.allocator_cap(Bytes::mib(782));
        }
    }
}

/// `.vramlab.json` documents: parse, resolve the model and the GPU, plan.
pub fn vramlab_config(data: &[u8]) {
    let Ok(doc) = VramlabConfig::from_bytes(data) else {
        return;
    };
    // What was accepted is written back and read again identically.
    let back = VramlabConfig::from_bytes(doc.to_json().as_bytes()).expect("re-parses");
    assert_eq!(back.training, doc.training);
    let _ = vramlab_words::find_gpu(&doc.gpu);
    if let Ok(preset) = doc.preset() {
        plan_small(&preset, &doc.training);
    }
}

/// The OOM doctor's readers on hostile input: the safe pickle reader, the snapshot typing
/// and replay, and the OOM message parser must reject or read anything without panicking,
/// executing nothing and staying within their limits.
pub fn snapshot_pickle(data: &[u8]) {
    let limits = Limits {
        max_nodes: 1 << 20,
        max_string_bytes: 1 << 20,
        max_stack: 1 << 16,
        max_memo: 1 << 20,
    };
    // The reader before issue 32 is the oracle: both read a file or both refuse it, and
    // what both read is typed identically.
    let current = vramlab_core::doctor::read_snapshot(data, &mut |_| true);
    let legacy = vramlab_core::doctor::legacy::read_snapshot_legacy(data, &mut |_| true);
    match (&current, &legacy) {
        (Ok(c), Ok(l)) => assert_eq!(format!("{c:?}"), format!("{l:?}"), "the readers differ"),
        (Err(_), Err(_)) => {}
        (c, l) => panic!(
            "one reader refused: current {:?}, legacy {:?}",
            c.as_ref().err(),
            l.as_ref().err()
        ),
    }
    if let Ok(p) = read_pickle_bytes(data, limits) {
        let _ = p.to_json(p.root, 8);
        if let Ok(s) = Snapshot::from_pickle(&p)
            && let Ok(r) = analyze(&s, None)
        {
            let _ = diagnose(None, Some(&r));
        }
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Some(m) = parse_message(text)
    {
        let _ = diagnose(Some(&m), None);
    }
}

/// Hugging Face config.json import: parse, build, plan small; never a panic.
pub fn hf_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(preset) = vramlab_core::model::hf::from_config_text(text, "fuzz") else {
        return;
    };
    for (size, precision, checkpointing) in [
        (Some(8), Precision::AmpBf16, false),
        (Some(16), Precision::Fp32, true),
    ] {
        let cfg = TrainConfig {
            batch: 2,
            size,
            precision,
            checkpointing,
            ..TrainConfig::default()
        };
        plan_small(&preset, &cfg);
    }
}

/// A safetensors file's start (a model folder's shard): the 8-byte header length, then the
/// JSON header; the stored dtypes read within `MAX_HEADER_BYTES`, or an error; never a
/// panic. The reader counts what it hands out, so a read past the bound is caught.
pub fn safetensors_header(data: &[u8]) {
    struct Counted<'a> {
        data: &'a [u8],
        read: u64,
    }
    impl std::io::Read for Counted<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = std::io::Read::read(&mut self.data, buf)?;
            self.read += n as u64;
            Ok(n)
        }
    }
    let mut r = Counted { data, read: 0 };
    let mut w = vramlab_hub::Weights::default();
    let ok = vramlab_hub::folder::parse_header(&mut r, &mut w).is_ok();
    assert!(r.read <= 8 + vramlab_hub::folder::MAX_HEADER_BYTES);
    if ok {
        // A header of N bytes after its 8-byte length: nothing after it was needed.
        let len = data
            .get(..8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes);
        assert!(len.is_some_and(|n| r.read >= 8 + n));
        assert_eq!(
            w.elements.keys().collect::<Vec<_>>(),
            w.bytes.keys().collect::<Vec<_>>()
        );
        assert!(w.tensors as usize >= w.elements.len());
    }
}

/// `model.safetensors.index.json`: the shard names, each a file name of the folder (never a
/// path out of it), or an error; never a panic.
pub fn safetensors_index(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(names) = vramlab_hub::folder::parse_index(text) {
        for n in &names {
            assert!(!n.is_empty() && !n.contains(['/', '\\']) && n != ".." && n != ".");
        }
        assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
    }
}

/// A captured graph file (`*.vramlab-graph.json`): parse, fit, plan at a few batches with
/// its own settings and with others (refused); never a panic.
pub fn captured_graph(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(preset) = Preset::from_captured("fuzz", text) else {
        return;
    };
    let vramlab_core::model::ModelSpec::Captured(c) = &preset.spec else {
        return;
    };
    let own = TrainConfig {
        batch: 2,
        precision: vramlab_words::vocabulary::precision(&c.settings.precision)
            .map_or(Precision::AmpBf16, |r| r.value),
        checkpointing: c.settings.checkpointing,
        ..TrainConfig::default()
    };
    plan_small(&preset, &own);
    plan_small(
        &preset,
        &TrainConfig {
            precision: Precision::Fp32,
            accum: 2,
            ..own
        },
    );
}
