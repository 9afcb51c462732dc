//! The two dialects' topic rules, as the kernel applies them (mirroring
//! `compiler/amqp.py` and `compiler/mqtt.py`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Amqp,
    Mqtt,
}

impl Dialect {
    pub(crate) fn parse(name: &str) -> PyResult<Self> {
        match name {
            "amqp" => Ok(Dialect::Amqp),
            "mqtt" => Ok(Dialect::Mqtt),
            _ => Err(PyValueError::new_err(format!("unknown dialect {name:?}"))),
        }
    }

    pub(crate) fn separator(self) -> u8 {
        match self {
            Dialect::Amqp => b'.',
            Dialect::Mqtt => b'/',
        }
    }

    pub(crate) fn one(self) -> &'static [u8] {
        match self {
            Dialect::Amqp => b"*",
            Dialect::Mqtt => b"+",
        }
    }

    /// Whether `topic` (UTF-8) is a valid topic of the dialect; the Python
    /// grammar gives the error for the others.
    pub(crate) fn valid_topic(self, topic: &[u8]) -> bool {
        match self {
            Dialect::Amqp => topic.len() <= 255,
            Dialect::Mqtt => {
                !topic.is_empty()
                    && topic.len() <= 65535
                    && !topic.iter().any(|&b| b == b'+' || b == b'#' || b == 0)
            }
        }
    }

    /// The words of a valid topic or filter: the empty AMQP key has none.
    pub(crate) fn split(self, text: &[u8], out: &mut Vec<(usize, usize)>) {
        out.clear();
        if text.is_empty() && self == Dialect::Amqp {
            return;
        }
        let sep = self.separator();
        let mut start = 0;
        for (i, &b) in text.iter().enumerate() {
            if b == sep {
                out.push((start, i));
                start = i + 1;
            }
        }
        out.push((start, text.len()));
    }

    /// The words of a filter that match topics: an MQTT shared subscription
    /// `$share/<group>/<filter>` matches as `<filter>` (already validated).
    pub(crate) fn match_part(self, filter: &str) -> &str {
        match (self, filter.strip_prefix("$share/")) {
            (Dialect::Mqtt, Some(rest)) => rest.split_once('/').map_or(filter, |(_, inner)| inner),
            _ => filter,
        }
    }

    /// The MQTT `$` rule: wildcards at the first level do not match.
    pub(crate) fn dollar(self, topic: &[u8]) -> bool {
        self == Dialect::Mqtt && topic.first() == Some(&b'$')
    }
}
