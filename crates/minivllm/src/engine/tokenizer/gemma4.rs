//! Gemma 4's GGUF tokenizer (`tokenizer.ggml.model = "gemma4"`), as llama.cpp b11434 reads
//! it: BPE over raw UTF-8 (not GPT-2's byte alphabet) with the file's merges, spaces
//! written `▁` and none put in front, the text cut only into runs of newlines and runs of
//! anything else before the merges, unknown bytes as `<0xXX>` tokens.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::SplitDelimiterBehavior;

use super::tok_err;
use crate::model_executor::loader::LoadError;

/// Runs of newlines, and runs of everything else: the only cuts before the merges.
const NEWLINE_RUNS: &str = "[^\\n]+|[\\n]+";

pub(super) fn build_gemma4_bpe(
    vocab: Vocab,
    merges: Merges,
    unk: Option<String>,
) -> Result<tokenizers::Tokenizer, LoadError> {
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let model = builder
        .build()
        .map_err(|e| tok_err(format!("GGUF gemma4 tokenizer: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(model);
    inner
        .with_normalizer(Some(Replace::new(" ", "▁").map_err(tok_err)?))
        .map_err(tok_err)?;
    let split = Split::new(
        SplitPattern::Regex(NEWLINE_RUNS.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(tok_err)?;
    inner.with_pre_tokenizer(Some(split));
    let decoders: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ").map_err(tok_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}
