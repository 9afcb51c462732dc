//! `expiry_states`: the core's message expiry rule (`bitroute_core::expiry`)
//! over a batch's expiry headers, for the micro-batch path
//! (`streaming/router/batch/routing.py`), so that both modes decide alike.

use bitroute_core::expiry::{expiry_at, Expiry};
use pyo3::prelude::*;

/// One state per publish: the remaining interval in seconds (`int >= 1`),
/// `0` when expired, or the reason (`str`) its header is invalid.
#[derive(IntoPyObject)]
pub(crate) enum State {
    Seconds(u64),
    Reason(String),
}

/// `expiry_states(values, published_ms, now_ms)`: for each publish, the
/// value of its last `expiry` header (`None`: a null value) and its Kafka
/// timestamp (epoch ms), routed at `now_ms`: see [`State`].
#[pyfunction]
pub(crate) fn expiry_states(
    values: Vec<Option<Vec<u8>>>,
    published_ms: Vec<i64>,
    now_ms: i64,
) -> PyResult<Vec<State>> {
    if values.len() != published_ms.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "expiry_states: {} values but {} timestamps",
            values.len(),
            published_ms.len()
        )));
    }
    Ok(values
        .iter()
        .zip(published_ms)
        .map(
            |(value, published)| match expiry_at(value.as_deref(), published, now_ms) {
                Expiry::Remaining(seconds) => State::Seconds(u64::from(seconds)),
                Expiry::Expired | Expiry::Never => State::Seconds(0),
                Expiry::Invalid(reason) => State::Reason(reason),
            },
        )
        .collect())
}
