//! The scheduler's queues (waiting, running, swapped): sequences kept in the policy's order
//! as they are inserted, so that no step sorts them again. An arrival under FCFS goes to the
//! back at no cost; a preempted sequence, which arrived earlier, goes back to its place.

use std::collections::VecDeque;

use crate::core::policy::PolicyKey;
use crate::ids::SeqId;

/// Sequences by ascending policy key: the first is served first and preempted last.
#[derive(Debug, Default)]
pub(crate) struct SeqQueue {
    items: VecDeque<(PolicyKey, SeqId)>,
}

impl SeqQueue {
    /// Adds `id` at its place by `key` (keys are unique: they end with the sequence id).
    pub fn insert(&mut self, key: PolicyKey, id: SeqId) {
        let at = self.items.partition_point(|(k, _)| *k < key);
        self.items.insert(at, (key, id));
    }

    pub fn first(&self) -> Option<SeqId> {
        self.items.front().map(|e| e.1)
    }

    pub fn last(&self) -> Option<SeqId> {
        self.items.back().map(|e| e.1)
    }

    pub(crate) fn pop_first(&mut self) -> Option<SeqId> {
        self.items.pop_front().map(|e| e.1)
    }

    /// The `i`-th in order.
    pub fn get(&self, i: usize) -> Option<SeqId> {
        self.items.get(i).map(|e| e.1)
    }

    /// Takes `id` out wherever it is; false if it was not queued.
    pub fn remove(&mut self, id: SeqId) -> bool {
        match self.items.iter().position(|e| e.1 == id) {
            Some(i) => {
                self.items.remove(i);
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.items.iter().map(|e| e.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insertion_keeps_policy_order() {
        let mut q = SeqQueue::default();
        for (key, id) in [
            ((0, 5, 5), 5),
            ((0, 2, 2), 2),
            ((-1, 9, 9), 9),
            ((0, 7, 7), 7),
        ] {
            q.insert(key, SeqId(id));
        }
        let order: Vec<u64> = q.iter().map(|s| s.0).collect();
        assert_eq!(order, [9, 2, 5, 7]);
        assert_eq!((q.first(), q.last()), (Some(SeqId(9)), Some(SeqId(7))));
        assert!(q.remove(SeqId(2)));
        assert!(!q.remove(SeqId(2)));
        assert_eq!(q.pop_first(), Some(SeqId(9)));
        assert_eq!(q.get(1), Some(SeqId(7)));
        assert_eq!(q.len(), 2);
    }
}
