//! Just enough of JSON's structure to find values in text that is still being generated:
//! where a value ends, or that it has not ended yet. The spans found are parsed with
//! serde_json once complete; this only has to find their edges.

/// The length of the JSON value at the start of `s`, or `None` when `s` ends inside it.
/// Objects and arrays end at their matching bracket, strings at their closing quote,
/// numbers and literals at the first character that cannot continue them.
pub(crate) fn value_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    match b.first()? {
        b'"' => string_end(b),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = 0;
            while i < b.len() {
                match b[i] {
                    b'"' => {
                        i += string_end(&b[i..])?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => b
            .iter()
            .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            .filter(|&end| end > 0),
    }
}

/// `b` starts with a quote: the length up to and including the closing one.
fn string_end(b: &[u8]) -> Option<usize> {
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

pub(crate) fn skip_ws(s: &str, from: usize) -> usize {
    from + s[from..].len() - s[from..].trim_start().len()
}

/// A member of a JSON object found so far: its key and its value's span, the end `None`
/// while the value is still being written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub key: String,
    pub start: usize,
    pub end: Option<usize>,
}

/// The members of the (possibly unfinished) object at the start of `s`, in order, and the
/// object's length once it is closed. Stops quietly at anything that is not JSON: the
/// complete text is parsed properly before it is trusted.
pub(crate) fn object_members(s: &str) -> (Vec<Member>, Option<usize>) {
    let mut members = Vec::new();
    let b = s.as_bytes();
    if b.first() != Some(&b'{') {
        return (members, None);
    }
    let mut i = 1;
    loop {
        i = skip_ws(s, i);
        match b.get(i) {
            Some(b'}') => return (members, Some(i + 1)),
            Some(b',') => {
                i += 1;
                continue;
            }
            Some(b'"') => {}
            _ => return (members, None),
        }
        let Some(klen) = string_end(&b[i..]) else {
            return (members, None);
        };
        let Ok(key) = serde_json::from_str::<String>(&s[i..i + klen]) else {
            return (members, None);
        };
        i = skip_ws(s, i + klen);
        if b.get(i) != Some(&b':') {
            return (members, None);
        }
        i = skip_ws(s, i + 1);
        if i >= b.len() {
            return (members, None);
        }
        let end = value_end(&s[i..]).map(|len| i + len);
        members.push(Member { key, start: i, end });
        match end {
            Some(end) => i = end,
            None => return (members, None),
        }
    }
}

/// The spans of the objects at the start of `s` separated by any of `separators` (and
/// whitespace), the last one's end `None` while it is being written. Stops at anything
/// else.
pub(crate) fn object_sequence(s: &str, separators: &[u8]) -> Vec<(usize, Option<usize>)> {
    let mut spans = Vec::new();
    let mut i = 0;
    loop {
        i = skip_ws(s, i);
        while s.as_bytes().get(i).is_some_and(|c| separators.contains(c)) {
            i = skip_ws(s, i + 1);
        }
        if s.as_bytes().get(i) != Some(&b'{') {
            return spans;
        }
        let end = value_end(&s[i..]).map(|len| i + len);
        spans.push((i, end));
        match end {
            Some(end) => i = end,
            None => return spans,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_end_where_json_says() {
        assert_eq!(
            value_end(r#"{"a": "}", "b": [1, {"c": 2}]} tail"#),
            Some(30)
        );
        assert_eq!(value_end(r#""x\"y" rest"#), Some(6));
        assert_eq!(value_end("12.5, 3"), Some(4));
        assert_eq!(value_end("true}"), Some(4));
        assert_eq!(value_end(r#"{"a": "}"#), None);
        assert_eq!(value_end("12"), None);
        assert_eq!(value_end(r#""abc\"#), None);
        assert_eq!(value_end(""), None);
    }

    #[test]
    fn members_of_an_unfinished_object() {
        let s = r#"{"name": "f", "arguments": {"city": "Par"#;
        let (m, end) = object_members(s);
        assert_eq!(end, None);
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].key.as_str(), &s[m[0].start..m[0].end.unwrap()]),
            ("name", "\"f\"")
        );
        assert_eq!(
            (m[1].key.as_str(), &s[m[1].start..]),
            ("arguments", r#"{"city": "Par"#)
        );
        assert_eq!(m[1].end, None);
        let s = r#"{"name":"f","arguments":{}} "#;
        let (m, end) = object_members(s);
        assert_eq!(end, Some(s.len() - 1));
        assert_eq!(m[1].end, Some(s.len() - 2));
        // A key still being written is not a member yet.
        assert_eq!(object_members(r#"{"name": "f", "argu"#).0.len(), 1);
    }

    #[test]
    fn sequences_of_objects() {
        let s = r#"{"a": 1}; {"b": 2} ; {"c""#;
        let spans = object_sequence(s, b";");
        assert_eq!(spans.len(), 3);
        assert_eq!(&s[spans[1].0..spans[1].1.unwrap()], r#"{"b": 2}"#);
        assert_eq!(spans[2].1, None);
        assert_eq!(object_sequence("{} junk {}", b",").len(), 1);
    }
}
