//! The two dialects' topic rules, as the kernel applies them (mirroring
//! `compiler/amqp.py` and `compiler/mqtt.py`), and the rules of a grammar
//! that `compiler/` hands in ([`Grammar`]).

use pyo3::prelude::*;

use crate::errors::TableError;

/// One exchange's grammar as `compiler.grammar.KernelGrammar` hands it over:
/// its dialect's name and its shared-subscription prefix (MQTT's `$share/`,
/// `None` in AMQP), the grammar's own constant rather than a copy here.
#[derive(FromPyObject)]
pub(crate) struct Grammar {
    pub(crate) dialect: String,
    pub(crate) share_prefix: Option<String>,
}

impl Grammar {
    pub(crate) fn dialect(&self) -> PyResult<Dialect> {
        Dialect::parse(&self.dialect)
    }

    /// The part of a validated filter that matches topics: a shared
    /// subscription `<share_prefix><group>/<filter>` matches as `<filter>`.
    pub(crate) fn match_part<'a>(&self, dialect: Dialect, filter: &'a str) -> &'a str {
        let separator = dialect.separator() as char;
        match self
            .share_prefix
            .as_deref()
            .and_then(|p| filter.strip_prefix(p))
        {
            Some(rest) => rest
                .split_once(separator)
                .map_or(filter, |(_, inner)| inner),
            None => filter,
        }
    }

    /// Whether `filter` is a shared subscription (per-message member choice).
    pub(crate) fn is_shared(&self, filter: &str) -> bool {
        self.share_prefix
            .as_deref()
            .is_some_and(|p| filter.starts_with(p))
    }
}

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
            _ => Err(TableError::new_err(format!("unknown dialect {name:?}"))),
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

    /// The MQTT `$` rule: wildcards at the first level do not match.
    pub(crate) fn dollar(self, topic: &[u8]) -> bool {
        self == Dialect::Mqtt && topic.first() == Some(&b'$')
    }
}
