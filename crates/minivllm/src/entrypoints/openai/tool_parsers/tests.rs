use super::*;

fn call(name: &str, arguments: &str) -> ParsedToolCall {
    ParsedToolCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// Feeds `text` one character at a time: each unfinished result must extend the one before
/// (what a stream sends is never taken back), and the finished one must extend the last.
/// Returns the finished result.
fn streamed(parser: &dyn ToolParser, text: &str) -> ParsedOutput {
    let mut before = ParsedOutput::default();
    for end in crate::testing::prefix_ends(text) {
        let now = parser.parse(&text[..end], false);
        assert_extends(&before, &now, &text[..end]);
        before = now;
    }
    let done = parser.parse(text, true);
    if !done.tool_calls.is_empty() || before.tool_calls.is_empty() {
        assert_extends(&before, &done, text);
    }
    done
}

fn assert_extends(before: &ParsedOutput, now: &ParsedOutput, text: &str) {
    assert!(
        now.content.starts_with(&before.content),
        "content went back at {text:?}: {before:?} -> {now:?}"
    );
    assert!(
        now.tool_calls.len() >= before.tool_calls.len(),
        "a call went away at {text:?}"
    );
    for (b, n) in before.tool_calls.iter().zip(&now.tool_calls) {
        assert_eq!(b.name, n.name, "a name changed at {text:?}");
        assert!(
            n.arguments.starts_with(&b.arguments),
            "arguments went back at {text:?}: {b:?} -> {n:?}"
        );
    }
}

#[test]
fn hermes_reads_qwen_calls_with_content_before() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let out = streamed(&HermesToolParser, text);
    assert_eq!(out.content, "Let me check.\n");
    assert_eq!(
        out.tool_calls,
        [
            call("get_weather", r#"{"city": "Paris", "unit": "°C"}"#),
            call("get_time", "{}")
        ]
    );
}

#[test]
fn hermes_streams_arguments_in_pieces_and_holds_back_a_marker() {
    let p = HermesToolParser;
    assert_eq!(p.parse("Sure <tool", false).content, "Sure ");
    assert_eq!(p.parse("Sure <tool", true).content, "Sure <tool");
    let out = p.parse(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"ab",
        false,
    );
    assert_eq!(out.tool_calls, [call("f", "{\"q\": \"ab")]);
    // Before the name is whole there is no call to send.
    assert!(p
        .parse("<tool_call>\n{\"name\": \"f", false)
        .tool_calls
        .is_empty());
}

#[test]
fn hermes_text_that_is_not_a_call_stays_content() {
    for text in [
        "no calls here",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
        "<tool_call>\nnot json\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
    ] {
        let out = streamed(&HermesToolParser, text);
        assert_eq!(out, ParsedOutput::content(text), "{text:?}");
    }
    // Unclosed at the end of the output (max_tokens): read if the JSON is whole.
    let out = HermesToolParser.parse(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        true,
    );
    assert_eq!(out.tool_calls, [call("f", r#"{"a": 1}"#)]);
}

#[test]
fn hermes_reads_bare_calls_without_the_tags() {
    for text in [
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
    ] {
        let out = streamed(&HermesToolParser, text);
        assert_eq!(out.content, "");
        assert_eq!(
            out.tool_calls,
            [call("get_weather", r#"{"city": "Paris"}"#)]
        );
    }
    // A JSON answer is not a call, and is not streamed as one.
    for text in [
        "{\"name\": \"Ada\", \"age\": 36}",
        "{\"name\": \"f\", \"arguments\": {}} and more",
    ] {
        assert_eq!(
            streamed(&HermesToolParser, text),
            ParsedOutput::content(text)
        );
    }
}

#[test]
fn arguments_given_as_a_json_string_are_unwrapped() {
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>";
    assert_eq!(
        streamed(&HermesToolParser, text).tool_calls,
        [call("f", r#"{"a": 1}"#)]
    );
}

#[test]
fn llama3_json_reads_one_or_several_calls() {
    let text = "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": [1, 2]}}; {\"name\": \"b\", \"parameters\": {}}";
    let out = streamed(&Llama3JsonToolParser, text);
    assert_eq!(out.content, "");
    assert_eq!(
        out.tool_calls,
        [call("a", r#"{"x": [1, 2]}"#), call("b", "{}")]
    );
    let plain = "The answer is 4.";
    assert_eq!(
        streamed(&Llama3JsonToolParser, plain),
        ParsedOutput::content(plain)
    );
    let braces = "{not a call}";
    assert_eq!(
        streamed(&Llama3JsonToolParser, braces),
        ParsedOutput::content(braces)
    );
}

#[test]
fn mistral_reads_both_formats() {
    let text = "Calling.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"k\": \"v\"}}, {\"name\": \"b\", \"arguments\": {}}]";
    let out = streamed(&MistralToolParser, text);
    assert_eq!(out.content, "Calling.");
    assert_eq!(
        out.tool_calls,
        [call("a", r#"{"k": "v"}"#), call("b", "{}")]
    );
    let v11 = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]b{}";
    let out = streamed(&MistralToolParser, v11);
    assert_eq!(
        out.tool_calls,
        [call("get_weather", r#"{"city": "Paris"}"#), call("b", "{}")]
    );
    let broken = "[TOOL_CALLS][{\"name\": ";
    assert_eq!(
        MistralToolParser.parse(broken, true),
        ParsedOutput::content(broken)
    );
}

#[test]
fn pythonic_reads_python_literals_as_json() {
    let text = "[get_weather(city='Paris', days=2, metric=True, extra=None), tools.search(q=\"a \\\"b\\\"\", tags=['x', 'y'], opts={'k': 1.5},)]";
    let out = streamed(&PythonicToolParser, text);
    assert_eq!(
        out.tool_calls,
        [
            call(
                "get_weather",
                r#"{"city": "Paris", "days": 2, "metric": true, "extra": null}"#
            ),
            call(
                "tools.search",
                r#"{"q": "a \"b\"", "tags": ["x", "y"], "opts": {"k": 1.5}}"#
            ),
        ]
    );
    for plain in ["[1, 2, 3]", "Hello", "[f(x=1)] and more"] {
        assert_eq!(
            PythonicToolParser.parse(plain, true),
            ParsedOutput::content(plain)
        );
    }
}

#[test]
fn forced_choices_read_constrained_json() {
    let named = ForcedToolParser::Named("f".into());
    assert_eq!(
        streamed(&named, "{\"a\": 1} ").tool_calls,
        [call("f", r#"{"a": 1}"#)]
    );
    let text = r#"[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]"#;
    let out = streamed(&ForcedToolParser::Required, text);
    assert_eq!(out.tool_calls, [call("a", r#"{"x": 1}"#), call("b", "{}")]);
}

#[test]
fn parser_names_and_detection() {
    for p in ToolParserName::ALL {
        assert_eq!(p.as_str().parse::<ToolParserName>(), Ok(p));
    }
    let err = "nope".parse::<ToolParserName>().unwrap_err();
    assert!(
        err.contains("hermes, llama3_json, mistral, pythonic"),
        "{err}"
    );
    assert_eq!(
        ToolParserName::detect(include_str!(
            "../../../engine/testdata/qwen2.5_chat_template.jinja"
        )),
        Some(ToolParserName::Hermes)
    );
    assert_eq!(ToolParserName::detect("{{ messages }}"), None);
}
