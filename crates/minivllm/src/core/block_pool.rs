//! The pool of physical KV-cache blocks: reference counts, the free queue, and the index of
//! blocks whose contents are cached for reuse (prefix caching).

use std::collections::HashMap;

pub use crate::ids::{BlockId, CpuBlockId};

/// What a cached (full, computed) block holds, kept so a lookup can check that a hash hit
/// really is the same content: a 64-bit hash alone could serve another prefix's K/V.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedBlock {
    /// Chained hash of the block: its index key in the pool.
    pub hash: u64,
    /// Unique for every registration, never reused: children name their parent by it, so a
    /// parent that was evicted and replaced by different content under the same hash cannot
    /// vouch for them.
    pub id: u64,
    /// `id` of the block before this one in the sequence (None for a first block).
    pub parent: Option<u64>,
    pub tokens: Box<[u32]>,
}

const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Slot {
    ref_cnt: u32,
    /// Free-queue links, meaningful only while `ref_cnt == 0`.
    prev: u32,
    next: u32,
    cached: Option<CachedBlock>,
}

/// Hands out blocks and takes them back.
///
/// Blocks with no references wait in one free queue, which doubles as the LRU order for
/// eviction: a fresh block is taken from the front, evicting its cached contents if any.
/// Freed cached blocks join the back, so the least recently freed are evicted first; freed
/// uncached blocks join the front, since reusing them loses nothing. A free cached block can
/// leave the queue from the middle when a lookup revives it, hence the linked list.
#[derive(Debug)]
pub struct BlockPool {
    slots: Vec<Slot>,
    head: u32,
    tail: u32,
    num_free: usize,
    by_hash: HashMap<u64, BlockId>,
    next_entry_id: u64,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> Self {
        assert!(
            num_blocks < NIL as usize,
            "{num_blocks} blocks do not fit a u32 id"
        );
        let n = num_blocks as u32;
        let slots = (0..n)
            .map(|i| Slot {
                ref_cnt: 0,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == n { NIL } else { i + 1 },
                cached: None,
            })
            .collect();
        Self {
            slots,
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            num_free: num_blocks,
            by_hash: HashMap::new(),
            next_entry_id: 0,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.slots.len()
    }

    /// Blocks with no references, cached or not.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// `n` fresh blocks with one reference each, or `None` (taking nothing) if fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free {
            return None;
        }
        Some((0..n).map(|_| self.pop_fresh()).collect())
    }

    /// Drops one reference from each block, in order; blocks left with none become free.
    pub fn free(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        for b in blocks {
            let slot = &mut self.slots[b.0 as usize];
            debug_assert!(slot.ref_cnt > 0, "{b} freed twice");
            if slot.ref_cnt == 0 {
                continue;
            }
            slot.ref_cnt -= 1;
            if slot.ref_cnt == 0 {
                if slot.cached.is_some() {
                    self.push_back(b.0);
                } else {
                    self.push_front(b.0);
                }
            }
        }
    }

    /// Adds a reference to a block, reviving it from the free queue if it had none.
    pub fn touch(&mut self, b: BlockId) {
        if self.slots[b.0 as usize].ref_cnt == 0 {
            self.unlink(b.0);
        }
        self.slots[b.0 as usize].ref_cnt += 1;
    }

    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.slots[b.0 as usize].ref_cnt
    }

    pub fn cached(&self, b: BlockId) -> Option<&CachedBlock> {
        self.slots[b.0 as usize].cached.as_ref()
    }

    /// The block registered under `hash`, if any (its contents still need checking).
    pub fn lookup(&self, hash: u64) -> Option<(BlockId, &CachedBlock)> {
        let b = *self.by_hash.get(&hash)?;
        Some((b, self.cached(b).expect("indexed blocks are cached")))
    }

    /// Makes `b`'s contents findable under `hash` and returns the new entry's id. `b` must not
    /// be cached yet and `hash` must be free: the first registration of a hash wins.
    pub fn register(&mut self, b: BlockId, hash: u64, parent: Option<u64>, tokens: &[u32]) -> u64 {
        debug_assert!(
            self.slots[b.0 as usize].cached.is_none(),
            "{b} cached twice"
        );
        let id = self.next_entry_id;
        self.next_entry_id += 1;
        let previous = self.by_hash.insert(hash, b);
        debug_assert!(previous.is_none(), "hash {hash:#x} registered twice");
        self.slots[b.0 as usize].cached = Some(CachedBlock {
            hash,
            id,
            parent,
            tokens: tokens.into(),
        });
        id
    }

    pub fn num_cached(&self) -> usize {
        self.by_hash.len()
    }

    /// Forgets every cached block; refused (false) while any block is in use, since a running
    /// sequence may be about to extend a chain through them.
    pub fn reset_cache(&mut self) -> bool {
        if self.num_free != self.slots.len() {
            return false;
        }
        self.by_hash.clear();
        for s in &mut self.slots {
            s.cached = None;
        }
        true
    }

    /// The free queue from front (next to be reused) to back.
    pub fn free_queue(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut i = self.head;
        while i != NIL {
            out.push(BlockId(i));
            i = self.slots[i as usize].next;
        }
        out
    }

    /// Every (hash, block) in the cache index.
    pub fn cache_index(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.by_hash.iter().map(|(&h, &b)| (h, b))
    }

    fn pop_fresh(&mut self) -> BlockId {
        let i = self.head;
        assert_ne!(i, NIL, "free queue is empty");
        self.unlink(i);
        let slot = &mut self.slots[i as usize];
        slot.ref_cnt = 1;
        if let Some(c) = slot.cached.take() {
            self.by_hash.remove(&c.hash);
        }
        BlockId(i)
    }

    fn push_back(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        s.prev = self.tail;
        s.next = NIL;
        match self.tail {
            NIL => self.head = i,
            t => self.slots[t as usize].next = i,
        }
        self.tail = i;
        self.num_free += 1;
    }

    fn push_front(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        s.prev = NIL;
        s.next = self.head;
        match self.head {
            NIL => self.tail = i,
            h => self.slots[h as usize].prev = i,
        }
        self.head = i;
        self.num_free += 1;
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let s = &self.slots[i as usize];
            (s.prev, s.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_all_or_nothing_and_free_returns_blocks() {
        let mut pool = BlockPool::new(4);
        let a = pool.allocate(3).unwrap();
        assert_eq!(pool.num_free(), 1);
        assert!(pool.allocate(2).is_none());
        assert_eq!(pool.num_free(), 1);
        pool.free(a);
        assert_eq!(pool.num_free(), 4);
        let mut all = pool.allocate(4).unwrap();
        all.sort();
        assert_eq!(all, (0..4).map(BlockId).collect::<Vec<_>>());
    }

    #[test]
    fn cached_blocks_queue_at_the_back_uncached_at_the_front() {
        let mut pool = BlockPool::new(4);
        let b = pool.allocate(4).unwrap();
        pool.register(b[0], 7, None, &[1, 2]);
        pool.register(b[1], 8, Some(0), &[3, 4]);
        pool.free([b[1], b[0], b[2], b[3]]);
        assert_eq!(pool.free_queue(), vec![b[3], b[2], b[1], b[0]]);
        // Reviving from the middle keeps the rest in order.
        pool.touch(b[2]);
        assert_eq!(pool.free_queue(), vec![b[3], b[1], b[0]]);
        assert_eq!(pool.ref_count(b[2]), 1);
        // Taking cached blocks for fresh use evicts them from the index.
        let got = pool.allocate(2).unwrap();
        assert_eq!(got, vec![b[3], b[1]]);
        assert!(pool.lookup(8).is_none() && pool.cached(b[1]).is_none());
        assert_eq!(pool.lookup(7).unwrap().0, b[0]);
        assert!(!pool.reset_cache());
        pool.free(got);
        pool.free([b[2]]);
        assert!(pool.reset_cache());
        assert_eq!(pool.num_cached(), 0);
    }
}
