//! A GGUF file's vocabulary as a `tokenizers` model: GPT-2 style byte-level BPE (with the
//! pre-tokenizer llama.cpp picks by `tokenizer.ggml.pre`) and SentencePiece-style BPE (merges
//! recovered from the token scores).

use std::collections::HashSet;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence, NFC};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::{tok_err, GgufTokenizerSpec};
use crate::model_executor::loader::LoadError;

/// Llama 3's pre-tokenizer split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`, the `Split` in
/// Meta's `tokenizer.json`): numbers in groups of up to three digits.
const LLAMA3_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// OpenAI's o200k split (gpt-oss; GGUF `tokenizer.ggml.pre` `gpt-4o`), as its
/// tokenizer.json writes it: words cut where the case changes up, digits in threes.
const O200K_SPLIT_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: like Llama 3's but every digit on its own.
const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-2 style byte-level BPE from the GGUF vocabulary and merge list.
pub(super) fn build_byte_level_bpe(
    spec: &GgufTokenizerSpec,
    vocab: Vocab,
) -> Result<tokenizers::Tokenizer, LoadError> {
    let merges = parse_merges(spec, "gpt2")?;

    let pre = spec.pre.as_deref().unwrap_or("default");
    // transformers' GGUF converter always uses GPT-2's ByteLevel regex; llama.cpp picks
    // by `pre`. They agree on "smollm" only because SmolLM2's vocabulary has no multi-digit
    // tokens; we follow transformers there since its output is this project's reference.
    let (split_regex, normalizer, ignore_merges) = match pre {
        "llama-bpe" | "llama3" => (Some(LLAMA3_SPLIT_REGEX), None, true),
        "qwen2" => (
            Some(QWEN2_SPLIT_REGEX),
            Some(NormalizerWrapper::from(NFC)),
            false,
        ),
        // llama.cpp keeps the merges for o200k (gpt-oss), as for Qwen2.
        "gpt-4o" | "llama4" => (Some(O200K_SPLIT_REGEX), None, false),
        "default" | "gpt2" | "smollm" => (None, None, false),
        other => {
            tracing::warn!(
                pre = other,
                "unknown GGUF pre-tokenizer; using GPT-2's byte-level split"
            );
            (None, None, false)
        }
    };
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| tok_err(format!("GGUF gpt2 tokenizer: {e}")))?;
    let pre_tokenizer: PreTokenizerWrapper = match split_regex {
        Some(regex) => {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(tok_err)?;
            PreTokenizerSequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into()
        }
        None => ByteLevel::new(false, true, true).into(),
    };
    let mut inner = tokenizers::Tokenizer::new(model);
    inner.with_normalizer(normalizer).map_err(tok_err)?;
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(DecoderWrapper::from(ByteLevel::default())));
    Ok(inner)
}

/// `tokenizer.ggml.merges` as pairs; a `model` tokenizer must have some.
pub(super) fn parse_merges(
    spec: &GgufTokenizerSpec,
    model: &str,
) -> Result<Vec<(String, String)>, LoadError> {
    if spec.merges.is_empty() {
        return Err(tok_err(format!(
            "GGUF {model} tokenizer has no tokenizer.ggml.merges"
        )));
    }
    spec.merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| tok_err(format!("GGUF merge {m:?} is not two tokens")))
        })
        .collect()
}

/// SentencePiece BPE (Llama 1/2, Mistral) as transformers rebuilds it from a GGUF: merges
/// derived from the piece scores, `▁` for spaces, unknown bytes as `<0xXX>` tokens.
pub(super) fn build_sentencepiece_bpe(
    spec: &GgufTokenizerSpec,
    vocab: Vocab,
    unk_token_id: Option<u32>,
) -> Result<tokenizers::Tokenizer, LoadError> {
    if spec.scores.len() != spec.tokens.len() {
        return Err(tok_err(format!(
            "GGUF llama tokenizer has {} tokens but {} scores",
            spec.tokens.len(),
            spec.scores.len()
        )));
    }
    let merges = merges_from_scores(&spec.tokens, &spec.scores, &vocab);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(unk) = unk_token_id {
        builder = builder.unk_token(spec.tokens[unk as usize].clone());
    }
    let model = builder
        .build()
        .map_err(|e| tok_err(format!("GGUF llama tokenizer: {e}")))?;

    let add_space_prefix = spec.add_space_prefix.unwrap_or(true);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new("▁".to_string()).into());
    }
    normalizers.push(Replace::new(" ", "▁").map_err(tok_err)?.into());
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ").map_err(tok_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        // After Fuse there is one string left, so this strips only the prepended space.
        decoders.push(Strip::new(' ', 1, 0).into());
    }

    let mut inner = tokenizers::Tokenizer::new(model);
    inner
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(tok_err)?;
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}

/// transformers' `generate_merges`: every split of a piece into two pieces that are both in
/// the vocabulary is a merge, ranked by the merged piece's score (higher first), then by
/// longer left and right parts; ties keep vocabulary order.
pub(super) fn merges_from_scores(
    tokens: &[String],
    scores: &[f32],
    vocab: &Vocab,
) -> Vec<(String, String)> {
    struct Candidate<'a> {
        left: &'a str,
        right: &'a str,
        score: f32,
        left_chars: usize,
        right_chars: usize,
    }
    let mut seen: HashSet<&str> = HashSet::with_capacity(tokens.len());
    let mut candidates: Vec<Candidate<'_>> = Vec::new();
    for token in tokens {
        if !seen.insert(token.as_str()) {
            continue;
        }
        let score = scores[vocab[token.as_str()] as usize];
        let mut local: Vec<Candidate<'_>> = token
            .char_indices()
            .skip(1)
            .map(|(at, _)| token.split_at(at))
            .filter(|(l, r)| vocab.contains_key(*l) && vocab.contains_key(*r))
            .map(|(left, right)| Candidate {
                left,
                right,
                score,
                left_chars: left.chars().count(),
                right_chars: right.chars().count(),
            })
            .collect();
        local.sort_by_key(|c| (vocab[c.left], vocab[c.right]));
        candidates.extend(local);
    }
    candidates.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    candidates
        .into_iter()
        .map(|c| (c.left.to_string(), c.right.to_string()))
        .collect()
}
