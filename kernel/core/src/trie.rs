//! One exchange's filters: the exact map and the trie, and the walk of a
//! topic through them (hit codes, see the crate docs).

use hashbrown::{HashMap, HashSet};

use crate::dialect::Dialect;
use crate::exact::ExactTable;

pub const NONE: u32 = u32::MAX;

/// Ask the CPU to start loading the cache line at `p` (a hint; no effect on
/// results). A batch reads one table entry and one id per delivered
/// subscription, each a memory miss at a million subscriptions: issued ahead,
/// the misses overlap instead of queueing.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

pub struct Node {
    pub one: u32,
    pub many: u32,
    pub hits_start: u32,
    pub hits_end: u32,
    pub is_many: bool,
}

impl Node {
    pub fn new(is_many: bool) -> Self {
        Node {
            one: NONE,
            many: NONE,
            hits_start: 0,
            hits_end: 0,
            is_many,
        }
    }
}

/// The filters of one exchange. Wildcard-free filters are one hash table keyed
/// by the whole text (`exact`, [`ExactTable`]: one lookup, whatever the
/// topic's length; most filters are exact, and a trie walk would cost a
/// memory miss per word at a million of them). The others are a trie, word by word: literal words are
/// interned (`words`); a literal edge is `children[(node << 32) | word]`; the
/// `*`/`+` and `#` edges are fields of the node. A node reached through `#`
/// is a *many* node: it may absorb further words.
pub struct Trie {
    pub dialect: Dialect,
    /// Per exact text, its hits (see [`ExactValue`]).
    pub exact: ExactTable,
    pub exact_hits: Vec<Hit>,
    pub words: HashMap<Box<[u8]>, u32>,
    pub children: HashMap<u64, u32>,
    pub nodes: Vec<Node>,
    pub hits: Vec<Hit>,
}

/// A hit code with, for a subscription slot (`code >= 0`), that slot's rank
/// in (subscriber, id) order and its subscriber's number: a topic's slots are
/// ordered and grouped without reading the per-slot table (a memory miss per
/// subscription at a million).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct Hit {
    pub code: i64,
    pub rank: u32,
    pub subscriber: u32,
}

/// An exact text's hits: `count == 1` (the common case), the hit itself;
/// otherwise `hit.code` is where its `count` hits start in `exact_hits`.
#[derive(Clone, Copy)]
pub struct ExactValue {
    pub hit: Hit,
    pub count: u32,
}

/// Scratch space of one match, reused across the calls of a thread.
#[derive(Default)]
pub struct Scratch {
    pub bounds: Vec<(usize, usize)>,
    pub word_ids: Vec<u32>,
    pub stack: Vec<(u32, u32)>,
    pub seen: HashSet<u64>,
    pub codes: Vec<Hit>,
    pub entries: Vec<(u64, u32)>,
    pub runs: Vec<(usize, usize)>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch space (a fresh one if it is in use).
pub fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Scratch::default()),
    })
}

impl Trie {
    pub fn build<S: AsRef<str>>(dialect: Dialect, filters: &[S], codes: &[Hit]) -> Self {
        let mut trie = Trie {
            dialect,
            exact: ExactTable::new(&[]),
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
        // Exact texts: number the distinct ones, then lay their codes out by
        // counting, without sorting.
        let mut number: HashMap<&[u8], u32> = HashMap::with_capacity(exact.len());
        let mut distinct: Vec<&[u8]> = Vec::new();
        let group_of: Vec<u32> = exact
            .iter()
            .map(|&(text, _)| {
                *number.entry(text).or_insert_with(|| {
                    distinct.push(text);
                    distinct.len() as u32 - 1
                })
            })
            .collect();
        let mut starts = vec![0u32; distinct.len() + 1];
        for &g in &group_of {
            starts[g as usize + 1] += 1;
        }
        for g in 0..distinct.len() {
            starts[g + 1] += starts[g];
        }
        trie.exact_hits = vec![Hit::default(); exact.len()];
        let mut fill = starts.clone();
        for (&g, &(_, code)) in group_of.iter().zip(&exact) {
            trie.exact_hits[fill[g as usize] as usize] = code;
            fill[g as usize] += 1;
        }
        let items: Vec<(&[u8], ExactValue)> = distinct
            .iter()
            .enumerate()
            .map(|(g, &text)| {
                let (start, count) = (starts[g], starts[g + 1] - starts[g]);
                let value = if count == 1 {
                    ExactValue {
                        hit: trie.exact_hits[start as usize],
                        count: 1,
                    }
                } else {
                    ExactValue {
                        hit: Hit {
                            code: start as i64,
                            ..Hit::default()
                        },
                        count,
                    }
                };
                (text, value)
            })
            .collect();
        trie.exact = ExactTable::new(&items);
        trie
    }

    pub fn wild_child(&mut self, node: u32, many: bool) -> u32 {
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

    pub fn literal_child(&mut self, node: u32, word: &[u8]) -> u32 {
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
    pub fn collect(&self, dollar: bool, scratch: &mut Scratch) {
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
    pub fn exact_hits(&self, text: &[u8], codes: &mut Vec<Hit>) {
        self.exact_hits_hashed(text, self.exact.hash(text), codes)
    }

    /// [`Trie::exact_hits`] of a text whose [`ExactTable::hash`] is known.
    pub fn exact_hits_hashed(&self, text: &[u8], hash: u64, codes: &mut Vec<Hit>) {
        match self.exact.get(text, hash) {
            Some(ExactValue { hit, count: 1 }) => codes.push(hit),
            Some(ExactValue { hit, count }) => {
                codes.extend_from_slice(&self.exact_hits[hit.code as usize..][..count as usize])
            }
            None => {}
        }
    }

    /// Hit codes of a valid topic into `scratch.codes` (cleared first).
    pub fn topic_hits(&self, topic: &[u8], scratch: &mut Scratch) {
        self.topic_hits_hashed(topic, self.exact.hash(topic), scratch)
    }

    /// [`Trie::topic_hits`] of a topic whose [`ExactTable::hash`] is known.
    pub fn topic_hits_hashed(&self, topic: &[u8], hash: u64, scratch: &mut Scratch) {
        scratch.codes.clear();
        self.exact_hits_hashed(topic, hash, &mut scratch.codes);
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
    pub fn word_hits(&self, words: &[String], scratch: &mut Scratch) {
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
