//! Planning the search's next combinations at once, one per core, with the answer of one
//! thread planning them in turn.
//!
//! A pass over a list of combinations (the seeds, the ranked candidates) skips some by what
//! the combinations planned before it showed (dead, dominated, the plan budget spent) and
//! plans the others in order. This thread and the workers plan ahead first the combinations
//! that the ones before them, not recorded yet, cannot make the pass skip
//! ([`Pass::may_skip_after`], [`Pass::headroom`]), as threads come free; a thread that would
//! still wait takes one the pass guesses they will not skip ([`Pass::likely_skips`]: a guess
//! wrong costs only the work); the plans are recorded in list order, each
//! combination classified again when its turn comes (one then skipped has its plan dropped,
//! as a pass on one thread would never have made it). What a skip depends on only grows (the
//! dead, the accepted candidates, the plans counted); a plan depends on the search only
//! through the closest miss, which only shrinks, and [`super::search::Search::record`]
//! compares with the one known when recording.

use std::collections::BTreeMap;

use super::axes::Knobs;

use super::search::{Fitting, Planned, Search, Task, plan_one};
use crate::par::{Pending, Workers};
use crate::plan::PlanError;

/// One pass: its list, how each entry is skipped, what is done with each plan.
pub(super) trait Pass {
    fn len(&self) -> usize;
    fn knobs(&self, i: usize) -> Knobs;
    /// Whether entry `i` is skipped with what the search knows now; `count`: record the
    /// reason (false while looking ahead).
    fn skip(&mut self, s: &Search<'_>, i: usize, count: bool) -> bool;
    /// Whether a plan that fits becomes a candidate (its figures computed where it is
    /// planned).
    fn candidates(&self) -> bool;
    /// Whether the pass only asks which of its entries are dead (the seeds).
    fn only_alive(&self) -> bool;
    /// Whether recording entry `u` (before `j`) could make the pass skip `j`, the counts
    /// of [`Pass::headroom`] aside: `j` is planned ahead of `u`'s result only when not.
    fn may_skip_after(&self, s: &Search<'_>, u: usize, j: usize) -> bool;
    /// Whether entry `u` (before `j`) is likely to make the pass skip `j` once recorded: a
    /// guess that decides only what an idle thread plans ahead ([`speculative`]).
    fn likely_skips(&self, s: &Search<'_>, u: usize, j: usize) -> bool;
    /// How many more entries can be recorded before a limit of the pass (its plans, its
    /// candidates) may skip the rest.
    fn headroom(&self, s: &Search<'_>) -> usize;
    /// Entry `i` was planned (`Some` when it fits).
    fn planned(
        &mut self,
        s: &mut Search<'_>,
        i: usize,
        f: Option<Fitting>,
    ) -> Result<(), PlanError>;
}

/// Runs `pass` over its list as one thread planning its entries in turn would, this thread
/// and every worker planning at once.
///
/// The entries the pass would plan next (were none of them to change anything) are handed
/// out as threads come free, not a window at a time: a thread that finishes a short plan
/// (a generation stopped early) takes the next entry instead of waiting for the longest plan
/// of its window. Results are recorded in list order; an entry is classified again when its
/// turn comes, and one now skipped has its plan dropped.
pub(super) fn run<'a: 'w, 'w>(
    s: &mut Search<'a>,
    pass: &mut dyn Pass,
    workers: &Workers<'w>,
) -> Result<(), PlanError> {
    let width = workers.count() + 1;
    // Entries planned ahead of the next to record: at most this many at a time.
    let depth = 2 * width;
    let mut ahead: BTreeMap<usize, Slot> = BTreeMap::new();
    // Plans dropped while their worker still ran: their twins go back when they are done.
    let mut dropped: Vec<Pending<Result<Planned, PlanError>>> = Vec::new();
    let mut i = 0;
    let outcome = loop {
        // Record in order what is planned.
        let mut failed = None;
        while i < pass.len() {
            let slot = ahead.remove(&i);
            if pass.skip(s, i, true) {
                match slot {
                    Some(Slot::Done(r)) => {
                        if let Ok(p) = *r {
                            s.untake(p);
                        }
                    }
                    Some(Slot::Running(p)) => dropped.push(p),
                    None => {}
                }
                i += 1;
                continue;
            }
            let planned = match slot {
                Some(Slot::Done(r)) => *r,
                Some(Slot::Running(p)) => match p.try_take() {
                    Some(r) => r,
                    None => {
                        ahead.insert(i, Slot::Running(p));
                        break;
                    }
                },
                None => break,
            };
            match planned {
                Ok(p) => {
                    let f = s.record(p);
                    if let Err(e) = pass.planned(s, i, f) {
                        failed = Some(e);
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            i += 1;
        }
        dropped.retain(|p| match p.try_take() {
            Some(r) => {
                if let Ok(p) = r {
                    s.untake(p);
                }
                false
            }
            None => true,
        });
        if let Some(e) = failed {
            break Err(e);
        }
        if i >= pass.len() {
            break Ok(());
        }
        // Jobs done since are results now: a worker done is free to take another.
        for slot in ahead.values_mut() {
            if let Slot::Running(p) = slot
                && let Some(r) = p.try_take()
            {
                *slot = Slot::Done(Box::new(r));
            }
        }
        // The next entries the pass would plan, not planned yet.
        let running = ahead
            .values()
            .filter(|slot| matches!(slot, Slot::Running(_)))
            .count();
        let room = depth.saturating_sub(ahead.len());
        let mut next = plannable(s, &mut *pass, i, room, |j| ahead.contains_key(&j));
        // Threads that would wait for a result take an entry a result not recorded yet may
        // still skip (its plan dropped then, [`speculative`]).
        let idle = width.saturating_sub(next.len() + running);
        if s.tuning.speculate && idle > 0 {
            let more = speculative(s, &mut *pass, i, idle, |j| {
                ahead.contains_key(&j) || next.contains(&j)
            });
            next.extend(more);
        }
        let task = task(s, pass);
        let closest = s.closest_smi();
        let mut next = next.into_iter();
        // This thread plans the first of them; the workers queue the ones after it, so that
        // a worker done early takes the next instead of waiting for this thread.
        let mine = next.next();
        let queued = if workers.count() == 0 {
            0
        } else {
            depth - width
        };
        for j in next.take(queued.saturating_sub(running)) {
            let k = pass.knobs(j);
            let twin = s.take_twin(&k);
            let job = workers.submit(move || plan_one(&task, &k, twin, closest));
            ahead.insert(j, Slot::Running(job));
        }
        match mine {
            Some(j) => {
                let k = pass.knobs(j);
                let twin = s.take_twin(&k);
                ahead.insert(j, Slot::Done(Box::new(plan_one(&task, &k, twin, closest))));
            }
            // Nothing more to plan here: wait for the next entry to record (planned here
            // if it was not planned ahead, which skips that only grow rule out).
            None => {
                let done = match ahead.remove(&i) {
                    Some(Slot::Running(p)) => p.wait(),
                    Some(Slot::Done(r)) => *r,
                    None => {
                        let k = pass.knobs(i);
                        let twin = s.take_twin(&k);
                        plan_one(&task, &k, twin, closest)
                    }
                };
                ahead.insert(i, Slot::Done(Box::new(done)));
            }
        }
    };
    // Plans made ahead and never recorded (the pass ended or failed) give their twins back.
    for slot in std::mem::take(&mut ahead).into_values() {
        let r = match slot {
            Slot::Done(r) => *r,
            Slot::Running(p) => p.wait(),
        };
        if let Ok(p) = r {
            s.untake(p);
        }
    }
    for p in dropped {
        if let Ok(p) = p.wait() {
            s.untake(p);
        }
    }
    outcome
}

/// The next entries from `i` (at most `room`) that the pass plans whatever the entries before
/// them not recorded yet show, not `planned` yet: none of these is dropped, so a second core
/// planning them does no work one thread would not do.
fn plannable(
    s: &Search<'_>,
    pass: &mut dyn Pass,
    i: usize,
    room: usize,
    planned: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let headroom = pass.headroom(s);
    // Entries not recorded yet before the one looked at (planned ahead or not).
    let mut before: Vec<usize> = Vec::new();
    let mut next = Vec::new();
    for j in i..pass.len() {
        if next.len() >= room || before.len() >= SCAN || before.len() >= headroom {
            break;
        }
        if pass.skip(s, j, false) {
            continue;
        }
        if !planned(j) && !before.iter().any(|&u| pass.may_skip_after(s, u, j)) {
            next.push(j);
        }
        before.push(j);
    }
    next
}

/// The next entries from `i` (at most `count`) not skipped with what the search knows now,
/// not `planned` yet, and not likely to be skipped for the entries before them not recorded
/// yet ([`Pass::likely_skips`]): planned on a thread that would otherwise wait, and dropped
/// when their turn comes if they are skipped after all (the answer is the same; only work one
/// thread would not do may be wasted).
fn speculative(
    s: &Search<'_>,
    pass: &mut dyn Pass,
    i: usize,
    count: usize,
    planned: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let mut before: Vec<usize> = Vec::new();
    let mut next = Vec::new();
    for j in (i..pass.len()).take(SCAN) {
        if next.len() >= count {
            break;
        }
        if pass.skip(s, j, false) || before.iter().any(|&u| pass.likely_skips(s, u, j)) {
            continue;
        }
        if !planned(j) {
            next.push(j);
        }
        before.push(j);
    }
    next
}

/// Entries looked at past the next one to record, at most, for one to plan ahead.
const SCAN: usize = 64;

/// An entry planned ahead of its turn: still on a worker, or done.
enum Slot {
    Running(Pending<Result<Planned, PlanError>>),
    /// Boxed: a plan's result is large beside a pending one.
    Done(Box<Result<Planned, PlanError>>),
}

/// What planning one of `pass`'s entries needs of the search.
fn task<'a>(s: &Search<'a>, pass: &dyn Pass) -> Task<'a> {
    let mut task = s.task();
    task.figures = pass.candidates();
    task.only_alive = pass.only_alive();
    task
}
