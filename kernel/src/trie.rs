//! One exchange's filters: the exact map and the trie, and the walk of a
//! topic through them (hit codes, see the crate docs).

use hashbrown::{HashMap, HashSet};

use crate::dialect::Dialect;

pub(crate) const NONE: u32 = u32::MAX;

pub(crate) struct Node {
    pub(crate) one: u32,
    pub(crate) many: u32,
    pub(crate) hits_start: u32,
    pub(crate) hits_end: u32,
    pub(crate) is_many: bool,
}

impl Node {
    pub(crate) fn new(is_many: bool) -> Self {
        Node {
            one: NONE,
            many: NONE,
            hits_start: 0,
            hits_end: 0,
            is_many,
        }
    }
}

/// The filters of one exchange. Wildcard-free filters are one hash map keyed
/// by the whole text (`exact`: one lookup, whatever the topic's length; most
/// filters are exact, and a trie walk would cost a memory miss per word at a
/// million of them). The others are a trie, word by word: literal words are
/// interned (`words`); a literal edge is `children[(node << 32) | word]`; the
/// `*`/`+` and `#` edges are fields of the node. A node reached through `#`
/// is a *many* node: it may absorb further words.
pub(crate) struct Trie {
    pub(crate) dialect: Dialect,
    /// Per exact text, its one hit code (`(code, 1)`, the common case: no
    /// second memory read) or where its codes are (`(start, count)` into
    /// `exact_hits`).
    pub(crate) exact: HashMap<TextKey, ExactValue>,
    pub(crate) exact_hits: Vec<Hit>,
    pub(crate) words: HashMap<Box<[u8]>, u32>,
    pub(crate) children: HashMap<u64, u32>,
    pub(crate) nodes: Vec<Node>,
    pub(crate) hits: Vec<Hit>,
}

/// A hit code with, for a subscription slot (`code >= 0`), that slot's rank
/// in (subscriber, id) order: the batch path sorts a topic's slots without
/// reading the per-slot table (a memory miss per subscription at a million).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct Hit {
    pub(crate) code: i64,
    pub(crate) rank: u32,
}

/// An exact text's hits: `count == 1` (the common case), the hit itself;
/// otherwise `hit.code` is where its `count` hits start in `exact_hits`.
#[derive(Clone, Copy)]
pub(crate) struct ExactValue {
    pub(crate) hit: Hit,
    pub(crate) count: u32,
}

/// Longest exact text kept inline in its hash map entry.
pub(crate) const INLINE_TEXT: usize = 30;

/// An exact filter's text as a hash key: short ones (most topics) inline, so
/// that a lookup compares bytes in the table's own memory instead of
/// following a pointer (one memory miss less per topic at a million).
#[derive(Clone)]
pub(crate) enum TextKey {
    Inline(u8, [u8; INLINE_TEXT]),
    Heap(Box<[u8]>),
}

impl TextKey {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            TextKey::Inline(len, bytes) => &bytes[..*len as usize],
            TextKey::Heap(bytes) => bytes,
        }
    }
}

impl From<&[u8]> for TextKey {
    fn from(text: &[u8]) -> Self {
        if text.len() <= INLINE_TEXT {
            let mut bytes = [0u8; INLINE_TEXT];
            bytes[..text.len()].copy_from_slice(text);
            TextKey::Inline(text.len() as u8, bytes)
        } else {
            TextKey::Heap(text.into())
        }
    }
}

impl PartialEq for TextKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for TextKey {}

impl std::hash::Hash for TextKey {
    /// As `[u8]` hashes, so that a `&[u8]` finds its key.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl std::borrow::Borrow<[u8]> for TextKey {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

/// Scratch space of one match, reused across the calls of a thread.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) bounds: Vec<(usize, usize)>,
    pub(crate) word_ids: Vec<u32>,
    pub(crate) stack: Vec<(u32, u32)>,
    pub(crate) seen: HashSet<u64>,
    pub(crate) codes: Vec<Hit>,
    pub(crate) entries: Vec<(u64, u32)>,
    pub(crate) runs: Vec<(usize, usize)>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch space (a fresh one if it is in use).
pub(crate) fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Scratch::default()),
    })
}

impl Trie {
    pub(crate) fn build<S: AsRef<str>>(dialect: Dialect, filters: &[S], codes: &[Hit]) -> Self {
        let mut trie = Trie {
            dialect,
            exact: HashMap::new(),
            exact_hits: Vec::new(),
            words: HashMap::new(),
            children: HashMap::new(),
            nodes: vec![Node::new(false)],
            hits: Vec::new(),
        };
        let mut ends: Vec<(u32, Hit)> = Vec::new();
        let mut exact: Vec<(&[u8], Hit)> = Vec::new();
        let mut bounds = Vec::new();
        let one = dialect.one();
        for (filter, &code) in filters.iter().zip(codes) {
            let text = filter.as_ref().as_bytes();
            dialect.split(text, &mut bounds);
            if !bounds
                .iter()
                .any(|&(s, e)| &text[s..e] == one || &text[s..e] == b"#")
            {
                exact.push((text, code));
                continue;
            }
            let mut node = 0u32;
            for &(s, e) in &bounds {
                let word = &text[s..e];
                node = if word == one {
                    trie.wild_child(node, false)
                } else if word == b"#" {
                    trie.wild_child(node, true)
                } else {
                    trie.literal_child(node, word)
                };
            }
            ends.push((node, code));
        }
        // Each node's (each exact text's) codes contiguous, in a CSR array.
        ends.sort_by_key(|&(node, _)| node);
        for group in ends.chunk_by(|a, b| a.0 == b.0) {
            let start = trie.hits.len() as u32;
            trie.hits.extend(group.iter().map(|&(_, code)| code));
            let n = &mut trie.nodes[group[0].0 as usize];
            n.hits_start = start;
            n.hits_end = trie.hits.len() as u32;
        }
        // Exact texts: number the distinct ones (a key is allocated once, on
        // insertion), then lay their codes out by counting, without sorting.
        trie.exact.reserve(exact.len());
        let mut group_of = Vec::with_capacity(exact.len());
        for &(text, _) in &exact {
            let next = Hit {
                code: trie.exact.len() as i64,
                rank: 0,
            };
            group_of.push(
                trie.exact
                    .entry_ref(text)
                    .or_insert(ExactValue {
                        hit: next,
                        count: 0,
                    })
                    .hit
                    .code as u32,
            );
        }
        let mut starts = vec![0u32; trie.exact.len() + 1];
        for &g in &group_of {
            starts[g as usize + 1] += 1;
        }
        for g in 0..trie.exact.len() {
            starts[g + 1] += starts[g];
        }
        trie.exact_hits = vec![Hit::default(); exact.len()];
        let mut fill = starts.clone();
        for (&g, &(_, code)) in group_of.iter().zip(&exact) {
            trie.exact_hits[fill[g as usize] as usize] = code;
            fill[g as usize] += 1;
        }
        for value in trie.exact.values_mut() {
            let g = value.hit.code as usize;
            let (start, count) = (starts[g], starts[g + 1] - starts[g]);
            *value = if count == 1 {
                ExactValue {
                    hit: trie.exact_hits[start as usize],
                    count: 1,
                }
            } else {
                ExactValue {
                    hit: Hit {
                        code: start as i64,
                        rank: 0,
                    },
                    count,
                }
            };
        }
        trie
    }

    pub(crate) fn wild_child(&mut self, node: u32, many: bool) -> u32 {
        let existing = if many {
            self.nodes[node as usize].many
        } else {
            self.nodes[node as usize].one
        };
        if existing != NONE {
            return existing;
        }
        let child = self.nodes.len() as u32;
        self.nodes.push(Node::new(many));
        let n = &mut self.nodes[node as usize];
        if many {
            n.many = child;
        } else {
            n.one = child;
        }
        child
    }

    pub(crate) fn literal_child(&mut self, node: u32, word: &[u8]) -> u32 {
        let next_word = self.words.len() as u32;
        let word_id = *self.words.entry(word.into()).or_insert(next_word);
        let next_node = self.nodes.len() as u32;
        let child = *self
            .children
            .entry(((node as u64) << 32) | word_id as u64)
            .or_insert(next_node);
        if child == next_node {
            self.nodes.push(Node::new(false));
        }
        child
    }

    /// Appends to `scratch.codes` the hit code of every wildcard filter
    /// matching the topic whose words are `scratch.word_ids` (`NONE`: a word
    /// no filter has), each once.
    ///
    /// A state `(node, p)` means "the filter's words up to `node` match the
    /// topic's first `p` words". Every state is visited at most once: a
    /// literal or one-word node has one predecessor state, and states of
    /// many nodes (the only ones with two) are de-duplicated through `seen`;
    /// so a filter, whose end is one node, is reported at most once.
    pub(crate) fn collect(&self, dollar: bool, scratch: &mut Scratch) {
        let Scratch {
            word_ids,
            stack,
            seen,
            codes,
            ..
        } = scratch;
        let len = word_ids.len() as u32;
        stack.clear();
        seen.clear();
        stack.push((0, 0));
        while let Some((n, p)) = stack.pop() {
            let node = &self.nodes[n as usize];
            if node.is_many {
                if !seen.insert(((n as u64) << 32) | p as u64) {
                    continue;
                }
                if p < len {
                    stack.push((n, p + 1));
                }
            }
            let wildcards = !(dollar && p == 0);
            if node.many != NONE && wildcards {
                stack.push((node.many, p));
            }
            if p == len {
                codes.extend_from_slice(
                    &self.hits[node.hits_start as usize..node.hits_end as usize],
                );
                continue;
            }
            if node.one != NONE && wildcards {
                stack.push((node.one, p + 1));
            }
            let word = word_ids[p as usize];
            if word != NONE {
                if let Some(&child) = self.children.get(&(((n as u64) << 32) | word as u64)) {
                    stack.push((child, p + 1));
                }
            }
        }
    }

    /// Appends the codes of the exact filters equal to `text` to `codes`.
    pub(crate) fn exact_hits(&self, text: &[u8], codes: &mut Vec<Hit>) {
        match self.exact.get(text) {
            Some(&ExactValue { hit, count: 1 }) => codes.push(hit),
            Some(&ExactValue { hit, count }) => {
                codes.extend_from_slice(&self.exact_hits[hit.code as usize..][..count as usize])
            }
            None => {}
        }
    }

    /// Hit codes of a valid topic into `scratch.codes` (cleared first).
    pub(crate) fn topic_hits(&self, topic: &[u8], scratch: &mut Scratch) {
        scratch.codes.clear();
        self.exact_hits(topic, &mut scratch.codes);
        if self.nodes.len() == 1 {
            return; // no wildcard filter
        }
        self.dialect.split(topic, &mut scratch.bounds);
        scratch.word_ids.clear();
        for &(s, e) in &scratch.bounds {
            scratch
                .word_ids
                .push(self.words.get(&topic[s..e]).copied().unwrap_or(NONE));
        }
        self.collect(self.dialect.dollar(topic), scratch);
    }

    /// Hit codes of a topic given as its words, into `scratch.codes`.
    pub(crate) fn word_hits(&self, words: &[String], scratch: &mut Scratch) {
        scratch.codes.clear();
        let separator = [self.dialect.separator()];
        let text = words
            .iter()
            .map(|w| w.as_bytes())
            .collect::<Vec<_>>()
            .join(&separator[..]);
        self.exact_hits(&text, &mut scratch.codes);
        scratch.word_ids.clear();
        for word in words {
            scratch
                .word_ids
                .push(self.words.get(word.as_bytes()).copied().unwrap_or(NONE));
        }
        self.collect(self.dialect.dollar(&text), scratch);
    }
}
