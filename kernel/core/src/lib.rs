//! bitroute's matching core, pure Rust (no Python, no JVM): what the Python
//! module `bitroute_kernel` (`kernel/src`) and the realtime mode's JNI
//! library `bitroute_jni` (`kernel/jni`) share, so that both match with one
//! implementation.
//!
//! - [`dialect`]: the topic rules of AMQP and MQTT (`compiler/amqp.py`,
//!   `compiler/mqtt.py`); the rules of the grammar that `compiler/` owns
//!   (the shared-subscription prefix) are handed in.
//! - [`trie`]: per exchange, the exact filters in one hash table
//!   ([`exact`]) and the wildcard filters in a trie; a topic is one lookup
//!   and one walk of its words. Leaves hold *hit codes* (see
//!   `compiler/resolve.py`).
//! - [`route`]: [`RouteTable`], a publish's whole outcome (exchange, reason,
//!   deliveries) from a routing table in JSON, as the micro-batch path
//!   decides it (docs: the realtime contract, sections 1 and 2).
//! - [`expiry`]: MQTT 5's message expiry interval (the `expiry` header):
//!   expired, remaining or invalid, for both modes.
//! - [`pytext`]: Python's text forms (`repr`, `quote`, UTF-8 decode errors,
//!   `json.dumps`) that reasons and headers are made of.

pub mod dialect;
pub mod exact;
pub mod expiry;
mod printable;
pub mod pytext;
pub mod route;
pub mod trie;

pub use expiry::{expiry_of, Expiry};
pub use route::{Delivery, Outcome, OutcomeKind, RouteTable, SubscriptionSet, TableError};
