//! The pool of physical KV-cache blocks.

use std::fmt;

/// A physical KV-cache block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}", self.0)
    }
}

/// Hands out free blocks and takes them back. Blocks are reused most-recently-freed first,
/// so a steady workload keeps touching the same (warm, already paged-in) memory.
#[derive(Debug)]
pub struct BlockPool {
    free: Vec<BlockId>,
    num_blocks: usize,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> Self {
        let free = (0..num_blocks as u32).rev().map(BlockId).collect();
        Self { free, num_blocks }
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// `n` blocks, or `None` (taking nothing) if fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free.len() {
            return None;
        }
        Some(self.free.split_off(self.free.len() - n))
    }

    pub fn free(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        for b in blocks {
            debug_assert!((b.0 as usize) < self.num_blocks, "{b} is not in this pool");
            debug_assert!(!self.free.contains(&b), "{b} freed twice");
            self.free.push(b);
        }
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
}
