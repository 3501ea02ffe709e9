//! vLLM's `StructuredOutputsParams`: the one constraint a request's completions must
//! follow (a JSON schema, any JSON object, a regular expression, one of a list of strings,
//! or a Lark grammar), with vLLM's field names and messages.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::structural_tag::StructuralTag;
use super::ValidationError;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
// vLLM's other fields (whitespace and fallback options) are accepted and ignored, as
// vLLM's server ignores fields it does not know.
#[serde(default)]
pub struct StructuredOutputsParams {
    /// A JSON schema, as an object or as its text.
    pub json: Option<Value>,
    /// A regular expression the whole completion matches.
    pub regex: Option<String>,
    /// The completion is one of these strings.
    pub choice: Option<Vec<String>>,
    /// A context-free grammar in llguidance's Lark dialect.
    pub grammar: Option<String>,
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub json_object: Option<bool>,
    /// JSON without whitespace between its tokens (vLLM's option); by default any is allowed.
    pub disable_any_whitespace: bool,
    /// vLLM's `structural_tag` (its JSON text, or the object): free text, with JSON after
    /// trigger strings (`structural_tag.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structural_tag: Option<Value>,
}

/// The constraint a [`StructuredOutputsParams`] names.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    JsonSchema(Value),
    JsonObject,
    Regex(String),
    Choice(Vec<String>),
    Grammar(String),
    StructuralTag(StructuralTag),
}

/// Grammars and schemas larger than this are refused before they are compiled: 1 MiB of
/// text already compiles to more than llguidance's default grammar-size limit.
pub const MAX_CONSTRAINT_BYTES: usize = 1 << 20;

impl StructuredOutputsParams {
    pub fn json_schema(schema: Value) -> Self {
        Self {
            json: Some(schema),
            ..Self::default()
        }
    }

    /// Any JSON object.
    pub(crate) fn json_object() -> Self {
        Self {
            json_object: Some(true),
            ..Self::default()
        }
    }

    pub fn regex(regex: impl Into<String>) -> Self {
        Self {
            regex: Some(regex.into()),
            ..Self::default()
        }
    }

    pub fn choice(choice: Vec<String>) -> Self {
        Self {
            choice: Some(choice),
            ..Self::default()
        }
    }

    pub fn grammar(grammar: impl Into<String>) -> Self {
        Self {
            grammar: Some(grammar.into()),
            ..Self::default()
        }
    }

    /// The one constraint asked for; none, two, an empty choice list, a schema that is not
    /// JSON, or one past [`MAX_CONSTRAINT_BYTES`] is refused.
    pub fn constraint(&self) -> Result<Constraint, ValidationError> {
        let err = |m: String| ValidationError::new(Some("structured_outputs"), m);
        let given: Vec<&str> = [
            ("json", self.json.is_some()),
            ("regex", self.regex.is_some()),
            ("choice", self.choice.is_some()),
            ("grammar", self.grammar.is_some()),
            ("json_object", self.json_object == Some(true)),
            ("structural_tag", self.structural_tag.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        match given.len() {
            0 => {
                return Err(err(
                    "You must use one kind of structured outputs constraint but none are \
                     specified (json, regex, choice, grammar, json_object or structural_tag)"
                        .into(),
                ))
            }
            1 => {}
            _ => {
                return Err(err(format!(
                    "You can only use one kind of structured outputs constraint but multiple \
                     are specified: {}",
                    given.join(", ")
                )))
            }
        }
        let size = |n: usize, what: &str| {
            if n > MAX_CONSTRAINT_BYTES {
                Err(err(format!(
                    "the {what} is {n} bytes, more than the {MAX_CONSTRAINT_BYTES} allowed"
                )))
            } else {
                Ok(())
            }
        };
        if let Some(json) = &self.json {
            let schema = match json {
                Value::String(text) => {
                    size(text.len(), "JSON schema")?;
                    serde_json::from_str(text)
                        .map_err(|e| err(format!("the JSON schema is not valid JSON: {e}")))?
                }
                other => other.clone(),
            };
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(err("a JSON schema must be an object or a boolean".into()));
            }
            size(schema.to_string().len(), "JSON schema")?;
            return Ok(Constraint::JsonSchema(schema));
        }
        if let Some(regex) = &self.regex {
            size(regex.len(), "regex")?;
            return Ok(Constraint::Regex(regex.clone()));
        }
        if let Some(choice) = &self.choice {
            if choice.is_empty() {
                return Err(err("choice must list at least one string".into()));
            }
            size(choice.iter().map(String::len).sum(), "choice list")?;
            return Ok(Constraint::Choice(choice.clone()));
        }
        if let Some(grammar) = &self.grammar {
            size(grammar.len(), "grammar")?;
            return Ok(Constraint::Grammar(grammar.clone()));
        }
        if let Some(tag) = &self.structural_tag {
            size(tag.to_string().len(), "structural_tag")?;
            return StructuralTag::parse(tag)
                .map(Constraint::StructuralTag)
                .map_err(err);
        }
        Ok(Constraint::JsonObject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exactly_one_constraint_is_taken() {
        let two = StructuredOutputsParams {
            regex: Some("a+".into()),
            choice: Some(vec!["x".into()]),
            ..Default::default()
        };
        let e = two.constraint().unwrap_err().to_string();
        assert!(e.contains("multiple are specified: regex, choice"), "{e}");
        let none = StructuredOutputsParams::default().constraint().unwrap_err();
        assert!(none.to_string().contains("none are specified"));
        assert_eq!(
            StructuredOutputsParams::regex("a+").constraint().unwrap(),
            Constraint::Regex("a+".into())
        );
    }

    #[test]
    fn a_schema_may_come_as_text_but_must_be_json() {
        let text = StructuredOutputsParams::json_schema(json!("{\"type\": \"integer\"}"));
        assert_eq!(
            text.constraint().unwrap(),
            Constraint::JsonSchema(json!({"type": "integer"}))
        );
        let bad = StructuredOutputsParams::json_schema(json!("{type"));
        assert!(bad
            .constraint()
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
        let number = StructuredOutputsParams::json_schema(json!(3));
        assert!(number.constraint().is_err());
    }

    #[test]
    fn empty_or_huge_constraints_are_refused() {
        let empty = StructuredOutputsParams::choice(Vec::new());
        assert!(empty
            .constraint()
            .unwrap_err()
            .to_string()
            .contains("at least one"));
        let huge = StructuredOutputsParams::regex("a".repeat(MAX_CONSTRAINT_BYTES + 1));
        assert!(huge
            .constraint()
            .unwrap_err()
            .to_string()
            .contains("more than"));
    }
}
