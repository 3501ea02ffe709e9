//! OpenAI's strict mode for JSON schemas (`response_format.json_schema.strict`, the
//! Responses route's `text.format.strict`, forced tool calls): every object takes only the
//! properties its schema lists, and all of them. OpenAI refuses a strict schema that does
//! not say so itself; we say it for the client, so a strict schema written loosely is
//! held to what OpenAI would have made the client write. What a schema states outright
//! (`additionalProperties: true`, a schema for the extra properties) is kept.

use serde_json::{Map, Value};

/// Keywords whose value is one subschema.
const ONE: &[&str] = &[
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
];
/// Keywords whose value is a list of subschemas.
const LIST: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems", "items"];
/// Keywords whose value maps names to subschemas.
const MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Calls `f` on `schema` and on each of its subschemas, found by keyword: the names in
/// `properties` are data, not keywords, so a property called `properties` is not taken for
/// one. Recursion is bounded by the parser's nesting limit (128 for request bodies).
fn for_each_schema(schema: &mut Value, f: &mut impl FnMut(&mut Map<String, Value>)) {
    let Value::Object(o) = schema else {
        return;
    };
    f(o);
    for key in ONE {
        if let Some(sub @ Value::Object(_)) = o.get_mut(*key) {
            for_each_schema(sub, f);
        }
    }
    for key in LIST {
        if let Some(Value::Array(subs)) = o.get_mut(*key) {
            subs.iter_mut().for_each(|s| for_each_schema(s, f));
        }
    }
    for key in MAP {
        if let Some(Value::Object(subs)) = o.get_mut(*key) {
            subs.values_mut().for_each(|s| for_each_schema(s, f));
        }
    }
}

/// `additionalProperties: false` on every object schema that lists `properties` without
/// saying whether others may come.
pub(crate) fn close_objects(schema: &mut Value) {
    for_each_schema(schema, &mut |o| {
        if o.contains_key("properties") && !o.contains_key("additionalProperties") {
            o.insert("additionalProperties".into(), Value::Bool(false));
        }
    });
}

/// OpenAI's strict mode: objects closed as [`close_objects`] does, and every property
/// they list required (OpenAI's strict schemas list all of them in `required`; an
/// optional field is written as a union with `null`). Any output that follows the result
/// also follows `schema`.
pub(crate) fn make_strict(schema: &mut Value) {
    close_objects(schema);
    for_each_schema(schema, &mut |o| {
        let Some(Value::Object(props)) = o.get("properties") else {
            return;
        };
        let mut required: Vec<Value> = match o.get("required") {
            Some(Value::Array(r)) => r.clone(),
            _ => Vec::new(),
        };
        let listed: std::collections::HashSet<&str> =
            required.iter().filter_map(Value::as_str).collect();
        let missing: Vec<Value> = (props.keys())
            .filter(|k| !listed.contains(k.as_str()))
            .map(|k| Value::from(k.as_str()))
            .collect();
        if !missing.is_empty() {
            required.extend(missing);
            o.insert("required".into(), Value::Array(required));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strict_closes_every_object_and_requires_every_property() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                // A property called like a keyword is a property, not a keyword.
                "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {}}}},
                "open": {"type": "object", "properties": {"k": {}}, "additionalProperties": true},
            },
            "required": ["name"],
            "$defs": {"d": {"anyOf": [{"type": "object", "properties": {"a": {}}}]}},
        });
        make_strict(&mut s);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["required"], json!(["name", "properties", "tags", "open"]));
        let p = &s["properties"];
        assert!(p.get("additionalProperties").is_none(), "{p}");
        assert_eq!(p["properties"]["additionalProperties"], false);
        assert_eq!(p["properties"]["required"], json!(["x"]));
        assert_eq!(p["tags"]["items"]["additionalProperties"], false);
        assert_eq!(p["tags"]["items"]["required"], json!(["t"]));
        // Said outright: kept.
        assert_eq!(p["open"]["additionalProperties"], true);
        let d = &s["$defs"]["d"]["anyOf"][0];
        assert_eq!(
            (&d["additionalProperties"], &d["required"]),
            (&json!(false), &json!(["a"]))
        );
    }

    #[test]
    fn closing_leaves_requirements_and_schemas_without_properties_alone() {
        let mut s = json!({"type": "object", "properties": {"a": {"type": "object"}}});
        close_objects(&mut s);
        assert_eq!(
            s,
            json!({"type": "object", "properties": {"a": {"type": "object"}},
                   "additionalProperties": false})
        );
    }
}
