//! `trellis token create`: a new engine API token (docs/auth.md). The token is printed once, on
//! stdout; the tokens file gets only its SHA-256, with its name, role and instance patterns.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::serve::auth::{Role, create_token};

#[derive(clap::Args, Debug)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token: prints it once on stdout and appends its hash to the tokens file
    /// (created, owner-only, if missing). Send SIGHUP to a running engine to load it.
    Create(CreateArgs),
}

#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// The token's name, unique in the file: logs and refusals name the token by it.
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// viewer, planner, deployer or admin (docs/auth.md).
    #[arg(long, value_name = "ROLE", value_parser = Role::parse)]
    pub role: Role,
    /// Instance name patterns the token may act on (`*` any run of characters, `?` one),
    /// e.g. `team-a/*`. Repeatable or comma-separated; default `*`, every instance.
    #[arg(long = "instances", value_name = "GLOB", value_delimiter = ',')]
    pub instances: Vec<String>,
    /// The tokens file the engine's `[auth] tokens_file` names.
    #[arg(long, value_name = "FILE")]
    pub tokens_file: PathBuf,
}

pub fn run(args: &TokenArgs) -> ExitCode {
    match &args.command {
        TokenCommand::Create(a) => {
            let instances = a
                .instances
                .iter()
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect();
            match create_token(&a.tokens_file, &a.name, a.role, instances) {
                Ok(token) => {
                    println!("{token}");
                    eprintln!(
                        "token `{}` ({}) added to {}; it is shown only now. Send SIGHUP to a \
                         running engine to load it.",
                        a.name.trim(),
                        a.role,
                        a.tokens_file.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
