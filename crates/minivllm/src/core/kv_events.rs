//! KV cache events: what entered and left the prefix cache, named by vLLM's block hashes,
//! for routers that place requests where their prefix is cached (vLLM's `KVCacheEvent`s,
//! `vllm/distributed/kv_events.py`; published by `core/kv_event_publisher.rs`).
//!
//! The prefix cache keys its blocks by a fast 64-bit chained hash checked against the stored
//! tokens (`kv_cache_manager.rs` says why). Outside the process a block is named as vLLM
//! names it with `--prefix-caching-hash-algo sha256_cbor`: SHA-256 of the canonical CBOR of
//! `(parent_hash, token_ids, None)`, the first block's parent being `NONE_HASH`, SHA-256 of
//! the CBOR text string `PYTHONHASHSEED` (when set) or `"vllm-none-hash"`. Anyone can thus
//! compute a prompt's block names without the engine (`docs/distributed.md`).

use std::collections::HashMap;

use sha2::{Digest, Sha256};

/// A block's name outside the process: vLLM's `sha256_cbor` chained hash.
pub type ExternalBlockHash = [u8; 32];

/// One change to the prefix cache, as vLLM reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// Consecutive blocks of one sequence became findable: `block_hashes[0]`'s parent is
    /// `parent_block_hash` (None: the sequence's first block), each next block's parent the
    /// one before it; `token_ids` holds all their tokens, `block_size` per block.
    BlockStored {
        block_hashes: Vec<ExternalBlockHash>,
        parent_block_hash: Option<ExternalBlockHash>,
        token_ids: Vec<u32>,
        block_size: usize,
    },
    /// Blocks no longer findable (evicted, or never computed after a failed step).
    BlockRemoved {
        block_hashes: Vec<ExternalBlockHash>,
    },
}

/// What the block pool logs, by its own entry ids (`block_pool.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PoolEvent {
    Stored {
        id: u64,
        parent: Option<u64>,
        tokens: Box<[u32]>,
    },
    Removed {
        id: u64,
    },
}

/// The seed vLLM derives `NONE_HASH` from when `PYTHONHASHSEED` is unset.
const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// Names the pool's entries as vLLM would: keeps each cached entry's external hash, since a
/// child's is computed from its parent's.
#[derive(Debug)]
pub(crate) struct ExternalHashes {
    none_hash: ExternalBlockHash,
    block_size: usize,
    by_entry: HashMap<u64, ExternalBlockHash>,
}

impl ExternalHashes {
    /// Seeded as vLLM's processes are: `PYTHONHASHSEED` when set, so that engines and
    /// routers configured alike agree.
    pub(crate) fn new(block_size: usize) -> Self {
        let seed = std::env::var("PYTHONHASHSEED").ok();
        Self::with_seed(
            seed.as_deref().unwrap_or(DEFAULT_NONE_HASH_SEED),
            block_size,
        )
    }

    pub(crate) fn with_seed(seed: &str, block_size: usize) -> Self {
        let mut cbor = Vec::with_capacity(seed.len() + 9);
        cbor_head(&mut cbor, 3, seed.len() as u64);
        cbor.extend_from_slice(seed.as_bytes());
        Self {
            none_hash: Sha256::digest(&cbor).into(),
            block_size,
            by_entry: HashMap::new(),
        }
    }

    /// The first block's parent in the chain.
    #[cfg(test)]
    pub(crate) fn none_hash(&self) -> ExternalBlockHash {
        self.none_hash
    }

    /// Turns the pool's log into vLLM's events, merging runs as vLLM does: a stored block
    /// whose parent is the previous event's last block joins that event, as do consecutive
    /// removals. A block whose parent's name is unknown (its parent left the cache before
    /// the child entered it) cannot be named, and no router could reach it through its
    /// parent anyway: it is left out, and so is its later removal.
    pub(crate) fn events(&mut self, log: impl IntoIterator<Item = PoolEvent>) -> Vec<KvCacheEvent> {
        let mut out: Vec<KvCacheEvent> = Vec::new();
        for e in log {
            match e {
                PoolEvent::Stored { id, parent, tokens } => {
                    let parent_hash = match parent {
                        None => None,
                        Some(p) => match self.by_entry.get(&p) {
                            Some(h) => Some(*h),
                            None => {
                                tracing::debug!(entry = id, "KV event left out: parent unnamed");
                                continue;
                            }
                        },
                    };
                    let hash = hash_block_tokens(parent_hash.unwrap_or(self.none_hash), &tokens);
                    self.by_entry.insert(id, hash);
                    if let Some(KvCacheEvent::BlockStored {
                        block_hashes,
                        token_ids,
                        ..
                    }) = out.last_mut()
                    {
                        if parent_hash.is_some() && block_hashes.last() == parent_hash.as_ref() {
                            block_hashes.push(hash);
                            token_ids.extend_from_slice(&tokens);
                            continue;
                        }
                    }
                    out.push(KvCacheEvent::BlockStored {
                        block_hashes: vec![hash],
                        parent_block_hash: parent_hash,
                        token_ids: tokens.into_vec(),
                        block_size: self.block_size,
                    });
                }
                PoolEvent::Removed { id } => {
                    let Some(hash) = self.by_entry.remove(&id) else {
                        continue;
                    };
                    if let Some(KvCacheEvent::BlockRemoved { block_hashes }) = out.last_mut() {
                        block_hashes.push(hash);
                    } else {
                        out.push(KvCacheEvent::BlockRemoved {
                            block_hashes: vec![hash],
                        });
                    }
                }
            }
        }
        out
    }
}

/// vLLM's `hash_block_tokens(sha256_cbor, parent, tokens)`: SHA-256 of the canonical CBOR
/// of the 3-array `[parent (bytes), tokens (array of uints), null]`.
pub fn hash_block_tokens(parent: ExternalBlockHash, tokens: &[u32]) -> ExternalBlockHash {
    let mut h = Sha256::new();
    let mut head = Vec::with_capacity(9);
    h.update([0x83]);
    cbor_head(&mut head, 2, parent.len() as u64);
    h.update(&head);
    h.update(parent);
    head.clear();
    cbor_head(&mut head, 4, tokens.len() as u64);
    for &t in tokens {
        cbor_head(&mut head, 0, t.into());
    }
    h.update(&head);
    h.update([0xf6]);
    h.finalize().into()
}

/// A CBOR data item's head: major type and argument in the shortest form (RFC 8949 §3,
/// which canonical encoding requires).
fn cbor_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, n as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(h: &[u8]) -> String {
        h.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The values vLLM 0.32 gives (`init_none_hash(sha256_cbor)` without PYTHONHASHSEED,
    /// then `hash_block_tokens(sha256_cbor, ...)`), tokens chosen to need each CBOR integer
    /// width.
    #[test]
    fn block_hashes_are_vllms_sha256_cbor() {
        let x = ExternalHashes::with_seed(DEFAULT_NONE_HASH_SEED, 4);
        assert_eq!(
            hex(&x.none_hash),
            "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
        );
        let h1 = hash_block_tokens(x.none_hash, &[1, 2, 3, 4]);
        assert_eq!(
            hex(&h1),
            "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111"
        );
        let h2 = hash_block_tokens(h1, &[300, 70000, 0, 49151]);
        assert_eq!(
            hex(&h2),
            "8fe994f50d1ea45d7712bbb96ba5fd85f8254daef990bebeb2796330d17f134b"
        );
    }

    #[test]
    fn cbor_heads_take_the_shortest_form() {
        let head = |major, n| {
            let mut v = Vec::new();
            cbor_head(&mut v, major, n);
            v
        };
        assert_eq!(head(0, 23), [0x17]);
        assert_eq!(head(0, 24), [0x18, 24]);
        assert_eq!(head(4, 256), [0x99, 1, 0]);
        assert_eq!(head(0, 65536), [0x1a, 0, 1, 0, 0]);
        assert_eq!(head(0, 1 << 32), [0x1b, 0, 0, 0, 1, 0, 0, 0, 0]);
    }

    #[test]
    fn runs_merge_and_unnamed_blocks_are_left_out() {
        let mut x = ExternalHashes::with_seed("0", 2);
        let stored = |id, parent, tokens: &[u32]| PoolEvent::Stored {
            id,
            parent,
            tokens: tokens.into(),
        };
        let ev = x.events([
            stored(0, None, &[1, 2]),
            stored(1, Some(0), &[3, 4]),
            // Another sequence's first block: a new event.
            stored(2, None, &[9, 9]),
            // Parent 7 was never named.
            stored(3, Some(7), &[5, 6]),
            PoolEvent::Removed { id: 1 },
            PoolEvent::Removed { id: 3 },
            PoolEvent::Removed { id: 2 },
        ]);
        let h0 = hash_block_tokens(x.none_hash, &[1, 2]);
        let h1 = hash_block_tokens(h0, &[3, 4]);
        let h2 = hash_block_tokens(x.none_hash, &[9, 9]);
        assert_eq!(
            ev,
            [
                KvCacheEvent::BlockStored {
                    block_hashes: vec![h0, h1],
                    parent_block_hash: None,
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                },
                KvCacheEvent::BlockStored {
                    block_hashes: vec![h2],
                    parent_block_hash: None,
                    token_ids: vec![9, 9],
                    block_size: 2,
                },
                KvCacheEvent::BlockRemoved {
                    block_hashes: vec![h1, h2]
                },
            ]
        );
        // A child stored after its parent's removal is not named either.
        assert_eq!(x.events([stored(4, Some(1), &[7, 7])]), []);
        let ev = x.events([stored(5, Some(0), &[8, 8])]);
        assert!(
            matches!(&ev[..], [KvCacheEvent::BlockStored { parent_block_hash: Some(p), .. }] if *p == h0)
        );
    }

    use crate::core::kv_cache_manager::tests::{cached_tokens, mgr, prefill, toks};
    use crate::core::kv_cache_manager::{KvCacheManager, KvCacheManagerConfig};
    use crate::sequence::SeqId;

    #[test]
    fn the_cache_manager_reports_what_enters_and_leaves_it() {
        let mut m = mgr(3, 2);
        m.enable_kv_events();
        let a = toks(0..5);
        prefill(&mut m, 1, &a);
        let none = ExternalHashes::new(2).none_hash();
        let h0 = hash_block_tokens(none, &[0, 1]);
        let h1 = hash_block_tokens(h0, &[2, 3]);
        assert_eq!(
            m.take_kv_events(),
            [KvCacheEvent::BlockStored {
                block_hashes: vec![h0, h1],
                parent_block_hash: None,
                token_ids: vec![0, 1, 2, 3],
                block_size: 2,
            }]
        );
        assert_eq!(m.take_kv_events(), []);
        m.free(SeqId(1));
        // Shares [0, 1]; its own second block is new.
        let b = [0, 1, 7, 7, 9];
        assert_eq!(prefill(&mut m, 2, &b), 2);
        let h1b = hash_block_tokens(h0, &[7, 7]);
        // Taking a block evicted the least recently freed cached one: a's tail.
        assert_eq!(
            m.take_kv_events(),
            [
                KvCacheEvent::BlockRemoved {
                    block_hashes: vec![h1]
                },
                KvCacheEvent::BlockStored {
                    block_hashes: vec![h1b],
                    parent_block_hash: Some(h0),
                    token_ids: vec![7, 7],
                    block_size: 2,
                }
            ]
        );
        // Without prefix caching nothing is reported.
        let mut off = KvCacheManager::new(KvCacheManagerConfig {
            enable_prefix_caching: false,
            ..KvCacheManagerConfig::new(4, 2)
        });
        off.enable_kv_events();
        prefill(&mut off, 1, &a);
        assert_eq!(off.take_kv_events(), []);
    }

    /// A step that failed takes its registrations back: routers hear of the blocks' removal
    /// in the same batch that stored them, so they never count on K/V nobody computed.
    #[test]
    fn a_failed_step_reports_its_blocks_removed() {
        let mut m = mgr(4, 2);
        m.enable_kv_events();
        m.start_step();
        prefill(&mut m, 1, &toks(0..5));
        m.free(SeqId(1));
        m.forget_step();
        let none = ExternalHashes::new(2).none_hash();
        let h0 = hash_block_tokens(none, &[0, 1]);
        let h1 = hash_block_tokens(h0, &[2, 3]);
        assert_eq!(
            m.take_kv_events(),
            [
                KvCacheEvent::BlockStored {
                    block_hashes: vec![h0, h1],
                    parent_block_hash: None,
                    token_ids: vec![0, 1, 2, 3],
                    block_size: 2,
                },
                KvCacheEvent::BlockRemoved {
                    block_hashes: vec![h0, h1]
                },
            ]
        );
        assert_eq!(cached_tokens(&mut m, &toks(0..5)), 0);
    }
}
