//! Best-fit index of free allocator blocks: segregated bins (16 per power of two, as in
//! TLSF) with an occupancy bitmap. Finds the smallest block ≥ a size, ties broken by the
//! lowest (segment, offset) — the order of PyTorch's `BlockComparatorSize` — in O(1) bins
//! instead of a tree walk.

use std::collections::VecDeque;

const SUB: u32 = 4; // 2^4 bins per power of two
const BINS: usize = 64 << SUB;

fn bin(size: u64) -> usize {
    let fl = 63 - size.max(1).leading_zeros();
    if fl < SUB {
        return size as usize;
    }
    let sl = (size >> (fl - SUB)) & ((1 << SUB) - 1);
    ((fl as usize) << SUB) | sl as usize
}

/// An entry found by [`FreeBins::best_fit`], with where it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fit {
    pub key: u128,
    pub id: u32,
    bin: usize,
    index: usize,
}

impl Fit {
    /// Bytes of the block.
    pub fn size(&self) -> u64 {
        (self.key >> 64) as u64
    }
}

/// A key as (high, low) halves: 24-byte entries instead of the 32 of a 16-aligned `u128`.
type Key = (u64, u64);

fn split(key: u128) -> Key {
    ((key >> 64) as u64, key as u64)
}

fn join(k: Key) -> u128 {
    (u128::from(k.0) << 64) | u128::from(k.1)
}

/// Free blocks keyed by `(size << 64) | position`; values are block ids. Each bin is a
/// deque sorted by key: blocks of one size pile up in a bin (the layers of a model free
/// alike tensors), and they are mostly taken at the low end and returned at either end,
/// which a deque does without moving the others and without a search.
#[derive(Debug, Clone)]
pub struct FreeBins {
    bins: Vec<VecDeque<(Key, u32)>>,
    mask: [u64; BINS / 64],
    len: usize,
}

impl Default for FreeBins {
    fn default() -> Self {
        FreeBins {
            bins: (0..BINS).map(|_| VecDeque::new()).collect(),
            mask: [0; BINS / 64],
            len: 0,
        }
    }
}

impl FreeBins {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn insert(&mut self, key: u128, id: u32) {
        let key = split(key);
        let b = bin(key.0);
        let slot = &mut self.bins[b];
        match (slot.front(), slot.back()) {
            (_, None) => slot.push_back((key, id)),
            (_, Some(&(last, _))) if key > last => slot.push_back((key, id)),
            (Some(&(first, _)), _) if key < first => slot.push_front((key, id)),
            _ => {
                let at = slot.partition_point(|&(k, _)| k < key);
                slot.insert(at, (key, id));
            }
        }
        self.mask[b / 64] |= 1 << (b % 64);
        self.len += 1;
    }

    /// Removes the entry with `key` (no-op when absent).
    pub fn remove(&mut self, key: u128) {
        let key = split(key);
        let b = bin(key.0);
        let slot = &self.bins[b];
        let at = if slot.front().is_some_and(|e| e.0 == key) {
            Some(0)
        } else if slot.back().is_some_and(|e| e.0 == key) {
            Some(slot.len() - 1)
        } else {
            slot.binary_search_by(|&(k, _)| k.cmp(&key)).ok()
        };
        if let Some(index) = at {
            self.remove_at(b, index);
        }
    }

    fn remove_at(&mut self, b: usize, index: usize) {
        let slot = &mut self.bins[b];
        if index == 0 {
            slot.pop_front();
        } else {
            slot.remove(index);
        }
        self.len -= 1;
        if slot.is_empty() {
            self.mask[b / 64] &= !(1 << (b % 64));
        }
    }

    /// The smallest entry whose size is ≥ `size` (lowest key among equals).
    pub fn best_fit(&self, size: u64) -> Option<Fit> {
        let b = bin(size);
        let floor = (size, 0);
        let slot = &self.bins[b];
        let (bin, index) = match (slot.front(), slot.back()) {
            (Some(&(first, _)), _) if first >= floor => (b, 0),
            (_, Some(&(last, _))) if last >= floor => {
                (b, slot.partition_point(|&(k, _)| k < floor))
            }
            // Every entry of the bin is smaller (no search): the next occupied bin has the fit.
            _ => (self.next_bin(b + 1)?, 0),
        };
        let (key, id) = *self.bins[bin].get(index)?;
        Some(Fit {
            key: join(key),
            id,
            bin,
            index,
        })
    }

    /// Removes the entry `best_fit` returned (the bins must not have changed since).
    pub fn take(&mut self, fit: Fit) {
        self.remove_at(fit.bin, fit.index);
    }

    fn next_bin(&self, from: usize) -> Option<usize> {
        let mut w = from / 64;
        if w >= self.mask.len() {
            return None;
        }
        let mut bits = self.mask[w] & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            if w >= self.mask.len() {
                return None;
            }
            bits = self.mask[w];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn agrees_with_an_ordered_map() {
        let mut bins = FreeBins::default();
        let mut map = BTreeMap::new();
        // A deterministic pseudo-random mix of inserts, removals and queries.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for id in 0..5000u32 {
            let size = 512 * (1 + next() % 100_000);
            let key = (u128::from(size) << 64) | u128::from(id);
            bins.insert(key, id);
            map.insert(key, id);
            if next() % 3 == 0 {
                let victim = (next() % u64::from(id + 1)) as u32;
                if let Some(k) = map.iter().find(|(_, v)| **v == victim).map(|(k, _)| *k) {
                    map.remove(&k);
                    bins.remove(k);
                }
            }
            let q = 512 * (1 + next() % 120_000);
            let expect = map
                .range(u128::from(q) << 64..)
                .next()
                .map(|(k, v)| (*k, *v));
            assert_eq!(bins.best_fit(q).map(|f| (f.key, f.id)), expect, "query {q}");
            if let Some(fit) = bins.best_fit(q)
                && next() % 4 == 0
            {
                bins.take(fit);
                map.remove(&fit.key);
            }
            assert_eq!(bins.len(), map.len());
        }
    }
}
