//! The request fields that ask for structured output, in every form clients send them:
//! OpenAI's `response_format`, vLLM's `structured_outputs`, and the older `guided_*`
//! fields; each becomes one `StructuredOutputsParams`.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::sampling_params::{StructuredOutputsParams, ValidationError};
use crate::structured_output::strict_schema::make_strict;

/// OpenAI's `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema {
        json_schema: JsonSchemaFormat,
    },
    /// vLLM's: free text with JSON structures after trigger strings.
    StructuralTag {
        structures: Value,
        triggers: Value,
    },
}

#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    /// Absent: any JSON object.
    pub schema: Option<Value>,
    /// OpenAI's strict mode: every object of the schema closed and all its properties
    /// required (`structured_output/strict_schema.rs`). The output follows the schema
    /// either way; strict also keeps out the keys and the omissions it leaves open.
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StructuredFields {
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputsParams>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
}

impl StructuredFields {
    /// The one constraint the request asks for, if any; asking in two of the forms is an
    /// error (which one would win is not obvious).
    pub fn params(&self) -> Result<Option<StructuredOutputsParams>, ValidationError> {
        let from_format = match &self.response_format {
            None | Some(ResponseFormat::Text) => None,
            Some(ResponseFormat::JsonObject) => Some(StructuredOutputsParams::json_object()),
            Some(ResponseFormat::JsonSchema { json_schema }) => Some(match &json_schema.schema {
                Some(schema) => {
                    let mut schema = schema.clone();
                    if json_schema.strict == Some(true) {
                        make_strict(&mut schema);
                    }
                    StructuredOutputsParams::json_schema(schema)
                }
                None => StructuredOutputsParams::json_object(),
            }),
            Some(ResponseFormat::StructuralTag {
                structures,
                triggers,
            }) => Some(StructuredOutputsParams {
                structural_tag: Some(json!({"type": "structural_tag",
                    "structures": structures, "triggers": triggers})),
                ..Default::default()
            }),
        };
        let guided = StructuredOutputsParams {
            json: self.guided_json.clone(),
            regex: self.guided_regex.clone(),
            choice: self.guided_choice.clone(),
            grammar: self.guided_grammar.clone(),
            ..Default::default()
        };
        let from_guided = (guided != StructuredOutputsParams::default()).then_some(guided);
        let given: Vec<(&'static str, StructuredOutputsParams)> = [
            ("response_format", from_format),
            ("structured_outputs", self.structured_outputs.clone()),
            ("guided_*", from_guided),
        ]
        .into_iter()
        .filter_map(|(name, p)| p.map(|p| (name, p)))
        .collect();
        match given.as_slice() {
            [] => Ok(None),
            [(name, p)] => {
                p.constraint()
                    .map_err(|e| ValidationError::new(Some(name), e.message()))?;
                Ok(Some(p.clone()))
            }
            _ => Err(ValidationError::new(
                Some("response_format"),
                format!(
                    "structured output is asked for in more than one field ({}): use one",
                    given.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> StructuredFields {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn every_form_becomes_one_constraint() {
        let schema = json!({"type": "object"});
        let p = fields(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": true}}}));
        assert_eq!(p.params().unwrap().unwrap().json, Some(schema.clone()));
        let p = fields(json!({"response_format": {"type": "json_object"}}));
        assert_eq!(p.params().unwrap().unwrap().json_object, Some(true));
        let p = fields(json!({"response_format": {"type": "text"}}));
        assert_eq!(p.params().unwrap(), None);
        let p = fields(json!({"guided_choice": ["a", "b"]}));
        assert_eq!(p.params().unwrap().unwrap().choice.unwrap().len(), 2);
        let p = fields(json!({"structured_outputs": {"regex": "a+"}}));
        assert_eq!(p.params().unwrap().unwrap().regex.as_deref(), Some("a+"));
    }

    #[test]
    fn a_strict_schema_is_closed_and_all_required() {
        let schema = json!({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["b"]});
        let format = |strict: Value| {
            let f = fields(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": strict}}}));
            f.params().unwrap().unwrap().json.unwrap()
        };
        let strict = format(json!(true));
        assert_eq!(strict["additionalProperties"], false);
        assert_eq!(strict["required"], json!(["b", "a"]));
        assert_eq!(format(json!(false)), schema);
        assert_eq!(format(Value::Null), schema);
    }

    #[test]
    fn two_forms_or_a_bad_one_are_refused() {
        let p = fields(json!({"guided_regex": "a", "structured_outputs": {"regex": "b"}}));
        let e = p.params().unwrap_err();
        assert!(
            e.message().contains("structured_outputs, guided_*"),
            "{}",
            e.message()
        );
        let p = fields(json!({"guided_choice": []}));
        assert!(p.params().unwrap_err().message().contains("at least one"));
        let p = fields(json!({"guided_regex": "a", "guided_choice": ["b"]}));
        assert!(p.params().unwrap_err().message().contains("multiple"));
    }
}
