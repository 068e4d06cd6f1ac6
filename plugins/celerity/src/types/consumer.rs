//! `celerity/consumer`: not implemented yet (issue 17).

use crate::model::{Input, Out, Resource};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/consumer";
pub const DESCRIPTION: &str =
    "A consumer of messages from a queue, topic, datastore stream or bucket";

pub fn schema() -> Schema {
    Schema::object()
}

pub fn emit(_input: &Input, r: &Resource, out: &mut Out) {
    crate::types::not_supported(r, out);
}
