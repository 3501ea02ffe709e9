//! The KV cache manager: per-sequence block tables over a shared [`BlockPool`], prefix
//! caching (vLLM v1 `KVCacheManager` semantics), and the CPU swap pool that preempted
//! sequences' blocks move to and back from (`swap_out` / `swap_in` return the copies).
//! Sequences share blocks only through the prefix cache, whose blocks are full and never
//! written again, so `n > 1` needs no copy-on-write: its sequences are siblings that find
//! the prompt's blocks there.
//!
//! A sequence has one block table per KV cache group (`config/kv_cache_layout.rs`): one for
//! a model whose layers are all alike, several for Gemma 3's mix of full and sliding-window
//! layers. The tables of a sequence always have the same length; in a sliding-window
//! group's table, the blocks that have left the window of every query still to come are
//! given back to the pool and replaced by [`BlockId::NULL`] (vLLM v1's
//! `SlidingWindowManager`), so a long conversation holds, in those layers, only the window.
//!
//! A block's K/V depend on every token before it, so a cached block is keyed by a chained
//! hash of its parent block's hash and its own token ids, and found by walking a new
//! prompt's full blocks from the start. Only full, computed blocks are cached.
//!
//! Why a 64-bit hash whose hits are checked against the stored tokens, rather than a
//! 128-bit key trusted alone: a wrong hit serves one prompt another prompt's K/V, silently
//! and possibly across users (vLLM's CVE-2025-25183 was such a collision, crafted through
//! Python's predictable `hash`). A fast 128-bit hash with fixed public keys (SipHash, xxh3)
//! is just as predictable to a client choosing its prompt, and only a cryptographic one
//! (SHA-256, as vLLM's `--prefix-caching-hash-algo sha256`) would make the check
//! removable. The check costs a comparison of one block's tokens per hit and 64 bytes per
//! cached block (its K/V take 100s of KiB), and it makes correctness independent of the
//! hash: a collision can only cost a cache miss. So the bookkeeping stays.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::block_pool::{BlockId, BlockPool, CpuBlockId};
use super::kv_events::{ExternalHashes, KvCacheEvent};
use crate::config::first_needed_block;
use crate::model_executor::input_metadata::StateStep;
use crate::sequence::SeqId;
use state_pool::StatePool;

#[derive(Debug, Clone, PartialEq)]
pub struct KvCacheManagerConfig {
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    /// fraction of blocks kept free when admitting NEW sequences (vLLM watermark, default 0.01)
    pub watermark: f32,
    /// Each KV cache group's sliding window (`None`: full attention); a sequence has one
    /// block table per group.
    pub group_windows: Vec<Option<usize>>,
    /// Blocks of the CPU swap pool (`--swap-space`); 0 preempts by recompute only.
    pub num_cpu_blocks: usize,
    /// Linear-attention state slots (0: the model has no such layers): a sequence holds
    /// one from its admission until it finishes or is preempted; with prefix caching, the
    /// others keep states at block boundaries (`kv_cache_manager/state_pool.rs`).
    pub num_state_slots: usize,
}

impl KvCacheManagerConfig {
    /// Prefix caching on and vLLM's default watermark.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            num_blocks,
            block_size,
            enable_prefix_caching: true,
            watermark: 0.01,
            group_windows: vec![None],
            num_cpu_blocks: 0,
            num_state_slots: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PrefixCacheStats {
    /// Tokens looked up.
    pub queries: u64,
    /// Tokens found.
    pub hits: u64,
}

/// Chained block hash: (parent block's hash, this block's token ids) -> hash.
pub(crate) type BlockHasher = fn(Option<u64>, &[u32]) -> u64;

/// `DefaultHasher::new()` has fixed keys, so hashes agree across sequences and runs.
fn default_block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// A full block of a sequence whose hash is known.
#[derive(Debug, Clone, Copy)]
struct HashedBlock {
    hash: u64,
    /// Cache entry id of this content (its own or that of an equal block registered first);
    /// None after a hash collision, which leaves it and its descendants uncacheable.
    entry: Option<u64>,
}

#[derive(Debug, Clone, Default)]
struct SeqBlocks {
    /// One table per KV cache group, all of the same length.
    tables: Vec<Vec<BlockId>>,
    /// One per leading full block already hashed: cache_full_blocks resumes after them.
    hashed: Vec<HashedBlock>,
    /// Its linear-attention state slot, where the model has such layers.
    state_slot: Option<u32>,
    /// The prefix-cache entry its latest state kept at a block boundary is cached under.
    snapshot_key: Option<u64>,
    /// The state copies of the step being scheduled: a cached state it starts from, and
    /// where the state at a block boundary inside the step goes (`StateStep`).
    restore_from: Option<u32>,
    snapshot: Option<(u32, u32)>,
}

impl SeqBlocks {
    fn len(&self) -> usize {
        self.tables.first().map_or(0, Vec::len)
    }
}

/// A prefix-cache lookup for a sequence about to start
/// ([`KvCacheManager::get_computed_blocks`]): the cached blocks of the longest usable prefix
/// of its tokens, which [`KvCacheManager::allocate_new_slots`] then takes over, so an
/// admission looks its prefix up once (vLLM's `new_computed_blocks`).
#[derive(Debug, Default)]
pub(crate) struct ComputedBlocks {
    hits: Vec<Hit>,
    num_tokens: usize,
    /// For a model with linear attention, the cached state at the prefix's end (its key
    /// and slot): a prefix is usable only with one.
    state: Option<(u64, u32)>,
    /// The admission counts in the hit rate: the cache was looked up (prefix caching on,
    /// the request did not skip it) and the sequence is not a preempted one come back.
    in_hit_rate: bool,
}

impl ComputedBlocks {
    /// Whether the admission counts in the hit rate (a lookup counts unless told not to).
    pub(crate) fn counted(mut self, counted: bool) -> Self {
        self.in_hit_rate &= counted;
        self
    }

    /// The tokens the cached blocks hold: a whole number of blocks, never the last token.
    pub(crate) fn num_tokens(&self) -> usize {
        self.num_tokens
    }
}

/// The cached blocks found for one block of a prefix.
#[derive(Debug)]
struct Hit {
    /// The block in each group, `None` where the group does not need it (before a window).
    blocks: Vec<Option<BlockId>>,
    hashed: HashedBlock,
}

#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    enable_prefix_caching: bool,
    watermark_blocks: usize,
    group_windows: Vec<Option<usize>>,
    seqs: HashMap<SeqId, SeqBlocks>,
    stats: PrefixCacheStats,
    hasher: BlockHasher,
    /// Blocks registered in the prefix cache since `start_step`.
    registered: Vec<BlockId>,
    /// The swap pool's books; only refcounts and the free list are used, never its cache.
    cpu_pool: BlockPool<CpuBlockId>,
    /// Each swapped-out sequence's CPU blocks, in block-table order.
    cpu_tables: HashMap<SeqId, Vec<CpuBlockId>>,
    /// The linear-attention state slots: held by sequences, or keeping cached states.
    states: StatePool,
    /// The cached blocks' names in KV cache events, once they are asked for.
    kv_events: Option<ExternalHashes>,
}

impl KvCacheManager {
    pub fn new(cfg: KvCacheManagerConfig) -> Self {
        Self::with_hasher(cfg, default_block_hash)
    }

    /// With a given block hash, so tests can force collisions.
    pub(crate) fn with_hasher(cfg: KvCacheManagerConfig, hasher: BlockHasher) -> Self {
        assert!(cfg.block_size > 0, "block_size must be positive");
        assert!(!cfg.group_windows.is_empty(), "no KV cache group");
        let mut m = Self {
            pool: BlockPool::new(cfg.num_blocks, cfg.group_windows.len()),
            block_size: cfg.block_size,
            enable_prefix_caching: cfg.enable_prefix_caching,
            // Rounded down like vLLM's int(watermark * num_gpu_blocks).
            watermark_blocks: (cfg.watermark.max(0.0) * cfg.num_blocks as f32) as usize,
            group_windows: cfg.group_windows,
            seqs: HashMap::new(),
            stats: PrefixCacheStats::default(),
            hasher,
            registered: Vec::new(),
            cpu_pool: BlockPool::new(cfg.num_cpu_blocks, 1),
            cpu_tables: HashMap::new(),
            states: StatePool::new(cfg.num_state_slots),
            kv_events: None,
        };
        if m.keeps_states() {
            m.pool.log_removed();
        }
        m
    }

    /// Starts reporting what enters and leaves the prefix cache ([`Self::take_kv_events`]);
    /// without prefix caching nothing does.
    pub(crate) fn enable_kv_events(&mut self) {
        if self.enable_prefix_caching {
            self.pool.log_events();
            self.kv_events = Some(ExternalHashes::new(self.block_size));
        }
    }

    /// The prefix cache's changes since the last call, as vLLM's KV cache events.
    pub(crate) fn take_kv_events(&mut self) -> Vec<KvCacheEvent> {
        match &mut self.kv_events {
            Some(names) => names.events(self.pool.take_events()),
            None => Vec::new(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Each KV cache group's sliding window (`None`: full attention).
    pub fn group_windows(&self) -> &[Option<usize>] {
        &self.group_windows
    }

    /// Whether a sequence's blocks are all of one table with no block given back early, as
    /// swapping a sequence out and in again needs.
    pub(crate) fn can_swap(&self) -> bool {
        self.group_windows == [None] && self.states.num_slots() == 0
    }

    /// The first block of a group with `window` that a query at position `pos` (or later)
    /// reads: every block before it has left the window.
    fn first_needed_block(&self, window: Option<usize>, pos: usize) -> usize {
        first_needed_block(window, pos, self.block_size)
    }

    /// Prefix-cache lookup for a sequence about to start (or restart after preemption): the
    /// longest run of full blocks of `token_ids` already cached, never covering the last token
    /// (so there are logits to sample); none with prefix caching off. Takes no references:
    /// [`allocate_new_slots`](Self::allocate_new_slots), before anything else allocates,
    /// commits them.
    pub(crate) fn get_computed_blocks(&mut self, token_ids: &[u32]) -> ComputedBlocks {
        if !self.enable_prefix_caching {
            return ComputedBlocks::default();
        }
        let max_blocks = token_ids.len().saturating_sub(1) / self.block_size;
        let hits = self.find_cached(token_ids, max_blocks);
        let num_tokens = hits.len() * self.block_size;
        let state = hits.last().and_then(|h| self.cached_state(h.hashed));
        ComputedBlocks {
            hits,
            num_tokens,
            state,
            in_hit_rate: true,
        }
    }

    /// Admits `seq`, which holds no blocks: it takes the cached blocks `computed` found for
    /// its first `computed.num_tokens()` tokens and fresh ones for `num_new_tokens` more,
    /// if the watermark's worth of blocks stays free, and registers its full blocks as
    /// [`allocate_slots`](Self::allocate_slots) does. All or nothing: `None` changes
    /// nothing, whether blocks are short or a cached block was evicted since the lookup.
    pub(crate) fn allocate_new_slots(
        &mut self,
        seq: SeqId,
        token_ids: &[u32],
        computed: ComputedBlocks,
        num_new_tokens: usize,
    ) -> Option<()> {
        debug_assert!(
            self.block_table(seq).is_empty(),
            "{seq} already holds blocks"
        );
        let num_tokens = computed.num_tokens + num_new_tokens;
        let still_cached = computed.hits.iter().all(|hit| {
            self.pool.lookup(hit.hashed.hash).is_some_and(|c| {
                Some(c.id) == hit.hashed.entry
                    && (hit.blocks.iter().zip(&c.blocks)).all(|(h, c)| h.is_none() || h == c)
            })
        });
        if !still_cached {
            return None;
        }
        let required = num_tokens.div_ceil(self.block_size);
        let (in_hit_rate, num_hits) = (computed.in_hit_rate, computed.num_tokens);
        self.allocate_new(seq, computed.hits, required, computed.state)?;
        // Counted at admission, as vLLM does, so that a request waiting through several
        // steps' lookups counts once.
        if in_hit_rate {
            self.stats.queries += token_ids.len() as u64;
            self.stats.hits += num_hits as u64;
        }
        self.cache_full_blocks(seq, token_ids, num_tokens);
        self.plan_snapshot(seq, computed.num_tokens, num_tokens);
        Some(())
    }

    /// Ensures `seq` has blocks for `num_computed_tokens + num_new_tokens` tokens, and
    /// registers the full ones among them in the prefix cache ([`cache_full_blocks`]: the
    /// step being scheduled computes them). A block is only ever written by the one sequence
    /// that holds it: blocks are shared only through prefix-cache hits, which are full and
    /// never written again.
    ///
    /// [`cache_full_blocks`]: Self::cache_full_blocks
    ///
    /// A sequence without blocks (swapped in, or started with nothing cached) is admitted
    /// only if the watermark's worth of blocks stays free. All or nothing: `None` changes
    /// nothing but for the sliding-window blocks no query can read any more, which go back
    /// first either way. `token_ids` are all the sequence's known tokens, for hashing.
    pub(crate) fn allocate_slots(
        &mut self,
        seq: SeqId,
        token_ids: &[u32],
        num_computed_tokens: usize,
        num_new_tokens: usize,
    ) -> Option<()> {
        let num_tokens = num_computed_tokens + num_new_tokens;
        let required = num_tokens.div_ceil(self.block_size);
        if self.block_table(seq).is_empty() {
            debug_assert_eq!(
                num_computed_tokens, 0,
                "{seq}: cached blocks go through allocate_new_slots"
            );
            self.allocate_new(seq, Vec::new(), required, None)?;
        } else {
            self.free_skipped_blocks(seq, num_computed_tokens);
            let state = self.seqs.get_mut(&seq).expect("non-empty table");
            let more = required.saturating_sub(state.len());
            let mut fresh = self.pool.allocate(state.tables.len() * more)?.into_iter();
            for table in &mut state.tables {
                table.extend(fresh.by_ref().take(more));
            }
        }
        self.cache_full_blocks(seq, token_ids, num_tokens);
        self.plan_snapshot(seq, num_computed_tokens, num_tokens);
        Some(())
    }

    /// The cached state at the end of a prefix whose last block is `last`.
    fn cached_state(&self, last: HashedBlock) -> Option<(u64, u32)> {
        let key = last.entry?;
        Some((key, self.states.lookup(key)?))
    }

    /// For a model with linear attention and prefix caching: has `seq`'s step, which
    /// computes its tokens from `num_computed` to `num_tokens`, keep the state at the last
    /// block boundary it passes, under that block's cache entry, in place of the one it
    /// kept before. Skipped when no slot is spare: a later prompt then finds less.
    fn plan_snapshot(&mut self, seq: SeqId, num_computed: usize, num_tokens: usize) {
        if !self.keeps_states() {
            return;
        }
        // Blocks just handed out may have evicted the entries other states were kept under.
        self.drop_orphaned_states();
        let bs = self.block_size;
        let boundary = num_tokens / bs * bs;
        let Some(state) = self.seqs.get_mut(&seq) else {
            return;
        };
        let block = (boundary / bs)
            .checked_sub(1)
            .filter(|_| boundary > num_computed);
        let Some(key) = block.and_then(|b| state.hashed.get(b)?.entry) else {
            return;
        };
        if let Some(into) = self.states.snapshot(key, state.snapshot_key) {
            state.snapshot_key = Some(key);
            state.snapshot = Some(((boundary - num_computed) as u32, into));
        }
    }

    /// Gives back the blocks of `seq`'s sliding-window groups that no query from position
    /// `num_computed_tokens` on can read. Cached ones stay findable until evicted.
    fn free_skipped_blocks(&mut self, seq: SeqId, num_computed_tokens: usize) {
        let Some(state) = self.seqs.get_mut(&seq) else {
            return;
        };
        for (table, &w) in state.tables.iter_mut().zip(&self.group_windows) {
            let first = first_needed_block(w, num_computed_tokens, self.block_size);
            // Freed blocks are a prefix of the table: walk back to the last one.
            let first = first.min(table.len());
            for b in table[..first].iter_mut().rev() {
                if *b == BlockId::NULL {
                    break;
                }
                self.pool.free([*b]);
                *b = BlockId::NULL;
            }
        }
    }

    /// Gives `seq` its first tables: the cached blocks of `hits`, then fresh ones up to
    /// `required` blocks per group, and (with linear attention) a state slot, which takes
    /// the cached state `restore` (key, slot) at the hits' end before its step.
    fn allocate_new(
        &mut self,
        seq: SeqId,
        hits: Vec<Hit>,
        required: usize,
        restore: Option<(u64, u32)>,
    ) -> Option<()> {
        let held = || hits.iter().flat_map(|h| h.blocks.iter().flatten());
        let revived = held().filter(|&&b| self.pool.ref_count(b) == 0).count();
        let groups = self.group_windows.len();
        let fresh_needed = groups * required.saturating_sub(hits.len());
        let taken = revived + fresh_needed;
        if taken + self.watermark_blocks > self.pool.num_free() {
            return None;
        }
        // A model with linear attention runs a sequence only with a state slot, and
        // resumes a prefix only from the state at its end.
        debug_assert!(
            hits.is_empty() || self.states.num_slots() == 0 || restore.is_some(),
            "{seq}: a prefix hit without its state"
        );
        self.drop_orphaned_states();
        let state_slot = match self.states.num_slots() {
            0 => None,
            _ => Some(self.states.take(restore)?),
        };
        // Revive the hits before allocating, or allocation could evict them.
        for &b in held() {
            self.pool.touch(b);
        }
        let mut fresh = self
            .pool
            .allocate(fresh_needed)
            .expect("counted above")
            .into_iter();
        let tables = (0..groups)
            .map(|g| {
                let hit = hits.iter().map(|h| h.blocks[g].unwrap_or(BlockId::NULL));
                hit.chain(fresh.by_ref().take(required.saturating_sub(hits.len())))
                    .collect()
            })
            .collect();
        let state = self.seqs.entry(seq).or_default();
        state.tables = tables;
        state.hashed = hits.iter().map(|h| h.hashed).collect();
        state.state_slot = state_slot;
        state.restore_from = restore.map(|(_, slot)| slot);
        Some(())
    }

    /// The cached blocks for the longest prefix of `token_ids`' full blocks, at most
    /// `max_blocks`, that every group can resume from: a full-attention group needs all the
    /// prefix's blocks, a sliding-window group those inside the window of the prefix's next
    /// token. A hash hit counts only if the stored tokens and the parent entry match, so a
    /// hash collision can never serve another prefix's K/V: the chain of entries is checked
    /// from the first block, even in groups that no longer need the early blocks.
    fn find_cached(&self, token_ids: &[u32], max_blocks: usize) -> Vec<Hit> {
        if !self.enable_prefix_caching {
            return Vec::new();
        }
        let mut chain: Vec<(HashedBlock, &[Option<BlockId>])> = Vec::new();
        let mut parent: Option<HashedBlock> = None;
        for tokens in token_ids.chunks_exact(self.block_size).take(max_blocks) {
            let hash = (self.hasher)(parent.map(|p| p.hash), tokens);
            let Some(c) = self.pool.lookup(hash) else {
                break;
            };
            if *c.tokens != *tokens || c.parent != parent.and_then(|p| p.entry) {
                break;
            }
            let hashed = HashedBlock {
                hash,
                entry: Some(c.id),
            };
            chain.push((hashed, &c.blocks));
            parent = Some(hashed);
        }
        // The longest cut at which each group has every block it still reads.
        let bs = self.block_size;
        let mut cut = chain.len();
        for (g, &w) in self.group_windows.iter().enumerate() {
            if w.is_none() {
                cut = cut.min(chain.iter().take_while(|(_, b)| b[g].is_some()).count());
            }
        }
        let sliding: Vec<(usize, usize)> = (self.group_windows.iter().enumerate())
            .filter_map(|(g, w)| w.map(|w| (g, w)))
            .collect();
        // For each sliding group, the run of cached blocks ending at each block.
        let runs: Vec<Vec<usize>> = sliding
            .iter()
            .map(|&(g, _)| {
                let mut run = 0;
                chain[..cut]
                    .iter()
                    .map(|(_, b)| {
                        run = if b[g].is_some() { run + 1 } else { 0 };
                        run
                    })
                    .collect()
            })
            .collect();
        while cut > 0 {
            let reads_all = sliding.iter().zip(&runs).all(|(&(_, w), run)| {
                let first = self.first_needed_block(Some(w), cut * bs);
                run[cut - 1] >= cut - first.min(cut)
            });
            // A recurrent state cannot be rewound: only a boundary whose state is cached.
            let has_state =
                self.states.num_slots() == 0 || self.cached_state(chain[cut - 1].0).is_some();
            if reads_all && has_state {
                break;
            }
            cut -= 1;
        }
        let firsts: Vec<usize> = (self.group_windows.iter())
            .map(|&w| self.first_needed_block(w, cut * bs))
            .collect();
        chain[..cut]
            .iter()
            .enumerate()
            .map(|(i, (hashed, blocks))| Hit {
                blocks: (blocks.iter().zip(&firsts))
                    .map(|(b, &first)| b.filter(|_| i >= first))
                    .collect(),
                hashed: *hashed,
            })
            .collect()
    }

    /// Registers `seq`'s full blocks among its first `num_tokens` tokens in the prefix cache.
    /// Their K/V are complete, or will be once the step being scheduled runs: `allocate_slots`
    /// registers a step's blocks as it hands them out (vLLM v1's does too), so that a sequence
    /// scheduled after this one in the same step, such as a sibling of `n > 1` or another
    /// request with the same system prompt, already shares them; the model writes every
    /// sequence's K/V of a layer before any of them attends. Should that step fail,
    /// [`forget_step`](Self::forget_step) takes the registrations back. A block whose
    /// content is already cached in another block is left uncached: the first registration
    /// wins, as in vLLM.
    pub(crate) fn cache_full_blocks(&mut self, seq: SeqId, token_ids: &[u32], num_tokens: usize) {
        if !self.enable_prefix_caching {
            return;
        }
        let Some(state) = self.seqs.get_mut(&seq) else {
            return;
        };
        let bs = self.block_size;
        let num_full = (num_tokens.min(token_ids.len()) / bs).min(state.len());
        for i in state.hashed.len()..num_full {
            let tokens = &token_ids[i * bs..(i + 1) * bs];
            let parent = i.checked_sub(1).map(|p| state.hashed[p]);
            let parent_entry = parent.and_then(|p| p.entry);
            let hash = (self.hasher)(parent.map(|p| p.hash), tokens);
            let blocks = state.tables.iter().map(|t| t[i]);
            // Shared with the sequence that registered it (a prefix hit).
            let known = blocks
                .filter(|&b| b != BlockId::NULL)
                .find_map(|b| self.pool.cached(b));
            let cacheable = if let Some(c) = known {
                debug_assert!(*c.tokens == *tokens, "{seq}: block {i} holds other tokens");
                true
            } else if parent.is_some() && parent_entry.is_none() {
                // Its parent's content is unknown to the cache, so nothing could find it.
                false
            } else if let Some(c) = self.pool.lookup(hash) {
                *c.tokens == *tokens && c.parent == parent_entry
            } else {
                true
            };
            let mut entry = None;
            if cacheable {
                for (g, table) in state.tables.iter().enumerate() {
                    let b = table[i];
                    if b == BlockId::NULL {
                        continue;
                    }
                    entry = Some(match self.pool.cached(b) {
                        Some(c) => c.id,
                        None => {
                            let id = self.pool.register(b, g, hash, parent_entry, tokens);
                            if self.pool.cached(b).is_some() {
                                self.registered.push(b);
                            }
                            id
                        }
                    });
                }
            }
            state.hashed.push(HashedBlock { hash, entry });
        }
    }

    /// Starts a step's bookkeeping: the blocks registered and the states kept before it
    /// are computed.
    pub(crate) fn start_step(&mut self) {
        self.registered.clear();
        if self.states.num_slots() > 0 {
            self.states.start_step();
            self.drop_orphaned_states();
            for s in self.seqs.values_mut() {
                (s.restore_from, s.snapshot) = (None, None);
            }
        }
    }

    /// Frees the states kept at the ends of blocks that have left the prefix cache.
    fn drop_orphaned_states(&mut self) {
        self.states.forget(self.pool.take_removed());
    }

    /// Takes back the registrations made since `start_step`, for a step that failed: those
    /// blocks may never have been written. Free the step's sequences first (only they
    /// registered blocks in it); the blocks become plain free blocks.
    pub(crate) fn forget_step(&mut self) {
        for b in self.registered.drain(..) {
            self.pool.unregister(b);
        }
        self.states.forget_step();
    }

    /// Drops the sequence's references. Its blocks are freed tail first so that, among its
    /// cached blocks, the tail is evicted before the prefix more sequences are likely to share.
    pub fn free(&mut self, seq: SeqId) {
        if let Some(cpu) = self.cpu_tables.remove(&seq) {
            self.cpu_pool.free(cpu);
        }
        if let Some(state) = self.seqs.remove(&seq) {
            if let Some(slot) = state.state_slot {
                self.states.release(slot);
            }
            let blocks = (0..state.len())
                .rev()
                .flat_map(|i| state.tables.iter().map(move |t| t[i]));
            self.pool.free(blocks.filter(|&b| b != BlockId::NULL));
        }
    }

    /// Moves `seq`'s blocks holding its first `num_computed_tokens` tokens to the swap pool:
    /// returns the (device, CPU) copies to make before the device blocks are reused, and
    /// frees the device blocks (a block shared through the prefix cache only loses this
    /// sequence's reference). `None`, changing nothing, when swapping cannot keep the
    /// sequence whole: no swap pool or too little of it, nothing computed, or sliding-window
    /// groups (their early blocks are gone).
    pub(crate) fn swap_out(
        &mut self,
        seq: SeqId,
        num_computed_tokens: usize,
    ) -> Option<Vec<(BlockId, CpuBlockId)>> {
        if !self.can_swap() {
            return None;
        }
        let n = num_computed_tokens
            .div_ceil(self.block_size)
            .min(self.block_table(seq).len());
        if n == 0 {
            return None;
        }
        let cpu = self.cpu_pool.allocate(n)?;
        let table = self.block_table(seq);
        let copies = table.iter().copied().zip(cpu.iter().copied()).collect();
        self.free(seq);
        self.cpu_tables.insert(seq, cpu);
        Some(copies)
    }

    /// Brings a swapped-out `seq` back with fresh blocks for its first `num_tokens` tokens
    /// (those swapped out and this step's new ones): returns the (CPU, device) copies to
    /// make before the model runs (so the blocks may serve prefix hits at once), and frees
    /// its CPU blocks. `None`, changing nothing, when
    /// the device blocks are short.
    pub(crate) fn swap_in(
        &mut self,
        seq: SeqId,
        token_ids: &[u32],
        num_tokens: usize,
    ) -> Option<Vec<(CpuBlockId, BlockId)>> {
        debug_assert!(
            self.cpu_tables.contains_key(&seq),
            "{seq} is not swapped out"
        );
        let cpu = self.cpu_tables.remove(&seq)?;
        if self.allocate_slots(seq, token_ids, 0, num_tokens).is_none() {
            self.cpu_tables.insert(seq, cpu);
            return None;
        }
        let copies = cpu
            .iter()
            .copied()
            .zip(self.block_table(seq).iter().copied())
            .collect();
        self.cpu_pool.free(cpu);
        Some(copies)
    }

    pub fn num_cpu_blocks(&self) -> usize {
        self.cpu_pool.num_blocks()
    }

    /// Blocks of the swap pool not held by a swapped-out sequence.
    pub fn num_free_cpu_blocks(&self) -> usize {
        self.cpu_pool.num_free()
    }

    /// The first group's table; empty for an unknown sequence.
    pub(crate) fn block_table(&self, seq: SeqId) -> &[BlockId] {
        self.seqs
            .get(&seq)
            .and_then(|s| s.tables.first())
            .map_or(&[], |t| t)
    }

    /// Every group's table (none for an unknown sequence).
    pub fn block_tables(&self, seq: SeqId) -> &[Vec<BlockId>] {
        self.seqs.get(&seq).map_or(&[], |s| &s.tables)
    }

    /// `seq`'s linear-attention state slot (`None` without such layers, or before it runs).
    pub fn state_slot(&self, seq: SeqId) -> Option<u32> {
        self.seqs.get(&seq).and_then(|s| s.state_slot)
    }

    /// `seq`'s state slot and the copies of it the step being scheduled makes.
    pub(crate) fn state_step(&self, seq: SeqId) -> Option<StateStep> {
        let s = self.seqs.get(&seq)?;
        Some(StateStep {
            slot: s.state_slot?,
            restore_from: s.restore_from,
            snapshot: s.snapshot,
        })
    }

    /// Whether it keeps linear-attention states for prefix caching (at block boundaries).
    pub(crate) fn keeps_states(&self) -> bool {
        self.enable_prefix_caching && self.states.num_slots() > 0
    }

    /// Linear-attention state slots held by no sequence and no cached state.
    pub fn num_free_state_slots(&self) -> usize {
        self.states.num_free()
    }

    /// Blocks with no references, cached or not.
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Blocks handed out at least once (their memory is resident).
    pub(crate) fn num_blocks_ever_used(&self) -> usize {
        self.pool.num_ever_used()
    }

    /// Fraction of blocks in use.
    pub fn usage(&self) -> f32 {
        match self.num_blocks() {
            0 => 0.0,
            n => 1.0 - self.num_free_blocks() as f32 / n as f32,
        }
    }

    pub(crate) fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Forgets all cached blocks; only while no block is in use (false otherwise).
    #[cfg(test)]
    pub(crate) fn reset_prefix_cache(&mut self) -> bool {
        if !self.pool.reset_cache() {
            return false;
        }
        for s in self.seqs.values_mut() {
            s.hashed.clear();
        }
        true
    }

    /// References held on `block`: one per sequence whose table holds it.
    #[cfg(test)]
    pub(crate) fn ref_count(&self, block: BlockId) -> u32 {
        self.pool.ref_count(block)
    }
}

#[cfg(test)]
mod hit_rate;
mod state_pool;
#[cfg(test)]
mod state_slots;
#[cfg(test)]
pub(crate) mod tests;
