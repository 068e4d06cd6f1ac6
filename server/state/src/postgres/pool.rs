//! A small connection pool: at most `max` connections, idle ones kept for reuse, each set up
//! (statement timeout, search path) when it is opened. Hand-rolled because the store needs
//! nothing more than this, and a pool crate would bring its own runtime glue and features.

use std::sync::{Mutex, PoisonError};

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::{Client, Config, NoTls, Statement};

use crate::error::{Result, StateError};

pub(super) struct Pool {
    config: Config,
    /// Run on every new connection before it is used.
    setup: String,
    /// Where the pool connects, with no password: safe for messages.
    target: String,
    idle: Mutex<Vec<(Client, Arc<Statements>)>>,
    permits: Semaphore,
}

/// A connection's prepared statements, by SQL text. A statement given as text costs two round
/// trips (prepare, then execute) every time; prepared once per connection, one.
pub(super) type Statements = Mutex<HashMap<String, Statement>>;

impl Pool {
    pub(super) fn new(config: Config, setup: String, target: String, max: usize) -> Pool {
        Pool {
            config,
            setup,
            target,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(max.max(1)),
        }
    }

    pub(super) fn target(&self) -> &str {
        &self.target
    }

    /// A connection, waiting while `max` are in use.
    pub(super) async fn get(&self) -> Result<Conn<'_>> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StateError::Db("state store closed".into()))?;
        loop {
            let pooled = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match pooled {
                // A connection the server closed (restart, idle timeout) is dropped, not reused.
                Some((client, _)) if client.is_closed() => continue,
                Some((client, statements)) => {
                    return Ok(Conn {
                        client: Some(client),
                        statements,
                        pool: self,
                        _permit: permit,
                    });
                }
                None => break,
            }
        }
        let client = self.connect().await?;
        Ok(Conn {
            client: Some(client),
            statements: Arc::default(),
            pool: self,
            _permit: permit,
        })
    }

    async fn connect(&self) -> Result<Client> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(|e| {
            StateError::Db(format!(
                "cannot connect to PostgreSQL at {}: {e}",
                self.target
            ))
        })?;
        let target = self.target.clone();
        // The connection object does the socket I/O for its client until either side closes.
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(postgres = %target, error = %e, "PostgreSQL connection failed");
            }
        });
        client.batch_execute(&self.setup).await.map_err(|e| {
            StateError::Db(format!(
                "cannot set up a PostgreSQL connection to {}: {e}",
                self.target
            ))
        })?;
        Ok(client)
    }
}

/// A pooled connection; goes back to the pool when dropped (unless it broke).
pub(super) struct Conn<'p> {
    client: Option<Client>,
    statements: Arc<Statements>,
    pool: &'p Pool,
    _permit: SemaphorePermit<'p>,
}

impl Conn<'_> {
    /// The statements prepared on this connection.
    pub(super) fn statements(&self) -> Arc<Statements> {
        self.statements.clone()
    }

    pub(super) fn client(&mut self) -> &mut Client {
        // Only `Drop` takes the client out.
        self.client
            .as_mut()
            .expect("pooled client present until drop")
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        // A transaction dropped unfinished (its future was cancelled) queued its ROLLBACK on the
        // connection before this, so the next user starts outside any transaction.
        if let Some(client) = self.client.take()
            && !client.is_closed()
        {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((client, self.statements.clone()));
        }
    }
}
