//! Work spread over the cores this process may run on, with results in input order.
//!
//! The planner's answers do not depend on how many threads computed them: every function
//! here returns what a loop over the items on one thread returns. `VRAMLAB_THREADS=1` makes
//! them run on the calling thread (the benchmarks compare the two side by side).

use std::sync::{Arc, Mutex, mpsc};
use std::thread;

/// Threads used at most, whatever the machine has: the searches here plan a handful of
/// independent configurations at a time.
pub const MAX_THREADS: usize = 8;

/// Threads to use: `VRAMLAB_THREADS` when set to a whole number ≥ 1, else the cores this
/// process may run on; at most [`MAX_THREADS`].
pub fn threads() -> usize {
    let env = std::env::var("VRAMLAB_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n >= 1);
    env.unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, MAX_THREADS)
}

/// `items.into_iter().map(f).collect()` on [`threads`] scoped threads (the calling thread
/// among them), each taking the next item as it comes free. A panic in `f` is resumed here.
pub fn map<T, R, F>(items: Vec<T>, f: F) -> Vec<R>
where
    T: Send,
    R: Send,
    F: Fn(T) -> R + Sync,
{
    map_on(threads(), items, f)
}

/// [`map`] on at most `threads` threads (the calling thread included; 1: on it alone).
///
/// The items are taken in order from one shared queue, not dealt in advance: the costs of
/// the items differ several times over (a remedy that fits is one replay, one that does not
/// is a max-batch search too), and a thread given its share up front sat idle while the
/// other worked through a long one.
pub fn map_on<T, R, F>(threads: usize, items: Vec<T>, f: F) -> Vec<R>
where
    T: Send,
    R: Send,
    F: Fn(T) -> R + Sync,
{
    let n = threads.min(items.len());
    if n <= 1 {
        return items.into_iter().map(f).collect();
    }
    let len = items.len();
    let queue = Mutex::new(items.into_iter().enumerate());
    let work = || {
        let mut out = Vec::new();
        loop {
            // The lock is held only while taking the next item, never while `f` runs.
            let next = match queue.lock() {
                Ok(mut q) => q.next(),
                Err(poisoned) => poisoned.into_inner().next(),
            };
            let Some((i, t)) = next else {
                break;
            };
            out.push((i, f(t)));
        }
        out
    };
    let work = &work;
    let mut done: Vec<(usize, R)> = Vec::with_capacity(len);
    thread::scope(|scope| {
        let handles: Vec<_> = (1..n).map(|_| scope.spawn(work)).collect();
        done.extend(work());
        for h in handles {
            match h.join() {
                Ok(part) => done.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    done.sort_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// A job for [`Workers`].
type Job<'scope> = Box<dyn FnOnce() + Send + 'scope>;

/// Threads that stay for a whole search and take its jobs as they come: a plan's vectors
/// are allocated where earlier plans freed theirs (a thread started per job pays the page
/// faults of fresh memory every time: measured twice as slow per plan on the 2-vCPU
/// development machine). Dropping the workers ends the threads once their jobs are done.
pub struct Workers<'scope> {
    jobs: Option<mpsc::Sender<Job<'scope>>>,
    count: usize,
}

impl<'scope> Workers<'scope> {
    /// `count` threads in `scope`.
    pub fn new<'env>(scope: &'scope thread::Scope<'scope, 'env>, count: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job<'scope>>();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..count {
            let rx = Arc::clone(&rx);
            scope.spawn(move || {
                loop {
                    // The lock is held only while taking a job off the queue.
                    let job = match rx.lock() {
                        Ok(q) => q.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                }
            });
        }
        Workers {
            jobs: Some(tx),
            count,
        }
    }

    /// The number of threads.
    pub fn count(&self) -> usize {
        self.count
    }

    /// `items.map(f)` in input order: the first item on the calling thread, the others on
    /// the workers (all on the calling thread when there are none). A panic in `f` on a
    /// worker is resumed here, as if `f` had run here.
    pub fn map<T, R, F>(&self, items: Vec<T>, f: F) -> Vec<R>
    where
        T: Send + 'scope,
        R: Send + 'scope,
        F: Fn(T) -> R + Send + Sync + Clone + 'scope,
    {
        let Some(jobs) = self
            .jobs
            .as_ref()
            .filter(|_| self.count > 0 && items.len() > 1)
        else {
            return items.into_iter().map(f).collect();
        };
        let mut items = items.into_iter();
        let Some(first) = items.next() else {
            return Vec::new();
        };
        let mut waiting = Vec::new();
        for item in items {
            let (tx, rx) = mpsc::channel::<thread::Result<R>>();
            let g = f.clone();
            let job: Job<'scope> = Box::new(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g(item)));
                // The caller waits for this result; if it is gone there is no one to tell.
                let _ = tx.send(r);
            });
            // With every worker gone the job runs here.
            if let Err(mpsc::SendError(job)) = jobs.send(job) {
                job();
            }
            waiting.push(rx);
        }
        let mut out = Vec::with_capacity(waiting.len() + 1);
        out.push(f(first));
        for rx in waiting {
            match rx.recv() {
                Ok(Ok(r)) => out.push(r),
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                Err(_) => std::panic::resume_unwind(Box::new("a worker thread stopped")),
            }
        }
        out
    }
}

impl<'scope> Workers<'scope> {
    /// Runs `f` on a worker (here when there are none): its result is waited for with
    /// [`Pending::wait`] or looked for with [`Pending::try_take`]. A panic in `f` is
    /// resumed where the result is taken.
    pub fn submit<R, F>(&self, f: F) -> Pending<R>
    where
        R: Send + 'scope,
        F: FnOnce() -> R + Send + 'scope,
    {
        let (tx, rx) = mpsc::channel::<thread::Result<R>>();
        let job: Job<'scope> = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            // The caller waits for this result; if it is gone there is no one to tell.
            let _ = tx.send(r);
        });
        match self.jobs.as_ref().filter(|_| self.count > 0) {
            Some(jobs) => {
                // With every worker gone the job runs here.
                if let Err(mpsc::SendError(job)) = jobs.send(job) {
                    job();
                }
            }
            None => job(),
        }
        Pending { rx }
    }
}

/// The result of a job handed to [`Workers::submit`].
pub struct Pending<R> {
    rx: mpsc::Receiver<thread::Result<R>>,
}

impl<R> Pending<R> {
    /// The result, once the job has run.
    pub fn wait(self) -> R {
        match self.rx.recv() {
            Ok(r) => unwind(r),
            Err(_) => std::panic::resume_unwind(Box::new("a worker thread stopped")),
        }
    }

    /// The result if the job has run, else `None` (the job still to come or running).
    pub fn try_take(&self) -> Option<R> {
        match self.rx.try_recv() {
            Ok(r) => Some(unwind(r)),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => {
                std::panic::resume_unwind(Box::new("a worker thread stopped"))
            }
        }
    }
}

/// A job's result, its panic resumed here.
fn unwind<R>(r: thread::Result<R>) -> R {
    match r {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

impl Drop for Workers<'_> {
    fn drop(&mut self) {
        // Closing the queue ends each worker after its current job.
        self.jobs.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn map_keeps_the_input_order() {
        let items: Vec<u64> = (0..37).collect();
        let out = map(items.clone(), |x| x * x);
        assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert!(map(Vec::<u64>::new(), |x| x).is_empty());
    }

    #[test]
    fn map_on_calls_f_once_per_item_whatever_the_threads() {
        for threads in [1, 2, 3, 8] {
            for n in [0u64, 1, 2, 7, 40] {
                let calls = AtomicUsize::new(0);
                let out = map_on(threads, (0..n).collect(), |x| {
                    calls.fetch_add(1, Ordering::Relaxed);
                    // Uneven costs, so the threads take different numbers of items.
                    if x % 7 == 0 {
                        thread::sleep(std::time::Duration::from_millis(2));
                    }
                    x + 1
                });
                assert_eq!(
                    out,
                    (1..=n).collect::<Vec<_>>(),
                    "{threads} threads, {n} items"
                );
                assert_eq!(calls.load(Ordering::Relaxed), n as usize);
            }
        }
    }

    #[test]
    fn workers_map_in_order_and_end_when_dropped() {
        thread::scope(|scope| {
            let w = Workers::new(scope, 2);
            assert_eq!(w.count(), 2);
            for n in [0usize, 1, 2, 5, 17] {
                let items: Vec<usize> = (0..n).collect();
                let out = w.map(items.clone(), |x| x * 3);
                assert_eq!(out, items.iter().map(|x| x * 3).collect::<Vec<_>>());
            }
        });
        // Without workers everything runs here.
        thread::scope(|scope| {
            let w = Workers::new(scope, 0);
            assert_eq!(w.map(vec![1, 2, 3], |x| x + 1), vec![2, 3, 4]);
        });
    }

    #[test]
    fn submitted_jobs_give_their_results() {
        for count in [0, 1, 3] {
            thread::scope(|scope| {
                let w = Workers::new(scope, count);
                let jobs: Vec<_> = (0..9u64).map(|x| w.submit(move || x * x)).collect();
                let mut got = Vec::new();
                for job in jobs {
                    got.push(match job.try_take() {
                        Some(r) => r,
                        None => job.wait(),
                    });
                }
                assert_eq!(got, (0..9u64).map(|x| x * x).collect::<Vec<_>>());
            });
        }
    }

    #[test]
    fn map_resumes_a_panic() {
        let r = std::panic::catch_unwind(|| {
            map(vec![1u32, 2, 3, 4], |x| {
                assert!(x != 3, "three");
                x
            })
        });
        assert!(r.is_err());
    }
}
