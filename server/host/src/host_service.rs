//! The Host service: what plugins may ask of the engine, on a Unix socket in
//! a private (0700) directory of its own.
//!
//! Authentication is a tonic interceptor layer in front of every method:
//! the `x-trellis-host-token` metadata must be a token issued to a running
//! plugin at its handshake (one per launch, revoked when the process exits).
//! The layer puts the caller's identity ([`Caller`]) into the request
//! extensions; handlers never see an unauthenticated request.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tonic::service::InterceptorLayer;
use tonic::{Request, Response, Status};
use trellis_proto::plugin::v1 as pb;
use trellis_proto::plugin::v1::host_server::{Host, HostServer};

use super::client::CallOptions;
use super::process::{self, lock};
use super::supervisor::Shared;
use super::values;
use trellis_ids::{random_hex, sha256_hex};

pub const HOST_TOKEN_METADATA: &str = "x-trellis-host-token";
/// Longest wait AcquireLock accepts.
pub(crate) const MAX_LOCK_WAIT: Duration = Duration::from_secs(600);

/// Who is calling the Host service.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The plugin's name (provider namespace or transformer name), or the
    /// identity given to [`super::PluginHost::issue_host_token`].
    pub plugin: String,
    /// The plugin process (launch) the token was issued to.
    pub instance: u64,
}

/// Where `LookupResource` reads resources: the engine's state, set by whoever owns it
/// ([`super::PluginHost::set_state_lookup`]).
pub trait StateLookup: Send + Sync + 'static {
    /// The resource `name` of the instance `instance_id` as recorded (spec as last applied,
    /// computed state), `None` if the instance has no such resource.
    fn lookup<'a>(
        &'a self,
        instance_id: &'a str,
        name: &'a str,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Option<pb::ResourceState>, String>> + Send + 'a,
        >,
    >;
}

/// Which instances each plugin process is serving a call for right now. A plugin may look up
/// resources of those instances only: the instance it works on, not every tenant's.
#[derive(Default)]
pub(crate) struct Serving {
    calls: Mutex<HashMap<(u64, String), usize>>,
}

impl Serving {
    /// Marks launch `launch` as serving a call for `instance_id` until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, launch: u64, instance_id: &str) -> ServingGuard {
        *self
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((launch, instance_id.to_owned()))
            .or_insert(0) += 1;
        ServingGuard {
            serving: self.clone(),
            key: (launch, instance_id.to_owned()),
        }
    }

    fn serves(&self, launch: u64, instance_id: &str) -> bool {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&(launch, instance_id.to_owned()))
    }
}

pub(crate) struct ServingGuard {
    serving: Arc<Serving>,
    key: (u64, String),
}

impl Drop for ServingGuard {
    fn drop(&mut self) {
        let mut calls = self.serving.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = calls.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                calls.remove(&self.key);
            }
        }
    }
}

/// Issued tokens, stored by their SHA-256 so a lookup reveals nothing
/// through timing about a valid token.
#[derive(Default)]
pub(crate) struct AuthRegistry {
    tokens: RwLock<HashMap<String, Arc<Caller>>>,
}

impl AuthRegistry {
    pub(crate) fn register(&self, token: &str, caller: Caller) {
        self.tokens
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sha256_hex(token.as_bytes()), Arc::new(caller));
    }

    pub(crate) fn revoke(&self, token: &str) {
        self.tokens
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&sha256_hex(token.as_bytes()));
    }

    fn lookup(&self, token: &str) -> Option<Arc<Caller>> {
        self.tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&sha256_hex(token.as_bytes()))
            .cloned()
    }
}

/// The interceptor: rejects calls without a valid token (UNAUTHENTICATED)
/// and attaches the caller.
#[derive(Clone)]
pub(crate) struct Authenticate(Arc<AuthRegistry>);

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let token = req
            .metadata()
            .get(HOST_TOKEN_METADATA)
            .ok_or_else(|| {
                Status::unauthenticated(format!("missing {HOST_TOKEN_METADATA} metadata"))
            })?
            .to_str()
            .map_err(|_| Status::unauthenticated(format!("malformed {HOST_TOKEN_METADATA}")))?;
        let caller = self
            .0
            .lookup(token)
            .ok_or_else(|| Status::unauthenticated(format!("invalid {HOST_TOKEN_METADATA}")))?;
        req.extensions_mut().insert(caller);
        Ok(req)
    }
}

struct Held {
    key: (String, String),
    owner: u64,
    _permit: OwnedSemaphorePermit,
}

/// In-memory per-resource locks (instance id, resource name). Locks held by
/// a plugin process are released when it exits, so a crash leaves no stale
/// lock.
#[derive(Default)]
pub(crate) struct LockTable {
    sems: Mutex<HashMap<(String, String), Arc<Semaphore>>>,
    held: Mutex<HashMap<String, Held>>,
}

impl LockTable {
    /// Waits up to `wait` for the lock; `Some(lock_id)` when acquired.
    pub(crate) async fn acquire(
        &self,
        owner: u64,
        key: (String, String),
        wait: Duration,
    ) -> Option<String> {
        let sem = lock(&self.sems)
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone();
        let permit = if wait.is_zero() {
            sem.clone().try_acquire_owned().ok()
        } else {
            tokio::time::timeout(wait, sem.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok)
        };
        let Some(permit) = permit else {
            drop(sem);
            self.collect(&key);
            return None;
        };
        let id = random_hex(16);
        lock(&self.held).insert(
            id.clone(),
            Held {
                key,
                owner,
                _permit: permit,
            },
        );
        Some(id)
    }

    /// Releases a lock; only its owner may. Unknown ids are a no-op
    /// (release is idempotent).
    pub(crate) fn release(&self, owner: u64, lock_id: &str) -> Result<(), Status> {
        let held = {
            let mut held = lock(&self.held);
            match held.get(lock_id) {
                None => return Ok(()),
                Some(h) if h.owner != owner => {
                    return Err(Status::permission_denied(
                        "the lock is held by another plugin",
                    ));
                }
                Some(_) => held.remove(lock_id),
            }
        };
        if let Some(h) = held {
            let key = h.key.clone();
            drop(h);
            self.collect(&key);
        }
        Ok(())
    }

    /// Releases every lock held by `owner` (its process exited).
    pub(crate) fn release_owner(&self, owner: u64) {
        let released: Vec<Held> = {
            let mut held = lock(&self.held);
            let ids: Vec<String> = held
                .iter()
                .filter(|(_, h)| h.owner == owner)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| held.remove(id)).collect()
        };
        for h in released {
            let key = h.key.clone();
            tracing::warn!(
                instance = %key.0,
                resource = %key.1,
                "lock released: its holder exited"
            );
            drop(h);
            self.collect(&key);
        }
    }

    /// Forgets a key's semaphore when nobody holds or waits for it.
    fn collect(&self, key: &(String, String)) {
        let mut sems = lock(&self.sems);
        if let Some(sem) = sems.get(key)
            && Arc::strong_count(sem) == 1
            && sem.available_permits() == 1
        {
            sems.remove(key);
        }
    }

    #[cfg(test)]
    fn keys(&self) -> usize {
        lock(&self.sems).len()
    }
}

pub(crate) struct HostServiceHandle {
    pub dir: PathBuf,
    pub socket: PathBuf,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl HostServiceHandle {
    /// Stops serving and removes the socket directory.
    pub(crate) async fn stop(&self) {
        if let Some(tx) = lock(&self.shutdown).take() {
            let _ = tx.send(());
        }
        let task = lock(&self.task).take();
        if let Some(task) = task
            && tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
        {
            tracing::warn!("Host service did not stop within 2s");
        }
        self.remove_dir();
    }

    /// Non-async last resort (drop).
    pub(crate) fn abort(&self) {
        if let Some(tx) = lock(&self.shutdown).take() {
            let _ = tx.send(());
        }
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
        self.remove_dir();
    }

    fn remove_dir(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove the Host service directory");
        }
    }
}

pub(crate) async fn start(shared: Arc<Shared>) -> std::io::Result<HostServiceHandle> {
    let dir = process::fresh_private_dir(&shared.runtime_dir, "h")?;
    let socket = dir.join("host.sock");
    let listener = match tokio::net::UnixListener::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let service = HostService {
        inner: shared.inner.clone(),
        locks: shared.locks.clone(),
    };
    let (tx, rx) = oneshot::channel::<()>();
    let router = tonic::transport::Server::builder()
        .layer(InterceptorLayer::new(Authenticate(shared.auth.clone())))
        .add_service(
            HostServer::new(service)
                .max_decoding_message_size(shared.config.max_message_bytes)
                .max_encoding_message_size(shared.config.max_message_bytes),
        );
    let task = tokio::spawn(async move {
        // Plugins in any language call it: gRPC's C core sends the socket path as authority.
        let incoming = trellis_proto::unix_conn::incoming(listener);
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await
        {
            tracing::error!(error = %e, "Host service stopped");
        }
    });
    tracing::debug!(socket = %socket.display(), "Host service listening");
    Ok(HostServiceHandle {
        dir,
        socket,
        shutdown: Mutex::new(Some(tx)),
        task: Mutex::new(Some(task)),
    })
}

struct HostService {
    inner: Weak<super::Inner>,
    locks: Arc<LockTable>,
}

fn caller<T>(req: &Request<T>) -> Result<Arc<Caller>, Status> {
    // Present on every request the interceptor let through.
    req.extensions()
        .get::<Arc<Caller>>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no caller"))
}

fn app_error(class: pb::ErrorClass, message: String) -> pb::Error {
    pb::Error {
        error_class: class as i32,
        message,
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Host for HostService {
    async fn call_function(
        &self,
        request: Request<pb::HostCallFunctionRequest>,
    ) -> Result<Response<pb::CallFunctionResponse>, Status> {
        let caller = caller(&request)?;
        let pb::HostCallFunctionRequest { name, args } = request.into_inner();
        tracing::debug!(plugin = %caller.plugin, function = %name, "Host.CallFunction");
        if crate::functions::core(&name).is_some() {
            return Ok(Response::new(call_core(&name, &args)));
        }
        let Some(inner) = self.inner.upgrade() else {
            return Err(Status::unavailable("the engine is shutting down"));
        };
        let host = super::PluginHost { inner };
        let provider = match host.function_provider(&name).await {
            Some(p) => p,
            None => {
                return Ok(Response::new(pb::CallFunctionResponse {
                    result: None,
                    error: Some(app_error(
                        pb::ErrorClass::NotFound,
                        format!("no core or provider function `{name}`"),
                    )),
                }));
            }
        };
        let resp = match provider
            .call_function(&name, args, &CallOptions::default())
            .await
        {
            Ok(v) => pb::CallFunctionResponse {
                result: Some(v),
                error: None,
            },
            Err(super::PluginError::Application(e)) => pb::CallFunctionResponse {
                result: None,
                error: Some(e.error),
            },
            Err(e @ super::PluginError::DeadlineExceeded { .. }) => pb::CallFunctionResponse {
                result: None,
                error: Some(app_error(pb::ErrorClass::Transient, e.to_string())),
            },
            Err(e) => pb::CallFunctionResponse {
                result: None,
                error: Some(app_error(pb::ErrorClass::Internal, e.to_string())),
            },
        };
        Ok(Response::new(resp))
    }

    /// A resource of an instance the calling plugin process is serving a call for, read
    /// from the engine's state.
    async fn lookup_resource(
        &self,
        request: Request<pb::LookupResourceRequest>,
    ) -> Result<Response<pb::LookupResourceResponse>, Status> {
        let caller = caller(&request)?;
        let r = request.into_inner();
        if r.instance_id.is_empty() || r.resource_name.is_empty() {
            return Err(Status::invalid_argument(
                "instance_id and resource_name are required",
            ));
        }
        let inner = self
            .inner
            .upgrade()
            .ok_or_else(|| Status::unavailable("the engine is stopping"))?;
        if !inner.shared.serving.serves(caller.instance, &r.instance_id) {
            return Err(Status::permission_denied(format!(
                "plugin `{}` is serving no call for instance `{}`: a plugin may look up \
                 resources only of the instance a call of its is for (CallContext.instance_id)",
                caller.plugin, r.instance_id
            )));
        }
        let Some(state) = inner.shared.state_lookup.get() else {
            return Err(Status::unavailable(
                "no state is attached to this plugin host",
            ));
        };
        let resource = state
            .lookup(&r.instance_id, &r.resource_name)
            .await
            .map_err(Status::unavailable)?;
        Ok(Response::new(pb::LookupResourceResponse {
            found: resource.is_some(),
            resource,
        }))
    }

    async fn acquire_lock(
        &self,
        request: Request<pb::AcquireLockRequest>,
    ) -> Result<Response<pb::AcquireLockResponse>, Status> {
        let caller = caller(&request)?;
        let r = request.into_inner();
        if r.resource_name.is_empty() {
            return Err(Status::invalid_argument("resource_name is empty"));
        }
        let wait = Duration::from_millis(r.timeout_ms).min(MAX_LOCK_WAIT);
        let id = self
            .locks
            .acquire(caller.instance, (r.instance_id, r.resource_name), wait)
            .await;
        Ok(Response::new(pb::AcquireLockResponse {
            acquired: id.is_some(),
            lock_id: id.unwrap_or_default(),
        }))
    }

    async fn release_lock(
        &self,
        request: Request<pb::ReleaseLockRequest>,
    ) -> Result<Response<pb::ReleaseLockResponse>, Status> {
        let caller = caller(&request)?;
        self.locks
            .release(caller.instance, &request.into_inner().lock_id)?;
        Ok(Response::new(pb::ReleaseLockResponse {}))
    }
}

/// A core function called by a plugin: evaluated in-process, with the
/// engine's clock and working directory; links read as unknown.
fn call_core(name: &str, args: &[pb::Value]) -> pb::CallFunctionResponse {
    use crate::eval::functions::{Env, call};
    let cwd = std::env::current_dir()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let now_unix_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    let link = |_: &str, _: &str| crate::eval::value::Value::Unknown;
    let env = Env {
        cwd: &cwd,
        now_unix_nanos,
        link: &link,
    };
    let sensitive = args.iter().any(values::any_sensitive);
    let eval_args = args.iter().map(values::to_eval).collect();
    match call(name, eval_args, Vec::new(), &env) {
        Ok(v) => match values::from_eval(&v) {
            Some(mut result) => {
                result.sensitive |= sensitive;
                pb::CallFunctionResponse {
                    result: Some(result),
                    error: None,
                }
            }
            None => pb::CallFunctionResponse {
                result: None,
                error: Some(app_error(
                    pb::ErrorClass::BadInput,
                    format!("{name} returned a function value, which cannot leave the engine"),
                )),
            },
        },
        Err(e) => {
            let mut err = app_error(pb::ErrorClass::BadInput, e.to_string());
            if let Some(pos) = e.position {
                err.path = Some(pb::AttributePath {
                    steps: vec![pb::PathStep {
                        step: Some(pb::path_step::Step::Index(pos.saturating_sub(1) as u64)),
                    }],
                });
            }
            pb::CallFunctionResponse {
                result: None,
                error: Some(err),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn locks_exclude_time_out_and_are_collected() {
        let t = LockTable::default();
        let key = || ("i".to_owned(), "r".to_owned());
        let a = t.acquire(1, key(), Duration::ZERO).await;
        assert!(a.is_some());
        assert!(
            t.acquire(2, key(), Duration::from_millis(20))
                .await
                .is_none()
        );
        assert!(t.release(2, a.as_deref().unwrap_or_default()).is_err());
        assert!(t.release(1, a.as_deref().unwrap_or_default()).is_ok());
        assert_eq!(t.keys(), 0);
        let b = t.acquire(2, key(), Duration::ZERO).await;
        assert!(b.is_some());
        t.release_owner(2);
        assert_eq!(t.keys(), 0);
    }

    #[tokio::test]
    async fn a_waiter_gets_the_lock_on_release() {
        let t = Arc::new(LockTable::default());
        let key = || ("i".to_owned(), "r".to_owned());
        let a = t
            .acquire(1, key(), Duration::ZERO)
            .await
            .unwrap_or_default();
        let t2 = t.clone();
        let waiter =
            tokio::spawn(async move { t2.acquire(2, key(), Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(t.release(1, &a).is_ok());
        assert!(waiter.await.ok().flatten().is_some());
    }

    #[test]
    fn core_functions_through_the_host() {
        let r = call_core("to_upper", &[values::string("abc")]);
        assert_eq!(r.result, Some(values::string("ABC")));
        let r = call_core("to_upper", &[]);
        assert!(r.error.is_some());
    }
}
