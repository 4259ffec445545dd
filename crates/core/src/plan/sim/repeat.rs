//! The measured step's micro-steps repeated from the warm-up step's: on one GPU the two steps
//! start a micro-step from the same state but for the buffers' ids, so the measured step
//! copies the warm-up's events with its own ids instead of walking the graph again.
//!
//! Why the copy is the walk's result: a micro-step reads the state only through the
//! containers that hold buffer ids (reference counts, each tensor's buffer and gradient,
//! each parameter's gradient and pending sum, what nodes saved, the checkpoint's inputs,
//! autocast's cache, the loop's pinned tensors) and the graph. At the first micro-step of
//! both steps every container but the tensors' buffers is empty ([`Sim::quiescent`], asked
//! of both); the tensors' buffers are written before they are read when every node reads
//! only tensors an earlier node made or none made (`repeat_state.rs`). So the walk of
//! the measured step allocates and frees the same buffers in the same order, each new one
//! numbered `delta` higher (the number of buffers made between the two steps), and ends in
//! the warm-up's end state with its ids moved by `delta`: that state is what the copy
//! restores, and what the next micro-step (copied too) starts from. Nothing here holds for
//! a multi-GPU strategy (its units, buckets and shards hold ids across steps): those walk.
//! The generation's running figures at batch 1 (`live1`, where to stop, the expandable
//! bound) move by what the warm-up's micro-step moved them (its start, peak and end,
//! recorded as it walked), or, without a stop bound, follow each copied event as in the walk.

use super::repeat_state::{Template, reads_after_writes};
use super::state::{NO_NODE, Sim, size_at_one};
use crate::plan::allocator::{ExpandableBound, shifted};
use crate::plan::events::{Event, Phase};

impl Sim<'_> {
    /// Whether no container holds a buffer id but the tensors' buffers (left over, never
    /// read before written), the reference counts and the parameters' gradients (asked
    /// apart); nothing recomputing, no pending shared gradient.
    fn quiescent(&self) -> bool {
        !self.recomputing
            && self.pinned.is_empty()
            && self.cache_refs.is_empty()
            && self.output_refs.is_empty()
            && self.reentrant_held.is_empty()
            && self.chunk_grads.is_empty()
            && self.saved_bufs.is_empty()
            && self.saved.iter().all(|r| r.is_empty())
            && self.block_inputs.iter().all(Vec::is_empty)
            && self.param_cast.iter().all(Option::is_none)
            && self.gbuf.iter().all(Option::is_none)
            && self.param_pending.iter().all(Option::is_none)
            && self.param_seen.iter().all(|&s| s == 0)
    }

    /// Micro-step `micro` of the warm-up step, recorded for the measured step.
    pub(super) fn record_micro_step(&mut self, micro: u16) {
        if !self.repeat.allowed {
            self.micro_step(micro);
            return;
        }
        if micro == 0 {
            // Asked here, not per generation: most generations the search stops early never
            // get to a warm-up.
            self.repeat.allowed = reads_after_writes(self.g);
            if !self.repeat.allowed {
                self.micro_step(micro);
                return;
            }
            self.repeat.templates.clear();
            self.repeat.first_buffer = self.buffers.len();
            // Where the walk starts: nothing held, no gradient yet.
            self.repeat.complete = self.quiescent() && self.param_grad.iter().all(Option::is_none);
        }
        let (buffers, events) = (self.buffers.len(), self.events.len());
        let live1 = self.live1;
        self.live1_peak = live1;
        let bound = self.bound1.as_mut().map(ExpandableBound::start_window);
        self.micro_step(micro);
        let bound = match (bound, self.bound1.as_mut()) {
            (Some(before), Some(b)) => Some(b.end_window(before)),
            _ => None,
        };
        if self.stopped || !self.repeat.complete || !self.quiescent() {
            self.repeat.complete = false;
            return;
        }
        let first = self.repeat.first_buffer;
        let template = Template {
            buffers: buffers..self.buffers.len(),
            events: events..self.events.len(),
            refs: self.refs[first..].to_vec(),
            tbuf: self.tbuf.clone(),
            gbuf: self.gbuf.clone(),
            param_grad: self.param_grad.clone(),
            param_pending: self.param_pending.clone(),
            param_seen: self.param_seen.clone(),
            param_pending_inplace: self.param_pending_inplace.clone(),
            live1: [live1, self.live1_peak, self.live1],
            bound,
        };
        self.repeat.templates.push(template);
    }

    /// Repeats the warm-up's micro-steps as the measured step's, `micros` of them, when the
    /// measured step starts where the warm-up did; `false` (nothing done) otherwise.
    pub(super) fn repeat_micro_steps(&mut self, micros: u16) -> bool {
        let r = &self.repeat;
        if !r.allowed
            || !r.complete
            || r.templates.len() != usize::from(micros)
            || !self.quiescent()
            || self.param_grad.iter().any(Option::is_some)
        {
            return false;
        }
        let first = r.first_buffer;
        let Ok(delta) = u32::try_from(self.buffers.len() - first) else {
            return false;
        };
        let Ok(first) = u32::try_from(first) else {
            return false;
        };
        // Every id a copy makes fits an event's id.
        let last = r.templates.last().map_or(0, |t| t.buffers.end);
        if u32::try_from(last + delta as usize).is_err() {
            return false;
        }
        let moved = |id: u32| if id >= first { id + delta } else { id };
        let moved_opt = |id: Option<u32>| id.map(moved);
        let templates = std::mem::take(&mut self.repeat.templates);
        'copy: for t in &templates {
            self.buffers.extend_from_within(t.buffers.clone());
            self.refs.resize(self.buffers.len(), 0);
            // `live1` only decides where to stop: without a bound (never stopping) and without
            // the expandable bound the copied events change no running figure.
            if self.stop_above == u64::MAX && self.bound1.is_none() {
                self.copy_ids(t.events.clone(), moved);
            } else if self.stop_above < u64::MAX {
                // Below a bound under `u64::MAX` no figure ever saturated (it would have
                // passed the bound and stopped the generation): each is the exact sum of
                // live bytes, so the copy moves it by what the micro-step moved it, and its
                // peak rises by what the micro-step's rose.
                let [from, peak, to] = t.live1;
                if shifted(self.live1, from, peak) > self.stop_above {
                    self.stopped = true;
                    break 'copy;
                }
                self.live1 = shifted(self.live1, from, to);
                if let (Some(bound), Some(w)) = (&mut self.bound1, &t.bound) {
                    bound.repeat_window(w);
                }
                self.copy_ids(t.events.clone(), moved);
            } else if self.copy_counted(t.events.clone(), moved) {
                break 'copy;
            }
            let start = first as usize + delta as usize;
            self.refs[start..start + t.refs.len()].copy_from_slice(&t.refs);
            for (to, &from) in self.tbuf.iter_mut().zip(&t.tbuf) {
                *to = moved_opt(from);
            }
            for (to, &from) in self.gbuf.iter_mut().zip(&t.gbuf) {
                *to = moved_opt(from);
            }
            for (to, &from) in self.param_grad.iter_mut().zip(&t.param_grad) {
                *to = moved_opt(from);
            }
            for (to, &from) in self.param_pending.iter_mut().zip(&t.param_pending) {
                *to = moved_opt(from);
            }
            self.param_seen.copy_from_slice(&t.param_seen);
            self.param_pending_inplace
                .copy_from_slice(&t.param_pending_inplace);
        }
        self.repeat.templates = templates;
        self.micro = micros.saturating_sub(1);
        self.phase = Phase::Backward;
        self.node = NO_NODE;
        true
    }

    /// Copies `events` with their ids `moved`.
    fn copy_ids(&mut self, events: std::ops::Range<usize>, moved: impl Fn(u32) -> u32) {
        let start = self.events.len();
        self.events.extend_from_within(events);
        for e in &mut self.events[start..] {
            e.buffer = moved(e.buffer);
        }
    }

    /// Copies `events` with their ids `moved`, feeding the running figures as
    /// [`Sim::new_buffer`] and [`Sim::free`] do; `true` where `live1` passed the bound (the
    /// generation ends there, `None`, where the walk would stop too).
    fn copy_counted(&mut self, events: std::ops::Range<usize>, moved: impl Fn(u32) -> u32) -> bool {
        for i in events {
            let e = self.events[i];
            let buffer = moved(e.buffer);
            let b = &self.buffers[buffer as usize];
            let size1 = size_at_one(b.per_sample, b.fixed);
            if e.alloc {
                self.count_alloc1(size1);
                if self.stopped {
                    return true;
                }
            } else {
                self.count_free1(size1);
            }
            self.events.push(Event { buffer, ..e });
        }
        false
    }
}
