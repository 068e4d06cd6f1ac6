//! `trellis token create | list | revoke`: the engine API's tokens (docs/auth.md). A new token is
//! printed once, on stdout; the tokens file gets only its SHA-256, with its name, role and
//! instance patterns. The commands edit the file; a running engine loads it on SIGHUP.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::OutputFormat;
use crate::cli::client::render::rfc3339;
use crate::serve::auth::{Role, TokensFile, create_token, revoke_token};

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
    /// List the tokens of a tokens file: name, role, instance patterns, when created (never a
    /// token: the file holds only their hashes).
    List(ListArgs),
    /// Remove a token from the tokens file by name. Send SIGHUP to a running engine: from
    /// then on it answers the token UNAUTHENTICATED.
    Revoke(RevokeArgs),
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// The tokens file the engine's `[auth] tokens_file` names.
    #[arg(long, value_name = "FILE")]
    pub tokens_file: PathBuf,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    /// The name the token was created with.
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// The tokens file the engine's `[auth] tokens_file` names.
    #[arg(long, value_name = "FILE")]
    pub tokens_file: PathBuf,
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
        TokenCommand::List(a) => match TokensFile::read(&a.tokens_file) {
            Ok(file) => {
                print!("{}", list(&file, a.format));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        TokenCommand::Revoke(a) => match revoke_token(&a.tokens_file, &a.name) {
            Ok(t) => {
                eprintln!(
                    "token `{}` ({}) removed from {}. Send SIGHUP to a running engine to refuse it.",
                    t.name,
                    t.role,
                    a.tokens_file.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
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

/// The tokens as a table or JSON lines' array; hashes are left out (they identify a token to
/// whoever holds it, and nobody reading a listing needs them).
fn list(file: &TokensFile, format: OutputFormat) -> String {
    match format {
        OutputFormat::Json => {
            let tokens: Vec<serde_json::Value> = file
                .token
                .iter()
                .map(|t| {
                    serde_json::json!({ "name": t.name, "role": t.role.name(),
                        "instances": t.instances, "created": t.created })
                })
                .collect();
            format!("{}\n", serde_json::json!({ "tokens": tokens }))
        }
        OutputFormat::Text if file.token.is_empty() => "no tokens\n".to_owned(),
        OutputFormat::Text => {
            let rows: Vec<[String; 4]> = file
                .token
                .iter()
                .map(|t| {
                    [
                        t.name.clone(),
                        t.role.to_string(),
                        t.instances.join(", "),
                        t.created.map_or_else(
                            || "-".to_owned(),
                            |s| {
                                rfc3339(
                                    i64::try_from(s).unwrap_or(i64::MAX).saturating_mul(1000),
                                    false,
                                )
                            },
                        ),
                    ]
                })
                .collect();
            let header = ["NAME", "ROLE", "INSTANCES", "CREATED"].map(str::to_owned);
            let mut widths = [0; 4];
            for row in std::iter::once(&header).chain(&rows) {
                for (w, cell) in widths.iter_mut().zip(row) {
                    *w = (*w).max(cell.len());
                }
            }
            let mut out = String::new();
            for row in std::iter::once(&header).chain(&rows) {
                let line: Vec<String> = row
                    .iter()
                    .zip(widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                out.push_str(line.join("  ").trim_end());
                out.push('\n');
            }
            out
        }
    }
}
