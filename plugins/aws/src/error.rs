//! AWS errors as the engine's error classes.
//!
//! Throttling, 5xx, timeouts and lost connections are TRANSIENT (the engine retries them
//! per the manifest's policy); validation errors BAD_INPUT at the attribute AWS names;
//! conflicts CONFLICT; missing NOT_FOUND; access denied PERMISSION. Messages are AWS's
//! own, which never carry credentials.

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use trellis_plugin_sdk::prelude::*;

const THROTTLING: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
    "InternalFailure",
    "InternalError",
    "InternalErrorException",
    "InternalServerError",
    "InternalServerErrorException",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "ServiceException",
    "RequestTimeout",
    "RequestTimeoutException",
    // SSM: concurrent updates of one parameter.
    "TooManyUpdates",
];

const CONFLICT: &[&str] = &[
    "ResourceInUseException",
    "ResourceConflictException",
    "ResourceExistsException",
    "ConflictException",
    "ConcurrentModification",
    "ConcurrentModificationException",
    "EntityAlreadyExists",
    "BucketAlreadyExists",
    "BucketNotEmpty",
    "DeleteConflict",
    "QueueAlreadyExists",
    "QueueNameExists",
    "QueueDeletedRecently",
    "AWS.SimpleQueueService.QueueDeletedRecently",
    "ParameterAlreadyExists",
    "OperationAbortedException",
    "TableAlreadyExistsException",
];

const NOT_FOUND: &[&str] = &[
    "ResourceNotFoundException",
    "NoSuchEntity",
    "NoSuchBucket",
    "NoSuchKey",
    "NotFound",
    "NotFoundException",
    "NonExistentQueue",
    "QueueDoesNotExist",
    "AWS.SimpleQueueService.NonExistentQueue",
    "ParameterNotFound",
    "TableNotFoundException",
    "InvalidVpcID.NotFound",
    // SSM: tagging or listing the tags of a parameter that is gone.
    "InvalidResourceId",
];

const PERMISSION: &[&str] = &[
    "AccessDenied",
    "AccessDeniedException",
    "UnauthorizedOperation",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "AuthFailure",
    "AuthorizationError",
    "KMSAccessDeniedException",
    // Secrets Manager: KMS refused to decrypt or encrypt the value.
    "DecryptionFailure",
    "EncryptionFailure",
];

/// The class an AWS error code and HTTP status stand for.
pub fn classify(code: Option<&str>, status: Option<u16>) -> ErrorClass {
    if let Some(code) = code {
        let is = |list: &[&str]| list.contains(&code);
        if is(THROTTLING) {
            return ErrorClass::Transient;
        }
        if is(NOT_FOUND) {
            return ErrorClass::NotFound;
        }
        if is(PERMISSION) {
            return ErrorClass::Permission;
        }
        if is(CONFLICT) {
            return ErrorClass::Conflict;
        }
    }
    match status {
        Some(429) => ErrorClass::Transient,
        Some(s) if s >= 500 => ErrorClass::Transient,
        Some(401 | 403) => ErrorClass::Permission,
        Some(404) => ErrorClass::NotFound,
        Some(409) => ErrorClass::Conflict,
        Some(s) if (400..500).contains(&s) => ErrorClass::BadInput,
        _ => ErrorClass::Internal,
    }
}

/// `err` from an SDK call `what` ("creating queue orders").
pub fn sdk<E>(what: impl std::fmt::Display, err: SdkError<E, HttpResponse>) -> PluginError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = err.raw_response().map(|r| r.status().as_u16());
    match &err {
        SdkError::ServiceError(se) => {
            let e = se.err();
            let code = e.code();
            let message = e.message().unwrap_or("");
            let mut class = classify(code, status);
            // Lambda answers an update made while another is in progress with a conflict that
            // clears by itself: worth the engine's retry.
            if code == Some("ResourceConflictException") && message.contains("at this time") {
                class = ErrorClass::Transient;
            }
            let mut out = PluginError::new(
                class,
                format!(
                    "{what}: {}{}{message}",
                    code.unwrap_or("error"),
                    if message.is_empty() { "" } else { ": " }
                ),
            );
            if class == ErrorClass::BadInput
                && let Some(path) = attribute_path(message)
            {
                out = out.at(path);
            }
            out
        }
        SdkError::TimeoutError(_) => PluginError::transient(format!("{what}: timed out")),
        SdkError::DispatchFailure(d) => {
            let why = if d.is_timeout() {
                "timed out"
            } else if d.is_io() {
                "connection failed"
            } else {
                "could not send the request"
            };
            let class = if d.is_user() {
                ErrorClass::BadInput
            } else {
                ErrorClass::Transient
            };
            PluginError::new(class, format!("{what}: {why}: {}", chain(&err)))
        }
        SdkError::ResponseError(_) => PluginError::new(
            classify(None, status).max_transient(),
            format!("{what}: unreadable response: {}", chain(&err)),
        ),
        SdkError::ConstructionFailure(_) => PluginError::internal(format!(
            "{what}: could not build the request: {}",
            chain(&err)
        )),
        _ => PluginError::internal(format!("{what}: {}", chain(&err))),
    }
}

/// The whole source chain, one line: the SDK's top-level messages alone say little.
fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

trait MaxTransient {
    fn max_transient(self) -> ErrorClass;
}

impl MaxTransient for ErrorClass {
    /// A response that could not be read is worth another attempt unless AWS said otherwise.
    fn max_transient(self) -> ErrorClass {
        match self {
            ErrorClass::Internal => ErrorClass::Transient,
            c => c,
        }
    }
}

/// The attribute a validation message names (`... at 'tableName' failed to satisfy
/// constraint ...`, `Value ... for parameter FunctionName is invalid`), as a spec path in
/// lowerCamelCase (`provisionedThroughput.readCapacityUnits`).
pub fn attribute_path(message: &str) -> Option<AttrPath> {
    let raw = if let Some(i) = message.find(" at '") {
        let rest = &message[i + 5..];
        &rest[..rest.find('\'')?]
    } else if let Some(i) = message.find("for parameter ") {
        let rest = &message[i + 14..];
        rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
            .next()?
    } else {
        return None;
    };
    let mut path = AttrPath::root();
    for part in raw.split('.') {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return None;
        }
        // `keySchema.1.member` style indexes are 1-based and name list elements.
        if let Ok(n) = part.parse::<u64>() {
            path = path.index(n.saturating_sub(1));
            continue;
        }
        if part == "member" {
            continue;
        }
        path = path.field(lower_camel(part));
    }
    (!path.is_empty()).then_some(path)
}

/// `TableName` → `tableName`; `SSEType` → `sseType`.
pub fn lower_camel(s: &str) -> String {
    let upper = s.chars().take_while(char::is_ascii_uppercase).count();
    let n = match upper {
        0 => 0,
        1 => 1,
        u if u == s.len() => u,
        // Keep the last capital of an acronym for the next word: SSEType → sseType.
        u => u - 1,
    };
    let (head, tail) = s.split_at(n);
    format!("{}{tail}", head.to_ascii_lowercase())
}

/// Whether `err` is AWS saying the thing is not there (for idempotent deletes and reads).
pub fn is_not_found(err: &PluginError) -> bool {
    err.class == ErrorClass::NotFound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(
            classify(Some("ThrottlingException"), Some(400)),
            ErrorClass::Transient
        );
        assert_eq!(classify(Some("Whatever"), Some(503)), ErrorClass::Transient);
        assert_eq!(classify(None, Some(500)), ErrorClass::Transient);
        assert_eq!(
            classify(Some("ResourceNotFoundException"), Some(400)),
            ErrorClass::NotFound
        );
        assert_eq!(
            classify(Some("AccessDeniedException"), Some(400)),
            ErrorClass::Permission
        );
        assert_eq!(
            classify(Some("ResourceInUseException"), Some(400)),
            ErrorClass::Conflict
        );
        assert_eq!(
            classify(Some("ValidationException"), Some(400)),
            ErrorClass::BadInput
        );
        assert_eq!(classify(None, None), ErrorClass::Internal);
        assert_eq!(
            classify(Some("TooManyUpdates"), Some(400)),
            ErrorClass::Transient
        );
        assert_eq!(
            classify(Some("InvalidResourceId"), Some(400)),
            ErrorClass::NotFound
        );
        assert_eq!(
            classify(Some("DecryptionFailure"), Some(400)),
            ErrorClass::Permission
        );
    }

    #[test]
    fn validation_messages_name_the_attribute() {
        let m =
            "1 validation error detected: Value 'a' at 'tableName' failed to satisfy constraint";
        assert_eq!(
            attribute_path(m).map(|p| p.to_string()),
            Some("tableName".to_owned())
        );
        let m = "Value at 'provisionedThroughput.readCapacityUnits' failed";
        assert_eq!(
            attribute_path(m).map(|p| p.to_string()),
            Some("provisionedThroughput.readCapacityUnits".to_owned())
        );
        let m = "1 validation error: Value '' at 'keySchema.1.member.attributeName' failed";
        assert_eq!(
            attribute_path(m).map(|p| p.to_string()),
            Some("keySchema[0].attributeName".to_owned())
        );
        let m = "Value x for parameter FunctionName is invalid.";
        assert_eq!(
            attribute_path(m).map(|p| p.to_string()),
            Some("functionName".to_owned())
        );
        assert_eq!(attribute_path("no attribute here"), None);
    }

    #[test]
    fn camel() {
        assert_eq!(lower_camel("TableName"), "tableName");
        assert_eq!(lower_camel("SSEType"), "sseType");
        assert_eq!(lower_camel("ARN"), "arn");
        assert_eq!(lower_camel("tableName"), "tableName");
    }
}
