//! Python's text forms that reasons and headers are made of, byte for byte:
//! `repr` of a str and of bytes, `compiler.errors.quote`, the reason of a
//! `UnicodeDecodeError` of UTF-8, and the JSON string of a subscription id as
//! `streaming.kafka.records.subscription_ids_json` writes it. The micro-batch
//! path writes these texts with Python; the routing table must write the same.

use crate::printable::PRINTABLE;

/// `compiler.errors.MAX_QUOTED_CHARS`.
const MAX_QUOTED_CHARS: usize = 120;

/// Whether Python's `str.isprintable()` holds for `c`.
fn printable(c: char) -> bool {
    let cp = c as u32;
    if cp < 0x80 {
        return (0x20..0x7f).contains(&cp);
    }
    PRINTABLE
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Python's `repr(s)` of a str.
pub fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if printable(c) => out.push(c),
            c if (c as u32) <= 0xff => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
    out
}

/// `compiler.errors.quote` of a str: its `repr`, shortened to
/// [`MAX_QUOTED_CHARS`] characters (Python counts code points).
pub fn quote(s: &str) -> String {
    let text = repr_str(s);
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        None => text,
        Some((cut, _)) => format!("{}...({} chars)", &text[..cut], s.chars().count()),
    }
}

/// Python's `repr(b)` of bytes.
pub fn repr_bytes(b: &[u8]) -> String {
    let quote = if b.contains(&b'\'') && !b.contains(&b'"') {
        b'"'
    } else {
        b'\''
    };
    let mut out = String::with_capacity(b.len() + 3);
    out.push('b');
    out.push(quote as char);
    for &c in b {
        match c {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c as char);
            }
            0x20..=0x7e => out.push(c as char),
            c => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    out.push(quote as char);
    out
}

/// `bytes.decode("utf-8")`: the text, or the `UnicodeDecodeError`'s
/// `(reason, start)` (CPython's decoder and Rust's agree on where a bad
/// sequence starts and how long it is: both take the maximal subpart).
pub fn decode_utf8(b: &[u8]) -> Result<&str, (&'static str, usize)> {
    std::str::from_utf8(b).map_err(|e| {
        let start = e.valid_up_to();
        let reason = match e.error_len() {
            None => "unexpected end of data",
            Some(1) if matches!(b[start], 0x80..=0xc1 | 0xf5..=0xff) => "invalid start byte",
            Some(_) => "invalid continuation byte",
        };
        (reason, start)
    })
}

/// The JSON string literal of `s` as `subscription_ids_json` writes it:
/// `json.dumps(s, ensure_ascii=False)` (only `"`, `\` and U+0000-U+001F
/// are escaped; everything else is written as it is).
pub fn push_json_string(out: &mut String, s: &str) {
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
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_of_str_as_python() {
        assert_eq!(repr_str("a"), "'a'");
        assert_eq!(repr_str("it's"), "\"it's\"");
        assert_eq!(repr_str("'\""), "'\\'\"'");
        assert_eq!(
            repr_str("a\0\t\u{7f}\u{85}é\u{200b}\u{10ffff}😀"),
            "'a\\x00\\t\\x7f\\x85é\\u200b\\U0010ffff😀'"
        );
        assert_eq!(repr_str("\u{a0}\u{ad}"), "'\\xa0\\xad'");
    }

    #[test]
    fn quote_shortens_long_text() {
        let long = "a".repeat(300);
        assert_eq!(quote(&long), format!("'{}...(300 chars)", "a".repeat(119)));
        assert_eq!(quote(&"a".repeat(118)), format!("'{}'", "a".repeat(118)));
        assert_eq!(
            quote(&"é".repeat(200)),
            format!("'{}...(200 chars)", "é".repeat(119))
        );
    }

    #[test]
    fn repr_of_bytes_as_python() {
        assert_eq!(repr_bytes(b"a\xff'"), "b\"a\\xff'\"");
        assert_eq!(repr_bytes(b"\x00\n\\ok"), "b'\\x00\\n\\\\ok'");
    }

    #[test]
    fn decode_errors_as_python() {
        assert_eq!(decode_utf8(b"ab"), Ok("ab"));
        assert_eq!(decode_utf8(b"a\xff"), Err(("invalid start byte", 1)));
        assert_eq!(decode_utf8(b"a\x80"), Err(("invalid start byte", 1)));
        assert_eq!(decode_utf8(b"\xe2\x82"), Err(("unexpected end of data", 0)));
        assert_eq!(
            decode_utf8(b"\xe2(a"),
            Err(("invalid continuation byte", 0))
        );
        assert_eq!(
            decode_utf8(b"x\xe0\x80"),
            Err(("invalid continuation byte", 1))
        );
        assert_eq!(
            decode_utf8(b"\xed\xa0\x80"),
            Err(("invalid continuation byte", 0))
        );
        assert_eq!(
            decode_utf8(b"\xf0\x90\x80"),
            Err(("unexpected end of data", 0))
        );
        assert_eq!(
            decode_utf8(b"\xf0\x90\x80a"),
            Err(("invalid continuation byte", 0))
        );
    }

    #[test]
    fn json_strings_as_subscription_ids_json() {
        let mut out = String::new();
        push_json_string(&mut out, "a\"\\\n\u{1}é\u{7f}\u{2028}");
        assert_eq!(out, "\"a\\\"\\\\\\n\\u0001é\u{7f}\u{2028}\"");
    }
}
