//! vLLM's `structural_tag` constraint (xgrammar's): free text, except that once the model
//! writes one of the `triggers`, what follows must be one of the `structures` that begin
//! with it: its `begin`, JSON following its `schema`, its `end`; then free text again.
//! Tool calls are the use: `<tool_call>` opens a call whose JSON must fit a tool.
//!
//! Compiled as a Lark grammar with llguidance's lazy rules (text up to the first trigger is
//! one lexeme) and lexeme negation (the text after the last structure holds no trigger).
//! Up to three whitespace characters may separate a structure's JSON from its begin and end
//! (Hermes writes `<tool_call>\n{...}\n</tool_call>`), no more: a model that keeps writing
//! newlines there would never finish.

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StructuralTag {
    /// `"structural_tag"` when given (vLLM's `response_format` form carries it).
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub structures: Vec<Structure>,
    pub triggers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Structure {
    pub begin: String,
    pub schema: Value,
    pub end: String,
}

impl StructuralTag {
    /// The tag from vLLM's JSON text or object, checked: triggers not empty, each structure
    /// reachable (its `begin` starts with a trigger), each trigger opening a structure.
    pub fn parse(value: &Value) -> Result<Self, String> {
        let tag: StructuralTag = match value {
            Value::String(text) => serde_json::from_str(text),
            other => serde_json::from_value(other.clone()),
        }
        .map_err(|e| format!("structural_tag is not a valid tag: {e}"))?;
        if tag.kind.as_deref().is_some_and(|k| k != "structural_tag") {
            return Err("structural_tag's type must be \"structural_tag\"".into());
        }
        if tag.triggers.is_empty() || tag.triggers.iter().any(String::is_empty) {
            return Err("structural_tag needs at least one trigger, none empty".into());
        }
        for s in &tag.structures {
            if !tag.triggers.iter().any(|t| s.begin.starts_with(t.as_str())) {
                return Err(format!(
                    "structural_tag: the structure beginning {:?} starts with no trigger",
                    s.begin
                ));
            }
            if !(s.schema.is_object() || s.schema.is_boolean()) {
                return Err(
                    "structural_tag: a structure's schema must be a JSON schema object".into(),
                );
            }
        }
        for t in &tag.triggers {
            if !tag
                .structures
                .iter()
                .any(|s| s.begin.starts_with(t.as_str()))
            {
                return Err(format!(
                    "structural_tag: the trigger {t:?} begins no structure"
                ));
            }
        }
        Ok(tag)
    }

    /// The tag as a Lark grammar for llguidance.
    pub(crate) fn to_lark(&self) -> String {
        let mut lark = String::from("start: (");
        let segments: Vec<String> = (0..self.triggers.len())
            .map(|i| format!("free{i} rest{i}"))
            .collect();
        lark.push_str(&segments.join(" | "));
        lark.push_str(")* tail\n");
        for (i, trigger) in self.triggers.iter().enumerate() {
            // Text up to and including the first trigger: one lazy lexeme.
            lark.push_str(&format!("free{i}[lazy]: /(.|\\n)*/ {}\n", literal(trigger)));
            let alternatives: Vec<String> = self
                .structures
                .iter()
                .enumerate()
                .filter(|(_, s)| s.begin.starts_with(trigger.as_str()))
                .map(|(j, s)| {
                    let rest = &s.begin[trigger.len()..];
                    let rest = if rest.is_empty() {
                        String::new()
                    } else {
                        format!("{} ", literal(rest))
                    };
                    format!("{rest}WS? json{j} WS? {}", literal(&s.end))
                })
                .collect();
            lark.push_str(&format!("rest{i}: {}\n", alternatives.join(" | ")));
        }
        for (j, s) in self.structures.iter().enumerate() {
            lark.push_str(&format!("json{j}: %json {}\n", s.schema));
        }
        let any_trigger: Vec<String> = self.triggers.iter().map(|t| regex_escape(t)).collect();
        lark.push_str(&format!(
            "WS: /[ \\t\\r\\n]{{1,3}}/\ntail: TAIL\nTAIL: /(.|\\n)*/ & ~/(.|\\n)*({})(.|\\n)*/\n",
            any_trigger.join("|")
        ));
        lark
    }
}

/// A Lark string literal (JSON's string syntax).
fn literal(text: &str) -> String {
    Value::from(text).to_string()
}

/// `text` matched literally inside a Lark `/regex/`.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$'
            | '#' | '&' | '-' | '~' | '/' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tags_are_checked() {
        let ok = json!({"type": "structural_tag", "triggers": ["<f="],
            "structures": [{"begin": "<f=a>", "schema": {"type": "object"}, "end": "</f>"}]});
        let tag = StructuralTag::parse(&Value::String(ok.to_string())).unwrap();
        assert_eq!(tag.structures[0].begin, "<f=a>");
        let lark = tag.to_lark();
        assert!(lark.contains(r#"free0[lazy]: /(.|\n)*/ "<f=""#), "{lark}");
        assert!(
            lark.contains(r#"rest0: "a>" WS? json0 WS? "</f>""#),
            "{lark}"
        );
        for (bad, needle) in [
            (
                json!({"triggers": [], "structures": []}),
                "at least one trigger",
            ),
            (
                json!({"triggers": ["<g"], "structures": [{"begin": "<f", "schema": {}, "end": ""}]}),
                "starts with no trigger",
            ),
            (
                json!({"triggers": ["<f", "<g"], "structures": [{"begin": "<f", "schema": {}, "end": ""}]}),
                "begins no structure",
            ),
            (json!({"structures": []}), "not a valid tag"),
        ] {
            let e = StructuralTag::parse(&bad).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        assert_eq!(regex_escape("<a.b/c>"), r"<a\.b\/c>");
    }
}
