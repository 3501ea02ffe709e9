//! Tokens that end a reply beyond the file's own EOS, for vocabularies whose chat formats
//! end a turn with their own markers (as llama.cpp adds them to its end-of-generation set).

use crate::reasoning::gemma4::STOP_TOKENS;

/// gpt-oss's o200k_harmony vocabulary: a reply ends with `<|return|>` or, calling a tool,
/// `<|call|>`; `<|end|>` only ends a message within it (llama.cpp decides the same, for
/// files whose end-of-turn token is `<|end|>`).
pub(super) fn harmony_stops(inner: &tokenizers::Tokenizer, eos_token_ids: &mut Vec<u32>) {
    let (Some(ret), Some(call)) = (
        inner.token_to_id("<|return|>"),
        inner.token_to_id("<|call|>"),
    ) else {
        return;
    };
    if let Some(end) = inner.token_to_id("<|end|>") {
        eos_token_ids.retain(|&id| id != end);
    }
    for id in [ret, call] {
        if !eos_token_ids.contains(&id) {
            eos_token_ids.push(id);
        }
    }
}

/// Gemma 4's vocabulary: the model ends its turn with `<turn|>`, or after tool calls with
/// `<|tool_response>` (the template's opener for the results), beside `<eos>`; llama.cpp
/// stops at all three whatever the file's end-of-turn id says.
pub(super) fn gemma4_stops(inner: &tokenizers::Tokenizer, eos_token_ids: &mut Vec<u32>) {
    let ids = STOP_TOKENS.map(|t| inner.token_to_id(t));
    let [Some(turn_end), Some(response)] = ids else {
        return;
    };
    for id in [turn_end, response] {
        if !eos_token_ids.contains(&id) {
            eos_token_ids.push(id);
        }
    }
}
