//! The [`Context`] every plugin callback receives.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use trellis_proto::plugin::v1 as pb;

use crate::error::{PluginError, Result};
use crate::schema::Spec;
use crate::value::Value;

/// What a call knows about itself: the provider config, its ids, its
/// deadline, cancellation and a progress reporter.
///
/// Cancellation is cooperative: the SDK cancels the token when the engine
/// calls Cancel with this call's id, when the call's deadline passes, when
/// the engine drops an ApplyResource stream, and on shutdown. Long
/// operations should check [`Context::is_cancelled`] or use
/// [`Context::sleep`] / [`Context::run_cancellable`] and return
/// [`PluginError::cancelled`].
#[derive(Clone, Debug)]
pub struct Context {
    call_id: String,
    request_id: String,
    instance_id: String,
    idempotency_key: String,
    config: Value,
    deadline: Option<SystemTime>,
    cancel: CancellationToken,
    progress: Option<UnboundedSender<pb::ApplyResourceEvent>>,
    local_assets: HashMap<String, PathBuf>,
}

impl Context {
    /// A context for calling your callbacks directly in unit tests: the given
    /// config, no deadline, a fresh cancellation token, progress discarded.
    pub fn new(config: impl Into<Value>) -> Context {
        Context {
            call_id: String::new(),
            request_id: String::new(),
            instance_id: String::new(),
            idempotency_key: String::new(),
            config: config.into(),
            deadline: None,
            cancel: CancellationToken::new(),
            progress: None,
            local_assets: HashMap::new(),
        }
    }

    pub(crate) fn from_call(
        call: pb::CallContext,
        cancel: CancellationToken,
        progress: Option<UnboundedSender<pb::ApplyResourceEvent>>,
    ) -> Context {
        let deadline = u64::try_from(call.deadline_unix_ms)
            .ok()
            .filter(|ms| *ms > 0)
            .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)));
        Context {
            call_id: call.call_id,
            request_id: call.request_id,
            instance_id: call.instance_id,
            idempotency_key: call.idempotency_key,
            config: call.provider_config.map_or(Value::Null, Value::from),
            deadline,
            cancel,
            progress,
            local_assets: call
                .local_assets
                .into_iter()
                .map(|(uri, path)| (uri, PathBuf::from(path)))
                .collect(),
        }
    }

    /// The context of one item of a call over several resources: the call's, with the item's
    /// idempotency key (the cancellation token is shared: cancelling the call cancels them all).
    pub(crate) fn for_item(&self, idempotency_key: String) -> Context {
        Context {
            idempotency_key,
            ..self.clone()
        }
    }

    /// Sets the call id (for unit tests).
    pub fn with_call_id(mut self, id: impl Into<String>) -> Context {
        self.call_id = id.into();
        self
    }

    /// Sets the idempotency key (for unit tests).
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Context {
        self.idempotency_key = key.into();
        self
    }

    /// Adds a local asset: what the engine sends for a `local_asset` field's
    /// `asset:sha256:<hex>/<name>` value (for unit tests and harnesses).
    pub fn with_local_asset(mut self, uri: impl Into<String>, path: impl Into<PathBuf>) -> Context {
        self.local_assets.insert(uri.into(), path.into());
        self
    }

    /// Where the content of a local asset is, for a `local_asset` field's value
    /// (`asset:sha256:<hex>/<name>`): a read-only file or directory the engine keeps, named
    /// `<name>`'s last part. None for any other value, or one the engine did not send.
    pub fn local_asset(&self, uri: &str) -> Option<&Path> {
        self.local_assets.get(uri).map(PathBuf::as_path)
    }

    /// Unique per call; in logs and for Cancel.
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// The engine API request this call serves (empty when none): the engine's request and
    /// operation log lines carry the same id. The SDK puts it in every line a call logs.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The blueprint instance the call is made for.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// For mutating calls: the same key means the same operation, so a
    /// retried call must not create a second resource.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// The provider configuration (Null when none was sent).
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The provider configuration as a typed view; errors carry the config
    /// attribute's path.
    pub fn config_spec(&self) -> Spec<'_> {
        Spec::new(&self.config)
    }

    /// When the engine gives up on this call.
    pub fn deadline(&self) -> Option<SystemTime> {
        self.deadline
    }

    /// Time left before the deadline (None without a deadline; zero once passed).
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| {
            d.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        })
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// `Err(PluginError::cancelled())` once the call is cancelled.
    pub fn check_cancelled(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(PluginError::cancelled())
        } else {
            Ok(())
        }
    }

    /// Completes when the call is cancelled.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// The token itself, to hand to other tasks.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Sleeps for `d`, or fails with [`PluginError::cancelled`] as soon as the
    /// call is cancelled.
    pub async fn sleep(&self, d: Duration) -> Result<()> {
        tokio::select! {
            _ = tokio::time::sleep(d) => Ok(()),
            _ = self.cancel.cancelled() => Err(PluginError::cancelled()),
        }
    }

    /// Runs `fut`, abandoning it (and returning [`PluginError::cancelled`])
    /// when the call is cancelled first.
    pub async fn run_cancellable<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::select! {
            r = fut => r,
            _ = self.cancel.cancelled() => Err(PluginError::cancelled()),
        }
    }

    /// Reports progress. Only ApplyResource streams it to the engine; in other
    /// calls it does nothing. `fraction` is 0..=1 when known.
    pub fn progress(&self, message: impl Into<String>, fraction: Option<f64>) {
        if let Some(tx) = &self.progress {
            let fraction = fraction
                .filter(|f| f.is_finite())
                .map_or(-1.0, |f| f.clamp(0.0, 1.0));
            // The receiver is gone only when the engine dropped the call; the
            // call is then cancelled, and progress has nowhere to go.
            let _ = tx.send(pb::ApplyResourceEvent {
                event: Some(pb::apply_resource_event::Event::Progress(pb::Progress {
                    message: message.into(),
                    fraction,
                })),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deadline_and_cancel() {
        let call = pb::CallContext {
            call_id: "c1".into(),
            deadline_unix_ms: 1,
            provider_config: Some(Value::map().with("root", "/tmp").to_proto()),
            ..Default::default()
        };
        let token = CancellationToken::new();
        let ctx = Context::from_call(call, token.clone(), None);
        assert_eq!(ctx.call_id(), "c1");
        assert_eq!(ctx.remaining(), Some(Duration::ZERO));
        assert_eq!(ctx.config_spec().get_str("root").ok(), Some("/tmp"));
        assert!(ctx.check_cancelled().is_ok());
        token.cancel();
        assert!(ctx.sleep(Duration::from_secs(60)).await.is_err());
        assert!(ctx.check_cancelled().is_err());
        let ctx = Context::new(Value::Null);
        assert_eq!(ctx.deadline(), None);
        ctx.progress("nothing happens", Some(0.5));
    }
}
