//! Python call syntax, as Llama 3.2/4 and some fine-tunes write calls:
//! `[get_weather(city="Paris", days=2), other()]`, the arguments Python literals.

use serde_json::{Map, Number, Value};

use super::{ParsedOutput, ParsedToolCall, ToolParser};

#[derive(Debug, Clone, Copy, Default)]
pub struct PythonicToolParser;

impl ToolParser for PythonicToolParser {
    fn parse(&self, text: &str, finished: bool) -> ParsedOutput {
        let body = text.trim();
        if !body.starts_with('[') {
            if !finished && body.is_empty() {
                return ParsedOutput::default();
            }
            return ParsedOutput::content(text);
        }
        let mut p = Reader { s: body, i: 1 };
        let (calls, result) = p.calls();
        match result {
            Ok(()) if p.at_end() && !calls.is_empty() => ParsedOutput {
                tool_calls: calls,
                ..ParsedOutput::default()
            },
            // Each call is sent once its closing parenthesis is read.
            Err(Stop::Incomplete) if !finished => ParsedOutput {
                tool_calls: calls,
                ..ParsedOutput::default()
            },
            _ => ParsedOutput::content(text),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Stop {
    /// The text ends before the construct does.
    Incomplete,
    Invalid,
}

struct Reader<'a> {
    s: &'a str,
    i: usize,
}

impl Reader<'_> {
    fn ws(&mut self) {
        self.i = super::json_scan::skip_ws(self.s, self.i);
    }

    fn peek(&self) -> Result<u8, Stop> {
        self.s
            .as_bytes()
            .get(self.i)
            .copied()
            .ok_or(Stop::Incomplete)
    }

    fn eat(&mut self, c: u8) -> Result<(), Stop> {
        self.ws();
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(Stop::Invalid)
        }
    }

    fn at_end(&mut self) -> bool {
        self.ws();
        self.i == self.s.len()
    }

    /// The calls of the list, after its `[`: those read whole, and why reading stopped.
    fn calls(&mut self) -> (Vec<ParsedToolCall>, Result<(), Stop>) {
        let mut calls = Vec::new();
        loop {
            self.ws();
            match self.peek() {
                Ok(b']') => {
                    self.i += 1;
                    return (calls, Ok(()));
                }
                Ok(b',') if !calls.is_empty() => self.i += 1,
                Ok(_) => {}
                Err(e) => return (calls, Err(e)),
            }
            match self.call() {
                Ok(call) => calls.push(call),
                Err(e) => return (calls, Err(e)),
            }
        }
    }

    fn call(&mut self) -> Result<ParsedToolCall, Stop> {
        self.ws();
        let name = self.identifier(true)?;
        self.eat(b'(')?;
        let mut args = Map::new();
        loop {
            self.ws();
            match self.peek()? {
                b')' => {
                    self.i += 1;
                    break;
                }
                b',' if !args.is_empty() => {
                    self.i += 1;
                    continue;
                }
                _ => {}
            }
            let key = self.identifier(false)?;
            self.eat(b'=')?;
            let value = self.literal()?;
            args.insert(key, value);
        }
        Ok(ParsedToolCall {
            name,
            arguments: python_json(&Value::Object(args)),
        })
    }

    /// A Python name (dotted for a function: `tools.search`).
    fn identifier(&mut self, dotted: bool) -> Result<String, Stop> {
        let start = self.i;
        let rest = &self.s[start..];
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || (dotted && c == '.')))
            .unwrap_or(rest.len());
        if len == rest.len() {
            return Err(Stop::Incomplete);
        }
        if len == 0 || rest.as_bytes()[0].is_ascii_digit() {
            return Err(Stop::Invalid);
        }
        self.i += len;
        Ok(rest[..len].to_string())
    }

    fn literal(&mut self) -> Result<Value, Stop> {
        self.ws();
        match self.peek()? {
            q @ (b'"' | b'\'') => self.string(q).map(Value::String),
            b'[' | b'(' => {
                let close = if self.peek()? == b'[' { b']' } else { b')' };
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.peek()? == close {
                        self.i += 1;
                        return Ok(Value::Array(items));
                    }
                    if !items.is_empty() {
                        self.eat(b',')?;
                        self.ws();
                        if self.peek()? == close {
                            continue;
                        }
                    }
                    items.push(self.literal()?);
                }
            }
            b'{' => {
                self.i += 1;
                let mut map = Map::new();
                loop {
                    self.ws();
                    if self.peek()? == b'}' {
                        self.i += 1;
                        return Ok(Value::Object(map));
                    }
                    if !map.is_empty() {
                        self.eat(b',')?;
                        self.ws();
                        if self.peek()? == b'}' {
                            continue;
                        }
                    }
                    let key = match self.literal()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    self.eat(b':')?;
                    map.insert(key, self.literal()?);
                }
            }
            _ => {
                let rest = &self.s[self.i..];
                let len = rest
                    .find(|c: char| !(c.is_alphanumeric() || matches!(c, '.' | '-' | '+' | '_')))
                    .ok_or(Stop::Incomplete)?;
                let word = &rest[..len];
                self.i += len;
                match word {
                    "True" => Ok(Value::Bool(true)),
                    "False" => Ok(Value::Bool(false)),
                    "None" => Ok(Value::Null),
                    _ => number(word).ok_or(Stop::Invalid),
                }
            }
        }
    }

    /// A quoted string with Python's common escapes.
    fn string(&mut self, quote: u8) -> Result<String, Stop> {
        let mut out = String::new();
        let mut chars = self.s[self.i + 1..].char_indices();
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' => {
                    let (_, e) = chars.next().ok_or(Stop::Incomplete)?;
                    out.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        '0' => '\0',
                        'u' => {
                            let hex: String = (0..4)
                                .map(|_| chars.next().map(|(_, h)| h).ok_or(Stop::Incomplete))
                                .collect::<Result<_, _>>()?;
                            u32::from_str_radix(&hex, 16)
                                .ok()
                                .and_then(char::from_u32)
                                .ok_or(Stop::Invalid)?
                        }
                        other => other,
                    });
                }
                c if c as u32 == quote as u32 => {
                    self.i += 1 + at + 1;
                    return Ok(out);
                }
                c => out.push(c),
            }
        }
        Err(Stop::Incomplete)
    }
}

fn number(word: &str) -> Option<Value> {
    if let Ok(i) = word.parse::<i64>() {
        return Some(Value::from(i));
    }
    let f = word.parse::<f64>().ok()?;
    Number::from_f64(f).map(Value::Number)
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "`), as vLLM's arguments read.
pub(super) fn python_json(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_json).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.to_string(),
    }
}
