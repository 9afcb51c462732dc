//! The matching kernel of one snapshot: the Python class `Kernel`.

use hashbrown::HashMap;
use pyo3::buffer::PyBuffer;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple, PyType};

use crate::dialect::Grammar;
use crate::errors::{ColumnOverflowError, TableError};
use crate::trie::{with_scratch, Hit, Scratch, Trie, NONE};

/// What resolving one topic's hit codes found.
pub(crate) enum Resolved {
    /// The topic's subscriptions, in `scratch.entries`, sorted.
    Slots,
    /// A filter with per-message conditions matched: the Python side resolves it.
    Special,
}

/// Per subscription slot, what ordering, grouping and writing its
/// deliveries need, side by side (one memory read per delivered
/// subscription; the hot paths get rank and subscriber from the hits, see
/// [`Hit`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct SlotInfo {
    pub(crate) rank: u32,
    pub(crate) subscriber: u32,
    /// Where the slot's id is in `Kernel::id_data`.
    pub(crate) id_start: u32,
    pub(crate) id_len: u32,
}

/// The matching kernel of one snapshot (see the crate docs).
#[pyclass(frozen, module = "bitroute_kernel")]
pub(crate) struct Kernel {
    pub(crate) tries: Vec<Trie>,
    pub(crate) slots: Vec<SlotInfo>,
    pub(crate) fs_start: Vec<u32>,
    pub(crate) fs_count: Vec<u32>,
    pub(crate) fs_slots: Vec<u32>,
    /// `rank[fs_slots[i]]` and the slot's subscriber, side by side with `fs_slots`.
    pub(crate) fs_ranks: Vec<u32>,
    pub(crate) fs_subscribers: Vec<u32>,
    pub(crate) special: Vec<bool>,
    pub(crate) names: Py<PyList>,
    /// Each subscription slot's id as a str, made at load from the Arrow
    /// column: held here, not in a Python list, so the collector never
    /// traverses a million entries (it did, 20-25 ms in the first batch
    /// after each load at a million subscriptions). Made eagerly: made on
    /// first delivery instead, a cold `match()` took 0.5 us longer.
    pub(crate) ids: Vec<Py<PyString>>,
    /// The same ids (see [`SlotInfo`]) and the subscriber names as UTF-8,
    /// for writing the Arrow output of a batch ([`Kernel::layout`]).
    pub(crate) id_data: Vec<u8>,
    pub(crate) name_offsets: Vec<u32>,
    pub(crate) name_data: Vec<u8>,
    pub(crate) delivery: Py<PyType>,
}

/// A string column as `compiler.tables.StringColumn` hands it over:
/// `offsets` (int64, one more than the strings) and `data` (uint8).
#[derive(FromPyObject)]
pub(crate) struct StringColumn<'py> {
    offsets: Bound<'py, PyAny>,
    data: Bound<'py, PyAny>,
}

impl StringColumn<'_> {
    /// `(offsets, data)`, the offsets checked against the data.
    fn read(&self, py: Python<'_>, what: &str) -> PyResult<(Vec<u32>, Vec<u8>)> {
        let data = PyBuffer::<u8>::get(&self.data)
            .and_then(|b| b.to_vec(py))
            .map_err(|e| {
                TableError::new_err(format!("{what} data: expected a uint8 buffer ({e})"))
            })?;
        let offsets = u32_of(
            py,
            &self.offsets,
            data.len() + 1,
            &format!("{what} offsets"),
        )?;
        if offsets.is_empty() || offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err(TableError::new_err(format!(
                "{what} offsets must be non-decreasing, one more than the strings"
            )));
        }
        Ok((offsets, data))
    }
}

/// The string `k` of a column read by [`StringColumn::read`] (`text`: its data as UTF-8).
fn string_at<'a>(text: &'a str, offsets: &[u32], k: usize, what: &str) -> PyResult<&'a str> {
    text.get(offsets[k] as usize..offsets[k + 1] as usize)
        .ok_or_else(|| TableError::new_err(format!("{what}: an offset splits a character")))
}

fn utf8<'a>(data: &'a [u8], what: &str) -> PyResult<&'a str> {
    std::str::from_utf8(data).map_err(|e| TableError::new_err(format!("{what}: not UTF-8 ({e})")))
}

/// The tables of one snapshot, as `compiler.tables.KernelTables` hands them
/// over (read by attribute; typed in `bitroute_kernel.pyi`). Arrays are
/// int64 unless stated.
///
/// `names[k]`: subscriber number `k`'s name (a list that must not change
/// while the kernel lives; also as a string column, `name_text`). Per
/// subscription slot: its id (`ids`), `rank[slot]` its position in
/// (subscriber, id) order, `owners[slot]` its subscriber's number. Per
/// filter slot: its subscriptions (CSR `filter_start`, `filter_count` into
/// `filter_slots`), `special` (uint8: has per-message conditions), its text
/// (`filter_text`), its exchange (a number into `grammars`; -1: a free slot)
/// and its hit code (`hit_code`, see the crate docs).
#[derive(FromPyObject)]
pub(crate) struct Tables<'py> {
    delivery_type: Bound<'py, PyType>,
    names: Bound<'py, PyList>,
    name_text: StringColumn<'py>,
    ids: StringColumn<'py>,
    rank: Bound<'py, PyAny>,
    owners: Bound<'py, PyAny>,
    filter_start: Bound<'py, PyAny>,
    filter_count: Bound<'py, PyAny>,
    filter_slots: Bound<'py, PyAny>,
    special: Bound<'py, PyAny>,
    grammars: Vec<Grammar>,
    filter_text: StringColumn<'py>,
    filter_exchange: Bound<'py, PyAny>,
    hit_code: Bound<'py, PyAny>,
}

/// Per filter slot, its subscriptions (CSR) and whether it has per-message conditions.
struct FilterSlots {
    start: Vec<u32>,
    count: Vec<u32>,
    slots: Vec<u32>,
    special: Vec<bool>,
}

impl FilterSlots {
    fn read(py: Python<'_>, tables: &Tables<'_>, n_slots: usize) -> PyResult<Self> {
        let slots = u32_of(py, &tables.filter_slots, n_slots, "filter_slots")?;
        let start = u32_of(py, &tables.filter_start, slots.len() + 1, "filter_start")?;
        let count = u32_of(py, &tables.filter_count, slots.len() + 1, "filter_count")?;
        let special: Vec<bool> = PyBuffer::<u8>::get(&tables.special)
            .and_then(|b| b.to_vec(py))
            .map_err(|e| TableError::new_err(format!("special: expected a uint8 array ({e})")))?
            .into_iter()
            .map(|v| v != 0)
            .collect();
        if start.len() != special.len() || count.len() != special.len() {
            return Err(TableError::new_err(
                "filter_start, filter_count and special need one entry per filter slot",
            ));
        }
        if start
            .iter()
            .zip(&count)
            .any(|(&s, &c)| s as usize + c as usize > slots.len())
        {
            return Err(TableError::new_err(
                "filter_start + filter_count beyond filter_slots",
            ));
        }
        Ok(FilterSlots {
            start,
            count,
            slots,
            special,
        })
    }
}

/// An int64 array's values as u32, each checked to be below `bound`, read
/// in one pass over the buffer (no intermediate copy: batch columns hold
/// tens of millions of slots).
pub(crate) fn u32_of(
    py: Python<'_>,
    buffer: &Bound<'_, PyAny>,
    bound: usize,
    what: &str,
) -> PyResult<Vec<u32>> {
    let array = PyBuffer::<i64>::get(buffer).map_err(|e| {
        TableError::new_err(format!("{what}: expected a contiguous int64 array ({e})"))
    })?;
    let values = array
        .as_slice(py)
        .ok_or_else(|| TableError::new_err(format!("{what}: expected a contiguous int64 array")))?;
    values
        .iter()
        .map(|cell| {
            let v = cell.get();
            if v >= 0 && (v as u64) < bound as u64 && v < NONE as i64 {
                Ok(v as u32)
            } else {
                Err(TableError::new_err(format!(
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
            TableError::new_err(format!("{what}: expected a contiguous int64 array ({e})"))
        })
}

#[pymethods]
impl Kernel {
    /// `Kernel(tables)`: the kernel of one snapshot (see [`Tables`]).
    /// Raises `TableError` for inconsistent tables.
    #[new]
    pub(crate) fn new(py: Python<'_>, tables: Tables<'_>) -> PyResult<Self> {
        if !tables.delivery_type.is_subclass_of::<PyTuple>()? {
            return Err(TableError::new_err(
                "delivery_type must be a tuple subclass",
            ));
        }
        let (name_offsets, name_data) = tables.name_text.read(py, "names")?;
        if name_offsets.len() != tables.names.len() + 1 {
            return Err(TableError::new_err(
                "names and their string column differ in length",
            ));
        }
        let (id_offsets, id_data) = tables.ids.read(py, "ids")?;
        let id_text = utf8(&id_data, "ids")?;
        let ids = (0..id_offsets.len() - 1)
            .map(|k| Ok(PyString::new(py, string_at(id_text, &id_offsets, k, "ids")?).unbind()))
            .collect::<PyResult<Vec<_>>>()?;
        let n_slots = ids.len();
        let rank = u32_of(py, &tables.rank, n_slots.max(1), "rank")?;
        let owners = u32_of(py, &tables.owners, tables.names.len().max(1), "owners")?;
        if rank.len() != n_slots || owners.len() != n_slots {
            return Err(TableError::new_err(
                "rank and owners need one entry per subscription slot",
            ));
        }
        let filters = FilterSlots::read(py, &tables, n_slots)?;
        let tries = Self::tries(py, &tables, filters.special.len(), &rank, &owners)?;
        let slots = (0..n_slots)
            .map(|k| SlotInfo {
                rank: rank[k],
                subscriber: owners[k],
                id_start: id_offsets[k],
                id_len: id_offsets[k + 1] - id_offsets[k],
            })
            .collect();
        Ok(Kernel {
            tries,
            slots,
            fs_ranks: filters.slots.iter().map(|&s| rank[s as usize]).collect(),
            fs_subscribers: filters.slots.iter().map(|&s| owners[s as usize]).collect(),
            fs_start: filters.start,
            fs_count: filters.count,
            fs_slots: filters.slots,
            special: filters.special,
            names: tables.names.unbind(),
            ids,
            id_data,
            name_offsets,
            name_data,
            delivery: tables.delivery_type.unbind(),
        })
    }

    /// The finished deliveries of one topic of exchange number `exchange`: a
    /// tuple of `Delivery` (by subscriber; ids by rank), or `None` when the
    /// Python side must answer: the topic is not a valid str topic (its
    /// grammar names the error) or a matched filter has per-message
    /// conditions.
    pub(crate) fn deliveries(
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
            match self.resolve(scratch) {
                Resolved::Special => Ok(py.None()),
                Resolved::Slots => self.delivery_tuple(py, scratch),
            }
        })
    }

    /// The subscription slots of hit codes (each once), conditions ignored,
    /// in (subscriber, id) order: the slot form of a result whose
    /// per-message conditions the Python side applies.
    pub(crate) fn ordered_slots(&self, codes: Vec<i64>) -> PyResult<Vec<i64>> {
        let n_slots = self.slots.len() as i64;
        let n_filters = self.special.len() as i64;
        if let Some(bad) = codes.iter().find(|&&c| {
            if c >= 0 {
                c >= n_slots
            } else {
                !c >= n_filters
            }
        }) {
            return Err(TableError::new_err(format!("hit code {bad} names no slot")));
        }
        let mut entries: Vec<(u32, i64)> = Vec::new();
        for code in codes {
            if code >= 0 {
                entries.push((self.slots[code as usize].rank, code));
                continue;
            }
            let f = (!code) as usize;
            let range = self.fs_start[f] as usize..(self.fs_start[f] + self.fs_count[f]) as usize;
            entries.extend(
                self.fs_slots[range.clone()]
                    .iter()
                    .zip(&self.fs_ranks[range])
                    .map(|(&s, &r)| (r, s as i64)),
            );
        }
        entries.sort_unstable();
        Ok(entries.into_iter().map(|(_, slot)| slot).collect())
    }

    /// The deliveries of subscription slots already in output order (one
    /// per run of equal subscribers), as a tuple of `Delivery`.
    pub(crate) fn slot_deliveries(&self, py: Python<'_>, slots: Vec<i64>) -> PyResult<PyObject> {
        if let Some(bad) = slots
            .iter()
            .find(|&&s| s < 0 || s as usize >= self.slots.len())
        {
            return Err(TableError::new_err(format!("no subscription slot {bad}")));
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
    pub(crate) fn hits(&self, exchange: usize, words: Vec<String>) -> PyResult<Vec<i64>> {
        let trie = self.trie(exchange)?;
        Ok(with_scratch(|scratch| {
            trie.word_hits(&words, scratch);
            scratch.codes.iter().map(|hit| hit.code).collect()
        }))
    }

    /// Match distinct topics of exchange number `exchange` together:
    /// `(flat, offsets, unhandled, special)`. Topic `t`'s subscription
    /// slots, in output order, are `flat[offsets[t]:offsets[t + 1]]` (`flat`
    /// and `offsets`: bytes of int64). `unhandled`: topics that are not
    /// valid str topics; `special`: topics that hit a filter with
    /// per-message conditions; both have no slots in `flat`.
    pub(crate) fn match_topics<'py>(
        &self,
        py: Python<'py>,
        exchange: usize,
        topics: &Bound<'py, PyList>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Vec<usize>,
        Vec<usize>,
    )> {
        let trie = self.trie(exchange)?;
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
                        match self.resolve(scratch) {
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
    pub(crate) fn match_keys<'py>(
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
        // The batch's distinct valid topics first (equal keys once), then
        // matched in order with the exact-table entries of the topics a few
        // places ahead already requested: their memory misses overlap.
        const AHEAD: usize = 8;
        let mut row_distinct: Vec<i64> = Vec::with_capacity(n);
        let mut distinct: HashMap<&[u8], i64> = HashMap::with_capacity(n);
        let mut topics: Vec<(&[u8], u64)> = Vec::new();
        // SAFETY (lifetimes): each key's bytes live as long as the key object,
        // which the list holds for the whole call (nothing here runs Python code).
        let list = keys.as_ptr();
        for r in 0..n {
            let key = unsafe { ffi::PyList_GET_ITEM(list, r as ffi::Py_ssize_t) };
            let Some(text) = (unsafe { key_bytes(key) }) else {
                row_distinct.push(-1);
                continue;
            };
            let d = *distinct.entry(text).or_insert_with(|| {
                if trie.dialect.valid_topic(text) && std::str::from_utf8(text).is_ok() {
                    topics.push((text, trie.exact.hash(text)));
                    topics.len() as i64 - 1
                } else {
                    -1
                }
            });
            row_distinct.push(d);
        }
        let mut topic_unit: Vec<i64> = Vec::with_capacity(topics.len());
        let mut flat: Vec<i64> = Vec::new();
        let mut offsets: Vec<i64> = vec![0];
        with_scratch(|scratch| {
            for (d, &(text, hash)) in topics.iter().enumerate() {
                if let Some(&(_, ahead)) = topics.get(d + AHEAD) {
                    trie.exact.prefetch(ahead);
                }
                trie.topic_hits_hashed(text, hash, scratch);
                if let Resolved::Slots = self.resolve(scratch) {
                    flat.extend(scratch.entries.iter().map(|e| (e.0 & 0xFFFF_FFFF) as i64));
                    offsets.push(flat.len() as i64);
                    topic_unit.push(offsets.len() as i64 - 2);
                } else {
                    topic_unit.push(-1);
                }
            }
        });
        let row_topic: Vec<i64> = row_distinct
            .iter()
            .map(|&d| if d < 0 { -1 } else { topic_unit[d as usize] })
            .collect();
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
    /// names. Raises `ColumnOverflowError` past Arrow's 32-bit offsets.
    pub(crate) fn layout<'py>(
        &self,
        py: Python<'py>,
        row_unit: Bound<'py, PyAny>,
        flat: Bound<'py, PyAny>,
        offsets: Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let flat = u32_of(py, &flat, self.slots.len(), "flat")?;
        let offsets = u32_of(py, &offsets, flat.len() + 1, "offsets")?;
        if offsets.is_empty() || offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err(TableError::new_err(
                "offsets must be non-decreasing, one more than the units",
            ));
        }
        let row_unit = u32_of(py, &row_unit, offsets.len() - 1, "row_unit")?;
        let plan = py.allow_threads(|| self.plan_layout(&flat, &offsets));
        let sizes = plan
            .sizes(&row_unit)
            .map_err(ColumnOverflowError::new_err)?;
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
        py.allow_threads(|| self.write_layout(&plan, &row_unit, &mut out));
        Ok(buffers)
    }
}

/// The native-endian bytes of integers (numpy's and Arrow's layout), copied.
pub(crate) fn as_bytes<'py, T: Copy>(py: Python<'py>, values: &[T]) -> Bound<'py, PyBytes> {
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
pub(crate) unsafe fn key_bytes<'a>(key: *mut ffi::PyObject) -> Option<&'a [u8]> {
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
pub(crate) fn topic_bytes<'a>(trie: &Trie, topic: &'a Bound<'_, PyAny>) -> Option<&'a [u8]> {
    if !topic.is_instance_of::<PyString>() {
        return None; // a topic is a str; the grammar names other types
    }
    // SAFETY: `topic` is a live object, borrowed for 'a.
    let bytes = unsafe { key_bytes(topic.as_ptr()) }?;
    trie.dialect.valid_topic(bytes).then_some(bytes)
}

impl Kernel {
    /// One trie per exchange of `tables.grammars`, of the live filter slots'
    /// match parts (the filter text without a shared-subscription prefix)
    /// and hit codes.
    fn tries(
        py: Python<'_>,
        tables: &Tables<'_>,
        n_filters: usize,
        rank: &[u32],
        owners: &[u32],
    ) -> PyResult<Vec<Trie>> {
        let n_slots = rank.len();
        let dialects = tables
            .grammars
            .iter()
            .map(Grammar::dialect)
            .collect::<PyResult<Vec<_>>>()?;
        let (filter_offsets, filter_data) = tables.filter_text.read(py, "filters")?;
        let filter_exchange = vec_of(py, &tables.filter_exchange, "filter_exchange")?;
        let codes = vec_of(py, &tables.hit_code, "hit_code")?;
        if filter_offsets.len() != n_filters + 1
            || filter_exchange.len() != n_filters
            || codes.len() != n_filters
        {
            return Err(TableError::new_err(
                "filter_text, filter_exchange and hit_code need one entry per filter slot",
            ));
        }
        let text = utf8(&filter_data, "filters")?;
        let mut per_exchange: Vec<(Vec<&str>, Vec<Hit>)> =
            vec![(Vec::new(), Vec::new()); dialects.len()];
        for f in 0..n_filters {
            let e = filter_exchange[f];
            if e < 0 {
                continue; // a free filter slot
            }
            let Some((filters, hits)) = per_exchange.get_mut(e as usize) else {
                return Err(TableError::new_err(format!(
                    "filter_exchange: no exchange number {e}"
                )));
            };
            let code = codes[f];
            if (code >= 0 && code as usize >= n_slots)
                || (code < 0 && (!code) as usize >= n_filters)
            {
                return Err(TableError::new_err(format!(
                    "hit code {code} names no slot"
                )));
            }
            let filter = string_at(text, &filter_offsets, f, "filters")?;
            filters.push(tables.grammars[e as usize].match_part(dialects[e as usize], filter));
            hits.push(if code >= 0 {
                Hit {
                    code,
                    rank: rank[code as usize],
                    subscriber: owners[code as usize],
                }
            } else {
                Hit {
                    code,
                    ..Hit::default()
                }
            });
        }
        Ok(py.allow_threads(|| {
            dialects
                .iter()
                .zip(&per_exchange)
                .map(|(&d, (filters, hits))| Trie::build(d, filters, hits))
                .collect()
        }))
    }

    pub(crate) fn trie(&self, exchange: usize) -> PyResult<&Trie> {
        self.tries
            .get(exchange)
            .ok_or_else(|| TableError::new_err(format!("no exchange number {exchange}")))
    }

    /// Turns the hits in `scratch.codes` into the topic's subscription slots
    /// in `scratch.entries`: `((rank << 32) | slot, subscriber)`, sorted.
    /// Ranks and subscribers travel with the hits and beside the filters'
    /// slot lists, so the per-slot table is not read here.
    pub(crate) fn resolve(&self, scratch: &mut Scratch) -> Resolved {
        let Scratch { codes, entries, .. } = scratch;
        entries.clear();
        let entry = |slot: u32, rank: u32, subscriber: u32| {
            (((rank as u64) << 32) | slot as u64, subscriber)
        };
        for &hit in codes.iter() {
            if hit.code >= 0 {
                entries.push(entry(hit.code as u32, hit.rank, hit.subscriber));
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
                    .zip(&self.fs_ranks[range.clone()])
                    .zip(&self.fs_subscribers[range])
                    .map(|((&s, &r), &k)| entry(s, r, k)),
            );
        }
        entries.sort_unstable_by_key(|e| e.0);
        Resolved::Slots
    }

    /// A tuple of `Delivery(subscriber, (ids...))`, one per run of equal
    /// subscribers in `scratch.entries`.
    pub(crate) fn delivery_tuple(
        &self,
        py: Python<'_>,
        scratch: &mut Scratch,
    ) -> PyResult<PyObject> {
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
