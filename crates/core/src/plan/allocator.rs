//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`):
//! 512-byte rounding, a small pool of 2 MiB segments for requests ≤ 1 MiB, large
//! segments of 20 MiB (requests < 10 MiB) or rounded up to 2 MiB, best-fit reuse of
//! cached blocks, splitting and coalescing, `max_split_size_mb` and
//! `expandable_segments`. It turns allocation events into reserved bytes.

use super::free_bins::FreeBins;

use super::config::AllocatorConfig;

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const ROUND_LARGE: u64 = 2 << 20;

/// Bytes PyTorch actually reserves for a request of `size` bytes (block rounding).
pub fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK {
        MIN_BLOCK
    } else {
        size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }
}

fn segment_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// "No block" in [`Block::prev`] and [`Block::next`].
const NONE: u32 = u32::MAX;
/// The segment of blocks of expandable segments.
const EXPANDABLE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    offset: u64,
    segment: u32,
    /// Neighbours within the segment, or [`NONE`].
    prev: u32,
    next: u32,
    free: bool,
    small: bool,
}

/// Simulated allocator state.
#[derive(Debug, Default)]
pub struct CachingAllocator {
    cfg: AllocatorConfig,
    blocks: Vec<Block>,
    /// Free blocks ordered by (size, segment, offset) packed into one integer, as
    /// PyTorch's `BlockComparatorSize` orders them; value = block id.
    free_small: FreeBins,
    free_large: FreeBins,
    segments: u32,
    /// Bytes of all segments (what `memory_reserved()` reports).
    pub reserved: u64,
    /// Bytes of all allocated blocks (what `memory_allocated()` reports).
    pub allocated: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Expandable segments: bytes mapped per pool.
    mapped_large: u64,
    live_large: u64,
    /// Device memory the allocator may reserve (None = unlimited).
    cap: Option<u64>,
    /// Set when a request could not be served within `cap`, even after releasing
    /// every cached segment that holds no live block (PyTorch's OOM condition).
    pub oom: bool,
    /// Set when a request would have passed `cap` (cached segments released then): until
    /// it is set, a capped allocator has run exactly as an uncapped one.
    pub reached_cap: bool,
    /// Times cached segments were released to stay within `cap` (PyTorch's
    /// `num_alloc_retries`).
    pub flushes: u32,
    /// Per segment: (size, first block, released).
    segs: Vec<(u64, u32, bool)>,
    /// The segments not released yet (what `release_cached` looks at: `empty_cache()` may run
    /// thousands of times in one call).
    open: Vec<u32>,
    /// Ids of blocks merged into a neighbour (or freed expandable blocks), reused for new
    /// blocks so that the table stays as small as the live blocks.
    dead: Vec<u32>,
}

impl CachingAllocator {
    pub fn new(cfg: AllocatorConfig) -> Self {
        CachingAllocator {
            cfg,
            ..Default::default()
        }
    }

    /// An allocator that may reserve at most `cap` bytes, like a GPU of that size.
    pub fn with_cap(cfg: AllocatorConfig, cap: u64) -> Self {
        CachingAllocator {
            cfg,
            cap: Some(cap),
            ..Default::default()
        }
    }

    /// Pre-sizes the block table for about `n` blocks.
    pub fn reserve_blocks(&mut self, n: usize) {
        self.blocks.reserve(n);
    }

    /// Stores a new block in a dead block's slot or at the end; returns its id.
    fn add_block(&mut self, block: Block) -> u32 {
        match self.dead.pop() {
            Some(id) => {
                self.blocks[id as usize] = block;
                id
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    /// Frees every cached segment without live blocks (`release_cached_blocks`).
    fn release_cached(&mut self) {
        let mut open = std::mem::take(&mut self.open);
        open.retain(|&s| {
            let (size, head, _) = self.segs[s as usize];
            let b = self.blocks[head as usize];
            if b.free && b.size == size {
                self.remove_free(head);
                self.segs[s as usize].2 = true;
                self.reserved -= size;
                false
            } else {
                true
            }
        });
        self.open = open;
    }

    /// `torch.cuda.empty_cache()`: every cached segment without a live block goes back to
    /// the device (`release_cached_blocks`); expandable segments unmap their free pages.
    pub fn empty_cache(&mut self) {
        self.release_cached();
        let need = self.live_large.div_ceil(LARGE_BUFFER) * LARGE_BUFFER;
        if self.mapped_large > need {
            self.reserved -= self.mapped_large - need;
            self.mapped_large = need;
        }
    }

    /// Accounts for a new segment of `seg` bytes, honouring the cap.
    fn reserve(&mut self, seg: u64) {
        if let Some(cap) = self.cap
            && self.reserved.saturating_add(seg) > cap
        {
            self.reached_cap = true;
            self.flushes += 1;
            self.release_cached();
            if self.reserved.saturating_add(seg) > cap {
                self.oom = true;
            }
        }
        self.reserved = self.reserved.saturating_add(seg);
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }

    fn max_split(&self) -> u64 {
        self.cfg
            .max_split_size_mb
            .map_or(u64::MAX, |mb| mb.saturating_mul(1 << 20))
    }

    fn key(&self, id: u32) -> u128 {
        let b = &self.blocks[id as usize];
        // Offsets are multiples of 512: 40 bits of them cover 512 TiB per segment.
        (u128::from(b.size) << 64)
            | (u128::from(0xFF_FFFF - (b.segment & 0xFF_FFFF)) << 40)
            | u128::from(b.offset >> 9)
    }

    fn insert_free(&mut self, id: u32) {
        let k = self.key(id);
        if self.blocks[id as usize].small {
            self.free_small.insert(k, id);
        } else {
            self.free_large.insert(k, id);
        }
    }

    fn remove_free(&mut self, id: u32) {
        let k = self.key(id);
        if self.blocks[id as usize].small {
            self.free_small.remove(k);
        } else {
            self.free_large.remove(k);
        }
    }

    /// Allocates `size` bytes; returns a handle for [`free`](Self::free).
    pub fn malloc(&mut self, size: u64) -> u32 {
        self.malloc_rounded(round_size(size))
    }

    /// [`malloc`](Self::malloc) of a size already rounded by [`round_size`].
    pub fn malloc_rounded(&mut self, size: u64) -> u32 {
        debug_assert_eq!(size, round_size(size));
        let small = size <= SMALL_SIZE;
        if self.cfg.expandable_segments && !small {
            return self.malloc_expandable(size);
        }
        let max_split = self.max_split();
        let pool = if small {
            &self.free_small
        } else {
            &self.free_large
        };
        // Best fit: the smallest cached block that is large enough, unless it is an
        // oversize block reserved for oversize requests.
        let found = pool.best_fit(size).filter(|fit| {
            let bsize = fit.size();
            // A fit is never smaller than the request (defensive: keys saturate for
            // absurd sizes).
            bsize >= size
                && (small
                    || !((size < max_split && bsize >= max_split)
                        || (size >= max_split && bsize >= size + LARGE_BUFFER)))
        });
        let id = match found {
            Some(fit) => {
                if small {
                    self.free_small.take(fit);
                } else {
                    self.free_large.take(fit);
                }
                fit.id
            }
            None => {
                let seg = segment_size(size);
                self.reserve(seg);
                let segment = self.segments;
                self.segments += 1;
                let head = self.add_block(Block {
                    size: seg,
                    offset: 0,
                    segment,
                    prev: NONE,
                    next: NONE,
                    free: true,
                    small,
                });
                self.segs.push((seg, head, false));
                self.open.push(segment);
                head
            }
        };
        // Saturating: an absurd request (the plan reports its overflow) must not panic here.
        let remaining = self.blocks[id as usize].size.saturating_sub(size);
        let split = if small {
            remaining >= MIN_BLOCK
        } else {
            size < max_split && remaining > SMALL_SIZE
        };
        if split {
            let b = self.blocks[id as usize];
            let rid = self.add_block(Block {
                size: remaining,
                offset: b.offset + size,
                segment: b.segment,
                prev: id,
                next: b.next,
                free: true,
                small,
            });
            if b.next != NONE {
                self.blocks[b.next as usize].prev = rid;
            }
            let blk = &mut self.blocks[id as usize];
            blk.size = size;
            blk.next = rid;
            self.insert_free(rid);
        }
        let blk = &mut self.blocks[id as usize];
        blk.free = false;
        self.allocated = self.allocated.saturating_add(blk.size);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        id
    }

    fn malloc_expandable(&mut self, size: u64) -> u32 {
        // One growing segment mapped in 20 MiB pages: memory is reused without
        // fragmentation, so reserved follows the live bytes rounded to pages.
        self.live_large = self.live_large.saturating_add(size);
        let need = self.live_large.div_ceil(LARGE_BUFFER) * LARGE_BUFFER;
        if need > self.mapped_large {
            let grow = need - self.mapped_large;
            self.mapped_large = need;
            self.reserve(grow);
        }
        let id = self.add_block(Block {
            size,
            offset: 0,
            segment: EXPANDABLE,
            prev: NONE,
            next: NONE,
            free: false,
            small: false,
        });
        self.allocated = self.allocated.saturating_add(size);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        id
    }

    /// Returns a block to the cache, merging it with free neighbours.
    pub fn free(&mut self, id: u32) {
        let b = self.blocks[id as usize];
        if b.free {
            return;
        }
        self.allocated = self.allocated.saturating_sub(b.size);
        self.blocks[id as usize].free = true;
        if b.segment == EXPANDABLE {
            self.live_large = self.live_large.saturating_sub(b.size);
            self.dead.push(id);
            return;
        }
        let mut id = id;
        if b.prev != NONE && self.blocks[b.prev as usize].free {
            let p = b.prev;
            self.remove_free(p);
            let pb = &mut self.blocks[p as usize];
            pb.size += b.size;
            pb.next = b.next;
            if b.next != NONE {
                self.blocks[b.next as usize].prev = p;
            }
            self.dead.push(id);
            id = p;
        }
        let n = self.blocks[id as usize].next;
        if n != NONE && self.blocks[n as usize].free {
            self.remove_free(n);
            let nb = self.blocks[n as usize];
            let cur = &mut self.blocks[id as usize];
            cur.size += nb.size;
            cur.next = nb.next;
            if nb.next != NONE {
                self.blocks[nb.next as usize].prev = id;
            }
            self.dead.push(n);
        }
        self.insert_free(id);
    }

    /// Where the allocated block `id` lives: `(segment, byte offset, rounded bytes)`;
    /// `None` for blocks of expandable segments, which have no fixed segment. (Ids of freed
    /// blocks are reused for later blocks.)
    pub fn block_location(&self, id: u32) -> Option<(u32, u64, u64)> {
        let b = self.blocks.get(id as usize)?;
        (b.segment != EXPANDABLE).then_some((b.segment, b.offset, b.size))
    }

    /// Number of segments created so far (released ones included); segment `i` has
    /// `segment_size(i)` bytes.
    pub fn segment_count(&self) -> u32 {
        self.segs.len() as u32
    }

    /// Bytes of segment `i` (0 when there is no such segment).
    pub fn segment_size(&self, i: u32) -> u64 {
        self.segs.get(i as usize).map_or(0, |s| s.0)
    }

    /// Whether segment `i` was returned to the device (capped mode, before an OOM retry).
    pub fn segment_released(&self, i: u32) -> bool {
        self.segs.get(i as usize).is_some_and(|s| s.2)
    }

    /// Bytes reserved but not allocated: cached free blocks.
    pub fn cached_free(&self) -> u64 {
        self.reserved - self.allocated
    }
}

/// An upper bound of the peak reserved bytes of an uncapped allocator with
/// `expandable_segments`, fed the same (rounded) requests and frees, in one pass without
/// the allocator: the large pool maps the live large bytes rounded up to 20 MiB pages (its
/// peak is the largest live large bytes, so rounded), and the small pool opens a 2 MiB
/// segment only when no cached block fits — every segment then holds a live block, since a
/// segment whose blocks are all free is one free 2 MiB block that any small request fits —
/// so it has at most as many segments as small blocks are ever live at once. Under a cap at
/// least this bound the capped allocator never reaches its cap: it runs as the uncapped one
/// and never fails ([`crate::plan::search::fits`] skips its replay then).
#[derive(Debug, Default, Clone, Copy)]
pub struct ExpandableBound {
    live_large: u64,
    max_live_large: u64,
    live_small: u64,
    max_live_small: u64,
}

impl ExpandableBound {
    /// A request of `size` bytes, rounded by [`round_size`].
    #[inline]
    pub fn malloc_rounded(&mut self, size: u64) {
        if size <= SMALL_SIZE {
            self.live_small += 1;
            self.max_live_small = self.max_live_small.max(self.live_small);
        } else {
            self.live_large = self.live_large.saturating_add(size);
            self.max_live_large = self.max_live_large.max(self.live_large);
        }
    }

    /// The free of a block of `size` rounded bytes, allocated before.
    #[inline]
    pub fn free_rounded(&mut self, size: u64) {
        if size <= SMALL_SIZE {
            self.live_small = self.live_small.saturating_sub(1);
        } else {
            self.live_large = self.live_large.saturating_sub(size);
        }
    }

    /// Starts a window of requests: the peaks from here are the window's own until
    /// [`end_window`](Self::end_window); returns what to give it.
    pub fn start_window(&mut self) -> ExpandableBound {
        let before = *self;
        self.max_live_large = self.live_large;
        self.max_live_small = self.live_small;
        before
    }

    /// Ends the window [`start_window`](Self::start_window) began (`before` is what it
    /// returned): the peaks are again those of every request, and the returned
    /// [`BoundWindow`] is what the window's requests did.
    pub fn end_window(&mut self, before: ExpandableBound) -> BoundWindow {
        let window = BoundWindow {
            start: before,
            end: *self,
        };
        self.max_live_large = self.max_live_large.max(before.max_live_large);
        self.max_live_small = self.max_live_small.max(before.max_live_small);
        window
    }

    /// The window's requests again, from this state: each live figure moves by what it
    /// moved in the window, each peak is at least this state's figure plus the window's rise
    /// to its peak. Exact where no figure saturated (the live large bytes stayed below
    /// `u64::MAX` in the window and stay below it here), as it is where the caller checks
    /// that the live bytes stay under a bound below `u64::MAX`.
    pub fn repeat_window(&mut self, w: &BoundWindow) {
        let peak_large = shifted(self.live_large, w.start.live_large, w.end.max_live_large);
        let peak_small = shifted(self.live_small, w.start.live_small, w.end.max_live_small);
        self.max_live_large = self.max_live_large.max(peak_large);
        self.max_live_small = self.max_live_small.max(peak_small);
        self.live_large = shifted(self.live_large, w.start.live_large, w.end.live_large);
        self.live_small = shifted(self.live_small, w.start.live_small, w.end.live_small);
    }

    /// At least the uncapped allocator's peak reserved bytes.
    pub fn reserved(&self) -> u64 {
        self.max_live_large
            .div_ceil(LARGE_BUFFER)
            .saturating_mul(LARGE_BUFFER)
            .saturating_add(self.max_live_small.saturating_mul(SMALL_BUFFER))
    }
}

/// `now + to − from`: the figure that went from `from` to `to`, moved to start at `now`
/// (0 at the least, `u64::MAX` at the most).
#[inline]
pub(crate) fn shifted(now: u64, from: u64, to: u64) -> u64 {
    let v = (u128::from(now) + u128::from(to)).saturating_sub(u128::from(from));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// What a window of requests did to an [`ExpandableBound`]: its state where the window
/// began and where it ended (the peaks those of the window alone).
#[derive(Debug, Default, Clone, Copy)]
pub struct BoundWindow {
    start: ExpandableBound,
    end: ExpandableBound,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_512() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
    }

    /// Absurd sizes saturate instead of overflowing (the plan reports them as errors);
    /// found by tests/invariants.rs in a debug build.
    #[test]
    fn absurd_requests_do_not_overflow() {
        assert_eq!(round_size(u64::MAX - 10), u64::MAX);
        assert!(segment_size(u64::MAX - (1 << 20)) >= u64::MAX - (1 << 20));
        let mut a = CachingAllocator::new(AllocatorConfig::default());
        a.malloc(u64::MAX - (1 << 20));
        a.malloc(u64::MAX / 2);
    }

    /// [`ExpandableBound`] is at least the peak reserved bytes of the allocator it bounds,
    /// on random request sequences (small and large, freed in random order).
    #[test]
    fn the_expandable_bound_is_above_the_peak() {
        let cfg = AllocatorConfig {
            expandable_segments: true,
            max_split_size_mb: None,
        };
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let mut a = CachingAllocator::new(cfg);
            let mut bound = ExpandableBound::default();
            let mut live: Vec<(u32, u64)> = Vec::new();
            for _ in 0..300 {
                if live.is_empty() || next() % 3 != 0 {
                    let size = if next() % 2 == 0 {
                        next() % (SMALL_SIZE + 1)
                    } else {
                        next() % (64 << 20)
                    };
                    let size = round_size(size);
                    live.push((a.malloc_rounded(size), size));
                    bound.malloc_rounded(size);
                } else {
                    let (id, size) = live.swap_remove((next() % live.len() as u64) as usize);
                    a.free(id);
                    bound.free_rounded(size);
                }
                assert!(a.peak_reserved <= bound.reserved());
            }
        }
    }

    /// A window of requests repeated from another state ([`ExpandableBound::repeat_window`])
    /// leaves the bound those requests fed again would: on random windows (each freeing
    /// only what it allocated, or what was live before it) after random prefixes.
    #[test]
    fn a_repeated_window_is_its_requests_again() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let size = |next: &mut dyn FnMut() -> u64| {
            round_size(if next().is_multiple_of(2) {
                next() % SMALL_SIZE
            } else {
                next() % (64 << 20)
            })
        };
        for _ in 0..200 {
            // Two prefixes, each leaving blocks live (of which the window frees some).
            let mut prefixes = [Vec::new(), Vec::new()];
            let mut bounds = [ExpandableBound::default(); 2];
            for (p, b) in prefixes.iter_mut().zip(&mut bounds) {
                for _ in 0..(next() % 40) {
                    let s = size(&mut next);
                    b.malloc_rounded(s);
                    p.push(s);
                }
            }
            let common: Vec<u64> = prefixes[0]
                .iter()
                .copied()
                .filter(|s| prefixes[1].contains(s))
                .take(3)
                .collect();
            // The window: requests and frees of its own blocks, and frees of blocks both
            // prefixes left live.
            let mut window: Vec<(bool, u64)> = Vec::new();
            let mut live: Vec<u64> = Vec::new();
            for _ in 0..(next() % 60) {
                if next() % 3 > 0 || live.is_empty() {
                    let s = size(&mut next);
                    live.push(s);
                    window.push((true, s));
                } else {
                    let i = (next() % live.len() as u64) as usize;
                    window.push((false, live.swap_remove(i)));
                }
            }
            for &s in &common {
                window.push((false, s));
            }
            let feed = |b: &mut ExpandableBound| {
                for &(alloc, s) in &window {
                    if alloc {
                        b.malloc_rounded(s);
                    } else {
                        b.free_rounded(s);
                    }
                }
            };
            let [mut first, second] = bounds;
            let before = first.start_window();
            feed(&mut first);
            let w = first.end_window(before);
            let fed = first;
            let mut repeated = second;
            let mut again = second;
            repeated.repeat_window(&w);
            feed(&mut again);
            assert_eq!(format!("{repeated:?}"), format!("{again:?}"));
            // The window's peaks joined those before it.
            let mut whole = bounds[0];
            feed(&mut whole);
            assert_eq!(format!("{fed:?}"), format!("{whole:?}"));
        }
    }

    #[test]
    fn small_requests_share_a_2mib_segment() {
        let mut a = CachingAllocator::new(AllocatorConfig::default());
        let x = a.malloc(1000);
        let y = a.malloc(4000);
        assert_eq!(a.reserved, 2 << 20);
        assert_eq!(a.allocated, 1024 + 4096);
        a.free(x);
        a.free(y);
        assert_eq!(a.allocated, 0);
        // Coalesced: a 1.5 MiB small request fits again without a new segment.
        let _z = a.malloc(SMALL_SIZE);
        assert_eq!(a.reserved, 2 << 20);
    }

    #[test]
    fn mid_size_requests_get_20mib_segments_and_split() {
        let mut a = CachingAllocator::new(AllocatorConfig::default());
        let _x = a.malloc(3 << 20);
        assert_eq!(a.reserved, 20 << 20);
        let _y = a.malloc(3 << 20);
        assert_eq!(
            a.reserved,
            20 << 20,
            "second request reuses the split remainder"
        );
        let _z = a.malloc(100 << 20);
        assert_eq!(a.reserved, 120 << 20);
    }

    #[test]
    fn fragmentation_forces_new_segment() {
        let mut a = CachingAllocator::new(AllocatorConfig::default());
        let x = a.malloc(50 << 20);
        let _y = a.malloc(50 << 20);
        a.free(x);
        // 60 MiB does not fit in the cached 50 MiB block.
        let _z = a.malloc(60 << 20);
        assert_eq!(a.reserved, 160 << 20);
        assert_eq!(a.cached_free(), 50 << 20);
    }

    #[test]
    fn max_split_size_keeps_big_blocks_whole() {
        let cfg = AllocatorConfig {
            expandable_segments: false,
            max_split_size_mb: Some(64),
        };
        let mut a = CachingAllocator::new(cfg);
        let x = a.malloc(200 << 20);
        a.free(x);
        // A 30 MiB request may not carve the 200 MiB oversize block.
        let _y = a.malloc(30 << 20);
        assert_eq!(a.reserved, 230 << 20);
    }

    #[test]
    fn a_cap_releases_cached_segments_before_failing() {
        let mut a = CachingAllocator::with_cap(AllocatorConfig::default(), 100 << 20);
        let x = a.malloc(60 << 20);
        a.free(x);
        // 60 MiB cached and unused: released so that 80 MiB fits under the cap.
        assert_eq!(a.flushes, 0);
        let y = a.malloc(80 << 20);
        assert!(!a.oom);
        assert_eq!(a.reserved, 80 << 20);
        assert_eq!(a.flushes, 1, "one release of the cache (num_alloc_retries)");
        let _z = a.malloc(30 << 20);
        assert!(a.oom, "80 + 30 MiB live cannot fit in 100 MiB");
        assert_eq!(a.flushes, 2, "the failed request flushed first");
        a.free(y);
    }

    #[test]
    fn an_uncapped_allocator_never_flushes() {
        let mut a = CachingAllocator::new(AllocatorConfig::default());
        for _ in 0..4 {
            let x = a.malloc(300 << 20);
            a.free(x);
        }
        assert_eq!((a.flushes, a.reached_cap), (0, false));
    }

    #[test]
    fn expandable_segments_track_live_bytes() {
        let cfg = AllocatorConfig {
            expandable_segments: true,
            max_split_size_mb: None,
        };
        let mut a = CachingAllocator::new(cfg);
        let x = a.malloc(50 << 20);
        let _y = a.malloc(50 << 20);
        a.free(x);
        let _z = a.malloc(60 << 20);
        assert_eq!(a.reserved, 120 << 20);
    }
}
