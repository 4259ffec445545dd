//! What `alloc_trace` and `replay_trace` share: the allocator model they replay into (capped
//! by `--cap GIB`), and what they print at an out-of-memory: the segments a cache flush could
//! not release, with the live blocks that kept each.

use vramlab_core::plan::allocator::CachingAllocator;
use vramlab_core::plan::config::AllocatorConfig;

/// The allocator model to replay into, and whether it is capped: `--cap GIB` among `args`
/// caps it at that many GiB, as a capped max-batch search replays (each cache flush and the
/// out-of-memory then happen as they would there); without it, uncapped.
pub fn allocator_from_args(args: &[String]) -> anyhow::Result<(CachingAllocator, bool)> {
    let cap = args
        .iter()
        .position(|s| s == "--cap")
        .and_then(|i| args.get(i + 1))
        .map(|g| g.parse::<f64>().map(|g| (g * (1u64 << 30) as f64) as u64))
        .transpose()?;
    Ok(match cap {
        Some(c) => (
            CachingAllocator::with_cap(AllocatorConfig::default(), c),
            true,
        ),
        None => (CachingAllocator::new(AllocatorConfig::default()), false),
    })
}

/// One open segment of 20 MiB or more: its index, bytes, live bytes and live blocks
/// (`offset`, `bytes`, the caller's label), sorted by offset.
pub struct Open<L> {
    pub index: u32,
    pub size: u64,
    pub used: u64,
    pub blocks: Vec<(u64, u64, L)>,
}

/// Groups the live blocks `live` (allocator handle, label) by the segment that holds them and
/// returns the segments not released and of 20 MiB or more.
pub fn open_segments<L: Ord>(
    al: &CachingAllocator,
    live: impl IntoIterator<Item = (u32, L)>,
) -> Vec<Open<L>> {
    let mut by_seg: Vec<Vec<(u64, u64, L)>> = (0..al.segment_count()).map(|_| Vec::new()).collect();
    for (handle, label) in live {
        if let Some((seg, off, size)) = al.block_location(handle) {
            by_seg[seg as usize].push((off, size, label));
        }
    }
    by_seg
        .into_iter()
        .enumerate()
        .filter_map(|(i, mut blocks)| {
            let index = i as u32;
            let size = al.segment_size(index);
            if al.segment_released(index) || size < 20 << 20 {
                return None;
            }
            blocks.sort();
            let used = blocks.iter().map(|b| b.1).sum();
            Some(Open {
                index,
                size,
                used,
                blocks,
            })
        })
        .collect()
}
