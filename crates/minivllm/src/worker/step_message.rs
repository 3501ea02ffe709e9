//! What the driver (rank 0) sends the other ranks of a tensor-parallel group each step, as
//! bytes for one broadcast: the KV-cache operations the scheduler ordered, the batch to run,
//! or the end of the group.
//!
//! The batch goes as the sequences' new tokens and context lengths and what changed in
//! their block tables, from which each rank rebuilds the same `InputMetadata` (positions
//! and slots follow from them). Both ends keep the tables of the last batch's sequences
//! ([`HeldTables`]), so a sequence's table goes whole once and then as the blocks it
//! gained (vLLM's `new_block_ids`): a decode step of 64 sequences is about two kilobytes,
//! however long their contexts.

use std::collections::HashMap;

use crate::distributed::CommError;
use crate::ids::{BlockId, CpuBlockId, SeqId};
use crate::model_executor::input_metadata::{InputMetadata, StateStep};

const CACHE_OPS: u8 = 1;
const EXECUTE: u8 = 2;
const SHUTDOWN: u8 = 3;
/// More KV cache groups than any layout makes (one per layer at most) marks a bad message.
const MAX_GROUPS: usize = 1 << 12;
/// A state copy's absent slot.
const NO_SLOT: u32 = u32::MAX;

/// Block moves to make before the next forward pass: swap-outs, then swap-ins (the order
/// `ModelRunner::apply_cache_ops` explains).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CacheOps {
    pub swap_out: Vec<(BlockId, CpuBlockId)>,
    pub swap_in: Vec<(CpuBlockId, BlockId)>,
}

/// What a received message asks of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    /// Make the cache operations decoded into the `CacheOps`.
    CacheOps,
    /// Run the batch decoded into the `InputMetadata`.
    Execute,
    /// The driver is done: leave the worker loop.
    Shutdown,
}

pub(crate) fn encode_cache_ops(
    buf: &mut Vec<u8>,
    swap_out: &[(BlockId, CpuBlockId)],
    swap_in: &[(CpuBlockId, BlockId)],
) {
    buf.clear();
    buf.push(CACHE_OPS);
    put_pairs(buf, swap_out.iter().map(|(a, b)| (a.0, b.0)));
    put_pairs(buf, swap_in.iter().map(|(a, b)| (a.0, b.0)));
}

/// The block tables of the sequences in the last batch sent (on the driver) or received
/// (on a worker), each as `InputMetadata` holds it (every KV cache group's table, one after
/// another). Both ends update theirs from the same messages by the same rules, so they
/// stay equal; a sequence that a batch leaves out is dropped from both (a later batch sends
/// its table whole again), which bounds them by the batch.
#[derive(Debug, Default)]
pub(crate) struct HeldTables {
    tables: HashMap<SeqId, Vec<u32>>,
    /// Sequences of the batch being sent or received, and tables dropped for reuse.
    in_batch: Vec<SeqId>,
    spare: Vec<Vec<u32>>,
    /// The encoder's count of held blocks each table keeps, per sequence and group.
    keeps: Vec<usize>,
}

impl HeldTables {
    /// The table held for `id` (empty if none), for `groups` KV cache groups.
    fn held(&self, id: SeqId) -> &[u32] {
        self.tables.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Holds `table` for `id`, built into a reused buffer by `fill`.
    fn hold(&mut self, id: SeqId, fill: impl FnOnce(&[u32], &mut Vec<u32>)) {
        let mut table = self.spare.pop().unwrap_or_default();
        table.clear();
        fill(self.held(id), &mut table);
        if let Some(old) = self.tables.insert(id, table) {
            self.spare.push(old);
        }
        self.in_batch.push(id);
    }

    /// Drops the sequences the batch just sent or received left out.
    fn end_batch(&mut self) {
        let HeldTables {
            tables,
            in_batch,
            spare,
            ..
        } = self;
        if tables.len() > in_batch.len() {
            in_batch.sort_unstable();
            tables.retain(|id, table| {
                let keep = in_batch.binary_search(id).is_ok();
                if !keep {
                    spare.push(std::mem::take(table));
                }
                keep
            });
        }
        in_batch.clear();
        // Enough to refill a batch of as many sequences, no more.
        spare.truncate(tables.len());
    }

    /// Sequences held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.tables.len()
    }
}

/// The batch `input`, whose sequences are `ids` in order, for the workers, with each block
/// table sent as its change from `held`'s (updated to the batch's).
pub(crate) fn encode_execute(
    buf: &mut Vec<u8>,
    input: &InputMetadata,
    ids: impl ExactSizeIterator<Item = SeqId>,
    held: &mut HeldTables,
) {
    assert_eq!(
        ids.len(),
        input.seqs.len(),
        "a sequence id for each sequence"
    );
    let groups = input.num_groups();
    buf.clear();
    buf.push(EXECUTE);
    put(buf, groups);
    put(buf, input.seqs.len());
    // Per sequence: id, query_len, context_len, num_blocks and, per group, how many of
    // the held table's first blocks it keeps; the tails follow the tokens.
    let mut keeps = std::mem::take(&mut held.keeps);
    keeps.clear();
    for (i, (s, id)) in input.seqs.iter().zip(ids).enumerate() {
        put_u32(buf, id.0 as u32);
        put_u32(buf, (id.0 >> 32) as u32);
        put(buf, s.query_len);
        put(buf, s.context_len);
        put(buf, s.num_blocks);
        let old = held.held(id);
        let old_blocks = old.len() / groups;
        for g in 0..groups {
            let before = &old[g * old_blocks..(g + 1) * old_blocks];
            let now = input.block_table(i, g);
            let keep = now.iter().zip(before).take_while(|(a, b)| a == b).count();
            put(buf, keep);
            keeps.push(keep);
        }
        held.hold(id, |_, into| {
            (0..groups).for_each(|g| into.extend_from_slice(input.block_table(i, g)))
        });
    }
    held.end_batch();
    input.token_ids.iter().for_each(|&t| put_u32(buf, t));
    for (at, &keep) in keeps.iter().enumerate() {
        let tail = &input.block_table(at / groups, at % groups)[keep..];
        tail.iter().for_each(|&b| put_u32(buf, b));
    }
    held.keeps = keeps;
    put(buf, input.logits_indices.len());
    input.logits_indices.iter().for_each(|&i| put(buf, i));
    put(buf, input.states.len());
    for s in &input.states {
        put_u32(buf, s.slot);
        put_u32(buf, s.restore_from.unwrap_or(NO_SLOT));
        let (after, into) = s.snapshot.unwrap_or((0, NO_SLOT));
        put_u32(buf, after);
        put_u32(buf, into);
    }
}

pub(crate) fn encode_shutdown(buf: &mut Vec<u8>) {
    buf.clear();
    buf.push(SHUTDOWN);
}

/// A worker's buffers for received messages, reused from step to step.
#[derive(Debug, Default)]
pub(crate) struct StepBuffers {
    pub ops: CacheOps,
    pub input: InputMetadata,
    /// The tables of the last batch's sequences, which the next batch's changes apply to.
    held: HeldTables,
    tokens: Vec<u32>,
}

/// Decodes a message into `into` (its cache operations or its batch, rebuilt for KV blocks
/// of `block_size` tokens). A malformed message is an error, never a panic.
pub fn decode(
    buf: &[u8],
    block_size: usize,
    into: &mut StepBuffers,
) -> Result<Received, CommError> {
    let mut r = Reader { buf, at: 0 };
    let kind = match r.byte()? {
        CACHE_OPS => {
            let ops = &mut into.ops;
            r.pairs(&mut ops.swap_out, |a, b| (BlockId(a), CpuBlockId(b)))?;
            r.pairs(&mut ops.swap_in, |a, b| (CpuBlockId(a), BlockId(b)))?;
            Received::CacheOps
        }
        EXECUTE => {
            decode_execute(&mut r, block_size, into)?;
            Received::Execute
        }
        SHUTDOWN => Received::Shutdown,
        other => return Err(malformed(format!("unknown message kind {other}"))),
    };
    if r.at != buf.len() {
        return Err(malformed(format!("{} bytes left over", buf.len() - r.at)));
    }
    Ok(kind)
}

fn decode_execute(
    r: &mut Reader<'_>,
    block_size: usize,
    into: &mut StepBuffers,
) -> Result<(), CommError> {
    // The KV cache groups; (id, query_len, context_len, num_blocks, blocks kept per group)
    // for each sequence, then the tokens and the tables' new tails.
    let groups = r.u32()? as usize;
    if groups == 0 || groups > MAX_GROUPS {
        return Err(malformed(format!("{groups} KV cache groups")));
    }
    let fields = 5 + groups;
    let num_seqs = r.len(fields * 4)?;
    let header = r.take(num_seqs * fields * 4)?;
    let field = |s: usize, f: usize| read_u32(&header[(s * fields + f) * 4..]) as usize;
    let mut num_tokens = 0usize;
    let mut num_tail_blocks = 0usize;
    for s in 0..num_seqs {
        let blocks = field(s, 4);
        num_tokens += field(s, 2);
        for g in 0..groups {
            // A tail longer than the table is caught below, with the sequence named.
            num_tail_blocks += blocks.saturating_sub(field(s, 5 + g));
        }
    }
    let tokens = r.take(
        num_tokens
            .checked_mul(4)
            .ok_or_else(|| malformed("tokens".into()))?,
    )?;
    let tails = r.take(
        num_tail_blocks
            .checked_mul(4)
            .ok_or_else(|| malformed("tables".into()))?,
    )?;
    let StepBuffers {
        input,
        held,
        tokens: seq_tokens,
        ..
    } = into;
    if input.num_groups() != groups {
        *input = InputMetadata::with_groups(groups);
    }
    input.clear();
    let (mut token_at, mut tail_at) = (0, 0);
    for s in 0..num_seqs {
        let id = SeqId(field(s, 0) as u64 | (field(s, 1) as u64) << 32);
        let (query_len, context_len, blocks) = (field(s, 2), field(s, 3), field(s, 4));
        if query_len > context_len || context_len > blocks * block_size {
            return Err(malformed(format!(
                "sequence {s}: {query_len} new tokens, context {context_len}, {blocks} blocks"
            )));
        }
        let old_blocks = held.held(id).len() / groups;
        if let Some(keep) = (0..groups)
            .map(|g| field(s, 5 + g))
            .find(|&k| k > blocks.min(old_blocks))
        {
            return Err(malformed(format!(
                "sequence {s} keeps {keep} blocks of {old_blocks} held, {blocks} now"
            )));
        }
        held.hold(id, |old, table| {
            for g in 0..groups {
                let keep = field(s, 5 + g);
                table.extend_from_slice(&old[g * old_blocks..g * old_blocks + keep]);
                let new = blocks - keep;
                table.extend(words(&tails[tail_at * 4..(tail_at + new) * 4]));
                tail_at += new;
            }
        });
        seq_tokens.clear();
        seq_tokens.extend(words(&tokens[token_at * 4..(token_at + query_len) * 4]));
        token_at += query_len;
        input.add_sequence(seq_tokens, context_len, held.held(id), block_size, false);
    }
    held.end_batch();
    for _ in 0..r.len(4)? {
        input.logits_indices.push(r.u32()? as usize);
    }
    for _ in 0..r.len(16)? {
        let slot = r.u32()?;
        let restore_from = Some(r.u32()?).filter(|&s| s != NO_SLOT);
        let (after, into) = (r.u32()?, r.u32()?);
        input.states.push(StateStep {
            slot,
            restore_from,
            snapshot: (into != NO_SLOT).then_some((after, into)),
        });
    }
    Ok(())
}

fn malformed(what: String) -> CommError {
    CommError::Mismatch {
        rank: 0,
        what: format!("malformed step message: {what}"),
    }
}

fn put(buf: &mut Vec<u8>, v: usize) {
    put_u32(
        buf,
        u32::try_from(v).expect("step message fields fit in 32 bits"),
    );
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_pairs(buf: &mut Vec<u8>, pairs: impl ExactSizeIterator<Item = (u32, u32)>) {
    put(buf, pairs.len());
    for (a, b) in pairs {
        put_u32(buf, a);
        put_u32(buf, b);
    }
}

fn read_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks_exact(4).map(read_u32)
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CommError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| malformed(format!("truncated at byte {}", self.at)))?;
        let bytes = &self.buf[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn byte(&mut self) -> Result<u8, CommError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, CommError> {
        Ok(read_u32(self.take(4)?))
    }

    /// A count of items of `item_bytes` each, checked against the bytes left so that a bad
    /// count cannot size an allocation.
    fn len(&mut self, item_bytes: usize) -> Result<usize, CommError> {
        let n = self.u32()? as usize;
        if n * item_bytes > self.buf.len() - self.at {
            return Err(malformed(format!(
                "{n} items of {item_bytes} bytes claimed"
            )));
        }
        Ok(n)
    }

    fn pairs<T>(
        &mut self,
        out: &mut Vec<T>,
        make: impl Fn(u32, u32) -> T,
    ) -> Result<(), CommError> {
        out.clear();
        for _ in 0..self.len(8)? {
            let (a, b) = (self.u32()?, self.u32()?);
            out.push(make(a, b));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
