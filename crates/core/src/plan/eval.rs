//! Evaluates an event list at a batch size: allocated timeline, peak, breakdown,
//! and reserved bytes through the caching-allocator model.

use serde::Serialize;

use super::allocator::{CachingAllocator, ExpandableBound, round_size};
use super::config::AllocatorConfig;
use super::error::PlanError;
use super::events::{Buffer, Category, Event, Events, Phase};
use crate::units::Bytes;

/// One point of the predicted allocated-bytes timeline of the measured step.
#[derive(Debug, Clone, Serialize)]
pub struct TimelinePoint {
    /// Event index within the step.
    pub index: u32,
    pub allocated: Bytes,
    pub phase: Phase,
    pub micro: u16,
}

/// Result of evaluating one batch.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub peak_allocated: Bytes,
    pub peak_reserved: Bytes,
    pub peak_phase: Phase,
    pub peak_node: Option<u32>,
    /// Bytes per [`Category`] live at the peak.
    pub breakdown: [u64; Category::COUNT],
    pub timeline: Vec<TimelinePoint>,
}

/// The three peaks only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peaks {
    pub allocated: Bytes,
    pub reserved: Bytes,
    pub nvidia_smi: Bytes,
}

/// Totals beyond 1 EiB are treated as overflow: no device is within a million times that.
const LIMIT: u64 = 1 << 60;

/// Rounded bytes of every buffer at `batch`. (`LIMIT` is a multiple of 512: rounding never
/// takes a size across it.)
fn sizes(ev: &Events, batch: u64) -> Result<Vec<u64>, PlanError> {
    let mut out = Vec::with_capacity(ev.buffers.len());
    for b in &ev.buffers {
        let bytes = b
            .per_sample
            .checked_mul(batch)
            .and_then(|x| x.checked_add(b.fixed));
        match bytes {
            Some(x) if x <= LIMIT => out.push(round_size(x)),
            _ => return Err(PlanError::Overflow("activation bytes")),
        }
    }
    Ok(out)
}

/// Whether no buffer's bytes at `batch` can pass [`LIMIT`]: the largest per-sample and the
/// largest fixed bytes of all buffers together stay within it.
fn sizes_within_limit(ev: &Events, batch: u64) -> bool {
    let (ps, fx) = ev
        .buffers
        .iter()
        .fold((0, 0), |(p, f), b| (b.per_sample.max(p), b.fixed.max(f)));
    ps.checked_mul(batch)
        .and_then(|x| x.checked_add(fx))
        .is_some_and(|x| x <= LIMIT)
}

/// Per buffer: its allocator handle, set at its allocation. (Its rounded bytes are computed
/// again at the free: cheaper than reading them back from a list twice the size.)
struct Slots {
    batch: u64,
    handles: Vec<u32>,
}

impl Slots {
    /// Fails as [`sizes`] does when a buffer's bytes overflow at `batch`. When the largest
    /// per-sample and fixed bytes of all buffers together stay within [`LIMIT`], no buffer
    /// can overflow and the sizes are computed at each allocation instead of in a pass.
    fn new(ev: &Events, batch: u64) -> Result<Slots, PlanError> {
        if !sizes_within_limit(ev, batch) {
            sizes(ev, batch)?;
        }
        Ok(Slots {
            batch,
            handles: vec![u32::MAX; ev.buffers.len()],
        })
    }

    /// Rounded bytes of buffer `b` (no overflow: checked in [`Slots::new`]).
    #[inline]
    fn size_of(&self, b: &Buffer) -> u64 {
        round_size(b.per_sample * self.batch + b.fixed)
    }
}

/// The `torch.cuda.empty_cache()` calls of an event list, run as the events are applied.
struct Flushes<'e> {
    at: &'e [u32],
    next: usize,
}

impl<'e> Flushes<'e> {
    fn new(ev: &'e Events) -> Flushes<'e> {
        Flushes {
            at: &ev.empty_cache,
            next: 0,
        }
    }

    /// Runs the calls due before event `i`.
    #[inline(always)]
    fn before(&mut self, i: usize, a: &mut CachingAllocator) {
        while self.next < self.at.len() && self.at[self.next] as usize <= i {
            a.empty_cache();
            self.next += 1;
        }
    }
}

/// Whether the whole event list (model creation, warm-up, measured step) runs without a
/// CUDA OOM when the allocator may reserve at most `cap` bytes.
pub fn runs_within(
    ev: &Events,
    batch: u64,
    alloc_cfg: AllocatorConfig,
    cap: Bytes,
) -> Result<bool, PlanError> {
    Ok(reserved_within(ev, batch, alloc_cfg, cap)?.is_some())
}

/// An upper bound of the peak reserved bytes of [`reserved_within`] at `batch` under any cap
/// at least that bound, where one is cheap to give ([`ExpandableBound`]): with expandable
/// segments, no side stream, no `empty_cache()` and sizes that cannot overflow (the cases
/// where [`reserved_within`] replays the plain allocator and cannot fail but for the cap);
/// `None` otherwise.
pub fn reserved_bound(ev: &Events, batch: u64, alloc_cfg: AllocatorConfig) -> Option<Bytes> {
    if !alloc_cfg.expandable_segments || ev.side_streams || !ev.empty_cache.is_empty() {
        return None;
    }
    if !sizes_within_limit(ev, batch) {
        return None;
    }
    // The generation fed the same bound with the same rounded sizes at batch 1, in the
    // events' order (the make-it-fit search's seeds ask batch 1 only).
    if batch == 1
        && let Some(b) = ev.bound_at_one
    {
        return Some(Bytes(b));
    }
    let mut bound = ExpandableBound::default();
    for e in &ev.events {
        let b = &ev.buffers[e.buffer as usize];
        let size = round_size(b.per_sample * batch + b.fixed);
        if e.alloc {
            bound.malloc_rounded(size);
        } else {
            bound.free_rounded(size);
        }
    }
    Some(Bytes(bound.reserved()))
}

/// The peak reserved bytes when the allocator may reserve at most `cap` bytes: near the cap
/// PyTorch releases cached segments before it fails, so this can be well below the uncapped
/// peak. `None` on a CUDA OOM.
pub fn reserved_within(
    ev: &Events,
    batch: u64,
    alloc_cfg: AllocatorConfig,
    cap: Bytes,
) -> Result<Option<Bytes>, PlanError> {
    let mut slots = Slots::new(ev, batch)?;
    let mut allocator = CachingAllocator::with_cap(alloc_cfg, cap.0);
    if ev.side_streams {
        return side_reserved_within(ev, &mut slots, allocator, alloc_cfg, cap);
    }
    let mut flushes = Flushes::new(ev);
    let start = ev.measured_start.min(ev.events.len());
    let mut at_start = (0, 0);
    for (i, e) in ev.events.iter().enumerate() {
        flushes.before(i, &mut allocator);
        if i == start {
            at_start = (allocator.reserved, allocator.flushes);
        }
        let b = e.buffer as usize;
        if e.alloc {
            slots.handles[b] = allocator.malloc_rounded(slots.size_of(&ev.buffers[b]));
            if allocator.oom {
                return Ok(None);
            }
        } else {
            allocator.free(slots.handles[b]);
        }
    }
    if !later_steps(ev, &mut slots, &mut allocator, at_start) {
        return Ok(None);
    }
    Ok(Some(Bytes(allocator.peak_reserved)))
}

/// [`reserved_within`] with side-stream pools: the side pool's segments count against
/// the cap with the main pool's (the side pool itself is not capped; the sum is checked).
fn side_reserved_within(
    ev: &Events,
    slots: &mut Slots,
    mut allocator: CachingAllocator,
    alloc_cfg: AllocatorConfig,
    cap: Bytes,
) -> Result<Option<Bytes>, PlanError> {
    let mut side = CachingAllocator::new(alloc_cfg);
    let mut peak = 0u64;
    for e in &ev.events {
        let b = e.buffer as usize;
        let buf = &ev.buffers[b];
        let pool = if buf.side_stream {
            &mut side
        } else {
            &mut allocator
        };
        if e.alloc {
            slots.handles[b] = pool.malloc_rounded(slots.size_of(buf));
            let total = allocator.reserved + side.reserved;
            if allocator.oom || total > cap.0 {
                return Ok(None);
            }
            peak = peak.max(total);
        } else {
            pool.free(slots.handles[b]);
        }
    }
    Ok(Some(Bytes(peak)))
}

/// The live bytes while the events run: in total, per category, and in the allocator.
struct Run<'e> {
    ev: &'e Events,
    slots: Slots,
    allocator: CachingAllocator,
    /// The side streams' pool (FSDP2's all-gather / reduce-scatter streams).
    side: CachingAllocator,
    /// Peak of the two pools' reserved bytes together.
    side_peak: u64,
    current: u64,
    live: [u64; Category::COUNT],
}

impl Run<'_> {
    /// Applies event `e`.
    #[inline(always)]
    fn apply(&mut self, e: &Event) -> Result<(), PlanError> {
        let b = e.buffer as usize;
        let buf = &self.ev.buffers[b];
        let cat = buf.category.index();
        let size = self.slots.size_of(buf);
        if e.alloc {
            self.current = match self.current.checked_add(size) {
                Some(c) if c <= LIMIT => c,
                // (not `ok_or`: that builds, and drops, an error per event)
                _ => return Err(PlanError::Overflow("allocated bytes")),
            };
            self.live[cat] += size;
            if self.ev.side_streams {
                let pool = if buf.side_stream {
                    &mut self.side
                } else {
                    &mut self.allocator
                };
                self.slots.handles[b] = pool.malloc_rounded(size);
                self.side_peak = self
                    .side_peak
                    .max(self.allocator.reserved + self.side.reserved);
            } else {
                self.slots.handles[b] = self.allocator.malloc_rounded(size);
                if self.ev.whole_blocks {
                    self.current = self.allocator.allocated;
                }
            }
        } else {
            self.current -= size;
            self.live[cat] -= size;
            if buf.side_stream {
                self.side.free(self.slots.handles[b]);
            } else {
                self.allocator.free(self.slots.handles[b]);
                if self.ev.whole_blocks {
                    self.current = self.allocator.allocated;
                }
            }
        }
        Ok(())
    }
}

/// [`reserved_within`] (`None` on a CUDA OOM) and, when the capped allocator never reached
/// its cap — it then ran exactly as an uncapped one — the uncapped [`peaks`] too, from the
/// same replay (`context` added for nvidia-smi). The make-it-fit search's max-batch replay
/// at the batch that fits is then also the candidate's figures. Lists with side streams are
/// replayed by [`reserved_within`] alone.
pub fn reserved_and_peaks_within(
    ev: &Events,
    batch: u64,
    alloc_cfg: AllocatorConfig,
    cap: Bytes,
    context: Bytes,
) -> Result<(Option<Bytes>, Option<Peaks>), PlanError> {
    if ev.side_streams {
        return Ok((reserved_within(ev, batch, alloc_cfg, cap)?, None));
    }
    let mut slots = Slots::new(ev, batch)?;
    let mut allocator = CachingAllocator::with_cap(alloc_cfg, cap.0);
    // `evaluate`'s allocated bytes (`Run::apply` without the breakdown, one pool), stopped
    // at the OOM as `reserved_within` is.
    let start = ev.measured_start.min(ev.events.len());
    let mut flushes = Flushes::new(ev);
    let (mut current, mut peak) = (0u64, 0u64);
    let mut at_start = (0, 0);
    for (i, e) in ev.events.iter().enumerate() {
        flushes.before(i, &mut allocator);
        if i == start {
            peak = current;
            at_start = (allocator.reserved, allocator.flushes);
        }
        let b = e.buffer as usize;
        let size = slots.size_of(&ev.buffers[b]);
        if e.alloc {
            current = match current.checked_add(size) {
                Some(c) if c <= LIMIT => c,
                _ => return Err(PlanError::Overflow("allocated bytes")),
            };
            slots.handles[b] = allocator.malloc_rounded(size);
            if allocator.oom {
                return Ok((None, None));
            }
        } else {
            current -= size;
            allocator.free(slots.handles[b]);
        }
        if ev.whole_blocks {
            current = allocator.allocated;
        }
        if i >= start && current > peak {
            peak = current;
        }
    }
    if start == ev.events.len() {
        peak = current;
    }
    if !later_steps(ev, &mut slots, &mut allocator, at_start) {
        return Ok((None, None));
    }
    let reserved = Bytes(allocator.peak_reserved);
    if allocator.reached_cap {
        return Ok((Some(reserved), None));
    }
    let reserved_uncapped = Bytes(allocator.peak_reserved.max(peak));
    let smi = reserved_uncapped
        .checked_add(context)
        .ok_or(PlanError::Overflow("nvidia-smi bytes"))?;
    Ok((
        Some(reserved),
        Some(Peaks {
            allocated: Bytes(peak),
            reserved: reserved_uncapped,
            nvidia_smi: smi,
        }),
    ))
}

/// Full evaluation; `timeline` keeps one point per event of the measured step.
pub fn evaluate(
    ev: &Events,
    batch: u64,
    alloc_cfg: AllocatorConfig,
    timeline: bool,
) -> Result<Evaluation, PlanError> {
    let mut run = Run {
        ev,
        slots: Slots::new(ev, batch)?,
        allocator: CachingAllocator::new(alloc_cfg),
        side: CachingAllocator::new(alloc_cfg),
        side_peak: 0,
        current: 0,
        live: [0; Category::COUNT],
    };
    let start = ev.measured_start.min(ev.events.len());
    let (before, measured) = ev.events.split_at(start);
    let mut flushes = Flushes::new(ev);
    for (i, e) in before.iter().enumerate() {
        flushes.before(i, &mut run.allocator);
        run.apply(e)?;
    }
    let at_start = (run.allocator.reserved, run.allocator.flushes);
    // The measured step's peak starts from the bytes live when it begins.
    let mut peak = run.current;
    let mut peak_breakdown = run.live;
    let mut peak_phase = Phase::ZeroGrad;
    let mut peak_node = None;
    let mut points = Vec::with_capacity(if timeline { measured.len() } else { 0 });
    for (i, e) in measured.iter().enumerate() {
        flushes.before(start + i, &mut run.allocator);
        run.apply(e)?;
        if run.current > peak {
            peak = run.current;
            peak_breakdown = run.live;
            peak_phase = e.phase;
            peak_node = (e.node != u32::MAX).then_some(e.node);
        }
        if timeline {
            points.push(TimelinePoint {
                index: i as u32,
                allocated: Bytes(run.current),
                phase: e.phase,
                micro: e.micro,
            });
        }
    }
    if !ev.side_streams {
        later_steps(ev, &mut run.slots, &mut run.allocator, at_start);
    }
    Ok(Evaluation {
        peak_allocated: Bytes(peak),
        peak_reserved: Bytes(
            if ev.side_streams {
                run.side_peak
            } else {
                run.allocator.peak_reserved
            }
            .max(peak),
        ),
        peak_phase,
        peak_node,
        breakdown: peak_breakdown,
        timeline: points,
    })
}

/// Allocated and reserved bytes (`memory_allocated()`, `memory_reserved()`) when the measured
/// part begins and after each of its events; the peaks of [`evaluate`] are the largest of
/// these.
pub fn memory_trace(
    ev: &Events,
    batch: u64,
    alloc_cfg: AllocatorConfig,
) -> Result<Vec<(Bytes, Bytes)>, PlanError> {
    let mut run = Run {
        ev,
        slots: Slots::new(ev, batch)?,
        allocator: CachingAllocator::new(alloc_cfg),
        side: CachingAllocator::new(alloc_cfg),
        side_peak: 0,
        current: 0,
        live: [0; Category::COUNT],
    };
    let start = ev.measured_start.min(ev.events.len());
    let (before, measured) = ev.events.split_at(start);
    let mut flushes = Flushes::new(ev);
    for (i, e) in before.iter().enumerate() {
        flushes.before(i, &mut run.allocator);
        run.apply(e)?;
    }
    let mut out = Vec::with_capacity(measured.len() + 1);
    let point = |r: &Run| {
        let reserved = r.allocator.reserved + r.side.reserved;
        (Bytes(r.current), Bytes(reserved.max(r.current)))
    };
    out.push(point(&run));
    for (i, e) in measured.iter().enumerate() {
        flushes.before(start + i, &mut run.allocator);
        run.apply(e)?;
        out.push(point(&run));
    }
    Ok(out)
}

/// Peaks only (used by sweeps and the max-batch search).
pub fn peaks(
    ev: &Events,
    batch: u64,
    alloc_cfg: AllocatorConfig,
    context: Bytes,
) -> Result<Peaks, PlanError> {
    let e = evaluate(ev, batch, alloc_cfg, false)?;
    let smi = e
        .peak_reserved
        .checked_add(context)
        .ok_or(PlanError::Overflow("nvidia-smi bytes"))?;
    Ok(Peaks {
        allocated: e.peak_allocated,
        reserved: e.peak_reserved,
        nvidia_smi: smi,
    })
}

/// The measured step's live bytes as lines `slope × batch + intercept`, one per local
/// maximum (the live bytes before a free, or at the end): an allocation raises both slope
/// and intercept, so the point before it is below the point after it at every batch and
/// never the peak. Built in one pass without sorting; a query scans the lines, which for a
/// handful of queries (the max-batch bracket) is cheaper than building [`PeakEnvelope`]'s
/// hull. Block rounding and the warm-up are left out: a lower bound of the peak allocated.
#[derive(Debug, Clone)]
pub struct LivePeaks {
    points: Vec<(u64, u64)>,
}

impl LivePeaks {
    pub fn new(ev: &Events) -> LivePeaks {
        let mut a: u64 = 0;
        let mut b: u64 = 0;
        let mut points: Vec<(u64, u64)> = Vec::new();
        let apply = |e: &Event, a: &mut u64, b: &mut u64| {
            let buf = &ev.buffers[e.buffer as usize];
            if e.alloc {
                *a = a.saturating_add(buf.per_sample);
                *b = b.saturating_add(buf.fixed);
            } else {
                *a = a.saturating_sub(buf.per_sample);
                *b = b.saturating_sub(buf.fixed);
            }
        };
        // The events before the last one ahead of the measured step only move the live
        // bytes: no point is taken there.
        let n = ev.events.len();
        let first = ev.measured_start.saturating_sub(1).min(n);
        let (before, rest) = ev.events.split_at(first);
        for e in before {
            apply(e, &mut a, &mut b);
        }
        for (i, e) in rest.iter().enumerate() {
            apply(e, &mut a, &mut b);
            let next_allocates = rest.get(i + 1).is_some_and(|next| next.alloc);
            if (i + 1 == rest.len() || !next_allocates) && points.last() != Some(&(a, b)) {
                points.push((a, b));
            }
        }
        LivePeaks { points }
    }

    /// Peak of the measured step's live bytes at `batch` (saturating).
    pub fn at(&self, batch: u64) -> Bytes {
        Bytes(
            self.points
                .iter()
                .map(|&(s, c)| s.saturating_mul(batch).saturating_add(c))
                .max()
                .unwrap_or(0),
        )
    }
}

/// The peak allocated bytes as a function of the batch, precomputed once: at every event of
/// the measured step the live bytes are `slope × batch + intercept`, so the peak is the upper
/// envelope of those lines (convex-hull trick). A query is a binary search; 512-byte block
/// rounding is left out, so values are exact to within 512 B per live buffer.
#[derive(Debug, Clone)]
pub struct PeakEnvelope {
    /// Hull lines (slope, intercept), slopes increasing.
    lines: Vec<(u64, u64)>,
    /// `breaks[i]`: from this batch on, line i+1 is at least line i.
    breaks: Vec<f64>,
}

impl PeakEnvelope {
    pub fn new(ev: &Events) -> PeakEnvelope {
        PeakEnvelope::of(&LivePeaks::new(ev))
    }

    /// The hull of `live`'s lines.
    pub fn of(live: &LivePeaks) -> PeakEnvelope {
        let mut candidates = live.points.clone();
        // Keep the best intercept per slope, then the upper hull for batch ≥ 1.
        candidates.sort_unstable();
        let mut dedup: Vec<(u64, u64)> = Vec::new();
        for (s, c) in candidates {
            match dedup.last_mut() {
                Some(last) if last.0 == s => last.1 = last.1.max(c),
                _ => dedup.push((s, c)),
            }
        }
        let cross = |l1: (u64, u64), l2: (u64, u64)| -> f64 {
            // batch where l2 (larger slope) overtakes l1
            (l1.1 as f64 - l2.1 as f64) / (l2.0 as f64 - l1.0 as f64)
        };
        let mut lines: Vec<(u64, u64)> = Vec::new();
        for l in dedup {
            // A line with a larger slope but a smaller intercept may still win later.
            while let Some(&top) = lines.last() {
                if top.1 <= l.1 {
                    lines.pop();
                    continue;
                }
                if lines.len() >= 2 {
                    let prev = lines[lines.len() - 2];
                    if cross(prev, l) <= cross(prev, top) {
                        lines.pop();
                        continue;
                    }
                }
                break;
            }
            lines.push(l);
        }
        let breaks = lines.windows(2).map(|w| cross(w[0], w[1])).collect();
        PeakEnvelope { lines, breaks }
    }

    /// Peak allocated bytes at `batch` (saturating).
    pub fn at(&self, batch: u64) -> Bytes {
        let x = batch as f64;
        let i = self.breaks.partition_point(|&br| br <= x);
        let (s, c) = self.lines.get(i).copied().unwrap_or((0, 0));
        Bytes(s.saturating_mul(batch).saturating_add(c))
    }
}

/// The steps after the measured one, replayed until the allocator's state repeats: the
/// runners measure the third step of a process (two warm-up steps), a user's run goes on for
/// thousands, and where a step reserved a new segment or released cached ones (near a cap)
/// the next starts from a different cache and may reserve (or run out of memory) where the
/// one before did not. A step that reserves nothing and releases nothing leaves the cache as
/// the step before it left it (the same requests into the same free blocks), so the replay
/// stops there; at most [`LATER_STEPS`] steps. Only when the measured step itself changed
/// the cache since `at_start` (its reserved bytes and cache flushes when it began), otherwise
/// it already repeats the warm-up's. False on a CUDA OOM.
fn later_steps(
    ev: &Events,
    slots: &mut Slots,
    a: &mut CachingAllocator,
    at_start: (u64, u32),
) -> bool {
    if (a.reserved, a.flushes) == at_start {
        return true;
    }
    let Some(rep) = StepRepeat::new(ev) else {
        return true;
    };
    for _ in 0..LATER_STEPS {
        match rep.replay(ev, slots, a) {
            Replayed::Oom => return false,
            Replayed::Repeats => break,
            Replayed::Changed => {}
        }
    }
    true
}

/// At most this many steps after the measured one (every measured row repeats after one).
const LATER_STEPS: u32 = 4;

enum Replayed {
    Oom,
    Repeats,
    Changed,
}

/// The measured step replayed after itself (the runner's third step, a user's later steps):
/// a buffer the step frees that an earlier step made (zero_grad's gradients) is the previous
/// replay's counterpart, `delta` ids higher, as the repeated step numbers them
/// (`sim/repeat.rs`).
struct StepRepeat {
    /// Per measured event: the buffer whose handle it allocates or frees.
    target: Vec<u32>,
}

impl StepRepeat {
    /// `None` when the measured step's carried-in frees have no counterpart `delta` ids higher
    /// (a step that does not repeat: multi-GPU walks).
    fn new(ev: &Events) -> Option<StepRepeat> {
        let ms = ev.measured_start.min(ev.events.len());
        if ev.empty_cache.last().is_some_and(|&i| i as usize >= ms) {
            return None;
        }
        let n = ev.buffers.len();
        let mut made = vec![false; n];
        for e in ev.events[ms..].iter().filter(|e| e.alloc) {
            made[e.buffer as usize] = true;
        }
        let fm = ev.events[ms..]
            .iter()
            .filter(|e| e.alloc)
            .map(|e| e.buffer)
            .min()?;
        let fw = ev.events[..ms]
            .iter()
            .filter(|e| e.alloc && e.phase != Phase::Setup)
            .map(|e| e.buffer)
            .min()?;
        let delta = fm.checked_sub(fw)?;
        let sig = |b: usize| {
            let x = &ev.buffers[b];
            (x.per_sample, x.fixed, x.category)
        };
        let mut target = Vec::with_capacity(ev.events.len() - ms);
        for e in &ev.events[ms..] {
            let b = e.buffer as usize;
            if e.alloc || made[b] {
                target.push(e.buffer);
            } else {
                let y = b + delta as usize;
                if y >= n || !made[y] || sig(b) != sig(y) {
                    return None;
                }
                target.push(y as u32);
            }
        }
        Some(StepRepeat { target })
    }

    /// Replays the measured step once.
    fn replay(&self, ev: &Events, slots: &mut Slots, a: &mut CachingAllocator) -> Replayed {
        let ms = ev.measured_start.min(ev.events.len());
        let (segments, flushes) = (a.reserved, a.flushes);
        for (e, &t) in ev.events[ms..].iter().zip(&self.target) {
            let t = t as usize;
            if e.alloc {
                slots.handles[t] = a.malloc_rounded(slots.size_of(&ev.buffers[t]));
                if a.oom {
                    return Replayed::Oom;
                }
            } else {
                a.free(slots.handles[t]);
            }
        }
        if a.reserved <= segments && a.flushes == flushes {
            Replayed::Repeats
        } else {
            Replayed::Changed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset::find_builtin;
    use crate::plan::{Planner, TrainConfig};

    #[test]
    fn live_peaks_are_the_maximum_over_every_event_of_the_measured_step() {
        // Brute force: the live bytes after every event of the measured step, unfiltered.
        // The local maxima kept by `LivePeaks`, and the hull built from them, give the same
        // peak at every batch (checkpointing and LoRA change the event shapes).
        for (id, size, ckpt) in [
            ("resnet18", 64, false),
            ("gpt2", 128, true),
            ("TinyLlama-1.1B", 128, false),
        ] {
            let p = find_builtin(id).expect("preset");
            let cfg = TrainConfig {
                size: Some(size),
                checkpointing: ckpt,
                ..TrainConfig::default()
            };
            let planner = Planner::new(&p, &cfg).expect("planner");
            let ev = &planner.events;
            let (mut a, mut c) = (0u64, 0u64);
            let mut all = Vec::new();
            for (i, e) in ev.events.iter().enumerate() {
                let buf = &ev.buffers[e.buffer as usize];
                if e.alloc {
                    a += buf.per_sample;
                    c += buf.fixed;
                } else {
                    a -= buf.per_sample;
                    c -= buf.fixed;
                }
                if i + 1 >= ev.measured_start {
                    all.push((a, c));
                }
            }
            let live = LivePeaks::new(ev);
            assert!(live.points.len() < all.len(), "{id}: no point dropped");
            let env = PeakEnvelope::of(&live);
            for b in [1u64, 2, 3, 5, 8, 13, 64, 100, 1000, 4096] {
                let brute = all.iter().map(|&(s, k)| s * b + k).max().expect("events");
                assert_eq!(live.at(b).0, brute, "{id} b={b}");
                assert_eq!(env.at(b).0, brute, "{id} b={b} (hull)");
            }
        }
    }

    #[test]
    fn envelope_matches_full_evaluation() {
        for (id, size) in [("resnet18", 64), ("gpt2", 128), ("TinyLlama-1.1B", 128)] {
            let p = find_builtin(id).expect("preset");
            let cfg = TrainConfig {
                size: Some(size),
                ..TrainConfig::default()
            };
            let planner = Planner::new(&p, &cfg).expect("planner");
            let env = PeakEnvelope::new(&planner.events);
            for b in [1, 2, 3, 7, 16, 33, 100] {
                let exact = planner.peaks(b).expect("peaks").allocated.0;
                let fast = env.at(b).0;
                let live = planner.events.buffers.len() as u64;
                assert!(
                    fast <= exact && exact - fast <= 512 * live,
                    "{id} b={b}: {fast} vs {exact}"
                );
                assert!((exact - fast) as f64 / (exact as f64) < 0.01, "{id} b={b}");
            }
        }
    }
}
