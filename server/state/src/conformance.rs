//! The store-agnostic conformance suite: the semantics every [`StateStore`] must have, written
//! once. Each case is an async function taking a fresh [`Harness`]; a backend runs them all with
//! one line in its test file:
//!
//! ```ignore
//! async fn harness() -> trellis_state::conformance::Harness { /* a fresh, empty store */ }
//! trellis_state::state_conformance_tests!(harness);
//! ```
//!
//! Time only moves through the harness's [`ManualClock`], so lease expiry and retention are
//! tested without sleeping, and nothing here depends on how fast the machine is.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;

/// A fresh, empty store and the clock it reads.
pub struct Harness {
    pub store: Arc<dyn StateStore>,
    pub clock: Arc<ManualClock>,
    /// Keeps whatever backs the store alive for the test (a temp dir, a database schema...).
    pub guard: Option<Box<dyn Any + Send + Sync>>,
}

/// The lease TTL the cases use.
pub const TTL: Duration = Duration::from_secs(30);

/// Every case, in the order [`state_conformance_tests!`](crate::state_conformance_tests) runs
/// them.
pub const CASES: &[&str] = &[
    "instances_crud",
    "deployed_state_crud",
    "unit_of_work_is_atomic",
    "sequences_gap_free_under_concurrent_writers",
    "resume_from_every_sequence",
    "waiting_for_events",
    "leases_and_fencing",
    "intents_before_create",
    "change_set_staleness_and_double_execution",
    "request_id_idempotency",
    "change_set_request_ids",
    "interrupted_operations",
    "cancel_requests",
    "local_assets",
    "retention",
    "retention_runs_by_itself",
];

/// Expands to one `#[tokio::test]` per conformance case, each with a fresh harness from
/// `$factory` (an async fn returning [`Harness`]). Used by every backend's test file.
#[macro_export]
macro_rules! state_conformance_tests {
    ($factory:path) => {
        $crate::state_conformance_tests!(@cases $factory;
            instances_crud,
            deployed_state_crud,
            unit_of_work_is_atomic,
            sequences_gap_free_under_concurrent_writers,
            resume_from_every_sequence,
            waiting_for_events,
            leases_and_fencing,
            intents_before_create,
            change_set_staleness_and_double_execution,
            request_id_idempotency,
            change_set_request_ids,
            interrupted_operations,
            cancel_requests,
            local_assets,
            retention,
            retention_runs_by_itself,
        );
    };
    (@cases $factory:path; $($case:ident,)*) => {
        #[test]
        fn conformance_macro_covers_every_case() {
            let listed: &[&str] = &[$(stringify!($case),)*];
            assert_eq!(listed, $crate::conformance::CASES);
        }
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $factory().await;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}

// ---- helpers ----------------------------------------------------------------------------------

/// Asserts that `$result` is an `Err` matching `$pattern`, showing what it was otherwise.
macro_rules! assert_err {
    ($result:expr, $pattern:pat $(if $guard:expr)?) => {
        match $result {
            Err($pattern) $(if $guard)? => {}
            other => panic!(
                "expected Err({}), got {:?}",
                stringify!($pattern),
                other
            ),
        }
    };
}

async fn instance(h: &Harness, name: &str) -> Instance {
    h.store
        .create_instance(name)
        .await
        .expect("create instance")
}

async fn lease(h: &Harness, instance: &Instance, owner: &str) -> Lease {
    h.store
        .acquire_lease(&instance.id, owner, TTL)
        .await
        .expect("acquire lease")
}

async fn state(h: &Harness, instance: &Instance) -> InstanceState {
    h.store.load_state(&instance.id).await.expect("load state")
}

async fn all_events(h: &Harness, instance_id: &str) -> Vec<Event> {
    h.store
        .events_since(instance_id, 0, usize::MAX)
        .await
        .expect("events")
}

fn ev(kind: &str, payload: Value) -> NewEvent {
    NewEvent::new(kind, payload)
}

fn intend(name: &str, spec: Value) -> Change {
    Change::IntendCreate {
        name: name.into(),
        resource_type: "test/thing".into(),
        spec,
        depends_on: vec![],
        metadata: Value::Null,
        key: "conformance-key".into(),
    }
}

fn created(name: &str, external_id: &str) -> Change {
    Change::ResourceCreated {
        name: name.into(),
        external_id: external_id.into(),
        state: json!({ "id": external_id }),
    }
}

fn export(name: &str, value: Value) -> Change {
    Change::PutExport {
        name: name.into(),
        export_type: "string".into(),
        value,
    }
}

fn new_change_set(instance: &Instance, planned_version: u64) -> NewChangeSet {
    NewChangeSet {
        instance_id: instance.id.clone(),
        planned_version,
        digest: format!("sha256:plan-{planned_version}"),
        body: json!({ "changes": [{ "create": "api" }] }),
        request: None,
    }
}

fn new_operation(instance: &Instance, request_id: &str, digest: &str, owner: &str) -> NewOperation {
    NewOperation {
        instance_id: instance.id.clone(),
        kind: OperationKind::Deploy,
        request_id: request_id.into(),
        request_digest: digest.into(),
        change_set_id: None,
        owner: owner.into(),
    }
}

fn op_status(id: &str, status: OperationStatus) -> Change {
    Change::OperationStatus {
        id: id.into(),
        status,
        error: None,
    }
}

/// The sequence numbers of `events`, in order.
fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

// ---- cases ------------------------------------------------------------------------------------

/// Instances: create, name uniqueness, get, find, list, not found.
pub async fn instances_crud(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    assert_eq!(app.name, "app");
    assert_eq!(app.status, InstanceStatus::New);
    assert_eq!(app.version, 0);
    assert_eq!(app.lease_epoch, 0);
    assert_eq!(app.lease, None);
    assert_eq!(app.created_at, h.clock.now());
    assert_eq!(app.updated_at, h.clock.now());
    // Creation is itself an event, so a watcher of a new instance sees it from seq 1.
    assert_eq!(app.last_seq, 1);
    let events = all_events(h, &app.id).await;
    assert_eq!(seqs(&events), [1]);
    assert_eq!(events[0].kind, "instance.created");

    assert_err!(
        s.create_instance("app").await,
        StateError::Conflict(Conflict::NameTaken { name }) if name == "app"
    );
    assert_err!(
        s.create_instance("").await,
        StateError::Conflict(Conflict::Rejected(_))
    );

    assert_eq!(s.get_instance(&app.id).await.unwrap(), app);
    assert_eq!(s.find_instance("app").await.unwrap(), Some(app.clone()));
    assert_eq!(s.find_instance("nope").await.unwrap(), None);
    assert_err!(
        s.get_instance("nope").await,
        StateError::NotFound {
            kind: "instance",
            ..
        }
    );
    assert_err!(s.load_state("nope").await, StateError::NotFound { .. });

    h.clock.advance(Duration::from_secs(1));
    let web = instance(h, "web").await;
    assert_ne!(web.id, app.id);
    let names: Vec<String> = s
        .list_instances()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["app", "web"], "insertion order");

    let st = state(h, &app).await;
    assert_eq!(st.instance, app);
    assert!(st.resources.is_empty() && st.links.is_empty());
    assert!(st.children.is_empty() && st.exports.is_empty());
}

/// Resources, links, children, exports and instance status through units of work; versions and
/// timestamps; referential rules.
pub async fn deployed_state_crud(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    let child = instance(h, "app/network").await;
    let l = lease(h, &app, "engine-1").await;
    let t0 = h.clock.now();

    let c = s
        .commit(
            &l,
            vec![
                Change::InstanceStatus(InstanceStatus::Deploying),
                intend("db", json!({ "size": 1 })),
                created("db", "db-123"),
                intend("api", json!({ "handler": "main" })),
                created("api", "api-9"),
                Change::PutLink {
                    resource_a: "api".into(),
                    resource_b: "db".into(),
                    link_type: "test/api::test/db".into(),
                    status: LinkStatus::Created,
                    data: json!({ "env": { "DB": "db-123" } }),
                },
                Change::PutChild {
                    name: "network".into(),
                    child_instance_id: child.id.clone(),
                },
                export("endpoint", json!("https://api")),
                Change::InstanceStatus(InstanceStatus::Deployed),
                Change::InstanceEnvironment(
                    json!({ "environment": { "name": "dev" }, "providers": { "aws": { "key": { "$sensitive": "k" } } } }),
                ),
            ],
            vec![ev("deploy.step", json!({ "n": 1 }))],
        )
        .await
        .unwrap();
    assert_eq!(c.version, 1);
    assert_eq!((c.first_seq, c.last_seq), (2, 2));
    assert_eq!(c.event_count(), 1);

    let st = state(h, &app).await;
    assert_eq!(st.instance.status, InstanceStatus::Deployed);
    // The environment record is kept as given, and a new instance has none.
    assert_eq!(
        st.instance.environment,
        json!({ "environment": { "name": "dev" }, "providers": { "aws": { "key": { "$sensitive": "k" } } } })
    );
    assert_eq!(child.environment, serde_json::Value::Null);
    assert_eq!(st.instance.version, 1);
    assert_eq!(st.instance.last_seq, 2);
    let names: Vec<&str> = st.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["db", "api"], "insertion order");
    assert_eq!(s.count_resources(&app.id).await.unwrap(), 2);
    assert_eq!(s.count_resources(&child.id).await.unwrap(), 0);
    assert_err!(s.count_resources("nope").await, StateError::NotFound { .. });
    // One resource alone reads as it does in the whole state.
    let whole = st.resources.iter().find(|r| r.name == "db").cloned();
    assert_eq!(s.get_resource(&app.id, "db").await.unwrap(), whole);
    assert_eq!(s.get_resource(&app.id, "missing").await.unwrap(), None);
    assert_eq!(s.get_resource(&child.id, "db").await.unwrap(), None);
    assert_err!(
        s.get_resource("nope", "db").await,
        StateError::NotFound { .. }
    );
    let db = st.resource("db").unwrap();
    assert_eq!(db.instance_id, app.id);
    assert_eq!(db.resource_type, "test/thing");
    assert_eq!(db.spec, json!({ "size": 1 }));
    assert_eq!(db.state, Some(json!({ "id": "db-123" })));
    assert_eq!(db.status, ResourceStatus::Created);
    assert_eq!(db.external_id.as_deref(), Some("db-123"));
    assert_eq!(db.failure_reason, None);
    assert_eq!((db.created_at, db.updated_at), (t0, t0));
    assert_eq!(st.links.len(), 1);
    assert_eq!(st.links[0].resource_a, "api");
    assert_eq!(st.links[0].resource_b, "db");
    assert_eq!(st.links[0].link_type, "test/api::test/db");
    assert_eq!(st.links[0].status, LinkStatus::Created);
    assert_eq!(st.links[0].data, json!({ "env": { "DB": "db-123" } }));
    assert_eq!(st.children.len(), 1);
    assert_eq!(st.children[0].name, "network");
    assert_eq!(st.children[0].child_instance_id, child.id);
    let endpoint = st.export("endpoint").unwrap();
    assert_eq!(endpoint.export_type, "string");
    assert_eq!(endpoint.value, json!("https://api"));

    // Updates keep identity and creation time, move updated_at, keep the external id unless a
    // new one is given.
    h.clock.advance(Duration::from_secs(5));
    let t1 = h.clock.now();
    let c = s
        .commit(
            &l,
            vec![
                Change::IntendUpdate {
                    name: "db".into(),
                    spec: json!({ "size": 2 }),
                    depends_on: vec![],
                    metadata: Value::Null,
                    key: "conformance-key".into(),
                },
                Change::ResourceUpdated {
                    name: "db".into(),
                    external_id: None,
                    state: json!({ "id": "db-123", "size": 2 }),
                },
                Change::PutLink {
                    resource_a: "api".into(),
                    resource_b: "db".into(),
                    link_type: "test/api::test/db".into(),
                    status: LinkStatus::Updated,
                    data: json!({ "env": { "DB": "db-123", "SIZE": 2 } }),
                },
                export("endpoint", json!("https://api/v2")),
            ],
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(c.version, 2);
    assert_eq!(c.event_count(), 0);
    assert_eq!((c.first_seq, c.last_seq), (3, 2));
    let st = state(h, &app).await;
    let db = st.resource("db").unwrap();
    assert_eq!(db.status, ResourceStatus::Updated);
    assert_eq!(db.spec, json!({ "size": 2 }));
    assert_eq!(db.state, Some(json!({ "id": "db-123", "size": 2 })));
    assert_eq!(db.external_id.as_deref(), Some("db-123"));
    assert_eq!((db.created_at, db.updated_at), (t0, t1));
    assert_eq!(st.links.len(), 1);
    assert_eq!(st.links[0].status, LinkStatus::Updated);
    assert_eq!((st.links[0].created_at, st.links[0].updated_at), (t0, t1));
    assert_eq!(
        st.export("endpoint").unwrap().value,
        json!("https://api/v2")
    );
    assert_eq!(st.instance.updated_at, t1);

    // Referential rules.
    let link_to = |b: &str| Change::PutLink {
        resource_a: "api".into(),
        resource_b: b.into(),
        link_type: "t".into(),
        status: LinkStatus::Created,
        data: json!({}),
    };
    assert_err!(
        s.commit(&l, vec![link_to("ghost")], vec![]).await,
        StateError::NotFound {
            kind: "resource",
            ..
        }
    );
    let put_child = |id: &str| Change::PutChild {
        name: "x".into(),
        child_instance_id: id.into(),
    };
    assert_err!(
        s.commit(&l, vec![put_child("ghost")], vec![]).await,
        StateError::NotFound {
            kind: "instance",
            ..
        }
    );
    assert_err!(
        s.commit(&l, vec![put_child(&app.id)], vec![]).await,
        StateError::Conflict(Conflict::Rejected(_))
    );
    assert_err!(
        s.commit(
            &l,
            vec![
                Change::IntendDestroy {
                    name: "db".into(),
                    key: "destroy-db".into(),
                },
                Change::ResourceRemoved { name: "db".into() },
            ],
            vec![],
        )
        .await,
        StateError::Conflict(Conflict::InUse {
            kind: "resource",
            ..
        })
    );

    // Removal, in dependency order.
    let c = s
        .commit(
            &l,
            vec![
                Change::RemoveLink {
                    resource_a: "api".into(),
                    resource_b: "db".into(),
                },
                Change::IntendDestroy {
                    name: "db".into(),
                    key: "destroy-db".into(),
                },
                Change::ResourceRemoved { name: "db".into() },
                Change::RemoveChild {
                    name: "network".into(),
                },
                Change::RemoveExport {
                    name: "endpoint".into(),
                },
                Change::InstanceStatus(InstanceStatus::Destroying),
            ],
            vec![ev("deploy.step", json!({ "n": 2 }))],
        )
        .await
        .unwrap();
    assert_eq!(c.version, 3, "failed commits do not count");
    let st = state(h, &app).await;
    assert_eq!(st.instance.status, InstanceStatus::Destroying);
    assert_eq!(st.resources.len(), 1);
    assert!(st.links.is_empty() && st.children.is_empty() && st.exports.is_empty());
    for missing in [
        Change::RemoveExport {
            name: "endpoint".into(),
        },
        Change::RemoveChild {
            name: "network".into(),
        },
        Change::RemoveLink {
            resource_a: "api".into(),
            resource_b: "db".into(),
        },
        Change::ResourceRemoved { name: "db".into() },
    ] {
        assert_err!(
            s.commit(&l, vec![missing], vec![]).await,
            StateError::NotFound { .. }
        );
    }
    // The child instance is untouched by its parent's changes.
    assert_eq!(state(h, &child).await.instance.version, 0);
}

/// A unit of work whose last change fails writes nothing: no change, no event, no version, no
/// sequence number used.
pub async fn unit_of_work_is_atomic(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    let l = lease(h, &app, "engine-1").await;
    s.commit(
        &l,
        vec![intend("db", json!({})), created("db", "db-1")],
        vec![ev("seed", json!({}))],
    )
    .await
    .unwrap();
    let before = state(h, &app).await;

    let failing_units: Vec<Vec<Change>> = vec![
        // An unknown resource at the end.
        vec![
            export("x", json!(1)),
            intend("cache", json!({})),
            Change::InstanceStatus(InstanceStatus::Deployed),
            created("ghost", "g-1"),
        ],
        // A transition that does not apply (db is Created, not CreateRequested).
        vec![
            export("x", json!(1)),
            Change::IntendUpdate {
                name: "db".into(),
                spec: json!({ "v": 2 }),
                depends_on: vec![],
                metadata: Value::Null,
                key: "conformance-key".into(),
            },
            created("db", "db-2"),
        ],
        // An operation of nowhere.
        vec![
            intend("cache", json!({})),
            op_status("op_missing", OperationStatus::Running),
        ],
    ];
    for changes in failing_units {
        let result = s
            .commit(
                &l,
                changes,
                vec![ev("should.not.land", json!({})), ev("nor.this", json!({}))],
            )
            .await;
        assert!(result.is_err(), "expected the unit to fail: {result:?}");
        let after = state(h, &app).await;
        assert_eq!(after, before, "a failed unit of work changed state");
        let tail = s
            .events_since(&app.id, before.instance.last_seq, usize::MAX)
            .await
            .unwrap();
        assert!(tail.is_empty(), "events of a failed unit landed: {tail:?}");
    }

    // The next successful commit takes the very next sequence number.
    let c = s
        .commit(&l, vec![export("x", json!(1))], vec![ev("ok", json!({}))])
        .await
        .unwrap();
    assert_eq!(c.first_seq, before.instance.last_seq + 1);
    assert_eq!(c.version, before.instance.version + 1);
}

/// Several writers at once (fenced commits sharing one lease, unfenced plan and operation
/// writers, another instance): each instance's sequence is exactly 1..=n, and each commit's
/// events are contiguous and its own.
pub async fn sequences_gap_free_under_concurrent_writers(h: &Harness) {
    let app = instance(h, "app").await;
    let other = instance(h, "other").await;
    let l_app = lease(h, &app, "engine-1").await;
    let l_other = lease(h, &other, "engine-1").await;

    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..4u64 {
        let (store, l) = (h.store.clone(), l_app.clone());
        tasks.spawn(async move {
            let mut ranges = Vec::new();
            for i in 0..20u64 {
                let n = 1 + (t + i) % 3; // 1 to 3 events per unit
                let events = (0..n)
                    .map(|k| ev(&format!("task-{t}"), json!({ "i": i, "k": k })))
                    .collect();
                let c = store
                    .commit(&l, vec![export(&format!("t{t}"), json!(i))], events)
                    .await
                    .unwrap();
                assert_eq!(c.event_count(), n);
                ranges.push((c.first_seq, c.last_seq, format!("task-{t}")));
            }
            ranges
        });
    }
    {
        let (store, l) = (h.store.clone(), l_other.clone());
        tasks.spawn(async move {
            for i in 0..20u64 {
                store
                    .commit(&l, vec![], vec![ev("other", json!({ "i": i }))])
                    .await
                    .unwrap();
            }
            Vec::new()
        });
    }
    {
        let (store, app) = (h.store.clone(), app.clone());
        tasks.spawn(async move {
            for _ in 0..10 {
                store
                    .create_change_set(new_change_set(&app, 0))
                    .await
                    .unwrap();
            }
            Vec::new()
        });
    }
    {
        let (store, app) = (h.store.clone(), app.clone());
        tasks.spawn(async move {
            for i in 0..10 {
                let req = format!("req-{i}");
                store
                    .create_operation(new_operation(&app, &req, "d", "engine-1"))
                    .await
                    .unwrap();
            }
            Vec::new()
        });
    }
    let mut ranges = Vec::new();
    while let Some(r) = tasks.join_next().await {
        ranges.extend(r.expect("writer task panicked"));
    }

    let events = all_events(h, &app.id).await;
    let n = events.len() as u64;
    // 1 (created) + 4 tasks x 20 units x 2 events on average + 10 plans + 10 operations.
    assert_eq!(
        n,
        1 + (0..4u64)
            .map(|t| (0..20).map(|i| 1 + (t + i) % 3).sum::<u64>())
            .sum::<u64>()
            + 20
    );
    assert_eq!(seqs(&events), (1..=n).collect::<Vec<_>>(), "gap or repeat");
    let instance = h.store.get_instance(&app.id).await.unwrap();
    assert_eq!(instance.last_seq, n);
    assert_eq!(instance.version, 80, "one version per fenced commit");
    let mut covered = BTreeSet::new();
    for (first, last, kind) in ranges {
        for seq in first..=last {
            assert!(covered.insert(seq), "seq {seq} returned by two commits");
            assert_eq!(events[(seq - 1) as usize].kind, kind, "seq {seq}");
        }
    }
    let other_events = all_events(h, &other.id).await;
    assert_eq!(seqs(&other_events), (1..=21).collect::<Vec<_>>());
}

/// Resuming after any sequence number returns exactly the tail; paging with any limit returns
/// every event once.
pub async fn resume_from_every_sequence(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    let l = lease(h, &app, "engine-1").await;
    for i in 0..12u64 {
        let events = (0..=(i % 4))
            .map(|k| ev("step", json!({ "i": i, "k": k })))
            .collect();
        s.commit(&l, vec![], events).await.unwrap();
        h.clock.advance(Duration::from_millis(10));
    }
    let all = all_events(h, &app.id).await;
    let last = all.len() as u64;
    assert_eq!(seqs(&all), (1..=last).collect::<Vec<_>>());
    assert!(all.windows(2).all(|w| w[0].at <= w[1].at));
    assert!(all.iter().all(|e| e.instance_id == app.id));

    for after in 0..=last {
        let tail = s.events_since(&app.id, after, usize::MAX).await.unwrap();
        assert_eq!(tail, all[after as usize..], "resume after {after}");
        let page = s.events_since(&app.id, after, 5).await.unwrap();
        let end = (after as usize + 5).min(all.len());
        assert_eq!(page, all[after as usize..end], "page after {after}");
    }
    for limit in [1, 2, 7, 100] {
        let mut seen = Vec::new();
        let mut after = 0;
        loop {
            let page = s.events_since(&app.id, after, limit).await.unwrap();
            let Some(tail) = page.last() else { break };
            after = tail.seq;
            seen.extend(page);
        }
        assert_eq!(seen, all, "paging with limit {limit}");
    }
    assert!(
        s.events_since(&app.id, last + 10, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.events_since(&app.id, 0, 0).await.unwrap().is_empty());
    assert_err!(
        s.events_since("nope", 0, 10).await,
        StateError::NotFound { .. }
    );
}

/// Watchers wait for new events instead of polling, and wake for their instance.
pub async fn waiting_for_events(h: &Harness) {
    let app = instance(h, "app").await;
    let l = lease(h, &app, "engine-1").await;
    let last = app.last_seq;

    // Existing events return at once.
    let now = h.store.wait_events(&app.id, 0, 10).await.unwrap();
    assert_eq!(seqs(&now), [1]);

    let waiter = {
        let (store, id) = (h.store.clone(), app.id.clone());
        tokio::spawn(async move { store.wait_events(&id, last, 10).await })
    };
    let mut sub = h.store.subscribe(&app.id);
    // Give the waiter a chance to block first (correct either way: it subscribes before
    // reading, so an early commit is seen by the read, a late one by the wake-up).
    tokio::task::yield_now().await;
    let c = h
        .store
        .commit(&l, vec![], vec![ev("hello", json!({}))])
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("waiter never woke")
        .unwrap()
        .unwrap();
    assert_eq!(seqs(&got), [c.first_seq]);
    assert_eq!(got[0].kind, "hello");
    let woke = tokio::time::timeout(Duration::from_secs(60), sub.changed())
        .await
        .expect("subscription never woke");
    assert_eq!(woke, Some(c.last_seq));
}

/// Leases: conflict, heartbeat, expiry, epochs, fencing of every kind of write.
pub async fn leases_and_fencing(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    let cs = s.create_change_set(new_change_set(&app, 0)).await.unwrap();
    let l1 = lease(h, &app, "engine-1").await;
    assert_eq!(l1.epoch, 1);
    assert_eq!(l1.owner, "engine-1");
    assert_eq!(l1.instance_id, app.id);
    assert_eq!(l1.expires_at, h.clock.now().plus(TTL));
    let inst = s.get_instance(&app.id).await.unwrap();
    assert_eq!(inst.lease_epoch, 1);
    assert_eq!(
        inst.lease,
        Some(LeaseHolder {
            owner: "engine-1".into(),
            expires_at: l1.expires_at
        })
    );

    // Held: nobody else, not even the same owner, gets it.
    for owner in ["engine-2", "engine-1"] {
        assert_err!(
            s.acquire_lease(&app.id, owner, TTL).await,
            StateError::Conflict(Conflict::LeaseHeld { owner, epoch: 1, .. }) if owner == "engine-1"
        );
    }
    assert_err!(
        s.acquire_lease("nope", "engine-1", TTL).await,
        StateError::NotFound { .. }
    );

    // Heartbeat extends past the original expiry.
    h.clock.advance(TTL - Duration::from_secs(1));
    let l1 = s.heartbeat(&l1, TTL).await.unwrap();
    assert_eq!(l1.expires_at, h.clock.now().plus(TTL));
    assert_eq!(l1.epoch, 1);
    h.clock.advance(Duration::from_secs(2));
    assert_err!(
        s.acquire_lease(&app.id, "engine-2", TTL).await,
        StateError::Conflict(Conflict::LeaseHeld { .. })
    );
    s.commit(&l1, vec![export("x", json!(1))], vec![])
        .await
        .unwrap();

    // Expired but not taken over: still the current lease (no one else wrote), so its holder
    // may keep writing and renew.
    h.clock.advance(TTL + Duration::from_secs(1));
    s.commit(&l1, vec![export("x", json!(2))], vec![])
        .await
        .unwrap();
    let l1 = s.heartbeat(&l1, TTL).await.unwrap();
    h.clock.advance(TTL + Duration::from_secs(1));

    // Taken over: epoch + 1, and every write with the old lease is fenced.
    let l2 = lease(h, &app, "engine-2").await;
    assert_eq!(l2.epoch, 2);
    assert_ne!(l2.token, l1.token);
    let before = state(h, &app).await;
    let fenced = |r: Result<Committed>| {
        assert_err!(
            r,
            StateError::Fenced {
                epoch: 1,
                current_epoch: 2,
                ..
            }
        );
    };
    fenced(s.commit(&l1, vec![export("x", json!(3))], vec![]).await);
    fenced(s.commit(&l1, vec![], vec![ev("stale", json!({}))]).await);
    fenced(s.record_intent(&l1, "db", "test/thing", json!({})).await);
    fenced(s.begin_execution(&cs.id, &l1).await);
    assert_err!(
        s.heartbeat(&l1, TTL).await,
        StateError::Fenced {
            epoch: 1,
            current_epoch: 2,
            ..
        }
    );
    assert_err!(
        s.release_lease(&l1).await,
        StateError::Fenced {
            epoch: 1,
            current_epoch: 2,
            ..
        }
    );
    assert_eq!(state(h, &app).await, before, "a fenced write landed");

    // A lease with the right epoch but the wrong token is not the lease.
    let forged = Lease {
        token: "forged".into(),
        ..l2.clone()
    };
    assert_err!(
        s.commit(&forged, vec![], vec![]).await,
        StateError::Fenced { .. }
    );

    let c = s
        .commit(&l2, vec![export("x", json!(4))], vec![])
        .await
        .unwrap();
    assert_eq!(c.version, before.instance.version + 1);

    // Released: its writes are fenced and the next owner need not wait for expiry.
    s.release_lease(&l2).await.unwrap();
    assert_eq!(s.get_instance(&app.id).await.unwrap().lease, None);
    assert_err!(
        s.commit(&l2, vec![], vec![]).await,
        StateError::Fenced {
            epoch: 2,
            current_epoch: 2,
            ..
        }
    );
    let l3 = lease(h, &app, "engine-3").await;
    assert_eq!(l3.epoch, 3);
    assert_eq!(s.get_instance(&app.id).await.unwrap().lease_epoch, 3);

    // A lease fences its own instance only.
    let other = instance(h, "other").await;
    let lo = lease(h, &other, "engine-1").await;
    assert_eq!(lo.epoch, 1);
    let other_lease_on_app = Lease {
        instance_id: app.id.clone(),
        ..lo
    };
    assert_err!(
        s.commit(&other_lease_on_app, vec![], vec![]).await,
        StateError::Fenced { .. }
    );

    // The last change of a unit may give the lease up: the unit's events and the release land
    // together, and the next owner need not wait.
    assert_err!(
        s.commit(
            &l3,
            vec![
                Change::ReleaseLease,
                Change::InstanceStatus(InstanceStatus::Deployed)
            ],
            vec![],
        )
        .await,
        StateError::Conflict(Conflict::Rejected(_))
    );
    let done = s
        .commit(
            &l3,
            vec![
                Change::InstanceStatus(InstanceStatus::Deployed),
                Change::ReleaseLease,
            ],
            vec![NewEvent::new("operation.finished", json!({}))],
        )
        .await
        .unwrap();
    let after = s.get_instance(&app.id).await.unwrap();
    assert_eq!(after.status, InstanceStatus::Deployed);
    assert_eq!(after.last_seq, done.last_seq);
    assert_eq!(after.lease, None);
    assert_err!(
        s.commit(&l3, vec![], vec![]).await,
        StateError::Fenced { .. }
    );
    assert_eq!(lease(h, &app, "engine-1").await.epoch, 4);
}

/// The intent is recorded before the provider is called, and creation can only complete an
/// intent: a crash between the two leaves a `CreateRequested` record, never nothing.
pub async fn intents_before_create(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    let l1 = lease(h, &app, "engine-1").await;

    let c = s
        .record_intent(&l1, "db", "aws/rds", json!({ "engine": "postgres" }))
        .await
        .unwrap();
    let st = state(h, &app).await;
    let db = st.resource("db").unwrap();
    assert_eq!(db.status, ResourceStatus::CreateRequested);
    assert_eq!(db.resource_type, "aws/rds");
    assert_eq!(db.spec, json!({ "engine": "postgres" }));
    assert_eq!((db.external_id.as_ref(), db.state.as_ref()), (None, None));
    let events = s.events_since(&app.id, c.first_seq - 1, 10).await.unwrap();
    assert_eq!(events[0].kind, "resource.create_requested");
    assert_eq!(events[0].payload["resource"], "db");

    // "Crash": the engine dies after the intent, its lease expires, another engine takes over
    // and finds the intent, so it asks the provider instead of creating blindly again.
    h.clock.advance(TTL + Duration::from_secs(1));
    let l2 = lease(h, &app, "engine-2").await;
    let found = state(h, &app).await;
    assert_eq!(
        found.resource("db").unwrap().status,
        ResourceStatus::CreateRequested
    );
    assert_err!(
        s.complete_create(&l1, "db", "db-1", json!({})).await,
        StateError::Fenced { .. }
    );
    // Recording the intent again (a retry) is allowed; the record stays one.
    s.record_intent(&l2, "db", "aws/rds", json!({ "engine": "postgres" }))
        .await
        .unwrap();
    s.complete_create(&l2, "db", "db-1", json!({ "arn": "arn:db-1" }))
        .await
        .unwrap();
    let db = state(h, &app).await.resource("db").cloned().unwrap();
    assert_eq!(db.status, ResourceStatus::Created);
    assert_eq!(db.external_id.as_deref(), Some("db-1"));
    assert_eq!(db.state, Some(json!({ "arn": "arn:db-1" })));

    // No create without an intent; no double completion; no intent over a live resource.
    assert_err!(
        s.complete_create(&l2, "cache", "c-1", json!({})).await,
        StateError::NotFound {
            kind: "resource",
            ..
        }
    );
    assert_err!(
        s.complete_create(&l2, "db", "db-2", json!({})).await,
        StateError::Conflict(Conflict::InvalidTransition { from, .. }) if from == "created"
    );
    assert_err!(
        s.record_intent(&l2, "db", "aws/rds", json!({})).await,
        StateError::Conflict(Conflict::InvalidTransition { .. })
    );
    assert_err!(
        s.commit(
            &l2,
            vec![Change::ResourceRemoved { name: "db".into() }],
            vec![]
        )
        .await,
        StateError::Conflict(Conflict::InvalidTransition { .. })
    );

    // A failed create keeps the reason; a new intent clears it.
    s.record_intent(&l2, "cache", "aws/redis", json!({}))
        .await
        .unwrap();
    s.fail_resource(&l2, "cache", "quota exceeded")
        .await
        .unwrap();
    let cache = state(h, &app).await.resource("cache").cloned().unwrap();
    assert_eq!(cache.status, ResourceStatus::CreateFailed);
    assert_eq!(cache.failure_reason.as_deref(), Some("quota exceeded"));
    assert_err!(
        s.fail_resource(&l2, "cache", "again").await,
        StateError::Conflict(Conflict::InvalidTransition { .. })
    );
    s.record_intent(&l2, "cache", "aws/redis", json!({ "small": true }))
        .await
        .unwrap();
    let cache = state(h, &app).await.resource("cache").cloned().unwrap();
    assert_eq!(cache.status, ResourceStatus::CreateRequested);
    assert_eq!(cache.failure_reason, None);

    // Updates and destroys have intents too.
    let step = |change: Change| s.commit(&l2, vec![change], vec![]);
    step(Change::IntendUpdate {
        name: "db".into(),
        spec: json!({ "engine": "postgres", "size": 2 }),
        depends_on: vec!["net".into(), "dns".into()],
        metadata: json!({ "labels": { "app": "orders" } }),
        key: "conformance-key".into(),
    })
    .await
    .unwrap();
    let db = state(h, &app).await.resource("db").unwrap().clone();
    assert_eq!(db.status, ResourceStatus::UpdateRequested);
    // What it waits for and its labels are kept for removal and link planning.
    assert_eq!(db.depends_on, ["net", "dns"]);
    assert_eq!(db.metadata, json!({ "labels": { "app": "orders" } }));
    step(Change::ResourceFailed {
        name: "db".into(),
        reason: "timeout".into(),
    })
    .await
    .unwrap();
    assert_eq!(
        state(h, &app).await.resource("db").unwrap().status,
        ResourceStatus::UpdateFailed
    );
    step(Change::IntendUpdate {
        name: "db".into(),
        spec: json!({ "size": 3 }),
        depends_on: vec![],
        metadata: Value::Null,
        key: "conformance-key".into(),
    })
    .await
    .unwrap();
    step(Change::ResourceUpdated {
        name: "db".into(),
        external_id: Some("db-1b".into()),
        state: json!({ "size": 3 }),
    })
    .await
    .unwrap();
    let db = state(h, &app).await.resource("db").cloned().unwrap();
    assert_eq!(db.status, ResourceStatus::Updated);
    assert_eq!(db.external_id.as_deref(), Some("db-1b"));
    // An outcome with no intent before it is refused (the store may check the status in the
    // statement itself; the refusal still names what it found), and changes nothing.
    assert_err!(
        step(Change::ResourceUpdated {
            name: "db".into(),
            external_id: None,
            state: json!({ "size": 4 }),
        })
        .await,
        StateError::Conflict(Conflict::InvalidTransition { from, .. }) if from == "updated"
    );
    assert_err!(
        step(Change::ResourceCreated {
            name: "db".into(),
            external_id: "db-2".into(),
            state: json!({}),
        })
        .await,
        StateError::Conflict(Conflict::InvalidTransition { from, .. }) if from == "updated"
    );
    assert_err!(
        step(Change::IntendDestroy {
            name: "ghost".into(),
            key: "destroy-ghost".into(),
        })
        .await,
        StateError::NotFound {
            kind: "resource",
            ..
        }
    );
    assert_eq!(state(h, &app).await.resource("db"), Some(&db));
    step(Change::IntendDestroy {
        name: "db".into(),
        key: "destroy-db".into(),
    })
    .await
    .unwrap();
    assert_eq!(
        state(h, &app).await.resource("db").unwrap().status,
        ResourceStatus::DestroyRequested
    );
    step(Change::ResourceRemoved { name: "db".into() })
        .await
        .unwrap();
    assert!(state(h, &app).await.resource("db").is_none());
}

/// A change set runs only against the version it was planned on, and only once.
pub async fn change_set_staleness_and_double_execution(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    let l = lease(h, &app, "engine-1").await;

    let cs1 = s.create_change_set(new_change_set(&app, 0)).await.unwrap();
    assert_eq!(cs1.status, ChangeSetStatus::Planned);
    assert_eq!(cs1.planned_version, 0);
    assert_eq!(cs1.instance_id, app.id);
    assert_eq!(cs1.digest, "sha256:plan-0");
    assert_eq!(cs1.body, json!({ "changes": [{ "create": "api" }] }));
    assert_eq!(cs1.created_at, h.clock.now());
    assert_eq!(s.get_change_set(&cs1.id).await.unwrap(), cs1);
    assert_eq!(
        s.get_change_set_head(&cs1.id).await.unwrap(),
        ChangeSet {
            body: Value::Null,
            ..cs1.clone()
        }
    );
    assert_err!(
        s.get_change_set_head("nope").await,
        StateError::NotFound { .. }
    );
    assert_err!(
        s.create_change_set(new_change_set(&app, 5)).await,
        StateError::Conflict(Conflict::Rejected(_))
    );
    assert_err!(s.get_change_set("nope").await, StateError::NotFound { .. });

    // The instance moves on: cs1 is stale, and stays so.
    s.commit(&l, vec![export("x", json!(1))], vec![])
        .await
        .unwrap();
    let version_before = s.get_instance(&app.id).await.unwrap().version;
    assert_err!(
        s.begin_execution(&cs1.id, &l).await,
        StateError::Stale {
            planned_version: 0,
            current_version: 1,
            ..
        }
    );
    assert_eq!(
        s.get_change_set(&cs1.id).await.unwrap().status,
        ChangeSetStatus::Superseded
    );
    assert_err!(
        s.begin_execution(&cs1.id, &l).await,
        StateError::Stale { .. }
    );
    assert_eq!(
        s.get_instance(&app.id).await.unwrap().version,
        version_before,
        "a refused execution does not count as a change"
    );

    // Two plans of the same version: executing one supersedes the other.
    let cs2 = s.create_change_set(new_change_set(&app, 1)).await.unwrap();
    let cs3 = s.create_change_set(new_change_set(&app, 1)).await.unwrap();
    let c = s.begin_execution(&cs2.id, &l).await.unwrap();
    assert_eq!(c.version, 2);
    assert_eq!(c.event_count(), 1);
    let cs2_now = s.get_change_set(&cs2.id).await.unwrap();
    assert_eq!(cs2_now.status, ChangeSetStatus::Executing);
    assert_eq!(
        s.get_change_set(&cs3.id).await.unwrap().status,
        ChangeSetStatus::Superseded
    );
    assert_err!(
        s.begin_execution(&cs3.id, &l).await,
        StateError::Stale { .. }
    );

    // Never twice.
    assert_err!(
        s.begin_execution(&cs2.id, &l).await,
        StateError::AlreadyExecuted {
            status: ChangeSetStatus::Executing,
            ..
        }
    );
    s.commit(
        &l,
        vec![Change::ChangeSetStatus {
            id: cs2.id.clone(),
            status: ChangeSetStatus::Executed,
        }],
        vec![ev("change_set.executed", json!({}))],
    )
    .await
    .unwrap();
    assert_err!(
        s.begin_execution(&cs2.id, &l).await,
        StateError::AlreadyExecuted {
            status: ChangeSetStatus::Executed,
            ..
        }
    );
    assert_err!(
        s.commit(
            &l,
            vec![Change::ChangeSetStatus {
                id: cs2.id.clone(),
                status: ChangeSetStatus::Planned,
            }],
            vec![],
        )
        .await,
        StateError::Conflict(Conflict::InvalidTransition { .. })
    );

    // Concurrent double execution: exactly one wins.
    let v = s.get_instance(&app.id).await.unwrap().version;
    let cs4 = s.create_change_set(new_change_set(&app, v)).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (store, id, l) = (h.store.clone(), cs4.id.clone(), l.clone());
        tasks.spawn(async move { store.begin_execution(&id, &l).await });
    }
    let (mut won, mut refused) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(_) => won += 1,
            Err(StateError::AlreadyExecuted { .. }) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((won, refused), (1, 3));

    // A change set of another instance cannot run under this lease.
    let other = instance(h, "other").await;
    let foreign = s
        .create_change_set(new_change_set(&other, 0))
        .await
        .unwrap();
    assert_err!(
        s.begin_execution(&foreign.id, &l).await,
        StateError::Conflict(Conflict::Rejected(_))
    );
    assert_err!(
        s.begin_execution("nope", &l).await,
        StateError::NotFound { .. }
    );

    let ids: Vec<String> = s
        .list_change_sets(&app.id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, [cs1.id, cs2.id, cs3.id, cs4.id]);
}

/// One request id, one operation: retries return it, a different request under the same id is
/// refused, concurrent retries create one.
pub async fn request_id_idempotency(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    // A history before the operation: its events are not the operation's.
    let l = lease(h, &app, "engine-0").await;
    s.commit(
        &l,
        vec![],
        vec![ev("earlier", json!({})), ev("earlier", json!({}))],
    )
    .await
    .unwrap();
    s.release_lease(&l).await.unwrap();
    let history = s.get_instance(&app.id).await.unwrap().last_seq;
    assert!(history >= 2, "{history}");

    let first = s
        .create_operation(new_operation(&app, "req-1", "digest-a", "engine-1"))
        .await
        .unwrap();
    assert!(first.created);
    let op = first.operation;
    // Where a watch of the operation starts: every event of it comes later.
    assert_eq!(op.events_after, history);
    assert_eq!(op.status, OperationStatus::Pending);
    assert_eq!(op.kind, OperationKind::Deploy);
    assert_eq!(op.request_id, "req-1");
    assert_eq!(op.request_digest, "digest-a");
    assert_eq!(op.owner, "engine-1");
    assert_eq!((op.lease_owner.as_ref(), op.lease_epoch), (None, None));
    assert_eq!(op.finished_at, None);
    let last_seq = s.get_instance(&app.id).await.unwrap().last_seq;
    let accepted = all_events(h, &app.id).await.pop().unwrap();
    assert_eq!(
        (accepted.kind.as_str(), accepted.seq),
        ("operation.accepted", history + 1)
    );

    let retry = s
        .create_operation(new_operation(&app, "req-1", "digest-a", "engine-2"))
        .await
        .unwrap();
    assert!(!retry.created);
    assert_eq!(retry.operation, op);
    assert_eq!(
        s.get_instance(&app.id).await.unwrap().last_seq,
        last_seq,
        "a retry writes nothing"
    );
    assert_err!(
        s.create_operation(new_operation(&app, "req-1", "digest-b", "engine-1"))
            .await,
        StateError::RequestIdReused { request_id } if request_id == "req-1"
    );
    assert_eq!(s.find_operation("req-1").await.unwrap(), Some(op.clone()));
    assert_eq!(s.find_operation("req-x").await.unwrap(), None);
    assert_eq!(s.get_operation(&op.id).await.unwrap(), op);
    assert_err!(s.get_operation("nope").await, StateError::NotFound { .. });

    // Concurrent retries of one request.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (store, app) = (h.store.clone(), app.clone());
        tasks.spawn(async move {
            store
                .create_operation(new_operation(&app, "req-2", "digest-c", "engine-1"))
                .await
                .unwrap()
        });
    }
    let mut results = Vec::new();
    while let Some(r) = tasks.join_next().await {
        results.push(r.unwrap());
    }
    assert_eq!(results.iter().filter(|a| a.created).count(), 1);
    let ids: BTreeSet<&str> = results.iter().map(|a| a.operation.id.as_str()).collect();
    assert_eq!(ids.len(), 1);

    // References are checked.
    let other = instance(h, "other").await;
    let foreign = s
        .create_change_set(new_change_set(&other, 0))
        .await
        .unwrap();
    let mut with_cs = new_operation(&app, "req-3", "d", "engine-1");
    with_cs.change_set_id = Some(foreign.id.clone());
    assert_err!(
        s.create_operation(with_cs.clone()).await,
        StateError::Conflict(Conflict::Rejected(_))
    );
    with_cs.change_set_id = Some("nope".into());
    assert_err!(
        s.create_operation(with_cs).await,
        StateError::NotFound { .. }
    );
    let mut nowhere = new_operation(&app, "req-4", "d", "engine-1");
    nowhere.instance_id = "nope".into();
    assert_err!(
        s.create_operation(nowhere).await,
        StateError::NotFound { .. }
    );

    // Status changes go through fenced commits; running records the lease.
    let l = lease(h, &app, "engine-1").await;
    s.commit(
        &l,
        vec![op_status(&op.id, OperationStatus::Running)],
        vec![],
    )
    .await
    .unwrap();
    let running = s.get_operation(&op.id).await.unwrap();
    assert_eq!(running.status, OperationStatus::Running);
    assert_eq!(running.lease_owner.as_deref(), Some("engine-1"));
    assert_eq!(running.lease_epoch, Some(l.epoch));
    h.clock.advance(Duration::from_secs(3));
    s.commit(
        &l,
        vec![Change::OperationStatus {
            id: op.id.clone(),
            status: OperationStatus::Failed,
            error: Some("provider said no".into()),
        }],
        vec![],
    )
    .await
    .unwrap();
    let done = s.get_operation(&op.id).await.unwrap();
    assert_eq!(done.status, OperationStatus::Failed);
    assert_eq!(done.error.as_deref(), Some("provider said no"));
    assert_eq!(done.finished_at, Some(h.clock.now()));
    for to in [OperationStatus::Running, OperationStatus::Interrupted] {
        assert_err!(
            s.commit(&l, vec![op_status(&op.id, to)], vec![]).await,
            StateError::Conflict(Conflict::InvalidTransition { .. })
        );
    }
    // A finished operation is still the answer to its request id.
    let again = s
        .create_operation(new_operation(&app, "req-1", "digest-a", "engine-1"))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.operation.status, OperationStatus::Failed);

    let listed: Vec<String> = s
        .list_operations(&app.id)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.request_id)
        .collect();
    assert_eq!(listed, ["req-1", "req-2"]);
}

/// A change set recorded with a request key is the answer to every retry of that request;
/// the same id for another request is refused; no key, no deduplication.
pub async fn change_set_request_ids(h: &Harness) {
    let s = &h.store;
    let app = instance(h, "app").await;
    let key = |id: &str, digest: &str| RequestKey {
        id: id.into(),
        digest: digest.into(),
    };
    assert_eq!(s.find_change_set(&key("plan-1", "a")).await.unwrap(), None);
    let first = s
        .create_change_set(NewChangeSet {
            request: Some(key("plan-1", "a")),
            ..new_change_set(&app, 0)
        })
        .await
        .unwrap();
    assert_eq!(first.request, Some(key("plan-1", "a")));
    let last_seq = s.get_instance(&app.id).await.unwrap().last_seq;

    // A retry, even with another body (planned again at another time), gets the first back.
    let retry = s
        .create_change_set(NewChangeSet {
            request: Some(key("plan-1", "a")),
            body: json!({ "changes": [] }),
            ..new_change_set(&app, 0)
        })
        .await
        .unwrap();
    assert_eq!(retry, first);
    assert_eq!(
        s.get_instance(&app.id).await.unwrap().last_seq,
        last_seq,
        "a retry writes nothing"
    );
    assert_eq!(
        s.find_change_set(&key("plan-1", "a")).await.unwrap(),
        Some(first.clone())
    );
    assert_err!(
        s.find_change_set(&key("plan-1", "b")).await,
        StateError::RequestIdReused { request_id } if request_id == "plan-1"
    );
    assert_err!(
        s.create_change_set(NewChangeSet {
            request: Some(key("plan-1", "b")),
            ..new_change_set(&app, 0)
        })
        .await,
        StateError::RequestIdReused { request_id } if request_id == "plan-1"
    );
    assert_err!(
        s.create_change_set(NewChangeSet {
            request: Some(key("", "a")),
            ..new_change_set(&app, 0)
        })
        .await,
        StateError::Conflict(Conflict::Rejected(_))
    );

    // Concurrent retries record one change set.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (store, app) = (h.store.clone(), app.clone());
        tasks.spawn(async move {
            store
                .create_change_set(NewChangeSet {
                    request: Some(RequestKey {
                        id: "plan-2".into(),
                        digest: "c".into(),
                    }),
                    ..new_change_set(&app, 0)
                })
                .await
                .unwrap()
                .id
        });
    }
    let mut ids = BTreeSet::new();
    while let Some(id) = tasks.join_next().await {
        ids.insert(id.unwrap());
    }
    assert_eq!(ids.len(), 1);

    // Without a key every plan is recorded.
    let a = s.create_change_set(new_change_set(&app, 0)).await.unwrap();
    let b = s.create_change_set(new_change_set(&app, 0)).await.unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!((a.request, b.request), (None, None));
    let listed = s.list_change_sets(&app.id).await.unwrap();
    assert_eq!(listed.len(), 4);
}

/// Recovery at start: a dead engine's operations are interrupted (with an event), the change
/// sets they were executing fail, their leases die; live operations are left alone.
pub async fn interrupted_operations(h: &Harness) {
    let s = &h.store;

    // engine-1 runs a1 (executing a change set) on A and has a2 pending there.
    let a = instance(h, "a").await;
    let la = lease(h, &a, "engine-1").await;
    let cs = s.create_change_set(new_change_set(&a, 0)).await.unwrap();
    let mut new_a1 = new_operation(&a, "a1", "d", "engine-1");
    new_a1.change_set_id = Some(cs.id.clone());
    let a1 = s.create_operation(new_a1).await.unwrap().operation;
    s.begin_execution(&cs.id, &la).await.unwrap();
    s.commit(
        &la,
        vec![op_status(&a1.id, OperationStatus::Running)],
        vec![],
    )
    .await
    .unwrap();
    let a2 = s
        .create_operation(new_operation(&a, "a2", "d", "engine-1"))
        .await
        .unwrap()
        .operation;
    // engine-2 runs b1 on B, has c1 pending on C, and finished d1 on B.
    let b = instance(h, "b").await;
    let lb = lease(h, &b, "engine-2").await;
    let b1 = s
        .create_operation(new_operation(&b, "b1", "d", "engine-2"))
        .await
        .unwrap()
        .operation;
    let d1 = s
        .create_operation(new_operation(&b, "d1", "d", "engine-2"))
        .await
        .unwrap()
        .operation;
    s.commit(
        &lb,
        vec![
            op_status(&b1.id, OperationStatus::Running),
            op_status(&d1.id, OperationStatus::Running),
            op_status(&d1.id, OperationStatus::Succeeded),
        ],
        vec![],
    )
    .await
    .unwrap();
    let c = instance(h, "c").await;
    let c1 = s
        .create_operation(new_operation(&c, "c1", "d", "engine-2"))
        .await
        .unwrap()
        .operation;

    // engine-1 restarts.
    let a_last = s.get_instance(&a.id).await.unwrap().last_seq;
    let got = s
        .mark_interrupted(InterruptScope::Owner("engine-1".into()))
        .await
        .unwrap();
    let ids: Vec<&str> = got.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, [a1.id.as_str(), a2.id.as_str()]);
    for op in &got {
        assert_eq!(op.status, OperationStatus::Interrupted);
        assert!(op.error.as_deref().unwrap_or("").contains("engine-1"));
        assert_eq!(op.finished_at, Some(h.clock.now()));
    }
    assert_eq!(
        s.get_change_set(&cs.id).await.unwrap().status,
        ChangeSetStatus::Failed
    );
    let tail = s.events_since(&a.id, a_last, 10).await.unwrap();
    let kinds: Vec<(&str, &Value)> = tail
        .iter()
        .map(|e| (e.kind.as_str(), &e.payload["operation"]))
        .collect();
    assert_eq!(
        kinds,
        [
            ("operation.interrupted", &json!(a1.id)),
            ("operation.interrupted", &json!(a2.id)),
        ]
    );
    // Its lease is dead: writes with it are fenced, and a new engine need not wait for expiry.
    assert_err!(
        s.commit(&la, vec![], vec![]).await,
        StateError::Fenced { .. }
    );
    let la3 = lease(h, &a, "engine-3").await;
    assert_eq!(la3.epoch, la.epoch + 1);
    // engine-2's work is untouched.
    assert_eq!(
        s.get_operation(&b1.id).await.unwrap().status,
        OperationStatus::Running
    );

    // Nothing expired yet.
    assert!(
        s.mark_interrupted(InterruptScope::Expired)
            .await
            .unwrap()
            .is_empty()
    );

    // engine-2 stops heartbeating: its running b1 is interrupted once its lease expires; the
    // pending c1 is not (a live engine may be about to start it); finished d1 is not.
    h.clock.advance(TTL + Duration::from_secs(1));
    let la3 = s.heartbeat(&la3, TTL).await.unwrap();
    let got = s.mark_interrupted(InterruptScope::Expired).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, [b1.id.as_str()]);
    assert!(got[0].error.as_deref().unwrap_or("").contains("expired"));
    assert_eq!(
        s.get_operation(&c1.id).await.unwrap().status,
        OperationStatus::Pending
    );
    assert_eq!(
        s.get_operation(&d1.id).await.unwrap().status,
        OperationStatus::Succeeded
    );
    assert_eq!(
        all_events(h, &b.id).await.last().unwrap().kind,
        "operation.interrupted"
    );
    // The expired lease was revoked, so engine-2 waking up is fenced.
    assert_err!(
        s.commit(&lb, vec![], vec![]).await,
        StateError::Fenced { .. }
    );
    // A live lease (engine-3 on A) is not touched.
    s.commit(&la3, vec![], vec![]).await.unwrap();
    // Idempotent.
    assert!(
        s.mark_interrupted(InterruptScope::Expired)
            .await
            .unwrap()
            .is_empty()
    );

    // An operation whose lease was taken over by a newer epoch is abandoned even though the
    // instance has a live lease; the new holder keeps it.
    let lb2 = lease(h, &b, "engine-2").await;
    let e1 = s
        .create_operation(new_operation(&b, "e1", "d", "engine-2"))
        .await
        .unwrap()
        .operation;
    s.commit(
        &lb2,
        vec![op_status(&e1.id, OperationStatus::Running)],
        vec![],
    )
    .await
    .unwrap();
    h.clock.advance(TTL + Duration::from_secs(1));
    let lb3 = lease(h, &b, "engine-4").await;
    let got = s.mark_interrupted(InterruptScope::Expired).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, [e1.id.as_str()]);
    s.commit(&lb3, vec![], vec![]).await.unwrap();

    // engine-2 shutting down with its drain time run out recovers its pending work too, and
    // says it shut down (not that it restarted).
    let got = s
        .mark_interrupted(InterruptScope::ShutDown("engine-2".into()))
        .await
        .unwrap();
    let ids: Vec<&str> = got.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, [c1.id.as_str()]);
    let error = got[0].error.as_deref().unwrap_or("");
    assert!(
        error.contains("engine-2") && error.contains("shut down"),
        "{error}"
    );
}

/// Local assets: a store shared by several engines keeps them by key (a content digest, so
/// keeping one again changes nothing) and gives back exactly the bytes kept; a store of one
/// engine says it does not keep them.
pub async fn local_assets(h: &Harness) {
    let s = &h.store;
    let key = "sha256:0123abcd/code";
    if !s.shares_assets() {
        assert_err!(
            s.put_asset(key, b"zip".to_vec()).await,
            StateError::Unsupported(_)
        );
        assert_err!(s.get_asset(key).await, StateError::Unsupported(_));
        return;
    }
    assert_eq!(s.get_asset(key).await.unwrap(), None);
    s.put_asset(key, b"zip".to_vec()).await.unwrap();
    s.put_asset(key, b"zip".to_vec()).await.unwrap();
    assert_eq!(s.get_asset(key).await.unwrap(), Some(b"zip".to_vec()));
    let every_byte: Vec<u8> = (0..=255).collect();
    s.put_asset("sha256:ff/all", every_byte.clone())
        .await
        .unwrap();
    assert_eq!(
        s.get_asset("sha256:ff/all").await.unwrap(),
        Some(every_byte)
    );
    assert_eq!(s.get_asset("sha256:0123abcd/other").await.unwrap(), None);
    assert!(s.put_asset("", vec![]).await.is_err());
}

/// Cancel requests: recorded on an operation that has not ended, announced to
/// `cancel_requests` receivers, refused (`false`) once it ended, and not found for an unknown id.
pub async fn cancel_requests(h: &Harness) {
    let s = &h.store;
    let a = instance(h, "a").await;
    let la = lease(h, &a, "engine-1").await;
    let running = s
        .create_operation(new_operation(&a, "r1", "d", "engine-1"))
        .await
        .unwrap()
        .operation;
    s.commit(
        &la,
        vec![op_status(&running.id, OperationStatus::Running)],
        vec![],
    )
    .await
    .unwrap();
    let pending = s
        .create_operation(new_operation(&a, "p1", "d", "engine-1"))
        .await
        .unwrap()
        .operation;
    let untouched = s
        .create_operation(new_operation(&a, "u1", "d", "engine-1"))
        .await
        .unwrap()
        .operation;

    let mut requests = s.cancel_requests();
    assert!(!s.cancel_requested(&running.id).await.unwrap());
    assert!(s.request_cancel(&running.id).await.unwrap());
    assert!(s.request_cancel(&pending.id).await.unwrap());
    let mut got = Vec::new();
    while got.len() < 2 {
        let id = tokio::time::timeout(Duration::from_secs(10), requests.recv())
            .await
            .expect("a cancel request is announced")
            .unwrap();
        // A store that also hears its own announcements back (PostgreSQL) may repeat one.
        if !got.contains(&id) {
            got.push(id);
        }
    }
    got.sort();
    let mut want = vec![running.id.clone(), pending.id.clone()];
    want.sort();
    assert_eq!(got, want);
    assert!(s.cancel_requested(&running.id).await.unwrap());
    assert!(s.cancel_requested(&pending.id).await.unwrap());
    assert!(!s.cancel_requested(&untouched.id).await.unwrap());
    // The request changes nothing else about the operation.
    assert_eq!(
        s.get_operation(&running.id).await.unwrap().status,
        OperationStatus::Running
    );

    // An operation that ended has nothing to cancel.
    s.commit(
        &la,
        vec![
            op_status(&untouched.id, OperationStatus::Running),
            op_status(&untouched.id, OperationStatus::Succeeded),
        ],
        vec![],
    )
    .await
    .unwrap();
    assert!(!s.request_cancel(&untouched.id).await.unwrap());
    assert!(!s.cancel_requested(&untouched.id).await.unwrap());
    assert_err!(
        s.request_cancel("op-missing").await,
        StateError::NotFound { .. }
    );
    assert_err!(
        s.cancel_requested("op-missing").await,
        StateError::NotFound { .. }
    );
}

/// Retention removes old events (a prefix, keeping the newest per instance) and old change sets
/// (not executing ones); a resume from before the pruned prefix is refused, not silently short.
pub async fn retention(h: &Harness) {
    let s = &h.store;
    let hour = Duration::from_secs(3600);
    let a = instance(h, "a").await;
    let b = instance(h, "b").await;
    let la = lease(h, &a, "engine-1").await;
    let lb = lease(h, &b, "engine-1").await;
    // a: 14 old events (`instance.created`, 9 commits' worth, 2 plans, an operation, an
    // execution), b: 6 (`instance.created` and 5).
    for _ in 0..3 {
        s.commit(&la, vec![], vec![ev("old", json!({})); 3])
            .await
            .unwrap();
    }
    s.commit(&lb, vec![], vec![ev("old", json!({})); 5])
        .await
        .unwrap();
    let cs_old = s.create_change_set(new_change_set(&a, 3)).await.unwrap();
    let cs_exec = s.create_change_set(new_change_set(&a, 3)).await.unwrap();
    let mut new_op = new_operation(&a, "r1", "d", "engine-1");
    new_op.change_set_id = Some(cs_old.id.clone());
    let op = s.create_operation(new_op).await.unwrap().operation;
    s.begin_execution(&cs_exec.id, &la).await.unwrap();
    let a_old = s.get_instance(&a.id).await.unwrap().last_seq;
    assert_eq!(a_old, 14);

    h.clock.advance(2 * hour);
    let la = s.heartbeat(&la, TTL).await.unwrap();
    s.commit(&la, vec![], vec![ev("new", json!({})); 5])
        .await
        .unwrap();

    let policy = RetentionPolicy {
        events_older_than: hour,
        keep_last_events: 8,
        change_sets_older_than: Duration::from_secs(24 * 3600),
    };
    let report = s.prune(&policy).await.unwrap();
    // a: all 14 old ones are older than an hour, but the newest 8 (5 new + 3 old) stay.
    // b: 6 old, keep 8: nothing goes.
    assert_eq!(report.events_deleted, 11);
    assert_eq!(
        report.change_sets_deleted, 0,
        "change sets are younger than a day"
    );
    let inst = s.get_instance(&a.id).await.unwrap();
    assert_eq!((inst.pruned_through, inst.last_seq), (11, 19));
    let left = all_events_after(h, &a.id, 11).await;
    assert_eq!(seqs(&left), (12..=19).collect::<Vec<_>>());
    for after in [0, 5, 10] {
        assert_err!(
            s.events_since(&a.id, after, 10).await,
            StateError::EventsPruned {
                pruned_through: 11,
                ..
            }
        );
    }
    assert_eq!(
        seqs(&all_events(h, &b.id).await),
        (1..=6).collect::<Vec<_>>()
    );

    // Pruning again changes nothing.
    assert_eq!(s.prune(&policy).await.unwrap(), PruneReport::default());

    // A smaller keep: b loses its old prefix.
    let tight = RetentionPolicy {
        keep_last_events: 2,
        ..policy.clone()
    };
    let report = s.prune(&tight).await.unwrap();
    // b: 1..=4 go; a: only old events go, so 12..=14 (the new 15..=19 are not old enough).
    assert_eq!(report.events_deleted, 4 + 3);
    assert_eq!(s.get_instance(&a.id).await.unwrap().pruned_through, 14);
    assert_eq!(seqs(&all_events_after(h, &b.id, 4).await), [5, 6]);

    // Change sets: after a day the old ones go, the executing one stays, and the operation
    // that referred to a removed one keeps existing.
    h.clock.advance(24 * hour);
    let report = s.prune(&policy).await.unwrap();
    assert_eq!(report.change_sets_deleted, 1);
    assert_err!(
        s.get_change_set(&cs_old.id).await,
        StateError::NotFound { .. }
    );
    assert_eq!(
        s.get_change_set(&cs_exec.id).await.unwrap().status,
        ChangeSetStatus::Executing
    );
    let op = s.get_operation(&op.id).await.unwrap();
    assert_eq!(op.change_set_id, None);

    // New events after pruning continue the sequence.
    let la = s.heartbeat(&la, TTL).await.unwrap();
    let c = s
        .commit(&la, vec![], vec![ev("after", json!({}))])
        .await
        .unwrap();
    assert_eq!(c.first_seq, 20);
}

async fn all_events_after(h: &Harness, instance_id: &str, after: u64) -> Vec<Event> {
    h.store
        .events_since(instance_id, after, usize::MAX)
        .await
        .unwrap()
}

/// The retention task prunes without being asked.
pub async fn retention_runs_by_itself(h: &Harness) {
    let a = instance(h, "a").await;
    let l = lease(h, &a, "engine-1").await;
    h.store
        .commit(&l, vec![], vec![ev("old", json!({})); 4])
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(2 * 3600));
    let policy = RetentionPolicy {
        events_older_than: Duration::from_secs(3600),
        keep_last_events: 1,
        change_sets_older_than: Duration::from_secs(3600),
    };
    let task = spawn_retention(h.store.clone(), policy, Duration::from_millis(20));
    // Poll the outcome, bounded: the task's own timing is not what is tested.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let inst = h.store.get_instance(&a.id).await.unwrap();
        if inst.pruned_through == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention never ran: {inst:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(task);
}
