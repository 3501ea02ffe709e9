use super::*;

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
    encode_execute(&mut buf, &sent);
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
    encode_execute(&mut buf, &sent);
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
    encode_execute(&mut buf, &batch());
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
    encode_execute(&mut buf, &short_table);
    assert!(decode(&buf, 2, &mut got).is_err());
}
