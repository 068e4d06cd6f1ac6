//! The engine's log subscriber, as its configuration describes it.

use super::config::*;
use std::io::{self, IsTerminal};

/// Installs the global log subscriber, writing to stderr. Does nothing if one is already
/// installed (tests, or an embedding program that set up its own).
pub(super) fn init_logging(config: &ServeConfig) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level).map_err(|e| {
        format!(
            "--log-level: `{}` is not a log filter: {e}",
            config.log_level
        )
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr);
    // The only failure left is "a subscriber is already set", which is fine.
    let _ = match config.log_format {
        // Colours only for a person watching; escape codes would litter log files.
        LogFormat::Text => builder.with_ansi(io::stderr().is_terminal()).try_init(),
        LogFormat::Json => builder.with_ansi(false).json().try_init(),
    };
    Ok(())
}
