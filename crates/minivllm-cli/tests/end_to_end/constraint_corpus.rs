//! Constraints an attacker would send, each under the 1 MiB constraint limit, through every
//! route that takes one, against a server under a 2 GiB address-space cap: wide objects
//! (10,000 required properties overflowed a tokio thread's stack and aborted the server),
//! long `$ref` chains, recursion, deep nesting, many alternatives, long patterns, long
//! Lark rule chains. Each gets 200 or a 400 naming its limit, the server lives, and another
//! client's greedy requests keep their answers meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::common::{model, StopOnDrop};
use crate::server::{request, start_capped, Server};

fn post(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = request(server.port, "POST", path, Some(&body.to_string())).unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:.300}"));
    (status, v)
}

fn object(props: impl Iterator<Item = (String, Value)>, required: bool) -> Value {
    let props: Map<String, Value> = props.collect();
    let mut o = json!({"type": "object", "properties": props});
    if required {
        o["required"] = props_keys(&o);
    }
    o
}

fn props_keys(o: &Value) -> Value {
    o["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| json!(k))
        .collect()
}

/// Object schemas (tools' parameters must be objects), each under 1 MiB.
fn schemas() -> Vec<(&'static str, Value)> {
    let wide = |n: usize, required| {
        object(
            (0..n).map(|i| (format!("p{i}"), json!({"type": "integer"}))),
            required,
        )
    };
    let chain = |n: usize| {
        let mut defs: Map<String, Value> = (0..n)
            .map(|i| {
                let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
                (
                    format!("d{i}"),
                    object([("a".to_string(), next)].into_iter(), true),
                )
            })
            .collect();
        defs.insert(format!("d{n}"), json!({"type": "integer"}));
        json!({"type": "object", "properties": {"root": {"$ref": "#/$defs/d0"}},
               "$defs": defs})
    };
    let mut deep = json!({"type": "integer"});
    for _ in 0..40 {
        deep = object([("a".to_string(), deep)].into_iter(), true);
    }
    let variants: Vec<Value> = (0..2_000)
        .map(|i| object([(format!("k{i}"), json!({"const": i}))].into_iter(), true))
        .collect();
    vec![
        ("10,000 required properties", wide(10_000, true)),
        ("6,000 optional properties", wide(6_000, false)),
        ("a 1,500-long $ref chain", chain(1_500)),
        ("a 300-long $ref chain", chain(300)),
        ("40 nested objects", deep),
        (
            "a recursive tree",
            json!({"type": "object", "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
                "properties": {"root": {"$ref": "#/$defs/node"}}}),
        ),
        (
            "2,000 anyOf objects",
            json!({"type": "object", "properties": {"x": {"anyOf": variants}}}),
        ),
        (
            "a 200,000-character pattern",
            json!({"type": "object", "properties": {"s": {"type": "string",
                "pattern": "a".repeat(200_000)}}}),
        ),
    ]
}

/// The widest, longest and deepest schemas that fit in 1 MiB.
fn one_route_schemas() -> Vec<(&'static str, Value)> {
    // Names of at most four characters: 80,000 optional properties in 0.9 MB.
    let names = (0..80_000).map(radix36);
    let widest = object(names.map(|n| (n, json!(true))), false);
    let mut deepest = json!({"type": "integer"});
    // Each level is two of the parser's 128 nesting levels.
    for _ in 0..60 {
        deepest = json!({"type": "array", "items": deepest});
    }
    vec![
        ("80,000 optional properties", widest),
        (
            "a 60,000-value enum",
            json!({"enum": (0..60_000).map(|i| format!("v{i}")).collect::<Vec<_>>()}),
        ),
        (
            "1,000 oneOf constants",
            json!({"oneOf": (0..1_000).map(|i| json!({"const": i})).collect::<Vec<_>>()}),
        ),
        ("60 nested arrays", deepest),
    ]
}

fn radix36(mut i: u32) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = Vec::new();
    loop {
        s.push(DIGITS[(i % 36) as usize]);
        i /= 36;
        if i == 0 {
            break;
        }
    }
    s.reverse();
    String::from_utf8(s).unwrap()
}

/// The request bodies of every route that takes a schema.
fn routes(schema: &Value) -> Vec<(&'static str, &'static str, Value)> {
    let user = json!([{"role": "user", "content": "Fill it in."}]);
    let tool = json!([{"type": "function", "function": {"name": "f", "parameters": schema}}]);
    vec![
        (
            "completions structured_outputs",
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 3, "structured_outputs": {"json": schema}}),
        ),
        (
            "completions guided_json",
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 3, "guided_json": schema}),
        ),
        (
            "chat response_format strict",
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 3, "response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
        ),
        (
            "chat tools required",
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 3, "tools": tool, "tool_choice": "required"}),
        ),
        (
            "chat tools named",
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 3, "tools": tool,
                   "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        ),
        (
            "Anthropic tools",
            "/v1/messages",
            json!({"model": "smol", "max_tokens": 3, "messages": user,
                   "tools": [{"name": "f", "input_schema": schema}],
                   "tool_choice": {"type": "any"}}),
        ),
        (
            "Responses text.format",
            "/v1/responses",
            json!({"input": "x", "max_output_tokens": 3, "text": {"format": {
                "type": "json_schema", "name": "x", "schema": schema, "strict": true}}}),
        ),
        (
            "Responses tools",
            "/v1/responses",
            json!({"input": "x", "max_output_tokens": 3, "tool_choice": "required",
                   "tools": [{"type": "function", "name": "f", "parameters": schema}]}),
        ),
    ]
}

fn greedy(server: &Server) -> String {
    let body = json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    let (status, v) = post(server, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[cfg(target_os = "linux")]
#[test]
fn every_constraint_under_the_size_limit_gets_200_or_a_400_naming_its_limit() {
    let server = start_capped(
        &model(),
        2 << 30,
        &["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    );
    let answer = greedy(&server);
    let done = AtomicBool::new(false);
    let slowest = std::thread::scope(|scope| {
        // Set however this scope ends: a failed assertion must not leave the watcher
        // running, which the scope would wait for forever.
        let _stop = StopOnDrop(&done);
        let watch = scope.spawn(|| {
            let mut slowest = Duration::ZERO;
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                assert_eq!(greedy(&server), answer);
                slowest = slowest.max(t.elapsed());
                std::thread::sleep(Duration::from_millis(100));
            }
            slowest
        });
        let mut lark = String::from("start: r0\n");
        for i in 0..5_000 {
            lark.push_str(&format!("r{i}: r{} \"x\"\n", i + 1));
        }
        lark.push_str("r5000: \"a\"\n");
        let lark_body =
            json!({"prompt": "x", "max_tokens": 3, "structured_outputs": {"grammar": lark}});
        let cases = schemas().into_iter().flat_map(|(what, schema)| {
            routes(&schema)
                .into_iter()
                .map(move |(route, path, body)| (format!("{what} via {route}"), path, body))
        });
        let lark_case = (
            "a 5,000-rule Lark chain".to_string(),
            "/v1/completions",
            lark_body,
        );
        // Through one route: the routes share the compiler, and these bodies are large.
        let one_route = one_route_schemas().into_iter().map(|(what, schema)| {
            let body =
                json!({"prompt": "x", "max_tokens": 3, "structured_outputs": {"json": schema}});
            (what.to_string(), "/v1/completions", body)
        });
        for (what, path, body) in cases.chain([lark_case]).chain(one_route) {
            assert!(body.to_string().len() < 1 << 20, "{what}: over 1 MiB");
            let t = Instant::now();
            let (status, v) = post(&server, path, &body);
            let msg = v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            eprintln!("{what}: {status} in {:?} {msg:.160}", t.elapsed());
            assert!(status == 200 || status == 400, "{what}: {status} {v:.300}");
            if status == 400 {
                // A limit, or a feature llguidance does not take (`oneOf`).
                assert!(
                    ["allowed", "too large", "limit", "not supported"]
                        .iter()
                        .any(|w| msg.contains(w)),
                    "{what}: the 400 names no limit: {msg}"
                );
            }
        }
        done.store(true, Ordering::Relaxed);
        watch.join().unwrap()
    });
    // Printed, not asserted: a timing other tests on the same cores would upset.
    eprintln!("the other client's slowest greedy request meanwhile: {slowest:?}");
    assert_eq!(greedy(&server), answer);
}

/// The keys of every object in `v` that `schema` does not list, as paths.
fn keys_outside(schema: &Value, v: &Value, path: &str, out: &mut Vec<String>) {
    let Some(o) = v.as_object() else { return };
    let props = schema["properties"].as_object().unwrap();
    for (k, child) in o {
        match props.get(k) {
            Some(s) => keys_outside(s, child, &format!("{path}.{k}"), out),
            None => out.push(format!("{path}.{k}")),
        }
    }
    for k in props.keys().filter(|k| !o.contains_key(*k)) {
        out.push(format!("{path}.{k} (missing)"));
    }
}

/// OpenAI's strict mode: schemas that leave `additionalProperties` unsaid and list some
/// properties as optional still get exactly their properties, all of them, sampled at
/// temperature 1 through chat's `response_format` and the Responses route's `text.format`.
#[test]
fn strict_schemas_yield_exactly_their_properties() {
    let server = crate::server::start_with(&model(), &[]);
    let schemas = [
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
               "age": {"type": "integer", "minimum": 0, "maximum": 120}}}),
        json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
               "location": {"type": "object", "properties": {"lat": {"type": "number"},
               "lon": {"type": "number"}}}}, "required": ["city"]}),
        json!({"type": "object", "properties": {"ok": {"type": "boolean"},
               "tags": {"type": "array", "maxItems": 2, "items": {"type": "object",
               "properties": {"t": {"enum": ["a", "b"]}}}}}}),
    ];
    for schema in &schemas {
        let body = json!({"messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "temperature": 1, "n": 8, "seed": 3, "max_tokens": 120,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema, "strict": true}}});
        let (status, v) = post(&server, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        // A reply the token limit cut (a number's digits may run on) cannot be whole JSON;
        // the seeded chat replies are checked whole, and so is the unseeded Responses reply
        // unless its status says the limit cut it.
        let mut texts: Vec<String> = (v["choices"].as_array().unwrap().iter())
            .filter(|c| c["finish_reason"] != "length")
            .map(|c| c["message"]["content"].as_str().unwrap().to_string())
            .collect();
        assert!(!texts.is_empty(), "every chat reply cut by the limit: {v}");
        let body = json!({"input": "Describe a person as JSON.", "temperature": 1,
            "max_output_tokens": 120, "text": {"format": {"type": "json_schema", "name": "x",
            "schema": schema, "strict": true}}});
        let (status, v) = post(&server, "/v1/responses", &body);
        assert_eq!(status, 200, "{v}");
        let responses_text = (v["output"].as_array().unwrap().iter())
            .flat_map(|item| item["content"].as_array().into_iter().flatten())
            .find_map(|part| part["text"].as_str())
            .unwrap_or_else(|| panic!("no output text: {v}"))
            .to_string();
        if v["status"] == "incomplete" {
            assert_eq!(
                v["incomplete_details"]["reason"], "max_output_tokens",
                "{v}"
            );
        } else {
            texts.push(responses_text);
        }
        for text in &texts {
            let value: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("{e}: not JSON under {schema}: {text}"));
            let mut outside = Vec::new();
            keys_outside(schema, &value, "", &mut outside);
            assert!(outside.is_empty(), "{outside:?} in {text} under {schema}");
        }
    }
}
