//! A chat request's template variables beyond the conversation's own, as vLLM takes them:
//! `chat_template_kwargs` over the server's `--default-chat-template-kwargs`, and what
//! `reasoning_effort` implies (`enable_thinking`, which Gemma 4's and Qwen3's templates read).

/// Variables for a chat template.
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// vLLM's `reasoning_effort` values.
const REASONING_EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// A request's own variables over the server's `defaults`.
pub(crate) fn merged(defaults: &TemplateKwargs, own: Option<&TemplateKwargs>) -> TemplateKwargs {
    let mut kwargs = defaults.clone();
    kwargs.extend(
        own.into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    kwargs
}

/// `kwargs` with `reasoning_effort` given as a variable (gpt-oss's template reads it) and as
/// `enable_thinking` (off for `none`) unless the request's `own` variables set that.
pub(crate) fn with_effort(
    mut kwargs: TemplateKwargs,
    own: Option<&TemplateKwargs>,
    effort: Option<&str>,
) -> TemplateKwargs {
    if let Some(effort) = effort {
        kwargs.insert("reasoning_effort".into(), effort.into());
        if !own.is_some_and(|k| k.contains_key("enable_thinking")) {
            kwargs.insert("enable_thinking".into(), (effort != "none").into());
        }
    }
    kwargs
}

/// Why `effort` is not one of vLLM's values, if it is not.
pub(crate) fn check_effort(effort: Option<&str>) -> Result<(), String> {
    match effort {
        Some(e) if !REASONING_EFFORTS.contains(&e) => Err(format!(
            "reasoning_effort {e:?} is not one of {}",
            REASONING_EFFORTS.join(", ")
        )),
        _ => Ok(()),
    }
}
