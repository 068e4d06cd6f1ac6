//! Who may call the engine API: bearer tokens, roles and instance patterns (docs/auth.md).
//!
//! A token is `trellis_` and 64 random hex digits, shown once by `trellis token create`; the
//! tokens file keeps only its SHA-256, with the token's name, role and instance patterns.
//! [`AuthLayer`] is a tower layer in front of every service: it finds the caller's token in
//! the `authorization: Bearer …` metadata, checks the method against the role
//! ([`required_role`]) and puts the [`Caller`] in the request's extensions. A request names
//! its instance inside its message (or through a change set or operation id), so the instance
//! check is made once the handler knows the instance, through [`Caller::check`]
//! (docs/decisions/0008-authorization.md). Health is always open; reflection follows the
//! `[auth] open_reflection` setting.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use tonic::Status;
use tonic::codegen::http;

use super::conns::BoxFuture;

/// The engine API's methods (`/trellis.engine.v1.Engine/GetInstance`, …).
const ENGINE_PATH: &str = "/trellis.engine.v1.Engine/";
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";
const REFLECTION_PATHS: [&str; 2] = [
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// What every new token starts with, so a leaked one is recognisable (and findable by secret
/// scanners).
pub(crate) const TOKEN_PREFIX: &str = "trellis_";

/// Roles, each allowed everything the one before it is.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read instances, change sets, operations, events and exports (secrets masked).
    Viewer,
    /// And validate and plan.
    Planner,
    /// And execute, destroy, cancel, check drift, reconcile and import.
    Deployer,
    /// And read secret values (and, when the API has them, backups and breaking a lease).
    Admin,
}

impl Role {
    pub(crate) const ALL: [Role; 4] = [Role::Viewer, Role::Planner, Role::Deployer, Role::Admin];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Planner => "planner",
            Role::Deployer => "deployer",
            Role::Admin => "admin",
        }
    }

    pub(crate) fn parse(text: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == text)
            .ok_or_else(|| {
                format!("unknown role `{text}` (roles: viewer, planner, deployer, admin)")
            })
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every method of the engine API and the least role that may call it. A method missing
/// here needs `admin` (so a new one is never open by mistake), and a unit test fails until it
/// has its entry. Reading secret values (`reveal_secrets`) needs `admin` whatever the method:
/// the handlers ask for it.
pub(crate) const METHODS: [(&str, Role); 18] = [
    ("Validate", Role::Planner),
    ("CreateChangeSet", Role::Planner),
    ("GetChangeSet", Role::Viewer),
    ("ListChangeSets", Role::Viewer),
    ("ExecuteChangeSet", Role::Deployer),
    ("Destroy", Role::Deployer),
    ("GetInstance", Role::Viewer),
    ("ListInstances", Role::Viewer),
    ("GetExports", Role::Viewer),
    ("GetOperation", Role::Viewer),
    ("ListOperations", Role::Viewer),
    ("WatchOperation", Role::Viewer),
    ("WatchInstance", Role::Viewer),
    ("CancelOperation", Role::Deployer),
    ("CheckDrift", Role::Deployer),
    ("Reconcile", Role::Deployer),
    // Records a resource, which the instance's next deploy or destroy then changes.
    ("ImportResource", Role::Deployer),
    // A copy of every instance's state, secrets included.
    ("Backup", Role::Admin),
];

/// The least role that may call engine method `method` (`GetInstance`).
pub(crate) fn required_role(method: &str) -> Role {
    METHODS
        .iter()
        .find(|(m, _)| *m == method)
        .map_or(Role::Admin, |(_, r)| *r)
}

// ---- tokens -----------------------------------------------------------------------------------

/// A new token: the prefix and 32 random bytes from the kernel, as hex.
pub(crate) fn new_token() -> String {
    format!("{TOKEN_PREFIX}{}", trellis_ids::random_hex(32))
}

/// What the tokens file keeps of a token: its SHA-256, as hex.
pub(crate) fn token_hash(token: &str) -> String {
    trellis_ids::sha256_hex(token.as_bytes())
}

/// Equality whose time does not depend on where the two differ (only on their lengths).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether instance name `name` matches `pattern`: `*` stands for any run of characters
/// (`/` included), `?` for one character; everything else is itself.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // The classic two-pointer match, backtracking only to the last `*`: linear in practice,
    // never exponential.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || (p[pi] != '*' && p[pi] == n[ni])) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// One entry of the tokens file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenEntry {
    pub name: String,
    pub role: Role,
    /// Instance name patterns ([`glob_match`]); at least one.
    pub instances: Vec<String>,
    /// SHA-256 of the token, lowercase hex.
    pub sha256: String,
    /// When `trellis token create` made it (seconds since 1970, UTC); for people only.
    #[serde(default)]
    pub created: Option<u64>,
}

/// The tokens file: `[[token]]` tables.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokensFile {
    #[serde(default)]
    pub token: Vec<TokenEntry>,
}

impl TokensFile {
    /// Reads and checks the file: every entry has a name (unique), a 64-digit hash and at
    /// least one pattern.
    pub(crate) fn read(path: &Path) -> Result<TokensFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read tokens file {}: {e}", path.display()))?;
        let file: TokensFile = toml::from_str(&text)
            .map_err(|e| format!("tokens file {}: {}", path.display(), e.message()))?;
        let mut names = std::collections::HashSet::new();
        for t in &file.token {
            let problem = if t.name.trim().is_empty() {
                Some("a token has an empty name".to_owned())
            } else if !names.insert(t.name.as_str()) {
                Some(format!("two tokens are named `{}`", t.name))
            } else if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                Some(format!(
                    "token `{}`: sha256 must be 64 hex digits (the token's SHA-256)",
                    t.name
                ))
            } else if t.instances.is_empty() {
                Some(format!(
                    "token `{}`: instances needs at least one pattern (\"*\" for every instance)",
                    t.name
                ))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(format!("tokens file {}: {problem}", path.display()));
            }
        }
        Ok(file)
    }

    /// The entry whose hash is the token's. Every entry is compared, in constant time each, so
    /// the time taken says nothing about which entry (if any) matched.
    pub(crate) fn find(&self, token: &str) -> Option<&TokenEntry> {
        let hash = token_hash(token).to_ascii_lowercase();
        let mut found = None;
        for entry in &self.token {
            if constant_time_eq(
                entry.sha256.to_ascii_lowercase().as_bytes(),
                hash.as_bytes(),
            ) && found.is_none()
            {
                found = Some(entry);
            }
        }
        found
    }
}

/// Adds a new token to the tokens file (created owner-only if missing) and returns the token,
/// which is shown once and kept nowhere.
pub(crate) fn create_token(
    path: &Path,
    name: &str,
    role: Role,
    instances: Vec<String>,
) -> Result<String, String> {
    use std::io::Write;
    let name = name.trim();
    if name.is_empty() {
        return Err("--name must not be empty".to_owned());
    }
    let instances = if instances.is_empty() {
        vec!["*".to_owned()]
    } else {
        instances
    };
    if path.exists() {
        let existing = TokensFile::read(path)?;
        if existing.token.iter().any(|t| t.name == name) {
            return Err(format!(
                "tokens file {} already has a token named `{name}`",
                path.display()
            ));
        }
    }
    let token = new_token();
    let text = entry_toml(&TokenEntry {
        name: name.to_owned(),
        role,
        instances,
        sha256: token_hash(&token),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs()),
    });
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| format!("cannot open tokens file {}: {e}", path.display()))?;
    file.write_all(format!("\n{text}").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write tokens file {}: {e}", path.display()))?;
    Ok(token)
}

/// Removes the token named `name` from the tokens file and returns its entry. The file is
/// written again whole (owner-only, beside it, then renamed over it: a crash leaves the old
/// file or the new one, never half of one), so comments in it are not kept.
pub(crate) fn revoke_token(path: &Path, name: &str) -> Result<TokenEntry, String> {
    use std::io::Write;
    let mut file = TokensFile::read(path)?;
    let i = file
        .token
        .iter()
        .position(|t| t.name == name.trim())
        .ok_or_else(|| format!("tokens file {} has no token named `{name}`", path.display()))?;
    let revoked = file.token.remove(i);
    let text: Vec<String> = file.token.iter().map(entry_toml).collect();
    let tmp = path.with_file_name(format!(
        ".{}.{}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("tokens"),
        trellis_ids::random_hex(6)
    ));
    let write = || -> std::io::Result<()> {
        let mut options = std::fs::OpenOptions::new();
        options.create_new(true).write(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut out = options.open(&tmp)?;
        out.write_all(text.join("\n").as_bytes())?;
        out.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write tokens file {}: {e}", path.display())
    })?;
    Ok(revoked)
}

/// One `[[token]]` table. Strings are written as JSON strings, whose escapes TOML's basic
/// strings share.
fn entry_toml(entry: &TokenEntry) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let instances: Vec<String> = entry.instances.iter().map(|p| quote(p)).collect();
    let mut text = format!(
        "[[token]]\nname = {}\nrole = {}\ninstances = [{}]\nsha256 = {}\n",
        quote(&entry.name),
        quote(entry.role.name()),
        instances.join(", "),
        quote(&entry.sha256),
    );
    if let Some(created) = entry.created {
        text.push_str(&format!("created = {created}\n"));
    }
    text
}

/// The tokens in force, replaced as a whole on reload.
pub(crate) struct TokenStore {
    path: PathBuf,
    current: RwLock<Arc<TokensFile>>,
}

impl TokenStore {
    pub(crate) fn open(path: PathBuf) -> Result<Arc<TokenStore>, String> {
        let file = TokensFile::read(&path)?;
        Ok(Arc::new(TokenStore {
            path,
            current: RwLock::new(Arc::new(file)),
        }))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn len(&self) -> usize {
        self.current().token.len()
    }

    /// Reads the file again; on an error the tokens in force stay.
    pub(crate) fn reload(&self) -> Result<usize, String> {
        let file = TokensFile::read(&self.path)?;
        let n = file.token.len();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(file);
        Ok(n)
    }

    fn current(&self) -> Arc<TokensFile> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

// ---- the caller -------------------------------------------------------------------------------

/// Who is calling, in the request's extensions.
#[derive(Clone, Debug)]
pub(crate) enum Caller {
    /// The engine runs without `[auth]`: everything is allowed.
    Open,
    Token(Arc<TokenCaller>),
}

#[derive(Debug)]
pub(crate) struct TokenCaller {
    pub name: String,
    pub role: Role,
    pub instances: Vec<String>,
}

impl Caller {
    /// The caller of a request, as [`AuthLayer`] left it. A request that did not pass through
    /// the layer is refused: the check fails closed.
    pub(crate) fn of<T>(req: &tonic::Request<T>) -> Result<Caller, Status> {
        req.extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| Status::unauthenticated("the request has no caller identity"))
    }

    /// Whether the caller may see instance `name` at all (listings leave the others out).
    pub(crate) fn may_see(&self, name: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::Token(t) => t.instances.iter().any(|p| glob_match(p, name)),
        }
    }

    /// Allows `what` on instance `name` when the token's patterns cover it and its role is at
    /// least `need`; logs the decision either way.
    pub(crate) fn check(&self, name: &str, need: Role, what: &str) -> Result<(), Status> {
        super::trace::note_instance(name);
        let Caller::Token(t) = self else {
            return Ok(());
        };
        let patterns = t.instances.join(", ");
        if t.role < need {
            tracing::warn!(token = %t.name, role = %t.role, instance = %name, action = what, needs = %need, decision = "denied", "authorization");
            return Err(Status::permission_denied(format!(
                "token `{}` has role {}; {what} needs role {need}",
                t.name, t.role
            )));
        }
        if !self.may_see(name) {
            tracing::warn!(token = %t.name, role = %t.role, instance = %name, patterns = %patterns, action = what, decision = "denied", "authorization");
            return Err(Status::permission_denied(format!(
                "token `{}` (role {}) is limited to instances `{patterns}`: not `{name}`",
                t.name, t.role
            )));
        }
        tracing::info!(token = %t.name, role = %t.role, instance = %name, action = what, decision = "allowed", "authorization");
        Ok(())
    }
}

// ---- the layer --------------------------------------------------------------------------------

/// Authentication and the role check, for every request. Without a token store (no `[auth]`)
/// every request is let through as [`Caller::Open`].
#[derive(Clone)]
pub(crate) struct AuthLayer {
    tokens: Option<Arc<TokenStore>>,
    open_reflection: bool,
}

impl AuthLayer {
    pub(crate) fn new(tokens: Option<Arc<TokenStore>>, open_reflection: bool) -> AuthLayer {
        AuthLayer {
            tokens,
            open_reflection,
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Auth<S> {
    inner: S,
    layer: AuthLayer,
}

/// What the layer decided about a request.
#[derive(Debug)]
enum Decision {
    Allow(Caller),
    Refuse(Status),
}

impl AuthLayer {
    fn decide(&self, path: &str, headers: &http::HeaderMap) -> Decision {
        let Some(store) = &self.tokens else {
            return Decision::Allow(Caller::Open);
        };
        if path.starts_with(HEALTH_PATH) {
            return Decision::Allow(Caller::Open);
        }
        let reflection = REFLECTION_PATHS.iter().any(|p| path.starts_with(p));
        if reflection && self.open_reflection {
            return Decision::Allow(Caller::Open);
        }
        let method = path.strip_prefix(ENGINE_PATH);
        let token = match bearer(headers) {
            Ok(t) => t,
            Err(why) => {
                tracing::warn!(method = %path, decision = "unauthenticated", reason = why, "authentication");
                return Decision::Refuse(Status::unauthenticated(format!(
                    "{why}: send `authorization: Bearer TOKEN` (the CLI reads TRELLIS_TOKEN or --token-file)"
                )));
            }
        };
        let tokens = store.current();
        let Some(entry) = tokens.find(token) else {
            tracing::warn!(method = %path, decision = "unauthenticated", reason = "unknown token", "authentication");
            return Decision::Refuse(Status::unauthenticated(
                "the token is not valid on this engine",
            ));
        };
        super::trace::note_caller(&entry.name);
        let caller = TokenCaller {
            name: entry.name.clone(),
            role: entry.role,
            instances: entry.instances.clone(),
        };
        // Reflection (when not open) and anything else outside the engine API: any valid token.
        let need = method.map_or(Role::Viewer, required_role);
        if caller.role < need {
            tracing::warn!(token = %caller.name, role = %caller.role, method = %path, needs = %need, decision = "denied", "authorization");
            return Decision::Refuse(Status::permission_denied(format!(
                "token `{}` has role {}; {} needs role {need}",
                caller.name,
                caller.role,
                method.unwrap_or(path)
            )));
        }
        tracing::info!(token = %caller.name, role = %caller.role, method = %path, decision = "allowed", "authorization");
        Decision::Allow(Caller::Token(Arc::new(caller)))
    }
}

/// The token of `authorization: Bearer TOKEN`, or why there is none.
fn bearer(headers: &http::HeaderMap) -> Result<&str, &'static str> {
    let value = headers
        .get(http::header::AUTHORIZATION)
        .ok_or("no token")?
        .to_str()
        .map_err(|_| "the authorization header is not text")?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or("the authorization header is not `Bearer TOKEN`")?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err("the authorization header is not `Bearer TOKEN`");
    }
    Ok(token.trim())
}

impl<S, B, RB> tower::Service<http::Request<B>> for Auth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        match self.layer.decide(req.uri().path(), req.headers()) {
            Decision::Allow(caller) => {
                req.extensions_mut().insert(caller);
                Box::pin(self.inner.call(req))
            }
            Decision::Refuse(status) => {
                let response = status.into_http::<RB>();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::{Layer, ServiceExt};

    #[test]
    fn tokens_are_hashed_and_compared_in_constant_time() {
        let a = new_token();
        let b = new_token();
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 64);
        assert_ne!(a, b);
        let h = token_hash(&a);
        assert_eq!(h.len(), 64);
        assert_eq!(h, trellis_ids::sha256_hex(a.as_bytes()));
        assert!(!h.contains(&a[TOKEN_PREFIX.len()..]));
        assert!(constant_time_eq(h.as_bytes(), token_hash(&a).as_bytes()));
        assert!(!constant_time_eq(h.as_bytes(), token_hash(&b).as_bytes()));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn a_token_is_found_by_its_hash_only() {
        let token = new_token();
        let file = TokensFile {
            token: vec![
                TokenEntry {
                    name: "other".into(),
                    role: Role::Admin,
                    instances: vec!["*".into()],
                    sha256: token_hash("something else"),
                    created: None,
                },
                TokenEntry {
                    name: "ci".into(),
                    role: Role::Viewer,
                    instances: vec!["*".into()],
                    sha256: token_hash(&token).to_ascii_uppercase(),
                    created: None,
                },
            ],
        };
        assert_eq!(file.find(&token).map(|e| e.name.as_str()), Some("ci"));
        assert!(file.find(&token_hash(&token)).is_none());
        assert!(file.find("").is_none());
    }

    #[test]
    fn glob_patterns() {
        let cases = [
            ("*", "anything/at/all", true),
            ("*", "", true),
            ("team-a/*", "team-a/web", true),
            ("team-a/*", "team-a/web/db", true),
            ("team-a/*", "team-b/web", false),
            ("team-a/*", "team-a", false),
            ("team-a/*", "xteam-a/web", false),
            ("prod", "prod", true),
            ("prod", "prod2", false),
            ("*-staging", "web-staging", true),
            ("*-staging", "web-staging-2", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("web-?", "web-1", true),
            ("web-?", "web-12", false),
            ("**", "x", true),
            ("", "", true),
            ("", "x", false),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(glob_match(pattern, name), want, "{pattern} ~ {name}");
        }
    }

    #[test]
    fn every_engine_rpc_has_a_role() {
        let proto = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../proto/trellis/engine/v1/engine.proto"
        ))
        .unwrap();
        let rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|l| l.split('(').next().unwrap().trim())
            .collect();
        assert!(rpcs.len() >= 16, "{rpcs:?}");
        for rpc in &rpcs {
            assert!(
                METHODS.iter().any(|(m, _)| m == rpc),
                "engine RPC `{rpc}` has no entry in auth::METHODS: give it a role"
            );
        }
        for (m, _) in METHODS {
            assert!(rpcs.contains(&m), "auth::METHODS names `{m}`, not an RPC");
        }
    }

    #[test]
    fn the_method_table() {
        use Role::*;
        let want = [
            ("GetInstance", Viewer),
            ("ListInstances", Viewer),
            ("WatchInstance", Viewer),
            ("Validate", Planner),
            ("CreateChangeSet", Planner),
            ("ExecuteChangeSet", Deployer),
            ("Destroy", Deployer),
            ("CancelOperation", Deployer),
            ("Reconcile", Deployer),
            ("ImportResource", Deployer),
            ("Backup", Admin),
            ("SomethingNew", Admin),
        ];
        for (m, r) in want {
            assert_eq!(required_role(m), r, "{m}");
        }
        assert!(Viewer < Planner && Planner < Deployer && Deployer < Admin);
    }

    fn layer_with(
        tokens: &[(&str, Role, &str)],
        open_reflection: bool,
    ) -> (AuthLayer, Vec<String>) {
        let dir = std::env::temp_dir().join(format!(
            "trellis-auth-{}-{}",
            std::process::id(),
            trellis_ids::random_hex(4)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.toml");
        std::fs::write(&path, "# no tokens yet\n").unwrap();
        let secrets = tokens
            .iter()
            .map(|(name, role, pattern)| {
                create_token(&path, name, *role, vec![(*pattern).to_owned()]).unwrap()
            })
            .collect();
        let store = TokenStore::open(path).unwrap();
        (AuthLayer::new(Some(store), open_reflection), secrets)
    }

    async fn status_of(layer: &AuthLayer, path: &str, token: Option<&str>) -> Option<i32> {
        let svc = tower::service_fn(|req: http::Request<()>| async move {
            assert!(req.extensions().get::<Caller>().is_some());
            Ok::<_, Infallible>(http::Response::new(()))
        });
        let mut b = http::Request::builder().uri(path);
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let resp = layer.layer(svc).oneshot(b.body(()).unwrap()).await.unwrap();
        resp.headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().parse().unwrap())
    }

    #[tokio::test]
    async fn the_layer_authenticates_and_checks_roles() {
        let (layer, t) = layer_with(
            &[("v", Role::Viewer, "*"), ("d", Role::Deployer, "team-a/*")],
            false,
        );
        let get = "/trellis.engine.v1.Engine/GetInstance";
        let exec = "/trellis.engine.v1.Engine/ExecuteChangeSet";
        const UNAUTHENTICATED: Option<i32> = Some(16);
        const DENIED: Option<i32> = Some(7);
        assert_eq!(status_of(&layer, get, None).await, UNAUTHENTICATED);
        assert_eq!(
            status_of(&layer, get, Some("trellis_nope")).await,
            UNAUTHENTICATED
        );
        assert_eq!(status_of(&layer, get, Some(&t[0])).await, None);
        assert_eq!(status_of(&layer, exec, Some(&t[0])).await, DENIED);
        assert_eq!(status_of(&layer, exec, Some(&t[1])).await, None);
        // Health is open; reflection needs a token unless the setting opens it.
        assert_eq!(
            status_of(&layer, "/grpc.health.v1.Health/Check", None).await,
            None
        );
        let (open, _) = layer_with(&[], true);
        // Both reflection versions are served (v1alpha: grpcio-reflection and other tools).
        for refl in [
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            assert_eq!(status_of(&layer, refl, None).await, UNAUTHENTICATED);
            assert_eq!(status_of(&layer, refl, Some(&t[0])).await, None);
            assert_eq!(status_of(&open, refl, None).await, None, "{refl}");
        }
        // Without `[auth]` everything passes.
        assert_eq!(
            status_of(&AuthLayer::new(None, false), exec, None).await,
            None
        );
    }

    #[test]
    fn the_instance_check_names_role_and_pattern() {
        let caller = Caller::Token(Arc::new(TokenCaller {
            name: "ci".into(),
            role: Role::Deployer,
            instances: vec!["team-a/*".into()],
        }));
        assert!(
            caller
                .check("team-a/web", Role::Deployer, "Destroy")
                .is_ok()
        );
        let e = caller
            .check("team-b/web", Role::Deployer, "Destroy")
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("deployer") && e.message().contains("team-a/*"),
            "{}",
            e.message()
        );
        let e = caller
            .check("team-a/web", Role::Admin, "reading secrets")
            .unwrap_err();
        assert!(e.message().contains("needs role admin"), "{}", e.message());
        assert!(Caller::Open.check("anything", Role::Admin, "x").is_ok());
    }

    #[test]
    fn the_tokens_file_is_checked_and_reloaded() {
        let (layer, secrets) = layer_with(&[("a", Role::Viewer, "*")], false);
        let store = layer.tokens.unwrap();
        let text = std::fs::read_to_string(store.path()).unwrap();
        assert!(
            !text.contains(&secrets[0]),
            "the token itself is never written"
        );
        assert!(create_token(store.path(), "a", Role::Admin, vec![]).is_err());
        let second = create_token(store.path(), "b", Role::Admin, vec![]).unwrap();
        assert!(store.current().find(&second).is_none());
        assert_eq!(store.reload(), Ok(2));
        assert_eq!(store.current().find(&second).unwrap().instances, ["*"]);
        let unknown = revoke_token(store.path(), "nobody").unwrap_err();
        assert!(unknown.contains("no token named `nobody`"), "{unknown}");
        assert_eq!(revoke_token(store.path(), "a").unwrap().name, "a");
        assert_eq!(store.reload(), Ok(1));
        assert!(store.current().find(&secrets[0]).is_none(), "revoked");
        assert!(store.current().find(&second).is_some(), "the others stay");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(store.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "owner-only after the rewrite");
        std::fs::write(store.path(), "[[token]]\nname = \"x\"\n").unwrap();
        assert!(store.reload().is_err());
        assert_eq!(store.len(), 1, "a bad file leaves the tokens in force");
    }
}
