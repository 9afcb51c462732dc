//! The Python class `RouteTable`: the core's routing table of the realtime
//! mode (`bitroute_core::RouteTable`, the one the JNI library routes with),
//! so that Python tests hold its every answer against the micro-batch path.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::TableError;

/// A routing table from its JSON (the realtime contract, section 2).
#[pyclass(frozen, module = "bitroute_kernel")]
pub(crate) struct RouteTable {
    table: bitroute_core::RouteTable,
}

/// One delivery as Python sees it: `(subscriber, ids_header, [ids])`.
type PyDelivery<'t> = (&'t str, String, Vec<&'t str>);

/// An outcome as Python sees it: `(outcome, exchange, routing_key, reason, deliveries,
/// alternate)`.
type PyOutcome<'t> = (
    u8,
    Option<String>,
    Option<String>,
    Option<String>,
    Vec<PyDelivery<'t>>,
    Option<String>,
);

#[pymethods]
impl RouteTable {
    /// `RouteTable(table_json)`; raises `TableError` for a table it cannot read.
    #[new]
    fn new(py: Python<'_>, table_json: &[u8]) -> PyResult<Self> {
        py.allow_threads(|| bitroute_core::RouteTable::from_json(table_json))
            .map(|table| RouteTable { table })
            .map_err(|e| TableError::new_err(e.0))
    }

    /// The table's `version` (`None` when it has none).
    #[getter]
    fn version(&self) -> Option<i64> {
        self.table.version()
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }

    /// `route(key, headers, message_id)`: `(outcome, exchange, routing_key,
    /// reason, deliveries, alternate)` with outcome 0 routed, 1 unroutable, 2
    /// rejected, deliveries `[(subscriber, ids_header, [ids])]` and alternate
    /// the alternate exchange that took them (`None`: its own exchange did).
    #[pyo3(signature = (key, headers, message_id))]
    fn route<'t>(
        &'t self,
        key: Option<&Bound<'_, PyBytes>>,
        headers: Vec<(String, Option<Vec<u8>>)>,
        message_id: &str,
    ) -> PyOutcome<'t> {
        let outcome = self
            .table
            .route(key.map(|k| k.as_bytes()), &borrowed(&headers), message_id);
        Self::tuple(outcome)
    }

    /// `route_at(key, headers, message_id, published_ms, now_ms)`: `route`'s
    /// tuple with the publish's expiry applied (outcome 3: expired), then
    /// the remaining interval its deliveries carry (`None`: no expiry).
    #[pyo3(signature = (key, headers, message_id, published_ms, now_ms))]
    fn route_at<'t>(
        &'t self,
        key: Option<&Bound<'_, PyBytes>>,
        headers: Vec<(String, Option<Vec<u8>>)>,
        message_id: &str,
        published_ms: i64,
        now_ms: i64,
    ) -> (PyOutcome<'t>, Option<u32>) {
        let outcome = self.table.route_at(
            key.map(|k| k.as_bytes()),
            &borrowed(&headers),
            message_id,
            published_ms,
            now_ms,
        );
        let remaining = outcome.remaining;
        (Self::tuple(outcome), remaining)
    }
}

impl RouteTable {
    fn tuple(outcome: bitroute_core::Outcome<'_>) -> PyOutcome<'_> {
        (
            outcome.kind as u8,
            outcome.exchange,
            outcome.routing_key,
            outcome.reason,
            outcome
                .deliveries
                .into_iter()
                .map(|d| (d.subscriber, d.ids_header, d.ids))
                .collect(),
            outcome.alternate,
        )
    }
}

/// The headers as the core takes them: borrowed names and values, in order.
fn borrowed(headers: &[(String, Option<Vec<u8>>)]) -> Vec<(&str, Option<&[u8]>)> {
    headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_deref()))
        .collect()
}
