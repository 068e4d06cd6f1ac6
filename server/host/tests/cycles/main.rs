//! Launch/shutdown cycles counted against this process's children: a binary of their own, so
//! no other test's plugins are children of this process while it counts.

#[path = "../it/plugins_common.rs"]
mod plugins_common;

mod cycles;
