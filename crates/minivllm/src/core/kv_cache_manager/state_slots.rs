//! The linear-attention state slots the KV cache manager hands out beside the blocks.

use super::*;

fn admit(m: &mut KvCacheManager, seq: u64, tokens: &[u32]) -> Option<()> {
    let computed = m.get_computed_blocks(tokens);
    m.allocate_new_slots(SeqId(seq), tokens, computed, tokens.len())
}

/// With linear-attention layers a sequence runs only with a state slot: admission waits
/// for one (taking nothing else), a sequence keeps its slot as it grows, and freeing it
/// (finish or preemption) gives the slot back.
#[test]
fn a_sequence_holds_a_state_slot_from_admission_to_its_end() {
    let mut m = KvCacheManager::new(KvCacheManagerConfig {
        watermark: 0.0,
        enable_prefix_caching: false,
        num_state_slots: 2,
        ..KvCacheManagerConfig::new(16, 4)
    });
    assert!(!m.can_swap(), "a state is not swapped out with the blocks");
    admit(&mut m, 1, &toks(0..5)).expect("room");
    admit(&mut m, 2, &toks(10..15)).expect("room");
    assert_eq!(
        (m.state_slot(SeqId(1)), m.state_slot(SeqId(2))),
        (Some(0), Some(1))
    );
    assert_eq!(m.num_free_state_slots(), 0);
    // A third waits, though blocks are free, and takes no block while it waits.
    let free = m.num_free_blocks();
    let t = toks(20..25);
    assert!(admit(&mut m, 3, &t).is_none());
    assert_eq!((m.num_free_blocks(), m.state_slot(SeqId(3))), (free, None));
    // Growing keeps the slot.
    m.allocate_slots(SeqId(1), &toks(0..9), 5, 4).expect("room");
    assert_eq!(m.state_slot(SeqId(1)), Some(0));
    m.free(SeqId(1));
    assert_eq!(
        (m.num_free_state_slots(), m.state_slot(SeqId(1))),
        (1, None)
    );
    admit(&mut m, 3, &t).expect("room");
    assert_eq!(m.state_slot(SeqId(3)), Some(0));
    // Without linear attention there are no slots to take.
    let mut plain = KvCacheManager::new(KvCacheManagerConfig::new(16, 4));
    admit(&mut plain, 1, &toks(0..5)).expect("room");
    assert_eq!(plain.state_slot(SeqId(1)), None);
}

fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}
