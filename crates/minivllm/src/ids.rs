//! The ids every layer shares: tokens, sequences, requests and KV-cache blocks. They sit
//! below all the layers (as `config`), so that the worker and the model can name a block or
//! a token without importing the scheduler or the engine.

use std::fmt;

/// A token id in the model's vocabulary.
pub type TokenId = u32;

/// One sequence (one completion of one request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq {}", self.0)
    }
}

/// A request as the caller named it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub String);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A physical KV-cache block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// No block: the entry of a sliding-window group's block table whose block has left
    /// every window of its sequence and gone back to the pool. Attention never reads it.
    pub(crate) const NULL: BlockId = BlockId(u32::MAX);
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}", self.0)
    }
}

/// A block of the CPU swap pool (`--swap-space`), a separate id space from [`BlockId`] so the
/// two pools' ids cannot be mixed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuBlockId(pub u32);

impl fmt::Display for CpuBlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpu block {}", self.0)
    }
}
