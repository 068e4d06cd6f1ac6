//! `trellis serve` settings: command-line flags, `TRELLIS_*` environment variables and an
//! optional TOML file, merged in that order of precedence (flag > env > file > default).

use std::path::PathBuf;

/// Flags of `trellis serve`. Every setting is optional here so that one not given on the
/// command line or in the environment can come from the config file.
#[derive(clap::Args, Debug, Default)]
pub struct ServeArgs {
    /// Address to listen on: `HOST:PORT` (default 127.0.0.1:8325) or `unix:/path/to.sock`.
    #[arg(long, value_name = "ADDR", env = "TRELLIS_LISTEN")]
    pub listen: Option<String>,
    /// Data directory: state database, plugin cache and sockets (default `.trellis`).
    #[arg(long, value_name = "DIR", env = "TRELLIS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// A TOML file with any of these settings (keys as the long flag names, `-` or `_`).
    #[arg(long, value_name = "FILE", env = "TRELLIS_CONFIG")]
    pub config: Option<PathBuf>,
}
