//! Prints the planner's allocation events and the caching-allocator segments they create,
//! to compare with a real allocator history (`lab/device/trace.py memory`).
//!
//! cargo run --release --example alloc_trace -- resnet18 256 224 fp32 adamw [ckpt]
//! cargo run --release --example alloc_trace -- --row '{"model": "tests/data/hf_configs/…", …}'

#[path = "shared/replay.rs"]
mod shared;

use shared::open_segments;
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::allocator::CachingAllocator;
use vramlab_core::plan::{Optimizer, Planner, Precision, TrainConfig};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let (preset, cfg) = if a.first().is_some_and(|s| s == "--row") {
        // One measured row of tests/data (its JSON line), planned as the accuracy tests plan it.
        let m = vramlab_core::validate::parse_lines(a.get(1).map_or("", String::as_str))
            .pop()
            .ok_or_else(|| anyhow::anyhow!("usage: alloc_trace --row JSON"))?;
        let preset = vramlab_core::validate::model_file(&m.model)?;
        (preset, m.config()?)
    } else {
        let get = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
        let preset = find_builtin(&get(0, "resnet18"))?;
        let mut cfg = TrainConfig {
            batch: get(1, "256").parse()?,
            size: Some(get(2, "224").parse()?),
            ..TrainConfig::default()
        };
        // The settings by their canonical names (`vramlab plan` reads the aliases too).
        let (p, o) = (get(3, "fp32"), get(4, "adamw"));
        cfg.precision = Precision::ALL
            .into_iter()
            .find(|x| x.as_str() == p)
            .ok_or_else(|| {
                anyhow::anyhow!("precision `{p}`: one of fp32, amp-fp16, amp-bf16, bf16")
            })?;
        cfg.optimizer = Optimizer::ALL
            .into_iter()
            .find(|x| x.as_str() == o)
            .ok_or_else(|| anyhow::anyhow!("optimizer `{o}`: a canonical name (adamw, sgd, …)"))?;
        cfg.checkpointing = a.get(5).is_some_and(|s| s == "ckpt");
        (preset, cfg)
    };
    let batch = cfg.batch;
    let p = Planner::new(&preset, &cfg)?;
    let ev = &p.events;
    // `--cap GIB` (after the other arguments): replay under a cap, as a capped max-batch
    // search does, marking each cache flush and the OOM.
    let (mut al, capped) = shared::allocator_from_args(&a)?;
    let mut h = vec![u32::MAX; ev.buffers.len()];
    for (i, e) in ev.events.iter().enumerate() {
        let b = &ev.buffers[e.buffer as usize];
        let size = b.per_sample * batch + b.fixed;
        let name = p
            .graph
            .nodes
            .get(e.node as usize)
            .map_or("-", |n| p.graph.name(n));
        let (before, flushes) = (al.reserved, al.flushes);
        // The segments open before this event (only a capped replay flushes).
        let open: Vec<u32> = if capped {
            (0..al.segment_count())
                .filter(|&s| !al.segment_released(s))
                .collect()
        } else {
            Vec::new()
        };
        // Where an allocation went: `seg<i>+<offset>/<segment bytes>` (last column).
        let mut at = String::new();
        if e.alloc {
            h[e.buffer as usize] = al.malloc(size);
            if let Some((s, o, _)) = al.block_location(h[e.buffer as usize]) {
                at = format!("\tseg{s}+{o}/{}", al.segment_size(s));
            }
        } else {
            al.free(h[e.buffer as usize]);
            h[e.buffer as usize] = u32::MAX;
        }
        let seg = if al.oom {
            format!(" OOM (reserved {})", al.reserved)
        } else if al.flushes > flushes {
            let released: Vec<String> = open
                .iter()
                .filter(|&&s| al.segment_released(s))
                .map(|&s| format!("seg{s}:{}", al.segment_size(s)))
                .collect();
            format!(
                " FLUSH {} -> {} (released {})",
                before,
                al.reserved,
                released.join(" ")
            )
        } else if al.reserved > before {
            format!(" SEGMENT +{}", al.reserved - before)
        } else {
            String::new()
        };
        println!(
            "{i}\t{}\t{}\t{size}\t{:?}\t{:?}\t{name}\t{}{seg}{at}",
            if e.alloc { "alloc" } else { "free" },
            e.buffer,
            e.phase,
            b.category,
            al.allocated,
        );
        if i + 1 == ev.measured_start {
            println!("--- measured step ---");
        }
        if al.oom {
            segments_at_oom(&p, &al, &h);
            break;
        }
    }
    println!(
        "peak_reserved {} peak_allocated {}",
        al.peak_reserved, al.peak_allocated
    );
    Ok(())
}

/// At an OOM under `--cap`: every open segment of 20 MiB or more, its live bytes and the
/// buffers that hold them (what kept the cache flush from releasing it).
fn segments_at_oom(p: &Planner, al: &CachingAllocator, h: &[u32]) {
    let ev = &p.events;
    let mut node = vec![u32::MAX; ev.buffers.len()];
    for e in ev.events.iter().filter(|e| e.alloc) {
        node[e.buffer as usize] = e.node;
    }
    let live = h
        .iter()
        .enumerate()
        .filter(|&(_, &id)| id != u32::MAX)
        .map(|(b, &id)| (id, b));
    println!("segments open at the OOM (size, live bytes, live buffers):");
    for s in open_segments(al, live) {
        let names: Vec<String> = s
            .blocks
            .iter()
            .take(6)
            .map(|&(off, sz, b)| {
                let name = p
                    .graph
                    .nodes
                    .get(node[b] as usize)
                    .map_or("-", |n| p.graph.name(n));
                format!("{name}@{}M:{}M", off >> 20, sz >> 20)
            })
            .collect();
        println!(
            "  seg {}: {} MiB, live {} MiB ({} blocks) {}",
            s.index,
            s.size >> 20,
            s.used >> 20,
            s.blocks.len(),
            names.join(" ")
        );
    }
}
