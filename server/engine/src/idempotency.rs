//! Idempotency: a request id starts at most one operation (or change set), and a retry of the
//! same request gets what the first one started.

use super::*;

/// A request id's turn-taking lock (see [`Engine::once`]); its map entry goes with the last
/// holder.
pub(crate) struct Starting<'a> {
    map: &'a Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    request_id: String,
    pub(crate) lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Clones are made under the map's lock: two (the map's and ours) means nobody else
        // holds or waits for this id.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.request_id);
        }
    }
}

/// What identifies a CreateChangeSet request for its retries: the request as received (a
/// path, not the file's content; the variables in their order), not the plan's time.
pub(crate) fn plan_request_digest(
    instance: &str,
    source: &Source,
    variables: &[(String, String)],
    environment: &crate::settings::Environment,
) -> String {
    let mut parts: Vec<&[u8]> = vec![b"plan", instance.as_bytes()];
    let count;
    let path;
    match source {
        Source::Inline {
            file_name,
            content,
            children,
            assets,
        } => {
            count = children.len().to_le_bytes();
            parts.extend([b"inline".as_slice(), file_name.as_bytes(), content, &count]);
            for (name, body) in children {
                parts.extend([name.as_bytes(), body.as_slice()]);
            }
            // Only when sent, so the digests of requests without assets are unchanged.
            if !assets.is_empty() {
                parts.push(b"--assets--");
                for (path, digest) in assets {
                    parts.extend([path.as_bytes(), digest.as_bytes()]);
                }
            }
        }
        Source::Path(p) => {
            path = p.to_string_lossy();
            parts.extend([b"path".as_slice(), path.as_bytes()]);
        }
    }
    for (k, v) in variables {
        parts.extend([k.as_bytes(), v.as_bytes()]);
    }
    let environment = (!environment.is_empty()).then(|| environment.to_json().to_string());
    if let Some(e) = &environment {
        parts.extend([b"environment".as_slice(), e.as_bytes()]);
    }
    trellis_ids::digest(&parts)
}

impl Engine {
    /// Starts a mutation at most once per request id: a retry of the same request (same
    /// digest) gets the operation recorded first, whatever its status now, and starts nothing;
    /// the same id with another request is `AlreadyExists`. `start` runs for a new id only.
    pub(crate) async fn once(
        &self,
        request_id: &str,
        request_digest: &str,
        start: impl std::future::Future<Output = Result<Operation>>,
    ) -> Result<Operation> {
        if request_id.is_empty() {
            return Err(EngineError::InvalidArgument(
                "request_id is required (a fresh unique id per request; reuse it to retry)".into(),
            ));
        }
        // Identical requests arriving together in this engine take turns: the second finds
        // the first's operation instead of being refused by the lease the first holds.
        let ticket = self.starting(request_id);
        let _one_at_a_time = ticket.lock.lock().await;
        if let Some(op) = self.retried(request_id, request_digest).await? {
            return Ok(op);
        }
        match start.await {
            // Refused before recording anything (the instance is held, the change set taken):
            // perhaps by this very request, started at once through another engine on the same
            // store. Then its operation is the answer.
            Err(e @ (EngineError::Aborted(_) | EngineError::FailedPrecondition(_))) => {
                match self.retried(request_id, request_digest).await {
                    Ok(Some(op)) => Ok(op),
                    Err(reused @ EngineError::AlreadyExists(_)) => Err(reused),
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// The turn-taking lock of `request_id` (see [`Engine::once`]).
    pub(crate) fn starting(&self, request_id: &str) -> Starting<'_> {
        let mut map = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        let lock = map.entry(request_id.to_owned()).or_default().clone();
        Starting {
            map: &self.starting,
            request_id: request_id.to_owned(),
            lock,
        }
    }

    /// The existing operation for a retried request, or `None` for a new request id.
    pub(crate) async fn retried(
        &self,
        request_id: &str,
        request_digest: &str,
    ) -> Result<Option<Operation>> {
        match self.store.find_operation(request_id).await? {
            Some(op) if op.request_digest == request_digest => Ok(Some(op)),
            Some(_) => Err(EngineError::AlreadyExists(format!(
                "request id `{request_id}` was already used for a different request"
            ))),
            None => Ok(None),
        }
    }
}
