//! What the driver (rank 0) sends the other ranks of a tensor-parallel group each step, as
//! bytes for one broadcast: the KV-cache operations the scheduler ordered, the batch to run,
//! or the end of the group.
//!
//! The batch goes as the sequences' new tokens, context lengths and block tables, from which
//! each rank rebuilds the same `InputMetadata` (positions and slots follow from them): a
//! decode step of 64 sequences is a few kilobytes, however long their contexts.

use crate::distributed::CommError;
use crate::ids::{BlockId, CpuBlockId};
use crate::model_executor::input_metadata::InputMetadata;

const CACHE_OPS: u8 = 1;
const EXECUTE: u8 = 2;
const SHUTDOWN: u8 = 3;
/// More KV cache groups than any layout makes (one per layer at most) marks a bad message.
const MAX_GROUPS: usize = 1 << 12;

/// Block moves to make before the next forward pass: swap-outs, then swap-ins (the order
/// `ModelRunner::apply_cache_ops` explains).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheOps {
    pub swap_out: Vec<(BlockId, CpuBlockId)>,
    pub swap_in: Vec<(CpuBlockId, BlockId)>,
}

/// What a received message asks of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
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

pub(crate) fn encode_execute(buf: &mut Vec<u8>, input: &InputMetadata) {
    buf.clear();
    buf.push(EXECUTE);
    put(buf, input.num_groups());
    put(buf, input.seqs.len());
    for s in &input.seqs {
        put(buf, s.query_len);
        put(buf, s.context_len);
        put(buf, s.num_blocks);
    }
    input.token_ids.iter().for_each(|&t| put_u32(buf, t));
    input.block_tables.iter().for_each(|&b| put_u32(buf, b));
    put(buf, input.logits_indices.len());
    input.logits_indices.iter().for_each(|&i| put(buf, i));
}

pub(crate) fn encode_shutdown(buf: &mut Vec<u8>) {
    buf.clear();
    buf.push(SHUTDOWN);
}

/// A worker's buffers for received messages, reused from step to step.
#[derive(Debug, Default)]
pub struct StepBuffers {
    pub ops: CacheOps,
    pub input: InputMetadata,
    tokens: Vec<u32>,
    table: Vec<u32>,
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
    // The KV cache groups; (query_len, context_len, num_blocks) for each sequence, then the
    // tokens and tables (each sequence's table of every group).
    let groups = r.u32()? as usize;
    if groups == 0 || groups > MAX_GROUPS {
        return Err(malformed(format!("{groups} KV cache groups")));
    }
    let num_seqs = r.len(12)?;
    let header = r.take(num_seqs * 12)?;
    let field = |s: usize, f: usize| read_u32(&header[s * 12 + f * 4..]) as usize;
    let num_tokens: usize = (0..num_seqs).map(|s| field(s, 0)).sum();
    let num_blocks: usize = (0..num_seqs).map(|s| field(s, 2) * groups).sum();
    let (tokens, tables) = (r.take(num_tokens * 4)?, r.take(num_blocks * 4)?);
    let StepBuffers {
        input,
        tokens: seq_tokens,
        table,
        ..
    } = into;
    if input.num_groups() != groups {
        *input = InputMetadata::with_groups(groups);
    }
    input.clear();
    let (mut token_at, mut block_at) = (0, 0);
    for s in 0..num_seqs {
        let (query_len, context_len, blocks) = (field(s, 0), field(s, 1), field(s, 2));
        let words_of_tables = blocks * groups;
        if query_len > context_len || context_len > blocks * block_size {
            return Err(malformed(format!(
                "sequence {s}: {query_len} new tokens, context {context_len}, {blocks} blocks"
            )));
        }
        seq_tokens.clear();
        seq_tokens.extend(words(&tokens[token_at * 4..(token_at + query_len) * 4]));
        table.clear();
        table.extend(words(
            &tables[block_at * 4..(block_at + words_of_tables) * 4],
        ));
        (token_at, block_at) = (token_at + query_len, block_at + words_of_tables);
        input.add_sequence(seq_tokens, context_len, table, block_size, false);
    }
    for _ in 0..r.len(4)? {
        input.logits_indices.push(r.u32()? as usize);
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
