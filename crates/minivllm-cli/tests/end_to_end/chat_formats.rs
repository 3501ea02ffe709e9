//! A model's chat format served: its template given with `--chat-template` (Gemma 4's, on the
//! test model, whose own vocabulary spells the markers as text), template variables from the
//! server's defaults and the request, and the parsers that format asks for.

use serde_json::{json, Value};

use crate::common::model;
use crate::server::{request, start_with, Server};

const GEMMA4_TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/data/templates/google-gemma-4-31B-it.jinja"
);

fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = request(server.port, "POST", path, Some(&body.to_string())).unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    (status, v)
}

/// The prompt a chat request with `extra` renders, as `/tokenize` counts it and
/// `/detokenize` gives it back.
fn rendered(server: &Server, extra: &Value) -> (String, u64) {
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let (status, t) = post(server, "/tokenize", body);
    assert_eq!(status, 200, "{t}");
    let (_, d) = post(server, "/detokenize", json!({"tokens": t["tokens"]}));
    (
        d["prompt"].as_str().unwrap().to_string(),
        t["count"].as_u64().unwrap(),
    )
}

/// Gemma 4's template with thinking on by default (`--default-chat-template-kwargs`), off for
/// a request that says so in `chat_template_kwargs` or with `reasoning_effort: "none"`; the
/// tool parser found from the template; a chat completion charged the prompt it rendered.
#[test]
fn gemma4_template_variables_from_the_server_and_the_request() {
    let server = start_with(
        &model(),
        &[
            "--chat-template",
            GEMMA4_TEMPLATE,
            "--reasoning-parser",
            "gemma4",
            // Starts only if the template shows a format it knows: Gemma 4's.
            "--enable-auto-tool-choice",
            "--default-chat-template-kwargs",
            r#"{"enable_thinking": true}"#,
        ],
    );
    let (on, on_count) = rendered(&server, &json!({}));
    assert!(
        on.contains("<|think|>") && on.ends_with("<|turn>model\n"),
        "{on:?}"
    );
    let off_kwargs = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let (off, off_count) = rendered(&server, &off_kwargs);
    assert!(!off.contains("<|think|>"), "{off:?}");
    assert!(
        off.ends_with("<|turn>model\n<|channel>thought\n<channel|>"),
        "{off:?}"
    );
    let chats = [
        (json!({}), on_count),
        (off_kwargs.clone(), off_count),
        (json!({"reasoning_effort": "none"}), off_count),
        // The request's own variable wins over what the effort implies.
        (
            json!({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": true}}),
            on_count,
        ),
    ];
    for (extra, want) in chats {
        let mut body = json!({
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, c) = post(&server, "/v1/chat/completions", body);
        assert_eq!(status, 200, "{extra}: {c}");
        assert_eq!(c["usage"]["prompt_tokens"], want, "{extra}: {c}");
        // The test model writes no Gemma markers: its reply is all answer.
        let message = &c["choices"][0]["message"];
        assert!(
            message["content"].as_str().is_some_and(|t| !t.is_empty()),
            "{c}"
        );
        assert!(message["reasoning_content"].is_null(), "{c}");
    }
    let (status, e) = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "huge"}),
    );
    assert_eq!(
        (status, e["error"]["param"].clone()),
        (400, json!("reasoning_effort")),
        "{e}"
    );
}

/// A bad `--default-chat-template-kwargs` stops the server at its start, naming the flag.
#[test]
fn a_default_chat_template_kwargs_that_is_no_object_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_minivllm"))
        .args([
            "serve",
            "--model",
            &model(),
            "--default-chat-template-kwargs",
            "[1]",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--default-chat-template-kwargs") && err.contains("JSON object"),
        "{err}"
    );
}
