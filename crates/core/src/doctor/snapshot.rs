//! Reads a `torch.cuda.memory._dump_snapshot` pickle and replays its allocator history.
//!
//! The structure is `torch.cuda.memory._snapshot`'s: `{"segments": [Segment],
//! "device_traces": [[TraceEntry] per device], "allocator_settings": {…}}`, a segment being
//! `{device, address, total_size, segment_type, is_expandable, blocks: [{address, size,
//! requested_size, state, frames}]}` and a trace entry `{action, addr, size, stream,
//! frames, time_us, device_free (oom only)}`. The trace's `alloc` size is the *requested*
//! size; the replay rounds it the way `DeviceCachingAllocator` does (512 B, and a block
//! keeps its whole free block when the remainder is too small to split), so the peaks
//! equal `torch.cuda.max_memory_allocated` / `max_memory_reserved` when the history covers
//! the whole run.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::error::DoctorError;
use super::pickle::{Node, NodeId, Pickle};
use crate::units::{Bytes, MIB};

/// One frame of a stack trace: Python or C++ (a snapshot recorded with `stacks="all"` holds
/// both; [`is_python_frame`] tells them apart).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

/// Small allocations are rounded to this (`kMinBlockSize`).
const MIN_BLOCK: u64 = 512;
/// Requests up to this size use the small pool (`kSmallSize`).
const SMALL_SIZE: u64 = MIB;
/// Small-pool segments are this large (`kSmallBuffer`).
const SMALL_BUFFER: u64 = 2 * MIB;
/// Most timeline points kept (the peak of each bucket is kept).
pub const MAX_TIMELINE_POINTS: usize = 4000;
/// Allocation sites listed.
const TOP_SITES: usize = 12;

/// What the allocator did (`TraceEntry::Action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    Other,
}

impl Action {
    pub(crate) fn parse(s: &str) -> Action {
        match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            _ => Action::Other,
        }
    }
}

/// One trace entry.
#[derive(Debug, Clone)]
pub struct TraceEntry {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub time_us: i64,
    /// `cudaMemGetInfo` free bytes (oom entries only).
    pub device_free: Option<u64>,
    /// Index into [`Snapshot::frames`]'s stacks.
    pub stack: u32,
}

/// A block of a segment in the final state.
#[derive(Debug, Clone)]
pub struct BlockState {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub allocated: bool,
    pub stack: u32,
}

/// A segment in the final state.
#[derive(Debug, Clone)]
pub struct SegmentState {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub is_small: bool,
    pub is_expandable: bool,
    pub blocks: Vec<BlockState>,
}

/// The typed content of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub segments: Vec<SegmentState>,
    /// One trace per device.
    pub traces: Vec<Vec<TraceEntry>>,
    /// Distinct stack traces (innermost frame first); index 0 is the empty stack.
    pub stacks: Vec<Vec<u32>>,
    pub frames: Vec<Frame>,
    /// `allocator_settings` as JSON.
    pub allocator_settings: serde_json::Value,
}

/// Distinct frames and stacks, found through the pickle's own sharing: PyTorch writes each
/// distinct frame dict once and refers to it from every traceback through the memo, so a
/// frame dict's value id names the frame and its strings are read once, not at every
/// reference; a traceback list shared by several entries is typed once too.
struct Interner<'p> {
    p: &'p Pickle,
    frames: Vec<Frame>,
    frame_ids: HashMap<(&'p str, i64, &'p str), u32>,
    /// Frame id + 1 by the value id of a frame dict (0: not seen yet).
    frame_of_node: Vec<u32>,
    stacks: Vec<Vec<u32>>,
    stack_ids: HashMap<Vec<u32>, u32>,
    /// Stack id + 1 by the value id of a frames list (0: not seen yet).
    stack_of_node: Vec<u32>,
    scratch: Vec<u32>,
}

/// The `filename`, `line` and `name` of a frame dict (absent ones empty or 0).
fn frame_fields(p: &Pickle, f: NodeId) -> (&str, i64, &str) {
    let (mut filename, mut line, mut name) = ("", 0, "");
    if let Node::Dict(items) = p.get(f) {
        // The first of repeated keys wins, as in `Pickle::field`.
        let (mut seen_file, mut seen_line, mut seen_name) = (false, false, false);
        for (k, v) in items {
            match p.as_str(*k) {
                Some("filename") if !seen_file => {
                    seen_file = true;
                    filename = p.as_str(*v).unwrap_or("");
                }
                Some("line") if !seen_line => {
                    seen_line = true;
                    line = p
                        .as_int(*v)
                        .and_then(|v| i64::try_from(v).ok())
                        .unwrap_or(0);
                }
                Some("name") if !seen_name => {
                    seen_name = true;
                    name = p.as_str(*v).unwrap_or("");
                }
                _ => {}
            }
        }
    }
    (filename, line, name)
}

impl<'p> Interner<'p> {
    fn new(p: &'p Pickle) -> Interner<'p> {
        Interner {
            p,
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            frame_of_node: vec![0; p.nodes.len()],
            stacks: vec![Vec::new()],
            stack_ids: HashMap::from([(Vec::new(), 0)]),
            stack_of_node: vec![0; p.nodes.len()],
            scratch: Vec::new(),
        }
    }

    fn frame(&mut self, f: NodeId) -> u32 {
        let slot = self.frame_of_node.get(f.0 as usize).copied().unwrap_or(0);
        if slot != 0 {
            return slot - 1;
        }
        let key = frame_fields(self.p, f);
        let next = self.frames.len() as u32;
        let id = *self.frame_ids.entry(key).or_insert(next);
        if id == next {
            self.frames.push(Frame {
                filename: key.0.to_string(),
                line: key.1,
                name: key.2.to_string(),
            });
        }
        if let Some(s) = self.frame_of_node.get_mut(f.0 as usize) {
            *s = id + 1;
        }
        id
    }

    fn stack(&mut self, frames: Option<NodeId>) -> u32 {
        let Some(list) = frames else { return 0 };
        let slot = self
            .stack_of_node
            .get(list.0 as usize)
            .copied()
            .unwrap_or(0);
        if slot != 0 {
            return slot - 1;
        }
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        for f in self.p.items(list) {
            ids.push(self.frame(*f));
        }
        let id = match self.stack_ids.get(&ids) {
            Some(id) => *id,
            None => {
                let id = self.stacks.len() as u32;
                self.stacks.push(ids.clone());
                self.stack_ids.insert(ids.clone(), id);
                id
            }
        };
        self.scratch = ids;
        if let Some(s) = self.stack_of_node.get_mut(list.0 as usize) {
            *s = id + 1;
        }
        id
    }
}

fn int(p: &Pickle, d: NodeId, k: &str) -> Option<i128> {
    p.field(d, k).and_then(|v| p.as_int(v))
}

fn uint(p: &Pickle, d: NodeId, k: &str) -> u64 {
    int(p, d, k)
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(0)
}

fn to_u64(p: &Pickle, v: Option<NodeId>) -> u64 {
    v.and_then(|v| p.as_int(v))
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(0)
}

fn to_i64(p: &Pickle, v: Option<NodeId>) -> i64 {
    v.and_then(|v| p.as_int(v))
        .and_then(|v| i64::try_from(v).ok())
        .unwrap_or(0)
}

/// A trace entry's fields in one pass over its dict (the first of repeated keys wins, as
/// in [`Pickle::field`]).
fn trace_entry(p: &Pickle, e: NodeId, it: &mut Interner<'_>) -> TraceEntry {
    let mut f: [Option<NodeId>; 7] = [None; 7];
    if let Node::Dict(items) = p.get(e) {
        for (k, v) in items {
            let slot = match p.as_str(*k) {
                Some("action") => 0,
                Some("addr") => 1,
                Some("size") => 2,
                Some("stream") => 3,
                Some("time_us") => 4,
                Some("device_free") => 5,
                Some("frames") => 6,
                _ => continue,
            };
            if f[slot].is_none() {
                f[slot] = Some(*v);
            }
        }
    }
    TraceEntry {
        action: f[0]
            .and_then(|v| p.as_str(v))
            .map_or(Action::Other, Action::parse),
        addr: to_u64(p, f[1]),
        size: to_u64(p, f[2]),
        stream: to_i64(p, f[3]),
        time_us: to_i64(p, f[4]),
        device_free: f[5]
            .and_then(|v| p.as_int(v))
            .and_then(|v| u64::try_from(v).ok()),
        stack: it.stack(f[6]),
    }
}

impl Snapshot {
    /// Types a decoded pickle; fails when it is not a memory snapshot.
    pub fn from_pickle(p: &Pickle) -> Result<Snapshot, DoctorError> {
        let root = p.root;
        let not_snapshot = |what: &str| DoctorError::NotSnapshot(what.to_string());
        if !matches!(p.get(root), Node::Dict(_)) {
            return Err(not_snapshot("the top-level value is not a dict"));
        }
        let segs = p.field(root, "segments");
        let traces = p.field(root, "device_traces");
        if segs.is_none() && traces.is_none() {
            return Err(not_snapshot(
                "it has neither `segments` nor `device_traces` (is it a torch.cuda.memory._dump_snapshot file?)",
            ));
        }
        let mut it = Interner::new(p);
        let mut segments = Vec::new();
        for s in segs.map(|s| p.items(s)).unwrap_or(&[]) {
            let mut blocks = Vec::new();
            for b in p.field(*s, "blocks").map(|b| p.items(b)).unwrap_or(&[]) {
                let state = p.field(*b, "state").and_then(|v| p.as_str(v)).unwrap_or("");
                blocks.push(BlockState {
                    address: uint(p, *b, "address"),
                    size: uint(p, *b, "size"),
                    requested_size: uint(p, *b, "requested_size"),
                    allocated: state.starts_with("active"),
                    stack: it.stack(p.field(*b, "frames")),
                });
            }
            let total_size = uint(p, *s, "total_size");
            segments.push(SegmentState {
                device: int(p, *s, "device")
                    .and_then(|v| i64::try_from(v).ok())
                    .unwrap_or(0),
                address: uint(p, *s, "address"),
                total_size,
                allocated_size: uint(p, *s, "allocated_size"),
                is_small: p
                    .field(*s, "segment_type")
                    .and_then(|v| p.as_str(v))
                    .map_or(total_size == SMALL_BUFFER, |t| t == "small"),
                is_expandable: p
                    .field(*s, "is_expandable")
                    .and_then(|v| p.as_bool(v))
                    .unwrap_or(false),
                blocks,
            });
        }
        let mut all = Vec::new();
        for dev in traces.map(|t| p.items(t)).unwrap_or(&[]) {
            let entries = p.items(*dev);
            let mut out = Vec::with_capacity(entries.len());
            for e in entries {
                out.push(trace_entry(p, *e, &mut it));
            }
            all.push(out);
        }
        let allocator_settings = p
            .field(root, "allocator_settings")
            .map_or(serde_json::Value::Null, |s| p.to_json(s, 4));
        Ok(Snapshot {
            segments,
            traces: all,
            stacks: it.stacks,
            frames: it.frames,
            allocator_settings,
        })
    }

    /// `max_split_size` of the allocator settings (`None` = unlimited).
    pub fn max_split_size(&self) -> Option<u64> {
        self.allocator_settings
            .get("max_split_size")
            .and_then(|v| v.as_i64())
            .and_then(|v| u64::try_from(v).ok())
            .filter(|v| *v > 0 && *v < u64::MAX / 2)
    }

    pub fn expandable_segments(&self) -> bool {
        self.allocator_settings
            .get("expandable_segments")
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    }
}

/// A block in the segment map.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MapBlock {
    /// Offset from the segment's start.
    pub offset: u64,
    pub size: u64,
    pub allocated: bool,
}

/// A segment in the segment map.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MapSegment {
    pub address: u64,
    pub size: u64,
    pub is_small: bool,
    pub blocks: Vec<MapBlock>,
}

/// The allocator's state at one moment of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SegmentMap {
    /// "peak" or "oom".
    pub at: String,
    /// Index of the trace entry.
    pub event: usize,
    pub allocated_bytes: Bytes,
    pub reserved_bytes: Bytes,
    /// Reserved but unallocated bytes inside segments.
    pub free_in_segments_bytes: Bytes,
    pub largest_free_block_bytes: Bytes,
    /// 1 − largest free block / free bytes in segments (0 = one contiguous hole).
    pub fragmentation: f64,
    /// Segments, largest first (at most 200 listed).
    pub segments: Vec<MapSegment>,
    pub segment_count: usize,
}

/// One point of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimelinePoint {
    pub event: usize,
    pub time_us: i64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

/// Bytes live at the peak by allocation site.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Site {
    /// "file:line in function" of the innermost Python frame outside torch, transformers,
    /// peft and accelerate (else the innermost Python frame); C++ frames are skipped.
    pub site: String,
    pub bytes_at_peak: Bytes,
    pub blocks_at_peak: u64,
    /// Every allocation made there over the trace.
    pub allocations: u64,
    /// The innermost few Python frames (C++ frames when there is none), innermost first.
    pub stack: Vec<Frame>,
}

/// The failed request of an `oom` trace entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomEvent {
    pub event: usize,
    pub requested_bytes: Bytes,
    pub device_free_bytes: Option<Bytes>,
    pub allocated_bytes: Bytes,
    pub reserved_bytes: Bytes,
    pub stack: Vec<Frame>,
}

/// What a snapshot says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotReport {
    pub device: usize,
    pub trace_entries: usize,
    /// The peaks over the trace (plus the state before it, taken from the final segments).
    pub peak_allocated_bytes: Bytes,
    pub peak_reserved_bytes: Bytes,
    pub peak_event: usize,
    /// The final state (`segments`).
    pub final_allocated_bytes: Bytes,
    pub final_reserved_bytes: Bytes,
    pub timeline: Vec<TimelinePoint>,
    pub ooms: Vec<OomEvent>,
    /// At the last OOM, else at the peak.
    pub segment_map: Option<SegmentMap>,
    pub top_sites: Vec<Site>,
    pub allocator_settings: serde_json::Value,
    pub expandable_segments: bool,
    pub max_split_size_bytes: Option<Bytes>,
    /// The user's Python functions whose names suggest evaluation (validate, evaluate, …)
    /// on the stacks of the blocks live at the peak (C++ and library frames never count).
    pub eval_sites_at_peak: Vec<String>,
}

#[derive(Debug, Clone)]
struct Blk {
    size: u64,
    allocated: bool,
    /// Allocated bytes were already subtracted (free_requested seen).
    freed: bool,
    stack: u32,
}

#[derive(Debug, Clone)]
struct Seg {
    size: u64,
    is_small: bool,
    expandable: bool,
    /// Block start → block; covers the segment without gaps (non-expandable segments).
    blocks: BTreeMap<u64, Blk>,
}

/// The allocator replay.
struct Replay {
    segs: BTreeMap<u64, Seg>,
    /// Live allocations outside known segments: addr → (size, stack).
    loose: HashMap<u64, (u64, u32, bool)>,
    allocated: i128,
    reserved: i128,
    max_split: Option<u64>,
}

fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK {
        MIN_BLOCK
    } else {
        size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }
}

impl Replay {
    fn seg_of(&mut self, addr: u64) -> Option<(&u64, &mut Seg)> {
        self.segs
            .range_mut(..=addr)
            .next_back()
            .filter(|(start, s)| addr < start.saturating_add(s.size))
    }

    fn step(&mut self, e: &TraceEntry) {
        let max_split = self.max_split;
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                self.reserved += i128::from(e.size);
                let expandable = e.action == Action::SegmentMap;
                if expandable {
                    return; // pages of an expandable segment: blocks are tracked loosely
                }
                let mut blocks = BTreeMap::new();
                blocks.insert(
                    e.addr,
                    Blk {
                        size: e.size,
                        allocated: false,
                        freed: false,
                        stack: 0,
                    },
                );
                self.segs.insert(
                    e.addr,
                    Seg {
                        size: e.size,
                        is_small: e.size == SMALL_BUFFER,
                        expandable,
                        blocks,
                    },
                );
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                self.reserved -= i128::from(e.size);
                self.segs.remove(&e.addr);
            }
            Action::Alloc => {
                let rounded = round_size(e.size);
                let size = match self.seg_of(e.addr) {
                    Some((_, seg)) if !seg.expandable => {
                        let is_small = seg.is_small;
                        match seg.blocks.get_mut(&e.addr) {
                            Some(b) if !b.allocated && b.size >= rounded => {
                                let remaining = b.size - rounded;
                                let split = if is_small {
                                    remaining >= MIN_BLOCK
                                } else {
                                    max_split.is_none_or(|m| rounded < m) && remaining > SMALL_SIZE
                                };
                                let size = if split { rounded } else { b.size };
                                b.size = size;
                                b.allocated = true;
                                b.freed = false;
                                b.stack = e.stack;
                                if split {
                                    seg.blocks.insert(
                                        e.addr + rounded,
                                        Blk {
                                            size: remaining,
                                            allocated: false,
                                            freed: false,
                                            stack: 0,
                                        },
                                    );
                                }
                                Some(size)
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                };
                let size = size.unwrap_or_else(|| {
                    self.loose.insert(e.addr, (rounded, e.stack, false));
                    rounded
                });
                self.allocated += i128::from(size);
            }
            Action::FreeRequested => {
                if let Some(b) = self.live_block(e.addr) {
                    if !b.0 {
                        let size = b.1;
                        self.mark_freed(e.addr);
                        self.allocated -= i128::from(size);
                    }
                } else {
                    // Allocated before the trace began: its size is the rounded request.
                    self.allocated -= i128::from(round_size(e.size));
                }
            }
            Action::FreeCompleted => {
                let known = self.live_block(e.addr);
                match known {
                    Some((freed, size)) => {
                        if !freed {
                            self.allocated -= i128::from(size);
                        }
                        self.release(e.addr);
                    }
                    None => {
                        // A free_requested already accounted for it, or it predates the trace.
                    }
                }
            }
            Action::Oom | Action::Snapshot | Action::Other => {}
        }
    }

    /// (already freed?, size) of the live block at `addr`.
    fn live_block(&mut self, addr: u64) -> Option<(bool, u64)> {
        if let Some((_, seg)) = self.seg_of(addr)
            && let Some(b) = seg.blocks.get(&addr)
            && b.allocated
        {
            return Some((b.freed, b.size));
        }
        self.loose.get(&addr).map(|(s, _, f)| (*f, *s))
    }

    fn mark_freed(&mut self, addr: u64) {
        if let Some((_, seg)) = self.seg_of(addr)
            && let Some(b) = seg.blocks.get_mut(&addr)
        {
            b.freed = true;
            return;
        }
        if let Some(l) = self.loose.get_mut(&addr) {
            l.2 = true;
        }
    }

    /// The block becomes free and merges with free neighbours.
    fn release(&mut self, addr: u64) {
        if self.loose.remove(&addr).is_some() {
            return;
        }
        let Some((_, seg)) = self.seg_of(addr) else {
            return;
        };
        let Some(b) = seg.blocks.get_mut(&addr) else {
            return;
        };
        b.allocated = false;
        b.freed = false;
        let mut start = addr;
        let mut size = b.size;
        if let Some((&next, nb)) = seg.blocks.range(addr + 1..).next()
            && !nb.allocated
            && next == addr + size
        {
            size += nb.size;
            seg.blocks.remove(&next);
        }
        if let Some((&prev, pb)) = seg.blocks.range(..addr).next_back()
            && !pb.allocated
            && prev + pb.size == addr
        {
            start = prev;
            size += pb.size;
            seg.blocks.remove(&addr);
        }
        if let Some(b) = seg.blocks.get_mut(&start) {
            b.size = size;
        }
    }

    fn map(&self, at: &str, event: usize) -> SegmentMap {
        let mut free_total = 0u64;
        let mut largest = 0u64;
        let mut segments: Vec<MapSegment> = self
            .segs
            .iter()
            .map(|(addr, s)| {
                let blocks = s
                    .blocks
                    .iter()
                    .map(|(b, blk)| {
                        if !blk.allocated {
                            free_total += blk.size;
                            largest = largest.max(blk.size);
                        }
                        MapBlock {
                            offset: b - addr,
                            size: blk.size,
                            allocated: blk.allocated,
                        }
                    })
                    .collect();
                MapSegment {
                    address: *addr,
                    size: s.size,
                    is_small: s.is_small,
                    blocks,
                }
            })
            .collect();
        let segment_count = segments.len();
        segments.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
        segments.truncate(200);
        SegmentMap {
            at: at.to_string(),
            event,
            allocated_bytes: Bytes(clamp(self.allocated)),
            reserved_bytes: Bytes(clamp(self.reserved)),
            free_in_segments_bytes: Bytes(free_total),
            largest_free_block_bytes: Bytes(largest),
            fragmentation: if free_total == 0 {
                0.0
            } else {
                1.0 - largest as f64 / free_total as f64
            },
            segments,
            segment_count,
        }
    }
}

fn clamp(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}

/// A frame of Python code. A snapshot's stack mixes two kinds of frames without marking
/// them: with `stacks="all"` (the default of `_record_memory_history`) PyTorch's
/// `symbolize` (`torch/csrc/profiler/combined_traceback.cpp`) walks the unwound C++ frames
/// and inserts the Python frame it gathered before each interpreter frame
/// (`_PyEval_EvalFrameDefault`). Python frames carry the code object's `co_filename` (a
/// `.py` file, or `<string>`, `<frozen runpy>`, `<eval_with_key>.N` for generated code);
/// C++ frames carry the symbolizer's source file (`memory_snapshot.cpp`, `ceval.c`, `??`)
/// or a shared library.
pub fn is_python_frame(f: &Frame) -> bool {
    if f.name.contains("PyEval_EvalFrame") {
        return false;
    }
    let file = f.filename.trim();
    let lower = file.to_ascii_lowercase();
    lower.ends_with(".py") || lower.ends_with(".pyw") || (file.starts_with('<') && file.len() > 2)
}

/// The frames PyTorch's own viewers hide (`_frame_filter` in `torch/cuda/_memory_viz.py`,
/// `frameFilter` in `MemoryViz.js`): the unwinder, the interpreter, the dispatcher's boxing.
pub fn is_plumbing_frame(f: &Frame) -> bool {
    const FUNCTIONS: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const FILES: [&str; 10] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    FUNCTIONS.iter().any(|n| f.name.contains(n)) || FILES.iter().any(|n| f.filename.contains(n))
}

/// Packages whose frames are not the user's code.
const LIBRARIES: [&str; 4] = ["torch", "transformers", "peft", "accelerate"];

/// A Python frame of a library (torch, transformers, peft, accelerate, anything installed in
/// site-packages) or of generated code (`<eval_with_key>.N`, `<frozen …>`).
fn is_library_frame(f: &Frame) -> bool {
    let p = f.filename.replace('\\', "/");
    p.contains("/site-packages/")
        || p.contains("/dist-packages/")
        || p.split('/').any(|part| LIBRARIES.contains(&part))
        || p.starts_with('<')
        || p.is_empty()
}

/// Function names that mark evaluation code.
fn is_eval_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "valid",
        "evaluat",
        "eval_",
        "_eval",
        "predict",
        "inference",
        "test_step",
    ]
    .iter()
    .any(|k| n.contains(k))
        || n == "eval"
        || n == "evaluate"
        || n == "validate"
        || n == "test"
}

/// Replays the trace of `device` (or of the device with the longest trace).
pub fn analyze(s: &Snapshot, device: Option<usize>) -> Result<SnapshotReport, DoctorError> {
    let device = match device {
        Some(d) if d < s.traces.len().max(1) => d,
        Some(d) => {
            return Err(DoctorError::NotSnapshot(format!(
                "device {d}: the snapshot has traces for {} device(s)",
                s.traces.len()
            )));
        }
        None => (0..s.traces.len())
            .max_by_key(|d| {
                let t = &s.traces[*d];
                (t.iter().any(|e| e.action == Action::Oom), t.len())
            })
            .unwrap_or(0),
    };
    let empty = Vec::new();
    let trace = s.traces.get(device).unwrap_or(&empty);
    let dev_segments: Vec<&SegmentState> = s
        .segments
        .iter()
        .filter(|g| usize::try_from(g.device).ok() == Some(device) || s.traces.len() <= 1)
        .collect();
    let final_allocated: u64 = dev_segments.iter().map(|g| g.allocated_size).sum();
    let final_reserved: u64 = dev_segments.iter().map(|g| g.total_size).sum();
    let new_replay = || Replay {
        segs: BTreeMap::new(),
        loose: HashMap::new(),
        allocated: 0,
        reserved: 0,
        max_split: s.max_split_size(),
    };
    // Pass 1: the net change over the trace gives the state before it began.
    let mut r = new_replay();
    let mut peak_a = 0i128;
    let mut peak_r = 0i128;
    let mut peak_event = 0usize;
    let mut points = Vec::with_capacity(trace.len() + 1);
    for (i, e) in trace.iter().enumerate() {
        r.step(e);
        points.push((i, e.time_us, r.allocated, r.reserved));
    }
    let base_a = i128::from(final_allocated) - r.allocated;
    let base_r = i128::from(final_reserved) - r.reserved;
    // A history that covers the run starts empty; a ring buffer that dropped entries
    // starts at whatever the final state implies.
    let base_a = base_a.max(0);
    let base_r = base_r.max(0);
    peak_a = peak_a.max(base_a);
    peak_r = peak_r.max(base_r);
    for (i, _, a, rv) in &points {
        if a + base_a > peak_a {
            peak_a = a + base_a;
            peak_event = *i;
        }
        peak_r = peak_r.max(rv + base_r);
    }
    let timeline = downsample(&points, base_a, base_r);
    let last_oom = trace.iter().rposition(|e| e.action == Action::Oom);
    // Pass 2: states at the peak and at the OOMs, sites.
    let mut r = new_replay();
    let mut ooms = Vec::new();
    let mut map = None;
    let mut at_peak: Option<Vec<(u64, u32)>> = None;
    let mut site_allocs: HashMap<u32, u64> = HashMap::new();
    for (i, e) in trace.iter().enumerate() {
        if e.action == Action::Oom {
            ooms.push(OomEvent {
                event: i,
                requested_bytes: Bytes(e.size),
                device_free_bytes: e.device_free.map(Bytes),
                allocated_bytes: Bytes(clamp(r.allocated + base_a)),
                reserved_bytes: Bytes(clamp(r.reserved + base_r)),
                stack: stack_frames(s, e.stack, 6),
            });
            if Some(i) == last_oom {
                let mut m = r.map("oom", i);
                m.allocated_bytes = Bytes(clamp(r.allocated + base_a));
                m.reserved_bytes = Bytes(clamp(r.reserved + base_r));
                map = Some(m);
            }
        }
        r.step(e);
        if e.action == Action::Alloc {
            *site_allocs.entry(e.stack).or_default() += 1;
        }
        if i == peak_event && !trace.is_empty() {
            if last_oom.is_none() {
                let mut m = r.map("peak", i);
                m.allocated_bytes = Bytes(clamp(r.allocated + base_a));
                m.reserved_bytes = Bytes(clamp(r.reserved + base_r));
                map = Some(m);
            }
            let mut live: Vec<(u64, u32)> = r
                .segs
                .values()
                .flat_map(|g| g.blocks.values())
                .filter(|b| b.allocated && !b.freed)
                .map(|b| (b.size, b.stack))
                .collect();
            live.extend(r.loose.values().filter(|l| !l.2).map(|l| (l.0, l.1)));
            at_peak = Some(live);
        }
    }
    let live = at_peak.unwrap_or_else(|| {
        dev_segments
            .iter()
            .flat_map(|g| g.blocks.iter())
            .filter(|b| b.allocated)
            .map(|b| (b.size, b.stack))
            .collect()
    });
    let (top_sites, eval_sites_at_peak) = sites(s, &live, &site_allocs);
    Ok(SnapshotReport {
        device,
        trace_entries: trace.len(),
        peak_allocated_bytes: Bytes(clamp(peak_a)),
        peak_reserved_bytes: Bytes(clamp(peak_r)),
        peak_event,
        final_allocated_bytes: Bytes(final_allocated),
        final_reserved_bytes: Bytes(final_reserved),
        timeline,
        ooms,
        segment_map: map,
        top_sites,
        allocator_settings: s.allocator_settings.clone(),
        expandable_segments: s.expandable_segments(),
        max_split_size_bytes: s.max_split_size().map(Bytes),
        eval_sites_at_peak,
    })
}

fn all_frames(s: &Snapshot, stack: u32) -> impl Iterator<Item = &Frame> {
    s.stacks
        .get(stack as usize)
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .filter_map(|f| s.frames.get(*f as usize))
}

/// The innermost `n` frames worth showing: the Python frames when the stack has any, else
/// the C++ frames PyTorch's viewers show (unwinder and interpreter frames left out).
fn stack_frames(s: &Snapshot, stack: u32, n: usize) -> Vec<Frame> {
    let python: Vec<Frame> = all_frames(s, stack)
        .filter(|f| is_python_frame(f))
        .take(n)
        .cloned()
        .collect();
    if !python.is_empty() {
        return python;
    }
    all_frames(s, stack)
        .filter(|f| !is_plumbing_frame(f))
        .take(n)
        .cloned()
        .collect()
}

/// The allocation site of a stack: the innermost Python frame outside the libraries, else
/// the innermost Python frame; C++ frames are never a site.
fn site_of(s: &Snapshot, stack: u32) -> String {
    let f = all_frames(s, stack)
        .filter(|f| is_python_frame(f))
        .find(|f| !is_library_frame(f))
        .or_else(|| all_frames(s, stack).find(|f| is_python_frame(f)));
    match f {
        Some(f) => format!("{}:{} in {}", short_path(&f.filename), f.line, f.name),
        None => "(no Python frame: autograd backward or C++)".to_string(),
    }
}

fn short_path(p: &str) -> &str {
    let parts: Vec<usize> = p.match_indices('/').map(|(i, _)| i).collect();
    match parts.len() {
        0 | 1 => p,
        n => &p[parts[n - 2] + 1..],
    }
}

fn sites(
    s: &Snapshot,
    live: &[(u64, u32)],
    allocs: &HashMap<u32, u64>,
) -> (Vec<Site>, Vec<String>) {
    let mut by: HashMap<String, (u64, u64, u64, u32)> = HashMap::new();
    let mut eval = Vec::new();
    for (size, stack) in live {
        let e = by.entry(site_of(s, *stack)).or_insert((0, 0, 0, *stack));
        e.0 += size;
        e.1 += 1;
        // The user's own Python code only: C++ frames (`_PyEval_EvalFrameDefault` in every
        // `stacks="all"` snapshot) and library internals say nothing about the loop.
        for f in all_frames(s, *stack) {
            if is_python_frame(f)
                && !is_library_frame(f)
                && is_eval_name(&f.name)
                && !eval.contains(&f.name)
            {
                eval.push(f.name.clone());
            }
        }
    }
    for (stack, n) in allocs {
        if let Some(e) = by.get_mut(&site_of(s, *stack)) {
            e.2 += n;
        }
    }
    let mut v: Vec<Site> = by
        .into_iter()
        .map(|(site, (b, n, a, stack))| Site {
            site,
            bytes_at_peak: Bytes(b),
            blocks_at_peak: n,
            allocations: a,
            stack: stack_frames(s, stack, 4),
        })
        .collect();
    v.sort_by(|a, b| {
        b.bytes_at_peak
            .cmp(&a.bytes_at_peak)
            .then(a.site.cmp(&b.site))
    });
    v.truncate(TOP_SITES);
    (v, eval)
}

fn downsample(
    points: &[(usize, i64, i128, i128)],
    base_a: i128,
    base_r: i128,
) -> Vec<TimelinePoint> {
    let to_point = |p: &(usize, i64, i128, i128)| TimelinePoint {
        event: p.0,
        time_us: p.1,
        allocated_bytes: clamp(p.2 + base_a),
        reserved_bytes: clamp(p.3 + base_r),
    };
    if points.len() <= MAX_TIMELINE_POINTS {
        return points.iter().map(to_point).collect();
    }
    // Each bucket keeps its lowest and highest allocated point, in order.
    let per = points.len().div_ceil(MAX_TIMELINE_POINTS / 2);
    let mut out = Vec::with_capacity(MAX_TIMELINE_POINTS + 2);
    for chunk in points.chunks(per) {
        let (mut lo, mut hi) = (&chunk[0], &chunk[0]);
        for p in chunk {
            if p.2 < lo.2 {
                lo = p;
            }
            if p.2 > hi.2 || (p.2 == hi.2 && p.3 > hi.3) {
                hi = p;
            }
        }
        let (a, b) = if lo.0 <= hi.0 { (lo, hi) } else { (hi, lo) };
        out.push(to_point(a));
        if a.0 != b.0 {
            out.push(to_point(b));
        }
    }
    out
}

#[cfg(test)]
mod tests;
