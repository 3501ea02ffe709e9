//! Incremental detokenisation and stop strings, one [`IncrementalDetokenizer`] per sequence.
//!
//! Text is produced the way vLLM's `detokenize_incrementally` does it: decoding a token on
//! its own loses what its neighbours change (SentencePiece strips a leading space from the
//! first piece, byte-level BPE splits characters across tokens), so each step decodes a short
//! window twice, with and without the new tokens, and keeps the difference. The window is
//! trimmed as text is emitted, so a step costs the same however long the output already is.

use std::sync::Arc;

use crate::engine::stop_strings::{StopScanner, StopStrings};
use crate::engine::tokenizer::{Tokenizer, TokenizerError};
use crate::sequence::StopReason;

/// How many prompt tokens serve as left context for the first generated token (vLLM's
/// `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// The `SamplingParams` fields that shape the output text.
#[derive(Debug, Clone)]
pub struct DetokenizerConfig {
    pub skip_special_tokens: bool,
    /// Accepted for vLLM's API but without effect: vLLM honours it only for slow (Python)
    /// tokenizers, and with a fast tokenizer, the only kind here, its output ignores it.
    pub spaces_between_special_tokens: bool,
    /// The request's stop strings' automaton ([`StopStrings::new`]), shared by its
    /// sequences.
    pub stop: Option<Arc<StopStrings>>,
    /// Keep the stop string at the end of the output instead of cutting it off.
    pub include_stop_str_in_output: bool,
}

impl Default for DetokenizerConfig {
    /// vLLM's `SamplingParams` defaults.
    fn default() -> Self {
        DetokenizerConfig {
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            stop: None,
            include_stop_str_in_output: false,
        }
    }
}

/// Turns one sequence's generated tokens into text as they arrive, and watches for stop
/// strings.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    skip_special_tokens: bool,
    /// The stop strings' automaton and where this output stands in it.
    stop: Option<StopScanner>,
    include_stop_str_in_output: bool,
    /// The tail of prompt + output still needed to decode the next token; the tokens before
    /// it have been turned into text for good.
    window: Vec<u32>,
    /// `window[..prefix_offset]` is gone from view; `window[prefix_offset..read_offset]` is
    /// context whose text is already emitted; `window[read_offset..]` is not yet emitted
    /// (it ends mid-character, or decodes to nothing so far).
    prefix_offset: usize,
    read_offset: usize,
    /// `decode(window[prefix_offset..read_offset])`, cached because it changes only when
    /// text is emitted.
    prefix_text: Option<String>,
    output_text: String,
    /// The text of the tokens not yet emitted, as decoded at the last step: it ends in an
    /// incomplete character.
    held_back: String,
    /// Length of `visible_text()` in bytes.
    visible_len: usize,
    finished: bool,
}

impl IncrementalDetokenizer {
    /// `prompt_ids`: the prompt, used as left context so the first output token decodes
    /// with the right leading space (as vLLM's prefix_offset/read_offset scheme does).
    /// Nothing is decoded yet (the first `push` decodes the context, where a failure can be
    /// reported), so the tokenizer goes unused for now.
    pub fn new(_tokenizer: &Tokenizer, prompt_ids: &[u32], cfg: DetokenizerConfig) -> Self {
        // One more token than the context proper, so that a context whose first token
        // continues a character cut at its left still has that character's start (vLLM keeps
        // two extra for the same reason).
        let tail = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS + 2)..];
        IncrementalDetokenizer {
            skip_special_tokens: cfg.skip_special_tokens,
            stop: cfg.stop.map(StopScanner::new),
            include_stop_str_in_output: cfg.include_stop_str_in_output,
            window: tail.to_vec(),
            prefix_offset: tail.len().saturating_sub(PROMPT_CONTEXT_TOKENS),
            read_offset: tail.len(),
            prefix_text: None,
            output_text: String::new(),
            held_back: String::new(),
            visible_len: 0,
            finished: false,
        }
    }

    /// Appends one generated token. Returns `Some(stop)` when a stop string now appears in
    /// the output text; the text is then cut at the stop string's start (or its end with
    /// `include_stop_str_in_output`) and the sequence is done. Tokens pushed after that are
    /// ignored.
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        token: u32,
    ) -> Result<Option<StopReason>, TokenizerError> {
        if self.finished {
            return Ok(None);
        }
        self.window.push(token);
        let full = self.decode_window(tokenizer)?;
        let prefix = self.prefix_text(tokenizer)?;
        let new = if full.len() > prefix.len() {
            new_text(prefix, &full)
        } else {
            ""
        };
        // A trailing U+FFFD is most likely a character whose remaining bytes are still to
        // come; wait for them rather than emit a replacement character.
        if new.is_empty() || full.ends_with('\u{FFFD}') {
            // Kept for `finish`, which has no tokenizer to decode with.
            self.held_back.clear();
            self.held_back.push_str(new);
            return Ok(None);
        }
        let new_start = self.output_text.len();
        self.output_text.push_str(new);
        self.held_back.clear();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.window.len();
        self.prefix_text = None;
        // Drop what no later step will decode, which keeps the window short.
        self.window.drain(..self.prefix_offset);
        self.read_offset -= self.prefix_offset;
        self.prefix_offset = 0;

        if let Some(stop) = self.find_stop(new_start) {
            return Ok(Some(stop));
        }
        self.visible_len = self.output_text.len() - self.stop_prefix_suffix_len();
        Ok(None)
    }

    /// All text decoded so far (after truncation on stop).
    pub fn output_text(&self) -> &str {
        &self.output_text
    }

    /// The prefix of [`output_text`](Self::output_text) safe to show while streaming: it
    /// never ends in part of a character, and, until the sequence is finished, holds back a
    /// suffix that might still grow into a stop string and be cut. It only ever grows.
    pub fn visible_text(&self) -> &str {
        &self.output_text[..self.visible_len]
    }

    /// Whether a stop string or [`finish`](Self::finish) has ended the sequence.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Call when the sequence finishes for another reason (EOS, length): everything becomes
    /// visible, including bytes held back in the hope that they would complete a character.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        // The held-back bytes never completed a character; a full decode of the output
        // shows them as U+FFFD too.
        self.output_text.push_str(&self.held_back);
        self.held_back.clear();
        self.visible_len = self.output_text.len();
    }

    fn decode_window(&self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        tokenizer.decode(&self.window[self.prefix_offset..], self.skip_special_tokens)
    }

    fn prefix_text(&mut self, tokenizer: &Tokenizer) -> Result<&str, TokenizerError> {
        if self.prefix_text.is_none() {
            let ids = &self.window[self.prefix_offset..self.read_offset];
            self.prefix_text = Some(tokenizer.decode(ids, self.skip_special_tokens)?);
        }
        Ok(self.prefix_text.as_deref().unwrap_or_default())
    }

    /// Looks for a stop string completed by the text from `new_start` on; on a hit, cuts
    /// the output and finishes the sequence. Earlier occurrences would have stopped the
    /// sequence when their last byte arrived, so only one ending in the new text can be
    /// here; the earliest start wins, so that no part of any stop string is left in the text.
    fn find_stop(&mut self, new_start: usize) -> Option<StopReason> {
        let hit = self
            .stop
            .as_mut()?
            .feed(new_start, &self.output_text[new_start..])?;
        let cut = if self.include_stop_str_in_output {
            hit.start + hit.pattern.len()
        } else {
            hit.start
        };
        self.output_text.truncate(cut);
        self.finished = true;
        self.visible_len = self.output_text.len();
        Some(StopReason::String(hit.pattern))
    }

    /// Length of the longest suffix of the output that is a proper prefix of a stop string.
    /// With `include_stop_str_in_output` nothing need be held: a stop found later ends in
    /// text not yet produced, so the cut falls after everything already there.
    fn stop_prefix_suffix_len(&self) -> usize {
        match &self.stop {
            Some(scanner) if !self.include_stop_str_in_output => scanner.pending(),
            _ => 0,
        }
    }
}

/// What `full`, the window's text, adds to `prefix`, the text of the window's context.
fn new_text<'a>(prefix: &str, full: &'a str) -> &'a str {
    match full.strip_prefix(prefix) {
        Some(new) => new,
        // The new tokens changed how the context decodes (a decoder's clean-up, say); like
        // vLLM, take everything past the context's length in characters.
        None => {
            let skip = prefix.chars().count();
            full.char_indices()
                .nth(skip)
                .map_or("", |(at, _)| &full[at..])
        }
    }
}

#[cfg(test)]
mod tests;
