//! What a constraint may hold before it is compiled. llguidance's compilers recurse: once
//! per property of an object, per `$ref` followed, per Lark rule referring to the next,
//! and a constraint well under the 1 MiB size limit can chain tens of thousands of them,
//! which no thread's stack holds (a 10,000-property schema overflowed tokio's 2 MiB and
//! aborted the server). Compiling optional properties also takes time quadratic in their
//! number (10,000 in one object: 8 s). So a constraint is measured first, and one past
//! these bounds is refused with the bound's name; within them, compiling needs at most a
//! few tens of MiB of stack (`COMPILE_STACK_BYTES`, measured at up to 16 KiB per `$ref`
//! level and 8 KiB per Lark rule level) and a few seconds.

use serde_json::Value;

/// Properties one object schema may list.
pub(crate) const MAX_OBJECT_PROPERTIES: usize = 5_000;
/// Properties a whole constraint may list (OpenAI's strict mode allows 5,000).
pub(crate) const MAX_PROPERTIES: usize = 20_000;
/// Distinct `$ref` targets: a chain of references is at most this long.
pub(crate) const MAX_REF_TARGETS: usize = 1_000;
/// Rules and terminals a Lark grammar (or a structural tag's) may define: a chain of rules
/// referring to the next is at most this long.
pub(crate) const MAX_LARK_DEFINITIONS: usize = 4_000;

/// The stack a compile runs on: the bounds above at the deepest measured cost per level,
/// twice over. Only the pages a compile touches are ever allocated.
pub(crate) const COMPILE_STACK_BYTES: usize = 128 << 20;

/// What a constraint holds, counted.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    properties: usize,
    widest_object: usize,
    ref_targets: std::collections::HashSet<String>,
    lark_definitions: usize,
}

impl Counts {
    /// Every object and array in `schema`, walked without recursion: a schema built in code
    /// (not parsed, so not held to the parser's nesting limit) can be of any depth.
    fn add_schema(&mut self, schema: &Value) {
        let mut pending = vec![schema];
        while let Some(v) = pending.pop() {
            match v {
                Value::Object(o) => {
                    if let Some(Value::Object(props)) = o.get("properties") {
                        self.properties += props.len();
                        self.widest_object = self.widest_object.max(props.len());
                    }
                    if let Some(Value::String(target)) = o.get("$ref") {
                        if !self.ref_targets.contains(target) {
                            self.ref_targets.insert(target.clone());
                        }
                    }
                    pending.extend(o.values());
                }
                Value::Array(a) => pending.extend(a),
                _ => {}
            }
        }
    }

    /// A Lark grammar's definitions (a name at the start of a line, then `:`), and the JSON
    /// schemas it embeds with `%json`.
    fn add_lark(&mut self, lark: &str) {
        for line in lark.split(['\n', '\r']) {
            if is_definition(line) {
                self.lark_definitions += 1;
            }
        }
        let mut rest = lark;
        while let Some(at) = rest.find("%json") {
            rest = &rest[at + "%json".len()..];
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            if let Some(Ok(schema)) = values.next() {
                self.add_schema(&schema);
                rest = &rest[values.byte_offset()..];
            }
        }
    }

    fn check(&self) -> Result<(), String> {
        let over = |what: &str, n: usize, max: usize| {
            Err(format!(
                "the constraint has {n} {what}, more than the {max} allowed \
                 (docs/structured-output.md, \"Limits\")"
            ))
        };
        if self.widest_object > MAX_OBJECT_PROPERTIES {
            return over(
                "properties in one object",
                self.widest_object,
                MAX_OBJECT_PROPERTIES,
            );
        }
        if self.properties > MAX_PROPERTIES {
            return over("properties", self.properties, MAX_PROPERTIES);
        }
        if self.ref_targets.len() > MAX_REF_TARGETS {
            return over(
                "distinct $ref targets",
                self.ref_targets.len(),
                MAX_REF_TARGETS,
            );
        }
        if self.lark_definitions > MAX_LARK_DEFINITIONS {
            return over("grammar rules", self.lark_definitions, MAX_LARK_DEFINITIONS);
        }
        Ok(())
    }
}

/// `[?!]name[.priority]:` after optional indentation: how every Lark rule and terminal
/// definition begins (continuation lines begin with `|`, directives with `%`).
fn is_definition(line: &str) -> bool {
    let line = line.trim_start();
    let line = line.strip_prefix(['?', '!']).unwrap_or(line);
    let name_len = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(line.len());
    if name_len == 0 || line.as_bytes()[0].is_ascii_digit() {
        return false;
    }
    let rest = &line[name_len..];
    // A priority (`.2`), or template parameters and lazy markers (`{x}`, `[lazy]`).
    let rest = rest.trim_start_matches(|c: char| {
        c.is_ascii_digit()
            || matches!(c, '.' | '-' | '{' | '}' | '[' | ']' | ',' | '_')
            || c.is_ascii_alphabetic()
    });
    rest.trim_start().starts_with(':')
}

/// Refuses a JSON schema past the bounds above, naming the bound.
pub(crate) fn check_json_schema(schema: &Value) -> Result<(), String> {
    let mut counts = Counts::default();
    counts.add_schema(schema);
    counts.check()
}

/// Refuses a Lark grammar (and the schemas it embeds) past the bounds above.
pub(crate) fn check_lark(lark: &str) -> Result<(), String> {
    let mut counts = Counts::default();
    counts.add_lark(lark);
    counts.check()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wide(n: usize) -> Value {
        let props: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("p{i}"), json!({}))).collect();
        json!({"type": "object", "properties": props})
    }

    #[test]
    fn wide_objects_many_properties_and_long_ref_chains_are_refused_by_name() {
        assert_eq!(check_json_schema(&wide(MAX_OBJECT_PROPERTIES)), Ok(()));
        let e = check_json_schema(&wide(MAX_OBJECT_PROPERTIES + 1)).unwrap_err();
        assert!(e.contains("5001 properties in one object"), "{e}");
        let many = json!({"anyOf": vec![wide(4_000); 6]});
        let e = check_json_schema(&many).unwrap_err();
        assert!(e.contains("24000 properties, more than the 20000"), "{e}");
        let defs: serde_json::Map<String, Value> = (0..=MAX_REF_TARGETS)
            .map(|i| {
                (
                    format!("d{i}"),
                    json!({"$ref": format!("#/$defs/d{}", i + 1)}),
                )
            })
            .collect();
        let e = check_json_schema(&json!({"$defs": defs})).unwrap_err();
        assert!(e.contains("1001 distinct $ref targets"), "{e}");
        // The same target many times is one.
        let same = json!({"items": vec![json!({"$ref": "#/$defs/a"}); 5_000]});
        assert_eq!(check_json_schema(&same), Ok(()));
    }

    #[test]
    fn a_deep_schema_built_in_code_is_walked_without_recursion() {
        let mut deep = json!({"type": "integer"});
        for _ in 0..200_000 {
            // Moved in, not serialised as `json!` would (recursively).
            deep = Value::Object(serde_json::Map::from_iter([("items".to_string(), deep)]));
        }
        assert_eq!(check_json_schema(&deep), Ok(()));
        // serde_json drops nested values recursively too: take it apart from the top.
        let mut v = deep;
        while let Some(inner) = v.get_mut("items").map(Value::take) {
            v = inner;
        }
    }

    #[test]
    fn lark_definitions_and_embedded_schemas_are_counted() {
        let chain = |n: usize| {
            let mut g = String::from("start: r0\n");
            for i in 0..n {
                g.push_str(&format!("r{i}: r{} \"x\"\n", i + 1));
            }
            g + &format!("?r{n}.2 : \"a\"\n  | \"b\"\nT: /x/\n%ignore T\n")
        };
        assert_eq!(check_lark(&chain(MAX_LARK_DEFINITIONS - 3)), Ok(()));
        let e = check_lark(&chain(MAX_LARK_DEFINITIONS)).unwrap_err();
        assert!(e.contains("4003 grammar rules"), "{e}");
        let embedded = format!("start: %json {}\n", wide(MAX_OBJECT_PROPERTIES + 1));
        assert!(check_lark(&embedded).unwrap_err().contains("in one object"));
        for line in [
            "free0[lazy]: /x/",
            "?a: b",
            "!a : b",
            "A.-1: /x/",
            "t{x}: x",
        ] {
            assert!(is_definition(line), "{line}");
        }
        for line in ["| a b", "%import common.WS", "\"a: b\"", "1a: b", ""] {
            assert!(!is_definition(line), "{line}");
        }
    }
}
