//! Stop strings found as the output grows, at a cost per new byte that does not depend on
//! how many stop strings a request has or how long they are.
//!
//! An Aho-Corasick automaton over the stop strings' bytes is built once per request (the
//! server builds it off the engine thread, after reserving its memory:
//! `CheckedParams::with_stop_strings`) and shared by every sequence of the request; each
//! sequence keeps only its state, fed the bytes its output gains. The state's depth is the
//! longest suffix of the output that begins a stop string, which is exactly what streaming
//! must hold back; each state also knows the longest stop string that ends there, so the
//! earliest-starting match in new text is found in one pass.
//!
//! The trie is laid out breadth first from the sorted strings, so a node's children are
//! consecutive nodes (sorted by byte) and depth only grows with the node's number: a node
//! costs 13 bytes, not a heap allocation of its own.

use std::sync::Arc;

/// The automaton: a trie of the stop strings with failure links.
#[derive(Debug)]
pub struct StopStrings {
    patterns: Vec<String>,
    /// The byte on the edge into each node (the root's is unused).
    label: Vec<u8>,
    /// Node `v`'s children are `first_child[v]..first_child[v + 1]`.
    first_child: Vec<u32>,
    /// The longest proper suffix of each node's string that is also a trie node.
    fail: Vec<u32>,
    /// The longest stop string that ends at each node (its own or a suffix's), by index;
    /// `NONE` where none does.
    longest_match: Vec<u32>,
    /// The first node of each depth (breadth-first numbering), and one past the last node.
    depth_start: Vec<u32>,
}

const ROOT: u32 = 0;
const NONE: u32 = u32::MAX;

impl StopStrings {
    /// The automaton for `patterns`; empty strings are dropped (they would match before any
    /// output). `None` if no pattern remains.
    pub fn new(patterns: &[String]) -> Option<Arc<Self>> {
        let patterns: Vec<String> = patterns.iter().filter(|p| !p.is_empty()).cloned().collect();
        if patterns.is_empty() {
            return None;
        }
        let mut s = StopStrings::trie(patterns);
        s.link();
        Some(Arc::new(s))
    }

    /// At most what the automaton of `count` strings of `total_bytes` in all holds, for a
    /// request's memory budget: a node per byte at most, and the strings themselves.
    pub(crate) fn bytes_for(total_bytes: usize, count: usize) -> usize {
        // label, first_child, fail, longest_match, and the child count while building.
        const NODE: usize = 1 + 4 + 4 + 4 + 4;
        (total_bytes + 1) * NODE + total_bytes + count * std::mem::size_of::<String>()
    }

    /// The trie, built level by level from the strings in byte order: the nodes of one
    /// depth are the distinct prefixes of that length, which sorted order lists grouped by
    /// parent, parents in the order of the level above, so numbering them as they come is
    /// breadth first with each node's children consecutive and sorted.
    fn trie(patterns: Vec<String>) -> Self {
        // Stable, so of duplicates the first keeps its node.
        let mut order: Vec<u32> = (0..patterns.len() as u32).collect();
        order.sort_by(|&a, &b| patterns[a as usize].cmp(&patterns[b as usize]));
        let total: usize = patterns.iter().map(String::len).sum();
        let mut s = StopStrings {
            label: Vec::with_capacity(total + 1),
            first_child: Vec::with_capacity(total + 2),
            fail: Vec::new(),
            longest_match: Vec::with_capacity(total + 1),
            depth_start: vec![0, 1],
            patterns,
        };
        s.label.push(0);
        s.longest_match.push(NONE);
        // Children per node, turned into `first_child` at the end.
        let mut children: Vec<u32> = vec![0];
        // Each string still long enough, with its node one level up.
        let mut active: Vec<(u32, u32)> = order.iter().map(|&p| (p, ROOT)).collect();
        let mut depth = 0;
        while !active.is_empty() {
            depth += 1;
            let mut prev: Option<(u32, u8, u32)> = None; // parent, byte, node
            let mut next = Vec::with_capacity(active.len());
            for &(p, parent) in &active {
                let bytes = s.patterns[p as usize].as_bytes();
                let b = bytes[depth - 1];
                let node = match prev {
                    Some((pp, pb, n)) if pp == parent && pb == b => n,
                    _ => {
                        let n = s.label.len() as u32;
                        s.label.push(b);
                        s.longest_match.push(NONE);
                        children.push(0);
                        children[parent as usize] += 1;
                        n
                    }
                };
                prev = Some((parent, b, node));
                if bytes.len() == depth {
                    let m = &mut s.longest_match[node as usize];
                    if *m == NONE {
                        *m = p;
                    }
                } else {
                    next.push((p, node));
                }
            }
            s.depth_start.push(s.label.len() as u32);
            active = next;
        }
        // Children are numbered in their parents' order, after the root.
        let mut at = 1u32;
        for c in children {
            s.first_child.push(at);
            at += c;
        }
        s.first_child.push(at);
        s
    }

    fn child(&self, node: u32, byte: u8) -> Option<u32> {
        let (lo, hi) = (
            self.first_child[node as usize] as usize,
            self.first_child[node as usize + 1] as usize,
        );
        self.label[lo..hi]
            .binary_search(&byte)
            .ok()
            .map(|i| (lo + i) as u32)
    }

    /// Failure links and inherited matches, in node order (breadth first: a node's failure
    /// target is shallower, so it is complete by the time the node is reached).
    fn link(&mut self) {
        let n = self.label.len();
        self.fail = vec![ROOT; n];
        for node in 0..n as u32 {
            let (lo, hi) = (
                self.first_child[node as usize],
                self.first_child[node as usize + 1],
            );
            for child in lo..hi {
                let fail = if node == ROOT {
                    ROOT
                } else {
                    self.step(self.fail[node as usize], self.label[child as usize])
                };
                self.fail[child as usize] = fail;
                // A node's own pattern is longer than any that ends at a suffix of it.
                if self.longest_match[child as usize] == NONE {
                    self.longest_match[child as usize] = self.longest_match[fail as usize];
                }
            }
        }
    }

    /// The state after `byte` from `node`.
    fn step(&self, mut node: u32, byte: u8) -> u32 {
        loop {
            if let Some(c) = self.child(node, byte) {
                return c;
            }
            if node == ROOT {
                return ROOT;
            }
            node = self.fail[node as usize];
        }
    }

    fn depth(&self, node: u32) -> usize {
        self.depth_start.partition_point(|&s| s <= node) - 1
    }
}

/// One sequence's position in the automaton.
#[derive(Debug, Clone)]
pub(crate) struct StopScanner {
    strings: Arc<StopStrings>,
    state: u32,
}

/// A stop string found in the output: where it starts, and which it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StopMatch {
    pub start: usize,
    pub pattern: String,
}

impl StopScanner {
    pub fn new(strings: Arc<StopStrings>) -> Self {
        StopScanner {
            strings,
            state: ROOT,
        }
    }

    /// Feeds `new`, the bytes the output gained at offset `base`. Of the stop strings that
    /// end in them, returns the one that starts first (the shortest, of those starting
    /// together: it was complete first).
    pub fn feed(&mut self, base: usize, new: &str) -> Option<StopMatch> {
        let mut best: Option<(usize, u32)> = None;
        for (i, &b) in new.as_bytes().iter().enumerate() {
            self.state = self.strings.step(self.state, b);
            let p = self.strings.longest_match[self.state as usize];
            if p == NONE {
                continue;
            }
            let start = base + i + 1 - self.strings.patterns[p as usize].len();
            if best.is_none_or(|(s, _)| start < s) {
                best = Some((start, p));
            }
        }
        best.map(|(start, p)| StopMatch {
            start,
            pattern: self.strings.patterns[p as usize].clone(),
        })
    }

    /// Bytes at the end of the output that begin a stop string: text a later token may
    /// still turn into a stop, so streaming holds it back.
    pub fn pending(&self) -> usize {
        self.strings.depth(self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanner(stops: &[&str]) -> StopScanner {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        StopScanner::new(StopStrings::new(&stops).unwrap())
    }

    /// The naive search the automaton replaces: earliest start, then shortest, among the
    /// stops that end in the new text; and the longest suffix that begins a stop.
    fn naive(stops: &[&str], text: &str, new_start: usize) -> (Option<(usize, String)>, usize) {
        let mut best: Option<(usize, usize, String)> = None;
        for s in stops.iter().filter(|s| !s.is_empty()) {
            for (at, _) in text.match_indices(*s) {
                let end = at + s.len();
                if end > new_start && best.as_ref().is_none_or(|b| (at, end) < (b.0, b.1)) {
                    best = Some((at, end, s.to_string()));
                }
            }
        }
        let pending = stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(move |&l| s.is_char_boundary(l))
                    .map(move |l| &s[..l])
            })
            .filter(|p| text.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        (best.map(|(a, _, s)| (a, s)), pending)
    }

    #[test]
    fn agrees_with_the_naive_search_piece_by_piece() {
        let stops = ["abcde", "bcd", "cd", "x", "ééa", "aab", "ab", ""];
        let text = "zaabcdzzabcdeéébééaxx";
        // Feed in pieces of every size from 1 to 4 bytes (at char boundaries); stop at the
        // first match, as a sequence does.
        for piece in 1..=4 {
            let mut sc = scanner(&stops);
            let mut at = 0;
            while at < text.len() {
                let mut end = (at + piece).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                let got = sc.feed(at, &text[at..end]);
                let (want, pending) = naive(&stops, &text[..end], at);
                assert_eq!(
                    got.map(|m| (m.start, m.pattern)),
                    want,
                    "piece {piece} at {at}"
                );
                if want.is_some() {
                    break;
                }
                assert_eq!(sc.pending(), pending, "piece {piece} at {at}");
                at = end;
            }
        }
    }

    #[test]
    fn earliest_start_wins_then_shortest() {
        let mut sc = scanner(&["bcd", "abcde", "abc"]);
        let m = sc.feed(0, "xabcdef").unwrap();
        assert_eq!((m.start, m.pattern.as_str()), (1, "abc"));
        assert!(StopStrings::new(&["".to_string()]).is_none());
    }

    /// A long stop list costs its size once, at build time; feeding costs per byte.
    #[test]
    fn many_long_stop_strings() {
        let stops: Vec<String> = (0..2000)
            .map(|i| format!("{i:04}{}", "q".repeat(500)))
            .collect();
        let mut sc = StopScanner::new(StopStrings::new(&stops).unwrap());
        let text = format!("0017{}", "q".repeat(499));
        assert_eq!(sc.feed(0, &text), None);
        assert_eq!(sc.pending(), text.len());
        let m = sc.feed(text.len(), "q").unwrap();
        assert_eq!((m.start, m.pattern), (0, stops[17].clone()));
    }

    /// Random lists over a small alphabet (many shared prefixes, duplicates, strings that
    /// are suffixes of others) against the naive search, fed a byte at a time.
    #[test]
    fn random_lists_agree_with_the_naive_search() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let word = |rng: &mut rand_chacha::ChaCha8Rng, max: usize| -> String {
            let len = rng.random_range(1..=max);
            (0..len)
                .map(|_| (b'a' + rng.random_range(0..3u8)) as char)
                .collect()
        };
        for _ in 0..300 {
            let count = rng.random_range(1..12);
            let stops: Vec<String> = (0..count).map(|_| word(&mut rng, 5)).collect();
            let refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let text = word(&mut rng, 40);
            let mut sc = StopScanner::new(StopStrings::new(&stops).unwrap());
            for at in 0..text.len() {
                let got = sc.feed(at, &text[at..at + 1]);
                let (want, pending) = naive(&refs, &text[..at + 1], at);
                assert_eq!(
                    got.map(|m| (m.start, m.pattern)),
                    want,
                    "{stops:?} in {text:?}"
                );
                if want.is_some() {
                    break;
                }
                assert_eq!(sc.pending(), pending, "{stops:?} in {text:?} at {at}");
            }
        }
    }

    #[test]
    fn empty_strings_are_dropped_and_the_size_bound_holds() {
        let a = StopStrings::new(&["shared-a".into(), "".into(), "shared-b".into()]).unwrap();
        assert_eq!(a.patterns, ["shared-a", "shared-b"]);
        // The bound covers what was built: a node per byte at most.
        assert!(a.label.len() <= 16 + 1);
        assert!(StopStrings::new(&["".to_string()]).is_none());
    }
}
