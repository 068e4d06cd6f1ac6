//! Integration tests of the plugin host, against real plugin processes (the sim plugin, the celerity transformer, fixtures written as scripts, and a Python plugin
//! for interop).

mod crash_loop;
mod default_configs;
mod fixtures;
mod interop;
mod plugins_common;
mod sim;
mod transformer;
