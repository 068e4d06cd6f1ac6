//! Function `sha256` and custom variable type `local/fileMode`.

use trellis_plugin_sdk::prelude::*;

use crate::fsutil::sha256_hex;

/// `sha256(text)`: the lowercase hex SHA-256 of the UTF-8 text.
pub struct Sha256Fn;

#[async_trait]
impl Function for Sha256Fn {
    fn signature(&self) -> Signature {
        Signature::new("sha256")
            .describe("The lowercase hex SHA-256 of a string's UTF-8 bytes (sensitive when the string is)")
            .param(Param::new("text", SchemaType::String).describe("The text to hash"))
            .returns(SchemaType::String)
    }

    async fn call(&self, _ctx: &Context, args: Vec<Value>) -> Result<Value> {
        let Some(arg) = args.first() else {
            return Err(
                PluginError::bad_input("sha256 expects one argument").at(AttrPath::root().index(0))
            );
        };
        if arg.is_unknown() {
            return Ok(Value::Unknown);
        }
        let text = arg.as_str().ok_or_else(|| {
            PluginError::bad_input("sha256 expects a string").at(AttrPath::root().index(0))
        })?;
        let digest = Value::from(sha256_hex(text.as_bytes()));
        Ok(if arg.is_sensitive() {
            Value::sensitive(digest)
        } else {
            digest
        })
    }
}

/// `local/fileMode`: named file modes.
pub struct FileModeType;

/// (label, mode, description), in the order options are returned.
pub const FILE_MODE_OPTIONS: [(&str, &str, &str); 7] = [
    ("private", "0600", "read and write for the owner only"),
    ("groupReadable", "0640", "owner read/write, group read"),
    ("shared", "0644", "owner read/write, everyone read"),
    (
        "groupWritable",
        "0664",
        "owner and group read/write, everyone read",
    ),
    (
        "privateExecutable",
        "0700",
        "read, write and execute for the owner only",
    ),
    ("groupExecutable", "0750", "owner all, group read/execute"),
    ("executable", "0755", "owner all, everyone read/execute"),
];

#[async_trait]
impl CustomVariableType for FileModeType {
    fn type_name(&self) -> &str {
        "local/fileMode"
    }

    fn description(&self) -> &str {
        "A file mode by name (private, shared, executable, ...); the value is the octal mode string local/file accepts"
    }

    async fn options(&self, _ctx: &Context) -> Result<Vec<VariableOption>> {
        Ok(FILE_MODE_OPTIONS
            .iter()
            .map(|(label, mode, d)| {
                VariableOption::new(*label, *mode).describe(format!("{mode}: {d}"))
            })
            .collect())
    }
}
