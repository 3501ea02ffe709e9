//! A request's KV cache as it travels between engines: the prompt's token ids (so that the
//! receiver checks it holds the same prompt) and its blocks, with the layout they need.

use minivllm_kernels::attention::KvCacheDtype;

const MAGIC: &[u8; 4] = b"MVKV";
const VERSION: u16 = 1;

/// The shape a payload's blocks have; two engines exchange KV only if theirs are equal (the
/// same model, block size and `--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayoutTag {
    /// KV stores per block: one per layer for the models that transfer.
    pub num_slots: u32,
    pub block_size: u32,
    /// Values in one store's keys (or values) of one block.
    pub block_len: u32,
    pub dtype: KvCacheDtype,
}

impl KvLayoutTag {
    /// Bytes of one block across its stores, keys and values.
    pub fn block_bytes(&self) -> usize {
        2 * self.num_slots as usize * self.block_len as usize * self.dtype.size()
    }
}

/// Blocks `0..ceil(token_ids.len() / block_size)` of one prompt, block after block, each its
/// stores' keys then values (little-endian elements).
#[derive(Debug, Clone, PartialEq)]
pub struct KvPayload {
    pub layout: KvLayoutTag,
    pub token_ids: Vec<u32>,
    pub data: Vec<u8>,
}

/// Why bytes are not a payload this engine can use.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    #[error("not a KV payload (bad magic or version)")]
    BadHeader,
    #[error("KV payload truncated or padded: {0}")]
    BadLength(String),
    #[error("unknown KV element type code {0}")]
    BadDtype(u8),
}

fn dtype_code(d: KvCacheDtype) -> u8 {
    match d {
        KvCacheDtype::Float32 => 0,
        KvCacheDtype::Float16 => 1,
        KvCacheDtype::BFloat16 => 2,
    }
}

impl KvPayload {
    /// Blocks the prompt's tokens fill (the last maybe in part).
    pub fn num_blocks(&self) -> usize {
        self.token_ids
            .len()
            .div_ceil(self.layout.block_size as usize)
    }

    /// Block `i`'s bytes.
    pub fn block(&self, i: usize) -> &[u8] {
        let n = self.layout.block_bytes();
        &self.data[i * n..(i + 1) * n]
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Self::encode_head(&self.layout, &self.token_ids, self.data.len());
        out.extend(&self.data);
        out
    }

    /// A payload's bytes up to its blocks, with room for `data_len` bytes of them: the
    /// blocks are then appended straight from the cache, copied once.
    pub fn encode_head(layout: &KvLayoutTag, token_ids: &[u32], data_len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 4 * token_ids.len() + data_len);
        out.extend(MAGIC);
        out.extend(VERSION.to_le_bytes());
        out.extend([dtype_code(layout.dtype), 0]);
        for x in [layout.num_slots, layout.block_size, layout.block_len] {
            out.extend(x.to_le_bytes());
        }
        out.extend((token_ids.len() as u32).to_le_bytes());
        token_ids.iter().for_each(|t| out.extend(t.to_le_bytes()));
        out
    }

    /// Reads [`encode`](Self::encode)'s bytes (in place: the blocks keep their buffer),
    /// checking that the data is exactly the blocks its tokens fill.
    pub fn decode(mut bytes: Vec<u8>) -> Result<Self, PayloadError> {
        let u32_at = |at: usize| -> Result<u32, PayloadError> {
            let b = bytes.get(at..at + 4).ok_or_else(|| short(bytes.len()))?;
            Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
        };
        if bytes.len() < 24 || &bytes[..4] != MAGIC || bytes[4..6] != VERSION.to_le_bytes() {
            return Err(PayloadError::BadHeader);
        }
        let dtype = match bytes[6] {
            0 => KvCacheDtype::Float32,
            1 => KvCacheDtype::Float16,
            2 => KvCacheDtype::BFloat16,
            c => return Err(PayloadError::BadDtype(c)),
        };
        let layout = KvLayoutTag {
            num_slots: u32_at(8)?,
            block_size: u32_at(12)?,
            block_len: u32_at(16)?,
            dtype,
        };
        if layout.block_size == 0 {
            return Err(PayloadError::BadLength("block size 0".into()));
        }
        let num_tokens = u32_at(20)? as usize;
        let data_at = 24 + 4 * num_tokens;
        let ids = bytes.get(24..data_at).ok_or_else(|| short(bytes.len()))?;
        let token_ids = ids
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        bytes.drain(..data_at);
        let payload = KvPayload {
            layout,
            token_ids,
            data: bytes,
        };
        // Computed wide: the header's sizes are the sender's word, not yet checked.
        let want = payload.num_blocks() as u128
            * 2
            * u128::from(layout.num_slots)
            * u128::from(layout.block_len)
            * layout.dtype.size() as u128;
        if payload.data.len() as u128 != want {
            return Err(PayloadError::BadLength(format!(
                "{} bytes of blocks where {num_tokens} tokens fill {want}",
                payload.data.len()
            )));
        }
        Ok(payload)
    }
}

fn short(len: usize) -> PayloadError {
    PayloadError::BadLength(format!("{len} bytes end inside the header"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> KvPayload {
        let layout = KvLayoutTag {
            num_slots: 2,
            block_size: 4,
            block_len: 8,
            dtype: KvCacheDtype::Float16,
        };
        KvPayload {
            layout,
            token_ids: vec![5, 6, 7, 8, 9],
            data: (0..2 * layout.block_bytes()).map(|i| i as u8).collect(),
        }
    }

    #[test]
    fn encode_then_decode_gives_the_payload_back() {
        let p = sample();
        assert_eq!(KvPayload::decode(p.encode()), Ok(p.clone()));
        assert_eq!(p.num_blocks(), 2);
        assert_eq!(p.block(1)[0], p.layout.block_bytes() as u8);
    }

    #[test]
    fn damaged_bytes_are_refused_not_read() {
        let bytes = sample().encode();
        assert_eq!(
            KvPayload::decode(bytes[..10].to_vec()),
            Err(PayloadError::BadHeader)
        );
        assert!(matches!(
            KvPayload::decode(bytes[..bytes.len() - 1].to_vec()),
            Err(PayloadError::BadLength(_))
        ));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(KvPayload::decode(bad.clone()), Err(PayloadError::BadHeader));
        let mut bad = bytes.clone();
        bad[6] = 9;
        assert_eq!(
            KvPayload::decode(bad.clone()),
            Err(PayloadError::BadDtype(9))
        );
        // A token count far past the bytes there are.
        let mut bad = bytes;
        bad[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            KvPayload::decode(bad.clone()),
            Err(PayloadError::BadLength(_))
        ));
    }
}
