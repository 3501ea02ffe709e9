//! The model's vocabulary as a grammar engine sees it: each token's bytes as they appear in
//! the text (a byte-level BPE token's GPT-2 characters mapped back to bytes, a
//! SentencePiece token's `▁` as a space and `<0x0A>` as its byte), special tokens by name
//! (they never match text), the EOS ids, and the tokenizer itself for the text a grammar
//! forces. llguidance's token trie is built from it (toktrie's `TokenizerEnv`).

use std::sync::Arc;

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenizerEnv};

use crate::ids::TokenId;

/// One vocabulary entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VocabToken {
    /// The bytes the token stands for in text (possibly part of a UTF-8 character).
    Text(Vec<u8>),
    /// A control token (BOS, EOS, chat markers), which no grammar's text matches.
    Special(String),
}

/// Text to token ids with the model's own tokenizer.
pub(crate) type TokenizeFn = Arc<dyn Fn(&str) -> Vec<TokenId> + Send + Sync>;

pub struct Vocabulary {
    /// Indexed by token id.
    pub tokens: Vec<VocabToken>,
    /// Ids that end generation, the tokenizer's own EOS first.
    pub eos_token_ids: Vec<TokenId>,
    pub tokenize: TokenizeFn,
}

/// toktrie's view of a [`Vocabulary`].
pub(crate) struct VocabularyEnv {
    trie: TokTrie,
    tokenize: TokenizeFn,
}

impl VocabularyEnv {
    /// The trie over `vocab`'s tokens, `vocab_size` entries long: the model's logits rows
    /// may be longer than the tokenizer's vocabulary, and the padding is never allowed.
    pub(crate) fn new(vocab: Vocabulary, vocab_size: usize) -> Result<Self, String> {
        if vocab.tokens.len() > vocab_size {
            return Err(format!(
                "the tokenizer has {} tokens, more than the model's {vocab_size} logits",
                vocab.tokens.len()
            ));
        }
        // EOS ids come from configuration files too: ones past the logits cannot be sampled.
        let eos_ids: Vec<TokenId> = (vocab.eos_token_ids.iter().copied())
            .filter(|&id| (id as usize) < vocab_size)
            .collect();
        let eos = *eos_ids
            .first()
            .ok_or("the tokenizer has no EOS token, which a finished grammar must allow")?;
        let mut words: Vec<Vec<u8>> = vocab
            .tokens
            .into_iter()
            .map(|t| match t {
                VocabToken::Text(bytes) => bytes,
                VocabToken::Special(name) => special(&name),
            })
            .collect();
        while words.len() < vocab_size {
            words.push(special(&format!("<|padding {}|>", words.len())));
        }
        let info = TokRxInfo::new(vocab_size as u32, eos);
        // toktrie asserts what it cannot hold (a token over its length limit, say): a
        // vocabulary it refuses is this model's lack of structured output, not a crash.
        let trie = std::panic::catch_unwind(|| {
            let trie = TokTrie::from(&info, &words);
            match eos_ids.len() {
                1 => trie,
                _ => trie.with_eos_tokens(&eos_ids),
            }
        })
        .map_err(|_| "the vocabulary cannot be put in llguidance's token trie".to_string())?;
        Ok(Self {
            trie,
            tokenize: vocab.tokenize,
        })
    }
}

/// toktrie's spelling of a special token: a marker byte no text contains, then the name.
fn special(name: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(name.len() + 1);
    bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
    bytes.extend_from_slice(name.as_bytes());
    bytes
}

impl TokenizerEnv for VocabularyEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The tokenizer's ids where the bytes are text, the trie's greedy ones where they are
    /// not (a grammar may force any bytes).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie
            .tokenize_with_greedy_fallback(s, |text| (self.tokenize)(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Vocabulary {
        let tokens = ["a", "b", "ab", " ", "{", "}"]
            .iter()
            .map(|t| VocabToken::Text(t.as_bytes().to_vec()))
            .chain([VocabToken::Special("</s>".into())])
            .collect();
        Vocabulary {
            tokens,
            eos_token_ids: vec![6],
            tokenize: Arc::new(|text| text.bytes().map(|b| b as TokenId).collect()),
        }
    }

    #[test]
    fn the_trie_pads_to_the_models_vocabulary_and_knows_eos() {
        let env = VocabularyEnv::new(vocab(), 40).unwrap();
        let trie = env.tok_trie();
        assert_eq!(trie.vocab_size(), 40);
        assert_eq!(trie.eos_token(), 6);
        assert_eq!(trie.token(2), b"ab");
        // Text goes through the model's tokenizer (here: one id per byte).
        assert_eq!(env.tokenize_bytes(b"ab"), vec![97, 98]);
    }

    #[test]
    fn a_vocabulary_longer_than_the_logits_or_without_eos_is_refused() {
        let err = |v, n| VocabularyEnv::new(v, n).err().expect("refused");
        assert!(err(vocab(), 3).contains("more than"));
        let no_eos = Vocabulary {
            eos_token_ids: Vec::new(),
            ..vocab()
        };
        assert!(err(no_eos, 40).contains("EOS"));
    }
}
