//! The two dialects' topic rules, as the kernel applies them (mirroring
//! `compiler/amqp.py` and `compiler/mqtt.py`), and the rules of a grammar
//! that `compiler/` hands in ([`Grammar`]).

/// One exchange's grammar: its dialect and its shared-subscription prefix
/// (MQTT's `$share/`, `None` in AMQP), the grammar's own constant handed in
/// (by `compiler.grammar.KernelGrammar`, or a routing table's exchange)
/// rather than a copy here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grammar {
    pub dialect: Dialect,
    pub share_prefix: Option<String>,
}

impl Grammar {
    /// The part of a validated filter that matches topics: a shared
    /// subscription `<share_prefix><group>/<filter>` matches as `<filter>`.
    pub fn match_part<'a>(&self, filter: &'a str) -> &'a str {
        match_part(self.share_prefix.as_deref(), self.dialect, filter)
    }

    /// Whether `filter` is a shared subscription (per-message member choice).
    pub fn is_shared(&self, filter: &str) -> bool {
        is_shared(self.share_prefix.as_deref(), filter)
    }
}

/// [`Grammar::match_part`] of a grammar given by its parts.
pub fn match_part<'a>(share_prefix: Option<&str>, dialect: Dialect, filter: &'a str) -> &'a str {
    let separator = dialect.separator() as char;
    match share_prefix.and_then(|p| filter.strip_prefix(p)) {
        Some(rest) => rest
            .split_once(separator)
            .map_or(filter, |(_, inner)| inner),
        None => filter,
    }
}

/// [`Grammar::is_shared`] of a grammar given by its prefix.
pub fn is_shared(share_prefix: Option<&str>, filter: &str) -> bool {
    share_prefix.is_some_and(|p| filter.starts_with(p))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Amqp,
    Mqtt,
}

impl Dialect {
    /// A dialect from its name (`compiler.dialect.Dialect`'s values).
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "amqp" => Ok(Dialect::Amqp),
            "mqtt" => Ok(Dialect::Mqtt),
            _ => Err(format!("unknown dialect {name:?}")),
        }
    }

    pub fn separator(self) -> u8 {
        match self {
            Dialect::Amqp => b'.',
            Dialect::Mqtt => b'/',
        }
    }

    pub fn one(self) -> &'static [u8] {
        match self {
            Dialect::Amqp => b"*",
            Dialect::Mqtt => b"+",
        }
    }

    /// Whether `topic` (UTF-8) is a valid topic of the dialect; the Python
    /// grammar (or [`Dialect::topic_error`]) gives the error for the others.
    pub fn valid_topic(self, topic: &[u8]) -> bool {
        match self {
            Dialect::Amqp => topic.len() <= 255,
            Dialect::Mqtt => {
                !topic.is_empty()
                    && topic.len() <= 65535
                    && !topic.iter().any(|&b| b == b'+' || b == b'#' || b == 0)
            }
        }
    }

    /// Why `topic` is not a valid topic of the dialect (`None`: it is), in
    /// the words of `parse_topic` of `compiler/amqp.py` and `compiler/mqtt.py`
    /// (the same checks in the same order, so the same text).
    pub fn topic_error(self, topic: &str) -> Option<String> {
        use crate::pytext::quote;
        match self {
            Dialect::Amqp => (topic.len() > 255).then(|| {
                format!(
                    "routing key is {} bytes, longer than 255: {}",
                    topic.len(),
                    quote(topic)
                )
            }),
            Dialect::Mqtt => {
                if topic.contains(['+', '#']) {
                    Some(format!(
                        "topic must not contain the wildcards '+' or '#': {}",
                        quote(topic)
                    ))
                } else if topic.is_empty() {
                    Some("topic must not be empty".to_owned())
                } else if topic.contains('\0') {
                    Some(format!("topic must not contain U+0000: {}", quote(topic)))
                } else if topic.len() > 65535 {
                    Some(format!(
                        "topic is {} bytes, longer than 65535: {}",
                        topic.len(),
                        quote(topic)
                    ))
                } else {
                    None
                }
            }
        }
    }

    /// The words of a valid topic or filter: the empty AMQP key has none.
    pub fn split(self, text: &[u8], out: &mut Vec<(usize, usize)>) {
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
    pub fn dollar(self, topic: &[u8]) -> bool {
        self == Dialect::Mqtt && topic.first() == Some(&b'$')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_filters_match_as_their_inner_filter() {
        let mqtt = Grammar {
            dialect: Dialect::Mqtt,
            share_prefix: Some("$share/".into()),
        };
        assert_eq!(mqtt.match_part("$share/g/a/+"), "a/+");
        assert_eq!(mqtt.match_part("$share/g/$SYS/#"), "$SYS/#");
        assert_eq!(mqtt.match_part("a/b"), "a/b");
        assert!(mqtt.is_shared("$share/g/#") && !mqtt.is_shared("$share"));
    }

    #[test]
    fn topic_errors_in_the_grammar_order() {
        assert_eq!(Dialect::Amqp.topic_error(&"a".repeat(255)), None);
        assert_eq!(
            Dialect::Amqp.topic_error(&"€".repeat(86)).unwrap()[..39],
            *"routing key is 258 bytes, longer than 2"
        );
        assert_eq!(
            Dialect::Mqtt.topic_error("a/+").as_deref(),
            Some("topic must not contain the wildcards '+' or '#': 'a/+'")
        );
        assert_eq!(
            Dialect::Mqtt.topic_error("").as_deref(),
            Some("topic must not be empty")
        );
        assert_eq!(
            Dialect::Mqtt.topic_error("a\0b").as_deref(),
            Some("topic must not contain U+0000: 'a\\x00b'")
        );
        assert_eq!(Dialect::Mqtt.topic_error("$SYS/x"), None);
    }
}
