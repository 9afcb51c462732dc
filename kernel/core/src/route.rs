//! [`RouteTable`]: one publish routed against a routing table, exactly as the
//! micro-batch path decides it (`streaming/kafka/records.py` `PublishColumns`,
//! `streaming/router/batch/routing.py`, `compiler/`), for the realtime mode's JNI
//! library and its Python face. The table is the JSON of the realtime
//! contract, section 2:
//!
//! ```json
//! {"version": 12, "default_exchange": "amq.topic",
//!  "exchanges": [{"name": "amq.topic", "dialect": "amqp", "share_prefix": null,
//!                 "alternate": "amq.unrouted"},
//!                {"name": "amq.unrouted", "dialect": "amqp", "share_prefix": null}],
//!  "subscriptions": [{"id": "s1", "exchange": "amq.topic", "subscriber": "billing",
//!                     "filter": "orders.*.paid",
//!                     "headers": {"match": "all", "criteria": {"unit": "celsius", "x": null}}}]}
//! ```
//!
//! A publish's outcome:
//! - the exchange is the value of its last `exchange` header, else the
//!   table's default; a null value is a missing exchange, a value that is
//!   not UTF-8 is rejected with `PublishColumns`' reason;
//! - an unknown exchange, a missing routing key, one that is not UTF-8 or
//!   not a topic of the exchange's dialect: rejected, with `compiler/`'s reason;
//! - else its deliveries: the subscriptions whose filter matches (the trie),
//!   whose header criteria hold (`compiler/headers.py`: the last header of a
//!   name counts, values compared as UTF-8) and, of a shared group, those of
//!   the member chosen for the message id (`compiler/shared.py`); one
//!   delivery per subscriber, by subscriber, ids in order; routed with at
//!   least one delivery;
//! - else, when its exchange names an `alternate` (RabbitMQ's alternate
//!   exchange: AMQP exchanges only), the deliveries of the same publish on the
//!   alternate's subscriptions, tried once (the alternate's own alternate is
//!   not followed): routed through the alternate, which the outcome names;
//! - else unroutable.

use std::sync::Arc;

use hashbrown::{HashMap, HashSet};
use serde::Deserialize;

use crate::dialect::{self, Dialect, Grammar};
use crate::expiry::{expiry_of, Expiry};
use crate::pytext::{decode_utf8, push_json_string, quote, repr_bytes, repr_str};
use crate::trie::{with_scratch, Hit, Trie};

/// `schemas.records.EXCHANGE_HEADER`.
pub const EXCHANGE_HEADER: &str = "exchange";
/// `schemas.records.RETAIN_HEADER` and `RETAIN_TRUE`: an MQTT retained publish.
pub const RETAIN_HEADER: &str = "retain";
pub const RETAIN_TRUE: &[u8] = b"true";
/// `schemas.records.PUBLISHER_HEADER`: who published (MQTT No Local).
pub const PUBLISHER_HEADER: &str = "publisher";

/// Why a routing table cannot be read: malformed JSON, an unknown dialect
/// or exchange, a repeated id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableError(pub String);

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TableError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OutcomeKind {
    Routed = 0,
    Unroutable = 1,
    Rejected = 2,
    /// Its lifetime ended before it was routed ([`crate::expiry`]): delivered to no one.
    Expired = 3,
}

/// One subscriber's delivery: its matched subscription ids in output order
/// and the value of the `bitroute.subscription_ids` header (a JSON array).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<'t> {
    pub subscriber: &'t str,
    pub ids: Vec<&'t str>,
    pub ids_header: String,
}

/// What became of one publish (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<'t> {
    pub kind: OutcomeKind,
    /// The exchange the publish went to; `None` when its exchange header
    /// was null or not UTF-8.
    pub exchange: Option<String>,
    /// The routing key as text; `None` when absent or not UTF-8.
    pub routing_key: Option<String>,
    /// Why it was rejected (`kind == Rejected` only).
    pub reason: Option<String>,
    /// By subscriber (empty unless routed).
    pub deliveries: Vec<Delivery<'t>>,
    /// The alternate exchange whose subscriptions took the deliveries, when
    /// the publish's own exchange routed it to no one; `None` otherwise.
    pub alternate: Option<String>,
    /// The remaining expiry interval, seconds, that the deliveries carry in the
    /// `expiry` header ([`RouteTable::route_at`] of a publish that expires).
    pub remaining: Option<u32>,
}

#[derive(Deserialize)]
struct TableJson {
    #[serde(default)]
    version: Option<i64>,
    default_exchange: String,
    exchanges: Vec<ExchangeJson>,
    subscriptions: Vec<SubscriptionJson>,
    /// Why a retained publish to an MQTT exchange is rejected (a router that does not
    /// keep retained messages: realtime mode); absent, it is routed as any other.
    #[serde(default)]
    retained_refused: Option<String>,
}

/// A table's JSON less its subscriptions ([`SubscriptionSet::table`]); any
/// `subscriptions` member is ignored.
#[derive(Deserialize, Clone)]
struct TableFieldsJson {
    #[serde(default)]
    version: Option<i64>,
    default_exchange: String,
    exchanges: Vec<ExchangeJson>,
    #[serde(default)]
    retained_refused: Option<String>,
}

#[derive(Deserialize, Clone, PartialEq)]
struct ExchangeJson {
    name: String,
    dialect: String,
    #[serde(default)]
    share_prefix: Option<String>,
    /// Its alternate exchange (see the module docs); absent, none.
    #[serde(default)]
    alternate: Option<String>,
}

#[derive(Deserialize, Clone, PartialEq)]
struct SubscriptionJson {
    id: String,
    exchange: String,
    subscriber: String,
    filter: String,
    #[serde(default)]
    headers: Option<CriteriaJson>,
    /// MQTT No Local (`compiler.options`): not delivered what its subscriber published.
    #[serde(default)]
    no_local: bool,
}

#[derive(Deserialize, Clone, PartialEq)]
struct CriteriaJson {
    #[serde(rename = "match")]
    mode: String,
    /// serde_json's map keeps the last of a repeated name, as Python's `json` does.
    criteria: serde_json::Map<String, serde_json::Value>,
}

/// A subscription's header criteria (`compiler.headers.HeaderCriteria`).
#[derive(Debug, Clone)]
struct Criteria {
    all: bool,
    /// Name and the value it must equal (`None`: presence).
    criteria: Vec<(String, Option<String>)>,
}

impl Criteria {
    fn read(json: CriteriaJson, id: &str) -> Result<Self, TableError> {
        let all = match json.mode.as_str() {
            "all" => true,
            "any" => false,
            other => {
                return Err(TableError(format!(
                    "subscription {id:?}: header match must be \"all\" or \"any\", not {other:?}"
                )))
            }
        };
        let criteria = json
            .criteria
            .into_iter()
            .map(|(name, value)| match value {
                serde_json::Value::Null => Ok((name, None)),
                serde_json::Value::String(v) => Ok((name, Some(v))),
                other => Err(TableError(format!(
                    "subscription {id:?}: header criterion {name:?} must be a string or null, not {other}"
                ))),
            })
            .collect::<Result<_, _>>()?;
        Ok(Criteria { all, criteria })
    }

    /// `HeaderCriteria.matches` on a publish's headers (name to its last
    /// value: `Some(None)` present without text, null or not UTF-8).
    fn holds(&self, headers: &HashMap<&str, Option<&str>>) -> bool {
        let holds = |(name, want): &(String, Option<String>)| match headers.get(name.as_str()) {
            None => false,
            Some(value) => want.is_none() || value.as_deref() == want.as_deref(),
        };
        if self.all {
            self.criteria.iter().all(holds)
        } else {
            self.criteria.iter().any(holds)
        }
    }
}

struct Exchange {
    name: String,
    trie: Trie,
    /// The number of its alternate exchange.
    alternate: Option<usize>,
}

struct Subscription {
    id: String,
    /// Number of its subscriber: subscribers are numbered in name order.
    subscriber: u32,
    criteria: Option<Criteria>,
    no_local: bool,
}

/// One filter of one exchange (its subscriptions share it).
struct Filter {
    /// `compiler.shared.group_key(exchange, filter)` for a shared group.
    group: Option<String>,
    /// Its subscriptions in `filter_subs`, in output order.
    start: u32,
    end: u32,
}

/// The most changed subscriptions a table layers over its base
/// ([`SubscriptionSet::table`]); past it, a whole table is built again.
pub const MAX_LAYERED_CHANGES: usize = 2_000;

/// The subscriptions of a routing table kept parsed between tables: the
/// realtime executors' view applies each subscription record as it reads it
/// ([`put`](Self::put), [`remove`](Self::remove)) and makes a table only at a
/// mark ([`table`](Self::table)). Keyed by the view's subscription id (its
/// `sub:<id>` key).
///
/// A table is made in one of two ways, with the same outcomes as
/// [`RouteTable::from_json`] of the same fields and subscriptions:
/// - whole: every subscription compiled (a few hundred ms at 100,000), which
///   becomes the set's *base*;
/// - layered: the subscriptions changed since the base, compiled alone, over
///   the base with the changed ids hidden (a change costs what it changes).
///   Only while the table's fields are the base's, at most
///   [`MAX_LAYERED_CHANGES`] ids changed, and none of them is or was in a
///   shared group (a group's member choice depends on all its members).
#[derive(Default)]
pub struct SubscriptionSet {
    subscriptions: HashMap<String, SubscriptionJson>,
    base: Option<Base>,
}

/// The set's last whole table, its fields, and what changed since: each
/// changed id with its subscription in the base (`None`: it had none).
struct Base {
    table: Arc<RouteTable>,
    fields: TableFieldsJson,
    changed: HashMap<String, Option<SubscriptionJson>>,
}

impl SubscriptionSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Hold the subscription of `json` (one entry of a table's
    /// `subscriptions`) as `id`'s; true when that changed the set. Malformed
    /// JSON is refused and leaves the set as it was.
    pub fn put(&mut self, id: &str, json: &[u8]) -> Result<bool, TableError> {
        let sub: SubscriptionJson = serde_json::from_slice(json)
            .map_err(|e| TableError(format!("subscription {id:?}: {e}")))?;
        if self.subscriptions.get(id) == Some(&sub) {
            return Ok(false);
        }
        self.note_change(id);
        self.subscriptions.insert(id.to_owned(), sub);
        Ok(true)
    }

    /// Drop `id`'s subscription; true when it held one.
    pub fn remove(&mut self, id: &str) -> bool {
        if !self.subscriptions.contains_key(id) {
            return false;
        }
        self.note_change(id);
        self.subscriptions.remove(id);
        true
    }

    fn note_change(&mut self, id: &str) {
        if let Some(base) = &mut self.base {
            if !base.changed.contains_key(id) {
                base.changed
                    .insert(id.to_owned(), self.subscriptions.get(id).cloned());
            }
        }
    }

    pub fn len(&self) -> usize {
        self.subscriptions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.subscriptions.is_empty()
    }

    /// The table of `fields` (a table's JSON; its `subscriptions`, if any,
    /// ignored) with the held subscriptions: layered over the base when it
    /// can be (see the type's docs), else whole (and the new base).
    pub fn table(&mut self, fields: &[u8]) -> Result<RouteTable, TableError> {
        let fields: TableFieldsJson = serde_json::from_slice(fields)
            .map_err(|e| TableError(format!("routing table: {e}")))?;
        if let Some(base) = &self.base {
            if self.layerable(base, &fields) {
                let overlay = base
                    .changed
                    .keys()
                    .filter_map(|id| self.subscriptions.get(id).cloned())
                    .collect();
                let hidden = base.changed.keys().cloned().collect();
                return Self::layered(&fields, overlay, base.table.clone(), hidden);
            }
        }
        let whole = Arc::new(RouteTable::build(Self::json(
            &fields,
            self.subscriptions.values().cloned().collect(),
        ))?);
        self.base = Some(Base {
            table: whole.clone(),
            fields: fields.clone(),
            changed: HashMap::new(),
        });
        Self::layered(&fields, Vec::new(), whole, HashSet::new())
    }

    fn layerable(&self, base: &Base, fields: &TableFieldsJson) -> bool {
        let same = base.fields.default_exchange == fields.default_exchange
            && base.fields.exchanges == fields.exchanges
            && base.fields.retained_refused == fields.retained_refused;
        if !same || base.changed.len() > MAX_LAYERED_CHANGES {
            return false;
        }
        let shared = |sub: &SubscriptionJson| {
            fields.exchanges.iter().any(|e| {
                e.name == sub.exchange && dialect::is_shared(e.share_prefix.as_deref(), &sub.filter)
            })
        };
        !base.changed.iter().any(|(id, before)| {
            before.as_ref().is_some_and(shared) || self.subscriptions.get(id).is_some_and(shared)
        })
    }

    fn layered(
        fields: &TableFieldsJson,
        overlay: Vec<SubscriptionJson>,
        base: Arc<RouteTable>,
        hidden: HashSet<String>,
    ) -> Result<RouteTable, TableError> {
        let mut table = RouteTable::build(Self::json(fields, overlay))?;
        table.layer = Some(Layer { base, hidden });
        Ok(table)
    }

    fn json(fields: &TableFieldsJson, subscriptions: Vec<SubscriptionJson>) -> TableJson {
        TableJson {
            version: fields.version,
            default_exchange: fields.default_exchange.clone(),
            exchanges: fields.exchanges.clone(),
            subscriptions,
            retained_refused: fields.retained_refused.clone(),
        }
    }
}

/// A table's base, when it is a layer of changes ([`SubscriptionSet`]): the
/// base's subscriptions route too, less the ids `hidden` (changed since).
struct Layer {
    base: Arc<RouteTable>,
    hidden: HashSet<String>,
}

/// A routing table (see the module docs); immutable, shared by threads.
pub struct RouteTable {
    version: Option<i64>,
    default_exchange: String,
    exchange_number: HashMap<String, usize>,
    exchanges: Vec<Exchange>,
    subscribers: Vec<String>,
    /// In output order: by subscriber name, then id (code point order,
    /// `compiler.tables.slot_ranks`); a subscription's number is its rank.
    subscriptions: Vec<Subscription>,
    filters: Vec<Filter>,
    filter_subs: Vec<u32>,
    has_criteria: bool,
    /// Some subscription has No Local: a publish's `publisher` header is read.
    has_no_local: bool,
    retained_refused: Option<String>,
    /// Set when this table holds only changes over a base ([`SubscriptionSet`]).
    layer: Option<Layer>,
}

impl RouteTable {
    /// The table of the JSON `table` (see the module docs).
    pub fn from_json(table: &[u8]) -> Result<Self, TableError> {
        let json: TableJson =
            serde_json::from_slice(table).map_err(|e| TableError(format!("routing table: {e}")))?;
        Self::build(json)
    }

    fn build(json: TableJson) -> Result<Self, TableError> {
        let mut exchange_number = HashMap::new();
        let mut grammars = Vec::new();
        for (k, exchange) in json.exchanges.iter().enumerate() {
            let dialect = Dialect::parse(&exchange.dialect)
                .map_err(|e| TableError(format!("exchange {:?}: {e}", exchange.name)))?;
            if exchange_number.insert(exchange.name.clone(), k).is_some() {
                return Err(TableError(format!(
                    "exchange {:?} is listed twice",
                    exchange.name
                )));
            }
            grammars.push(Grammar {
                dialect,
                share_prefix: exchange.share_prefix.clone(),
            });
        }
        let alternates = json
            .exchanges
            .iter()
            .map(|exchange| Self::alternate_of(exchange, &exchange_number, &grammars))
            .collect::<Result<Vec<_>, _>>()?;
        let mut subs = json.subscriptions;
        subs.sort_unstable_by(|a, b| {
            (a.subscriber.as_bytes(), a.id.as_bytes())
                .cmp(&(b.subscriber.as_bytes(), b.id.as_bytes()))
        });
        let mut subscribers: Vec<String> = Vec::new();
        let mut subscriptions = Vec::with_capacity(subs.len());
        // Per exchange, its filters by text: filter number.
        let mut filter_of: Vec<HashMap<String, u32>> = vec![HashMap::new(); grammars.len()];
        let mut filter_members: Vec<Vec<u32>> = Vec::new();
        let mut filter_exchange: Vec<(usize, String)> = Vec::new();
        let mut has_criteria = false;
        let mut has_no_local = false;
        for (rank, sub) in subs.into_iter().enumerate() {
            let &e = exchange_number.get(&sub.exchange).ok_or_else(|| {
                TableError(format!(
                    "subscription {:?}: unknown exchange {:?}",
                    sub.id, sub.exchange
                ))
            })?;
            if subscribers.last() != Some(&sub.subscriber) {
                subscribers.push(sub.subscriber.clone());
            }
            let next = filter_members.len() as u32;
            let f = *filter_of[e].entry(sub.filter.clone()).or_insert(next);
            if f == next {
                filter_members.push(Vec::new());
                filter_exchange.push((e, sub.filter.clone()));
            }
            filter_members[f as usize].push(rank as u32);
            let criteria = sub
                .headers
                .map(|c| Criteria::read(c, &sub.id))
                .transpose()?;
            has_criteria |= criteria.is_some();
            has_no_local |= sub.no_local;
            subscriptions.push(Subscription {
                id: sub.id,
                subscriber: subscribers.len() as u32 - 1,
                criteria,
                no_local: sub.no_local,
            });
        }
        let mut ids: Vec<&str> = subscriptions.iter().map(|s| s.id.as_str()).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(TableError(format!(
                "subscription {:?} is listed twice",
                w[0]
            )));
        }
        let mut filters = Vec::with_capacity(filter_members.len());
        let mut filter_subs = Vec::new();
        let mut per_exchange: Vec<(Vec<&str>, Vec<Hit>)> =
            vec![(Vec::new(), Vec::new()); grammars.len()];
        for (f, members) in filter_members.iter().enumerate() {
            let (e, text) = &filter_exchange[f];
            let grammar = &grammars[*e];
            let start = filter_subs.len() as u32;
            filter_subs.extend_from_slice(members);
            filters.push(Filter {
                group: grammar
                    .is_shared(text)
                    .then(|| format!("{}\0{}", json.exchanges[*e].name, text)),
                start,
                end: filter_subs.len() as u32,
            });
            per_exchange[*e].0.push(grammar.match_part(text));
            per_exchange[*e].1.push(Hit {
                code: !(f as i64),
                ..Hit::default()
            });
        }
        let exchanges = json
            .exchanges
            .iter()
            .zip(&grammars)
            .zip(&per_exchange)
            .zip(alternates)
            .map(
                |(((exchange, grammar), (texts, hits)), alternate)| Exchange {
                    name: exchange.name.clone(),
                    trie: Trie::build(grammar.dialect, texts, hits),
                    alternate,
                },
            )
            .collect();
        Ok(RouteTable {
            version: json.version,
            default_exchange: json.default_exchange,
            exchange_number,
            exchanges,
            subscribers,
            subscriptions,
            filters,
            filter_subs,
            has_criteria,
            has_no_local,
            retained_refused: json.retained_refused,
            layer: None,
        })
    }

    /// The number of `exchange`'s alternate: a listed AMQP exchange other than
    /// itself, of an AMQP exchange (`streaming.config`'s rule, checked again here).
    fn alternate_of(
        exchange: &ExchangeJson,
        exchange_number: &HashMap<String, usize>,
        grammars: &[Grammar],
    ) -> Result<Option<usize>, TableError> {
        let Some(name) = &exchange.alternate else {
            return Ok(None);
        };
        let refuse = |why: &str| {
            Err(TableError(format!(
                "exchange {:?}: alternate exchange {name:?} {why}",
                exchange.name
            )))
        };
        let Some(&a) = exchange_number.get(name) else {
            return refuse("is not listed");
        };
        if *name == exchange.name {
            return refuse("is the exchange itself");
        }
        let own = grammars[exchange_number[&exchange.name]].dialect;
        if own != Dialect::Amqp || grammars[a].dialect != Dialect::Amqp {
            return refuse("and the exchange must both be AMQP exchanges");
        }
        Ok(Some(a))
    }

    /// The table's `version` (informational).
    pub fn version(&self) -> Option<i64> {
        self.version
    }

    /// How many subscriptions route (a layered table's: its base's, less the
    /// hidden, plus its own).
    pub fn len(&self) -> usize {
        match &self.layer {
            None => self.subscriptions.len(),
            Some(layer) => {
                let hidden = layer
                    .base
                    .subscriptions
                    .iter()
                    .filter(|s| layer.hidden.contains(&s.id))
                    .count();
                layer.base.subscriptions.len() - hidden + self.subscriptions.len()
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Route one publish: `key` the record key (its text in the outcome as the
    /// micro-batch audit shows it: invalid UTF-8 as `\\xNN` escapes) (the routing key), `headers`
    /// the record's headers in order, `message_id` its
    /// `<topic>/<partition>/<offset>` (the shared groups' choice).
    pub fn route(
        &self,
        key: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
        message_id: &str,
    ) -> Outcome<'_> {
        let routing_key = key.map(backslash_replaced);
        let rejected = |exchange: Option<String>, reason: String| Outcome {
            kind: OutcomeKind::Rejected,
            exchange,
            routing_key: routing_key.clone(),
            reason: Some(reason),
            deliveries: Vec::new(),
            alternate: None,
            remaining: None,
        };
        let exchange = match headers
            .iter()
            .rev()
            .find(|(name, _)| *name == EXCHANGE_HEADER)
        {
            None => self.default_exchange.as_str(),
            Some((_, None)) => return rejected(None, "missing exchange".to_owned()),
            Some((_, Some(value))) => match decode_utf8(value) {
                Ok(name) => name,
                Err((why, at)) => {
                    return rejected(
                        None,
                        format!(
                            "the exchange header is not valid UTF-8 ({why} at byte {at}): {}",
                            repr_bytes(&value[..value.len().min(64)])
                        ),
                    )
                }
            },
        };
        let Some(&number) = self.exchange_number.get(exchange) else {
            return rejected(
                Some(exchange.to_owned()),
                format!("unknown exchange {}", quote(exchange)),
            );
        };
        let exchange_name = Some(exchange.to_owned());
        let topic = match key.map(decode_utf8) {
            None => return rejected(exchange_name, "missing routing key".to_owned()),
            Some(Err((why, at))) => {
                return rejected(
                    exchange_name,
                    format!("routing key is not valid UTF-8 ({why} at byte {at})"),
                )
            }
            Some(Ok(topic)) => topic,
        };
        let trie = &self.exchanges[number].trie;
        if !trie.dialect.valid_topic(topic.as_bytes()) {
            if let Some(reason) = trie.dialect.topic_error(topic) {
                return rejected(exchange_name, reason);
            }
        }
        // As streaming.router.retained.plan_retained: the last `retain` header decides.
        let retained = headers
            .iter()
            .rev()
            .find(|(name, _)| *name == RETAIN_HEADER)
            .is_some_and(|(_, value)| *value == Some(RETAIN_TRUE));
        if retained {
            if trie.dialect != Dialect::Mqtt {
                return rejected(
                    exchange_name,
                    format!(
                        "retain=true on exchange {}, which is not an MQTT exchange: retained \
                         messages are MQTT's (exchanges.dialects)",
                        repr_str(exchange)
                    ),
                );
            }
            if let Some(reason) = &self.retained_refused {
                return rejected(exchange_name, reason.clone());
            }
        }
        let mut deliveries = self.deliveries(number, topic, headers, message_id);
        let mut alternate = None;
        if deliveries.is_empty() {
            // Tried once: the alternate's own alternate is not followed (no chains, no loops).
            if let Some(a) = self.exchanges[number].alternate {
                deliveries = self.deliveries(a, topic, headers, message_id);
                if !deliveries.is_empty() {
                    alternate = Some(self.exchanges[a].name.clone());
                }
            }
        }
        Outcome {
            kind: if deliveries.is_empty() {
                OutcomeKind::Unroutable
            } else {
                OutcomeKind::Routed
            },
            exchange: exchange_name,
            routing_key,
            reason: None,
            deliveries,
            alternate,
            remaining: None,
        }
    }

    /// [`RouteTable::route`] of a publish whose Kafka timestamp is `published_ms`,
    /// routed at `now_ms` (epoch ms), with its expiry ([`crate::expiry`]) applied:
    /// a bad `expiry` header rejects it (after the reasons `route` gives), an
    /// expired one is [`OutcomeKind::Expired`] with no deliveries, a live one's
    /// outcome names the remaining interval its deliveries carry.
    pub fn route_at(
        &self,
        key: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
        message_id: &str,
        published_ms: i64,
        now_ms: i64,
    ) -> Outcome<'_> {
        let mut outcome = self.route(key, headers, message_id);
        if outcome.kind == OutcomeKind::Rejected {
            return outcome;
        }
        match expiry_of(headers, published_ms, now_ms) {
            Expiry::Never => {}
            Expiry::Remaining(seconds) => outcome.remaining = Some(seconds),
            Expiry::Expired => {
                outcome.kind = OutcomeKind::Expired;
                outcome.deliveries.clear();
                outcome.alternate = None;
            }
            Expiry::Invalid(reason) => {
                outcome.kind = OutcomeKind::Rejected;
                outcome.reason = Some(reason);
                outcome.deliveries.clear();
                outcome.alternate = None;
            }
        }
        outcome
    }

    /// The deliveries of a valid topic of exchange `number`: by subscriber
    /// name, then id (code point order), as the subscriptions' ranks are.
    fn deliveries(
        &self,
        number: usize,
        topic: &str,
        headers: &[(&str, Option<&[u8]>)],
        message_id: &str,
    ) -> Vec<Delivery<'_>> {
        let own = self.matched(number, topic, headers, message_id);
        let Some(layer) = &self.layer else {
            return grouped(own.iter().map(|&s| self.entry(s)));
        };
        let base = &layer.base;
        let below = base.matched(number, topic, headers, message_id);
        if own.is_empty() && layer.hidden.is_empty() {
            return grouped(below.iter().map(|&s| base.entry(s)));
        }
        let mut all: Vec<(&str, &str)> = below
            .iter()
            .map(|&s| base.entry(s))
            .filter(|(_, id)| !layer.hidden.contains(*id))
            .collect();
        all.extend(own.iter().map(|&s| self.entry(s)));
        all.sort_unstable_by(|a, b| {
            (a.0.as_bytes(), a.1.as_bytes()).cmp(&(b.0.as_bytes(), b.1.as_bytes()))
        });
        grouped(all.into_iter())
    }

    /// Subscription `s`'s subscriber and id.
    fn entry(&self, s: u32) -> (&str, &str) {
        let sub = &self.subscriptions[s as usize];
        (
            self.subscribers[sub.subscriber as usize].as_str(),
            sub.id.as_str(),
        )
    }

    /// The ranks of this table's subscriptions that take the publish, in order.
    fn matched(
        &self,
        number: usize,
        topic: &str,
        headers: &[(&str, Option<&[u8]>)],
        message_id: &str,
    ) -> Vec<u32> {
        let mut matched: Vec<u32> = Vec::new();
        let mut groups: Vec<usize> = Vec::new();
        with_scratch(|scratch| {
            self.exchanges[number]
                .trie
                .topic_hits(topic.as_bytes(), scratch);
            for hit in &scratch.codes {
                let f = (!hit.code) as usize;
                let filter = &self.filters[f];
                matched.extend_from_slice(
                    &self.filter_subs[filter.start as usize..filter.end as usize],
                );
                if filter.group.is_some() {
                    groups.push(f);
                }
            }
        });
        if self.has_criteria && !matched.is_empty() {
            // The last header of a name wins (Kafka's `lastHeader`); values as UTF-8 text.
            let mut last: HashMap<&str, Option<&str>> = HashMap::with_capacity(headers.len());
            for &(name, value) in headers {
                last.insert(name, value.and_then(|v| std::str::from_utf8(v).ok()));
            }
            matched.retain(|&s| {
                self.subscriptions[s as usize]
                    .criteria
                    .as_ref()
                    .map_or(true, |c| c.holds(&last))
            });
        }
        if self.has_no_local && !matched.is_empty() {
            // As compiler.matcher.Matcher: the last `publisher` header, as UTF-8 text.
            let publisher = headers
                .iter()
                .rev()
                .find(|(name, _)| *name == PUBLISHER_HEADER)
                .and_then(|(_, value)| value.and_then(|v| std::str::from_utf8(v).ok()));
            if let Some(publisher) = publisher {
                matched.retain(|&s| {
                    let sub = &self.subscriptions[s as usize];
                    !(sub.no_local && self.subscribers[sub.subscriber as usize] == publisher)
                });
            }
        }
        for f in groups {
            self.choose_member(f, message_id, &mut matched);
        }
        matched.sort_unstable();
        matched
    }

    /// `compiler.resolve.Resolver.shared`: of filter `f`'s subscriptions in
    /// `matched`, keep those of the member chosen for `message_id` among
    /// their subscribers (`compiler.shared.choose_member`).
    fn choose_member(&self, f: usize, message_id: &str, matched: &mut Vec<u32>) {
        let filter = &self.filters[f];
        let Some(group) = &filter.group else { return };
        let members_of = &self.filter_subs[filter.start as usize..filter.end as usize];
        let in_group = |s: u32| members_of.binary_search(&s).is_ok();
        // Subscriber numbers are in name order, so sorted numbers are sorted names.
        let mut members: Vec<u32> = matched
            .iter()
            .filter(|&&s| in_group(s))
            .map(|&s| self.subscriptions[s as usize].subscriber)
            .collect();
        members.sort_unstable();
        members.dedup();
        if members.len() <= 1 {
            return;
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(group.as_bytes());
        hasher.update(b"\0");
        hasher.update(message_id.as_bytes());
        let chosen = members[hasher.finalize() as usize % members.len()];
        matched.retain(|&s| !in_group(s) || self.subscriptions[s as usize].subscriber == chosen);
    }

    /// The default exchange's name.
    pub fn default_exchange(&self) -> &str {
        &self.default_exchange
    }

    /// The exchanges' names, in the table's order.
    pub fn exchange_names(&self) -> impl Iterator<Item = &str> {
        self.exchanges.iter().map(|e| e.name.as_str())
    }
}

/// (subscriber, id) pairs in order as deliveries: one per subscriber.
fn grouped<'t>(entries: impl Iterator<Item = (&'t str, &'t str)>) -> Vec<Delivery<'t>> {
    let mut out: Vec<Delivery<'t>> = Vec::new();
    for (name, id) in entries {
        match out.last_mut() {
            Some(last) if last.subscriber == name => last.ids.push(id),
            _ => out.push(Delivery {
                subscriber: name,
                ids: vec![id],
                ids_header: String::new(),
            }),
        }
    }
    for delivery in &mut out {
        delivery.ids_header = ids_header(&delivery.ids);
    }
    out
}

/// The `bitroute.subscription_ids` header of a delivery: its ids as a JSON
/// array, as `streaming.kafka.records.subscription_ids_json` writes it
/// (`["a","b"]`, no spaces).
pub fn ids_header(ids: &[&str]) -> String {
    let mut out = String::with_capacity(2 + ids.iter().map(|i| i.len() + 3).sum::<usize>());
    out.push('[');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_string(&mut out, id);
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = r##"{"version": 12, "default_exchange": "amq.topic",
      "exchanges": [{"name": "amq.topic", "dialect": "amqp", "share_prefix": null},
                    {"name": "mqtt", "dialect": "mqtt", "share_prefix": "$share/"}],
      "subscriptions": [
        {"id": "s1", "exchange": "amq.topic", "subscriber": "billing", "filter": "orders.*.paid", "headers": null},
        {"id": "s0", "exchange": "amq.topic", "subscriber": "billing", "filter": "orders.#", "headers": null},
        {"id": "a9", "exchange": "amq.topic", "subscriber": "audit", "filter": "#", "headers": null},
        {"id": "s2", "exchange": "mqtt", "subscriber": "ops", "filter": "sensors/+/temperature",
         "headers": {"match": "all", "criteria": {"unit": "celsius", "x": null}}},
        {"id": "g1", "exchange": "mqtt", "subscriber": "w1", "filter": "$share/g/jobs/#", "headers": null},
        {"id": "g2", "exchange": "mqtt", "subscriber": "w2", "filter": "$share/g/jobs/#", "headers": null},
        {"id": "g3", "exchange": "mqtt", "subscriber": "w3", "filter": "$share/g/jobs/#", "headers": null}]}"##;

    fn table() -> RouteTable {
        RouteTable::from_json(TABLE.as_bytes()).unwrap()
    }

    fn summary(o: &Outcome<'_>) -> Vec<(String, Vec<String>)> {
        o.deliveries
            .iter()
            .map(|d| {
                (
                    d.subscriber.to_owned(),
                    d.ids.iter().map(|i| i.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_retained_publish_is_mqtt_only_and_refused_where_the_table_says() {
        let t = table();
        let retain: &[(&str, Option<&[u8]>)] = &[("retain", Some(b"true"))];
        let amqp = t.route(Some(b"orders.eu.paid"), retain, "p/0/1");
        assert_eq!(amqp.kind, OutcomeKind::Rejected);
        assert_eq!(
            amqp.reason.as_deref(),
            Some("retain=true on exchange 'amq.topic', which is not an MQTT exchange: retained messages are MQTT's (exchanges.dialects)")
        );
        let mqtt: Vec<(&str, Option<&[u8]>)> =
            vec![("exchange", Some(b"mqtt")), ("retain", Some(b"true"))];
        assert_eq!(
            t.route(Some(b"jobs/1"), &mqtt, "p/0/2").kind,
            OutcomeKind::Routed
        );
        let last_wins: Vec<(&str, Option<&[u8]>)> =
            vec![("retain", Some(b"true")), ("retain", Some(b"false"))];
        assert_eq!(
            t.route(Some(b"orders.eu.paid"), &last_wins, "p/0/3").kind,
            OutcomeKind::Routed
        );
        let refusing = TABLE.replacen(
            '{',
            r#"{"retained_refused": "served by micro-batch mode", "#,
            1,
        );
        let refused = RouteTable::from_json(refusing.as_bytes()).unwrap();
        let o = refused.route(Some(b"jobs/1"), &mqtt, "p/0/2");
        assert_eq!(o.kind, OutcomeKind::Rejected);
        assert_eq!(o.reason.as_deref(), Some("served by micro-batch mode"));
    }

    #[test]
    fn route_at_applies_the_expiry_after_the_other_reasons() {
        let t = table();
        let live: &[(&str, Option<&[u8]>)] = &[("expiry", Some(b"10"))];
        let o = t.route_at(Some(b"orders.eu.paid"), live, "p/0/1", 1_000, 3_500);
        assert_eq!(
            (o.kind, o.remaining, summary(&o).len()),
            (OutcomeKind::Routed, Some(8), 2)
        );
        let o = t.route_at(Some(b"orders.eu.paid"), live, "p/0/1", 1_000, 11_000);
        assert_eq!(
            (o.kind, o.remaining, o.deliveries.len()),
            (OutcomeKind::Expired, None, 0)
        );
        // Unroutable publishes expire too; a bad key is rejected first.
        assert_eq!(
            t.route_at(Some(b"x"), live, "m", 0, 10_000).kind,
            OutcomeKind::Expired
        );
        assert_eq!(
            t.route_at(None, live, "m", 0, 10_000).reason.as_deref(),
            Some("missing routing key")
        );
        let bad: &[(&str, Option<&[u8]>)] = &[("expiry", Some(b"soon"))];
        let o = t.route_at(Some(b"orders.eu.paid"), bad, "m", 0, 0);
        assert_eq!((o.kind, o.deliveries.len()), (OutcomeKind::Rejected, 0));
        assert!(o.reason.unwrap().ends_with("not b'soon'"));
        assert_eq!(
            t.route_at(Some(b"orders.eu.paid"), &[], "m", 0, 1 << 40)
                .remaining,
            None
        );
    }

    #[test]
    fn routes_by_subscriber_then_id_on_the_default_exchange() {
        let t = table();
        let o = t.route(Some(b"orders.eu.paid"), &[], "p/0/1");
        assert_eq!(o.kind, OutcomeKind::Routed);
        assert_eq!(o.exchange.as_deref(), Some("amq.topic"));
        assert_eq!(o.routing_key.as_deref(), Some("orders.eu.paid"));
        assert_eq!(
            summary(&o),
            vec![
                ("audit".into(), vec!["a9".into()]),
                ("billing".into(), vec!["s0".into(), "s1".into()])
            ]
        );
        assert_eq!(o.deliveries[1].ids_header, r#"["s0","s1"]"#);
        let o = t.route(Some(b"x"), &[("exchange", Some(b"mqtt"))], "p/0/1");
        assert_eq!(
            (o.kind, o.exchange.as_deref()),
            (OutcomeKind::Unroutable, Some("mqtt"))
        );
    }

    #[test]
    fn the_last_exchange_header_wins_and_bad_ones_reject() {
        let t = table();
        let headers: &[(&str, Option<&[u8]>)] =
            &[("exchange", Some(b"nope")), ("exchange", Some(b"mqtt"))];
        assert_eq!(
            t.route(Some(b"a/b"), headers, "m").exchange.as_deref(),
            Some("mqtt")
        );
        let o = t.route(Some(b"a"), &[("exchange", Some(b"nope"))], "m");
        assert_eq!(o.reason.as_deref(), Some("unknown exchange 'nope'"));
        assert_eq!(o.exchange.as_deref(), Some("nope"));
        let o = t.route(Some(b"a"), &[("exchange", None)], "m");
        assert_eq!(
            (o.exchange, o.reason.as_deref()),
            (None, Some("missing exchange"))
        );
        let o = t.route(Some(b"a"), &[("exchange", Some(b"mq\xfftt"))], "m");
        assert_eq!(o.kind, OutcomeKind::Rejected);
        assert_eq!(
            o.reason.as_deref(),
            Some("the exchange header is not valid UTF-8 (invalid start byte at byte 2): b'mq\\xfftt'")
        );
    }

    #[test]
    fn bad_routing_keys_reject_with_the_grammar_reason() {
        let t = table();
        let mqtt: &[(&str, Option<&[u8]>)] = &[("exchange", Some(b"mqtt"))];
        let reason = |key: Option<&[u8]>, h| t.route(key, h, "m").reason;
        assert_eq!(reason(None, &[]).as_deref(), Some("missing routing key"));
        assert_eq!(
            reason(Some(b"a\xe2\x82"), &[]).as_deref(),
            Some("routing key is not valid UTF-8 (unexpected end of data at byte 1)")
        );
        assert_eq!(
            reason(Some(b"a/#"), mqtt).as_deref(),
            Some("topic must not contain the wildcards '+' or '#': 'a/#'")
        );
        assert_eq!(
            reason(Some(b""), mqtt).as_deref(),
            Some("topic must not be empty")
        );
        assert!(reason(Some("a".repeat(256).as_bytes()), &[])
            .unwrap()
            .starts_with("routing key is 256 bytes, longer than 255: 'aaa"));
        // Not UTF-8: no text form, as the contract says.
        assert_eq!(
            t.route(Some(b"\xff"), &[], "m").routing_key.as_deref(),
            Some("\\xff")
        );
    }

    #[test]
    fn header_criteria_read_the_last_header_of_a_name() {
        let t = table();
        let route = |headers: &[(&str, Option<&[u8]>)]| {
            let mut all = vec![("exchange", Some(&b"mqtt"[..]))];
            all.extend_from_slice(headers);
            t.route(Some(b"sensors/k/temperature"), &all, "m").kind
        };
        assert_eq!(
            route(&[("unit", Some(b"celsius")), ("x", None)]),
            OutcomeKind::Routed
        );
        assert_eq!(
            route(&[("unit", Some(b"celsius")), ("x", Some(b"\xff"))]),
            OutcomeKind::Routed
        );
        assert_eq!(
            route(&[("unit", Some(b"celsius"))]),
            OutcomeKind::Unroutable
        );
        assert_eq!(
            route(&[
                ("unit", Some(b"celsius")),
                ("x", None),
                ("unit", Some(b"kelvin"))
            ]),
            OutcomeKind::Unroutable
        );
        assert_eq!(
            route(&[
                ("unit", Some(b"kelvin")),
                ("unit", Some(b"celsius")),
                ("x", None)
            ]),
            OutcomeKind::Routed
        );
    }

    #[test]
    fn a_shared_group_delivers_to_one_member_by_crc32() {
        let t = table();
        let mqtt: &[(&str, Option<&[u8]>)] = &[("exchange", Some(b"mqtt"))];
        for mid in ["p/0/1", "p/0/2", "p/0/3", "p/1/7"] {
            let o = t.route(Some(b"jobs/x"), mqtt, mid);
            // zlib.crc32(b"mqtt\0$share/g/jobs/#\0" + mid) % 3 indexes [w1, w2, w3].
            let mut h = crc32fast::Hasher::new();
            h.update(format!("mqtt\0$share/g/jobs/#\0{mid}").as_bytes());
            let want = ["w1", "w2", "w3"][h.finalize() as usize % 3];
            assert_eq!(summary(&o).len(), 1);
            assert_eq!(o.deliveries[0].subscriber, want);
        }
    }

    #[test]
    fn refuses_unreadable_tables() {
        for (json, why) in [
            ("{", "routing table:"),
            (
                r#"{"default_exchange": "a", "exchanges": [{"name": "a", "dialect": "x"}], "subscriptions": []}"#,
                "unknown dialect \"x\"",
            ),
            (
                r#"{"default_exchange": "a", "exchanges": [], "subscriptions": [
                {"id": "s", "exchange": "b", "subscriber": "c", "filter": "f"}]}"#,
                "unknown exchange \"b\"",
            ),
        ] {
            let err = RouteTable::from_json(json.as_bytes()).err().unwrap();
            assert!(err.0.contains(why), "{err}");
        }
    }

    const ALTERNATES: &str = r##"{"default_exchange": "orders",
      "exchanges": [{"name": "orders", "dialect": "amqp", "alternate": "unrouted"},
                    {"name": "unrouted", "dialect": "amqp", "alternate": "last"},
                    {"name": "last", "dialect": "amqp"}],
      "subscriptions": [
        {"id": "o1", "exchange": "orders", "subscriber": "billing", "filter": "orders.#"},
        {"id": "u1", "exchange": "unrouted", "subscriber": "ops", "filter": "#",
         "headers": {"match": "all", "criteria": {"keep": null}}},
        {"id": "u2", "exchange": "unrouted", "subscriber": "dlq", "filter": "*.eu"},
        {"id": "l1", "exchange": "last", "subscriber": "never", "filter": "#"}]}"##;

    #[test]
    fn an_unroutable_publish_is_matched_once_against_its_alternate() {
        let t = RouteTable::from_json(ALTERNATES.as_bytes()).unwrap();
        // Its own exchange routes it: the alternate is not tried.
        let o = t.route(Some(b"orders.eu"), &[("keep", None)], "p/0/1");
        assert_eq!(
            (o.kind, o.alternate.as_deref()),
            (OutcomeKind::Routed, None)
        );
        assert_eq!(summary(&o), vec![("billing".into(), vec!["o1".into()])]);
        // Routed to no one there: the alternate's subscriptions, header criteria included.
        let o = t.route(Some(b"stock.eu"), &[("keep", None)], "p/0/2");
        assert_eq!(
            (o.kind, o.exchange.as_deref()),
            (OutcomeKind::Routed, Some("orders"))
        );
        assert_eq!(o.alternate.as_deref(), Some("unrouted"));
        assert_eq!(
            summary(&o),
            vec![
                ("dlq".into(), vec!["u2".into()]),
                ("ops".into(), vec!["u1".into()])
            ]
        );
        // Tried once: the alternate's own alternate ("last", which takes "#") is not followed.
        let o = t.route(Some(b"stock.us"), &[], "p/0/3");
        assert_eq!(
            (o.kind, o.alternate.as_deref()),
            (OutcomeKind::Unroutable, None)
        );
        // A publish to the alternate itself follows the alternate's alternate, once.
        let to_unrouted: &[(&str, Option<&[u8]>)] = &[("exchange", Some(b"unrouted"))];
        let o = t.route(Some(b"stock.us"), to_unrouted, "p/0/4");
        assert_eq!(
            (o.kind, o.alternate.as_deref()),
            (OutcomeKind::Routed, Some("last"))
        );
        // An expired publish goes nowhere, through no alternate.
        let expiring: &[(&str, Option<&[u8]>)] = &[("keep", None), ("expiry", Some(b"1"))];
        let o = t.route_at(Some(b"stock.eu"), expiring, "p/0/5", 0, 5_000);
        assert_eq!((o.kind, o.alternate), (OutcomeKind::Expired, None));
    }

    #[test]
    fn refuses_bad_alternates() {
        for (exchanges, why) in [
            (
                r#"[{"name": "a", "dialect": "amqp", "alternate": "b"}]"#,
                "\"b\" is not listed",
            ),
            (
                r#"[{"name": "a", "dialect": "amqp", "alternate": "a"}]"#,
                "is the exchange itself",
            ),
            (
                r#"[{"name": "a", "dialect": "amqp", "alternate": "m"}, {"name": "m", "dialect": "mqtt"}]"#,
                "must both be AMQP exchanges",
            ),
            (
                r#"[{"name": "a", "dialect": "amqp"}, {"name": "m", "dialect": "mqtt", "alternate": "a"}]"#,
                "must both be AMQP exchanges",
            ),
        ] {
            let json = format!(
                r#"{{"default_exchange": "a", "exchanges": {exchanges}, "subscriptions": []}}"#
            );
            let err = RouteTable::from_json(json.as_bytes()).err().unwrap();
            assert!(err.0.contains(why), "{err}");
        }
    }

    #[test]
    fn ids_header_escapes_as_json_dumps() {
        assert_eq!(ids_header(&["a", "b\"c", "é"]), r#"["a","b\"c","é"]"#);
        assert_eq!(ids_header(&[]), "[]");
    }

    /// A tiny deterministic generator (no dependency).
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) as usize) % n
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len())]
        }
    }

    fn random_subscription(rng: &mut Lcg, id: &str) -> serde_json::Value {
        let words = ["a", "b", "c"];
        let (exchange, filter) = if rng.below(2) == 0 {
            let parts: Vec<&str> = (0..1 + rng.below(3))
                .map(|_| rng.pick(&["a", "b", "c", "*", "#"]))
                .collect();
            ("amq.topic", parts.join("."))
        } else {
            let parts: Vec<&str> = (0..1 + rng.below(3))
                .map(|_| rng.pick(&["a", "b", "c", "+"]))
                .collect();
            let mut filter = parts.join("/");
            if rng.below(4) == 0 {
                filter.push_str("/#");
            }
            if rng.below(8) == 0 {
                filter = format!("$share/{}/{filter}", rng.pick(&words));
            }
            ("mqtt", filter)
        };
        let headers = match rng.below(5) {
            0 => serde_json::json!({"match": "all", "criteria": {"h": rng.pick(&words)}}),
            1 => {
                serde_json::json!({"match": "any", "criteria": {"h": null, "k": rng.pick(&words)}})
            }
            _ => serde_json::Value::Null,
        };
        serde_json::json!({"id": id, "exchange": exchange,
                           "subscriber": format!("w{}", rng.below(6)),
                           "filter": filter, "headers": headers})
    }

    #[test]
    fn a_layered_table_routes_as_the_whole_table_of_the_same_subscriptions() {
        let fields = r#"{"version": 1, "default_exchange": "amq.topic",
          "exchanges": [{"name": "amq.topic", "dialect": "amqp", "share_prefix": null},
                        {"name": "mqtt", "dialect": "mqtt", "share_prefix": "$share/"}]}"#;
        let mut rng = Lcg(7);
        let mut set = SubscriptionSet::new();
        let mut held: std::collections::BTreeMap<String, serde_json::Value> = Default::default();
        let (mut layered, mut whole) = (0, 0);
        for round in 0..300 {
            for _ in 0..1 + rng.below(if round == 0 { 200 } else { 4 }) {
                let id = format!("s{}", rng.below(260));
                if rng.below(4) == 0 {
                    assert_eq!(set.remove(&id), held.remove(&id).is_some());
                } else {
                    let sub = random_subscription(&mut rng, &id);
                    set.put(&id, sub.to_string().as_bytes()).unwrap();
                    held.insert(id, sub);
                }
            }
            let table = set.table(fields.as_bytes()).unwrap();
            let layer = table.layer.as_ref().unwrap();
            if layer.hidden.is_empty() {
                whole += 1
            } else {
                layered += 1
            }
            let mut json: serde_json::Value = serde_json::from_str(fields).unwrap();
            json["subscriptions"] = held.values().cloned().collect();
            let reference = RouteTable::from_json(json.to_string().as_bytes()).unwrap();
            assert_eq!(table.len(), reference.len());
            for p in 0..40 {
                let mqtt = rng.below(2) == 1;
                let parts: Vec<&str> = (0..1 + rng.below(3))
                    .map(|_| rng.pick(&["a", "b", "c"]))
                    .collect();
                let key = parts.join(if mqtt { "/" } else { "." });
                let mut headers: Vec<(&str, Option<&[u8]>)> = Vec::new();
                if mqtt {
                    headers.push(("exchange", Some(b"mqtt")));
                }
                for _ in 0..rng.below(3) {
                    let value: &[u8] = rng.pick(&["a", "b", "c"]).as_bytes();
                    headers.push((rng.pick(&["h", "k"]), Some(value)));
                }
                let id = format!("p/0/{p}");
                assert_eq!(
                    table.route(Some(key.as_bytes()), &headers, &id),
                    reference.route(Some(key.as_bytes()), &headers, &id),
                    "round {round}, publish {key} {headers:?}"
                );
            }
        }
        assert!(
            layered > 100 && whole > 10,
            "layered {layered}, whole {whole}"
        );
    }

    #[test]
    fn a_subscription_set_builds_the_table_of_the_same_json() {
        let json: serde_json::Value = serde_json::from_str(TABLE).unwrap();
        let mut set = SubscriptionSet::new();
        for sub in json["subscriptions"].as_array().unwrap() {
            let id = sub["id"].as_str().unwrap();
            assert!(set.put(id, sub.to_string().as_bytes()).unwrap());
            assert!(
                !set.put(id, sub.to_string().as_bytes()).unwrap(),
                "the same value again"
            );
        }
        let from_set = set.table(TABLE.as_bytes()).unwrap();
        let whole = table();
        for (key, headers) in [
            ("orders.eu.paid", vec![]),
            (
                "sensors/a/temperature",
                vec![
                    ("exchange", Some(&b"mqtt"[..])),
                    ("unit", Some(&b"celsius"[..])),
                    ("x", None),
                ],
            ),
            ("jobs/1", vec![("exchange", Some(&b"mqtt"[..]))]),
        ] {
            let a = from_set.route(Some(key.as_bytes()), &headers, "p/0/7");
            let b = whole.route(Some(key.as_bytes()), &headers, "p/0/7");
            assert_eq!(summary(&a), summary(&b), "{key}");
            assert_eq!(a.kind, b.kind);
        }
        assert_eq!(from_set.len(), 7);
        // A change, a removal and a bad record.
        assert!(set.put("s1", br#"{"id": "s1", "exchange": "amq.topic", "subscriber": "billing", "filter": "orders.*.due", "headers": null}"#).unwrap());
        assert!(set.remove("a9"));
        assert!(!set.remove("a9"));
        assert!(set.put("s9", b"{not json").is_err());
        let t = set.table(br#"{"version": 13, "default_exchange": "amq.topic", "exchanges": [{"name": "amq.topic", "dialect": "amqp", "share_prefix": null}, {"name": "mqtt", "dialect": "mqtt", "share_prefix": "$share/"}]}"#).unwrap();
        assert_eq!(t.len(), 6);
        assert_eq!(t.version(), Some(13));
        let o = t.route(Some(b"orders.eu.due"), &[], "p/0/1");
        assert_eq!(
            summary(&o),
            vec![("billing".to_owned(), vec!["s0".to_owned(), "s1".to_owned()])]
        );
        // A table the set cannot make: a subscription of an unknown exchange.
        let refused = set.table(br#"{"default_exchange": "amq.topic", "exchanges": [{"name": "amq.topic", "dialect": "amqp"}]}"#);
        assert!(refused.is_err());
    }
}

/// `key` decoded as Python's `bytes.decode("utf-8", "backslashreplace")` does
/// (`streaming.kafka.records.text`): each byte of an invalid sequence as `\xhh`.
pub fn backslash_replaced(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len());
    let mut rest = key;
    loop {
        match std::str::from_utf8(rest) {
            Ok(valid) => {
                out.push_str(valid);
                return out;
            }
            Err(error) => {
                let (valid, after) = rest.split_at(error.valid_up_to());
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                let bad = error.error_len().unwrap_or(after.len());
                for byte in &after[..bad] {
                    out.push_str(&format!("\\x{byte:02x}"));
                }
                rest = &after[bad..];
            }
        }
    }
}
