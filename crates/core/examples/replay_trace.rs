//! Replays a recorded allocator history (lines `a SIZE ID` / `f ID`) through the planner's
//! caching-allocator model and prints its peak reserved bytes and segment count.
//!
//! cargo run --release -p vramlab-core --example replay_trace -- FILE [--cap GIB] [--placements]
//!
//! `--cap GIB` replays under a per-process cap (`set_per_process_memory_fraction`), as a
//! capped max-batch search does: each cache flush (release the free segments, retry) and the
//! first request that fails even then are printed. `--placements` prints where each allocation
//! went (`p LINE SEGMENT OFFSET SEGMENT_SIZE`, LINE counted from 0) to set beside the recorded addresses.
#[path = "shared/replay.rs"]
mod shared;

use shared::open_segments;
use std::io::BufRead;
use vramlab_core::plan::allocator::CachingAllocator;

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: replay_trace FILE"))?;
    let a: Vec<String> = std::env::args().collect();
    let (mut al, _) = shared::allocator_from_args(&a)?;
    let placements = a.iter().any(|s| s == "--placements");
    let mut h = std::collections::HashMap::new();
    let mut segs = 0;
    for (n, line) in std::io::BufReader::new(std::fs::File::open(path)?)
        .lines()
        .enumerate()
    {
        let line = line?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let (before, flushes) = (al.reserved, al.flushes);
        match f.as_slice() {
            ["a", size, id] => {
                let b = al.malloc(size.parse()?);
                if placements && let Some((seg, off, _)) = al.block_location(b) {
                    println!("p {n} {seg} {off} {}", al.segment_size(seg));
                }
                h.insert(id.to_string(), b);
            }
            ["f", id] => {
                if let Some(x) = h.remove(*id) {
                    al.free(x);
                }
            }
            _ => {}
        }
        if al.oom {
            println!(
                "OOM at {line} (allocated {}, reserved {})",
                al.allocated, al.reserved
            );
            print_open_segments(&al, &h);
            break;
        }
        if al.flushes > flushes {
            println!("flush at {line}: reserved {before} -> {}", al.reserved);
        } else if al.reserved > before {
            segs += 1;
            println!("segment {} at {line}", al.reserved - before);
        }
    }
    println!(
        "peak_reserved {} segments {segs} flushes {}",
        al.peak_reserved, al.flushes
    );
    Ok(())
}

/// At an OOM: every open segment of 20 MiB or more that holds a live block, with its live bytes
/// and the ids (recorded addresses) of the blocks that kept the flush from releasing it.
fn print_open_segments(al: &CachingAllocator, h: &std::collections::HashMap<String, u32>) {
    println!("segments open at the OOM (size, live bytes: offset+size of each live block):");
    for s in open_segments(al, h.iter().map(|(id, &b)| (b, id.as_str()))) {
        let list: Vec<String> = s
            .blocks
            .iter()
            .take(8)
            .map(|&(off, sz, id)| format!("{id}@{off}+{sz}"))
            .collect();
        println!(
            "  seg {}: {}, live {}: {}",
            s.index,
            s.size,
            s.used,
            list.join(" ")
        );
    }
}
