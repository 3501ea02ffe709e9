//! Text <-> token ids, built either from a Hugging Face folder (`tokenizer.json` and friends)
//! or from the vocabulary a GGUF file carries in its metadata.
//!
//! Both paths end in a `tokenizers::Tokenizer`. BOS/EOS are added here rather than by the
//! Hugging Face post-processor so that both paths behave the same and `add_bos`/`add_eos`
//! say exactly what `encode(.., true)` does.

use std::path::Path;
use std::sync::OnceLock;

use serde::Deserialize;
use tokenizers::models::bpe::Vocab;
use tokenizers::AddedToken;

use crate::engine::chat_template::{ChatMessage, ChatTemplate, ChatTemplateError, TemplateTokens};
use crate::model_executor::loader::LoadError;

mod gemma4;
mod gguf_bpe;
mod load;
mod stops;
mod vocabulary;
use gguf_bpe::{build_byte_level_bpe, build_sentencepiece_bpe, parse_merges};
pub use load::{gguf_tokenizer_spec, load_tokenizer};
use stops::{gemma4_stops, harmony_stops};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The tokenizer-related GGUF metadata, as plain data so the tokenizer does not depend on
/// the GGUF reader. Each field is the GGUF key of the same name under `tokenizer.ggml.`
/// (`tokenizer.chat_template` for the template); absent keys are `None`/empty.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct GgufTokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer a `gpt2` model uses.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    /// 6 byte).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.scores`: SentencePiece piece scores; required for `llama`.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.merges`: `"left right"` strings; required for `gpt2`.
    pub merges: Vec<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: an end-of-turn token that also ends generation.
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; llama.cpp's default is true for `llama`, false for
    /// `gpt2`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`: whether `llama` models prepend `▁` to text
    /// (default true).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

/// Why text could not be encoded or ids decoded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot encode text: {0}")]
    Encode(String),
    #[error("cannot decode token ids: {0}")]
    Decode(String),
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token_id: Option<u32>,
    /// The tokenizer's own EOS first, then any other id that ends generation.
    eos_token_ids: Vec<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
    /// Compiled on first use: a model whose template does not compile still serves
    /// completions.
    compiled_template: OnceLock<Result<ChatTemplate, ChatTemplateError>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// A token given in `tokenizer_config.json` either as its text or as an added-token object.
#[derive(Deserialize)]
#[serde(untagged)]
enum TokenSpec {
    Text(String),
    Object { content: String },
}

impl TokenSpec {
    fn into_content(self) -> String {
        match self {
            TokenSpec::Text(s) | TokenSpec::Object { content: s } => s,
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateSpec {
    Single(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Deserialize, Default)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<TemplateSpec>,
    #[serde(default)]
    bos_token: Option<TokenSpec>,
    #[serde(default)]
    eos_token: Option<TokenSpec>,
    #[serde(default)]
    add_bos_token: Option<bool>,
    #[serde(default)]
    add_eos_token: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Deserialize, Default)]
struct GenerationConfig {
    #[serde(default)]
    bos_token_id: Option<u32>,
    #[serde(default)]
    eos_token_id: Option<OneOrMany>,
}

fn read_optional(path: &Path) -> Result<Option<String>, LoadError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LoadError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, LoadError> {
    serde_json::from_str(text).map_err(|e| LoadError::Tokenizer(format!("{}: {e}", path.display())))
}

fn tok_err(e: impl std::fmt::Display) -> LoadError {
    LoadError::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Loads `tokenizer.json`, with `tokenizer_config.json`, `chat_template.jinja` and
    /// `generation_config.json` when present, from a Hugging Face model folder.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, LoadError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let Some(tokenizer_json) = read_optional(&tokenizer_path)? else {
            return Err(LoadError::NotFound {
                path: tokenizer_path,
            });
        };
        let bad_tokenizer_json = |e: tokenizers::Error| {
            LoadError::Tokenizer(format!("{}: {e}", tokenizer_path.display()))
        };
        let mut inner = tokenizers::Tokenizer::from_bytes(tokenizer_json.as_bytes())
            .map_err(bad_tokenizer_json)?;
        // Some tokenizer.json files carry training-time truncation or padding; applied here
        // they would silently cut or pad prompts.
        inner.with_truncation(None).map_err(bad_tokenizer_json)?;
        inner.with_padding(None);

        let config_path = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = match read_optional(&config_path)? {
            Some(text) => parse_json(&config_path, &text)?,
            None => TokenizerConfig::default(),
        };
        let generation_path = dir.join("generation_config.json");
        let generation: GenerationConfig = match read_optional(&generation_path)? {
            Some(text) => parse_json(&generation_path, &text)?,
            None => GenerationConfig::default(),
        };

        // transformers lets a standalone chat_template.jinja override the config's template.
        let chat_template = match read_optional(&dir.join("chat_template.jinja"))? {
            Some(t) => Some(t),
            None => match config.chat_template {
                Some(TemplateSpec::Single(t)) => Some(t),
                Some(TemplateSpec::Named(list)) => list
                    .into_iter()
                    .find(|t| t.name == "default")
                    .map(|t| t.template),
                None => None,
            },
        };

        let resolve = |spec: Option<TokenSpec>,
                       fallback_id: Option<u32>,
                       what: &str|
         -> Result<(Option<String>, Option<u32>), LoadError> {
            match spec.map(TokenSpec::into_content) {
                Some(text) => {
                    let id = inner.token_to_id(&text).ok_or_else(|| {
                        LoadError::Tokenizer(format!(
                            "{}: {what} {text:?} is not in the vocabulary",
                            config_path.display()
                        ))
                    })?;
                    Ok((Some(text), Some(id)))
                }
                None => Ok((
                    fallback_id.and_then(|id| inner.id_to_token(id)),
                    fallback_id,
                )),
            }
        };
        let generation_eos: Vec<u32> = match generation.eos_token_id {
            Some(OneOrMany::One(id)) => vec![id],
            Some(OneOrMany::Many(ids)) => ids,
            None => Vec::new(),
        };
        let (bos_token, bos_token_id) =
            resolve(config.bos_token, generation.bos_token_id, "bos_token")?;
        let (eos_token, eos_token_id) = resolve(
            config.eos_token,
            generation_eos.first().copied(),
            "eos_token",
        )?;

        let mut eos_token_ids: Vec<u32> = Vec::new();
        for id in eos_token_id.into_iter().chain(generation_eos) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        // A folder whose generation_config.json leaves them out still ends turns there.
        gemma4_stops(&inner, &mut eos_token_ids);

        // Without explicit flags, ask the folder's own post-processor what it would add
        // around an empty text.
        let probe = inner.encode("", true).map_err(bad_tokenizer_json)?;
        let probe = probe.get_ids();
        let probe_bos = bos_token_id.is_some() && probe.first().copied() == bos_token_id;
        let after_bos = if probe_bos { &probe[1..] } else { probe };
        let probe_eos = eos_token_id.is_some() && after_bos.last().copied() == eos_token_id;

        Ok(Tokenizer {
            inner,
            bos_token_id,
            eos_token_ids,
            bos_token,
            eos_token,
            add_bos: config.add_bos_token.unwrap_or(probe_bos),
            add_eos: config.add_eos_token.unwrap_or(probe_eos),
            chat_template,
            compiled_template: OnceLock::new(),
        })
    }

    /// Builds the tokenizer a GGUF file describes, the way transformers converts it
    /// (`integrations/ggml.py`), with the pre-tokenizer picked from `tokenizer.ggml.pre`
    /// like llama.cpp.
    pub(crate) fn from_gguf_spec(spec: &GgufTokenizerSpec) -> Result<Tokenizer, LoadError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(tok_err("GGUF tokenizer has no tokens"));
        }
        if !spec.token_types.is_empty() && spec.token_types.len() != n {
            return Err(tok_err(format!(
                "GGUF tokenizer has {n} tokens but {} token types",
                spec.token_types.len()
            )));
        }
        let check_id = |id: Option<u32>, what: &str| -> Result<Option<u32>, LoadError> {
            match id {
                Some(id) if id as usize >= n => Err(tok_err(format!(
                    "GGUF {what} {id} is outside the vocabulary of {n} tokens"
                ))),
                _ => Ok(id),
            }
        };
        let bos_token_id = check_id(spec.bos_token_id, "bos_token_id")?;
        let eos_token_id = check_id(spec.eos_token_id, "eos_token_id")?;
        let unk_token_id = check_id(spec.unk_token_id, "unknown_token_id")?;
        check_id(spec.pad_token_id, "padding_token_id")?;
        let eot_token_id = check_id(spec.eot_token_id, "eot_token_id")?;

        // As with a Python dict built from the list, a repeated token keeps its last id.
        let vocab: Vocab = spec
            .tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), id as u32))
            .collect();

        let (mut inner, default_add_bos) = match spec.model.as_str() {
            "gpt2" => (build_byte_level_bpe(spec, vocab)?, false),
            "llama" => (build_sentencepiece_bpe(spec, vocab, unk_token_id)?, true),
            "gemma4" => {
                let unk = unk_token_id.map(|u| spec.tokens[u as usize].clone());
                let merges = parse_merges(spec, "gemma4")?;
                (gemma4::build_gemma4_bpe(vocab, merges, unk)?, true)
            }
            other => {
                return Err(tok_err(format!(
                    "unsupported GGUF tokenizer model {other:?} (supported: gpt2, llama, \
                     gemma4)"
                )))
            }
        };

        let token_type = |id: usize| spec.token_types.get(id).copied();
        let mut special: Vec<AddedToken> = Vec::new();
        let mut user_defined: Vec<AddedToken> = Vec::new();
        for (id, text) in spec.tokens.iter().enumerate() {
            match token_type(id) {
                Some(TOKEN_TYPE_CONTROL) => {
                    special.push(AddedToken::from(text.clone(), true).normalized(false))
                }
                Some(TOKEN_TYPE_USER_DEFINED) => {
                    user_defined.push(AddedToken::from(text.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
        // Without token types, at least never split the tokens the engine itself inserts.
        if spec.token_types.is_empty() {
            for id in [bos_token_id, eos_token_id, unk_token_id, eot_token_id]
                .into_iter()
                .flatten()
            {
                special.push(
                    AddedToken::from(spec.tokens[id as usize].clone(), true).normalized(false),
                );
            }
        }
        inner.add_special_tokens(special).map_err(tok_err)?;
        inner.add_tokens(user_defined).map_err(tok_err)?;

        let text_of = |id: Option<u32>| id.map(|id| spec.tokens[id as usize].clone());
        let mut eos_token_ids: Vec<u32> = eos_token_id.into_iter().collect();
        if let Some(eot) = eot_token_id {
            if !eos_token_ids.contains(&eot) {
                eos_token_ids.push(eot);
            }
        }
        harmony_stops(&inner, &mut eos_token_ids);
        gemma4_stops(&inner, &mut eos_token_ids);
        Ok(Tokenizer {
            inner,
            bos_token_id,
            eos_token_ids,
            bos_token: text_of(bos_token_id),
            eos_token: text_of(eos_token_id),
            // llama.cpp always adds Gemma 4's BOS, whatever the file says.
            add_bos: spec.model == "gemma4" || spec.add_bos.unwrap_or(default_add_bos),
            add_eos: spec.add_eos.unwrap_or(false),
            chat_template: spec.chat_template.clone(),
            compiled_template: OnceLock::new(),
        })
    }

    /// Encodes `text`. Special-token strings in it (`<|im_start|>`, ...) become their ids, as
    /// with Hugging Face; `add_special_tokens` adds BOS/EOS as `add_bos`/`add_eos` say.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let body = encoding.get_ids();
        let bos = self
            .bos_token_id
            .filter(|_| add_special_tokens && self.add_bos);
        let eos = self
            .eos_token_id()
            .filter(|_| add_special_tokens && self.add_eos);
        let mut ids = Vec::with_capacity(body.len() + 2);
        ids.extend(bos);
        ids.extend_from_slice(body);
        ids.extend(eos);
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The token's text as the vocabulary spells it (byte-level `Ġ`, SentencePiece `▁`, ...).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Every id that ends generation; the tokenizer's own EOS comes first.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_ids.first().copied()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    #[cfg(test)]
    pub(crate) fn add_eos(&self) -> bool {
        self.add_eos
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Replaces the model's chat template (e.g. with one given on the command line).
    pub(crate) fn set_chat_template(&mut self, template: Option<String>) {
        self.chat_template = template;
        self.compiled_template = OnceLock::new();
    }

    /// The underlying Hugging Face tokenizer, e.g. for its incremental `decode_stream`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Renders a conversation into a prompt with the model's chat template. Encode the result
    /// with `add_special_tokens = false` if the template writes the BOS itself.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.apply_chat_template_with_tools(
            messages,
            &[],
            add_generation_prompt,
            &Default::default(),
        )
    }

    /// As `apply_chat_template`, with OpenAI's tool objects given to the template as `tools`
    /// and `kwargs` as further variables (vLLM's `chat_template_kwargs`).
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        let source = self
            .chat_template
            .as_deref()
            .ok_or(ChatTemplateError::Missing)?;
        let template = self
            .compiled_template
            .get_or_init(|| ChatTemplate::new(source))
            .as_ref()
            .map_err(Clone::clone)?;
        self.render(template, messages, tools, add_generation_prompt, kwargs)
    }

    /// As `apply_chat_template_with_tools`, with the template `source` given for this call
    /// instead of the model's (vLLM's `LLM.chat(chat_template=...)`).
    pub fn apply_given_chat_template(
        &self,
        source: &str,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        let template = ChatTemplate::new(source)?;
        self.render(&template, messages, tools, add_generation_prompt, kwargs)
    }

    fn render(
        &self,
        template: &ChatTemplate,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        template.render(
            messages,
            tools,
            add_generation_prompt,
            TemplateTokens {
                bos_token: self.bos_token(),
                eos_token: self.eos_token(),
            },
            kwargs,
        )
    }
}

#[cfg(test)]
mod tests;
