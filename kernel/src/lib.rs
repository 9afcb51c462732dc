//! bitroute's matching kernel: the part of `compiler.matcher.Matcher` that
//! runs once per topic (or per topic and subscription), in Rust.
//!
//! A [`Trie`] per exchange holds that exchange's filters word by word; a
//! topic is matched by walking it once (see [`Trie::collect`]), whatever the
//! number of subscriptions. Its leaves hold *hit codes*, exactly as the
//! Python side defines them (`compiler/resolve.py`): a code `h >= 0` is the
//! subscription slot of a filter held by one subscription without
//! conditions; `h < 0` stands for filter slot `!h`, whose subscriptions are
//! `fs_slots[fs_start[f]..][..fs_count[f]]` and which may be *special*
//! (header criteria or a shared group: per-message conditions the Python
//! side applies).
//!
//! [`Kernel`] answers the two hot questions of the matcher:
//! - [`Kernel::deliveries`]: one topic to its finished `Delivery` tuples
//!   (sorted by subscriber, ids sorted), or `None` when the Python side must
//!   answer (an invalid topic, for its exact error; a special filter hit);
//! - [`Kernel::match_topics`]: many distinct topics to their subscription
//!   slots in rank order, as flat arrays.
//!
//! [`offline::offline_match`] runs `bitroute match` on the same trie for the
//! files it reads exactly as the Python paths do.
//!
//! Semantics mirror `compiler/amqp.py` and `compiler/mqtt.py` (validation
//! of topics, splitting, `*`/`+` one word, `#` zero or more words, the MQTT
//! rule that a filter starting with a wildcard does not match a topic
//! starting with `$`); `tests/compiler/test_properties.py` checks them
//! against the reference matcher.

mod offline;

use hashbrown::{HashMap, HashSet};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyType};

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Amqp,
    Mqtt,
}

impl Dialect {
    fn parse(name: &str) -> PyResult<Self> {
        match name {
            "amqp" => Ok(Dialect::Amqp),
            "mqtt" => Ok(Dialect::Mqtt),
            _ => Err(PyValueError::new_err(format!("unknown dialect {name:?}"))),
        }
    }

    fn separator(self) -> u8 {
        match self {
            Dialect::Amqp => b'.',
            Dialect::Mqtt => b'/',
        }
    }

    fn one(self) -> &'static [u8] {
        match self {
            Dialect::Amqp => b"*",
            Dialect::Mqtt => b"+",
        }
    }

    /// Whether `topic` (UTF-8) is a valid topic of the dialect; the Python
    /// grammar gives the error for the others.
    fn valid_topic(self, topic: &[u8]) -> bool {
        match self {
            Dialect::Amqp => topic.len() <= 255,
            Dialect::Mqtt => {
                !topic.is_empty()
                    && topic.len() <= 65535
                    && !topic.iter().any(|&b| b == b'+' || b == b'#' || b == 0)
            }
        }
    }

    /// The words of a valid topic or filter: the empty AMQP key has none.
    fn split(self, text: &[u8], out: &mut Vec<(usize, usize)>) {
        out.clear();
        if text.is_empty() && self == Dialect::Amqp {
            return;
        }
        let sep = self.separator();
        let mut start = 0;
        for (i, &b) in text.iter().enumerate() {
            if b == sep {
                out.push((start, i));
                start = i + 1;
            }
        }
        out.push((start, text.len()));
    }

    /// The words of a filter that match topics: an MQTT shared subscription
    /// `$share/<group>/<filter>` matches as `<filter>` (already validated).
    fn match_part(self, filter: &str) -> &str {
        match (self, filter.strip_prefix("$share/")) {
            (Dialect::Mqtt, Some(rest)) => rest.split_once('/').map_or(filter, |(_, inner)| inner),
            _ => filter,
        }
    }

    /// The MQTT `$` rule: wildcards at the first level do not match.
    fn dollar(self, topic: &[u8]) -> bool {
        self == Dialect::Mqtt && topic.first() == Some(&b'$')
    }
}

struct Node {
    one: u32,
    many: u32,
    hits_start: u32,
    hits_end: u32,
    is_many: bool,
}

impl Node {
    fn new(is_many: bool) -> Self {
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
struct Trie {
    dialect: Dialect,
    /// Per exact text, its one hit code (`(code, 1)`, the common case: no
    /// second memory read) or where its codes are (`(start, count)` into
    /// `exact_hits`).
    exact: HashMap<TextKey, ExactValue>,
    exact_hits: Vec<Hit>,
    words: HashMap<Box<[u8]>, u32>,
    children: HashMap<u64, u32>,
    nodes: Vec<Node>,
    hits: Vec<Hit>,
}

/// A hit code with, for a subscription slot (`code >= 0`), that slot's rank
/// in (subscriber, id) order: the batch path sorts a topic's slots without
/// reading the per-slot table (a memory miss per subscription at a million).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct Hit {
    code: i64,
    rank: u32,
}

/// An exact text's hits: `count == 1` (the common case), the hit itself;
/// otherwise `hit.code` is where its `count` hits start in `exact_hits`.
#[derive(Clone, Copy)]
struct ExactValue {
    hit: Hit,
    count: u32,
}

/// Longest exact text kept inline in its hash map entry.
const INLINE_TEXT: usize = 30;

/// An exact filter's text as a hash key: short ones (most topics) inline, so
/// that a lookup compares bytes in the table's own memory instead of
/// following a pointer (one memory miss less per topic at a million).
#[derive(Clone)]
enum TextKey {
    Inline(u8, [u8; INLINE_TEXT]),
    Heap(Box<[u8]>),
}

impl TextKey {
    fn as_bytes(&self) -> &[u8] {
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
struct Scratch {
    bounds: Vec<(usize, usize)>,
    word_ids: Vec<u32>,
    stack: Vec<(u32, u32)>,
    seen: HashSet<u64>,
    codes: Vec<Hit>,
    entries: Vec<(u64, u32)>,
    runs: Vec<(usize, usize)>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch space (a fresh one if it is in use).
fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Scratch::default()),
    })
}

impl Trie {
    fn build<S: AsRef<str>>(dialect: Dialect, filters: &[S], codes: &[Hit]) -> Self {
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

    fn wild_child(&mut self, node: u32, many: bool) -> u32 {
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

    fn literal_child(&mut self, node: u32, word: &[u8]) -> u32 {
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
    fn collect(&self, dollar: bool, scratch: &mut Scratch) {
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
    fn exact_hits(&self, text: &[u8], codes: &mut Vec<Hit>) {
        match self.exact.get(text) {
            Some(&ExactValue { hit, count: 1 }) => codes.push(hit),
            Some(&ExactValue { hit, count }) => {
                codes.extend_from_slice(&self.exact_hits[hit.code as usize..][..count as usize])
            }
            None => {}
        }
    }

    /// Hit codes of a valid topic into `scratch.codes` (cleared first).
    fn topic_hits(&self, topic: &[u8], scratch: &mut Scratch) {
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
    fn word_hits(&self, words: &[String], scratch: &mut Scratch) {
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

/// What resolving one topic's hit codes found.
enum Resolved {
    /// The topic's subscriptions, in `scratch.entries`, sorted.
    Slots,
    /// A filter with per-message conditions matched: the Python side resolves it.
    Special,
}

/// A batch's units grouped by subscriber, and what each takes in the output
/// (see [`Kernel::layout`]).
struct LayoutPlan {
    /// Per group, its positions `first..end` in `flat`; unit `u`'s groups are
    /// `groups[unit_groups[u]..unit_groups[u + 1]]`.
    groups: Vec<(u32, u32)>,
    unit_groups: Vec<u32>,
    units: Vec<UnitSize>,
}

#[derive(Clone, Copy)]
struct UnitSize {
    groups: u64,
    ids: u64,
    id_bytes: u64,
    name_bytes: u64,
}

impl LayoutPlan {
    /// The byte sizes of the six buffers for rows `row_unit`, or why they
    /// cannot be one Arrow column (32-bit offsets).
    fn sizes(&self, row_unit: &[u32]) -> Result<[usize; 6], String> {
        let mut total = UnitSize {
            groups: 0,
            ids: 0,
            id_bytes: 0,
            name_bytes: 0,
        };
        for &u in row_unit {
            let size = self.units[u as usize];
            total.groups += size.groups;
            total.ids += size.ids;
            total.id_bytes += size.id_bytes;
            total.name_bytes += size.name_bytes;
        }
        if [total.groups, total.ids, total.id_bytes, total.name_bytes]
            .iter()
            .any(|&n| n > i32::MAX as u64)
        {
            return Err(format!(
                "a batch's deliveries column would exceed Arrow's 32-bit offsets ({} deliveries, {} ids, {} bytes of ids): \
                 use smaller batches",
                total.groups, total.ids, total.id_bytes
            ));
        }
        let offsets = |n: u64| 4 * (n as usize + 1);
        Ok([
            offsets(row_unit.len() as u64),
            offsets(total.groups),
            offsets(total.ids),
            total.id_bytes as usize,
            offsets(total.groups),
            total.name_bytes as usize,
        ])
    }
}

/// Per subscription slot, what grouping and writing its deliveries need,
/// side by side (one memory read per delivered subscription; ranks travel
/// with the hits, see [`Hit`]).
#[derive(Clone, Copy, Default)]
struct SlotInfo {
    subscriber: u32,
    /// Where the slot's id is in `Kernel::id_data`.
    id_start: u32,
    id_len: u32,
}

/// The matching kernel of one snapshot (see the crate docs).
#[pyclass(frozen, module = "bitroute_kernel")]
struct Kernel {
    tries: Vec<Trie>,
    slots: Vec<SlotInfo>,
    fs_start: Vec<u32>,
    fs_count: Vec<u32>,
    fs_slots: Vec<u32>,
    /// `rank[fs_slots[i]]`, side by side with `fs_slots`.
    fs_ranks: Vec<u32>,
    special: Vec<bool>,
    names: Py<PyList>,
    /// Each subscription slot's id as a str, made at load from the Arrow
    /// column: held here, not in a Python list, so the collector never
    /// traverses a million entries (it did, 20-25 ms in the first batch
    /// after each load at a million subscriptions). Made eagerly: made on
    /// first delivery instead, a cold `match()` took 0.5 us longer.
    ids: Vec<Py<PyString>>,
    /// The same ids (see [`SlotInfo`]) and the subscriber names as UTF-8,
    /// for writing the Arrow output of a batch ([`Kernel::layout`]).
    id_data: Vec<u8>,
    name_offsets: Vec<u32>,
    name_data: Vec<u8>,
    delivery: Py<PyType>,
}

/// A string column's `(offsets, data)` (int64 offsets, `len + 1` of them; uint8 data).
fn string_column(
    py: Python<'_>,
    offsets: &Bound<'_, PyAny>,
    data: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<(Vec<u32>, Vec<u8>)> {
    let data = PyBuffer::<u8>::get(data)
        .and_then(|b| b.to_vec(py))
        .map_err(|e| {
            PyValueError::new_err(format!("{what} data: expected a uint8 buffer ({e})"))
        })?;
    let offsets = u32_of(py, offsets, data.len() + 1, &format!("{what} offsets"))?;
    if offsets.is_empty() || offsets.windows(2).any(|w| w[0] > w[1]) {
        return Err(PyValueError::new_err(format!(
            "{what} offsets must be non-decreasing, one more than the strings"
        )));
    }
    Ok((offsets, data))
}

/// An int64 array's values as u32, each checked to be below `bound`, read
/// in one pass over the buffer (no intermediate copy: batch columns hold
/// tens of millions of slots).
fn u32_of(
    py: Python<'_>,
    buffer: &Bound<'_, PyAny>,
    bound: usize,
    what: &str,
) -> PyResult<Vec<u32>> {
    let array = PyBuffer::<i64>::get(buffer).map_err(|e| {
        PyValueError::new_err(format!("{what}: expected a contiguous int64 array ({e})"))
    })?;
    let values = array.as_slice(py).ok_or_else(|| {
        PyValueError::new_err(format!("{what}: expected a contiguous int64 array"))
    })?;
    values
        .iter()
        .map(|cell| {
            let v = cell.get();
            if v >= 0 && (v as u64) < bound as u64 && v < NONE as i64 {
                Ok(v as u32)
            } else {
                Err(PyValueError::new_err(format!(
                    "{what}: value {v} out of range 0..{bound}"
                )))
            }
        })
        .collect()
}

fn vec_of(py: Python<'_>, buffer: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<i64>> {
    PyBuffer::<i64>::get(buffer)
        .and_then(|b| b.to_vec(py))
        .map_err(|e| {
            PyValueError::new_err(format!("{what}: expected a contiguous int64 array ({e})"))
        })
}

#[pymethods]
impl Kernel {
    /// `Kernel(delivery_type, names, name_offsets, name_data, id_offsets, id_data, rank,
    /// sub_subscriber, fs_start, fs_count, fs_slots, special, dialects,
    /// filter_offsets, filter_data, filter_exchange, codes)`.
    ///
    /// `names[k]`: subscriber number `k`'s name (a list that must not change
    /// while the kernel lives; also as a string column, `name_offsets`,
    /// `name_data`). Per subscription slot: its id (a string
    /// column: `id_offsets`, `id_data`, the Arrow layout), `rank[slot]` its
    /// position in (subscriber, id) order, `sub_subscriber[slot]` its
    /// subscriber's number. Per filter slot: its subscriptions (CSR
    /// `fs_start`, `fs_count` into `fs_slots`), `special` (uint8: has
    /// per-message conditions), its text (`filter_offsets`, `filter_data`),
    /// its exchange (a number into `dialects`; -1: a free slot) and its hit
    /// code. Arrays are int64 unless stated.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        delivery_type: Bound<'_, PyType>,
        names: Bound<'_, PyList>,
        name_offsets: Bound<'_, PyAny>,
        name_data: Bound<'_, PyAny>,
        id_offsets: Bound<'_, PyAny>,
        id_data: Bound<'_, PyAny>,
        rank: Bound<'_, PyAny>,
        sub_subscriber: Bound<'_, PyAny>,
        fs_start: Bound<'_, PyAny>,
        fs_count: Bound<'_, PyAny>,
        fs_slots: Bound<'_, PyAny>,
        special: Bound<'_, PyAny>,
        dialects: Vec<String>,
        filter_offsets: Bound<'_, PyAny>,
        filter_data: Bound<'_, PyAny>,
        filter_exchange: Bound<'_, PyAny>,
        codes: Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        if !delivery_type.is_subclass_of::<pyo3::types::PyTuple>()? {
            return Err(PyValueError::new_err(
                "delivery_type must be a tuple subclass",
            ));
        }
        let (name_offsets, name_data) = string_column(py, &name_offsets, &name_data, "names")?;
        if name_offsets.len() != names.len() + 1 {
            return Err(PyValueError::new_err(
                "names and their string column differ in length",
            ));
        }
        let (id_offsets, id_data) = string_column(py, &id_offsets, &id_data, "ids")?;
        let id_text = std::str::from_utf8(&id_data)
            .map_err(|e| PyValueError::new_err(format!("ids: not UTF-8 ({e})")))?;
        let ids = id_offsets
            .windows(2)
            .map(|w| {
                let id = id_text.get(w[0] as usize..w[1] as usize);
                id.map(|id| PyString::new(py, id).unbind())
                    .ok_or_else(|| PyValueError::new_err("ids: an offset splits a character"))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let n_slots = ids.len();
        let rank = u32_of(py, &rank, n_slots.max(1), "rank")?;
        let sub_subscriber = u32_of(py, &sub_subscriber, names.len().max(1), "sub_subscriber")?;
        let fs_slots = u32_of(py, &fs_slots, n_slots, "fs_slots")?;
        let fs_start = u32_of(py, &fs_start, fs_slots.len() + 1, "fs_start")?;
        let fs_count = u32_of(py, &fs_count, fs_slots.len() + 1, "fs_count")?;
        let special: Vec<bool> = PyBuffer::<u8>::get(&special)
            .and_then(|b| b.to_vec(py))
            .map_err(|e| PyValueError::new_err(format!("special: expected a uint8 array ({e})")))?
            .into_iter()
            .map(|v| v != 0)
            .collect();
        if rank.len() != n_slots || sub_subscriber.len() != n_slots {
            return Err(PyValueError::new_err(
                "rank and sub_subscriber need one entry per subscription slot",
            ));
        }
        let n_filters = special.len();
        if fs_start.len() != n_filters || fs_count.len() != n_filters {
            return Err(PyValueError::new_err(
                "fs_start, fs_count and special need one entry per filter slot",
            ));
        }
        if fs_start
            .iter()
            .zip(&fs_count)
            .any(|(&s, &c)| s as usize + c as usize > fs_slots.len())
        {
            return Err(PyValueError::new_err("fs_start + fs_count beyond fs_slots"));
        }
        let dialects = dialects
            .iter()
            .map(|d| Dialect::parse(d))
            .collect::<PyResult<Vec<_>>>()?;
        let (filter_offsets, filter_data) =
            string_column(py, &filter_offsets, &filter_data, "filters")?;
        let filter_exchange = vec_of(py, &filter_exchange, "filter_exchange")?;
        let codes = vec_of(py, &codes, "codes")?;
        if filter_offsets.len() != n_filters + 1
            || filter_exchange.len() != n_filters
            || codes.len() != n_filters
        {
            return Err(PyValueError::new_err(
                "filters, filter_exchange and codes need one entry per filter slot",
            ));
        }
        let text = std::str::from_utf8(&filter_data)
            .map_err(|e| PyValueError::new_err(format!("filters: not UTF-8 ({e})")))?;
        let mut per_exchange: Vec<(Vec<&str>, Vec<Hit>)> =
            vec![(Vec::new(), Vec::new()); dialects.len()];
        for f in 0..n_filters {
            let e = filter_exchange[f];
            if e < 0 {
                continue; // a free filter slot
            }
            let Some((filters, exchange_codes)) = per_exchange.get_mut(e as usize) else {
                return Err(PyValueError::new_err(format!(
                    "filter_exchange: no exchange number {e}"
                )));
            };
            let code = codes[f];
            if (code >= 0 && code as usize >= n_slots)
                || (code < 0 && (!code) as usize >= n_filters)
            {
                return Err(PyValueError::new_err(format!(
                    "hit code {code} names no slot"
                )));
            }
            let filter = text
                .get(filter_offsets[f] as usize..filter_offsets[f + 1] as usize)
                .ok_or_else(|| PyValueError::new_err("filters: an offset splits a character"))?;
            filters.push(dialects[e as usize].match_part(filter));
            exchange_codes.push(Hit {
                code,
                rank: if code >= 0 { rank[code as usize] } else { 0 },
            });
        }
        let tries = py.allow_threads(|| {
            dialects
                .iter()
                .zip(&per_exchange)
                .map(|(&d, (filters, codes))| Trie::build(d, filters, codes))
                .collect()
        });
        let slots = (0..n_slots)
            .map(|k| SlotInfo {
                subscriber: sub_subscriber[k],
                id_start: id_offsets[k],
                id_len: id_offsets[k + 1] - id_offsets[k],
            })
            .collect();
        Ok(Kernel {
            tries,
            slots,
            fs_start,
            fs_count,
            fs_ranks: fs_slots.iter().map(|&s| rank[s as usize]).collect(),
            fs_slots,
            special,
            names: names.unbind(),
            ids,
            id_data,
            name_offsets,
            name_data,
            delivery: delivery_type.unbind(),
        })
    }

    /// The finished deliveries of one topic of exchange number `exchange`: a
    /// tuple of `Delivery` (by subscriber; ids by rank), or `None` when the
    /// Python side must answer: the topic is not a valid str topic (its
    /// grammar names the error) or a matched filter has per-message
    /// conditions.
    fn deliveries(
        &self,
        py: Python<'_>,
        exchange: usize,
        topic: &Bound<'_, PyAny>,
    ) -> PyResult<PyObject> {
        let trie = self.trie(exchange)?;
        let Some(text) = topic_bytes(trie, topic) else {
            return Ok(py.None());
        };
        with_scratch(|scratch| {
            trie.topic_hits(text, scratch);
            match self.resolve(scratch, None, true) {
                Resolved::Special => Ok(py.None()),
                Resolved::Slots => self.delivery_tuple(py, scratch),
            }
        })
    }

    /// The deliveries of subscription slots already in output order (one
    /// per run of equal subscribers), as a tuple of `Delivery`.
    fn slot_deliveries(&self, py: Python<'_>, slots: Vec<i64>) -> PyResult<PyObject> {
        if let Some(bad) = slots
            .iter()
            .find(|&&s| s < 0 || s as usize >= self.slots.len())
        {
            return Err(PyValueError::new_err(format!("no subscription slot {bad}")));
        }
        with_scratch(|scratch| {
            scratch.entries.clear();
            scratch.entries.extend(
                slots
                    .iter()
                    .map(|&s| (s as u64, self.slots[s as usize].subscriber)),
            );
            self.delivery_tuple(py, scratch)
        })
    }

    /// Hit codes of a topic already validated and split by the Python
    /// grammar (`words`), each once.
    fn hits(&self, exchange: usize, words: Vec<String>) -> PyResult<Vec<i64>> {
        let trie = self.trie(exchange)?;
        Ok(with_scratch(|scratch| {
            trie.word_hits(&words, scratch);
            scratch.codes.iter().map(|hit| hit.code).collect()
        }))
    }

    /// Match distinct topics of exchange number `exchange` together:
    /// `(flat, offsets, unhandled, special)`. Topic `t`'s subscription
    /// slots, sorted by `rank` (an int64 array per slot; default: the
    /// kernel's), are `flat[offsets[t]:offsets[t + 1]]` (`flat` and
    /// `offsets`: bytes of int64). `unhandled`: topics that are not valid str
    /// topics; `special`: topics that hit a filter with per-message
    /// conditions; both have no slots in `flat`.
    #[pyo3(signature = (exchange, topics, rank=None))]
    fn match_topics<'py>(
        &self,
        py: Python<'py>,
        exchange: usize,
        topics: &Bound<'py, PyList>,
        rank: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Vec<usize>,
        Vec<usize>,
    )> {
        let trie = self.trie(exchange)?;
        let custom = match rank {
            Some(r) => Some(u32_of(py, &r, u32::MAX as usize, "rank")?),
            None => None,
        };
        if custom.as_ref().is_some_and(|r| r.len() != self.slots.len()) {
            return Err(PyValueError::new_err(
                "rank needs one entry per subscription slot",
            ));
        }
        let mut flat: Vec<i64> = Vec::new();
        let mut offsets: Vec<i64> = Vec::with_capacity(topics.len() + 1);
        offsets.push(0);
        let (mut unhandled, mut special) = (Vec::new(), Vec::new());
        with_scratch(|scratch| {
            for (t, topic) in topics.iter().enumerate() {
                match topic_bytes(trie, &topic) {
                    None => unhandled.push(t),
                    Some(text) => {
                        trie.topic_hits(text, scratch);
                        match self.resolve(scratch, custom.as_deref(), false) {
                            Resolved::Special => special.push(t),
                            Resolved::Slots => flat
                                .extend(scratch.entries.iter().map(|e| (e.0 & 0xFFFF_FFFF) as i64)),
                        }
                    }
                }
                offsets.push(flat.len() as i64);
            }
        });
        Ok((
            as_bytes(py, &flat),
            as_bytes(py, &offsets),
            unhandled,
            special,
        ))
    }

    /// Match a batch's routing keys (a list of bytes or str, one per row) of
    /// exchange number `exchange`: `(row_topic, flat, offsets)`, bytes of
    /// int64. Equal keys are matched once: row `r`'s subscription slots, in
    /// rank order, are `flat[offsets[t]:offsets[t + 1]]` for `t =
    /// row_topic[r]`; `row_topic[r]` is -1 for a row the Python side must
    /// answer (a key that is not UTF-8 bytes or str, not a valid topic, or
    /// that hit a filter with per-message conditions).
    fn match_keys<'py>(
        &self,
        py: Python<'py>,
        exchange: usize,
        keys: &Bound<'py, PyList>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        let trie = self.trie(exchange)?;
        let n = keys.len();
        let mut row_topic: Vec<i64> = Vec::with_capacity(n);
        let mut flat: Vec<i64> = Vec::new();
        let mut offsets: Vec<i64> = vec![0];
        let mut distinct: HashMap<&[u8], i64> = HashMap::with_capacity(n);
        // SAFETY (lifetimes): each key's bytes live as long as the key object,
        // which the list holds for the whole call (nothing here runs Python code).
        let list = keys.as_ptr();
        with_scratch(|scratch| {
            for r in 0..n {
                let key = unsafe { ffi::PyList_GET_ITEM(list, r as ffi::Py_ssize_t) };
                let Some(text) = (unsafe { key_bytes(key) }) else {
                    row_topic.push(-1);
                    continue;
                };
                if let Some(&t) = distinct.get(text) {
                    row_topic.push(t);
                    continue;
                }
                let mut t = -1;
                if trie.dialect.valid_topic(text) && std::str::from_utf8(text).is_ok() {
                    trie.topic_hits(text, scratch);
                    if let Resolved::Slots = self.resolve(scratch, None, false) {
                        flat.extend(scratch.entries.iter().map(|e| (e.0 & 0xFFFF_FFFF) as i64));
                        offsets.push(flat.len() as i64);
                        t = offsets.len() as i64 - 2;
                    }
                }
                distinct.insert(text, t);
                row_topic.push(t);
            }
        });
        Ok((
            as_bytes(py, &row_topic),
            as_bytes(py, &flat),
            as_bytes(py, &offsets),
        ))
    }

    /// The Arrow buffers of a batch's `deliveries` column
    /// (`list<struct<subscriber, subscription_ids: list<string>>>`, one row
    /// per entry of `row_unit`): row `r` holds unit `u = row_unit[r]`, whose
    /// slots, in output order, are `flat[offsets[u]:offsets[u + 1]]` (int64
    /// arrays), grouped into one delivery per run of equal subscribers.
    ///
    /// Returns `(row_offsets, group_offsets, id_offsets, id_data,
    /// name_offsets, name_data)` as bytes (offsets: int32): rows' delivery
    /// offsets, deliveries' id offsets, the ids, the deliveries' subscriber
    /// names. Raises `ValueError` past Arrow's 2 GiB string columns.
    fn layout<'py>(
        &self,
        py: Python<'py>,
        row_unit: Bound<'py, PyAny>,
        flat: Bound<'py, PyAny>,
        offsets: Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let flat = u32_of(py, &flat, self.slots.len(), "flat")?;
        let offsets = u32_of(py, &offsets, flat.len() + 1, "offsets")?;
        if offsets.is_empty() || offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err(PyValueError::new_err(
                "offsets must be non-decreasing, one more than the units",
            ));
        }
        let row_unit = u32_of(py, &row_unit, offsets.len() - 1, "row_unit")?;
        let plan = py.allow_threads(|| self.plan_layout(&flat, &offsets));
        let sizes = plan.sizes(&row_unit).map_err(PyValueError::new_err)?;
        // The six buffers are made at their final size and written in place:
        // a fan-out batch's column is gigabytes, which growing vectors and
        // then copying them into bytes objects would move two more times.
        let buffers = sizes
            .iter()
            .map(|&len| {
                // SAFETY: a new bytes object of `len` bytes, every one written below before Python sees it.
                unsafe {
                    Bound::from_owned_ptr_or_err(
                        py,
                        ffi::PyBytes_FromStringAndSize(std::ptr::null(), len as ffi::Py_ssize_t),
                    )
                }
                .map(|b| {
                    b.downcast_into::<PyBytes>()
                        .expect("PyBytes_FromStringAndSize makes bytes")
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mut out: Vec<&mut [u8]> = buffers
            .iter()
            // SAFETY: each object is new, unshared and exactly sizes[k] bytes long.
            .zip(&sizes)
            .map(|(b, &len)| unsafe {
                std::slice::from_raw_parts_mut(ffi::PyBytes_AsString(b.as_ptr()) as *mut u8, len)
            })
            .collect();
        py.allow_threads(|| self.write_layout(&plan, &row_unit, &flat, &mut out));
        Ok(buffers)
    }

    /// Number of nodes of each exchange's trie (for tests and sizing).
    fn node_counts(&self) -> Vec<usize> {
        self.tries.iter().map(|t| t.nodes.len()).collect()
    }
}

/// The native-endian bytes of integers (numpy's and Arrow's layout), copied.
fn as_bytes<'py, T: Copy>(py: Python<'py>, values: &[T]) -> Bound<'py, PyBytes> {
    // SAFETY: used for i32 and i64 only, which have no padding; the bytes are copied.
    let raw = unsafe {
        std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
    };
    PyBytes::new(py, raw)
}

/// The bytes of a routing key: a bytes object's, a str's UTF-8 (`None`:
/// another type, or a str that is not valid Unicode).
///
/// # Safety
/// `key` is a valid object pointer; the bytes live as long as it does.
unsafe fn key_bytes<'a>(key: *mut ffi::PyObject) -> Option<&'a [u8]> {
    if ffi::PyBytes_Check(key) != 0 {
        let data = ffi::PyBytes_AsString(key) as *const u8;
        return Some(std::slice::from_raw_parts(
            data,
            ffi::PyBytes_Size(key) as usize,
        ));
    }
    if ffi::PyUnicode_Check(key) != 0 {
        let mut size: ffi::Py_ssize_t = 0;
        let data = ffi::PyUnicode_AsUTF8AndSize(key, &mut size);
        if data.is_null() {
            ffi::PyErr_Clear(); // lone surrogates: the Python side names the problem
            return None;
        }
        return Some(std::slice::from_raw_parts(data as *const u8, size as usize));
    }
    None
}

/// The UTF-8 bytes of `topic` if it is a str and a valid topic of the trie's dialect.
fn topic_bytes<'a>(trie: &Trie, topic: &'a Bound<'_, PyAny>) -> Option<&'a [u8]> {
    let text = topic.downcast::<PyString>().ok()?;
    // SAFETY (lifetime): the str's UTF-8 form lives as long as the object, which `topic` borrows.
    let bytes = match text.to_str() {
        Ok(s) => unsafe { std::slice::from_raw_parts(s.as_ptr(), s.len()) },
        Err(_) => return None, // lone surrogates: the grammar names the error
    };
    trie.dialect.valid_topic(bytes).then_some(bytes)
}

impl Kernel {
    /// Each unit's deliveries, grouped by subscriber once (see [`Kernel::layout`]).
    fn plan_layout(&self, flat: &[u32], offsets: &[u32]) -> LayoutPlan {
        let n_units = offsets.len() - 1;
        let mut plan = LayoutPlan {
            groups: Vec::new(),
            unit_groups: vec![0; n_units + 1],
            units: Vec::with_capacity(n_units),
        };
        for u in 0..n_units {
            let (start, end) = (offsets[u] as usize, offsets[u + 1] as usize);
            let (mut ids, mut id_bytes, mut name_bytes) = (0u64, 0u64, 0u64);
            let mut first = start;
            for i in start + 1..=end {
                let info = self.slots[flat[i - 1] as usize];
                ids += 1;
                id_bytes += info.id_len as u64;
                if i == end
                    || self.slots[flat[i] as usize].subscriber
                        != self.slots[flat[first] as usize].subscriber
                {
                    let subscriber = self.slots[flat[first] as usize].subscriber as usize;
                    name_bytes +=
                        (self.name_offsets[subscriber + 1] - self.name_offsets[subscriber]) as u64;
                    plan.groups.push((first as u32, i as u32));
                    first = i;
                }
            }
            plan.unit_groups[u + 1] = plan.groups.len() as u32;
            plan.units.push(UnitSize {
                groups: (plan.unit_groups[u + 1] - plan.unit_groups[u]) as u64,
                ids,
                id_bytes,
                name_bytes,
            });
        }
        plan
    }

    /// Writes the six buffers of [`Kernel::layout`], sized by [`LayoutPlan::sizes`].
    /// A unit is written from the tables once; a later row of the same unit
    /// copies that first copy (sequential reads instead of a memory miss per
    /// id: rows of one topic repeat in a batch).
    fn write_layout(
        &self,
        plan: &LayoutPlan,
        row_unit: &[u32],
        flat: &[u32],
        out: &mut [&mut [u8]],
    ) {
        let [row_offsets, group_offsets, id_offsets, id_data, name_offsets, name_data] = out else {
            unreachable!("six buffers")
        };
        let get = |buffer: &[u8], k: usize| {
            i32::from_ne_bytes(buffer[4 * k..4 * k + 4].try_into().unwrap()) as usize
        };
        let put = |buffer: &mut [u8], k: usize, value: usize| {
            buffer[4 * k..4 * k + 4].copy_from_slice(&(value as i32).to_ne_bytes())
        };
        // Where each unit's first copy starts: (group index, id index); the
        // byte positions follow from the offsets already written.
        let mut written: Vec<Option<(usize, usize)>> = vec![None; plan.units.len()];
        let (mut groups, mut ids) = (0usize, 0usize);
        for buffer in [
            &mut **row_offsets,
            &mut **group_offsets,
            &mut **id_offsets,
            &mut **name_offsets,
        ] {
            put(buffer, 0, 0);
        }
        for (r, &u) in row_unit.iter().enumerate() {
            let size = plan.units[u as usize];
            let (n_groups, n_ids) = (size.groups as usize, size.ids as usize);
            if let Some((first_group, first_id)) = written[u as usize] {
                let (id_from, id_to) = (get(id_offsets, first_id), get(id_offsets, ids));
                let (name_from, name_to) =
                    (get(name_offsets, first_group), get(name_offsets, groups));
                id_data.copy_within(id_from..id_from + size.id_bytes as usize, id_to);
                name_data.copy_within(name_from..name_from + size.name_bytes as usize, name_to);
                for k in 1..=n_ids {
                    let v = get(id_offsets, first_id + k) - id_from + id_to;
                    put(id_offsets, ids + k, v);
                }
                for k in 1..=n_groups {
                    let g = get(group_offsets, first_group + k) - first_id + ids;
                    put(group_offsets, groups + k, g);
                    let v = get(name_offsets, first_group + k) - name_from + name_to;
                    put(name_offsets, groups + k, v);
                }
            } else {
                written[u as usize] = Some((groups, ids));
                let (mut id_end, mut name_end) = (get(id_offsets, ids), get(name_offsets, groups));
                let mut k_ids = ids;
                for (g, &(first, end)) in plan.groups[plan.unit_groups[u as usize] as usize
                    ..plan.unit_groups[u as usize + 1] as usize]
                    .iter()
                    .enumerate()
                {
                    let subscriber = self.slots[flat[first as usize] as usize].subscriber as usize;
                    let name = &self.name_data[self.name_offsets[subscriber] as usize
                        ..self.name_offsets[subscriber + 1] as usize];
                    name_data[name_end..name_end + name.len()].copy_from_slice(name);
                    name_end += name.len();
                    for &slot in &flat[first as usize..end as usize] {
                        let info = self.slots[slot as usize];
                        let id = &self.id_data[info.id_start as usize..][..info.id_len as usize];
                        id_data[id_end..id_end + id.len()].copy_from_slice(id);
                        id_end += id.len();
                        k_ids += 1;
                        put(id_offsets, k_ids, id_end);
                    }
                    put(group_offsets, groups + g + 1, k_ids);
                    put(name_offsets, groups + g + 1, name_end);
                }
            }
            groups += n_groups;
            ids += n_ids;
            put(row_offsets, r + 1, groups);
        }
    }

    fn trie(&self, exchange: usize) -> PyResult<&Trie> {
        self.tries
            .get(exchange)
            .ok_or_else(|| PyValueError::new_err(format!("no exchange number {exchange}")))
    }

    /// Turns the hits in `scratch.codes` into the topic's subscription slots
    /// in `scratch.entries`: `((rank << 32) | slot, subscriber)`, sorted
    /// (`rank`: the kernel's, or per slot the given one). The subscriber is
    /// read only when `subscribers` (the per-topic path builds deliveries;
    /// the batch path needs slots in order only, and the kernel's own ranks
    /// travel with the hits and the filters' slot lists).
    fn resolve(&self, scratch: &mut Scratch, rank: Option<&[u32]>, subscribers: bool) -> Resolved {
        let Scratch { codes, entries, .. } = scratch;
        entries.clear();
        let entry = |slot: u32, own_rank: u32| {
            let r = rank.map_or(own_rank, |r| r[slot as usize]);
            let subscriber = if subscribers {
                self.slots[slot as usize].subscriber
            } else {
                0
            };
            (((r as u64) << 32) | slot as u64, subscriber)
        };
        for &hit in codes.iter() {
            if hit.code >= 0 {
                entries.push(entry(hit.code as u32, hit.rank));
                continue;
            }
            let f = (!hit.code) as usize;
            if self.special[f] {
                return Resolved::Special;
            }
            let range = self.fs_start[f] as usize..(self.fs_start[f] + self.fs_count[f]) as usize;
            entries.extend(
                self.fs_slots[range.clone()]
                    .iter()
                    .zip(&self.fs_ranks[range])
                    .map(|(&s, &r)| entry(s, r)),
            );
        }
        entries.sort_unstable_by_key(|e| e.0);
        Resolved::Slots
    }

    /// A tuple of `Delivery(subscriber, (ids...))`, one per run of equal
    /// subscribers in `scratch.entries`.
    fn delivery_tuple(&self, py: Python<'_>, scratch: &mut Scratch) -> PyResult<PyObject> {
        let Scratch { entries, runs, .. } = scratch;
        runs.clear();
        let mut start = 0;
        for i in 1..=entries.len() {
            if i == entries.len() || entries[i].1 != entries[start].1 {
                runs.push((start, i));
                start = i;
            }
        }
        let names = self.names.bind(py).as_ptr();
        let delivery_type = self.delivery.bind(py).as_ptr() as *mut ffi::PyTypeObject;
        // SAFETY: every subscriber number is < len(names) (checked at
        // construction; the list does not change while the kernel lives);
        // PyTuple_SET_ITEM steals the references taken just before.
        unsafe {
            let out = ffi::PyTuple_New(runs.len() as ffi::Py_ssize_t);
            if out.is_null() {
                return Err(PyErr::fetch(py));
            }
            let out = PyObject::from_owned_ptr(py, out);
            for (g, &(s, e)) in runs.iter().enumerate() {
                let group = ffi::PyTuple_New((e - s) as ffi::Py_ssize_t);
                if group.is_null() {
                    return Err(PyErr::fetch(py));
                }
                for i in s..e {
                    let id = self.ids[(entries[i].0 & 0xFFFF_FFFF) as usize]
                        .clone_ref(py)
                        .into_ptr();
                    ffi::PyTuple_SET_ITEM(group, (i - s) as ffi::Py_ssize_t, id);
                }
                let alloc = (*delivery_type)
                    .tp_alloc
                    .unwrap_or(ffi::PyType_GenericAlloc);
                let delivery = alloc(delivery_type, 2);
                if delivery.is_null() {
                    ffi::Py_DECREF(group);
                    return Err(PyErr::fetch(py));
                }
                let name = ffi::PyList_GET_ITEM(names, entries[s].1 as ffi::Py_ssize_t);
                ffi::Py_INCREF(name);
                ffi::PyTuple_SET_ITEM(delivery, 0, name);
                ffi::PyTuple_SET_ITEM(delivery, 1, group);
                ffi::PyTuple_SET_ITEM(out.as_ptr(), g as ffi::Py_ssize_t, delivery);
            }
            Ok(out)
        }
    }
}

#[pymodule]
fn bitroute_kernel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Kernel>()?;
    m.add_class::<offline::OfflineOutput>()?;
    m.add_function(wrap_pyfunction!(offline::offline_match, m)?)?;
    Ok(())
}
