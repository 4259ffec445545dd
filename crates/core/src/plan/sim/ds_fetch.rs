//! DeepSpeed ZeRO-3's parameter coordinator, mirrored from DeepSpeed 0.19.8's
//! `runtime/zero/partitioned_param_coordinator.py` (`PartitionedParameterCoordinator`):
//! which parameters one rank holds gathered at each module of the step.
//!
//! - The trace: every module call of a micro-step in order (forward, then backward in
//!   reverse; a checkpointed block's recomputed forward before its backward), each with its
//!   own parameters (`iter_params(module, recurse=False)`, sorted by `ds_id`). `reset_step`
//!   runs at the start of every forward (`parameter_offload.py` `_start_of_forward_hook`):
//!   the fetch queue restarts from the trace's first parameter, nothing counts as available.
//!   The trace is recorded in the first training step and complete from the second on; the
//!   measured step is the third, so it is always planned complete.
//! - `fetch_sub_module` (lines 353-492): the module's parameters that are not available are
//!   all-gathered whatever `stage3_max_live_parameters` says; its entries are popped off the
//!   queue; then, when `stage3_prefetch_bucket_size` > 0, entries are popped and the
//!   unavailable ones all-gathered until `min(max_live − n_available, prefetch)` elements are
//!   in flight (`numel_prefetching < max_params_to_prefetch`: the last one may overshoot).
//!   Every popped entry records its step as the parameter's `most_recent_step_id_param_fetched_for`.
//! - `release_sub_module` (lines 494-535) with `__params_to_release` (634-664): after the
//!   module's forward or backward, its non-persistent parameters are released unless a later
//!   use was already popped by the prefetcher (`most_recent > step_id`) or the parameter is
//!   used again by a module within `stage3_max_reuse_distance` elements of the trace from
//!   here (every parameter of every later module counts, persistent ones too).
//! - Parameters of at most `stage3_param_persistence_threshold` elements are persistent:
//!   always available, never gathered or released.

use std::collections::VecDeque;

/// One micro-step's module calls: each call's parameter indices.
pub(super) type Trace = Vec<Vec<usize>>;

/// The coordinator's state over one micro-step.
#[derive(Debug, Default)]
pub(super) struct Coordinator {
    trace: Trace,
    numel: Vec<u64>,
    persistent: Vec<bool>,
    prefetch: u64,
    max_live: u64,
    max_reuse: u64,
    /// (parameter, the step it is used at), in trace order.
    queue: VecDeque<(usize, usize)>,
    most_recent: Vec<i64>,
    available: Vec<bool>,
    n_available: u64,
    step: usize,
}

/// `collections.defaultdict(lambda: int(-1e10))`.
const NEVER: i64 = -10_000_000_000;

impl Coordinator {
    pub(super) fn new(
        trace: Trace,
        numel: Vec<u64>,
        persistent: Vec<bool>,
        prefetch: u64,
        max_live: u64,
        max_reuse: u64,
    ) -> Coordinator {
        let n = numel.len();
        let mut c = Coordinator {
            trace,
            numel,
            persistent,
            prefetch,
            max_live,
            max_reuse,
            queue: VecDeque::new(),
            most_recent: vec![NEVER; n],
            available: vec![false; n],
            n_available: 0,
            step: 0,
        };
        c.reset_step();
        c
    }

    /// `reset_step`: the queue refilled from the trace, the step counter and
    /// `n_available` zeroed (the parameters themselves are not touched).
    pub(super) fn reset_step(&mut self) {
        self.queue = self
            .trace
            .iter()
            .enumerate()
            .flat_map(|(s, ps)| ps.iter().map(move |&p| (p, s)))
            .collect();
        self.most_recent.iter_mut().for_each(|m| *m = NEVER);
        self.n_available = 0;
        self.step = 0;
    }

    fn gatherable(&self, p: usize) -> bool {
        !self.available[p] && !self.persistent.get(p).copied().unwrap_or(true)
    }

    fn mark_gathered(&mut self, ps: &[usize]) {
        for &p in ps {
            self.available[p] = true;
            self.n_available = self.n_available.saturating_add(self.numel[p]);
        }
    }

    /// `fetch_sub_module` of the module at the current step with parameters `params`:
    /// (what is all-gathered for it, what is prefetched), in that order.
    pub(super) fn fetch(&mut self, params: &[usize]) -> (Vec<usize>, Vec<usize>) {
        let mut now: Vec<usize> = params
            .iter()
            .copied()
            .filter(|&p| p < self.numel.len() && self.gatherable(p))
            .collect();
        now.sort_unstable();
        now.dedup();
        self.mark_gathered(&now);
        let step = self.step as i64;
        // This module's own entries leave the queue.
        let mut need: Vec<usize> = params
            .iter()
            .copied()
            .filter(|&p| p < self.numel.len() && self.most_recent[p] < step)
            .collect();
        need.sort_unstable();
        need.dedup();
        let mut popped: Vec<usize> = Vec::new();
        while popped.len() < need.len() {
            let Some((p, s)) = self.queue.pop_front() else {
                break;
            };
            self.most_recent[p] = s as i64;
            if !popped.contains(&p) {
                popped.push(p);
            }
        }
        let mut ahead = Vec::new();
        if self.prefetch > 0 {
            let room = i128::from(self.max_live) - i128::from(self.n_available);
            let max = room.min(i128::from(self.prefetch));
            let mut numel: i128 = 0;
            while numel < max {
                let Some((p, s)) = self.queue.pop_front() else {
                    break;
                };
                self.most_recent[p] = self.most_recent[p].max(s as i64);
                if self.gatherable(p) && !ahead.contains(&p) {
                    ahead.push(p);
                    numel += i128::from(self.numel[p]);
                }
            }
            self.mark_gathered(&ahead);
        }
        self.step += 1;
        (now, ahead)
    }

    /// `release_sub_module` of the module just fetched (parameters `params`): the
    /// parameters released.
    pub(super) fn release(&mut self, params: &[usize]) -> Vec<usize> {
        let step = self.step;
        let mut out: Vec<usize> = params
            .iter()
            .copied()
            .filter(|&p| {
                p < self.numel.len()
                    && !self.persistent[p]
                    && self.available[p]
                    && self.most_recent[p] <= step as i64
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        let mut traversed = 0u64;
        for module in self.trace.iter().skip(step) {
            if traversed >= self.max_reuse || out.is_empty() {
                break;
            }
            for &p in module {
                out.retain(|&q| q != p);
                traversed = traversed.saturating_add(self.numel.get(p).copied().unwrap_or(0));
            }
        }
        for &p in &out {
            self.available[p] = false;
            self.n_available = self.n_available.saturating_sub(self.numel[p]);
        }
        out
    }

    /// Everything still gathered, released (the end of backward: no later use remains).
    pub(super) fn release_all(&mut self) -> Vec<usize> {
        let out: Vec<usize> = (0..self.available.len())
            .filter(|&p| self.available[p])
            .collect();
        for &p in &out {
            self.available[p] = false;
        }
        self.n_available = 0;
        out
    }

    /// Elements gathered now.
    #[cfg(test)]
    pub(super) fn gathered(&self) -> u64 {
        (0..self.available.len())
            .filter(|&p| self.available[p])
            .map(|p| self.numel[p])
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four modules of one parameter each (10, 20, 30, 40 elements), used forward then
    /// backward: trace 0 1 2 3 3 2 1 0.
    fn coord(prefetch: u64, max_live: u64, max_reuse: u64) -> Coordinator {
        let trace: Trace = [0, 1, 2, 3, 3, 2, 1, 0].iter().map(|&p| vec![p]).collect();
        Coordinator::new(
            trace,
            vec![10, 20, 30, 40],
            vec![false; 4],
            prefetch,
            max_live,
            max_reuse,
        )
    }

    /// Runs the trace; the most elements gathered at once.
    fn peak(c: &mut Coordinator) -> u64 {
        let trace = c.trace.clone();
        let mut peak = 0;
        for m in &trace {
            c.fetch(m);
            peak = peak.max(c.gathered());
            c.release(m);
        }
        c.release_all();
        peak
    }

    #[test]
    fn prefetch_zero_gathers_only_the_current_module() {
        let mut c = coord(0, 1_000, 0);
        let (now, ahead) = c.fetch(&[0]);
        assert_eq!((now, ahead), (vec![0], vec![]));
        assert_eq!(c.release(&[0]), vec![0]);
        assert_eq!(peak(&mut coord(0, 1_000, 0)), 40);
    }

    #[test]
    fn prefetch_brings_the_next_parameters_up_to_the_bucket() {
        let mut c = coord(25, 1_000, 0);
        // Pops 1 (20 < 25: go on), then 2 (50): both in flight.
        assert_eq!(c.fetch(&[0]), (vec![0], vec![1, 2]));
        // Distance 0: released after its use.
        assert_eq!(c.release(&[0]), vec![0]);
        // Module 1 was prefetched: nothing more to gather; the prefetch goes on with 3.
        assert_eq!(c.fetch(&[1]), (vec![], vec![3]));
        let mut last = 0;
        for pf in [0, 10, 25, 60, 1_000] {
            let p = peak(&mut coord(pf, 1_000, 0));
            assert!(p >= last, "prefetch {pf}: {p} < {last}");
            last = p;
        }
        assert_eq!(last, 100);
    }

    #[test]
    fn max_live_caps_the_prefetch_but_never_the_current_module() {
        // Max live 5: below any parameter; the current module is gathered anyway and
        // nothing is prefetched (room 5 − 10 < 0).
        let mut c = coord(1_000, 5, 0);
        assert_eq!(c.fetch(&[0]), (vec![0], vec![]));
        assert_eq!(peak(&mut coord(1_000, 5, 0)), 40);
        // Max live 35: after 0 (10 live) room 25: 1 (20) then 2 (30) — the last overshoots.
        let mut c = coord(1_000, 35, 0);
        assert_eq!(c.fetch(&[0]), (vec![0], vec![1, 2]));
    }

    #[test]
    fn reuse_distance_keeps_a_parameter_until_its_next_use() {
        // Module 3 is used twice in a row: kept after the first within any distance > 0.
        let mut c = coord(0, 1_000, 1);
        for m in [0, 1, 2] {
            c.fetch(&[m]);
            c.release(&[m]);
        }
        c.fetch(&[3]);
        assert!(c.release(&[3]).is_empty());
        // Distance 1e9: nothing is released before its last use; everything is gathered
        // at the turn from forward to backward.
        assert_eq!(peak(&mut coord(0, 1_000, 1_000_000_000)), 100);
        // Distance 50 from module 1's forward (step 2): 2 (30) + 3 (40) ≥ 50 before its
        // backward: released; module 2's backward comes after 3 + 3 = 80: released.
        let mut c = coord(0, 1_000, 50);
        c.fetch(&[0]);
        c.release(&[0]);
        c.fetch(&[1]);
        assert_eq!(c.release(&[1]), vec![1]);
    }

    #[test]
    fn persistent_parameters_are_never_gathered() {
        let trace: Trace = vec![vec![0, 1], vec![1], vec![1, 0]];
        let mut c = Coordinator::new(trace, vec![5, 50], vec![true, false], 0, 1_000, 0);
        assert_eq!(c.fetch(&[0, 1]), (vec![1], vec![]));
        // Distance 0: the first module of the rest is not even looked at.
        assert_eq!(c.release(&[0, 1]), vec![1]);
        // Any distance: the next module uses 1 again.
        let trace: Trace = vec![vec![0, 1], vec![1], vec![1, 0]];
        let mut c = Coordinator::new(trace, vec![5, 50], vec![true, false], 0, 1_000, 1);
        c.fetch(&[0, 1]);
        assert!(c.release(&[0, 1]).is_empty());
    }
}
