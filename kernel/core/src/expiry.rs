//! Message expiry: MQTT 5's Message Expiry Interval as the publish header
//! [`EXPIRY_HEADER`], the one rule both modes apply (the micro-batch path
//! through `bitroute_kernel.expiry_states`, the realtime mode through
//! [`crate::RouteTable::route_at`]).
//!
//! - The header's last value counts (Kafka's `lastHeader`), as for
//!   `exchange` and `retain`. Absent: the publish never expires.
//! - Its value is the interval in seconds, decimal ASCII digits only,
//!   1 to 4294967295 (MQTT's four-byte integer; 0, a sign, spaces, a null or
//!   anything else is bad input: the publish is rejected with [`Expiry::Invalid`]'s
//!   reason, which `bitroute publish --expiry` gives too).
//! - The publish's lifetime ends `interval` seconds after its Kafka
//!   timestamp. Routed at `now` (epoch ms) at or after that end, it is
//!   [`Expiry::Expired`]: delivered to no one. Else each delivery carries the
//!   remaining interval, `interval - floor(waited / 1000)` seconds (MQTT 5,
//!   3.3.2.3.3: "the received value minus the time that the Application
//!   Message has been waiting"), where `waited = now - published`, taken as 0
//!   when the publisher's clock is ahead; the remaining interval is at least 1.

/// `schemas.records.EXPIRY_HEADER`.
pub const EXPIRY_HEADER: &str = "expiry";
/// The longest interval, MQTT 5's four-byte integer.
pub const MAX_EXPIRY_SECONDS: u64 = 4_294_967_295;

/// A publish's expiry at routing time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expiry {
    /// No expiry header: the publish never expires.
    Never,
    /// Alive: its deliveries carry this remaining interval, in seconds (>= 1).
    Remaining(u32),
    /// Its lifetime ended before it was routed.
    Expired,
    /// The header's value is not an interval: why.
    Invalid(String),
}

/// The interval an expiry header's value states, or why it states none.
pub fn parse_interval(value: Option<&[u8]>) -> Result<u32, String> {
    let bad = |shown: String| {
        Err(format!(
            "the {EXPIRY_HEADER} header must be a whole number of seconds from 1 to \
             {MAX_EXPIRY_SECONDS} (MQTT 5's Message Expiry Interval), not {shown}"
        ))
    };
    let Some(value) = value else {
        return bad("null".to_owned());
    };
    let shown = || crate::pytext::repr_bytes(&value[..value.len().min(32)]);
    if value.is_empty() || value.len() > 10 || !value.iter().all(u8::is_ascii_digit) {
        return bad(shown());
    }
    let n = value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    if n == 0 || n > MAX_EXPIRY_SECONDS {
        return bad(shown());
    }
    Ok(n as u32)
}

/// The expiry of a publish with `headers`, Kafka timestamp `published_ms`,
/// routed at `now_ms` (both epoch milliseconds).
pub fn expiry_of(headers: &[(&str, Option<&[u8]>)], published_ms: i64, now_ms: i64) -> Expiry {
    match headers
        .iter()
        .rev()
        .find(|(name, _)| *name == EXPIRY_HEADER)
    {
        None => Expiry::Never,
        Some(&(_, value)) => expiry_at(value, published_ms, now_ms),
    }
}

/// The expiry of a publish whose last expiry header is `value` (see [`expiry_of`]).
pub fn expiry_at(value: Option<&[u8]>, published_ms: i64, now_ms: i64) -> Expiry {
    let interval = match parse_interval(value) {
        Ok(interval) => interval,
        Err(reason) => return Expiry::Invalid(reason),
    };
    let waited_s = now_ms.saturating_sub(published_ms).max(0) / 1000;
    if waited_s >= i64::from(interval) {
        Expiry::Expired
    } else {
        Expiry::Remaining(interval - waited_s as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remaining_interval_is_decremented_by_whole_seconds_waited() {
        let h = |v: &'static [u8]| vec![(EXPIRY_HEADER, Some(v))];
        assert_eq!(expiry_of(&[], 0, 1 << 40), Expiry::Never);
        assert_eq!(expiry_of(&h(b"10"), 1_000, 1_000), Expiry::Remaining(10));
        assert_eq!(expiry_of(&h(b"10"), 1_000, 1_999), Expiry::Remaining(10));
        assert_eq!(expiry_of(&h(b"10"), 1_000, 2_000), Expiry::Remaining(9));
        assert_eq!(expiry_of(&h(b"10"), 1_000, 10_999), Expiry::Remaining(1));
        assert_eq!(expiry_of(&h(b"10"), 1_000, 11_000), Expiry::Expired);
        // A publisher's clock ahead of the router's: nothing waited.
        assert_eq!(expiry_of(&h(b"10"), 50_000, 1_000), Expiry::Remaining(10));
        assert_eq!(
            expiry_of(&h(b"4294967295"), 0, 0),
            Expiry::Remaining(u32::MAX)
        );
    }

    #[test]
    fn the_last_header_counts_and_bad_values_are_invalid() {
        let two = [
            (EXPIRY_HEADER, Some(&b"x"[..])),
            (EXPIRY_HEADER, Some(&b"5"[..])),
        ];
        assert_eq!(expiry_of(&two, 0, 0), Expiry::Remaining(5));
        for bad in [
            &b""[..],
            b"0",
            b"-1",
            b" 5",
            b"5s",
            b"4294967296",
            b"99999999999",
            b"\xff",
        ] {
            assert!(
                matches!(expiry_at(Some(bad), 0, 0), Expiry::Invalid(_)),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_interval(Some(b"0")).unwrap_err(),
            "the expiry header must be a whole number of seconds from 1 to 4294967295 \
             (MQTT 5's Message Expiry Interval), not b'0'"
        );
        assert!(parse_interval(None).unwrap_err().ends_with("not null"));
    }
}
