//! Property tests of the planner over random valid configurations (issue 6): what must hold
//! for every model, precision, optimizer, accumulation, checkpointing, attention, input
//! size and batch, and that absurd inputs give errors, never panics or overflow.
//!
//! The models are the built-in presets. Most cases use a shallow variant of a preset (the
//! same family and widths, at most two layers per stage) so that ten thousand cases stay
//! fast in a debug build; one case in five uses the preset exactly as shipped.
//! `PROPTEST_CASES` scales every property (it replaces the per-property counts below).

use std::sync::LazyLock;

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::Value;

use vramlab_core::model::preset::BUILTIN;
use vramlab_core::model::{ModelSpec, Preset};
use vramlab_core::plan::config::{AllocatorConfig, LoopShape};
use vramlab_core::plan::gpus;
use vramlab_core::plan::remedies::remedies;
use vramlab_core::plan::search::{Budget, max_batch, max_batch_capped};
use vramlab_core::plan::step_kind::StepKind;
use vramlab_core::plan::{
    Attention, Category, Optimizer, PlanError, Planner, Precision, TrainConfig,
};
use vramlab_core::units::Bytes;

/// A model and the input sizes that are valid for it.
struct Model {
    preset: Preset,
    /// Valid sizes are `step × k` for `k` in `lo..=hi`.
    step: u64,
    lo: u64,
    hi: u64,
}

impl Model {
    fn size(&self, pick: u64) -> u64 {
        self.step * (self.lo + pick % (self.hi - self.lo + 1))
    }
}

/// Keeps at most `keep` layers per stage: the model stays valid and of the same family.
fn shrink(params: &mut Value, keep: u64) {
    let Some(obj) = params.as_object_mut() else {
        return;
    };
    for key in ["n_layer", "num_layers", "num_hidden_layers"] {
        if let Some(n) = obj.get(key).and_then(Value::as_u64) {
            obj.insert(key.into(), n.min(keep).into());
        }
    }
    for key in ["layers", "depths", "backbone_layers"] {
        if let Some(list) = obj.get_mut(key).and_then(Value::as_array_mut) {
            for n in list.iter_mut() {
                if let Some(k) = n.as_u64() {
                    *n = k.min(keep).into();
                }
            }
        }
    }
    if obj.get("depth_mult").and_then(Value::as_f64).is_some() {
        obj.insert("depth_mult".into(), 0.25.into());
    }
}

fn model(preset: Preset) -> Model {
    let default = preset.default_size();
    let (step, lo, hi) = if preset.input.is_tokens() {
        (1, 1, default.min(192))
    } else {
        match preset.spec.family() {
            "vit" => match &preset.spec {
                ModelSpec::Vit(v) => (v.patch_size, 1, 4),
                _ => unreachable!("family vit"),
            },
            "unet" => (16, 1, 6),
            _ => (1, 8, 96),
        }
    };
    Model {
        preset,
        step,
        lo,
        hi,
    }
}

/// Shallow variants of every built-in preset, then the presets as shipped.
static MODELS: LazyLock<(Vec<Model>, Vec<Model>)> = LazyLock::new(|| {
    let mut shallow = Vec::new();
    let mut full = Vec::new();
    for (id, text) in BUILTIN {
        let mut v: Value = serde_json::from_str(text).expect("built-in preset is JSON");
        let preset = Preset::from_value(&v).expect("built-in preset parses");
        full.push(model(preset));
        if let Some(p) = v.get_mut("params") {
            shrink(p, 2);
        }
        let preset = Preset::from_value(&v).unwrap_or_else(|e| panic!("shallow {id}: {e}"));
        shallow.push(model(preset));
    }
    for m in shallow.iter().chain(&full) {
        let size = m.size(0);
        assert!(
            m.preset
                .build(
                    size,
                    vramlab_core::model::families::transformer::AttnImpl::Sdpa
                )
                .is_ok(),
            "{} at size {size}",
            m.preset.id
        );
    }
    (shallow, full)
});

/// One random valid configuration of one model.
#[derive(Debug, Clone)]
struct Case {
    /// Index into the shallow or the full model list.
    model: usize,
    full: bool,
    size_pick: u64,
    cfg: TrainConfig,
}

impl Case {
    fn model(&self) -> &'static Model {
        let (shallow, full) = &*MODELS;
        let list = if self.full { full } else { shallow };
        &list[self.model % list.len()]
    }

    fn size(&self) -> u64 {
        self.model().size(self.size_pick)
    }

    fn config(&self) -> TrainConfig {
        TrainConfig {
            size: Some(self.size()),
            ..self.cfg
        }
    }

    fn planner(&self, cfg: &TrainConfig) -> Planner {
        Planner::new(&self.model().preset, cfg)
            .unwrap_or_else(|e| panic!("{} {cfg:?}: {e}", self.model().preset.id))
    }
}

fn precision() -> impl Strategy<Value = Precision> {
    prop::sample::select(Precision::ALL.to_vec())
}

fn optimizer() -> impl Strategy<Value = Optimizer> {
    prop::sample::select(Optimizer::ALL.to_vec())
}

fn train_config() -> impl Strategy<Value = TrainConfig> {
    (
        precision(),
        optimizer(),
        prop_oneof![3 => Just(1u64), 1 => 2u64..=8],
        any::<bool>(),
        (
            prop_oneof![Just(Attention::Sdpa), Just(Attention::Eager)],
            prop_oneof![Just(LoopShape::Plain), Just(LoopShape::Trainer)],
            prop_oneof![
                4 => Just(StepKind::Train),
                1 => Just(StepKind::Eval),
                1 => Just(StepKind::EvalGrad),
            ],
        ),
        prop_oneof![
            4 => Just(AllocatorConfig::default()),
            1 => Just(AllocatorConfig { expandable_segments: true, max_split_size_mb: None }),
            1 => (21u64..=4096).prop_map(|mb| AllocatorConfig {
                expandable_segments: false,
                max_split_size_mb: Some(mb),
            }),
        ],
    )
        .prop_map(
            |(
                precision,
                optimizer,
                accum,
                checkpointing,
                (attention, loop_shape, step),
                allocator,
            )| {
                TrainConfig {
                    batch: 1,
                    size: None,
                    target_seq: None,
                    precision,
                    optimizer,
                    accum,
                    checkpointing,
                    checkpoint_reentrant: false,
                    attention,
                    allocator,
                    loop_shape,
                    finetune: Default::default(),
                    step,
                    distributed: Default::default(),
                    moe_imbalance: 1.0,
                }
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<usize>(),
        prop::bool::weighted(0.2),
        any::<u64>(),
        train_config(),
    )
        .prop_map(|(model, full, size_pick, cfg)| Case {
            model,
            full,
            size_pick,
            cfg,
        })
}

/// Micro-batches: mostly small, sometimes large.
fn batch() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 1u64..=16, 1 => 17u64..=512]
}

fn peak(p: &Planner, batch: u64) -> u64 {
    p.peaks(batch)
        .unwrap_or_else(|e| panic!("{} batch {batch}: {e}", p.model))
        .allocated
        .0
}

/// Bytes the caching allocator hands out for a request (512-byte blocks).
fn block(bytes: u64) -> u64 {
    bytes.div_ceil(512).max(1) * 512
}

/// Bytes of one category's buffers allocated in the measured step or before it
/// (parameters, gradients and optimizer state are batch-independent).
fn persistent(p: &Planner, c: Category) -> u64 {
    let ev = &p.events;
    let mut live = vec![false; ev.buffers.len()];
    for e in &ev.events {
        live[e.buffer as usize] = e.alloc;
    }
    // Buffers alive at the end of the measured step (parameters, optimizer state; the
    // gradients of this step), counted once.
    ev.buffers
        .iter()
        .zip(&live)
        .filter(|(b, l)| **l && b.category == c)
        .map(|(b, _)| block(b.fixed))
        .sum()
}

/// Bytes of the inputs of every checkpoint block (fp32, the widest dtype they can have).
fn block_inputs(g: &vramlab_core::model::Graph, batch: u64) -> u64 {
    let mut total = 0;
    for id in 0..g.block_count() {
        let nodes: Vec<_> = g.nodes.iter().filter(|n| n.block == Some(id)).collect();
        let mut seen = Vec::new();
        for n in &nodes {
            for &t in &n.inputs {
                if !seen.contains(&t) && !nodes.iter().any(|m| m.output == t) {
                    seen.push(t);
                    let elems = g.tensors[t].per_sample * batch + g.tensors[t].fixed;
                    total += block(4 * elems);
                }
            }
        }
    }
    total
}

fn cases(n: u32) -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(n),
        // Failures print their minimal case; no regression files in the source tree.
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(cases(2500))]

    /// Peak allocated never decreases with the batch; reserved ≥ allocated; nvidia-smi is
    /// reserved plus the CUDA context.
    #[test]
    fn peak_grows_with_batch(c in case(), mut batches in prop::collection::vec(batch(), 2..5)) {
        batches.sort_unstable();
        let p = c.planner(&c.config());
        let mut last = 0;
        for &b in &batches {
            let peaks = p.peaks(b).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(peaks.allocated.0 >= last, "batch {b}: {} < {last}", peaks.allocated.0);
            prop_assert!(peaks.reserved >= peaks.allocated);
            prop_assert_eq!(peaks.nvidia_smi.0, peaks.reserved.0 + p.context.0);
            last = peaks.allocated.0;
        }
    }
}

proptest! {
    #![proptest_config(cases(1200))]

    /// Peak allocated never decreases with the sequence length or image side.
    #[test]
    fn peak_grows_with_input_size(c in case(), other in any::<u64>(), b in batch()) {
        let m = c.model();
        let (s1, s2) = {
            let (a, z) = (c.size(), m.size(other));
            (a.min(z), a.max(z))
        };
        let small = c.planner(&TrainConfig { size: Some(s1), ..c.cfg });
        let large = c.planner(&TrainConfig { size: Some(s2), ..c.cfg });
        let (p1, p2) = (peak(&small, b), peak(&large, b));
        prop_assert!(p1 <= p2, "{} size {s1}: {p1} > size {s2}: {p2}", m.preset.id);
    }

    /// Activation checkpointing never raises the peak by more than the block inputs the
    /// checkpoint holds. The issue asked for "never raises the peak", which PyTorch does not
    /// promise: `torch.utils.checkpoint` keeps every block's input until that block's
    /// backward, where without checkpointing the input may already be gone (under autocast
    /// the first op saves only its bf16 cast, and a residual add saves nothing). When the
    /// peak falls in the backward of the first block at a tiny input, nothing else is saved
    /// and the held input is pure extra. Minimal case found by this test: convnext_tiny,
    /// 8×8 images, batch 1, amp-bf16, SGD: +1536 B (the fp32 stem output) on 298 MB.
    #[test]
    fn checkpointing_adds_at_most_the_held_block_inputs(c in case(), b in batch()) {
        let plain = c.planner(&TrainConfig { checkpointing: false, ..c.config() });
        let ckpt = c.planner(&TrainConfig { checkpointing: true, ..c.config() });
        let held = block_inputs(&plain.graph, b);
        let (p0, p1) = (peak(&plain, b), peak(&ckpt, b));
        prop_assert!(
            p1 <= p0 + held,
            "{} batch {b}: checkpointing {p1} > {p0} + held inputs {held}",
            c.model().preset.id
        );
    }

}

proptest! {
    #![proptest_config(cases(1000))]

    /// Gradient accumulation, as PyTorch runs it. The issue asked for "accumulation never
    /// raises the peak above the same micro-batch without accumulation", but that is not what
    /// PyTorch does: with `accum ≥ 2` the gradients of the first micro-step stay allocated
    /// (they are being accumulated into) while the second micro-step runs its forward, where
    /// without accumulation `zero_grad(set_to_none=True)` has freed them. Measured on the H200
    /// (tests/data), the peak with accumulation is higher by up to the gradient bytes. So:
    /// - the micro-step without accumulation is part of the step with it: `p(1) ≤ p(k)`;
    /// - the extra is at most the persistent gradients: `p(k) ≤ p(1) + gradient bytes`;
    /// - every micro-step after the second repeats it: `p(k) = p(2)` for `k ≥ 2`.
    #[test]
    fn accumulation_adds_at_most_the_gradients(c in case(), k in 2u64..=64, b in batch()) {
        let base = c.config();
        let one = c.planner(&TrainConfig { accum: 1, ..base });
        let two = c.planner(&TrainConfig { accum: 2, ..base });
        let many = c.planner(&TrainConfig { accum: k, ..base });
        let grads = persistent(&one, Category::Gradients);
        let (p1, p2, pk) = (peak(&one, b), peak(&two, b), peak(&many, b));
        let id = &c.model().preset.id;
        prop_assert!(p1 <= p2, "{id} batch {b}: accum 2 {p2} < accum 1 {p1}");
        prop_assert!(p2 <= p1 + grads, "{id} batch {b}: accum 2 {p2} > {p1} + grads {grads}");
        prop_assert_eq!(p2, pk, "{} batch {}: accum {} differs from accum 2", id, b, k);
    }

}

proptest! {
    #![proptest_config(cases(2000))]

    /// Parameters, gradients and optimizer state follow the fp32 master-weight rules: AMP
    /// keeps them exactly as in fp32; pure bf16 never has more.
    #[test]
    fn low_precision_never_adds_weight_bytes(c in case()) {
        let cfg = c.config();
        let fp32 = c.planner(&TrainConfig { precision: Precision::Fp32, ..cfg });
        let mixed = c.planner(&cfg);
        let weights = |p: &Planner| {
            [Category::Parameters, Category::Gradients, Category::OptimizerState]
                .map(|k| persistent(p, k))
        };
        let (w32, w) = (weights(&fp32), weights(&mixed));
        // The fp32 figures are exactly what the rules give for the graph's parameters.
        let g = &fp32.graph;
        let params: u64 = g.params.iter().map(|p| block(4 * p.elems)).sum();
        let state: u64 = g
            .params
            .iter()
            .map(|p| match cfg.optimizer {
                Optimizer::Sgd => 0,
                Optimizer::SgdMomentum => block(4 * p.elems),
                Optimizer::Adam | Optimizer::AdamW => 2 * block(4 * p.elems),
                Optimizer::Adafactor => match p.matrix {
                    Some((r, col)) => block(4 * (p.elems / col)) + block(4 * (p.elems / r)),
                    None => block(4 * p.elems),
                },
                // bitsandbytes 0.50: fp32 states under 4096 elements, else two uint8
                // states and two fp32 scales per 256 elements; paged states (>= 100 000
                // elements) are not on the caching allocator.
                Optimizer::Adam8bit | Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit
                    if p.elems < 4096 =>
                {
                    2 * block(4 * p.elems)
                }
                Optimizer::PagedAdamW8bit if p.elems >= 100_000 => {
                    2 * block(4 * p.elems.div_ceil(256))
                }
                Optimizer::Adam8bit | Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit => {
                    2 * block(p.elems) + 2 * block(4 * p.elems.div_ceil(256))
                }
                Optimizer::PagedAdamW if p.elems >= 100_000 => 0,
                Optimizer::PagedAdamW => 2 * block(4 * p.elems),
            })
            .sum();
        prop_assert_eq!(w32, [params, params, state]);
        if cfg.precision.param_dtype() == Precision::Fp32.param_dtype() {
            prop_assert_eq!(w, w32);
        } else {
            for (i, (lo, hi)) in w.iter().zip(&w32).enumerate() {
                prop_assert!(lo <= hi, "category {i}: {lo} > fp32 {hi}");
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(600))]

    /// The full plan agrees with the quick peaks, and its breakdown adds up to the peak.
    #[test]
    fn plan_breakdown_adds_up(c in case(), b in batch()) {
        let p = c.planner(&c.config());
        let plan = p.plan(b).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let peaks = p.peaks(b).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(plan.peak_allocated_bytes, peaks.allocated);
        prop_assert_eq!(plan.peak_reserved_bytes, peaks.reserved);
        prop_assert_eq!(plan.nvidia_smi_bytes, peaks.nvidia_smi);
        let live: u64 = Category::ALL.iter().map(|&k| plan.category_bytes(k).0).sum();
        prop_assert_eq!(live, plan.peak_allocated_bytes.0);
        let max_point = plan.timeline.iter().map(|t| t.allocated.0).max().unwrap_or(0);
        prop_assert!(max_point <= plan.peak_allocated_bytes.0);
    }

    /// Under a cap at or above the uncapped peak reserved the capped allocator runs as the
    /// uncapped one (`Planner::reserved_within_given` skips its simulation there), and
    /// every cap gives what the capped simulation gives. The allocator settings are drawn
    /// too (expandable segments reserve differently).
    #[test]
    fn reserved_within_a_cap_above_the_peak_is_the_peak(
        c in case(),
        b in batch(),
        factor in 0.3f64..3.0,
        expandable in any::<bool>(),
    ) {
        let mut cfg = c.config();
        cfg.allocator = AllocatorConfig {
            expandable_segments: expandable,
            ..cfg.allocator
        };
        let p = c.planner(&cfg);
        let peaks = p.peaks(b).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for cap in [peaks.reserved, Bytes((peaks.reserved.0 as f64 * factor) as u64)] {
            let capped = p.reserved_within(b, cap).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let given = p
                .reserved_within_given(b, cap, peaks.reserved)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(given, capped, "cap {}", cap);
        }
    }

    /// The largest batch runs under the cap and the next one does not (the simulated
    /// allocator need not be monotone in the batch, so nothing more is promised).
    #[test]
    fn max_batch_fits_and_one_more_does_not(c in case(), factor in 0.5f64..40.0, limit in 1u64..=2048) {
        let p = c.planner(&c.config());
        let one = p.peaks(1).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let cap = Bytes((one.reserved.0 as f64 * factor) as u64);
        let got = max_batch_capped(&p, cap, limit).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let runs = |b: u64| p.runs_within(b, cap).unwrap_or(false);
        match got {
            Some(m) => {
                prop_assert!((1..=limit).contains(&m), "{m} outside 1..={limit}");
                prop_assert!(runs(m), "batch {m} does not run under {cap}");
                if m < limit {
                    prop_assert!(!runs(m + 1), "batch {} also runs under {cap}", m + 1);
                }
            }
            None => prop_assert!(!runs(1), "batch 1 runs under {cap} but none was found"),
        }
    }
}

/// Any u64, biased to the edges where overflow hides, and half the time a valid value
/// (so that the other fields' absurdity is reached past validation).
fn wild_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 1u64..=64,
        1 => Just(0u64),
        1 => Just(1u64 << 16),
        1 => Just(1u64 << 20),
        1 => Just((1u64 << 20) + 1),
        1 => Just(u64::MAX),
        1 => Just(u64::MAX / 2),
        1 => (1u64 << 20)..=(1u64 << 40),
        1 => any::<u64>(),
    ]
}

fn wild_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(0.0),
        Just(0.999_999),
        Just(1.0),
        0.0f64..1.0,
        any::<f64>(),
    ]
}

proptest! {
    #![proptest_config(cases(3000))]

    /// Absurd inputs give errors, never panics or wrapped numbers.
    #[test]
    fn absurd_inputs_are_errors_not_panics(
        c in case(),
        batch in wild_u64(),
        size in prop::option::of(wild_u64()),
        accum in wild_u64(),
        split in prop::option::of(wild_u64()),
        expandable in any::<bool>(),
        gpu in any::<prop::sample::Index>(),
        memory in prop::option::of(wild_u64()),
        margin in wild_f64(),
        search in prop::bool::weighted(0.1),
    ) {
        let cfg = TrainConfig {
            batch,
            size,
            accum,
            allocator: AllocatorConfig { expandable_segments: expandable, max_split_size_mb: split },
            ..c.cfg
        };
        let preset = &c.model().preset;
        let planner = match Planner::new(preset, &cfg) {
            Ok(p) => p,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        let peaks = planner.peaks(batch);
        match &peaks {
            Ok(p) => prop_assert!(p.reserved >= p.allocated && p.nvidia_smi >= p.reserved),
            Err(e) => prop_assert!(matches!(e, PlanError::Overflow(_) | PlanError::Field { .. }), "{e}"),
        }
        let plan = planner.plan(batch);
        prop_assert_eq!(plan.is_ok(), peaks.is_ok() && cfg.validate().is_ok());
        if search {
            let catalog = gpus::catalog();
            let capacity = match memory {
                Some(m) => Bytes(m),
                None => gpu.get(&catalog).memory(),
            };
            let budget = Budget { capacity, margin };
            let found = max_batch(&planner, budget, 1 << 20);
            prop_assert!(found.is_ok(), "{:?}", found);
            if cfg.validate().is_ok() && batch <= 1 << 16 && !c.full {
                // Remedies plan up to eight configurations: only where it stays quick.
                prop_assert!(remedies(preset, &cfg, budget).is_ok() || peaks.is_err());
            }
        }
    }
}
