//! Grammars through llguidance (vLLM's `guidance` backend): a request's constraint is
//! compiled once into a parser over the model's token trie, and each of its completions
//! runs its own copy, which gives the step's token mask and follows each token sampled.

use std::sync::Arc;

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::toktrie::TokEnv;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::ids::TokenId;
use crate::sampling_params::{Constraint, StructuredOutputsParams};
use crate::structured_output::limits::{self, COMPILE_STACK_BYTES};
use crate::structured_output::vocabulary::{Vocabulary, VocabularyEnv};
use crate::structured_output::{StructuredOutputGrammar, TokenBitmask};

/// Why a constraint could not become a grammar: the caller's input, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("{0}")]
    Invalid(String),
    /// The tokenizer cannot be described byte by byte (an unknown decoder).
    #[error("structured output is not available for this model: {0}")]
    Unsupported(String),
    /// The server cannot compile now (no thread could be started): not the caller's fault.
    #[error("{0}")]
    Unavailable(String),
}

/// The compiler of every request's constraint, over one model's vocabulary.
pub struct GuidanceBackend {
    factory: ParserFactory,
    /// Compiles running now, at most one per core: each runs on a thread of its own with a
    /// stack of [`COMPILE_STACK_BYTES`] (address space, reserved while it runs).
    compiling: CompileSlots,
}

impl GuidanceBackend {
    /// Builds the token trie of `vocab` over `vocab_size` logits (tens of milliseconds for
    /// a 150k vocabulary).
    pub fn new(vocab: Vocabulary, vocab_size: usize) -> Result<Self, GrammarError> {
        let env: TokEnv =
            Arc::new(VocabularyEnv::new(vocab, vocab_size).map_err(GrammarError::Unsupported)?);
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| GrammarError::Unsupported(e.to_string()))?;
        // Grammar warnings go to the caller as errors or nowhere, not to the server's stderr.
        factory.quiet();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Self {
            factory,
            compiling: CompileSlots::new(cores.min(4)),
        })
    }

    /// Compiles `params`' constraint: a schema llguidance cannot take, a regex or grammar
    /// that does not parse, is an error naming it.
    pub fn compile(
        &self,
        params: &StructuredOutputsParams,
    ) -> Result<Box<dyn StructuredOutputGrammar>, GrammarError> {
        self.compile_after(params, None)
    }

    /// [`compile`](Self::compile), the constraint starting after a free part: `before` is a
    /// Lark rule named `reasoning` (a reasoning parser's thinking) and whether the output
    /// may skip it.
    pub fn compile_after(
        &self,
        params: &StructuredOutputsParams,
        before: Option<(&str, bool)>,
    ) -> Result<Box<dyn StructuredOutputGrammar>, GrammarError> {
        let constraint = params
            .constraint()
            .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        let what = kind(&constraint);
        let mut grammar = top_level_grammar(constraint, params.disable_any_whitespace)
            .map_err(|e| GrammarError::Invalid(format!("{what}: {e}")))?;
        if let Some((rule, optional)) = before {
            grammar = after(grammar, rule, optional);
        }
        let parser = self
            .on_compile_thread(|| self.factory.create_parser(grammar))?
            .map_err(|e| GrammarError::Invalid(format!("{what}: {}", without_backtrace(e))))?;
        let trie = self.factory.tok_env().tok_trie();
        Ok(Box::new(GuidanceGrammar {
            matcher: Matcher::new(Ok(parser)),
            vocab_size: trie.vocab_size(),
            eos: trie.eos_token(),
        }))
    }

    /// Runs `compile` on a thread with a stack for the deepest constraint the limits admit
    /// (`limits.rs`): the caller's own (a tokio worker's 2 MiB, the engine's thread) may
    /// be far smaller, and a stack overflow aborts the whole process.
    fn on_compile_thread<T: Send>(
        &self,
        compile: impl FnOnce() -> T + Send,
    ) -> Result<T, GrammarError> {
        let _slot = self.compiling.take();
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name("minivllm-grammar".into())
                .stack_size(COMPILE_STACK_BYTES)
                .spawn_scoped(scope, compile)
                .map_err(|e| {
                    GrammarError::Unavailable(format!("cannot start a compile thread: {e}"))
                })?;
            thread
                .join()
                .map_err(|_| GrammarError::Invalid("the grammar compiler failed".into()))
        })
    }
}

/// A counting semaphore: compiles beyond the cores' number wait for one to end.
struct CompileSlots {
    free: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

struct CompileSlot<'a>(&'a CompileSlots);

impl CompileSlots {
    fn new(n: usize) -> Self {
        Self {
            free: std::sync::Mutex::new(n),
            freed: std::sync::Condvar::new(),
        }
    }

    fn take(&self) -> CompileSlot<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        CompileSlot(self)
    }
}

impl Drop for CompileSlot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

/// llguidance's message, as the client gets it: without the backtrace an internal limit's
/// assertion (a panic it catches) carries, and cut short: a message may quote the whole
/// constraint, up to a megabyte.
fn without_backtrace(e: impl std::fmt::Display) -> String {
    const MAX_CHARS: usize = 1_000;
    let text = e.to_string();
    let mut message = match text.split_once("\n<backtrace>") {
        Some((message, _)) => format!("{message} (the grammar is too large)"),
        None => text,
    };
    if let Some((cut, _)) = message.char_indices().nth(MAX_CHARS) {
        message.truncate(cut);
        message.push_str(" ...");
    }
    message
}

fn kind(c: &Constraint) -> &'static str {
    match c {
        Constraint::JsonSchema(_) => "invalid JSON schema",
        Constraint::JsonObject => "invalid JSON object grammar",
        Constraint::Regex(_) => "invalid regex",
        Constraint::Choice(_) => "invalid choice",
        Constraint::Grammar(_) => "invalid grammar",
        Constraint::StructuralTag(_) => "invalid structural_tag",
    }
}

/// Between two JSON tokens: one space, or a line break and up to 40 characters of
/// indentation (pretty-printing ten levels deep). llguidance's default allows any run of
/// whitespace, and a small model sampling at temperature 1 can then fill its whole
/// `max_tokens` with blank lines inside an object that never closes (as llama.cpp's JSON
/// grammars, we bound it). A schema's own `x-guidance` whitespace options win.
const JSON_WHITESPACE: &str = r"\x20|\r?\n[\x20\x09]{0,40}";

/// `compact`: JSON without free whitespace (vLLM's `disable_any_whitespace`), an option
/// llguidance reads from the schema's `x-guidance` object; otherwise [`JSON_WHITESPACE`].
fn top_level_grammar(c: Constraint, compact: bool) -> Result<TopLevelGrammar, String> {
    let json = |mut schema: Value| {
        let options = schema
            .as_object_mut()
            .map(|s| s.entry("x-guidance").or_insert_with(|| json!({})))
            .and_then(Value::as_object_mut);
        if let Some(options) = options {
            if compact {
                options.insert("whitespace_flexible".into(), Value::Bool(false));
            } else if !options.contains_key("whitespace_flexible")
                && !options.contains_key("whitespace_pattern")
            {
                options.insert("whitespace_pattern".into(), JSON_WHITESPACE.into());
            }
        }
        TopLevelGrammar::from_json_schema(schema)
    };
    Ok(match c {
        Constraint::JsonSchema(schema) => {
            limits::check_json_schema(&schema)?;
            json(schema)
        }
        Constraint::JsonObject => json(json!({"type": "object"})),
        Constraint::Regex(rx) => TopLevelGrammar::from_regex(&rx),
        // One alternative per choice, each a literal (a JSON string is a Lark literal).
        Constraint::Choice(choices) => {
            let alternatives: Vec<String> = choices
                .iter()
                .map(|c| Value::from(c.as_str()).to_string())
                .collect();
            TopLevelGrammar::from_grammar(GrammarWithLexer::from_lark(format!(
                "start: {}",
                alternatives.join(" | ")
            )))
        }
        Constraint::Grammar(lark) => {
            limits::check_lark(&lark)?;
            TopLevelGrammar::from_lark(lark)
        }
        Constraint::StructuralTag(tag) => {
            let lark = tag.to_lark();
            limits::check_lark(&lark)?;
            TopLevelGrammar::from_lark(lark)
        }
    })
}

/// `grammar` preceded by `rule` (named `reasoning`): a new start grammar refers to the old
/// one by name, as llguidance's `@name` allows.
fn after(mut grammar: TopLevelGrammar, rule: &str, optional: bool) -> TopLevelGrammar {
    const INNER: &str = "constrained";
    grammar.grammars[0].name = Some(INNER.into());
    let start = format!(
        "start: reasoning{} @{INNER}\n{rule}\n",
        if optional { "?" } else { "" }
    );
    grammar
        .grammars
        .insert(0, GrammarWithLexer::from_lark(start));
    grammar
}

/// One completion's place in its grammar.
struct GuidanceGrammar {
    matcher: Matcher,
    vocab_size: usize,
    eos: TokenId,
}

impl std::fmt::Debug for GuidanceGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuidanceGrammar")
            .field("stopped", &self.matcher.is_stopped())
            .field("error", &self.matcher.get_error())
            .finish()
    }
}

impl StructuredOutputGrammar for GuidanceGrammar {
    fn token_mask(&mut self) -> TokenBitmask {
        match self.matcher.compute_mask_or_eos() {
            Ok(mask) => TokenBitmask::from_words(mask.as_slice().to_vec()),
            Err(e) => {
                // Over its limits (or broken): the completion ends here rather than
                // running unconstrained.
                tracing::warn!("structured output stopped: {e}");
                let mut eos = TokenBitmask::new(self.vocab_size);
                eos.allow(self.eos);
                eos
            }
        }
    }

    fn accept_token(&mut self, token: TokenId) {
        if self.matcher.is_stopped() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            tracing::warn!("structured output refused token {token}: {e}");
        }
    }

    fn is_terminated(&self) -> bool {
        self.matcher.is_stopped()
    }

    fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }

    fn box_clone(&self) -> Box<dyn StructuredOutputGrammar> {
        Box::new(GuidanceGrammar {
            matcher: self.matcher.deep_clone(),
            vocab_size: self.vocab_size,
            eos: self.eos,
        })
    }
}
