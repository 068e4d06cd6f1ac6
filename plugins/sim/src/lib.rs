//! Provider `sim`: simulated resources with latency, failure and crash knobs.
//! A load and chaos testing tool, never a stand-in for a real provider.
//! Filled in with the plugin protocol (issue 4).
