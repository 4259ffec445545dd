//! Planning the search's next combinations at once, one per core, with the answer of one
//! thread planning them in turn.
//!
//! A pass over a list of combinations (the seeds, the ranked candidates) skips some by what
//! the combinations planned before it showed (dead, dominated, the plan budget spent) and
//! plans the others in order. A window takes the next combinations the pass would plan if
//! none of them changed anything, plans them on as many threads, then records them in order,
//! classifying every combination up to the last of them again with what the ones before it
//! showed: one now skipped is counted as skipped and its plan dropped, as a pass on one
//! thread would never have made it. What a skip depends on only grows (the dead, the
//! accepted candidates, the plans counted), so a combination skipped before the window is
//! still skipped after it; a plan depends on the search only through the closest miss, which
//! only shrinks, and [`super::search::Search::record`] compares with the one known when
//! recording.

use super::axes::Knobs;
use super::search::{Fitting, Planned, Search, Task, plan_one};
use crate::par::Workers;
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
    /// Entry `i` was planned (`Some` when it fits).
    fn planned(
        &mut self,
        s: &mut Search<'_>,
        i: usize,
        f: Option<Fitting>,
    ) -> Result<(), PlanError>;
}

/// Runs `pass` over its list as one thread planning its entries in turn would, one entry
/// on this thread and one on each worker at a time.
pub(super) fn run<'a: 'w, 'w>(
    s: &mut Search<'a>,
    pass: &mut dyn Pass,
    workers: &Workers<'w>,
) -> Result<(), PlanError> {
    let width = workers.count() + 1;
    let mut i = 0;
    while i < pass.len() {
        let ahead: Vec<usize> = (i..pass.len())
            .filter(|&j| !pass.skip(s, j, false))
            .take(width.max(1))
            .collect();
        let Some(&last) = ahead.last() else {
            // Nothing left to plan: count the skips.
            for j in i..pass.len() {
                pass.skip(s, j, true);
            }
            return Ok(());
        };
        let mut results = plan_all(s, pass, &ahead, workers)?.into_iter();
        for j in i..=last {
            let computed = if ahead.contains(&j) {
                results.next()
            } else {
                None
            };
            if pass.skip(s, j, true) {
                if let Some(p) = computed {
                    s.untake(p);
                }
                continue;
            }
            let planned = match computed {
                Some(p) => p,
                // Not looked ahead at because it was skipped then: skips only grow, so this
                // cannot happen; planned here all the same.
                None => {
                    let k = pass.knobs(j);
                    let twin = s.take_twin(&k);
                    plan_one(&task(s, pass), &k, twin, s.closest_smi())?
                }
            };
            let f = s.record(planned);
            pass.planned(s, j, f)?;
        }
        i = last + 1;
    }
    Ok(())
}

/// Plans the entries `ahead` of `pass`, the first on this thread and the others on the
/// workers.
fn plan_all<'a: 'w, 'w>(
    s: &mut Search<'a>,
    pass: &dyn Pass,
    ahead: &[usize],
    workers: &Workers<'w>,
) -> Result<Vec<Planned>, PlanError> {
    let closest = s.closest_smi();
    let jobs: Vec<_> = ahead
        .iter()
        .map(|&j| {
            let k = pass.knobs(j);
            (k, s.take_twin(&k))
        })
        .collect();
    let task = task(s, pass);
    workers
        .map(jobs, move |(k, twin)| plan_one(&task, &k, twin, closest))
        .into_iter()
        .collect()
}

/// What planning one of `pass`'s entries needs of the search.
fn task<'a>(s: &Search<'a>, pass: &dyn Pass) -> Task<'a> {
    let mut task = s.task();
    task.figures = pass.candidates();
    task.only_alive = pass.only_alive();
    task
}
