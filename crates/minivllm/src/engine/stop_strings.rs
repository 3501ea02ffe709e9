//! Stop strings found as the output grows, at a cost per new byte that does not depend on
//! how many stop strings a request has or how long they are.
//!
//! An Aho-Corasick automaton over the stop strings' bytes is built once per request and
//! shared by its sequences; each sequence keeps only its state, fed the bytes its output
//! gains. The state's depth is the longest suffix of the output that begins a stop string,
//! which is exactly what streaming must hold back; each state also knows the longest stop
//! string that ends there, so the earliest-starting match in new text is found in one pass.

use std::sync::Arc;

/// The automaton: a trie of the stop strings with failure links.
#[derive(Debug)]
pub struct StopStrings {
    patterns: Vec<String>,
    nodes: Vec<Node>,
}

#[derive(Debug, Default)]
struct Node {
    /// Children by byte, sorted.
    next: Vec<(u8, u32)>,
    /// The longest proper suffix of this node's string that is also a trie node.
    fail: u32,
    depth: u32,
    /// The longest stop string that ends here (this node's or a suffix's), by index.
    longest_match: Option<u32>,
}

const ROOT: u32 = 0;

impl StopStrings {
    /// The automaton for `patterns`; empty strings are dropped (they would match before any
    /// output). `None` if no pattern remains.
    pub fn new(patterns: &[String]) -> Option<Arc<Self>> {
        let patterns: Vec<String> = patterns.iter().filter(|p| !p.is_empty()).cloned().collect();
        if patterns.is_empty() {
            return None;
        }
        let mut s = StopStrings {
            patterns,
            nodes: vec![Node::default()],
        };
        for i in 0..s.patterns.len() {
            s.insert(i);
        }
        s.link();
        Some(Arc::new(s))
    }

    fn child(&self, node: u32, byte: u8) -> Option<u32> {
        let next = &self.nodes[node as usize].next;
        next.binary_search_by_key(&byte, |&(b, _)| b)
            .ok()
            .map(|i| next[i].1)
    }

    fn insert(&mut self, pattern: usize) {
        let mut node = ROOT;
        for &b in self.patterns[pattern].as_bytes() {
            node = match self.child(node, b) {
                Some(c) => c,
                None => {
                    let c = self.nodes.len() as u32;
                    let depth = self.nodes[node as usize].depth + 1;
                    self.nodes.push(Node {
                        depth,
                        ..Node::default()
                    });
                    let next = &mut self.nodes[node as usize].next;
                    let at = next.partition_point(|&(x, _)| x < b);
                    next.insert(at, (b, c));
                    c
                }
            };
        }
        // Of duplicates, the first keeps the node.
        self.nodes[node as usize]
            .longest_match
            .get_or_insert(pattern as u32);
    }

    /// Failure links and inherited matches, breadth first (a node's failure target is
    /// shallower, so it is complete by the time the node is reached).
    fn link(&mut self) {
        let mut queue = std::collections::VecDeque::from([ROOT]);
        while let Some(node) = queue.pop_front() {
            for k in 0..self.nodes[node as usize].next.len() {
                let (b, child) = self.nodes[node as usize].next[k];
                let fail = if node == ROOT {
                    ROOT
                } else {
                    self.step(self.nodes[node as usize].fail, b)
                };
                let inherited = self.nodes[fail as usize].longest_match;
                let c = &mut self.nodes[child as usize];
                c.fail = fail;
                // A node's own pattern is longer than any that ends at a suffix of it.
                if c.longest_match.is_none() {
                    c.longest_match = inherited;
                }
                queue.push_back(child);
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
            node = self.nodes[node as usize].fail;
        }
    }
}

/// One sequence's position in the automaton.
#[derive(Debug, Clone)]
pub struct StopScanner {
    strings: Arc<StopStrings>,
    state: u32,
}

/// A stop string found in the output: where it starts, and which it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopMatch {
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
            let Some(p) = self.strings.nodes[self.state as usize].longest_match else {
                continue;
            };
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
        self.strings.nodes[self.state as usize].depth as usize
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
}
