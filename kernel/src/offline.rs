//! `bitroute match` on the kernel: JSON Lines in, JSON Lines out, for the
//! files whose every line the kernel reads exactly as `compiler/offline.py`'s
//! reference path does. Any other file (a rejection to report, an error line to
//! write, a shared subscription, header criteria, an escape or line break
//! Python and serde might read differently) makes [`offline_match`] return
//! `None`, and the Python reference path answers it whole, with its messages.
//!
//! The grammar's rules this reader needs (the shared-subscription prefix,
//! the subscriber-name rule) are handed in from `compiler/`.
//!
//! The output is byte for byte the reference path's: per topic line
//! `json.dumps({"topic": topic, "subscriptions": ids})` (ASCII-escaped, ids
//! as given: numbers first, numerically, then strings by code point).

use std::borrow::Cow;
use std::cmp::Ordering;

use hashbrown::HashSet;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::dialect::{Dialect, Grammar};
use crate::trie::{Hit, Scratch, Trie};

/// Topic lines per output chunk.
const BLOCK_LINES: usize = 8192;

/// A present field's raw JSON text, `null` included (serde's `Option` would
/// read `null` as absent, and the reference path tells the two apart).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct SubscriptionLine<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    filter: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    subscriber: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    headers: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct TopicLine<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    topic: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    headers: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    message_id: Option<&'a RawValue>,
}

/// A subscription id as given: its output order and its JSON text.
#[derive(PartialEq, Eq)]
enum GivenId {
    Number(i128),
    Text(String),
}

impl GivenId {
    fn json(&self) -> String {
        match self {
            GivenId::Number(n) => n.to_string(),
            GivenId::Text(s) => json_string(s),
        }
    }
}

impl Ord for GivenId {
    /// The reference path's `_id_order`: numbers first, numerically, then strings
    /// by code point (the order of their UTF-8 bytes).
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (GivenId::Number(a), GivenId::Number(b)) => a.cmp(b),
            (GivenId::Number(_), GivenId::Text(_)) => Ordering::Less,
            (GivenId::Text(_), GivenId::Number(_)) => Ordering::Greater,
            (GivenId::Text(a), GivenId::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
        }
    }
}

impl PartialOrd for GivenId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Python's `json.dumps` of a str (`ensure_ascii=True`).
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_string(&mut out, s);
    out
}

fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
        }
    }
    out.push('"');
}

/// The lines of a file, or `None` when Python might split it otherwise: it
/// must be UTF-8 and have no line break but `\n` (`str.splitlines` also
/// breaks at `\r`, `\x0b`, `\x0c`, `\x1c`-`\x1e`, U+0085, U+2028, U+2029).
/// Blank lines (spaces and tabs only) are dropped, as the reference path does.
fn lines(data: &[u8]) -> Option<Vec<&str>> {
    let text = std::str::from_utf8(data).ok()?;
    if text
        .bytes()
        .any(|b| matches!(b, b'\r' | 0x0b | 0x0c | 0x1c..=0x1e))
        || text.contains(['\u{85}', '\u{2028}', '\u{2029}'])
    {
        return None;
    }
    Some(
        text.split('\n')
            .filter(|line| !line.bytes().all(|b| b == b' ' || b == b'\t'))
            .collect(),
    )
}

/// A JSON object line as `T`, or `None` (serde also reads arrays into structs).
fn object<'a, T: Deserialize<'a>>(line: &'a str) -> Option<T> {
    if !line.trim_start_matches([' ', '\t']).starts_with('{') {
        return None;
    }
    serde_json::from_str(line).ok()
}

/// A JSON string's value, or `None` for any other JSON value.
fn string_value(raw: &RawValue) -> Option<Cow<'_, str>> {
    if !raw.get().starts_with('"') {
        return None;
    }
    serde_json::from_str::<Cow<'_, str>>(raw.get()).ok()
}

/// An id the reference path accepts and the kernel reads alike: a non-empty
/// string or an integer.
fn given_id(raw: &RawValue) -> Option<GivenId> {
    let text = raw.get();
    if text.starts_with('"') {
        let value = string_value(raw)?;
        return (!value.is_empty()).then(|| GivenId::Text(value.into_owned()));
    }
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None; // floats, booleans, objects: the Python path
    }
    text.parse::<i128>().ok().map(GivenId::Number)
}

/// The subscriber-name rule as `compiler.subscription.SUBSCRIBER_RULE` hands
/// it over: the characters a name may hold (ASCII), its longest length and
/// the names it must not be.
#[derive(FromPyObject)]
pub(crate) struct SubscriberRule {
    characters: String,
    max_chars: usize,
    reserved: Vec<String>,
}

/// [`SubscriberRule`] as a byte table, for `validate_subscriber`'s check of every line.
struct SubscriberCheck<'a> {
    allowed: [bool; 128],
    rule: &'a SubscriberRule,
}

impl<'a> SubscriberCheck<'a> {
    fn new(rule: &'a SubscriberRule) -> Self {
        let mut allowed = [false; 128];
        for b in rule.characters.bytes().filter(|b| b.is_ascii()) {
            allowed[b as usize] = true;
        }
        SubscriberCheck { allowed, rule }
    }

    fn valid(&self, name: &str) -> bool {
        (1..=self.rule.max_chars).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii() && self.allowed[b as usize])
            && !self.rule.reserved.iter().any(|r| r == name)
    }
}

/// Whether `parse_filter` of the grammar accepts `text` as a filter the
/// kernel matches alone: not a shared subscription.
fn plain_filter(dialect: Dialect, grammar: &Grammar, text: &str) -> bool {
    if grammar.is_shared(text) {
        return false;
    }
    match dialect {
        Dialect::Amqp => text.len() <= 255,
        Dialect::Mqtt => {
            if text.is_empty() || text.len() > 65535 || text.contains('\0') {
                return false;
            }
            let levels: Vec<&str> = text.split('/').collect();
            levels.iter().enumerate().all(|(i, level)| {
                if level.contains('#') {
                    *level == "#" && i == levels.len() - 1
                } else {
                    !level.contains('+') || *level == "+"
                }
            })
        }
    }
}

/// The matched output of a file pair, produced a block of lines at a time.
#[pyclass(module = "bitroute_kernel")]
pub struct OfflineOutput {
    trie: Trie,
    /// Per subscription (hit code), its id's JSON text; the hits carry
    /// each subscription's rank in output order.
    id_json: Vec<String>,
    topics: Vec<String>,
    next: usize,
}

#[pymethods]
impl OfflineOutput {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next block of output lines (ASCII bytes), or the end.
    fn __next__<'py>(&mut self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        if self.next >= self.topics.len() {
            return None;
        }
        let end = (self.next + BLOCK_LINES).min(self.topics.len());
        let mut out = String::new();
        let mut scratch = Scratch::default();
        let mut ranked: Vec<(u32, usize)> = Vec::new();
        for topic in &self.topics[self.next..end] {
            self.trie.topic_hits(topic.as_bytes(), &mut scratch);
            ranked.clear();
            ranked.extend(
                scratch
                    .codes
                    .iter()
                    .map(|hit| (hit.rank, hit.code as usize)),
            );
            ranked.sort_unstable();
            out.push_str("{\"topic\": ");
            push_json_string(&mut out, topic);
            out.push_str(", \"subscriptions\": [");
            for (i, &(_, sub)) in ranked.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&self.id_json[sub]);
            }
            out.push_str("]}\n");
        }
        self.next = end;
        Some(PyBytes::new(py, out.as_bytes()))
    }
}

/// `offline_match(subscriptions, topics, grammar, subscribers)`: the output
/// of `bitroute match` for two files' bytes, as an iterator of ASCII chunks,
/// or `None` when the Python path must answer (see the module docs).
/// `grammar` is the exchange's `compiler.grammar.KernelGrammar`,
/// `subscribers` the subscriber-name rule.
#[pyfunction]
pub fn offline_match(
    py: Python<'_>,
    subscriptions: &[u8],
    topics: &[u8],
    grammar: Grammar,
    subscribers: SubscriberRule,
) -> PyResult<Option<OfflineOutput>> {
    let dialect = grammar.dialect()?;
    Ok(py.allow_threads(|| read(dialect, &grammar, &subscribers, subscriptions, topics)))
}

fn read(
    dialect: Dialect,
    grammar: &Grammar,
    subscribers: &SubscriberRule,
    subscriptions: &[u8],
    topics: &[u8],
) -> Option<OfflineOutput> {
    let subscribers = SubscriberCheck::new(subscribers);
    let mut ids: Vec<GivenId> = Vec::new();
    let mut filters: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut id_json: Vec<String> = Vec::new();
    for line in lines(subscriptions)? {
        let record: SubscriptionLine = object(line)?;
        if record.headers.is_some_and(|h| h.get() != "null") {
            return None; // header criteria: the Python path
        }
        let id = given_id(record.id?)?;
        let filter = string_value(record.filter?)?;
        if !plain_filter(dialect, grammar, &filter) {
            return None;
        }
        if let Some(raw) = record.subscriber {
            if raw.get() != "null"
                && !string_value(raw).is_some_and(|name| subscribers.valid(&name))
            {
                return None;
            }
        }
        let text = id.json();
        if !seen.insert(text.clone()) {
            return None; // a duplicate id: a rejection to report
        }
        id_json.push(text);
        ids.push(id);
        filters.push(filter.into_owned());
    }
    let mut topic_texts: Vec<String> = Vec::new();
    for line in lines(topics)? {
        let record: TopicLine = object(line)?;
        if record.headers.is_some_and(|h| h.get() != "null") {
            return None;
        }
        if let Some(raw) = record.message_id {
            string_value(raw)?;
        }
        let topic = string_value(record.topic?)?;
        if !dialect.valid_topic(topic.as_bytes()) {
            return None; // an error line: the grammar's message
        }
        topic_texts.push(topic.into_owned());
    }
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_unstable_by(|&a, &b| ids[a].cmp(&ids[b]));
    let mut rank = vec![0u32; ids.len()];
    for (position, &sub) in order.iter().enumerate() {
        rank[sub] = position as u32;
    }
    let hits: Vec<Hit> = (0..filters.len())
        .map(|k| Hit {
            code: k as i64,
            rank: rank[k],
            subscriber: 0,
        })
        .collect();
    Some(OfflineOutput {
        trie: Trie::build(dialect, &filters, &hits),
        id_json,
        topics: topic_texts,
        next: 0,
    })
}
