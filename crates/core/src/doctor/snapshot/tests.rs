//! Unit tests of `snapshot` (moved beside it from an inline module).

use super::*;

fn e(action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry {
        action,
        addr,
        size,
        stream: 0,
        time_us: 0,
        device_free: None,
        stack: 0,
    }
}

fn snap(trace: Vec<TraceEntry>) -> Snapshot {
    Snapshot {
        traces: vec![trace],
        stacks: vec![Vec::new()],
        ..Snapshot::default()
    }
}

#[test]
fn replay_rounds_and_keeps_unsplittable_remainders() {
    let base = 1 << 40;
    let seg = 20 * MIB;
    let s = snap(vec![
        e(Action::SegmentAlloc, base, seg),
        // 19.5 MiB + 1: the 0.5 MiB remainder is too small to split (large pool).
        e(Action::Alloc, base, 19 * MIB + MIB / 2 + 1),
        e(Action::FreeRequested, base, 19 * MIB + MIB / 2 + 1),
        e(Action::FreeCompleted, base, 19 * MIB + MIB / 2 + 1),
        // 3 MiB + 100: split; rounded to 512 B.
        e(Action::Alloc, base, 3 * MIB + 100),
    ]);
    let r = analyze(&s, None).expect("report");
    assert_eq!(r.peak_allocated_bytes, Bytes(seg));
    assert_eq!(r.peak_reserved_bytes, Bytes(seg));
    assert_eq!(
        r.timeline.last().map(|p| p.allocated_bytes),
        Some(3 * MIB + 512)
    );
    // The map is taken at the peak: the whole segment is one allocated block then.
    let m = r.segment_map.expect("map");
    assert_eq!((m.at.as_str(), m.event), ("peak", 1));
    assert_eq!(m.largest_free_block_bytes, Bytes(0));
    assert_eq!(m.segments[0].blocks.len(), 1);
    assert_eq!(m.fragmentation, 0.0);
}

#[test]
fn holes_make_fragmentation_and_oom_state() {
    let base = 1 << 40;
    let mut t = vec![e(Action::SegmentAlloc, base, 64 * MIB)];
    for i in 0..8 {
        t.push(e(Action::Alloc, base + i * 8 * MIB, 8 * MIB));
    }
    for i in (0..8).step_by(2) {
        t.push(e(Action::FreeRequested, base + i * 8 * MIB, 8 * MIB));
        t.push(e(Action::FreeCompleted, base + i * 8 * MIB, 8 * MIB));
    }
    let mut oom = e(Action::Oom, 0, 16 * MIB);
    oom.device_free = Some(MIB);
    t.push(oom);
    let r = analyze(&snap(t), None).expect("report");
    assert_eq!(r.peak_allocated_bytes, Bytes(64 * MIB));
    assert_eq!(r.ooms.len(), 1);
    let m = r.segment_map.expect("map at the oom");
    assert_eq!(m.at, "oom");
    assert_eq!(m.free_in_segments_bytes, Bytes(32 * MIB));
    assert_eq!(m.largest_free_block_bytes, Bytes(8 * MIB));
    assert!((m.fragmentation - 0.75).abs() < 1e-9);
    assert_eq!(r.ooms[0].allocated_bytes, Bytes(32 * MIB));
}

fn frame(filename: &str, line: i64, name: &str) -> Frame {
    Frame {
        filename: filename.to_string(),
        line,
        name: name.to_string(),
    }
}

/// A stack as `_record_memory_history()` (stacks="all") records it: C++ frames from the
/// unwinder, the Python frame gathered for each `_PyEval_EvalFrameDefault` placed before it.
fn mixed(user: &str) -> Vec<Frame> {
    vec![
        frame("??", 0, "torch::unwind::unwind()"),
        frame(
            "/pytorch/torch/csrc/cuda/memory_snapshot.cpp",
            0,
            "torch::cuda::(anonymous namespace)::gather_with_cpp()",
        ),
        frame(
            "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
            0,
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
        ),
        frame(
            "/usr/lib/python3.12/site-packages/torch/nn/modules/linear.py",
            125,
            "forward",
        ),
        frame("Python/ceval.c", 0, "_PyEval_EvalFrameDefault"),
        frame(
            "/usr/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py",
            600,
            "_eval_frame_wrapper",
        ),
        frame("??", 0, "_PyEval_EvalFrameDefault"),
        frame("/home/u/train.py", 40, user),
        frame("??", 0, "_PyEval_EvalFrameDefault"),
        frame("/home/u/train.py", 60, "main"),
        frame("??", 0, "__libc_start_main"),
    ]
}

fn snap_with_stacks(stacks: Vec<Vec<Frame>>) -> Snapshot {
    let base = 1 << 40;
    let mut frames = Vec::new();
    let mut ids = vec![Vec::new()];
    for st in &stacks {
        let mut v = Vec::new();
        for f in st {
            v.push(frames.len() as u32);
            frames.push(f.clone());
        }
        ids.push(v);
    }
    let mut t = vec![e(Action::SegmentAlloc, base, 64 * MIB)];
    for (i, _) in stacks.iter().enumerate() {
        let mut a = e(Action::Alloc, base + i as u64 * 8 * MIB, 8 * MIB);
        a.stack = i as u32 + 1;
        t.push(a);
    }
    Snapshot {
        traces: vec![t],
        stacks: ids,
        frames,
        ..Snapshot::default()
    }
}

#[test]
fn python_frames_are_told_from_cpp_frames() {
    let py = |f: &str, n: &str| is_python_frame(&frame(f, 1, n));
    assert!(py("/home/u/train.py", "train_step"));
    assert!(py("<eval_with_key>.3", "forward"));
    assert!(py("/tmp/ipykernel_77/3349.py", "<module>"));
    assert!(!py("Python/ceval.c", "_PyEval_EvalFrameDefault"));
    assert!(!py("??", "_PyEval_EvalFrameDefault"));
    assert!(!py(
        "/pytorch/torch/csrc/cuda/memory_snapshot.cpp",
        "gather_with_cpp"
    ));
    assert!(!py("??", "??"));
    assert!(!py("", ""));
}

#[test]
fn sites_name_the_users_python_frame_and_cpp_frames_never_mark_evaluation() {
    let backward = vec![
        frame("??", 0, "torch::unwind::unwind()"),
        frame(
            "/pytorch/torch/csrc/cuda/memory_snapshot.cpp",
            0,
            "torch::cuda::(anonymous namespace)::gather_with_cpp()",
        ),
        frame(
            "/pytorch/torch/csrc/autograd/engine.cpp",
            0,
            "torch::autograd::Engine::thread_main",
        ),
    ];
    let s = snap_with_stacks(vec![mixed("train_step"), backward]);
    let r = analyze(&s, None).expect("report");
    assert!(
        r.eval_sites_at_peak.is_empty(),
        "{:?}",
        r.eval_sites_at_peak
    );
    let sites: Vec<&str> = r.top_sites.iter().map(|x| x.site.as_str()).collect();
    assert!(sites.contains(&"u/train.py:40 in train_step"), "{sites:?}");
    assert!(
        sites.contains(&"(no Python frame: autograd backward or C++)"),
        "{sites:?}"
    );
    assert!(!sites.iter().any(|x| x.contains("memory_snapshot.cpp")));
    for site in &r.top_sites {
        // Shown frames: Python ones when there are any, never the unwinder's.
        assert!(
            site.stack
                .iter()
                .all(|f| !f.name.contains("gather_with_cpp")),
            "{:?}",
            site.stack
        );
    }
    let py_site = r
        .top_sites
        .iter()
        .find(|x| x.site.contains("train_step"))
        .expect("site");
    assert_eq!(py_site.stack[0].name, "forward");
    assert!(py_site.stack.iter().all(is_python_frame));
    // The user's own evaluation function is still found.
    let r = analyze(&snap_with_stacks(vec![mixed("validate")]), None).expect("report");
    assert_eq!(r.eval_sites_at_peak, ["validate"]);
    // Only library Python frames: the innermost Python frame is the site.
    let lib = vec![
        frame("??", 0, "gather_with_cpp"),
        frame(
            "/usr/lib/python3.12/site-packages/torch/nn/modules/linear.py",
            125,
            "forward",
        ),
        frame("??", 0, "_PyEval_EvalFrameDefault"),
    ];
    let r = analyze(&snap_with_stacks(vec![lib]), None).expect("report");
    assert_eq!(r.top_sites[0].site, "modules/linear.py:125 in forward");
}

#[test]
fn downsampling_keeps_the_peak() {
    let pts: Vec<_> = (0..100_000usize)
        .map(|i| {
            (
                i,
                i as i64,
                if i == 77_777 {
                    1_000_000
                } else {
                    (i % 7) as i128
                },
                0,
            )
        })
        .collect();
    let d = downsample(&pts, 0, 0);
    assert!(d.len() <= MAX_TIMELINE_POINTS + 2);
    assert_eq!(d.iter().map(|p| p.allocated_bytes).max(), Some(1_000_000));
}
