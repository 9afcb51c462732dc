//! bitroute's matching kernel: the part of `compiler.matcher.Matcher` that
//! runs once per topic (or per topic and subscription), in Rust. The
//! matching itself (dialects, trie, exact table, the realtime mode's
//! `RouteTable`) is the pure-Rust core, `bitroute-core` (`core/`), shared
//! with the JNI library of the realtime mode (`jni/`); this crate is its
//! Python face.
//!
//! - `trie` (core): per exchange, the exact filters in one hash map and the
//!   wildcard filters in a trie; a topic is one lookup and one walk of its
//!   words, whatever the number of subscriptions. Leaves hold *hit codes*,
//!   exactly as the Python side defines them (`compiler/resolve.py`): a code
//!   `h >= 0` is the subscription slot of a filter held by one subscription
//!   without conditions; `h < 0` stands for filter slot `!h`, whose
//!   subscriptions are a CSR range and which may be *special* (header
//!   criteria or a shared group: per-message conditions the Python side
//!   applies).
//! - `exact` (core): the exact filters' hash table, one cache line per entry.
//! - [`kernel`]: the Python class `Kernel` of one snapshot: one topic to its
//!   finished `Delivery` tuples (`deliveries`), a batch's keys or distinct
//!   topics to their slots in output order (`match_keys`, `match_topics`),
//!   or `None`/-1 where the Python side must answer (an invalid topic, for
//!   its exact error; a special filter hit).
//! - [`layout`]: a batch's Arrow deliveries column (`Kernel.layout`).
//! - [`delivery`]: `DeliveryWriter`, a batch's deliveries produced to Kafka
//!   from column buffers with librdkafka (`rdkafka-sys`), no Python object
//!   per record.
//! - [`offline`]: `bitroute match` on the same trie, for the files it reads
//!   exactly as the Python reference path does.
//! - [`dialect`]: the grammar `compiler/` hands in (the MQTT
//!   shared-subscription prefix); the topic rules of AMQP and MQTT are the
//!   core's.
//! - [`route_table`]: the Python class `RouteTable`, the core's routing
//!   table of the realtime mode, for tests that hold it against the
//!   micro-batch path.
//! - [`expiry`]: `expiry_states`, the core's message expiry rule over a
//!   batch's `expiry` headers (the micro-batch path's).
//! - [`errors`]: the exception classes (`KernelError` and its subclasses).
//!
//! The Python face is typed in `bitroute_kernel.pyi` (installed with the
//! module, with `py.typed`).
//!
//! Semantics mirror `compiler/amqp.py` and `compiler/mqtt.py` (validation
//! of topics, splitting, `*`/`+` one word, `#` zero or more words, the MQTT
//! rule that a filter starting with a wildcard does not match a topic
//! starting with `$`); `tests/compiler/test_properties.py` checks them
//! against the reference matcher.

mod delivery;
mod dialect;
mod errors;
mod expiry;
mod kernel;
mod layout;
mod offline;
mod route_table;

use bitroute_core::trie;

use pyo3::prelude::*;

#[pymodule]
fn bitroute_kernel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KernelError", py.get_type::<errors::KernelError>())?;
    m.add("TableError", py.get_type::<errors::TableError>())?;
    m.add(
        "ColumnOverflowError",
        py.get_type::<errors::ColumnOverflowError>(),
    )?;
    m.add_class::<kernel::Kernel>()?;
    m.add_class::<delivery::DeliveryWriter>()?;
    m.add_class::<offline::OfflineOutput>()?;
    m.add_class::<route_table::RouteTable>()?;
    m.add_function(wrap_pyfunction!(offline::offline_match, m)?)?;
    m.add_function(wrap_pyfunction!(expiry::expiry_states, m)?)?;
    Ok(())
}
