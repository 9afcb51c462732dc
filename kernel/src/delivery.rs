//! The delivery writer: a batch's deliveries produced to Kafka straight from
//! column buffers, with librdkafka's C API (`rdkafka-sys`, librdkafka built
//! into the module), without a Python object per record.
//!
//! `DeliveryWriter(config, shards, secrets)` holds `shards` idempotent
//! producers of the same configuration (the Python side's
//! `ProducerSettings.librdkafka()` and the connection's properties); a topic
//! goes to one shard, chosen by a hash of its name, and keeps its
//! `rd_kafka_topic_t` handle, so a record finds its topic without a lookup by
//! name. `produce(columns)` queues one record per delivery (see
//! [`DeliveryColumns`]) with the GIL released, serving the queue when it is
//! full; each record carries its index as librdkafka's per-message opaque, so
//! a failure comes back naming its exact record. `flush(timeout_ms)` flushes
//! every busy shard at once (a thread each) and returns the records left;
//! `take_events()` hands over what the producers reported since the last
//! call: failed records `(epoch, index, error code)`, client errors
//! `(code, reason)` and log lines `(syslog level, facility, text)`. What the
//! codes mean (a record's fault or the cluster's, an access failure) is the
//! Python side's rule (`streaming/router/batch/delivery.py`), not written here.
//!
//! Secrets: no configuration value is ever put in a message; an error text
//! of librdkafka's is returned with every value of `secrets` replaced.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;
use std::sync::Mutex;

use hashbrown::HashMap;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use rdkafka_sys as rd;
use rdkafka_sys::rd_kafka_vtype_t as vt;

use crate::errors::KernelError;

/// Log lines kept between two `take_events` calls (the rest are counted, not kept).
const LOG_LINES_KEPT: usize = 64;
/// How long a full local queue is served before a record is queued again.
const QUEUE_FULL_POLL_MS: c_int = 50;
const REDACTED: &str = "*****";

/// What one producer's callbacks report, until `take_events` takes it.
#[derive(Default)]
struct Events {
    /// `(opaque, error code)` of each record Kafka did not take.
    failed: Vec<(u64, i32)>,
    errors: Vec<(i32, String)>,
    logs: Vec<(i32, String, String)>,
    logs_dropped: u64,
}

struct Shard {
    rk: *mut rd::rd_kafka_t,
    /// Boxed: its address is the producer's opaque, read by the callbacks.
    events: Box<Mutex<Events>>,
}

// librdkafka's handles are thread-safe; the events are behind a mutex.
unsafe impl Send for Shard {}
unsafe impl Sync for Shard {}

impl Drop for Shard {
    fn drop(&mut self) {
        // Records still queued are dropped (a task that returns has flushed its own).
        unsafe { rd::rd_kafka_destroy(self.rk) };
    }
}

struct Topic(*mut rd::rd_kafka_topic_t);

unsafe impl Send for Topic {}
unsafe impl Sync for Topic {}

/// The delivery writer of a worker process (see the module docs).
#[pyclass(module = "bitroute_kernel")]
pub(crate) struct DeliveryWriter {
    /// Declared before `shards`: topic handles go before their producers.
    topics: HashMap<Vec<u8>, (usize, Topic)>,
    shards: Vec<Shard>,
    /// The current `produce` call's number: the high bits of each record's opaque.
    epoch: u64,
    /// Records refused when queued (an invalid topic name): reported like failures.
    refused: Vec<(u64, i32)>,
}

/// A record's opaque: the `produce` call's epoch in the high bits, its index in the low.
const INDEX_BITS: u32 = 32;
/// Epochs wrap here, so that every epoch fits the opaque's high bits (a router makes
/// a `produce` call per Arrow batch for weeks: never let the count overflow them).
const EPOCHS: u64 = 1 << (64 - INDEX_BITS);

fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret.as_str(), REDACTED);
    }
    out
}

fn c_text(raw: *const c_char) -> String {
    if raw.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(raw) }
            .to_string_lossy()
            .into_owned()
    }
}

fn events_of<'a>(opaque: *mut c_void) -> Option<&'a Mutex<Events>> {
    (!opaque.is_null()).then(|| unsafe { &*(opaque as *const Mutex<Events>) })
}

unsafe extern "C" fn on_delivery(
    _rk: *mut rd::rd_kafka_t,
    message: *const rd::rd_kafka_message_t,
    opaque: *mut c_void,
) {
    let message = &*message;
    if message.err as i32 != 0 {
        if let Some(events) = events_of(opaque) {
            let mut events = events.lock().unwrap_or_else(|e| e.into_inner());
            events
                .failed
                .push((message._private as u64, message.err as i32));
        }
    }
}

unsafe extern "C" fn on_error(
    _rk: *mut rd::rd_kafka_t,
    err: c_int,
    reason: *const c_char,
    opaque: *mut c_void,
) {
    if let Some(events) = events_of(opaque) {
        let mut events = events.lock().unwrap_or_else(|e| e.into_inner());
        if events.errors.len() < LOG_LINES_KEPT {
            events.errors.push((err, c_text(reason)));
        }
    }
}

unsafe extern "C" fn on_log(
    rk: *const rd::rd_kafka_t,
    level: c_int,
    facility: *const c_char,
    text: *const c_char,
) {
    if let Some(events) = events_of(rd::rd_kafka_opaque(rk)) {
        let mut events = events.lock().unwrap_or_else(|e| e.into_inner());
        if events.logs.len() < LOG_LINES_KEPT {
            events.logs.push((level, c_text(facility), c_text(text)));
        } else {
            events.logs_dropped += 1;
        }
    }
}

fn new_producer(config: &[(String, String)], secrets: &[String]) -> PyResult<Shard> {
    let events: Box<Mutex<Events>> = Box::default();
    let mut errstr = [0 as c_char; 512];
    unsafe {
        let conf = rd::rd_kafka_conf_new();
        for (name, value) in config {
            let refused = |why: &str| {
                KernelError::new_err(format!(
                    "librdkafka refused the property {name}: {}",
                    redact(why, secrets)
                ))
            };
            let (Ok(c_name), Ok(c_value)) =
                (CString::new(name.as_str()), CString::new(value.as_str()))
            else {
                rd::rd_kafka_conf_destroy(conf);
                return Err(refused("a NUL byte in the name or value"));
            };
            let res = rd::rd_kafka_conf_set(
                conf,
                c_name.as_ptr(),
                c_value.as_ptr(),
                errstr.as_mut_ptr(),
                errstr.len(),
            );
            if res != rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
                rd::rd_kafka_conf_destroy(conf);
                return Err(refused(&c_text(errstr.as_ptr())));
            }
        }
        rd::rd_kafka_conf_set_dr_msg_cb(conf, Some(on_delivery));
        rd::rd_kafka_conf_set_error_cb(conf, Some(on_error));
        rd::rd_kafka_conf_set_log_cb(conf, Some(on_log));
        rd::rd_kafka_conf_set_opaque(conf, &*events as *const Mutex<Events> as *mut c_void);
        let rk = rd::rd_kafka_new(
            rd::rd_kafka_type_t::RD_KAFKA_PRODUCER,
            conf,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        if rk.is_null() {
            rd::rd_kafka_conf_destroy(conf);
            return Err(KernelError::new_err(format!(
                "librdkafka could not make a producer: {}",
                redact(&c_text(errstr.as_ptr()), secrets)
            )));
        }
        Ok(Shard { rk, events })
    }
}

/// A binary column: Arrow's `offsets` (int32, one more than the values, into
/// `data`) and `valid` (uint8 per value, empty when every value is set).
#[derive(FromPyObject)]
pub(crate) struct BinaryColumn<'py> {
    offsets: Bound<'py, PyAny>,
    data: Bound<'py, PyAny>,
    valid: Bound<'py, PyAny>,
}

/// One batch's deliveries, as `streaming.router.batch.delivery.DeliveryColumns`
/// hands them over (read by attribute). Delivery `i` belongs to publish
/// `rows[i]` (int64) and goes to topic `topics[i]`; its key is `keys[i]`
/// when `keys_per_delivery`, else `keys[rows[i]]`; its value
/// `values[rows[i]]`. Its headers, in this order: the publish's kept headers
/// (`header_names` / `header_values` from `header_offsets[r]` to
/// `header_offsets[r + 1]`, int32), the routing key (`keys` of the publish,
/// under `routing_key_header`) when that is set, the message id
/// (`message_ids[r]`), the subscription ids (`subscription_ids[i]`), the
/// snapshot version (`version`): `header_names_router` names the last three.
#[derive(FromPyObject)]
pub(crate) struct DeliveryColumns<'py> {
    topics: BinaryColumn<'py>,
    rows: Bound<'py, PyAny>,
    keys: BinaryColumn<'py>,
    keys_per_delivery: bool,
    routing_keys: BinaryColumn<'py>,
    routing_key_header: Option<String>,
    values: BinaryColumn<'py>,
    header_offsets: Bound<'py, PyAny>,
    header_names: BinaryColumn<'py>,
    header_values: BinaryColumn<'py>,
    message_ids: BinaryColumn<'py>,
    subscription_ids: BinaryColumn<'py>,
    version: Vec<u8>,
    header_names_router: (String, String, String),
}

/// A buffer's contents as a slice, valid while the buffer is held.
fn slice_of<'b, T: pyo3::buffer::Element>(py: Python<'_>, buffer: &'b PyBuffer<T>) -> &'b [T] {
    let cells = buffer.as_slice(py).unwrap_or(&[]);
    // ReadOnlyCell<T> is repr(transparent) over T; nothing writes these buffers while we read.
    unsafe { std::slice::from_raw_parts(cells.as_ptr() as *const T, cells.len()) }
}

fn buffer<T: pyo3::buffer::Element>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PyBuffer<T>> {
    let buffer =
        PyBuffer::<T>::get(obj).map_err(|e| KernelError::new_err(format!("{what}: {e}")))?;
    if !buffer.is_c_contiguous() {
        return Err(KernelError::new_err(format!("{what}: not contiguous")));
    }
    Ok(buffer)
}

struct Held {
    offsets: PyBuffer<i32>,
    data: PyBuffer<u8>,
    valid: PyBuffer<u8>,
}

/// A checked binary column: every value is inside `data`.
#[derive(Clone, Copy)]
struct Column<'a> {
    offsets: &'a [i32],
    data: &'a [u8],
    valid: &'a [u8],
}

impl<'a> Column<'a> {
    /// Value `k` (None: null). `k < len()`.
    #[inline]
    fn get(&self, k: usize) -> Option<&'a [u8]> {
        if !self.valid.is_empty() && self.valid[k] == 0 {
            return None;
        }
        Some(&self.data[self.offsets[k] as usize..self.offsets[k + 1] as usize])
    }
}

fn hold(column: &BinaryColumn<'_>, what: &str) -> PyResult<Held> {
    Ok(Held {
        offsets: buffer(&column.offsets, &format!("{what} offsets"))?,
        data: buffer(&column.data, &format!("{what} data"))?,
        valid: buffer(&column.valid, &format!("{what} validity"))?,
    })
}

fn checked<'a>(py: Python<'_>, held: &'a Held, n: usize, what: &str) -> PyResult<Column<'a>> {
    let column = Column {
        offsets: slice_of(py, &held.offsets),
        data: slice_of(py, &held.data),
        valid: slice_of(py, &held.valid),
    };
    let fits = column.offsets.len() == n + 1
        && column.offsets.first().is_some_and(|&o| o >= 0)
        && column.offsets.windows(2).all(|w| w[0] <= w[1])
        && column.offsets[n] as usize <= column.data.len()
        && (column.valid.is_empty() || column.valid.len() == n);
    if !fits {
        return Err(KernelError::new_err(format!(
            "{what}: expected {n} values (offsets non-decreasing, inside the data)"
        )));
    }
    Ok(column)
}

fn shard_of(topic: &[u8], shards: usize) -> usize {
    // FNV-1a: any spread will do, it only has to be the same for a topic every time.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in topic {
        hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
    }
    (hash % shards as u64) as usize
}

/// Everything one record needs, read from the columns.
struct Record<'a> {
    topic: &'a [u8],
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
}

#[pymethods]
impl DeliveryWriter {
    #[new]
    fn new(config: Vec<(String, String)>, shards: usize, secrets: Vec<String>) -> PyResult<Self> {
        if shards == 0 {
            return Err(KernelError::new_err(
                "a delivery writer needs at least one shard",
            ));
        }
        let shards = (0..shards)
            .map(|_| new_producer(&config, &secrets))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(DeliveryWriter {
            topics: HashMap::new(),
            shards,
            epoch: 0,
            refused: Vec::new(),
        })
    }

    /// Queue one record per delivery of `columns`; returns this call's epoch
    /// (the failures `take_events` reports carry it, with the record's index).
    fn produce(&mut self, py: Python<'_>, columns: DeliveryColumns<'_>) -> PyResult<u64> {
        let rows_held = buffer::<i64>(&columns.rows, "rows")?;
        let rows = slice_of(py, &rows_held);
        let n = rows.len();
        let held = [
            hold(&columns.topics, "topics")?,
            hold(&columns.keys, "keys")?,
            hold(&columns.routing_keys, "routing keys")?,
            hold(&columns.values, "values")?,
            hold(&columns.header_names, "header names")?,
            hold(&columns.header_values, "header values")?,
            hold(&columns.message_ids, "message ids")?,
            hold(&columns.subscription_ids, "subscription ids")?,
        ];
        let publishes = slice_of(py, &held[3].offsets).len().saturating_sub(1);
        let topics = checked(py, &held[0], n, "topics")?;
        let keys = checked(
            py,
            &held[1],
            if columns.keys_per_delivery {
                n
            } else {
                publishes
            },
            "keys",
        )?;
        let routing_keys = checked(py, &held[2], publishes, "routing keys")?;
        let values = checked(py, &held[3], publishes, "values")?;
        let offsets_held = buffer::<i32>(&columns.header_offsets, "header offsets")?;
        let header_offsets = slice_of(py, &offsets_held);
        let n_headers = slice_of(py, &held[4].offsets).len().saturating_sub(1);
        let header_names = checked(py, &held[4], n_headers, "header names")?;
        let header_values = checked(py, &held[5], n_headers, "header values")?;
        let message_ids = checked(py, &held[6], publishes, "message ids")?;
        let subscription_ids = checked(py, &held[7], n, "subscription ids")?;
        if header_offsets.len() != publishes + 1
            || header_offsets.windows(2).any(|w| w[0] > w[1] || w[0] < 0)
            || header_offsets
                .last()
                .is_some_and(|&o| o as usize > n_headers)
        {
            return Err(KernelError::new_err(
                "header offsets: expected one more than the publishes",
            ));
        }
        if rows.iter().any(|&r| r < 0 || r as usize >= publishes) {
            return Err(KernelError::new_err("rows: a publish row out of range"));
        }
        let (mid_name, ids_name, version_name) = &columns.header_names_router;
        let routing_key_header = columns.routing_key_header.as_deref();
        let version = columns.version.as_slice();
        let keys_per_delivery = columns.keys_per_delivery;

        if n as u64 >= 1 << INDEX_BITS {
            return Err(KernelError::new_err(
                "too many deliveries for one produce call",
            ));
        }
        self.epoch = (self.epoch + 1) % EPOCHS;
        let epoch = self.epoch;
        py.allow_threads(|| {
            for i in 0..n {
                let r = rows[i] as usize;
                let record = Record {
                    topic: topics.get(i).unwrap_or(&[]),
                    key: keys.get(if keys_per_delivery { i } else { r }),
                    value: values.get(r),
                };
                let tag = (epoch << INDEX_BITS) | i as u64;
                let headers = unsafe {
                    let (first, last) =
                        (header_offsets[r] as usize, header_offsets[r + 1] as usize);
                    let hdrs = rd::rd_kafka_headers_new(last - first + 4);
                    for h in first..last {
                        add_header(
                            hdrs,
                            header_names.get(h).unwrap_or(&[]),
                            header_values.get(h),
                        );
                    }
                    if let Some(name) = routing_key_header {
                        add_header(hdrs, name.as_bytes(), routing_keys.get(r));
                    }
                    add_header(hdrs, mid_name.as_bytes(), message_ids.get(r));
                    add_header(hdrs, ids_name.as_bytes(), subscription_ids.get(i));
                    add_header(hdrs, version_name.as_bytes(), Some(version));
                    hdrs
                };
                self.produce_one(&record, headers, tag);
            }
        });
        Ok(epoch)
    }

    /// Flush every busy shard at once, for at most `timeout_ms`; the records left.
    fn flush(&self, py: Python<'_>, timeout_ms: i32) -> usize {
        py.allow_threads(|| {
            let busy: Vec<&Shard> = self
                .shards
                .iter()
                .filter(|s| unsafe { rd::rd_kafka_outq_len(s.rk) } > 0)
                .collect();
            match busy.as_slice() {
                [] => {}
                [one] => unsafe {
                    rd::rd_kafka_flush(one.rk, timeout_ms);
                },
                _ => std::thread::scope(|scope| {
                    for shard in &busy {
                        scope.spawn(move || unsafe { rd::rd_kafka_flush(shard.rk, timeout_ms) });
                    }
                }),
            }
            self.shards
                .iter()
                .map(|s| unsafe { rd::rd_kafka_outq_len(s.rk) }.max(0) as usize)
                .sum()
        })
    }

    /// What the producers reported since the last call: `(failed, errors, logs)`,
    /// `failed` as `(epoch, index, code)`.
    #[allow(clippy::type_complexity)]
    fn take_events(
        &mut self,
    ) -> (
        Vec<(u64, u64, i32)>,
        Vec<(i32, String)>,
        Vec<(i32, String, String)>,
    ) {
        let mask = (1u64 << INDEX_BITS) - 1;
        let mut failed: Vec<(u64, u64, i32)> = self
            .refused
            .drain(..)
            .map(|(tag, code)| (tag >> INDEX_BITS, tag & mask, code))
            .collect();
        let (mut errors, mut logs) = (Vec::new(), Vec::new());
        for shard in &self.shards {
            let mut events = shard.events.lock().unwrap_or_else(|e| e.into_inner());
            failed.extend(
                events
                    .failed
                    .drain(..)
                    .map(|(tag, code)| (tag >> INDEX_BITS, tag & mask, code)),
            );
            errors.append(&mut events.errors);
            logs.append(&mut events.logs);
            if events.logs_dropped > 0 {
                logs.push((
                    7,
                    "BITROUTE".into(),
                    format!("{} more log lines dropped", events.logs_dropped),
                ));
                events.logs_dropped = 0;
            }
        }
        (failed, errors, logs)
    }
}

/// Add one header (`value` None: a null value) to `hdrs`; librdkafka copies both.
unsafe fn add_header(hdrs: *mut rd::rd_kafka_headers_t, name: &[u8], value: Option<&[u8]>) {
    let (ptr, len) = match value {
        Some(v) => (v.as_ptr() as *const c_void, v.len() as isize),
        None => (ptr::null(), 0),
    };
    rd::rd_kafka_header_add(
        hdrs,
        name.as_ptr() as *const c_char,
        name.len() as isize,
        ptr,
        len,
    );
}

impl DeliveryWriter {
    /// The shard and topic handle of `topic` (made on first use); None if librdkafka refuses the name.
    fn topic(&mut self, topic: &[u8]) -> Result<(usize, *mut rd::rd_kafka_topic_t), i32> {
        if let Some((shard, handle)) = self.topics.get(topic) {
            return Ok((*shard, handle.0));
        }
        let shard = shard_of(topic, self.shards.len());
        let name = CString::new(topic)
            .map_err(|_| rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__INVALID_ARG as i32)?;
        let handle = unsafe {
            rd::rd_kafka_topic_new(self.shards[shard].rk, name.as_ptr(), ptr::null_mut())
        };
        if handle.is_null() {
            return Err(unsafe { rd::rd_kafka_last_error() } as i32);
        }
        self.topics.insert(topic.to_vec(), (shard, Topic(handle)));
        Ok((shard, handle))
    }

    /// Queue one record (its headers are handed over, or destroyed if it is refused).
    fn produce_one(&mut self, record: &Record<'_>, headers: *mut rd::rd_kafka_headers_t, tag: u64) {
        let (shard, rkt) = match self.topic(record.topic) {
            Ok(found) => found,
            Err(code) => {
                unsafe { rd::rd_kafka_headers_destroy(headers) };
                self.refused.push((tag, code));
                return;
            }
        };
        let rk = self.shards[shard].rk;
        let bytes = |v: Option<&[u8]>| match v {
            Some(v) => rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                ptr: v.as_ptr() as *mut c_void,
                size: v.len(),
            },
            None => rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                ptr: ptr::null_mut(),
                size: 0,
            },
        };
        let vu = |vtype, u| rd::rd_kafka_vu_t { vtype, u };
        use rd::rd_kafka_vu_s__bindgen_ty_1 as U;
        let args = [
            vu(vt::RD_KAFKA_VTYPE_RKT, U { rkt }),
            vu(vt::RD_KAFKA_VTYPE_PARTITION, U { i32_: -1 }), // RD_KAFKA_PARTITION_UA
            vu(
                vt::RD_KAFKA_VTYPE_MSGFLAGS,
                U {
                    i: rd::RD_KAFKA_MSG_F_COPY,
                },
            ),
            vu(
                vt::RD_KAFKA_VTYPE_VALUE,
                U {
                    mem: bytes(record.value),
                },
            ),
            vu(
                vt::RD_KAFKA_VTYPE_KEY,
                U {
                    mem: bytes(record.key),
                },
            ),
            vu(vt::RD_KAFKA_VTYPE_HEADERS, U { headers }),
            vu(
                vt::RD_KAFKA_VTYPE_OPAQUE,
                U {
                    ptr: tag as *mut c_void,
                },
            ),
        ];
        loop {
            let error = unsafe { rd::rd_kafka_produceva(rk, args.as_ptr(), args.len()) };
            if error.is_null() {
                return; // the headers belong to the record now
            }
            let code = unsafe {
                let code = rd::rd_kafka_error_code(error);
                rd::rd_kafka_error_destroy(error);
                code
            };
            if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__QUEUE_FULL {
                unsafe { rd::rd_kafka_poll(rk, QUEUE_FULL_POLL_MS) };
                continue;
            }
            unsafe { rd::rd_kafka_headers_destroy(headers) };
            self.refused.push((tag, code as i32));
            return;
        }
    }
}

impl Drop for DeliveryWriter {
    fn drop(&mut self) {
        for (_, (_, topic)) in self.topics.drain() {
            unsafe { rd::rd_kafka_topic_destroy(topic.0) };
        }
    }
}
