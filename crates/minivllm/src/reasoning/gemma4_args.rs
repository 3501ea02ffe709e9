//! Gemma 4's tool-call arguments, `{location:<|"|>Tokyo<|"|>,days:3,units:[<|"|>C<|"|>]}`,
//! turned into JSON text. The chat template writes them this way (keys bare, strings between
//! `<|"|>` marks, numbers, booleans and nested objects and lists as they are), and the model
//! answers in kind.
//!
//! Strings are strings because of their marks, so bare values are read by what they look
//! like: JSON numbers, `true`, `false` and `null` stay so, anything else becomes a string.
//! (vLLM's `gemma4` parser keeps bare values as strings unless the tool's schema says
//! otherwise; reading the format's own types gives the same JSON for what the template
//! writes, schema or not.)
//!
//! The text may be cut anywhere while it is generated: what is returned then only ever grows
//! into the whole's JSON. A key is written once its `:` is read, a bare value once what
//! follows it ends it, a string as far as it goes (less a mark being written), and open
//! objects and lists are closed only when the arguments are `complete`.

const STRING_MARK: &str = "<|\"|>";

enum Frame {
    /// Inside `{ }`: whether a member was written, whether a value is awaited (after `key:`).
    Object { first: bool, value_next: bool },
    /// Inside `[ ]`: whether an item was written.
    List { first: bool },
}

/// The JSON text of the arguments `src` (starting at their `{`), as `json.dumps` writes it
/// (`": "` and `", "`). `complete`: the call's end was read (or the reply ended), so open
/// strings, objects and lists are closed and a last bare value is final.
pub(crate) fn to_json(src: &str, complete: bool) -> String {
    let mut out = String::with_capacity(src.len() + 8);
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    let bytes = src.as_bytes();
    loop {
        while i < src.len() && matches!(bytes[i], b' ' | b'\n' | b'\t' | b'\r' | b',') {
            i += 1;
        }
        let Some(top) = stack.last_mut() else {
            if out.is_empty() && src[i..].starts_with('{') {
                out.push('{');
                stack.push(Frame::Object {
                    first: true,
                    value_next: false,
                });
                i += 1;
                continue;
            }
            // The object closed (or never opened): anything after it is not arguments.
            return out;
        };
        if i >= src.len() {
            break;
        }
        let rest = &src[i..];
        // A closer ends the frame on top, whichever it is (a model's mismatched bracket
        // included): the JSON stays well formed.
        if matches!(bytes[i], b'}' | b']') {
            close(&mut out, stack.pop());
            i += 1;
            continue;
        }
        if let Frame::Object {
            first,
            value_next: value_next @ false,
        } = top
        {
            // A key between marks, if a `:` follows it; else up to the `:`.
            let quoted = rest.strip_prefix(STRING_MARK).and_then(|q| {
                let end = q.find(STRING_MARK)?;
                let after = &q[end + STRING_MARK.len()..];
                let colon = after.len() - after.trim_start().len();
                after[colon..]
                    .starts_with(':')
                    .then(|| (&q[..end], 2 * STRING_MARK.len() + end + colon + 1))
            });
            let (key, used) =
                match quoted.or_else(|| rest.find(':').map(|c| (rest[..c].trim(), c + 1))) {
                    Some(key) => key,
                    None => break,
                };
            if !*first {
                out.push_str(", ");
            }
            *first = false;
            *value_next = true;
            out.push_str(&quote(key));
            out.push_str(": ");
            i += used;
            continue;
        }
        // A value: an object member's or a list item.
        match top {
            Frame::Object { value_next, .. } => *value_next = false,
            Frame::List { first } => {
                if !*first {
                    out.push_str(", ");
                }
                *first = false;
            }
        }
        if let Some(body) = rest.strip_prefix(STRING_MARK) {
            match body.find(STRING_MARK) {
                Some(end) => {
                    out.push_str(&quote(&body[..end]));
                    i += STRING_MARK.len() * 2 + end;
                }
                None => {
                    // Unterminated: as far as it goes, then stop (closed below if complete).
                    let shown = if complete {
                        body
                    } else {
                        &body[..body.len() - partial_mark(body)]
                    };
                    let q = quote(shown);
                    out.push_str(&q[..q.len() - 1]);
                    if complete {
                        out.push('"');
                    }
                    break;
                }
            }
        } else if rest.starts_with('{') {
            out.push('{');
            stack.push(Frame::Object {
                first: true,
                value_next: false,
            });
            i += 1;
        } else if rest.starts_with('[') {
            out.push('[');
            stack.push(Frame::List { first: true });
            i += 1;
        } else {
            let end = rest.find([',', '}', ']']);
            if end.is_none() && !complete {
                // May still grow (`tr` → `true`, `10` → `108`).
                break;
            }
            let raw = rest[..end.unwrap_or(rest.len())].trim();
            out.push_str(&bare(raw));
            i += end.unwrap_or(rest.len());
        }
    }
    if complete {
        while let Some(frame) = stack.pop() {
            close(&mut out, Some(frame));
        }
    }
    out
}

fn close(out: &mut String, frame: Option<Frame>) {
    match frame {
        // A key with no value yet.
        Some(Frame::Object {
            value_next: true, ..
        }) => out.push_str("\"\"}"),
        Some(Frame::Object { .. }) => out.push('}'),
        Some(Frame::List { .. }) => out.push(']'),
        None => {}
    }
}

/// A bare value as JSON: itself when it is a JSON number or literal, else a string.
fn bare(raw: &str) -> String {
    let literal = matches!(raw, "true" | "false" | "null")
        || serde_json::from_str::<serde_json::Number>(raw).is_ok();
    if literal {
        raw.to_string()
    } else {
        quote(raw)
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Bytes at the end of `s` that may be the start of a string mark.
fn partial_mark(s: &str) -> usize {
    (1..STRING_MARK.len())
        .rev()
        .find(|&k| s.ends_with(&STRING_MARK[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_templates_values_become_json() {
        let src = r#"{location:<|"|>San Francisco, "CA"<|"|>,days:3,exact:true,ratio:-0.5e1,note:null,units:[<|"|>C<|"|>,<|"|>F<|"|>],where:{lat:37.7,city:<|"|>{a}<|"|>},tag:fast}"#;
        let json = to_json(src, true);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "location": "San Francisco, \"CA\"", "days": 3, "exact": true, "ratio": -5.0,
                "note": null, "units": ["C", "F"], "where": {"lat": 37.7, "city": "{a}"},
                "tag": "fast"
            })
        );
        assert!(json.starts_with(r#"{"location": "San Francisco, \"CA\"", "days": 3"#));
        assert_eq!(to_json("{}", true), "{}");
        assert_eq!(
            to_json(r#"{<|"|>odd key<|"|>:1}"#, true),
            r#"{"odd key": 1}"#
        );
        // Text after the object is not part of it, a second object included.
        assert_eq!(to_json("{a:1} trailing", true), r#"{"a": 1}"#);
        assert_eq!(to_json("{a:1},{b:2}", true), r#"{"a": 1}"#);
        // A marked key with no `:` after its mark reads up to the `:`.
        assert_eq!(
            to_json(r#"{<|"|>a<|"|>b:1,c:2}"#, true),
            r#"{"<|\"|>a<|\"|>b": 1, "c": 2}"#
        );
    }

    #[test]
    fn cut_short_it_only_grows_and_closes_when_complete() {
        let src = r#"{q:<|"|>rust <|"|>,n:108,deep:{list:[1,[true]],s:<|"|>x<|"|>},last:tr}"#;
        let whole = to_json(src, true);
        let mut before = String::new();
        for end in crate::testing::prefix_ends(src) {
            let now = to_json(&src[..end], false);
            assert!(now.starts_with(&before), "{:?}: {now:?}", &src[..end]);
            assert!(whole.starts_with(&now), "{:?}: {now:?}", &src[..end]);
            assert!(!now.contains('<'), "{:?}: {now:?}", &src[..end]);
            before = now;
        }
        // A bare value waits for what ends it: 10 may be 108.
        assert_eq!(to_json("{n:10", false), r#"{"n": "#);
        // The reply ended mid-call: closed as far as it got.
        assert_eq!(to_json(r#"{q:<|"|>ru"#, true), r#"{"q": "ru"}"#);
        assert_eq!(to_json("{q:", true), r#"{"q": ""}"#);
        assert_eq!(to_json("{l:[1,2", true), r#"{"l": [1, 2]}"#);
        // Malformed: a mismatched closer closes what is open; a key with no value is empty.
        assert_eq!(to_json("{l:[1}, a:}", true), r#"{"l": [1], "a": ""}"#);
    }
}
