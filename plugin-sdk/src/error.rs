//! Application errors ([`PluginError`]) and validation findings ([`Diagnostic`]).

use std::fmt;

use trellis_proto::plugin::v1 as pb;

use crate::value::{AttrPath, Value};

/// `Result` with [`PluginError`], the return type of every plugin callback.
pub type Result<T, E = PluginError> = std::result::Result<T, E>;

/// What kind of failure an error is. The engine retries only
/// [`ErrorClass::Transient`], as the provider's retry policy allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Worth retrying: throttling, timeouts, eventual consistency.
    Transient,
    /// The input is wrong; retrying cannot help.
    BadInput,
    /// The resource is in a state that conflicts with the request.
    Conflict,
    /// The resource (or something it needs) does not exist.
    NotFound,
    /// The provider's credentials do not allow the operation.
    Permission,
    /// A bug or an unexpected condition in the plugin.
    Internal,
}

impl ErrorClass {
    pub fn to_proto(self) -> pb::ErrorClass {
        match self {
            ErrorClass::Transient => pb::ErrorClass::Transient,
            ErrorClass::BadInput => pb::ErrorClass::BadInput,
            ErrorClass::Conflict => pb::ErrorClass::Conflict,
            ErrorClass::NotFound => pb::ErrorClass::NotFound,
            ErrorClass::Permission => pb::ErrorClass::Permission,
            ErrorClass::Internal => pb::ErrorClass::Internal,
        }
    }

    /// Unspecified and unrecognised classes read as `Internal`.
    pub fn from_proto(class: i32) -> ErrorClass {
        match pb::ErrorClass::try_from(class) {
            Ok(pb::ErrorClass::Transient) => ErrorClass::Transient,
            Ok(pb::ErrorClass::BadInput) => ErrorClass::BadInput,
            Ok(pb::ErrorClass::Conflict) => ErrorClass::Conflict,
            Ok(pb::ErrorClass::NotFound) => ErrorClass::NotFound,
            Ok(pb::ErrorClass::Permission) => ErrorClass::Permission,
            _ => ErrorClass::Internal,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "TRANSIENT",
            ErrorClass::BadInput => "BAD_INPUT",
            ErrorClass::Conflict => "CONFLICT",
            ErrorClass::NotFound => "NOT_FOUND",
            ErrorClass::Permission => "PERMISSION",
            ErrorClass::Internal => "INTERNAL",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An application error returned by a plugin callback. Build one with the
/// class constructors and refine it:
///
/// ```
/// use trellis_plugin_sdk::{AttrPath, PluginError, ErrorClass};
/// let e = PluginError::bad_input("must be relative").at(AttrPath::from("path"));
/// assert_eq!(e.class, ErrorClass::BadInput);
/// ```
///
/// `?` converts `std::io::Error` (see its `From` impl) and `serde_json::Error`.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginError {
    pub class: ErrorClass,
    /// For people; never put a secret in it.
    pub message: String,
    /// The attribute the error is about (relative to the spec, the config or,
    /// for functions, `[index N]` of the arguments).
    pub path: Option<AttrPath>,
    /// What was created before the failure, so the engine records it and
    /// nothing is orphaned. (Boxed to keep `Result<T, PluginError>` small.)
    pub partial_state: Option<Box<Value>>,
    /// For create: the external id of what was created before the failure.
    pub partial_external_id: Option<String>,
}

impl PluginError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> PluginError {
        PluginError {
            class,
            message: message.into(),
            path: None,
            partial_state: None,
            partial_external_id: None,
        }
    }

    /// Worth retrying (throttling, timeouts, eventual consistency).
    pub fn transient(message: impl Into<String>) -> PluginError {
        PluginError::new(ErrorClass::Transient, message)
    }

    /// The input is wrong. Add `.at(path)` to point at the attribute.
    pub fn bad_input(message: impl Into<String>) -> PluginError {
        PluginError::new(ErrorClass::BadInput, message)
    }

    pub fn conflict(message: impl Into<String>) -> PluginError {
        PluginError::new(ErrorClass::Conflict, message)
    }

    pub fn not_found(message: impl Into<String>) -> PluginError {
        PluginError::new(ErrorClass::NotFound, message)
    }

    pub fn permission(message: impl Into<String>) -> PluginError {
        PluginError::new(ErrorClass::Permission, message)
    }

    pub fn internal(message: impl Into<String>) -> PluginError {
        PluginError::new(ErrorClass::Internal, message)
    }

    /// The error returned when a call was cancelled (Cancel RPC, deadline or
    /// shutdown): TRANSIENT, since the same call may succeed later.
    pub fn cancelled() -> PluginError {
        PluginError::transient("the call was cancelled")
    }

    /// Sets the attribute the error is about.
    pub fn at(mut self, path: impl Into<AttrPath>) -> PluginError {
        self.path = Some(path.into());
        self
    }

    /// Records what was created before the failure.
    pub fn with_partial_state(mut self, state: impl Into<Value>) -> PluginError {
        self.partial_state = Some(Box::new(state.into()));
        self
    }

    /// Records the external id and state of what was created before the
    /// failure (for create).
    pub fn with_partial(
        mut self,
        external_id: impl Into<String>,
        state: impl Into<Value>,
    ) -> PluginError {
        self.partial_external_id = Some(external_id.into());
        self.partial_state = Some(Box::new(state.into()));
        self
    }

    /// Prefixes the message: `"{what}: {message}"`.
    pub fn context(mut self, what: impl fmt::Display) -> PluginError {
        self.message = format!("{what}: {}", self.message);
        self
    }

    pub fn is_transient(&self) -> bool {
        self.class == ErrorClass::Transient
    }

    pub fn to_proto(&self) -> pb::Error {
        pb::Error {
            error_class: self.class.to_proto() as i32,
            message: self.message.clone(),
            path: self.path.as_ref().map(pb::AttributePath::from),
            partial_state: self.partial_state.as_deref().map(Value::to_proto),
        }
    }

    pub fn from_proto(e: pb::Error) -> PluginError {
        PluginError {
            class: ErrorClass::from_proto(e.error_class),
            message: e.message,
            path: e.path.map(AttrPath::from),
            partial_state: e.partial_state.map(|v| Box::new(Value::from(v))),
            partial_external_id: None,
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class, self.message)?;
        if let Some(p) = &self.path {
            write!(f, " (at {p})")?;
        }
        Ok(())
    }
}

impl std::error::Error for PluginError {}

impl From<std::io::Error> for PluginError {
    /// `NotFound` → NOT_FOUND, `PermissionDenied` → PERMISSION,
    /// `AlreadyExists` → CONFLICT, `InvalidInput` → BAD_INPUT,
    /// timeouts, interruptions and connection failures → TRANSIENT, everything
    /// else → INTERNAL.
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let class = match e.kind() {
            K::NotFound => ErrorClass::NotFound,
            K::PermissionDenied | K::ReadOnlyFilesystem => ErrorClass::Permission,
            K::AlreadyExists | K::DirectoryNotEmpty | K::IsADirectory | K::NotADirectory => {
                ErrorClass::Conflict
            }
            K::InvalidInput => ErrorClass::BadInput,
            K::TimedOut
            | K::Interrupted
            | K::WouldBlock
            | K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::BrokenPipe
            | K::ResourceBusy
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown
            | K::StorageFull
            | K::QuotaExceeded => ErrorClass::Transient,
            _ => ErrorClass::Internal,
        };
        PluginError::new(class, e.to_string())
    }
}

impl From<serde_json::Error> for PluginError {
    /// Malformed or mistyped data: BAD_INPUT.
    fn from(e: serde_json::Error) -> Self {
        PluginError::bad_input(e.to_string())
    }
}

/// Adds `.context("doing X")` to results whose error converts into a
/// [`PluginError`]: `fs::write(p, c).context("writing the file")?`.
pub trait ResultExt<T> {
    fn context(self, what: impl fmt::Display) -> Result<T>;
}

impl<T, E: Into<PluginError>> ResultExt<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().context(what))
    }
}

/// How serious a [`Diagnostic`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Severity {
    Error,
    Warning,
    Info,
}

impl Severity {
    pub fn to_proto(self) -> pb::Severity {
        match self {
            Severity::Error => pb::Severity::Error,
            Severity::Warning => pb::Severity::Warning,
            Severity::Info => pb::Severity::Info,
        }
    }

    pub fn from_proto(s: i32) -> Severity {
        match pb::Severity::try_from(s) {
            Ok(pb::Severity::Warning) => Severity::Warning,
            Ok(pb::Severity::Info) => Severity::Info,
            _ => Severity::Error,
        }
    }
}

/// A validation finding. The engine maps `path` back to the blueprint line.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable, chosen by the plugin: `"local.path-outside-root"`.
    pub code: String,
    pub message: String,
    pub path: Option<AttrPath>,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(
        severity: Severity,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Diagnostic {
        Diagnostic {
            severity,
            code: code.into(),
            message: message.into(),
            path: None,
            hint: None,
        }
    }

    pub fn error(code: impl Into<String>, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(Severity::Error, code, message)
    }

    pub fn warning(code: impl Into<String>, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(Severity::Warning, code, message)
    }

    pub fn info(code: impl Into<String>, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(Severity::Info, code, message)
    }

    pub fn at(mut self, path: impl Into<AttrPath>) -> Diagnostic {
        self.path = Some(path.into());
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }

    pub fn to_proto(&self) -> pb::Diagnostic {
        pb::Diagnostic {
            severity: self.severity.to_proto() as i32,
            code: self.code.clone(),
            message: self.message.clone(),
            path: self.path.as_ref().map(pb::AttributePath::from),
            hint: self.hint.clone().unwrap_or_default(),
        }
    }

    pub fn from_proto(d: pb::Diagnostic) -> Diagnostic {
        Diagnostic {
            severity: Severity::from_proto(d.severity),
            code: d.code,
            message: d.message,
            path: d.path.map(AttrPath::from),
            hint: (!d.hint.is_empty()).then_some(d.hint),
        }
    }
}

impl From<PluginError> for Diagnostic {
    /// An error as an error diagnostic with code `plugin.<class>`
    /// (`plugin.bad-input`, `plugin.internal`, ...).
    fn from(e: PluginError) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code: format!(
                "plugin.{}",
                e.class.as_str().to_ascii_lowercase().replace('_', "-")
            ),
            message: e.message,
            path: e.path,
            hint: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn io_errors_map_to_classes() {
        let class = |k| PluginError::from(io::Error::new(k, "x")).class;
        assert_eq!(class(io::ErrorKind::NotFound), ErrorClass::NotFound);
        assert_eq!(
            class(io::ErrorKind::PermissionDenied),
            ErrorClass::Permission
        );
        assert_eq!(class(io::ErrorKind::AlreadyExists), ErrorClass::Conflict);
        assert_eq!(class(io::ErrorKind::TimedOut), ErrorClass::Transient);
        assert_eq!(class(io::ErrorKind::InvalidInput), ErrorClass::BadInput);
        assert_eq!(class(io::ErrorKind::Other), ErrorClass::Internal);
    }

    #[test]
    fn context_and_question_mark() {
        fn read() -> Result<()> {
            Err(io::Error::new(io::ErrorKind::NotFound, "no such file")).context("reading /x")?;
            Ok(())
        }
        let e = read().err();
        assert_eq!(e.as_ref().map(|e| e.class), Some(ErrorClass::NotFound));
        assert_eq!(
            e.map(|e| e.message),
            Some("reading /x: no such file".to_owned())
        );
    }

    #[test]
    fn proto_round_trip() {
        let e = PluginError::conflict("busy")
            .at(AttrPath::root().field("a").index(2))
            .with_partial_state(Value::map().with("id", "x"));
        let back = PluginError::from_proto(e.to_proto());
        assert_eq!(back, e);
        assert_eq!(e.to_string(), "CONFLICT: busy (at a[2])");
        assert_eq!(ErrorClass::from_proto(0), ErrorClass::Internal);
        assert_eq!(ErrorClass::from_proto(99), ErrorClass::Internal);
    }

    #[test]
    fn diagnostics_round_trip() {
        let d = Diagnostic::warning("x.y", "careful").at("f").hint("do z");
        assert_eq!(Diagnostic::from_proto(d.to_proto()), d);
    }
}
