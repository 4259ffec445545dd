//! Prints the planner's allocation events and the caching-allocator segments they create,
//! to compare with a real allocator history (`lab/device/trace.py memory`).
//!
//! cargo run --release --example alloc_trace -- resnet18 256 224 fp32 adamw [ckpt]

use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::allocator::CachingAllocator;
use vramlab_core::plan::config::AllocatorConfig;
use vramlab_core::plan::{Planner, TrainConfig};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let get = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let preset = find_builtin(&get(0, "resnet18"))?;
    let batch: u64 = get(1, "256").parse()?;
    let mut cfg = TrainConfig {
        batch,
        size: Some(get(2, "224").parse()?),
        ..TrainConfig::default()
    };
    cfg.precision = get(3, "fp32").parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    cfg.optimizer = get(4, "adamw")
        .parse()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    cfg.checkpointing = a.get(5).is_some_and(|s| s == "ckpt");
    let p = Planner::new(&preset, &cfg)?;
    let ev = &p.events;
    let mut al = CachingAllocator::new(AllocatorConfig::default());
    let mut h = vec![u32::MAX; ev.buffers.len()];
    for (i, e) in ev.events.iter().enumerate() {
        let b = &ev.buffers[e.buffer as usize];
        let size = b.per_sample * batch + b.fixed;
        let name = p
            .graph
            .nodes
            .get(e.node as usize)
            .map_or("-", |n| p.graph.name(n));
        let before = al.reserved;
        if e.alloc {
            h[e.buffer as usize] = al.malloc(size);
        } else {
            al.free(h[e.buffer as usize]);
        }
        let seg = if al.reserved > before {
            format!(" SEGMENT +{}", al.reserved - before)
        } else {
            String::new()
        };
        println!(
            "{i}\t{}\t{}\t{size}\t{:?}\t{:?}\t{name}\t{}{seg}",
            if e.alloc { "alloc" } else { "free" },
            e.buffer,
            e.phase,
            b.category,
            al.allocated,
        );
        if i + 1 == ev.measured_start {
            println!("--- measured step ---");
        }
    }
    println!(
        "peak_reserved {} peak_allocated {}",
        al.peak_reserved, al.peak_allocated
    );
    Ok(())
}
