//! The grammar of an exchange as `compiler/` hands it over; the dialects'
//! topic rules themselves are the core's (`bitroute_core::dialect`).

use pyo3::prelude::*;

pub(crate) use bitroute_core::dialect::Dialect;

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
        Dialect::parse(&self.dialect).map_err(TableError::new_err)
    }

    /// The part of a validated filter that matches topics: a shared
    /// subscription `<share_prefix><group>/<filter>` matches as `<filter>`.
    pub(crate) fn match_part<'a>(&self, dialect: Dialect, filter: &'a str) -> &'a str {
        bitroute_core::dialect::match_part(self.share_prefix.as_deref(), dialect, filter)
    }

    /// Whether `filter` is a shared subscription (per-message member choice).
    pub(crate) fn is_shared(&self, filter: &str) -> bool {
        bitroute_core::dialect::is_shared(self.share_prefix.as_deref(), filter)
    }
}
