//! The event list of an inference call being written: buffers of `per_sample × batch +
//! fixed` bytes allocated and freed in the order PyTorch does (the same [`Events`] the
//! training simulator produces, so the caching-allocator model evaluates both).

use crate::plan::events::{Buffer, Category, Event, Events, Phase};

/// A buffer handle; [`Buf::NONE`] for a tensor that allocates nothing (0 bytes, or a view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf(u32);

impl Buf {
    pub const NONE: Buf = Buf(u32::MAX);
}

/// Events under construction.
#[derive(Debug, Default)]
pub struct Prog {
    buffers: Vec<Buffer>,
    events: Vec<Event>,
    /// The call's forward: 0 = the prefill, `k` = decode step `k` (kept in `Event::node`).
    pub forward: u16,
    pub phase: Option<Phase>,
    /// Where the measured call starts.
    measured_start: usize,
    /// Event indices before which `torch.cuda.empty_cache()` runs.
    empty_cache: Vec<u32>,
    /// Sequences per prompt of what is allocated per sequence (beam search's `num_beams`);
    /// 0 means 1.
    pub per_prompt: u64,
}

impl Prog {
    /// Allocates `per_sample` bytes per sequence plus `fixed` bytes.
    pub fn alloc(&mut self, per_sample: u64, fixed: u64, category: Category) -> Buf {
        let per_sample = per_sample * self.per_prompt.max(1);
        self.alloc_scaled(per_sample, fixed, category)
    }

    /// A new buffer of `b`'s size (an `index_select` of it).
    pub fn copy_of(&mut self, b: Buf, category: Category) -> Buf {
        match self.buffers.get(b.0 as usize) {
            Some(buf) => {
                let (per_sample, fixed) = (buf.per_sample, buf.fixed);
                self.alloc_scaled(per_sample, fixed, category)
            }
            None => Buf::NONE,
        }
    }

    /// `b`'s bytes per prompt (its per-sample bytes), 0 for [`Buf::NONE`].
    pub fn per_sample_of(&self, b: Buf) -> u64 {
        self.buffers
            .get(b.0 as usize)
            .map_or(0, |buf| buf.per_sample)
    }

    fn alloc_scaled(&mut self, per_sample: u64, fixed: u64, category: Category) -> Buf {
        if per_sample == 0 && fixed == 0 {
            return Buf::NONE;
        }
        self.buffers.push(Buffer {
            per_sample,
            fixed,
            category,
            side_stream: false,
        });
        let id = (self.buffers.len() - 1) as u32;
        self.push(id, true);
        Buf(id)
    }

    /// An activation or temporary of `per_sample` bytes per sequence.
    pub fn act(&mut self, per_sample: u64) -> Buf {
        self.alloc(per_sample, 0, Category::Activations)
    }

    /// A batch-independent temporary.
    pub fn fixed(&mut self, bytes: u64) -> Buf {
        self.alloc(0, bytes, Category::Transient)
    }

    pub fn free(&mut self, b: Buf) {
        if b != Buf::NONE {
            self.push(b.0, false);
        }
    }

    /// Gemma's tanh soft-cap of `x` (`per_sample` bytes a sequence): `x / cap`, `tanh(x)`,
    /// `x * cap`, each a new tensor bound to the same name, the one before it freed once the
    /// next exists. Returns the capped tensor.
    pub fn soft_cap(&mut self, mut x: Buf, per_sample: u64) -> Buf {
        for _ in 0..3 {
            let next = self.act(per_sample);
            self.free(x);
            x = next;
        }
        x
    }

    /// Allocated and freed at once (a kernel's scratch).
    pub fn scratch(&mut self, per_sample: u64, fixed: u64) {
        let b = self.alloc(per_sample, fixed, Category::Transient);
        self.free(b);
    }

    fn push(&mut self, buffer: u32, alloc: bool) {
        self.events.push(Event {
            buffer,
            alloc,
            phase: self.phase.unwrap_or(Phase::Forward),
            micro: 0,
            node: u32::from(self.forward),
        });
    }

    /// `torch.cuda.empty_cache()` at this point of the events.
    pub fn empty_cache(&mut self) {
        self.empty_cache.push(self.events.len() as u32);
    }

    /// Marks the start of the measured call (what `reset_peak_memory_stats` follows).
    pub fn start_measured(&mut self) {
        self.measured_start = self.events.len();
    }

    pub fn finish(self) -> Events {
        Events {
            buffers: self.buffers,
            events: self.events,
            measured_start: self.measured_start,
            side_streams: false,
            // `memory_allocated()` as PyTorch reports it (see `Events::whole_blocks`)
            whole_blocks: true,
            empty_cache: self.empty_cache,
            bound_at_one: None,
        }
    }
}
