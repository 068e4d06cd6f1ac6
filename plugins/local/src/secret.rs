//! `local/randomSecret`: a random string generated from `/dev/urandom`, kept
//! in the engine's state only (nothing on disk).

use std::io::Read;

use trellis_plugin_sdk::prelude::*;

use crate::fsutil::blocking;

pub struct RandomSecret;

pub const MIN_LENGTH: i64 = 8;
pub const MAX_LENGTH: i64 = 4096;
const DEFAULT_LENGTH: i64 = 32;
const CHARSETS: [&str; 3] = ["alphanumeric", "hex", "base64url"];
const DEFAULT_CHARSET: &str = "alphanumeric";

/// The characters of each charset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charset {
    Alphanumeric,
    Hex,
    Base64Url,
}

impl Charset {
    fn parse(s: &str) -> Option<Charset> {
        match s {
            "alphanumeric" => Some(Charset::Alphanumeric),
            "hex" => Some(Charset::Hex),
            "base64url" => Some(Charset::Base64Url),
            _ => None,
        }
    }

    fn alphabet(self) -> &'static [u8] {
        match self {
            Charset::Alphanumeric => {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
            }
            Charset::Hex => b"0123456789abcdef",
            Charset::Base64Url => {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
            }
        }
    }

    /// Whether `s` could have been generated with this charset and length.
    fn fits(self, s: &str, length: usize) -> bool {
        s.len() == length && s.bytes().all(|b| self.alphabet().contains(&b))
    }
}

/// `length` and `charset` of a spec, defaults applied and checked.
fn params(spec: &Spec<'_>) -> Result<(usize, Charset)> {
    let length = spec.opt_i64("length")?.unwrap_or(DEFAULT_LENGTH);
    if !(MIN_LENGTH..=MAX_LENGTH).contains(&length) {
        return Err(spec.error(
            "length",
            format!("must be between {MIN_LENGTH} and {MAX_LENGTH}, found {length}"),
        ));
    }
    let length = usize::try_from(length).map_err(|_| spec.error("length", "is out of range"))?;
    let name = spec.opt_str("charset")?.unwrap_or(DEFAULT_CHARSET);
    let charset = Charset::parse(name)
        .ok_or_else(|| spec.error("charset", format!("must be one of {}", CHARSETS.join(", "))))?;
    Ok((length, charset))
}

/// Uniformly random characters from `/dev/urandom` (rejection sampling, so
/// no character is more likely than another).
pub fn generate(length: usize, charset: Charset) -> std::io::Result<String> {
    let alphabet = charset.alphabet();
    let n = alphabet.len();
    let limit = 256 - (256 % n);
    let mut urandom = std::fs::File::open("/dev/urandom")?;
    let mut out = String::with_capacity(length);
    let mut buf = [0u8; 512];
    while out.len() < length {
        urandom.read_exact(&mut buf)?;
        for &b in &buf {
            let b = usize::from(b);
            if b < limit {
                out.push(char::from(alphabet[b % n]));
                if out.len() == length {
                    break;
                }
            }
        }
    }
    Ok(out)
}

async fn fresh(length: usize, charset: Charset) -> Result<String> {
    blocking(move || generate(length, charset).context("reading /dev/urandom")).await
}

fn id(name: &str) -> String {
    format!("local/randomSecret/{name}")
}

fn state(value: String) -> Value {
    Value::map().with("value", Value::sensitive(value))
}

#[async_trait]
impl Resource for RandomSecret {
    fn type_name(&self) -> &str {
        "local/randomSecret"
    }

    fn description(&self) -> &str {
        "A random secret string, generated once and kept in state (nothing is written to disk)."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("A random secret string")
            .field(
                "length",
                Field::integer()
                    .default(DEFAULT_LENGTH)
                    .must_recreate()
                    .describe("Number of characters, 8 to 4096"),
            )
            .field(
                "charset",
                Field::string()
                    .default(DEFAULT_CHARSET)
                    .allowed(CHARSETS)
                    .must_recreate()
                    .describe(
                        "alphanumeric (A-Z a-z 0-9), hex (0-9 a-f) or base64url (A-Z a-z 0-9 - _)",
                    ),
            )
            .field(
                "value",
                Field::string()
                    .computed()
                    .sensitive()
                    .describe("The secret"),
            )
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        if let Some(length) = spec.get("length").and_then(Value::as_i64)
            && !(MIN_LENGTH..=MAX_LENGTH).contains(&length)
        {
            out.push(
                Diagnostic::error(
                    "local.length-out-of-range",
                    format!(
                        "`length` is {length}, but must be between {MIN_LENGTH} and {MAX_LENGTH}"
                    ),
                )
                .at("length"),
            );
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        ctx.check_cancelled()?;
        let (length, charset) = params(&req.spec())?;
        let value = fresh(length, charset).await?;
        Ok(Applied::new(id(&req.name), state(value)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        ctx.check_cancelled()?;
        let (length, charset) = params(&req.spec())?;
        let before = params(&req.current.spec()).ok();
        let old = req.current.state.get("value").and_then(Value::as_str);
        let value = match old {
            Some(old) if before == Some((length, charset)) && charset.fits(old, length) => {
                old.to_owned()
            }
            _ => {
                // Normally unreachable: length and charset must recreate.
                tracing::info!(
                    "secret {} regenerated (length or charset changed, or no usable value)",
                    req.name
                );
                fresh(length, charset).await?
            }
        };
        Ok(Applied::new(id(&req.name), state(value)))
    }

    async fn destroy(&self, _ctx: &Context, _current: &ResourceState) -> Result<()> {
        Ok(())
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, _ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        Ok(Some(ReadState {
            spec: current.spec.clone(),
            state: current.state.clone(),
            external_id: Some(id(&current.name)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_from_the_alphabet() {
        for cs in [Charset::Alphanumeric, Charset::Hex, Charset::Base64Url] {
            let s = generate(100, cs).expect("urandom");
            assert!(cs.fits(&s, 100), "{cs:?}");
        }
        let a = generate(32, Charset::Alphanumeric).expect("urandom");
        let b = generate(32, Charset::Alphanumeric).expect("urandom");
        assert_ne!(a, b);
    }
}
