//! Reads and analyses one memory snapshot, printing the time of each phase:
//! `cargo run --release -p vramlab-core --example snapshot_read -- FILE`.

use std::time::Instant;

use vramlab_core::doctor::{self, pickle};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: snapshot_read FILE")?;
    let t = Instant::now();
    let file = std::fs::File::open(&path)?;
    let p = pickle::read_pickle(file, pickle::Limits::default(), &mut |_| true)?;
    let read = t.elapsed();
    let s = doctor::Snapshot::from_pickle(&p)?;
    let typed = t.elapsed();
    drop(p);
    let r = doctor::analyze(&s, None)?;
    let done = t.elapsed();
    println!(
        "{path}: unpickle {:.3} s, typing {:.3} s, analysis {:.3} s, total {:.3} s; {} entries, {} stacks, {} frames",
        read.as_secs_f64(),
        (typed - read).as_secs_f64(),
        (done - typed).as_secs_f64(),
        done.as_secs_f64(),
        r.trace_entries,
        s.stacks.len(),
        s.frames.len()
    );
    Ok(())
}
