//! What the prefix cache's hit rate (`vllm:prefix_cache_hits_total` over
//! `vllm:prefix_cache_queries_total`) counts.

use super::tests::{admit, cached_tokens, mgr, prefill, toks};
use super::*;

/// The hit rate counts admissions, not lookups: a request that waits through several
/// steps' lookups counts once, one never admitted not at all, and a readmission after a
/// preemption not again (vLLM 0.32 keeps those apart, out of `vllm:prefix_cache_*`).
#[test]
fn the_hit_rate_counts_each_admission_once() {
    let mut m = mgr(8, 4);
    let t = toks(0..9);
    prefill(&mut m, 1, &t);
    for _ in 0..3 {
        assert_eq!(cached_tokens(&mut m, &t), 8);
    }
    let counted = PrefixCacheStats {
        queries: 9,
        hits: 0,
    };
    assert_eq!(m.prefix_cache_stats(), counted);
    admit(&mut m, 2, &t, 8, 1);
    let counted = PrefixCacheStats {
        queries: 18,
        hits: 8,
    };
    assert_eq!(m.prefix_cache_stats(), counted);
    // Readmitted after a preemption (the scheduler says so): not counted again.
    m.free(SeqId(2));
    let again = m.get_computed_blocks(&t).counted(false);
    m.allocate_new_slots(SeqId(3), &t, again, 1).expect("room");
    assert_eq!(m.prefix_cache_stats(), counted);
}

#[test]
fn prefix_caching_off_finds_nothing() {
    let mut m = KvCacheManager::new(KvCacheManagerConfig {
        enable_prefix_caching: false,
        ..KvCacheManagerConfig::new(8, 4)
    });
    let t = toks(0..9);
    prefill(&mut m, 1, &t);
    assert_eq!(cached_tokens(&mut m, &t), 0);
    assert_eq!(m.prefix_cache_stats(), PrefixCacheStats::default());
}
