//! DeepSpeed's ZeRO knobs and PyTorch's ZeRO-1, planned per rank: numbers computed by hand
//! from DeepSpeed 0.19.8's and torch 2.11's source (file:line quoted at each check).

use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::distributed::{Distributed, Strategy, torch_zero1_owned};
use vramlab_core::plan::{Category, Plan, Planner, Precision, TrainConfig};

fn plan(precision: Precision, d: Distributed) -> Plan {
    let preset = find_builtin("gpt2").expect("gpt2");
    let cfg = TrainConfig {
        batch: 1,
        size: Some(64),
        precision,
        distributed: d,
        ..TrainConfig::default()
    };
    Planner::new(&preset, &cfg)
        .expect("planner")
        .plan(1)
        .expect("plan")
}

fn zero(world: u32, st: Strategy, f: impl FnOnce(&mut Distributed)) -> Distributed {
    let mut d = Distributed::new(world, st);
    f(&mut d);
    d
}

/// `setup_buckets` (runtime/zero/stage_1_and_2.py:3256-3280): with `contiguous_gradients`
/// one IPG buffer of `reduce_bucket_size` elements in the 16-bit gradient dtype, a second
/// with `overlap_comm`. bf16, 5e8 elements: 1e9 bytes each, allocated by the first
/// gradient hook of a backward and freed by its epilogue (`_release_ipg_buffers`), so
/// live at the peak of a small step (GPT-2, batch 1, sequence 64), beside the flat copy
/// `allreduce_bucket` makes of a bucket it reduces when the peak is there. With `overlap_comm`
/// stage 1 also moves each gradient into the bucket as it is ready (`process_gradients`),
/// so the second buffer adds less than its size to the peak; without
/// `contiguous_gradients` there is no buffer and the gradients stay autograd's.
#[test]
fn stage_1_and_2_ipg_buffers() {
    for st in [Strategy::Zero1, Strategy::Zero2] {
        let base = plan(Precision::Bf16, Distributed::new(4, st));
        let overlap = plan(
            Precision::Bf16,
            zero(4, st, |d| d.overlap_comm = Some(true)),
        );
        let none = plan(
            Precision::Bf16,
            zero(4, st, |d| d.contiguous_gradients = false),
        );
        let small = plan(
            Precision::Bf16,
            zero(4, st, |d| d.zero_bucket_elems = 100_000_000),
        );
        // Communication at the peak: the IPG buffers, plus `allreduce_bucket`'s flat copy of
        // the bucket when the peak is a reduction (at most GPT-2's 124M bf16 gradients).
        let flat = 124_439_808 * 2;
        let comm = |p: &Plan, ipg: u64| {
            let c = p.category_bytes(Category::Communication).0;
            assert!(c >= ipg && c - ipg <= flat, "{st}: {c} vs {ipg}");
        };
        comm(&base, 1_000_000_000);
        comm(&overlap, 2_000_000_000);
        comm(&none, 0);
        comm(&small, 200_000_000);
        let grow = overlap.peak_allocated_bytes.0 - base.peak_allocated_bytes.0;
        if st == Strategy::Zero2 {
            // Stage 2 moves gradients as they come either way: the second buffer adds its size.
            assert_eq!(grow, 1_000_000_000, "{st}");
        } else {
            assert!(grow > 0 && grow < 1_000_000_000, "{st}: {grow}");
        }
        let saved = base.peak_allocated_bytes.0 - none.peak_allocated_bytes.0;
        assert!(saved > 0 && saved <= 1_000_000_000, "{st}: {saved}");
    }
}

/// Stage 3 allocates one IPG buffer when `contiguous_gradients`, `overlap_comm` or not
/// (runtime/zero/stage3.py:780-784): fp32, 5e8 elements = 2e9 bytes, kept from
/// `deepspeed.initialize` on. Without it the gradients wait as autograd's tensors for the
/// bucket's reduce-scatter (`__add_grad_to_ipg_bucket` copies nothing), so the peak drops by
/// less than the buffer.
#[test]
fn stage3_ipg_buffer_ignores_overlap() {
    let base = plan(Precision::Fp32, Distributed::new(4, Strategy::Zero3));
    let no_overlap = plan(
        Precision::Fp32,
        zero(4, Strategy::Zero3, |d| d.overlap_comm = Some(false)),
    );
    let none = plan(
        Precision::Fp32,
        zero(4, Strategy::Zero3, |d| d.contiguous_gradients = false),
    );
    assert_eq!(base.peak_allocated_bytes, no_overlap.peak_allocated_bytes);
    let comm = |p: &Plan| p.category_bytes(Category::Communication).0;
    assert!(comm(&base) >= 2_000_000_000, "{}", comm(&base));
    assert!(comm(&none) < 2_000_000_000, "{}", comm(&none));
    let saved = base.peak_allocated_bytes.0 - none.peak_allocated_bytes.0;
    assert!(saved > 0 && saved <= 2_000_000_000, "{saved}");
}

/// `ds_persist` when `ds_numel <= param_persistence_threshold`
/// (runtime/zero/partition_parameters.py:1292): under the default 1e5 every GPT-2 (124M)
/// LayerNorm weight and bias and every Linear bias stays whole — per block ln_1 (2 × 768),
/// c_attn.bias 2304, attn c_proj.bias 768, ln_2 (2 × 768), c_fc.bias 3072, mlp
/// c_proj.bias 768 = 9984, × 12 blocks + ln_f (2 × 768) = 121 344 elements (wpe, 786 432,
/// is above it). fp32 on 4 ranks: whole 485 376 bytes instead of a quarter. The quarters
/// are rounded to the caching allocator's 512 bytes (768 → 1024, 2304 → 2560, 3072 stays):
/// per block 11 776 instead of 9 984, so 12 × 11 776 + 2 × 1024 = 143 360 bytes, and the
/// persistent parameters hold 485 376 − 143 360 = 342 016 bytes more per rank than with
/// the threshold 0.
#[test]
fn stage3_persistent_parameters_stay_whole() {
    let dflt = plan(Precision::Fp32, Distributed::new(4, Strategy::Zero3));
    let none = plan(
        Precision::Fp32,
        zero(4, Strategy::Zero3, |d| d.persistence_threshold = 0),
    );
    let params = |p: &Plan| p.category_bytes(Category::Parameters).0;
    assert_eq!(params(&dflt) - params(&none), 342_016);
    // FSDP2 has no such threshold.
    let fsdp = plan(Precision::Fp32, Distributed::new(4, Strategy::Fsdp2));
    assert_eq!(params(&fsdp), params(&none));
}

/// `_partition_parameters` (torch/distributed/optim/zero_redundancy_optimizer.py:680-697):
/// sorted by numel, largest first, each to the first rank with the fewest elements.
#[test]
fn zero_redundancy_optimizer_partition() {
    // 40 → r0, 30 → r1, 20 → r1 (30 < 40), 10 → r0 (40 < 50).
    let o = torch_zero1_owned(&[10, 40, 30, 20], &[true; 4], 2);
    assert_eq!(o, vec![true, true, false, false]);
    // Ties go to the first rank; equal sizes keep their order (a stable sort).
    let o = torch_zero1_owned(&[5, 5, 5], &[true; 3], 2);
    assert_eq!(o, vec![true, false, true]);
    // Frozen parameters never reach the optimizer.
    let o = torch_zero1_owned(&[100, 5, 5], &[false, true, true], 2);
    assert_eq!(o, vec![false, true, false]);
    // What ZeroRedundancyOptimizer itself assigned rank 0 (torch 2.15, fake process group
    // of 4, Linear(10,40), Linear(40,30), Linear(30,2)): only the 1200-element weight.
    let o = torch_zero1_owned(&[400, 40, 1200, 30, 60, 2], &[true; 6], 4);
    assert_eq!(o, vec![false, false, true, false, false, false]);
    // One rank owns everything.
    assert_eq!(torch_zero1_owned(&[1, 2], &[true; 2], 1), vec![true, true]);
}

/// PyTorch's ZeRO-1 on GPT-2: DDP's parameters, gradients and buckets, and AdamW's two
/// fp32 moments of rank 0's parameters only. wte (38 597 376) goes to rank 0 first and
/// outweighs the rest of a 4-way split, so rank 0 holds wte's state and little else.
#[test]
fn torch_zero1_is_ddp_with_this_ranks_state() {
    let ddp = plan(Precision::Fp32, Distributed::new(4, Strategy::Ddp));
    let z = plan(Precision::Fp32, Distributed::new(4, Strategy::TorchZero1));
    // (The gradients at the peak depend on where the peak falls: not compared.)
    for c in [Category::Parameters, Category::Communication] {
        assert_eq!(ddp.category_bytes(c), z.category_bytes(c), "{c:?}");
    }
    let state = z.category_bytes(Category::OptimizerState).0;
    let preset = find_builtin("gpt2").expect("gpt2");
    let g = preset.build(
        64,
        vramlab_core::model::families::transformer::AttnImpl::Sdpa,
    );
    let g = g.expect("graph");
    let elems: Vec<u64> = g.params.iter().map(|p| p.elems).collect();
    let owned = torch_zero1_owned(&elems, &vec![true; elems.len()], 4);
    let mine: u64 = elems
        .iter()
        .zip(&owned)
        .filter(|(_, o)| **o)
        .map(|(e, _)| e)
        .sum();
    assert_eq!(state, mine * 8);
    assert!(
        mine >= 38_597_376 && mine < elems.iter().sum::<u64>() / 3,
        "{mine}"
    );
    assert!(z.peak_allocated_bytes < ddp.peak_allocated_bytes);
}

/// GPT-2's largest module: wte (50257 × 768 = 38 597 376 elements; the tied `lm_head` uses it
/// too), padded to the world.
const GPT2_WTE: u64 = 38_597_376;

fn zero3(f: impl FnOnce(&mut Distributed)) -> Plan {
    plan(Precision::Fp32, zero(4, Strategy::Zero3, f))
}

fn unsharded(p: &Plan) -> u64 {
    p.category_bytes(Category::Unsharded).0
}

/// `__params_to_release` (partitioned_param_coordinator.py:634-664): a parameter stays
/// gathered after a module's call when it is used again within `stage3_max_reuse_distance`
/// elements of the trace. GPT-2 (124M elements), no prefetch: with the default 1e9 every
/// parameter stays from its forward to its backward; with 0 each is released after every
/// use. (With the default prefetch the distance hardly matters for GPT-2: the prefetcher,
/// capped by max live 1e9 only, gathers the whole model ahead anyway.)
#[test]
fn stage3_reuse_distance_keeps_parameters_gathered() {
    let dflt = zero3(|d| d.prefetch_elems = 0);
    let none = zero3(|d| {
        d.prefetch_elems = 0;
        d.max_reuse_distance = Some(0);
    });
    assert!(dflt.peak_allocated_bytes > none.peak_allocated_bytes);
    let prefetched = zero3(|d| d.max_reuse_distance = Some(0));
    assert!(prefetched.peak_allocated_bytes > none.peak_allocated_bytes);
    // Kept: at least the eleven blocks not being worked on are whole at the peak.
    assert!(
        unsharded(&dflt) >= 11 * 7_087_872 * 4,
        "{}",
        unsharded(&dflt)
    );
}

/// `fetch_sub_module` (partitioned_param_coordinator.py:353-492): after the current module,
/// up to `min(max_live − available, stage3_prefetch_bucket_size)` elements of the next
/// unavailable parameters of the trace are all-gathered — on every module call, so the
/// gathered set runs ahead until `stage3_max_live_parameters` stops it.
#[test]
fn stage3_prefetch_raises_the_peak_monotonically() {
    let mut last = 0;
    for pf in [0, 1_000_000, 10_000_000, 50_000_000, 200_000_000] {
        let p = zero3(|d| {
            d.prefetch_elems = pf;
            d.max_reuse_distance = Some(0);
        });
        let a = p.peak_allocated_bytes.0;
        assert!(a >= last, "prefetch {pf}: {a} < {last}");
        last = a;
    }
    let p0 = zero3(|d| {
        d.prefetch_elems = 0;
        d.max_reuse_distance = Some(0);
    });
    let big = zero3(|d| {
        d.prefetch_elems = 200_000_000;
        d.max_reuse_distance = Some(0);
    });
    assert!(big.peak_allocated_bytes > p0.peak_allocated_bytes);
    // Prefetch 0 and distance 0: only the current module is gathered — at most wte (the
    // largest), fp32.
    assert!(unsharded(&p0) <= GPT2_WTE * 4, "{}", unsharded(&p0));
}

/// `stage3_max_live_parameters` caps the prefetch (`max_params_to_prefetch` goes ≤ 0), never
/// the current module: `__all_gather_params(params_to_fetch)` runs first, unconditionally.
/// Below one module the plan still gathers each module when it runs, as DeepSpeed does.
#[test]
fn stage3_max_live_below_one_module_still_gathers_it() {
    let tiny = zero3(|d| {
        d.max_live_params = 1;
        d.max_reuse_distance = Some(0);
    });
    let p0 = zero3(|d| {
        d.prefetch_elems = 0;
        d.max_reuse_distance = Some(0);
    });
    // No prefetch at all: the same plan as prefetch 0.
    assert_eq!(tiny.peak_allocated_bytes, p0.peak_allocated_bytes);
    assert!(unsharded(&tiny) > 0);
    // A cap between: at most the cap plus the last prefetched parameter (and the current
    // module) beyond prefetch 0.
    let capped = zero3(|d| {
        d.max_live_params = 20_000_000;
        d.max_reuse_distance = Some(0);
    });
    let extra = capped.peak_allocated_bytes.0 - p0.peak_allocated_bytes.0;
    assert!(extra <= (20_000_000 + GPT2_WTE) * 4, "{extra}");
}
