//! `celerity/config`: not implemented yet (issue 17).

use crate::model::{Input, Out, Resource};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/config";
pub const DESCRIPTION: &str = "A configuration store: secrets or plain parameters";

pub fn schema() -> Schema {
    Schema::object()
}

pub fn emit(_input: &Input, r: &Resource, out: &mut Out) {
    crate::types::not_supported(r, out);
}
