//! bitroute's realtime mode: the routing table of `bitroute-core`
//! ([`RouteTable`]) behind JNI, for the Java class
//! `io.bitroute.realtime.NativeRouter` (the realtime contract, section 1):
//!
//! ```java
//! static native long load(byte[] tableJson);
//! static native void free(long handle);
//! static native byte[] route(long handle, byte[] key, String[] headerNames,
//!                            byte[][] headerValues, String messageId,
//!                            long publishedMs, long nowMs);
//! static native long newSet();
//! static native boolean put(long set, String id, byte[] subscriptionJson);
//! static native boolean remove(long set, String id);
//! static native int size(long set);
//! static native long build(long set, byte[] tableFieldsJson);
//! static native void freeSet(long set);
//! ```
//!
//! A set is a `Box<SubscriptionSet>` (the routing view's subscriptions, kept
//! parsed between tables): `newSet` makes it, `freeSet` drops it; `put`,
//! `remove` and `build` are called by one thread at a time (the view's). `build`
//! returns a table handle, as `load` does: a table layered over the set's last
//! whole table when only a few subscriptions changed since (it holds a
//! reference to that base, which lives until its last table is freed).
//!
//! A handle is a `Box<RouteTable>` turned into a pointer: `load` makes it,
//! `free` drops it (once, when no thread uses it: the Java side's duty);
//! `route` only reads it, from any number of threads. The outcome is
//! encoded by [`encode`] (big-endian, as `DataInputStream` reads it).
//!
//! Nothing crosses the boundary but values and Java exceptions: a table that
//! cannot be read throws `IllegalArgumentException` with the reason; bad
//! arguments throw `IllegalArgumentException`; a panic is caught and thrown
//! as `IllegalStateException` (the JVM survives; the task fails).

use std::panic::{catch_unwind, AssertUnwindSafe};

use bitroute_core::{Outcome, OutcomeKind, RouteTable, SubscriptionSet};
use jni::objects::{JByteArray, JClass, JObjectArray, JString};
use jni::sys::{jboolean, jbyteArray, jint, jlong, JNI_FALSE, JNI_TRUE};
use jni::JNIEnv;

const ILLEGAL_ARGUMENT: &str = "java/lang/IllegalArgumentException";
const ILLEGAL_STATE: &str = "java/lang/IllegalStateException";

/// Why an export failed: the Java exception to throw, unless one is pending
/// already (a JNI call failed with a Java exception of its own).
enum Failure {
    Throw(&'static str, String),
    Pending,
}

impl From<jni::errors::Error> for Failure {
    fn from(e: jni::errors::Error) -> Self {
        match e {
            jni::errors::Error::JavaException => Failure::Pending,
            other => Failure::Throw(
                ILLEGAL_STATE,
                format!("bitroute_jni: JNI call failed: {other}"),
            ),
        }
    }
}

/// Runs `body`, turning its failure or panic into a thrown Java exception
/// and `fallback` as the return value.
fn guarded<T>(
    env: &mut JNIEnv<'_>,
    fallback: T,
    body: impl FnOnce(&mut JNIEnv<'_>) -> Result<T, Failure>,
) -> T {
    let result = catch_unwind(AssertUnwindSafe(|| body(env)));
    let failure = match result {
        Ok(Ok(value)) => return value,
        Ok(Err(failure)) => failure,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            Failure::Throw(ILLEGAL_STATE, format!("bitroute_jni panicked: {what}"))
        }
    };
    if let Failure::Throw(class, message) = failure {
        if !env.exception_check().unwrap_or(true) {
            let _ = env.throw_new(class, message);
        }
    }
    fallback
}

fn table<'t>(handle: jlong) -> Result<&'t RouteTable, Failure> {
    if handle == 0 {
        return Err(Failure::Throw(
            ILLEGAL_ARGUMENT,
            "NativeRouter: handle 0 is no table".to_owned(),
        ));
    }
    // SAFETY: a non-zero handle comes from `load` and is not freed while a
    // task uses it (the Java side's contract).
    Ok(unsafe { &*(handle as *const RouteTable) })
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_load<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    table_json: JByteArray<'l>,
) -> jlong {
    guarded(&mut env, 0, |env| {
        let bytes = java_bytes(env, &table_json, "routing table")?;
        let table =
            RouteTable::from_json(&bytes).map_err(|e| Failure::Throw(ILLEGAL_ARGUMENT, e.0))?;
        Ok(Box::into_raw(Box::new(table)) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_free<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) {
    guarded(&mut env, (), |_| {
        if handle != 0 {
            // SAFETY: a handle from `load`, freed once (the Java side's contract).
            drop(unsafe { Box::from_raw(handle as *mut RouteTable) });
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_route<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    key: JByteArray<'l>,
    header_names: JObjectArray<'l>,
    header_values: JObjectArray<'l>,
    message_id: JString<'l>,
    published_ms: jlong,
    now_ms: jlong,
) -> jbyteArray {
    guarded(&mut env, std::ptr::null_mut(), |env| {
        let table = table(handle)?;
        let publish = Publish::read(env, &key, &header_names, &header_values, &message_id)?;
        let outcome = table.route_at(
            publish.key.as_deref(),
            &publish.borrowed_headers(),
            &publish.message_id,
            published_ms,
            now_ms,
        );
        Ok(env.byte_array_from_slice(&encode(&outcome))?.into_raw())
    })
}

/// A publish as `route` receives it, decoded from its Java arguments.
struct Publish {
    /// The record's key (a null array: none).
    key: Option<Vec<u8>>,
    headers: Headers,
    /// The publish's message id (a null string: empty).
    message_id: String,
}

impl Publish {
    fn read(
        env: &mut JNIEnv<'_>,
        key: &JByteArray<'_>,
        header_names: &JObjectArray<'_>,
        header_values: &JObjectArray<'_>,
        message_id: &JString<'_>,
    ) -> Result<Self, Failure> {
        Ok(Publish {
            key: optional_bytes(env, key)?,
            headers: read_headers(env, header_names, header_values)?,
            message_id: if message_id.is_null() {
                String::new()
            } else {
                env.get_string(message_id)?.into()
            },
        })
    }

    /// The headers as the core takes them: borrowed names and values, in order.
    fn borrowed_headers(&self) -> Vec<(&str, Option<&[u8]>)> {
        self.headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_deref()))
            .collect()
    }
}

fn set<'s>(handle: jlong) -> Result<&'s mut SubscriptionSet, Failure> {
    if handle == 0 {
        return Err(Failure::Throw(
            ILLEGAL_ARGUMENT,
            "NativeRouter: handle 0 is no subscription set".to_owned(),
        ));
    }
    // SAFETY: a non-zero handle comes from `newSet`, is not freed while in use
    // and is used by one thread at a time (the Java side's contract).
    Ok(unsafe { &mut *(handle as *mut SubscriptionSet) })
}

fn java_string(env: &mut JNIEnv<'_>, s: &JString<'_>, what: &str) -> Result<String, Failure> {
    if s.is_null() {
        return Err(Failure::Throw(ILLEGAL_ARGUMENT, format!("{what}: null")));
    }
    Ok(env.get_string(s)?.into())
}

fn java_bytes(env: &mut JNIEnv<'_>, b: &JByteArray<'_>, what: &str) -> Result<Vec<u8>, Failure> {
    optional_bytes(env, b)?.ok_or_else(|| Failure::Throw(ILLEGAL_ARGUMENT, format!("{what}: null")))
}

/// A byte array's bytes; a null array is `None`.
fn optional_bytes(env: &mut JNIEnv<'_>, b: &JByteArray<'_>) -> Result<Option<Vec<u8>>, Failure> {
    if b.is_null() {
        return Ok(None);
    }
    Ok(Some(env.convert_byte_array(b)?))
}

fn jbool(b: bool) -> jboolean {
    if b {
        JNI_TRUE
    } else {
        JNI_FALSE
    }
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_newSet<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
) -> jlong {
    guarded(&mut env, 0, |_| {
        Ok(Box::into_raw(Box::new(SubscriptionSet::new())) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_freeSet<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) {
    guarded(&mut env, (), |_| {
        if handle != 0 {
            // SAFETY: a handle from `newSet`, freed once (the Java side's contract).
            drop(unsafe { Box::from_raw(handle as *mut SubscriptionSet) });
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_put<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    id: JString<'l>,
    json: JByteArray<'l>,
) -> jboolean {
    guarded(&mut env, JNI_FALSE, |env| {
        let set = set(handle)?;
        let id = java_string(env, &id, "subscription id")?;
        let json = java_bytes(env, &json, "subscription")?;
        let changed = set
            .put(&id, &json)
            .map_err(|e| Failure::Throw(ILLEGAL_ARGUMENT, e.0))?;
        Ok(jbool(changed))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_remove<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    id: JString<'l>,
) -> jboolean {
    guarded(&mut env, JNI_FALSE, |env| {
        let set = set(handle)?;
        let id = java_string(env, &id, "subscription id")?;
        Ok(jbool(set.remove(&id)))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_size<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jint {
    guarded(&mut env, 0, |_| {
        Ok(jint::try_from(set(handle)?.len()).unwrap_or(jint::MAX))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_bitroute_realtime_NativeRouter_build<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    fields: JByteArray<'l>,
) -> jlong {
    guarded(&mut env, 0, |env| {
        let set = set(handle)?;
        let fields = java_bytes(env, &fields, "routing table")?;
        let table = set
            .table(&fields)
            .map_err(|e| Failure::Throw(ILLEGAL_ARGUMENT, e.0))?;
        Ok(Box::into_raw(Box::new(table)) as jlong)
    })
}

/// A publish's headers: name and value (null: `None`), in order.
type Headers = Vec<(String, Option<Vec<u8>>)>;

/// The headers of a publish from the two parallel arrays (null arrays: none).
fn read_headers(
    env: &mut JNIEnv<'_>,
    names: &JObjectArray<'_>,
    values: &JObjectArray<'_>,
) -> Result<Headers, Failure> {
    let n = if names.is_null() {
        0
    } else {
        env.get_array_length(names)?
    };
    let m = if values.is_null() {
        0
    } else {
        env.get_array_length(values)?
    };
    if n != m {
        return Err(Failure::Throw(
            ILLEGAL_ARGUMENT,
            format!("NativeRouter.route: {n} header names but {m} header values"),
        ));
    }
    let mut headers = Vec::with_capacity(n as usize);
    for i in 0..n {
        let name = JString::from(env.get_object_array_element(names, i)?);
        if name.is_null() {
            return Err(Failure::Throw(
                ILLEGAL_ARGUMENT,
                format!("NativeRouter.route: header name {i} is null"),
            ));
        }
        let text: String = env.get_string(&name)?.into();
        env.delete_local_ref(name)?;
        let value = JByteArray::from(env.get_object_array_element(values, i)?);
        let bytes = optional_bytes(env, &value)?;
        env.delete_local_ref(value)?;
        headers.push((text, bytes));
    }
    Ok(headers)
}

/// An outcome in the contract's encoding (section 1): big-endian; a string
/// is an int32 byte length (-1: null), then its UTF-8 bytes.
///
/// ```text
/// byte outcome (0 routed, 1 unroutable, 2 rejected, 3 expired), string exchange,
/// string routing_key, rejected: string reason; else: int32 n, per delivery: string
/// subscriber, string ids_header, int32 n ids, n strings; then int64 the remaining
/// expiry interval in seconds the deliveries carry (-1: the publish has none), string
/// the alternate exchange the deliveries came through (null: its own exchange's)
/// ```
pub fn encode(outcome: &Outcome<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(outcome.kind as u8);
    put_string(&mut out, outcome.exchange.as_deref());
    put_string(&mut out, outcome.routing_key.as_deref());
    if outcome.kind == OutcomeKind::Rejected {
        put_string(&mut out, outcome.reason.as_deref());
        return out;
    }
    put_i32(&mut out, outcome.deliveries.len());
    for delivery in &outcome.deliveries {
        put_string(&mut out, Some(delivery.subscriber));
        put_string(&mut out, Some(&delivery.ids_header));
        put_i32(&mut out, delivery.ids.len());
        for id in &delivery.ids {
            put_string(&mut out, Some(id));
        }
    }
    let remaining = outcome.remaining.map_or(-1, i64::from);
    out.extend_from_slice(&remaining.to_be_bytes());
    put_string(&mut out, outcome.alternate.as_deref());
    out
}

fn put_i32(out: &mut Vec<u8>, n: usize) {
    let n = i32::try_from(n).expect("a count or length beyond int32");
    out.extend_from_slice(&n.to_be_bytes());
}

fn put_string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(s) => {
            put_i32(out, s.len());
            out.extend_from_slice(s.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = r#"{"version": 3, "default_exchange": "amq.topic",
        "exchanges": [{"name": "amq.topic", "dialect": "amqp", "share_prefix": null}],
        "subscriptions": [{"id": "s1", "exchange": "amq.topic", "subscriber": "billing",
                           "filter": "orders.*", "headers": null}]}"#;

    #[test]
    fn encodes_a_routed_outcome() {
        let table = RouteTable::from_json(TABLE.as_bytes()).unwrap();
        let got = encode(&table.route(Some(b"orders.a"), &[], "p/0/1"));
        let mut want = vec![0u8];
        for s in ["amq.topic", "orders.a"] {
            want.extend_from_slice(&(s.len() as i32).to_be_bytes());
            want.extend_from_slice(s.as_bytes());
        }
        want.extend_from_slice(&1i32.to_be_bytes());
        for s in ["billing", "[\"s1\"]"] {
            want.extend_from_slice(&(s.len() as i32).to_be_bytes());
            want.extend_from_slice(s.as_bytes());
        }
        want.extend_from_slice(&1i32.to_be_bytes());
        want.extend_from_slice(&2i32.to_be_bytes());
        want.extend_from_slice(b"s1");
        want.extend_from_slice(&(-1i64).to_be_bytes());
        want.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(got, want);
    }

    #[test]
    fn encodes_an_expired_outcome_and_a_remaining_interval() {
        let table = RouteTable::from_json(TABLE.as_bytes()).unwrap();
        let headers: &[(&str, Option<&[u8]>)] = &[("expiry", Some(b"5"))];
        let got = encode(&table.route_at(Some(b"orders.a"), headers, "p/0/1", 0, 5_000));
        assert_eq!(got[0], 3);
        assert_eq!(
            got[got.len() - 16..],
            [
                &0i32.to_be_bytes()[..],
                &(-1i64).to_be_bytes(),
                &(-1i32).to_be_bytes()
            ]
            .concat()
        );
        let got = encode(&table.route_at(Some(b"orders.a"), headers, "p/0/1", 0, 1_000));
        assert_eq!(
            (got[0], &got[got.len() - 12..got.len() - 4]),
            (0, &4i64.to_be_bytes()[..])
        );
    }

    #[test]
    fn encodes_a_rejection_with_nulls() {
        let table = RouteTable::from_json(TABLE.as_bytes()).unwrap();
        let got = encode(&table.route(None, &[("exchange", None)], "p/0/1"));
        let mut want = vec![2u8];
        want.extend_from_slice(&(-1i32).to_be_bytes());
        want.extend_from_slice(&(-1i32).to_be_bytes());
        want.extend_from_slice(&16i32.to_be_bytes());
        want.extend_from_slice(b"missing exchange");
        assert_eq!(got, want);
    }

    #[test]
    fn encodes_the_alternate_exchange_last() {
        let table = RouteTable::from_json(
            br##"{"default_exchange": "a", "exchanges": [
                {"name": "a", "dialect": "amqp", "alternate": "ae"},
                {"name": "ae", "dialect": "amqp"}],
              "subscriptions": [{"id": "s", "exchange": "ae", "subscriber": "u", "filter": "#"}]}"##,
        )
        .unwrap();
        let got = encode(&table.route(Some(b"x"), &[], "p/0/1"));
        assert_eq!(got[0], 0);
        assert_eq!(
            &got[got.len() - 6..],
            &[&2i32.to_be_bytes()[..], &b"ae"[..]].concat()[..]
        );
    }
}
