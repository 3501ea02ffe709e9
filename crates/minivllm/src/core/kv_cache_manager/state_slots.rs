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

fn with_prefix_caching(num_state_slots: usize) -> KvCacheManager {
    KvCacheManager::new(KvCacheManagerConfig {
        watermark: 0.0,
        num_state_slots,
        ..KvCacheManagerConfig::new(32, 4)
    })
}

/// A step that passes block boundaries keeps the state at the last of them, found from
/// the next step on: a later prompt with that prefix resumes there (its blocks and the
/// state), and one whose prefix has cached blocks but no state starts from nothing.
#[test]
fn a_prompt_resumes_from_the_state_kept_at_a_block_boundary() {
    let mut m = with_prefix_caching(4);
    m.start_step();
    let first = toks(0..10);
    admit(&mut m, 1, &first).expect("room");
    // Tokens 0..10 pass boundaries 4 and 8: the state after 8 goes to a free slot.
    let kept = StateStep {
        snapshot: Some((8, 1)),
        ..StateStep::in_slot(0)
    };
    assert_eq!(m.state_step(SeqId(1)), Some(kept));
    // Within the step it is not there yet: the step writes it.
    let longer = [&first[..], &toks(50..53)].concat();
    assert_eq!(m.get_computed_blocks(&longer).num_tokens(), 0);
    m.start_step();
    assert_eq!(m.state_step(SeqId(1)), Some(StateStep::in_slot(0)));
    let computed = m.get_computed_blocks(&longer);
    assert_eq!(computed.num_tokens(), 8);
    m.allocate_new_slots(SeqId(2), &longer, computed, longer.len() - 8)
        .expect("room");
    let resumed = StateStep {
        restore_from: Some(1),
        // Its own step passes boundary 12 (tokens 8..13).
        snapshot: Some((4, 3)),
        ..StateStep::in_slot(2)
    };
    assert_eq!(m.state_step(SeqId(2)), Some(resumed));
    // A prompt sharing only the first block: its K/V are cached, its state is not.
    let other = [&first[..4], &toks(70..80)].concat();
    assert_eq!(m.get_computed_blocks(&other).num_tokens(), 0);
}

/// A sequence keeps only its latest boundary's state (the one before goes back once the
/// step that replaces it has run), its last one outlives it, and a failed step's states
/// are never found.
#[test]
fn a_sequence_keeps_only_its_latest_state() {
    let mut m = with_prefix_caching(4);
    m.start_step();
    let mut tokens = toks(0..5);
    admit(&mut m, 1, &tokens).expect("room");
    m.start_step();
    assert_eq!(m.num_free_state_slots(), 2);
    // Decode to position 8: the state after token 7 replaces the one after token 3.
    for t in 5..8 {
        tokens.push(100 + t);
        m.allocate_slots(SeqId(1), &tokens, t as usize, 1)
            .expect("room");
        let passes = t == 7;
        assert_eq!(m.state_step(SeqId(1)).unwrap().snapshot.is_some(), passes);
        m.start_step();
    }
    assert_eq!(m.num_free_state_slots(), 2, "one held, one kept");
    m.free(SeqId(1));
    assert_eq!(m.num_free_state_slots(), 3, "its last state stays");
    let next = [&tokens[..], &toks(200..203)].concat();
    assert_eq!(m.get_computed_blocks(&next).num_tokens(), 8);
    assert_eq!(m.get_computed_blocks(&tokens[..7]).num_tokens(), 0);
    // A failed step's state is dropped with its slot.
    let mut m = with_prefix_caching(4);
    m.start_step();
    admit(&mut m, 1, &toks(0..9)).expect("room");
    m.free(SeqId(1));
    m.forget_step();
    m.start_step();
    assert_eq!(m.num_free_state_slots(), 4);
    assert_eq!(m.get_computed_blocks(&toks(0..12)).num_tokens(), 0);
}

/// Cached states give way to running sequences, least recently used first, but never one
/// that a sequence of the same step restores from.
#[test]
fn cached_states_give_way_to_running_sequences() {
    let mut m = with_prefix_caching(3);
    m.start_step();
    // Two finished prompts leave their states at boundary 4.
    for (seq, start) in [(1, 0), (2, 100)] {
        admit(&mut m, seq, &toks(start..start + 6)).expect("room");
        m.start_step();
        m.free(SeqId(seq));
    }
    assert_eq!(m.num_free_state_slots(), 1);
    let again = toks(100..107);
    let computed = m.get_computed_blocks(&again);
    assert_eq!(computed.num_tokens(), 4);
    m.allocate_new_slots(SeqId(3), &again, computed, 3)
        .expect("room");
    let step = m.state_step(SeqId(3)).unwrap();
    assert_eq!((step.slot, step.restore_from), (0, Some(2)));
    // A newcomer takes the least recently used state's slot: the first prompt's.
    admit(&mut m, 4, &toks(300..306)).expect("room");
    assert_eq!(m.state_slot(SeqId(4)), Some(1));
    assert_eq!(m.get_computed_blocks(&toks(0..6)).num_tokens(), 0);
    // No slot left: the next waits rather than evict the state being restored.
    assert!(admit(&mut m, 5, &toks(400..406)).is_none());
    m.start_step();
    admit(&mut m, 5, &toks(400..406)).expect("the restored state may go now");
}

/// A state kept at the end of a block that leaves the prefix cache goes with it: its slot
/// is free at once, so LRU eviction never takes a state a prompt can still resume from in
/// its place.
#[test]
fn a_state_goes_with_the_block_it_ends() {
    let mut m = KvCacheManager::new(KvCacheManagerConfig {
        watermark: 0.0,
        num_state_slots: 4,
        ..KvCacheManagerConfig::new(8, 4)
    });
    m.start_step();
    // Two prompts keep their states at boundary 8, the first's the older.
    let (a, b) = (toks(0..9), toks(100..109));
    for (seq, t) in [(1, &a), (2, &b)] {
        admit(&mut m, seq, t).expect("room");
        m.start_step();
    }
    // Freed second then first: the second's cached blocks are evicted first.
    m.free(SeqId(2));
    m.free(SeqId(1));
    assert_eq!(m.num_free_state_slots(), 2);
    // A short prompt takes a slot; then 17 tokens take the last free slot, every block
    // holding nothing and the second prompt's two cached blocks, the state at whose end
    // goes with them. The newcomer's own state (boundary 16) takes that slot instead of
    // evicting the first prompt's, older but still reachable.
    admit(&mut m, 3, &toks(300..303)).expect("room");
    admit(&mut m, 4, &toks(200..217)).expect("room");
    assert!(m.state_step(SeqId(4)).unwrap().snapshot.is_some());
    m.start_step();
    assert_eq!(m.num_free_state_slots(), 0);
    assert_eq!(m.get_computed_blocks(&toks(100..112)).num_tokens(), 0);
    let resumed = [&a[..], &toks(50..53)].concat();
    assert_eq!(m.get_computed_blocks(&resumed).num_tokens(), 8);
}

/// A state whose entry leaves the cache goes at once if cached; if the step being
/// scheduled writes it, its slot stays taken until that step has run, then goes back
/// instead of caching a state no prompt can reach.
#[test]
fn a_state_whose_entry_leaves_goes_once_written() {
    let mut p = StatePool::new(3);
    let kept = p.snapshot(7, None).expect("a free slot");
    p.start_step();
    assert_eq!((p.lookup(7), p.num_free()), (Some(kept), 2));
    p.snapshot(8, None).expect("a free slot");
    p.forget([7, 8]);
    assert_eq!(p.lookup(7), None);
    assert_eq!(p.num_free(), 2, "the slot this step writes stays taken");
    p.start_step();
    assert_eq!((p.lookup(8), p.num_free()), (None, 3));
}
