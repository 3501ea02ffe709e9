//! The order in which the scheduler serves sequences, and which it preempts first.

use crate::sequence::Sequence;

/// vLLM's `--scheduling-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Policy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Lower `priority` first, ties by arrival.
    Priority,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Policy::Fcfs),
            "priority" => Ok(Policy::Priority),
            other => Err(format!(
                "unknown scheduling policy {other:?} (expected fcfs or priority)"
            )),
        }
    }
}

/// A sequence's place under a policy: smaller is served first and preempted last. Unique
/// per sequence (it ends with the sequence id).
pub(crate) type PolicyKey = (i64, u64, u64);

impl Policy {
    /// Sort key: smaller is served first and preempted last.
    pub fn key(self, seq: &Sequence) -> PolicyKey {
        let priority = match self {
            Policy::Fcfs => 0,
            Policy::Priority => seq.priority as i64,
        };
        (priority, seq.arrival, seq.id.0)
    }
}
