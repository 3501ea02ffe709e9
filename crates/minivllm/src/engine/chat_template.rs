//! Chat templates: the Jinja templates Hugging Face models ship to turn a conversation into
//! one prompt string.
//!
//! Rendering follows transformers' `apply_chat_template`: `trim_blocks` and `lstrip_blocks`
//! on, the trailing newline dropped, Python string/dict/list methods (`.strip()`,
//! `.startswith()`, `.items()`, ...) available, a `raise_exception(msg)` function, and a
//! `tojson` filter that writes JSON the way Python's `json.dumps` does.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The tools an assistant turn called. Templates test `'tool_calls' in message`, so the
    /// key is given to them only when there are calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` turn: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` turn: the function that answered (some templates print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A function call made by the model, as a later turn hands it back to the template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// A JSON object: templates write it with `tojson`, as transformers gets it from vLLM
    /// (which parses the OpenAI message's argument string first).
    pub arguments: serde_json::Value,
}

/// Why a conversation could not be turned into a prompt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatTemplateError {
    #[error(
        "this model has no chat template (none in tokenizer_config.json, chat_template.jinja \
         or the GGUF metadata); send a plain completion prompt or supply a template"
    )]
    Missing,
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template itself rejected the conversation via `raise_exception`, e.g. roles that
    /// do not alternate. The message is the template's own.
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// The special-token strings a template may refer to.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TemplateTokens<'a> {
    pub bos_token: Option<&'a str>,
    pub eos_token: Option<&'a str>,
}

/// Carried as the source of the minijinja error so a template's deliberate
/// `raise_exception` can be told apart from a bug in the template.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template.
#[derive(Debug)]
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    pub fn new(source: impl Into<String>) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.into())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self { env })
    }

    /// `tools`: OpenAI's tool objects (`{"type": "function", "function": {...}}`), given to
    /// the template as `tools` when there are any, as transformers does. `kwargs`: further
    /// variables (vLLM's `chat_template_kwargs`, e.g. `enable_thinking`); they cannot
    /// replace the conversation's own.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        tokens: TemplateTokens<'_>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        let ctx = minijinja::context! {
            messages => messages.iter().map(message_value).collect::<Vec<_>>(),
            tools => (!tools.is_empty()).then(|| tools.iter().map(json_value).collect::<Vec<_>>()),
            add_generation_prompt => add_generation_prompt,
            bos_token => tokens.bos_token.unwrap_or(""),
            eos_token => tokens.eos_token.unwrap_or(""),
            ..Value::from_pairs(kwargs.iter().map(|(k, v)| (k.as_str(), json_value(v))))
        };
        template.render(ctx).map_err(|e| classify(&e))
    }
}

/// transformers' `strftime_now`: the current UTC time in a C `strftime` format (the codes
/// templates use: `%Y %m %d %H %M %S %b %B %a %A %%`; others are kept as written).
pub fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(format, secs)
}

/// Howard Hinnant's days-to-civil conversion (proleptic Gregorian): the year, month and day
/// `z` days after 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days as i64);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month_name = MONTHS[(month - 1) as usize];
        let day_name = DAYS[(days % 7) as usize];
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('m') => out += &format!("{month:02}"),
            Some('d') => out += &format!("{day:02}"),
            Some('H') => out += &format!("{:02}", secs / 3600),
            Some('M') => out += &format!("{:02}", secs / 60 % 60),
            Some('S') => out += &format!("{:02}", secs % 60),
            Some('B') => out += month_name,
            Some('b') => out += &month_name[..3],
            Some('A') => out += day_name,
            Some('a') => out += &day_name[..3],
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn message_value(message: &ChatMessage) -> Value {
    let mut pairs = vec![
        ("role", Value::from(message.role.as_str())),
        ("content", Value::from(message.content.as_str())),
    ];
    if !message.tool_calls.is_empty() {
        let calls: Vec<Value> = message
            .tool_calls
            .iter()
            .map(|c| {
                Value::from_pairs([
                    ("id", Value::from(c.id.as_str())),
                    ("type", Value::from("function")),
                    (
                        "function",
                        Value::from_pairs([
                            ("name", Value::from(c.name.as_str())),
                            ("arguments", json_value(&c.arguments)),
                        ]),
                    ),
                ])
            })
            .collect();
        pairs.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &message.tool_call_id {
        pairs.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &message.name {
        pairs.push(("name", Value::from(name.as_str())));
    }
    Value::from_pairs(pairs)
}

/// A JSON value as the template sees it, key order kept (Python's dicts keep it, and `tojson`
/// must write tool schemas as transformers does).
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_value(v)))),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML; transformers' does not,
/// and templates that put tool schemas into the prompt must match it byte for byte.
/// transformers also accepts `ensure_ascii`, which minijinja would reject as unknown.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let rest: Kwargs = kwargs
        .args()
        .filter(|k| *k != "ensure_ascii")
        .map(|k| Ok((k.to_string(), kwargs.peek::<Value>(k)?)))
        .collect::<Result<Vec<_>, Error>>()?
        .into_iter()
        .collect();
    let json = minijinja::filters::tojson(value, indent, rest)?;
    Ok(Value::from_safe_string(undo_html_escapes(
        json.as_str().unwrap_or_default(),
    )))
}

/// Turns the `\u003c`-style escapes minijinja adds back into the characters, leaving every
/// other escape (notably `\\`) alone.
fn undo_html_escapes(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut rest = json;
    while let Some(pos) = rest.find('\\') {
        out.push_str(&rest[..pos]);
        let escape = &rest[pos..];
        let plain = match escape.get(..6) {
            Some("\\u003c") => Some('<'),
            Some("\\u003e") => Some('>'),
            Some("\\u0026") => Some('&'),
            Some("\\u0027") => Some('\''),
            _ => None,
        };
        match plain {
            Some(c) => {
                out.push(c);
                rest = &escape[6..];
            }
            None => {
                // Copy the backslash with the character it escapes, so an escaped backslash
                // is never mistaken for the start of a `\u` escape.
                let len = escape[1..].chars().next().map_or(0, char::len_utf8);
                out.push_str(&escape[..1 + len]);
                rest = &escape[1 + len..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// minijinja's display already names the template and line; the chain of sources adds the
/// cause when a function or method failed.
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn classify(err: &Error) -> ChatTemplateError {
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        if let Some(raised) = s.downcast_ref::<RaisedException>() {
            return ChatTemplateError::Raised(raised.0.clone());
        }
        source = s.source();
    }
    ChatTemplateError::Render(describe(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn render(src: &str, messages: &[ChatMessage], gen: bool) -> Result<String, ChatTemplateError> {
        ChatTemplate::new(src)?.render(
            messages,
            &[],
            gen,
            TemplateTokens {
                bos_token: Some("<s>"),
                eos_token: Some("</s>"),
            },
            &Default::default(),
        )
    }

    #[test]
    fn strftime_writes_the_codes_templates_use() {
        // 2026-12-05 14:07:38 UTC, a Saturday.
        let t = 1_796_479_658;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2026-12-05 14:07:38");
        assert_eq!(
            strftime("%d %b %Y, %A (%a) %B 100%%", t),
            "05 Dec 2026, Saturday (Sat) December 100%"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    /// gpt-oss's harmony template (llama.cpp's copy of OpenAI's, `tests/data/templates`):
    /// the system message with today's date and the reasoning effort, the developer message
    /// with the tools as a TypeScript namespace, a past tool call and its result, and the
    /// generation prompt the reply's first header follows.
    #[test]
    fn gpt_oss_harmony_template_renders() {
        let src = include_str!("../../../../tests/data/templates/openai-gpt-oss.jinja");
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: serde_json::json!({"location": "Tokyo"}),
        }];
        let mut result = ChatMessage::new("tool", "{\"temp\": 21}");
        result.tool_call_id = Some("call_1".into());
        let tools = [serde_json::json!({"type": "function", "function": {
            "name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                           "required": ["location"]}}})];
        let out = ChatTemplate::new(src)
            .unwrap()
            .render(
                &[ChatMessage::new("user", "Weather in Tokyo?"), call, result],
                &tools,
                true,
                TemplateTokens {
                    bos_token: None,
                    eos_token: Some("<|return|>"),
                },
                &Default::default(),
            )
            .unwrap();
        let today = strftime_now("%Y-%m-%d");
        assert!(
            out.starts_with("<|start|>system<|message|>You are ChatGPT"),
            "{out}"
        );
        assert!(out.contains(&format!("Current date: {today}")), "{out}");
        assert!(out.contains("Reasoning: medium"), "{out}");
        assert!(out.contains("namespace functions {"), "{out}");
        assert!(out.contains("type get_weather = (_: {"), "{out}");
        assert!(
            out.contains("<|start|>user<|message|>Weather in Tokyo?<|end|>"),
            "{out}"
        );
        assert!(
            out.contains("to=functions.get_weather<|channel|>commentary json<|message|>{\"location\": \"Tokyo\"}<|call|>"),
            "{out}"
        );
        assert!(
            out.contains(
                "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
            ),
            "{out}"
        );
        assert!(out.ends_with("<|start|>assistant"), "{out}");
    }

    /// Gemma 4's template (llama.cpp's copy of Google's, `tests/data/templates`) renders as
    /// transformers 5.19 renders it (`render_jinja_template`, these messages, `<bos>`): thinking
    /// off by default (the empty channel block the reply starts after), turned on by the
    /// `enable_thinking` variable; tools declared in Gemma's own syntax; a past call and its
    /// result, after which the model's turn goes on.
    #[test]
    fn gemma4_template_renders_as_transformers_does() {
        let src = include_str!("../../../../tests/data/templates/google-gemma-4-31B-it.jinja");
        let template = ChatTemplate::new(src).unwrap();
        let tokens = TemplateTokens {
            bos_token: Some("<bos>"),
            eos_token: Some("<eos>"),
        };
        let thinking: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"enable_thinking": true}"#).unwrap();
        let none = serde_json::Map::new();
        let chat = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "What is 2+2?"),
        ];
        let render = |messages: &[ChatMessage], tools: &[serde_json::Value], kwargs| {
            template
                .render(messages, tools, true, tokens, kwargs)
                .unwrap()
        };
        assert_eq!(
            render(&chat, &[], &none),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
        );
        assert_eq!(
            render(&chat, &[], &thinking),
            "<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n"
        );
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: serde_json::json!({"location": "Tokyo", "days": 2}),
        }];
        let mut result = ChatMessage::new("tool", "{\"temp\": 21}");
        result.tool_call_id = Some("call_1".into());
        let tools = [serde_json::json!({"type": "function", "function": {
            "name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {
                "location": {"type": "string", "description": "City"},
                "days": {"type": "integer"}}, "required": ["location"]}}})];
        assert_eq!(
            render(&[ChatMessage::new("user", "Weather in Tokyo?"), call, result], &tools, &thinking),
            "<bos><|turn>system\n<|think|>\n<|tool>declaration:get_weather{description:<|\"|>Weather now<|\"|>,parameters:{properties:{days:{type:<|\"|>INTEGER<|\"|>},location:{description:<|\"|>City<|\"|>,type:<|\"|>STRING<|\"|>}},required:[<|\"|>location<|\"|>],type:<|\"|>OBJECT<|\"|>}}<tool|><turn|>\n<|turn>user\nWeather in Tokyo?<turn|>\n<|turn>model\n<|tool_call>call:get_weather{days:2,location:<|\"|>Tokyo<|\"|>}<tool_call|><|tool_response>response:get_weather{value:<|\"|>{\"temp\": 21}<|\"|>}<tool_response|>"
        );
        // A past reply's thinking is dropped from the history.
        let past = [
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "<|channel>thought\nGreet.<channel|>Hello!"),
            ChatMessage::new("user", "Bye"),
        ];
        assert_eq!(
            render(&past, &[], &none),
            "<bos><|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n<|turn>user\nBye<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
        );
        // The conversation's own variables are not replaced by kwargs.
        let clash: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"messages": [], "add_generation_prompt": false}"#).unwrap();
        assert_eq!(render(&chat, &[], &clash), render(&chat, &[], &none));
    }

    #[test]
    fn smollm2_template_adds_default_system_prompt() {
        let out = render(
            SMOLLM2_TEMPLATE,
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn smollm2_template_keeps_given_system_prompt() {
        let out = render(
            SMOLLM2_TEMPLATE,
            &[
                ChatMessage::new("system", "Be terse."),
                ChatMessage::new("user", "Hi"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    const STRICT_TEMPLATE: &str = "\
{{ bos_token }}
{% for message in messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message.role.startswith('user') %}
[INST] {{ message['content'].strip() }} [/INST]
    {% else %}
{{ message.content | trim }}{{ eos_token }}
    {% endif %}
{% endfor %}
";

    #[test]
    fn python_methods_and_block_trimming_work() {
        let out = render(
            STRICT_TEMPLATE,
            &[
                ChatMessage::new("user", "  hello  "),
                ChatMessage::new("assistant", " hi "),
            ],
            false,
        )
        .unwrap();
        // trim_blocks eats the newline after each block tag and lstrip_blocks the indentation
        // before it, so only the lines holding text survive.
        assert_eq!(out, "<s>\n[INST] hello [/INST]\nhi</s>\n");
    }

    #[test]
    fn raise_exception_is_reported_with_its_message() {
        let err = render(
            STRICT_TEMPLATE,
            &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
            false,
        )
        .unwrap_err();
        assert_eq!(
            err,
            ChatTemplateError::Raised(
                "Conversation roles must alternate user/assistant/user/assistant/...".into()
            )
        );
    }

    #[test]
    fn syntax_and_render_errors_are_typed() {
        assert!(matches!(
            ChatTemplate::new("{% for m in messages %}"),
            Err(ChatTemplateError::Syntax(_))
        ));
        let err = render(
            "{{ messages[0].content.nosuchmethod() }}",
            &[ChatMessage::new("user", "x")],
            false,
        )
        .unwrap_err();
        assert!(matches!(err, ChatTemplateError::Render(_)), "{err:?}");
    }

    /// Expected text from Python's jinja2 with transformers' settings (trim_blocks,
    /// lstrip_blocks, `tojson` as `json.dumps`), over Qwen2.5's template as its GGUF ships it.
    #[test]
    fn qwen_template_renders_tools_calls_and_results_as_transformers_does() {
        let tools = [serde_json::json!({"type": "function", "function": {
            "name": "get_weather", "description": "Weather <now> & 'here'",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}})];
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: serde_json::json!({"city": "Paris", "days": [1, 2]}),
        }];
        let mut result = ChatMessage::new("tool", r#"{"temp": 21}"#);
        result.tool_call_id = Some("call_1".into());
        let mut second = ChatMessage::new("tool", "sunny");
        second.tool_call_id = Some("call_2".into());
        let messages = [
            ChatMessage::new("user", "Weather in Paris?"),
            call,
            result,
            second,
        ];
        let out = ChatTemplate::new(include_str!("testdata/qwen2.5_chat_template.jinja"))
            .unwrap()
            .render(
                &messages,
                &tools,
                true,
                TemplateTokens::default(),
                &Default::default(),
            )
            .unwrap();
        let expected: String = serde_json::from_str(r#""<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather <now> & 'here'\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n""#).unwrap();
        assert_eq!(out, expected);
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let out = render(
            "{{ {'a': '<b>&\\'', 'n': [1, 2], 'u': 'é\\\\u003c'} | tojson(ensure_ascii=False) }}",
            &[],
            false,
        )
        .unwrap();
        assert_eq!(out, r#"{"a": "<b>&'", "n": [1, 2], "u": "é\\u003c"}"#);
    }
}
