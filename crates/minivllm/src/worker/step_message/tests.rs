use super::*;
use crate::ids::SeqId;

const BLOCK_SIZE: usize = 4;

/// A prompt chunk, a decode and a second prompt with logits for some of its positions.
fn batch() -> InputMetadata {
    let mut input = InputMetadata::default();
    input.add_sequence(&[5, 6, 7], 7, &[9, 2], BLOCK_SIZE, false);
    input.add_sequence(&[11], 13, &[0, 1, 3, 8], BLOCK_SIZE, true);
    input.add_sequence(&[1, 2, 3, 4, 5], 5, &[4, 6], BLOCK_SIZE, true);
    input.logits_indices.extend([2, 5, 7]);
    input
}

#[test]
fn a_batch_arrives_as_the_same_input_metadata() {
    let sent = batch();
    let mut buf = Vec::new();
    send(&mut buf, &sent, &[1, 2, 3], &mut HeldTables::default());
    let mut got = StepBuffers::default();
    // Stale contents from an earlier step must not leak into this one.
    got.input.add_sequence(&[1], 1, &[7], BLOCK_SIZE, true);
    assert_eq!(decode(&buf, BLOCK_SIZE, &mut got), Ok(Received::Execute));
    assert_eq!(got.input.token_ids, sent.token_ids);
    assert_eq!(got.input.positions, sent.positions);
    assert_eq!(got.input.slot_mapping, sent.slot_mapping);
    assert_eq!(got.input.seqs, sent.seqs);
    assert_eq!(got.input.block_tables, sent.block_tables);
    assert_eq!(got.input.logits_indices, sent.logits_indices);
    assert!(got.input.states.is_empty());
    // A model with linear attention: each sequence's state slot and copies go too.
    let mut sent = batch();
    let restored = StateStep {
        restore_from: Some(5),
        ..StateStep::in_slot(0)
    };
    let snapshot = StateStep {
        snapshot: Some((3, 6)),
        ..StateStep::in_slot(2)
    };
    sent.states
        .extend([StateStep::in_slot(4), restored, snapshot]);
    send(&mut buf, &sent, &[1, 2, 3], &mut HeldTables::default());
    let mut got = StepBuffers::default();
    assert_eq!(decode(&buf, BLOCK_SIZE, &mut got), Ok(Received::Execute));
    assert_eq!(got.input.states, sent.states);
}

#[test]
fn a_batch_over_several_kv_cache_groups_arrives_whole() {
    // Two groups: a full one, and a sliding one whose first blocks have gone back.
    let mut sent = InputMetadata::with_groups(2);
    let null = BlockId::NULL.0;
    sent.add_sequence(&[11], 13, &[0, 1, 3, 8, null, null, 5, 9], BLOCK_SIZE, true);
    sent.add_sequence(&[5, 6, 7], 7, &[2, 4, 6, 7], BLOCK_SIZE, false);
    sent.logits_indices.push(0);
    let mut buf = Vec::new();
    send(&mut buf, &sent, &[1, 2], &mut HeldTables::default());
    let mut got = StepBuffers::default();
    assert_eq!(decode(&buf, BLOCK_SIZE, &mut got), Ok(Received::Execute));
    assert_eq!(got.input.num_groups(), 2);
    assert_eq!(got.input.slot_mapping, sent.slot_mapping);
    assert_eq!(got.input.slot_mapping[1][0], 9 * BLOCK_SIZE);
    assert_eq!(got.input.block_table(0, 1), [null, null, 5, 9]);
    assert_eq!(got.input.seqs, sent.seqs);
    assert_eq!(got.input.block_tables, sent.block_tables);
}

#[test]
fn cache_operations_and_shutdown_arrive() {
    let mut buf = Vec::new();
    let swap_out = [(BlockId(3), CpuBlockId(0)), (BlockId(4), CpuBlockId(1))];
    let swap_in = [(CpuBlockId(2), BlockId(7))];
    encode_cache_ops(&mut buf, &swap_out, &swap_in);
    let mut got = StepBuffers::default();
    assert_eq!(decode(&buf, BLOCK_SIZE, &mut got), Ok(Received::CacheOps));
    assert_eq!(got.ops.swap_out, swap_out);
    assert_eq!(got.ops.swap_in, swap_in);
    encode_shutdown(&mut buf);
    assert_eq!(decode(&buf, BLOCK_SIZE, &mut got), Ok(Received::Shutdown));
}

#[test]
fn malformed_messages_are_errors() {
    let mut buf = Vec::new();
    send(&mut buf, &batch(), &[1, 2, 3], &mut HeldTables::default());
    let mut got = StepBuffers::default();
    for cut in 0..buf.len() {
        assert!(
            decode(&buf[..cut], BLOCK_SIZE, &mut got).is_err(),
            "cut at {cut}"
        );
    }
    let mut longer = buf.clone();
    longer.push(0);
    assert!(decode(&longer, BLOCK_SIZE, &mut got).is_err());
    assert!(decode(&[9], BLOCK_SIZE, &mut got).is_err());
    // A count claiming more items than the bytes hold.
    let mut huge = vec![EXECUTE];
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode(&huge, BLOCK_SIZE, &mut got).is_err());
    // A context the block table cannot hold.
    let mut short_table = InputMetadata::default();
    short_table.add_sequence(&[1, 2], 8, &[0, 1], BLOCK_SIZE, false);
    send(&mut buf, &short_table, &[1], &mut HeldTables::default());
    assert!(decode(&buf, 2, &mut got).is_err());
    // A table keeping more blocks than the worker holds for the sequence: the driver held
    // one the worker never received.
    let mut driver = HeldTables::default();
    send(&mut buf, &batch(), &[1, 2, 3], &mut driver);
    send(&mut buf, &batch(), &[1, 2, 3], &mut driver);
    let mut fresh = StepBuffers::default();
    assert!(decode(&buf, BLOCK_SIZE, &mut fresh).is_err());
}

/// Encodes `input`, whose sequences are `ids`, against the driver's `held` tables.
fn send(buf: &mut Vec<u8>, input: &InputMetadata, ids: &[u64], held: &mut HeldTables) {
    encode_execute(buf, input, ids.iter().map(|&i| SeqId(i)), held);
}

/// Steps of one long sequence and a short one: after the first, a step sends each table's
/// new blocks only (a decode step's message does not grow with the context), and the
/// worker rebuilds the same batch each time, whatever joins, leaves or changes.
#[test]
fn later_steps_send_only_the_blocks_tables_gained() {
    let (mut driver, mut worker) = (HeldTables::default(), StepBuffers::default());
    let mut buf = Vec::new();
    let null = BlockId::NULL.0;
    // Two groups: a full one, and a sliding one that gives its first blocks back.
    let table = |blocks: u32, window_gone: u32| -> Vec<u32> {
        let full = (0..blocks).map(|b| 2 * b);
        let sliding = (0..blocks).map(|b| if b < window_gone { null } else { 2 * b + 1 });
        full.chain(sliding).collect()
    };
    let mut step = |seqs: &[(u64, u32, u32)]| -> usize {
        let mut input = InputMetadata::with_groups(2);
        for &(_, blocks, gone) in seqs {
            let context = blocks as usize * BLOCK_SIZE - 1;
            input.add_sequence(&[7], context, &table(blocks, gone), BLOCK_SIZE, true);
        }
        let ids: Vec<u64> = seqs.iter().map(|s| s.0).collect();
        send(&mut buf, &input, &ids, &mut driver);
        assert_eq!(decode(&buf, BLOCK_SIZE, &mut worker), Ok(Received::Execute));
        assert_eq!(worker.input.block_tables, input.block_tables);
        assert_eq!(worker.input.slot_mapping, input.slot_mapping);
        assert_eq!(worker.input.seqs, input.seqs);
        assert_eq!(worker.input.token_ids, input.token_ids);
        assert_eq!(worker.input.logits_indices, input.logits_indices);
        assert_eq!(worker.held.len(), seqs.len());
        assert_eq!(driver.len(), seqs.len());
        buf.len()
    };
    let first = step(&[(1 << 40, 2000, 0), (5, 3, 0)]);
    assert!(
        first > 2 * 2000 * 4,
        "the first step sends the tables whole"
    );
    // The same blocks, then one more for the long sequence, then its window moving on.
    let same = step(&[(1 << 40, 2000, 0), (5, 3, 0)]);
    let grown = step(&[(1 << 40, 2001, 0), (5, 3, 0)]);
    let slid = step(&[(1 << 40, 2001, 1), (5, 3, 0)]);
    assert!(same < 100, "an unchanged step: {same} bytes");
    assert_eq!(
        grown,
        same + 2 * 4,
        "a block gained in each group: 8 bytes more"
    );
    assert!(
        slid < 8200,
        "the window's change: the sliding table from block 0"
    );
    // The short sequence leaves and comes back with new blocks; a new one joins.
    step(&[(1 << 40, 2001, 1)]);
    let back = step(&[(1 << 40, 2001, 1), (5, 4, 0), (6, 1, 0)]);
    // 6's header (7 words), token and logits row, and 5's and 6's tables whole (10 words).
    assert_eq!(back, same + (7 + 2 + 10) * 4, "5 and 6 sent whole");
}
