//! The tokenizer's vocabulary byte by byte, for structured output's token trie.

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::NormalizerWrapper;

use super::Tokenizer;
use crate::structured_output::backend_guidance::GrammarError;
use crate::structured_output::vocabulary::{VocabToken, Vocabulary};

/// How the decoder turns a token's string into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-level BPE: each byte written as one printable character.
    ByteLevel,
    /// SentencePiece: `▁` for a space, bytes without a piece of their own as `<0xXX>`.
    SentencePiece,
}

fn spelling(tokenizer: &tokenizers::Tokenizer) -> Result<Spelling, GrammarError> {
    let decoder = tokenizer
        .get_decoder()
        .and_then(|d| serde_json::to_string(d).ok())
        .unwrap_or_default();
    if decoder.contains("\"ByteLevel\"") {
        Ok(Spelling::ByteLevel)
    } else if decoder.contains("\"ByteFallback\"") || decoder.contains('▁') {
        Ok(Spelling::SentencePiece)
    } else {
        Err(GrammarError::Unsupported(format!(
            "its tokenizer's decoder ({decoder}) is neither byte-level BPE nor SentencePiece"
        )))
    }
}

/// GPT-2's printable stand-in for each byte, reversed: printable Latin-1 bytes stand for
/// themselves, the others for U+0100 onwards in byte order.
fn byte_level_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                let c = char::from_u32(next).expect("below the surrogates");
                next += 1;
                (c, b)
            }
        })
        .collect()
}

/// `<0x0A>` as the byte it stands for.
fn byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// The normalizer without SentencePiece's `Prepend("▁")`: text a grammar forces continues
/// the output, it does not start a new text.
fn without_prepend(n: NormalizerWrapper) -> Option<NormalizerWrapper> {
    match n {
        NormalizerWrapper::Prepend(_) => None,
        NormalizerWrapper::Sequence(seq) => {
            let kept: Vec<NormalizerWrapper> = (seq.as_ref().iter().cloned())
                .filter_map(without_prepend)
                .collect();
            Some(tokenizers::normalizers::Sequence::new(kept).into())
        }
        other => Some(other),
    }
}

impl Tokenizer {
    /// Every token's bytes, special tokens by name, the EOS ids, and a tokenizer for text
    /// in the middle of an output.
    pub fn vocabulary(&self) -> Result<Vocabulary, GrammarError> {
        let spelling = spelling(&self.inner)?;
        let chars = byte_level_chars();
        let added = self.inner.get_added_tokens_decoder();
        let tokens = (0..self.inner.get_vocab_size(true) as u32)
            .map(|id| {
                if let Some(token) = added.get(&id) {
                    return if token.special {
                        VocabToken::Special(token.content.clone())
                    } else {
                        VocabToken::Text(token.content.clone().into_bytes())
                    };
                }
                let Some(piece) = self.inner.id_to_token(id) else {
                    return VocabToken::Special(format!("<|unused {id}|>"));
                };
                match spelling {
                    Spelling::ByteLevel => piece
                        .chars()
                        .map(|c| chars.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        // A piece outside the byte alphabet can never be produced by it.
                        .map_or(VocabToken::Special(piece.clone()), VocabToken::Text),
                    Spelling::SentencePiece => match byte_piece(&piece) {
                        Some(b) => VocabToken::Text(vec![b]),
                        None => VocabToken::Text(piece.replace('▁', " ").into_bytes()),
                    },
                }
            })
            .collect();
        let mut inner = self.inner.clone();
        if let Some(n) = inner.get_normalizer().cloned() {
            inner
                .with_normalizer(without_prepend(n))
                .map_err(|e| GrammarError::Unsupported(e.to_string()))?;
        }
        Ok(Vocabulary {
            tokens,
            eos_token_ids: self.eos_token_ids.clone(),
            tokenize: Arc::new(move |text| {
                inner
                    .encode(text, false)
                    .map(|e| e.get_ids().to_vec())
                    .unwrap_or_default()
            }),
        })
    }
}
