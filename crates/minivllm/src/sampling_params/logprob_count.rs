//! How many log-probabilities a position reports: a count, or the whole vocabulary (vLLM's
//! `-1`, in `logprobs`, `prompt_logprobs`, chat's `top_logprobs` and `--max-logprobs`).
//!
//! Kept as a `usize` with [`ALL_LOGPROBS`] for "all": every consumer already clamps a count to
//! the vocabulary (a top-k over a row cannot return more than the row), so "all" needs no
//! branch of its own past validation, and JSON carries it as vLLM does, `-1`.

use serde::{Deserialize, Deserializer, Serializer};

/// The whole vocabulary: what `-1` means as a logprob count.
pub const ALL_LOGPROBS: usize = usize::MAX;

/// `count` with [`ALL_LOGPROBS`] read as the vocabulary's size.
pub fn resolve(count: usize, vocab_size: usize) -> usize {
    if count == ALL_LOGPROBS {
        vocab_size
    } else {
        count
    }
}

/// The count as vLLM writes it: `-1` for all.
pub(crate) fn as_i64(count: usize) -> i64 {
    if count == ALL_LOGPROBS {
        -1
    } else {
        count as i64
    }
}

/// A count for logs and messages: `-1` for all, as it was asked.
pub fn display(count: usize) -> String {
    as_i64(count).to_string()
}

/// Parses a command-line count (`--max-logprobs 20`, `--max-logprobs -1`).
pub fn parse(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(ALL_LOGPROBS),
        Ok(n) if n >= 0 => Ok(n as usize),
        _ => Err(format!(
            "expected a non-negative count or -1 (the whole vocabulary), got {s:?}"
        )),
    }
}

/// An optional count from JSON: `null`, a non-negative integer, or `-1` for all. Any other
/// negative number is refused with vLLM's message.
pub(crate) fn deserialize_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    match Option::<i64>::deserialize(d)? {
        None => Ok(None),
        Some(-1) => Ok(Some(ALL_LOGPROBS)),
        Some(n) if n >= 0 => Ok(Some(n as usize)),
        Some(n) => Err(serde::de::Error::custom(format!(
            "must be a non-negative count or -1 (the whole vocabulary), got {n}"
        ))),
    }
}

/// Writes [`ALL_LOGPROBS`] back as `-1`.
pub(crate) fn serialize_opt<S: Serializer>(count: &Option<usize>, s: S) -> Result<S::Ok, S::Error> {
    match *count {
        None => s.serialize_none(),
        Some(n) => s.serialize_i64(as_i64(n)),
    }
}

/// [`serialize_opt`] for a count that is always there (`EngineArgs::max_logprobs`).
pub(crate) fn serialize<S: Serializer>(count: &usize, s: S) -> Result<S::Ok, S::Error> {
    serialize_opt(&Some(*count), s)
}

/// [`deserialize_opt`] for a count that is always there.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    deserialize_opt(d)?.ok_or_else(|| serde::de::Error::custom("expected a count, got null"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Counts {
        #[serde(
            default,
            deserialize_with = "deserialize_opt",
            serialize_with = "serialize_opt"
        )]
        logprobs: Option<usize>,
        #[serde(deserialize_with = "deserialize", serialize_with = "serialize")]
        max: usize,
    }

    #[test]
    fn minus_one_means_the_whole_vocabulary_both_ways() {
        let c: Counts = serde_json::from_str(r#"{"logprobs": -1, "max": -1}"#).unwrap();
        assert_eq!(c.logprobs, Some(ALL_LOGPROBS));
        assert_eq!(c.max, ALL_LOGPROBS);
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"logprobs":-1,"max":-1}"#
        );
        let c: Counts = serde_json::from_str(r#"{"logprobs": 5, "max": 20}"#).unwrap();
        assert_eq!((c.logprobs, c.max), (Some(5), 20));
        let c: Counts = serde_json::from_str(r#"{"logprobs": null, "max": 0}"#).unwrap();
        assert_eq!((c.logprobs, c.max), (None, 0));
        assert_eq!(resolve(ALL_LOGPROBS, 49152), 49152);
        assert_eq!(resolve(7, 49152), 7);
        assert_eq!(
            (display(ALL_LOGPROBS), display(3)),
            ("-1".into(), "3".into())
        );
    }

    #[test]
    fn other_negative_counts_are_refused() {
        let e = serde_json::from_str::<Counts>(r#"{"logprobs": -2, "max": 1}"#).unwrap_err();
        assert!(e.to_string().contains("non-negative count or -1"), "{e}");
        assert!(serde_json::from_str::<Counts>(r#"{"logprobs": 1.5, "max": 1}"#).is_err());
        assert_eq!(parse("-1"), Ok(ALL_LOGPROBS));
        assert_eq!(parse("20"), Ok(20));
        assert!(parse("-3").unwrap_err().contains("-3"));
        assert!(parse("x").is_err());
    }
}
