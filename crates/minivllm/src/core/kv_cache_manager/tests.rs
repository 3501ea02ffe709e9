use super::*;

pub(crate) fn mgr(num_blocks: usize, block_size: usize) -> KvCacheManager {
    KvCacheManager::new(KvCacheManagerConfig {
        watermark: 0.0,
        ..KvCacheManagerConfig::new(num_blocks, block_size)
    })
}

pub(crate) fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

/// Admits `seq` with its cached prefix, computes all of `tokens`, and caches its blocks,
/// as the scheduler would over a prefill; returns the cached-token count it started from.
pub(crate) fn prefill(m: &mut KvCacheManager, seq: u64, tokens: &[u32]) -> usize {
    let computed = m.get_computed_blocks(tokens);
    let cached = computed.num_tokens();
    m.allocate_new_slots(SeqId(seq), tokens, computed, tokens.len() - cached)
        .expect("room");
    m.cache_full_blocks(SeqId(seq), tokens, tokens.len());
    cached
}

/// Admits `seq` for `new` tokens past the cached prefix a lookup finds, which must hold
/// `cached` tokens.
pub(crate) fn admit(m: &mut KvCacheManager, seq: u64, tokens: &[u32], cached: usize, new: usize) {
    let computed = m.get_computed_blocks(tokens);
    assert_eq!(computed.num_tokens(), cached);
    m.allocate_new_slots(SeqId(seq), tokens, computed, new)
        .expect("room");
}

/// The cached tokens a lookup finds, taking nothing.
pub(crate) fn cached_tokens(m: &mut KvCacheManager, tokens: &[u32]) -> usize {
    m.get_computed_blocks(tokens).num_tokens()
}

#[test]
fn allocates_whole_blocks_and_frees_them() {
    let mut m = mgr(8, 4);
    let t = toks(0..10);
    assert_eq!(m.allocate_slots(SeqId(1), &t, 0, 10), Some(()));
    assert_eq!(m.block_table(SeqId(1)).len(), 3);
    assert_eq!(m.num_free_blocks(), 5);
    assert_eq!(m.usage(), 3.0 / 8.0);
    // Decode steps fill the last block before taking another.
    assert_eq!(m.allocate_slots(SeqId(1), &t, 10, 2), Some(()));
    assert_eq!(m.block_table(SeqId(1)).len(), 3);
    assert_eq!(m.allocate_slots(SeqId(1), &t, 12, 1), Some(()));
    assert_eq!(m.block_table(SeqId(1)).len(), 4);
    m.free(SeqId(1));
    assert!(m.block_table(SeqId(1)).is_empty());
    assert_eq!(m.num_free_blocks(), 8);
}

#[test]
fn allocation_is_all_or_nothing() {
    let mut m = mgr(4, 4);
    let t = toks(0..20);
    assert_eq!(m.allocate_slots(SeqId(1), &t, 0, 12), Some(()));
    assert_eq!(m.allocate_slots(SeqId(1), &t, 12, 8), None);
    assert_eq!(m.block_table(SeqId(1)).len(), 3);
    assert_eq!(m.allocate_slots(SeqId(2), &t, 0, 8), None);
    assert!(m.block_table(SeqId(2)).is_empty());
    assert_eq!(m.num_free_blocks(), 1);
}

#[test]
fn second_sequence_reuses_a_shared_prefix() {
    let mut m = mgr(16, 16);
    let prefix = toks(1000..1040);
    let a: Vec<u32> = prefix.iter().copied().chain([1, 2, 3]).collect();
    let b: Vec<u32> = prefix.iter().copied().chain([7, 8]).collect();
    assert_eq!(prefill(&mut m, 1, &a), 0);
    admit(&mut m, 2, &b, 32, b.len() - 32);
    let (ta, tb) = (m.block_table(SeqId(1)), m.block_table(SeqId(2)));
    assert_eq!(ta[..2], tb[..2]);
    assert_ne!(ta[2], tb[2]);
    assert_eq!(m.ref_count(ta[0]), 2);
    assert_eq!(m.ref_count(ta[2]), 1);
    assert_eq!(
        m.prefix_cache_stats(),
        PrefixCacheStats {
            queries: (a.len() + b.len()) as u64,
            hits: 32
        }
    );
}

#[test]
fn the_last_token_is_always_recomputed() {
    let mut m = mgr(16, 16);
    let t = toks(0..48);
    prefill(&mut m, 1, &t);
    // floor((len - 1) / bs) blocks at most.
    assert_eq!(cached_tokens(&mut m, &t[..48]), 32);
    assert_eq!(cached_tokens(&mut m, &t[..33]), 32);
    assert_eq!(cached_tokens(&mut m, &t[..32]), 16);
    assert_eq!(cached_tokens(&mut m, &t[..17]), 16);
    assert_eq!(cached_tokens(&mut m, &t[..16]), 0);
    assert_eq!(cached_tokens(&mut m, &[]), 0);
}

#[test]
fn a_hit_on_a_freed_block_revives_it_from_the_free_queue() {
    let mut m = mgr(4, 4);
    let t = toks(0..9);
    prefill(&mut m, 1, &t);
    let cached = m.block_table(SeqId(1))[..2].to_vec();
    m.free(SeqId(1));
    assert_eq!(m.num_free_blocks(), 4);
    assert_eq!(prefill(&mut m, 2, &t), 8);
    assert_eq!(m.block_table(SeqId(2))[..2], cached);
    assert_eq!(m.num_free_blocks(), 1);
    m.free(SeqId(2));
    assert_eq!(m.num_free_blocks(), 4);
}

#[test]
fn a_prefix_evicted_between_lookup_and_allocation_is_refused() {
    let mut m = mgr(4, 4);
    let t = toks(0..9);
    prefill(&mut m, 1, &t);
    m.free(SeqId(1));
    let stale = m.get_computed_blocks(&t);
    assert_eq!(stale.num_tokens(), 8);
    // Takes the free uncached blocks, then the second cached block (the tail goes first).
    m.allocate_slots(SeqId(2), &toks(100..112), 0, 12).unwrap();
    m.free(SeqId(2));
    // The lookup's second block was evicted since: the admission takes nothing.
    assert_eq!(m.allocate_new_slots(SeqId(3), &t, stale, 1), None);
    assert!(m.block_table(SeqId(3)).is_empty());
    assert_eq!(m.num_free_blocks(), 4);
    assert_eq!(cached_tokens(&mut m, &t), 4);
}

#[test]
fn blocks_registered_while_scheduling_serve_a_sibling_in_the_same_step() {
    let mut m = mgr(8, 4);
    let t = toks(0..10);
    // The first sequence is scheduled for its whole prompt; allocating registers its two
    // full blocks before the step runs.
    assert_eq!(m.allocate_slots(SeqId(1), &t, 0, 10), Some(()));
    // Its sibling, scheduled next in that step, takes them and computes only its tail.
    admit(&mut m, 2, &t, 8, 2);
    let (a, b) = (m.block_table(SeqId(1)), m.block_table(SeqId(2)));
    assert_eq!(a[..2], b[..2]);
    assert_ne!(a[2], b[2]);
    assert_eq!(m.ref_count(a[0]), 2);
    assert_eq!(m.num_free_blocks(), 4);
}

#[test]
fn a_failed_step_takes_its_registrations_back() {
    let mut m = mgr(8, 4);
    let t = toks(0..8);
    prefill(&mut m, 1, &t);
    m.start_step();
    let longer = toks(0..13);
    admit(&mut m, 2, &longer, 8, 5);
    assert_eq!(cached_tokens(&mut m, &toks(0..14)), 12);
    // The step fails: its sequence goes, and its block is no longer a hit, while the
    // blocks computed before the step still are.
    m.free(SeqId(2));
    m.forget_step();
    assert_eq!(cached_tokens(&mut m, &toks(0..14)), 8);
    assert_eq!(m.pool.num_cached(), 2);
    m.free(SeqId(1));
    assert_eq!(m.num_free_blocks(), 8);
}

#[test]
fn eviction_takes_the_least_recently_freed_and_forgets_it() {
    let mut m = mgr(5, 2);
    let prompts: Vec<[u32; 3]> = (0..4u32).map(|s| [s * 10, s * 10 + 1, 7]).collect();
    for (s, t) in prompts.iter().enumerate() {
        prefill(&mut m, s as u64, t);
        m.free(SeqId(s as u64));
    }
    let found = |m: &mut KvCacheManager| -> Vec<usize> {
        prompts.iter().map(|t| cached_tokens(m, t)).collect()
    };
    assert_eq!(found(&mut m), [2, 2, 2, 2]);
    // The free uncached block goes first, then cached ones in the order they were freed.
    m.allocate_slots(SeqId(9), &[500], 0, 1).unwrap();
    assert_eq!(found(&mut m), [2, 2, 2, 2]);
    m.allocate_slots(SeqId(9), &[500, 501, 502], 1, 2).unwrap();
    assert_eq!(found(&mut m), [0, 2, 2, 2]);
    m.allocate_slots(SeqId(9), &[500, 501, 502, 503, 504], 3, 2)
        .unwrap();
    assert_eq!(found(&mut m), [0, 0, 2, 2]);
}

#[test]
fn a_freed_sequence_loses_its_tail_blocks_first() {
    let mut m = mgr(4, 2);
    let t = toks(0..7);
    prefill(&mut m, 1, &t);
    m.free(SeqId(1));
    assert_eq!(cached_tokens(&mut m, &t), 6);
    m.allocate_slots(SeqId(2), &[900], 0, 1).unwrap();
    assert_eq!(cached_tokens(&mut m, &t), 6);
    m.allocate_slots(SeqId(2), &[900, 901, 902], 1, 2).unwrap();
    assert_eq!(cached_tokens(&mut m, &t), 4);
}

#[test]
fn a_duplicate_block_is_not_cached_again() {
    let mut m = mgr(8, 4);
    let t = toks(0..9);
    // Both compute the same prompt before either caches it.
    m.allocate_slots(SeqId(1), &t, 0, 9).unwrap();
    m.allocate_slots(SeqId(2), &t, 0, 9).unwrap();
    m.cache_full_blocks(SeqId(1), &t, 9);
    m.cache_full_blocks(SeqId(2), &t, 9);
    let first = m.block_table(SeqId(1))[..2].to_vec();
    m.free(SeqId(2));
    m.free(SeqId(1));
    assert_eq!(prefill(&mut m, 3, &t), 8);
    assert_eq!(m.block_table(SeqId(3))[..2], first);
}

#[test]
fn a_block_after_a_duplicate_is_still_cached_under_the_same_chain() {
    let mut m = mgr(8, 4);
    let short = toks(0..5);
    let long = toks(0..13);
    m.allocate_slots(SeqId(1), &short, 0, 5).unwrap();
    m.allocate_slots(SeqId(2), &long, 0, 13).unwrap();
    m.cache_full_blocks(SeqId(1), &short, 5);
    m.cache_full_blocks(SeqId(2), &long, 13);
    // Block 0 comes from seq 1, blocks 1 and 2 from seq 2.
    assert_eq!(cached_tokens(&mut m, &long), 12);
}

/// A full-attention group and a sliding one of 8 positions, blocks of 4.
fn hybrid(num_blocks: usize) -> KvCacheManager {
    KvCacheManager::new(KvCacheManagerConfig {
        watermark: 0.0,
        group_windows: vec![None, Some(8)],
        ..KvCacheManagerConfig::new(num_blocks, 4)
    })
}

fn held(m: &KvCacheManager, seq: u64) -> Vec<usize> {
    let tables = m.block_tables(SeqId(seq));
    tables
        .iter()
        .map(|t| t.iter().filter(|&&b| b != BlockId::NULL).count())
        .collect()
}

#[test]
fn a_sliding_group_gives_back_the_blocks_behind_its_window() {
    let mut m = hybrid(64);
    let t = toks(0..200);
    m.allocate_slots(SeqId(1), &t, 0, 20).unwrap();
    // The whole prompt is computed in one step: every block is needed during it.
    assert_eq!(held(&m, 1), [5, 5]);
    assert_eq!(m.num_free_blocks(), 54);
    // The query at position 20 sees 13..=20: blocks 0-2 are behind it.
    m.allocate_slots(SeqId(1), &t, 20, 1).unwrap();
    assert_eq!(held(&m, 1), [6, 3]);
    assert_eq!(m.block_tables(SeqId(1))[1][..3], [BlockId::NULL; 3]);
    assert_eq!(m.num_free_blocks(), 55);
    for pos in 21..150 {
        m.allocate_slots(SeqId(1), &t, pos, 1).unwrap();
        let [full, sliding] = held(&m, 1)[..] else {
            unreachable!()
        };
        assert_eq!(full, (pos + 1).div_ceil(4));
        assert!(sliding <= 3, "{sliding} sliding blocks at {pos}");
    }
    // The long sequence holds its full group's blocks and three more.
    assert_eq!(m.num_free_blocks(), 64 - 38 - 3);
    m.free(SeqId(1));
    assert_eq!(m.num_free_blocks(), 64);
}

#[test]
fn a_prefix_hit_takes_only_the_window_of_a_sliding_group() {
    let mut m = hybrid(64);
    let t = toks(0..41);
    assert_eq!(prefill(&mut m, 1, &t), 0);
    m.free(SeqId(1));
    admit(&mut m, 2, &t, 40, 1);
    let tables = m.block_tables(SeqId(2));
    // The next query (position 40) sees 33..=40: blocks 8 to 10 of the sliding group.
    assert!(tables[0].iter().all(|&b| b != BlockId::NULL));
    assert_eq!(tables[1][..8], [BlockId::NULL; 8]);
    assert_eq!(tables[0][..10], m.block_tables(SeqId(2))[0][..10]);
    assert_eq!(held(&m, 2), [11, 3]);
    // 10 + 2 revived, one fresh block per group for the last token.
    assert_eq!(m.num_free_blocks(), 64 - 14);
}

#[test]
fn a_prefix_hit_stops_where_a_sliding_group_lost_its_window() {
    let mut m = hybrid(22);
    let t = toks(0..41);
    prefill(&mut m, 1, &t);
    // Decode on: the sliding group gives its early blocks back, still cached.
    let mut long = t.clone();
    long.push(41);
    m.allocate_slots(SeqId(1), &long, 41, 1).unwrap();
    m.cache_full_blocks(SeqId(1), &long, 42);
    assert_eq!(held(&m, 1), [11, 3]);
    // A newcomer takes every free block: the early sliding blocks are evicted.
    let free = m.num_free_blocks();
    m.allocate_slots(SeqId(9), &toks(500..500 + 2 * free as u32), 0, 2 * free)
        .unwrap();
    m.free(SeqId(9));
    // The full group still has every block, the sliding one only blocks 8-10: a prompt
    // may resume at 40 (window 8-9) but no earlier cut has its window.
    assert_eq!(cached_tokens(&mut m, &long), 40);
    assert_eq!(cached_tokens(&mut m, &t[..37]), 0);
}

fn constant_hash(_: Option<u64>, _: &[u32]) -> u64 {
    7
}

#[test]
fn a_hash_collision_is_never_a_hit() {
    let mut m = KvCacheManager::with_hasher(KvCacheManagerConfig::new(8, 4), constant_hash);
    prefill(&mut m, 1, &toks(0..5));
    assert_eq!(cached_tokens(&mut m, &toks(0..5)), 4);
    assert_eq!(cached_tokens(&mut m, &toks(10..15)), 0);
    // The colliding block stays uncached rather than replacing the first.
    prefill(&mut m, 2, &toks(10..15));
    assert_eq!(cached_tokens(&mut m, &toks(10..15)), 0);
    assert_eq!(cached_tokens(&mut m, &toks(0..5)), 4);
}

/// Hashes only the block position, so every first block collides, as does every second.
fn position_hash(parent: Option<u64>, _: &[u32]) -> u64 {
    parent.map_or(0, |p| p + 1)
}

#[test]
fn a_child_of_a_colliding_block_is_not_cached() {
    let mut m = KvCacheManager::with_hasher(KvCacheManagerConfig::new(8, 4), position_hash);
    let a: Vec<u32> = [1, 1, 1, 1, 5, 5, 5, 5, 0].into();
    let b: Vec<u32> = [2, 2, 2, 2, 5, 5, 5, 5, 0].into();
    prefill(&mut m, 1, &a[..5]);
    prefill(&mut m, 2, &b);
    assert_eq!(cached_tokens(&mut m, &a), 4);
    assert_eq!(cached_tokens(&mut m, &b), 0);
}

#[test]
fn a_parent_replaced_under_the_same_hash_does_not_vouch_for_old_children() {
    let mut m = mgr(8, 4);
    m.hasher = position_hash;
    let a: Vec<u32> = [1, 1, 1, 1, 5, 5, 5, 5, 0].into();
    let b: Vec<u32> = [2, 2, 2, 2, 5, 5, 5, 5, 0].into();
    // Seq 1 caches b's first block; seq 2, computed alongside, caches b's second block as
    // its child. Seq 1's block is then evicted while seq 2 keeps running.
    m.allocate_slots(SeqId(1), &b[..5], 0, 5).unwrap();
    m.allocate_slots(SeqId(2), &b, 0, 9).unwrap();
    m.free(SeqId(1));
    // The evicting sequence's blocks hash apart from a's and b's (allocating registers
    // them).
    m.hasher = default_block_hash;
    m.allocate_slots(SeqId(99), &toks(0..20), 0, 20).unwrap();
    m.free(SeqId(99));
    m.hasher = position_hash;
    // a's first block takes the freed hash; b's second block has a's second block's
    // tokens and hash, but was computed after other tokens.
    assert_eq!(prefill(&mut m, 3, &a), 0);
    assert_eq!(cached_tokens(&mut m, &a), 4);
}

#[test]
fn the_watermark_holds_back_new_sequences_only() {
    let mut m = KvCacheManager::new(KvCacheManagerConfig {
        watermark: 0.25,
        ..KvCacheManagerConfig::new(8, 4)
    });
    let t = toks(0..40);
    // 8 blocks, 2 kept free: a new 7-block sequence is refused, 6 are admitted.
    assert_eq!(m.allocate_slots(SeqId(1), &t, 0, 25), None);
    assert_eq!(m.allocate_slots(SeqId(1), &t, 0, 24), Some(()));
    assert_eq!(m.allocate_slots(SeqId(2), &t, 0, 1), None);
    // A running sequence may use the reserve.
    assert_eq!(m.allocate_slots(SeqId(1), &t, 24, 8), Some(()));
    assert_eq!(m.num_free_blocks(), 0);
}

#[test]
fn the_watermark_counts_revived_cached_blocks() {
    let mut m = KvCacheManager::new(KvCacheManagerConfig {
        watermark: 0.25,
        ..KvCacheManagerConfig::new(8, 4)
    });
    let t = toks(0..21);
    prefill(&mut m, 1, &t);
    m.free(SeqId(1));
    // 5 cached blocks to revive and 1 fresh leaves 2 free: admitted.
    admit(&mut m, 2, &t, 20, 1);
    assert_eq!(m.num_free_blocks(), 2);
}

#[test]
fn reset_prefix_cache_only_when_idle() {
    let mut m = mgr(8, 4);
    let t = toks(0..9);
    prefill(&mut m, 1, &t);
    assert!(!m.reset_prefix_cache());
    m.free(SeqId(1));
    assert_eq!(cached_tokens(&mut m, &t), 8);
    assert!(m.reset_prefix_cache());
    assert_eq!(cached_tokens(&mut m, &t), 0);
}

mod props {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[derive(Debug, Clone)]
    enum Op {
        Add(Vec<u32>),
        Append(usize, Vec<u32>),
        Free(usize),
        Cache(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        // A three-token vocabulary, so prompts share prefixes and blocks repeat.
        let tokens = |max| prop::collection::vec(0u32..3, 1..max);
        prop_oneof![
            3 => tokens(20).prop_map(Op::Add),
            4 => (any::<usize>(), tokens(6)).prop_map(|(i, t)| Op::Append(i, t)),
            2 => any::<usize>().prop_map(Op::Free),
            3 => any::<usize>().prop_map(Op::Cache),
        ]
    }

    /// Collides constantly, so only the stored-token and parent checks keep hits right.
    fn weak_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
        (parent.unwrap_or(7) + tokens.iter().map(|&t| t as u64).sum::<u64>()) % 5
    }

    struct Seq {
        id: SeqId,
        tokens: Vec<u32>,
        computed: usize,
    }

    /// The scheduler's side: live sequences, and what each block's K/V were computed
    /// from (the writing sequence's tokens up to the block's last written position).
    #[derive(Default)]
    struct Model {
        seqs: Vec<Seq>,
        kv: HashMap<BlockId, Vec<u32>>,
        next_id: u64,
    }

    impl Model {
        fn pick(&self, i: usize) -> Option<usize> {
            (!self.seqs.is_empty()).then(|| i % self.seqs.len())
        }

        fn new_id(&mut self) -> SeqId {
            self.next_id += 1;
            SeqId(self.next_id)
        }

        /// Runs the model over positions `from..to` of sequence `s`, in every group.
        fn write(&mut self, m: &KvCacheManager, s: usize, from: usize, to: usize) {
            let bs = m.block_size();
            let seq = &self.seqs[s];
            for table in m.block_tables(seq.id) {
                let written = table
                    .iter()
                    .enumerate()
                    .take(to.div_ceil(bs))
                    .skip(from / bs);
                for (j, &b) in written {
                    assert_ne!(b, BlockId::NULL, "{} writes a freed block", seq.id);
                    assert_eq!(m.ref_count(b), 1, "{} writes a shared {b}", seq.id);
                    let end = ((j + 1) * bs).min(to);
                    self.kv.insert(b, seq.tokens[..end].to_vec());
                }
            }
        }
    }

    fn apply(m: &mut KvCacheManager, model: &mut Model, op: Op) {
        let bs = m.block_size();
        match op {
            Op::Add(tokens) => {
                let id = model.new_id();
                let free = m.num_free_blocks();
                let blocks = m.get_computed_blocks(&tokens);
                let computed = blocks.num_tokens();
                assert!(computed.is_multiple_of(bs));
                assert!(computed <= (tokens.len() - 1) / bs * bs);
                let new = tokens.len() - computed;
                if m.allocate_new_slots(id, &tokens, blocks, new).is_none() {
                    assert!(m.block_table(id).is_empty());
                    assert_eq!(m.num_free_blocks(), free);
                    return;
                }
                for (g, table) in m.block_tables(id).iter().enumerate() {
                    assert_eq!(table.len(), tokens.len().div_ceil(bs));
                    let first = m.first_needed_block(m.group_windows()[g], computed);
                    for (j, b) in table[..computed / bs].iter().enumerate() {
                        if j < first {
                            assert_eq!(*b, BlockId::NULL, "a hit before the window");
                            continue;
                        }
                        assert_eq!(model.kv[b], tokens[..(j + 1) * bs], "false hit on {b}");
                    }
                }
                model.seqs.push(Seq {
                    id,
                    tokens,
                    computed,
                });
                let s = model.seqs.len() - 1;
                let len = model.seqs[s].tokens.len();
                model.write(m, s, computed, len);
                model.seqs[s].computed = len;
            }
            Op::Append(i, new) => {
                let Some(s) = model.pick(i) else { return };
                let seq = &model.seqs[s];
                let before = m.block_tables(seq.id).to_vec();
                let tokens: Vec<u32> = seq.tokens.iter().chain(&new).copied().collect();
                if m.allocate_slots(seq.id, &tokens, seq.computed, new.len())
                    .is_none()
                {
                    // Only blocks behind a window may have gone back.
                    for (g, (now, was)) in m.block_tables(seq.id).iter().zip(&before).enumerate() {
                        let first = m.first_needed_block(m.group_windows()[g], seq.computed);
                        assert_eq!(now[first..], was[first..]);
                    }
                    return;
                };
                let after = m.block_tables(seq.id);
                for (g, table) in after.iter().enumerate() {
                    assert_eq!(table.len(), tokens.len().div_ceil(bs));
                    // What no later query reads is back in the pool.
                    let first = m.first_needed_block(m.group_windows()[g], seq.computed);
                    assert!(table[..first].iter().all(|&b| b == BlockId::NULL));
                }
                for (now, was) in after.iter().zip(&before) {
                    // Blocks stay put: nothing is copied, only appended.
                    let kept = was.len().min(now.len());
                    let moved = (0..kept).find(|&j| was[j] != now[j] && now[j] != BlockId::NULL);
                    assert_eq!(moved, None);
                }
                let from = seq.computed;
                model.seqs[s].tokens = tokens;
                model.write(m, s, from, from + new.len());
                model.seqs[s].computed += new.len();
            }
            Op::Free(i) => {
                let Some(s) = model.pick(i) else { return };
                m.free(model.seqs.swap_remove(s).id);
            }
            Op::Cache(i) => {
                let Some(s) = model.pick(i) else { return };
                let seq = &model.seqs[s];
                m.cache_full_blocks(seq.id, &seq.tokens, seq.computed);
            }
        }
    }

    fn check(m: &KvCacheManager, model: &Model) {
        let bs = m.block_size();
        let mut refs: HashMap<BlockId, u32> = HashMap::new();
        for seq in &model.seqs {
            let tables = m.block_tables(seq.id);
            assert_eq!(tables.len(), m.group_windows().len());
            for (g, table) in tables.iter().enumerate() {
                assert_eq!(table.len(), seq.computed.div_ceil(bs));
                let first = m.first_needed_block(m.group_windows()[g], seq.computed);
                for (j, b) in table.iter().enumerate() {
                    if *b == BlockId::NULL {
                        assert!(j < first, "{} lost block {j} of group {g}", seq.id);
                        continue;
                    }
                    *refs.entry(*b).or_default() += 1;
                    // Every computed position holds this sequence's own K/V.
                    if j * bs < seq.computed {
                        let end = ((j + 1) * bs).min(seq.computed);
                        assert_eq!(model.kv[b][..end], seq.tokens[..end], "{} {b}", seq.id);
                    }
                }
            }
        }
        let free = m.pool.free_queue();
        assert_eq!(free.len(), m.num_free_blocks());
        assert_eq!(free.iter().collect::<HashSet<_>>().len(), free.len());
        assert_eq!(m.num_free_blocks() + refs.len(), m.num_blocks());
        let mut num_cached = 0;
        for i in 0..m.num_blocks() as u32 {
            let b = BlockId(i);
            let held = refs.get(&b).copied().unwrap_or(0);
            assert_eq!(m.ref_count(b), held, "{b}");
            assert_eq!(held == 0, free.contains(&b), "{b}");
            num_cached += usize::from(m.pool.cached(b).is_some());
        }
        assert_eq!(num_cached, m.pool.num_cached());
        let by_id: HashMap<u64, BlockId> = m
            .pool
            .cache_index()
            .map(|(_, _, b)| (m.pool.cached(b).unwrap().id, b))
            .collect();
        for (hash, g, b) in m.pool.cache_index() {
            let c = m.pool.cached(b).expect("indexed blocks are cached");
            assert_eq!(c.hash, hash);
            assert_eq!(c.blocks[g], Some(b));
            let kv = &model.kv[&b];
            assert!(kv.len().is_multiple_of(bs) && !kv.is_empty());
            assert_eq!(*c.tokens, kv[kv.len() - bs..], "{b} holds other tokens");
            match c.parent {
                None => assert_eq!(kv.len(), bs),
                Some(p) => {
                    if let Some(pb) = by_id.get(&p) {
                        assert_eq!(model.kv[pb], kv[..kv.len() - bs], "{b}'s parent");
                    }
                }
            }
        }
        let stats = m.prefix_cache_stats();
        assert!(stats.hits <= stats.queries);
    }

    proptest! {
        #[test]
        fn random_workloads_keep_the_books_straight(
            num_blocks in 4usize..24,
            block_size in prop::sample::select(vec![1usize, 2, 4]),
            enable_prefix_caching in prop::bool::weighted(0.8),
            watermark in prop::sample::select(vec![0.0f32, 0.1]),
            group_windows in prop::sample::select(vec![
                vec![None],
                vec![None, Some(3)],
                vec![Some(5)],
                vec![None, Some(2), Some(2)],
            ]),
            weak in any::<bool>(),
            ops in prop::collection::vec(op(), 1..60),
        ) {
            let cfg = KvCacheManagerConfig {
                num_blocks,
                block_size,
                enable_prefix_caching,
                watermark,
                group_windows,
                num_cpu_blocks: 0,
                num_state_slots: 0,
            };
            let mut m = if weak {
                KvCacheManager::with_hasher(cfg, weak_hash)
            } else {
                KvCacheManager::new(cfg)
            };
            let mut model = Model::default();
            for op in ops {
                apply(&mut m, &mut model, op);
                check(&m, &model);
            }
            for seq in model.seqs.drain(..) {
                m.free(seq.id);
            }
            check(&m, &model);
            prop_assert_eq!(m.num_free_blocks(), m.num_blocks());
            prop_assert!(m.reset_prefix_cache());
            prop_assert_eq!(m.pool.num_cached(), 0);
        }
    }
}
