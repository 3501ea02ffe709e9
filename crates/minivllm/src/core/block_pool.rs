//! The pool of physical KV-cache blocks: reference counts, the free queue, and the index of
//! blocks whose contents are cached for reuse (prefix caching).

use std::collections::HashMap;

use super::kv_events::PoolEvent;
pub use crate::ids::{BlockId, CpuBlockId};

/// A pool's block id: a device block, or a block of the CPU swap pool, each its own type so
/// that the two id spaces cannot be mixed.
pub(crate) trait PoolBlock: Copy + Eq + std::fmt::Display + std::fmt::Debug {
    fn index(self) -> u32;
    fn from_index(i: u32) -> Self;
}

impl PoolBlock for BlockId {
    fn index(self) -> u32 {
        self.0
    }
    fn from_index(i: u32) -> Self {
        BlockId(i)
    }
}

impl PoolBlock for CpuBlockId {
    fn index(self) -> u32 {
        self.0
    }
    fn from_index(i: u32) -> Self {
        CpuBlockId(i)
    }
}

/// A cached (full, computed) block's contents, kept so a lookup can check that a hash hit
/// really is the same content: a 64-bit hash alone could serve another prefix's K/V. One
/// entry stands for the contents in every KV cache group; each group may hold a block of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedBlock<B = BlockId> {
    /// Chained hash of the block: its index key in the pool.
    pub hash: u64,
    /// Unique for every registration, never reused: children name their parent by it, so a
    /// parent that was evicted and replaced by different content under the same hash cannot
    /// vouch for them.
    pub id: u64,
    /// `id` of the block before this one in the sequence (None for a first block).
    pub parent: Option<u64>,
    pub tokens: Box<[u32]>,
    /// The block holding these contents in each KV cache group, where one does. The entry
    /// is forgotten when the last of them is evicted.
    pub blocks: Vec<Option<B>>,
}

const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Slot {
    ref_cnt: u32,
    /// Free-queue links, meaningful only while `ref_cnt == 0`.
    prev: u32,
    next: u32,
    /// The cache entry (by hash) and group this block holds contents for.
    cached: Option<(u64, u32)>,
    /// Handed out at least once: its memory has been written, so it is resident.
    used: bool,
}

/// Hands out blocks and takes them back.
///
/// Blocks with no references wait in one free queue, which doubles as the LRU order for
/// eviction: a fresh block is taken from the front, evicting its cached contents if any.
/// Freed cached blocks join the back, so the least recently freed are evicted first; freed
/// uncached blocks join the front, since reusing them loses nothing. A free cached block can
/// leave the queue from the middle when a lookup revives it, hence the linked list.
#[derive(Debug)]
pub(crate) struct BlockPool<B: PoolBlock = BlockId> {
    slots: Vec<Slot>,
    head: u32,
    tail: u32,
    num_free: usize,
    by_hash: HashMap<u64, CachedBlock<B>>,
    next_entry_id: u64,
    num_groups: usize,
    num_ever_used: usize,
    /// Ids of the entries that left the index since [`Self::take_removed`] last drained
    /// it, kept only once [`Self::log_removed`] has asked for them: what is cached beside
    /// a block entry (a linear-attention state at its boundary) goes with it.
    removed: Option<Vec<u64>>,
    /// Entries added to and dropped from the index since [`Self::take_events`] last drained
    /// it, kept only once [`Self::log_events`] has asked for them (KV cache events).
    events: Option<Vec<PoolEvent>>,
}

impl<B: PoolBlock> BlockPool<B> {
    /// A pool of blocks shared by `num_groups` KV cache groups.
    pub fn new(num_blocks: usize, num_groups: usize) -> Self {
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
                used: false,
            })
            .collect();
        Self {
            slots,
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            num_free: num_blocks,
            by_hash: HashMap::new(),
            next_entry_id: 0,
            num_groups: num_groups.max(1),
            num_ever_used: 0,
            removed: None,
            events: None,
        }
    }

    /// Starts logging the entries that join and leave the index, for [`Self::take_events`]
    /// (whose caller must then drain it every step).
    pub(crate) fn log_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The entries that joined and left the index since the last call, in order (none
    /// unless [`Self::log_events`] was called).
    pub(crate) fn take_events(&mut self) -> impl Iterator<Item = PoolEvent> + '_ {
        self.events.iter_mut().flat_map(|events| events.drain(..))
    }

    /// Starts logging the ids of entries that leave the index, for [`Self::take_removed`]
    /// (whose caller must then drain it as often as blocks are handed out).
    pub(crate) fn log_removed(&mut self) {
        self.removed.get_or_insert_with(Vec::new);
    }

    /// The ids of the entries that left the index since the last call (none unless
    /// [`Self::log_removed`] was called).
    pub(crate) fn take_removed(&mut self) -> impl Iterator<Item = u64> + '_ {
        self.removed
            .iter_mut()
            .flat_map(|removed| removed.drain(..))
    }

    pub fn num_blocks(&self) -> usize {
        self.slots.len()
    }

    /// Blocks handed out at least once since the pool was made: those whose memory the
    /// engine has written, and so holds resident.
    pub(crate) fn num_ever_used(&self) -> usize {
        self.num_ever_used
    }

    /// Blocks with no references, cached or not.
    pub(crate) fn num_free(&self) -> usize {
        self.num_free
    }

    /// `n` fresh blocks with one reference each, or `None` (taking nothing) if fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<B>> {
        if n > self.num_free {
            return None;
        }
        Some((0..n).map(|_| self.pop_fresh()).collect())
    }

    /// Drops one reference from each block, in order; blocks left with none become free.
    pub fn free(&mut self, blocks: impl IntoIterator<Item = B>) {
        for b in blocks {
            let slot = &mut self.slots[b.index() as usize];
            debug_assert!(slot.ref_cnt > 0, "{b} freed twice");
            if slot.ref_cnt == 0 {
                continue;
            }
            slot.ref_cnt -= 1;
            if slot.ref_cnt == 0 {
                if slot.cached.is_some() {
                    self.push_back(b.index());
                } else {
                    self.push_front(b.index());
                }
            }
        }
    }

    /// Adds a reference to a block, reviving it from the free queue if it had none.
    pub(crate) fn touch(&mut self, b: B) {
        if self.slots[b.index() as usize].ref_cnt == 0 {
            self.unlink(b.index());
        }
        self.slots[b.index() as usize].ref_cnt += 1;
    }

    pub(crate) fn ref_count(&self, b: B) -> u32 {
        self.slots[b.index() as usize].ref_cnt
    }

    /// The entry whose contents `b` holds, if it is cached.
    pub fn cached(&self, b: B) -> Option<&CachedBlock<B>> {
        let (hash, _) = self.slots[b.index() as usize].cached?;
        self.by_hash.get(&hash)
    }

    /// The entry registered under `hash`, if any (its contents still need checking).
    pub fn lookup(&self, hash: u64) -> Option<&CachedBlock<B>> {
        self.by_hash.get(&hash)
    }

    /// Makes `b`'s contents findable under `hash` as group `group`'s block and returns the
    /// entry's id. `b` must not be cached yet. If `hash` names an entry already, the caller
    /// has checked it holds these contents, and `b` joins it only where the group has no
    /// block of it (the first registration wins, as in vLLM); otherwise a new entry starts.
    pub(crate) fn register(
        &mut self,
        b: B,
        group: usize,
        hash: u64,
        parent: Option<u64>,
        tokens: &[u32],
    ) -> u64 {
        debug_assert!(
            self.slots[b.index() as usize].cached.is_none(),
            "{b} cached twice"
        );
        let num_groups = self.num_groups;
        let next_id = &mut self.next_entry_id;
        let events = &mut self.events;
        let entry = self.by_hash.entry(hash).or_insert_with(|| {
            let id = *next_id;
            *next_id += 1;
            if let Some(events) = events {
                let tokens = tokens.into();
                events.push(PoolEvent::Stored { id, parent, tokens });
            }
            CachedBlock {
                hash,
                id,
                parent,
                tokens: tokens.into(),
                blocks: vec![None; num_groups],
            }
        });
        debug_assert!(
            *entry.tokens == *tokens && entry.parent == parent,
            "hash {hash:#x} registered for other contents"
        );
        if entry.blocks[group].is_none() {
            entry.blocks[group] = Some(b);
            self.slots[b.index() as usize].cached = Some((hash, group as u32));
        }
        entry.id
    }

    /// Takes `b` out of the cache (its content turned out never to have been computed); a
    /// free `b` moves to the front of the free queue, as uncached blocks go.
    pub(crate) fn unregister(&mut self, b: B) {
        let slot = &mut self.slots[b.index() as usize];
        let Some((hash, group)) = slot.cached.take() else {
            return;
        };
        let free = slot.ref_cnt == 0;
        self.drop_from_entry(hash, group);
        if free {
            self.unlink(b.index());
            self.push_front(b.index());
        }
    }

    /// Blocks holding cached contents, over all groups.
    #[cfg(test)]
    pub(crate) fn num_cached(&self) -> usize {
        self.slots.iter().filter(|s| s.cached.is_some()).count()
    }

    /// Forgets every cached block; refused (false) while any block is in use, since a running
    /// sequence may be about to extend a chain through them.
    #[cfg(test)]
    pub(crate) fn reset_cache(&mut self) -> bool {
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
    #[cfg(test)]
    pub(crate) fn free_queue(&self) -> Vec<B> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut i = self.head;
        while i != NIL {
            out.push(B::from_index(i));
            i = self.slots[i as usize].next;
        }
        out
    }

    /// Every (hash, group, block) in the cache index.
    #[cfg(test)]
    pub(crate) fn cache_index(&self) -> impl Iterator<Item = (u64, usize, B)> + '_ {
        self.by_hash.iter().flat_map(|(&h, e)| {
            (e.blocks.iter().enumerate()).filter_map(move |(g, b)| b.map(|b| (h, g, b)))
        })
    }

    fn pop_fresh(&mut self) -> B {
        let i = self.head;
        assert_ne!(i, NIL, "free queue is empty");
        self.unlink(i);
        let slot = &mut self.slots[i as usize];
        slot.ref_cnt = 1;
        if !slot.used {
            slot.used = true;
            self.num_ever_used += 1;
        }
        if let Some((hash, group)) = slot.cached.take() {
            debug_assert!(
                self.by_hash.contains_key(&hash),
                "cached blocks are indexed"
            );
            self.drop_from_entry(hash, group);
        }
        B::from_index(i)
    }

    /// Group `group`'s block of the entry under `hash` is gone: the entry leaves the index
    /// with its last block.
    fn drop_from_entry(&mut self, hash: u64, group: u32) {
        let Some(entry) = self.by_hash.get_mut(&hash) else {
            return;
        };
        entry.blocks[group as usize] = None;
        if entry.blocks.iter().all(Option::is_none) {
            let id = entry.id;
            self.by_hash.remove(&hash);
            if let Some(removed) = &mut self.removed {
                removed.push(id);
            }
            if let Some(events) = &mut self.events {
                events.push(PoolEvent::Removed { id });
            }
        }
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
        let mut pool = BlockPool::<BlockId>::new(4, 1);
        let a = pool.allocate(3).unwrap();
        assert_eq!(pool.num_free(), 1);
        assert!(pool.allocate(2).is_none());
        assert_eq!(pool.num_free(), 1);
        pool.free(a);
        assert_eq!(pool.num_free(), 4);
        // Freed uncached blocks are reused first: still three ever used.
        let again = pool.allocate(3).unwrap();
        pool.free(again);
        assert_eq!(pool.num_ever_used(), 3);
        let mut all = pool.allocate(4).unwrap();
        all.sort();
        assert_eq!(all, (0..4).map(BlockId).collect::<Vec<_>>());
        assert_eq!(pool.num_ever_used(), 4);
    }

    #[test]
    fn cached_blocks_queue_at_the_back_uncached_at_the_front() {
        let mut pool = BlockPool::<BlockId>::new(4, 1);
        let b = pool.allocate(4).unwrap();
        pool.register(b[0], 0, 7, None, &[1, 2]);
        pool.register(b[1], 0, 8, Some(0), &[3, 4]);
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
        assert_eq!(pool.lookup(7).unwrap().blocks, [Some(b[0])]);
        assert!(!pool.reset_cache());
        pool.free(got);
        pool.free([b[2]]);
        assert!(pool.reset_cache());
        assert_eq!(pool.num_cached(), 0);
    }

    #[test]
    fn an_entry_lives_while_any_group_holds_a_block_of_it() {
        let mut pool = BlockPool::<BlockId>::new(3, 2);
        let b = pool.allocate(3).unwrap();
        let id = pool.register(b[0], 0, 7, None, &[1, 2]);
        // The second group's block joins the entry; a later one of the same group does not.
        assert_eq!(pool.register(b[1], 1, 7, None, &[1, 2]), id);
        assert_eq!(pool.register(b[2], 1, 7, None, &[1, 2]), id);
        assert_eq!(pool.lookup(7).unwrap().blocks, [Some(b[0]), Some(b[1])]);
        assert!(pool.cached(b[2]).is_none());
        assert_eq!(pool.num_cached(), 2);
        pool.free([b[2], b[0], b[1]]);
        // b[2] (uncached) goes first, then b[0]: the entry keeps group 1's block.
        pool.allocate(2).unwrap();
        assert_eq!(pool.lookup(7).unwrap().blocks, [None, Some(b[1])]);
        assert_eq!(pool.cached(b[1]).unwrap().id, id);
        pool.allocate(1).unwrap();
        assert!(pool.lookup(7).is_none());
    }
}
