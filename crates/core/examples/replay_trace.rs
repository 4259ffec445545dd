//! Replays a recorded allocator history (lines `a SIZE ID` / `f ID`) through the planner's
//! caching-allocator model and prints its peak reserved bytes and segment count.
use std::io::BufRead;
use vramlab_core::plan::allocator::CachingAllocator;
use vramlab_core::plan::config::AllocatorConfig;

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: replay_trace FILE"))?;
    let mut al = CachingAllocator::new(AllocatorConfig::default());
    let mut h = std::collections::HashMap::new();
    let mut segs = 0;
    for line in std::io::BufReader::new(std::fs::File::open(path)?).lines() {
        let line = line?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let before = al.reserved;
        match f.as_slice() {
            ["a", size, id] => {
                h.insert(id.to_string(), al.malloc(size.parse()?));
            }
            ["f", id] => {
                if let Some(x) = h.remove(*id) {
                    al.free(x);
                }
            }
            _ => {}
        }
        if al.reserved > before {
            segs += 1;
            println!("segment {} at {line}", al.reserved - before);
        }
    }
    println!("peak_reserved {} segments {segs}", al.peak_reserved);
    Ok(())
}
