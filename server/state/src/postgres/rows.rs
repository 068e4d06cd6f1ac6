//! Rows to records, and the queries reads and writes share. Bad stored data (an unknown status,
//! invalid JSON, a negative counter, a column of the wrong type) is `Corrupt`, never a panic.

use serde_json::Value;
use tokio_postgres::types::FromSql;
use tokio_postgres::{Row, Transaction};

use crate::error::{Result, StateError};
use crate::model::*;

/// Column `i` of `row`; a value of the wrong type is corruption, not a bad query.
pub(super) fn col<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| StateError::Corrupt(format!("column {i}: {e}")))
}

pub(super) fn parse_json(text: &str, what: impl FnOnce() -> String) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| StateError::Corrupt(format!("{}: {e}", what())))
}

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

pub(super) const INSTANCE_COLS: &str = "id, name, status, version, last_seq, pruned_through, \
     lease_epoch, lease_owner, lease_expires_at, created_at, updated_at, environment";

pub(super) fn decode_instance(row: &Row) -> Result<Instance> {
    let id: String = col(row, 0)?;
    let what = format!("instance {id}");
    let status = parse_status(InstanceStatus::parse, col(row, 2)?, &what)?;
    let lease = match (col::<Option<String>>(row, 7)?, col::<Option<i64>>(row, 8)?) {
        (Some(owner), Some(expires)) => Some(LeaseHolder {
            owner,
            expires_at: ts(expires),
        }),
        _ => None,
    };
    Ok(Instance {
        name: col(row, 1)?,
        status,
        version: to_u64(col(row, 3)?, &what)?,
        last_seq: to_u64(col(row, 4)?, &what)?,
        pruned_through: to_u64(col(row, 5)?, &what)?,
        lease_epoch: to_u64(col(row, 6)?, &what)?,
        lease,
        created_at: ts(col(row, 9)?),
        updated_at: ts(col(row, 10)?),
        environment: parse_json(col(row, 11)?, || what.clone())?,
        id,
    })
}

pub(super) const RESOURCE_COLS: &str = "instance_id, name, type, spec, state, status, \
     external_id, failure_reason, created_at, updated_at, depends_on, metadata, call_key";

pub(super) fn decode_resource(row: &Row) -> Result<Resource> {
    let instance_id: String = col(row, 0)?;
    let name: String = col(row, 1)?;
    let what = || format!("resource {name} of instance {instance_id}");
    let spec = parse_json(col(row, 3)?, || format!("{} spec", what()))?;
    let state = match col::<Option<&str>>(row, 4)? {
        Some(text) => Some(parse_json(text, || format!("{} state", what()))?),
        None => None,
    };
    let status = parse_status(ResourceStatus::parse, col(row, 5)?, &what())?;
    let depends_on = match parse_json(col(row, 10)?, || format!("{} depends_on", what()))? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let metadata = parse_json(col(row, 11)?, || format!("{} metadata", what()))?;
    Ok(Resource {
        depends_on,
        metadata,
        resource_type: col(row, 2)?,
        spec,
        state,
        status,
        external_id: col(row, 6)?,
        failure_reason: col(row, 7)?,
        call_key: col(row, 12)?,
        created_at: ts(col(row, 8)?),
        updated_at: ts(col(row, 9)?),
        instance_id,
        name,
    })
}

pub(super) const LINK_COLS: &str =
    "instance_id, resource_a, resource_b, link_type, status, data, created_at, updated_at";

pub(super) fn decode_link(row: &Row) -> Result<Link> {
    let instance_id: String = col(row, 0)?;
    let (a, b): (String, String) = (col(row, 1)?, col(row, 2)?);
    let what = format!("link {a} -> {b} of instance {instance_id}");
    Ok(Link {
        link_type: col(row, 3)?,
        status: parse_status(LinkStatus::parse, col(row, 4)?, &what)?,
        data: parse_json(col(row, 5)?, || format!("{what} data"))?,
        created_at: ts(col(row, 6)?),
        updated_at: ts(col(row, 7)?),
        instance_id,
        resource_a: a,
        resource_b: b,
    })
}

pub(super) const CHILD_COLS: &str = "instance_id, name, child_instance_id, created_at, updated_at";

pub(super) fn decode_child(row: &Row) -> Result<Child> {
    Ok(Child {
        instance_id: col(row, 0)?,
        name: col(row, 1)?,
        child_instance_id: col(row, 2)?,
        created_at: ts(col(row, 3)?),
        updated_at: ts(col(row, 4)?),
    })
}

pub(super) const EXPORT_COLS: &str = "instance_id, name, type, value, updated_at";

pub(super) fn decode_export(row: &Row) -> Result<Export> {
    let instance_id: String = col(row, 0)?;
    let name: String = col(row, 1)?;
    let value = parse_json(col(row, 3)?, || {
        format!("export {name} of instance {instance_id}")
    })?;
    Ok(Export {
        export_type: col(row, 2)?,
        value,
        updated_at: ts(col(row, 4)?),
        instance_id,
        name,
    })
}

pub(super) const CHANGE_SET_COLS: &str = "id, instance_id, planned_version, digest, body, status, \
     created_at, updated_at, request_id, request_digest";
/// The same columns with the body left out: a body is the whole plan (megabytes for a large
/// blueprint), and most readers need only the status, digest or version.
const CHANGE_SET_HEAD_COLS: &str = "id, instance_id, planned_version, digest, NULL::TEXT, \
     status, created_at, updated_at, request_id, request_digest";

pub(super) fn decode_change_set(row: &Row) -> Result<ChangeSet> {
    let id: String = col(row, 0)?;
    let what = format!("change set {id}");
    Ok(ChangeSet {
        instance_id: col(row, 1)?,
        planned_version: to_u64(col(row, 2)?, &what)?,
        digest: col(row, 3)?,
        body: match col::<Option<&str>>(row, 4)? {
            Some(text) => parse_json(text, || format!("{what} body"))?,
            None => Value::Null,
        },
        status: parse_status(ChangeSetStatus::parse, col(row, 5)?, &what)?,
        created_at: ts(col(row, 6)?),
        updated_at: ts(col(row, 7)?),
        request: match (col(row, 8)?, col(row, 9)?) {
            (Some(id), Some(digest)) => Some(RequestKey { id, digest }),
            _ => None,
        },
        id,
    })
}

pub(super) const OPERATION_COLS: &str = "id, instance_id, kind, request_id, request_digest, \
     change_set_id, owner, status, lease_owner, lease_epoch, error, created_at, updated_at, \
     finished_at, events_after";

pub(super) fn decode_operation(row: &Row) -> Result<Operation> {
    let id: String = col(row, 0)?;
    let what = format!("operation {id}");
    let kind: &str = col(row, 2)?;
    let kind = OperationKind::parse(kind)
        .ok_or_else(|| StateError::Corrupt(format!("{what}: unknown kind {kind:?}")))?;
    Ok(Operation {
        instance_id: col(row, 1)?,
        kind,
        request_id: col(row, 3)?,
        request_digest: col(row, 4)?,
        change_set_id: col(row, 5)?,
        owner: col(row, 6)?,
        status: parse_status(OperationStatus::parse, col(row, 7)?, &what)?,
        lease_owner: col(row, 8)?,
        lease_epoch: col::<Option<i64>>(row, 9)?
            .map(|e| to_u64(e, &what))
            .transpose()?,
        error: col(row, 10)?,
        created_at: ts(col(row, 11)?),
        updated_at: ts(col(row, 12)?),
        finished_at: col::<Option<i64>>(row, 13)?.map(ts),
        events_after: to_u64(col(row, 14)?, &what)?,
        id,
    })
}

pub(super) fn decode_event(row: &Row) -> Result<Event> {
    let instance_id: String = col(row, 0)?;
    let seq = to_u64(col(row, 1)?, "event seq")?;
    let payload = parse_json(col(row, 3)?, || {
        format!("event {seq} of instance {instance_id}")
    })?;
    Ok(Event {
        kind: col(row, 2)?,
        payload,
        at: ts(col(row, 4)?),
        instance_id,
        seq,
    })
}

// ---- queries shared by reads and writes -------------------------------------------------------

pub(super) async fn get_instance(tx: &Transaction<'_>, id: &str) -> Result<Instance> {
    let sql = format!("SELECT {INSTANCE_COLS} FROM instances WHERE id = $1");
    match tx.query_opt(&sql, &[&id]).await? {
        Some(row) => decode_instance(&row),
        None => Err(StateError::not_found("instance", id)),
    }
}

/// The instance, its row locked until the transaction ends: every write to an instance (its
/// lease, version, sequence numbers, deployed state) takes this lock first, which serializes
/// them the way SQLite's single writer does. `NO KEY UPDATE` leaves foreign-key checks of other
/// transactions (a child pointing at this instance) unblocked.
pub(super) async fn lock_instance(tx: &Transaction<'_>, id: &str) -> Result<Instance> {
    let sql = format!("SELECT {INSTANCE_COLS} FROM instances WHERE id = $1 FOR NO KEY UPDATE");
    match tx.query_opt(&sql, &[&id]).await? {
        Some(row) => decode_instance(&row),
        None => Err(StateError::not_found("instance", id)),
    }
}

pub(super) async fn get_change_set(tx: &Transaction<'_>, id: &str) -> Result<ChangeSet> {
    let sql = format!("SELECT {CHANGE_SET_COLS} FROM change_sets WHERE id = $1");
    match tx.query_opt(&sql, &[&id]).await? {
        Some(row) => decode_change_set(&row),
        None => Err(StateError::not_found("change set", id)),
    }
}

/// A change set without its body (`Value::Null`).
pub(super) async fn get_change_set_head(tx: &Transaction<'_>, id: &str) -> Result<ChangeSet> {
    let sql = format!("SELECT {CHANGE_SET_HEAD_COLS} FROM change_sets WHERE id = $1");
    match tx.query_opt(&sql, &[&id]).await? {
        Some(row) => decode_change_set(&row),
        None => Err(StateError::not_found("change set", id)),
    }
}

pub(super) async fn find_change_set(
    tx: &Transaction<'_>,
    request_id: &str,
) -> Result<Option<ChangeSet>> {
    let sql = format!("SELECT {CHANGE_SET_COLS} FROM change_sets WHERE request_id = $1");
    tx.query_opt(&sql, &[&request_id])
        .await?
        .map(|row| decode_change_set(&row))
        .transpose()
}

/// The change set recorded for `key`'s request id, if it was recorded for the same request.
pub(super) fn same_request(cs: ChangeSet, key: &RequestKey) -> Result<ChangeSet> {
    match &cs.request {
        Some(k) if k.digest == key.digest => Ok(cs),
        _ => Err(StateError::RequestIdReused {
            request_id: key.id.clone(),
        }),
    }
}

pub(super) async fn get_operation(tx: &Transaction<'_>, id: &str) -> Result<Operation> {
    let sql = format!("SELECT {OPERATION_COLS} FROM operations WHERE id = $1");
    match tx.query_opt(&sql, &[&id]).await? {
        Some(row) => decode_operation(&row),
        None => Err(StateError::not_found("operation", id)),
    }
}

pub(super) async fn find_operation(
    tx: &Transaction<'_>,
    request_id: &str,
) -> Result<Option<Operation>> {
    let sql = format!("SELECT {OPERATION_COLS} FROM operations WHERE request_id = $1");
    tx.query_opt(&sql, &[&request_id])
        .await?
        .map(|row| decode_operation(&row))
        .transpose()
}

/// Rows of `table` for one instance, in insertion order.
pub(super) async fn list<T>(
    tx: &Transaction<'_>,
    cols: &str,
    table: &str,
    instance_id: &str,
    decode: fn(&Row) -> Result<T>,
) -> Result<Vec<T>> {
    let sql = format!("SELECT {cols} FROM {table} WHERE instance_id = $1 ORDER BY pos");
    tx.query(&sql, &[&instance_id])
        .await?
        .iter()
        .map(decode)
        .collect()
}
