//! Schemas, declared once with a builder, and typed reading of specs.
//!
//! ```
//! use trellis_plugin_sdk::schema::{Field, Schema};
//! let spec_schema = Schema::object()
//!     .field("path", Field::string().required().must_recreate().describe("Where the file lives"))
//!     .field("mode", Field::string().default("0644").allowed(["0644", "0600"]))
//!     .field("tags", Field::map(Schema::string()))
//!     .field("id", Field::string().computed());
//! assert_eq!(spec_schema.fields().len(), 4);
//! ```
//!
//! The schema a resource returns from `Resource::schema` is exactly what
//! `GetManifest` sends to the engine. The engine checks specs against it;
//! [`Schema::check`] runs the same kind of check in-process (for tests and
//! for plugins that want to double-check).

use trellis_proto::plugin::v1 as pb;

use crate::error::{Diagnostic, PluginError, Result};
use crate::value::{AttrPath, Map, Value};

/// The type of a schema node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchemaType {
    Any,
    String,
    Integer,
    Float,
    Boolean,
    /// A list of `items`.
    Array,
    /// Fixed `fields`.
    Object,
    /// Arbitrary string keys, each a `values`.
    Map,
}

impl SchemaType {
    pub fn to_proto(self) -> pb::SchemaType {
        match self {
            SchemaType::Any => pb::SchemaType::Any,
            SchemaType::String => pb::SchemaType::String,
            SchemaType::Integer => pb::SchemaType::Integer,
            SchemaType::Float => pb::SchemaType::Float,
            SchemaType::Boolean => pb::SchemaType::Boolean,
            SchemaType::Array => pb::SchemaType::Array,
            SchemaType::Object => pb::SchemaType::Object,
            SchemaType::Map => pb::SchemaType::Map,
        }
    }

    /// Unspecified reads as `Any`.
    pub fn from_proto(t: i32) -> SchemaType {
        match pb::SchemaType::try_from(t) {
            Ok(pb::SchemaType::String) => SchemaType::String,
            Ok(pb::SchemaType::Integer) => SchemaType::Integer,
            Ok(pb::SchemaType::Float) => SchemaType::Float,
            Ok(pb::SchemaType::Boolean) => SchemaType::Boolean,
            Ok(pb::SchemaType::Array) => SchemaType::Array,
            Ok(pb::SchemaType::Object) => SchemaType::Object,
            Ok(pb::SchemaType::Map) => SchemaType::Map,
            _ => SchemaType::Any,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SchemaType::Any => "any",
            SchemaType::String => "string",
            SchemaType::Integer => "integer",
            SchemaType::Float => "float",
            SchemaType::Boolean => "boolean",
            SchemaType::Array => "array",
            SchemaType::Object => "object",
            SchemaType::Map => "map",
        }
    }

    /// Whether a (known) value has this type. Integers are accepted where a
    /// float is expected; null is accepted by nothing but `Any`.
    pub fn accepts(self, v: &Value) -> bool {
        matches!(
            (self, v.revealed()),
            (SchemaType::Any, _)
                | (_, Value::Unknown)
                | (SchemaType::String, Value::String(_))
                | (SchemaType::Integer, Value::Int(_))
                | (SchemaType::Float, Value::Float(_) | Value::Int(_))
                | (SchemaType::Boolean, Value::Bool(_))
                | (SchemaType::Array, Value::List(_))
                | (SchemaType::Object | SchemaType::Map, Value::Map(_))
        )
    }
}

/// The shape of a value: a resource spec (an object), a field, a list's
/// items, a map's values.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    ty: SchemaType,
    description: String,
    fields: Vec<(String, Field)>,
    items: Option<Box<Schema>>,
    values: Option<Box<Schema>>,
    allowed: Vec<Value>,
    default: Option<Value>,
}

impl Schema {
    fn of(ty: SchemaType) -> Schema {
        Schema {
            ty,
            description: String::new(),
            fields: Vec::new(),
            items: None,
            values: None,
            allowed: Vec::new(),
            default: None,
        }
    }

    /// An object with fixed fields (add them with [`Schema::field`]).
    pub fn object() -> Schema {
        Schema::of(SchemaType::Object)
    }
    pub fn any() -> Schema {
        Schema::of(SchemaType::Any)
    }
    pub fn string() -> Schema {
        Schema::of(SchemaType::String)
    }
    pub fn integer() -> Schema {
        Schema::of(SchemaType::Integer)
    }
    pub fn float() -> Schema {
        Schema::of(SchemaType::Float)
    }
    pub fn boolean() -> Schema {
        Schema::of(SchemaType::Boolean)
    }
    /// A list whose elements are `items`.
    pub fn array(items: Schema) -> Schema {
        let mut s = Schema::of(SchemaType::Array);
        s.items = Some(Box::new(items));
        s
    }
    /// A map with arbitrary string keys whose values are `values`.
    pub fn map(values: Schema) -> Schema {
        let mut s = Schema::of(SchemaType::Map);
        s.values = Some(Box::new(values));
        s
    }

    /// Adds (or replaces) a field of an object schema. Fields keep the order
    /// they are added in.
    pub fn field(mut self, name: impl Into<String>, field: Field) -> Schema {
        let name = name.into();
        if let Some(slot) = self.fields.iter_mut().find(|(n, _)| *n == name) {
            slot.1 = field;
        } else {
            self.fields.push((name, field));
        }
        self
    }

    pub fn describe(mut self, description: impl Into<String>) -> Schema {
        self.description = description.into();
        self
    }

    /// Allowed values (for scalars), compared by value.
    pub fn allowed<V: Into<Value>>(mut self, values: impl IntoIterator<Item = V>) -> Schema {
        self.allowed = values.into_iter().map(Into::into).collect();
        self
    }

    /// Used when the value is not set.
    pub fn default(mut self, value: impl Into<Value>) -> Schema {
        self.default = Some(value.into());
        self
    }

    pub fn ty(&self) -> SchemaType {
        self.ty
    }
    pub fn description(&self) -> &str {
        &self.description
    }
    pub fn fields(&self) -> &[(String, Field)] {
        &self.fields
    }
    pub fn get_field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, f)| f)
    }
    pub fn items(&self) -> Option<&Schema> {
        self.items.as_deref()
    }
    pub fn values(&self) -> Option<&Schema> {
        self.values.as_deref()
    }
    pub fn allowed_values(&self) -> &[Value] {
        &self.allowed
    }
    pub fn default_value(&self) -> Option<&Value> {
        self.default.as_ref()
    }

    pub fn to_proto(&self) -> pb::Schema {
        pb::Schema {
            r#type: self.ty.to_proto() as i32,
            description: self.description.clone(),
            fields: self.fields.iter().map(|(n, f)| f.to_proto(n)).collect(),
            items: self.items.as_ref().map(|s| Box::new(s.to_proto())),
            values: self.values.as_ref().map(|s| Box::new(s.to_proto())),
            allowed_values: self.allowed.iter().map(Value::to_proto).collect(),
            default: self.default.as_ref().map(Value::to_proto),
        }
    }

    pub fn from_proto(s: pb::Schema) -> Schema {
        Schema {
            ty: SchemaType::from_proto(s.r#type),
            description: s.description,
            fields: s
                .fields
                .into_iter()
                .map(|f| (f.name.clone(), Field::from_proto(f)))
                .collect(),
            items: s.items.map(|i| Box::new(Schema::from_proto(*i))),
            values: s.values.map(|v| Box::new(Schema::from_proto(*v))),
            allowed: s.allowed_values.into_iter().map(Value::from).collect(),
            default: s.default.map(Value::from),
        }
    }

    /// Checks `value` against this schema: types, required fields, fields the
    /// schema does not know, computed fields set by the user, allowed values.
    /// Unknown values pass. Diagnostic codes: `schema.type`, `schema.required`,
    /// `schema.unknown-field`, `schema.computed`, `schema.not-allowed`.
    pub fn check(&self, value: &Value) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        self.check_at(value, &AttrPath::root(), &mut out);
        out
    }

    fn check_at(&self, value: &Value, path: &AttrPath, out: &mut Vec<Diagnostic>) {
        let v = value.revealed();
        if v.is_unknown() || (v.is_null() && self.ty == SchemaType::Any) {
            return;
        }
        if !self.ty.accepts(v) {
            out.push(
                Diagnostic::error(
                    "schema.type",
                    format!(
                        "`{path}` must be {}, found {}",
                        article(self.ty),
                        v.kind_name()
                    ),
                )
                .at(path),
            );
            return;
        }
        if !self.allowed.is_empty() && !self.allowed.iter().any(|a| a.revealed() == v) {
            let list: Vec<String> = self.allowed.iter().map(ToString::to_string).collect();
            out.push(
                Diagnostic::error(
                    "schema.not-allowed",
                    format!("`{path}` must be one of {}", list.join(", ")),
                )
                .at(path),
            );
        }
        match (self.ty, v) {
            (SchemaType::Object, Value::Map(m)) => {
                for (name, field) in &self.fields {
                    let p = path.join(name);
                    match m.get(name) {
                        Some(fv) if field.computed && !fv.is_null() => out.push(
                            Diagnostic::error(
                                "schema.computed",
                                format!("`{p}` is computed by the provider and cannot be set"),
                            )
                            .at(p),
                        ),
                        Some(fv) if !fv.is_null() => field.schema.check_at(fv, &p, out),
                        _ if field.required && field.schema.default.is_none() => out.push(
                            Diagnostic::error("schema.required", format!("`{p}` is required"))
                                .at(p),
                        ),
                        _ => {}
                    }
                }
                for key in m.keys() {
                    if self.get_field(key).is_none() {
                        let p = path.join(key);
                        out.push(
                            Diagnostic::error(
                                "schema.unknown-field",
                                format!("`{p}` is not a known field"),
                            )
                            .at(p),
                        );
                    }
                }
            }
            (SchemaType::Map, Value::Map(m)) => {
                if let Some(vs) = &self.values {
                    for (k, fv) in m {
                        vs.check_at(fv, &path.join(k), out);
                    }
                }
            }
            (SchemaType::Array, Value::List(items)) => {
                if let Some(is) = &self.items {
                    for (i, iv) in items.iter().enumerate() {
                        is.check_at(iv, &path.join_index(i), out);
                    }
                }
            }
            _ => {}
        }
    }

    /// Fills fields that are absent (or null) with their schema default, in
    /// objects at any depth.
    pub fn apply_defaults(&self, value: &mut Value) {
        match (self.ty, value) {
            (SchemaType::Object, Value::Map(m)) => {
                for (name, field) in &self.fields {
                    match m.get_mut(name) {
                        Some(v) if !v.is_null() => field.schema.apply_defaults(v),
                        _ => {
                            if let Some(d) = &field.schema.default {
                                m.insert(name.clone(), d.clone());
                            }
                        }
                    }
                }
            }
            (SchemaType::Map, Value::Map(m)) => {
                if let Some(vs) = &self.values {
                    m.values_mut().for_each(|v| vs.apply_defaults(v));
                }
            }
            (SchemaType::Array, Value::List(items)) => {
                if let Some(is) = &self.items {
                    items.iter_mut().for_each(|v| is.apply_defaults(v));
                }
            }
            (_, Value::Sensitive(inner)) => self.apply_defaults(inner),
            _ => {}
        }
    }

    /// Marks every value whose field is declared `sensitive` as sensitive (the
    /// SDK does this to states it returns, so a secret computed field is
    /// masked even when the resource forgot to wrap it).
    pub fn mark_sensitive(&self, value: &mut Value) {
        match (self.ty, value) {
            (_, Value::Sensitive(inner)) => self.mark_sensitive(inner),
            (SchemaType::Object, Value::Map(m)) => {
                for (name, field) in &self.fields {
                    if let Some(v) = m.get_mut(name) {
                        if field.sensitive && !v.is_sensitive() && !v.is_null() {
                            *v = Value::sensitive(std::mem::take(v));
                        } else {
                            field.schema.mark_sensitive(v);
                        }
                    }
                }
            }
            (SchemaType::Map, Value::Map(m)) => {
                if let Some(vs) = &self.values {
                    m.values_mut().for_each(|v| vs.mark_sensitive(v));
                }
            }
            (SchemaType::Array, Value::List(items)) => {
                if let Some(is) = &self.items {
                    items.iter_mut().for_each(|v| is.mark_sensitive(v));
                }
            }
            _ => {}
        }
    }
}

fn article(t: SchemaType) -> String {
    match t {
        SchemaType::Any => "any value".to_owned(),
        SchemaType::Integer | SchemaType::Object | SchemaType::Array => format!("an {}", t.name()),
        _ => format!("a {}", t.name()),
    }
}

/// A field of an object schema: its schema plus flags.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    schema: Schema,
    required: bool,
    computed: bool,
    sensitive: bool,
    must_recreate: bool,
    local_asset: bool,
}

impl Field {
    /// A field of the given schema (optional, not computed).
    pub fn of(schema: Schema) -> Field {
        Field {
            schema,
            required: false,
            computed: false,
            sensitive: false,
            must_recreate: false,
            local_asset: false,
        }
    }
    pub fn any() -> Field {
        Field::of(Schema::any())
    }
    pub fn string() -> Field {
        Field::of(Schema::string())
    }
    pub fn integer() -> Field {
        Field::of(Schema::integer())
    }
    pub fn float() -> Field {
        Field::of(Schema::float())
    }
    pub fn boolean() -> Field {
        Field::of(Schema::boolean())
    }
    pub fn array(items: Schema) -> Field {
        Field::of(Schema::array(items))
    }
    pub fn map(values: Schema) -> Field {
        Field::of(Schema::map(values))
    }
    /// A nested object (build it with `Schema::object().field(..)`).
    pub fn object(schema: Schema) -> Field {
        Field::of(schema)
    }

    /// Must be set in the blueprint.
    pub fn required(mut self) -> Field {
        self.required = true;
        self
    }
    /// Set by the provider (visible in state); setting it in a blueprint is an error.
    pub fn computed(mut self) -> Field {
        self.computed = true;
        self
    }
    /// Secret: masked everywhere.
    pub fn sensitive(mut self) -> Field {
        self.sensitive = true;
        self
    }
    /// Changing it replaces the resource instead of updating it.
    pub fn must_recreate(mut self) -> Field {
        self.must_recreate = true;
        self
    }
    /// A string naming a file or directory on the caller's machine, relative to the blueprint
    /// (unless it has a URI scheme): the client sends it, and the call receives
    /// `asset:sha256:<hex>/<name>` with the content's path in [`Context::local_asset`]
    /// (docs/assets.md).
    ///
    /// [`Context::local_asset`]: crate::Context::local_asset
    pub fn local_asset(mut self) -> Field {
        self.local_asset = true;
        self
    }
    pub fn describe(mut self, description: impl Into<String>) -> Field {
        self.schema.description = description.into();
        self
    }
    pub fn default(mut self, value: impl Into<Value>) -> Field {
        self.schema.default = Some(value.into());
        self
    }
    pub fn allowed<V: Into<Value>>(mut self, values: impl IntoIterator<Item = V>) -> Field {
        self.schema = self.schema.allowed(values);
        self
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }
    pub fn is_required(&self) -> bool {
        self.required
    }
    pub fn is_computed(&self) -> bool {
        self.computed
    }
    pub fn is_sensitive(&self) -> bool {
        self.sensitive
    }
    pub fn is_must_recreate(&self) -> bool {
        self.must_recreate
    }
    pub fn is_local_asset(&self) -> bool {
        self.local_asset
    }

    pub fn to_proto(&self, name: &str) -> pb::SchemaField {
        pb::SchemaField {
            name: name.to_owned(),
            schema: Some(self.schema.to_proto()),
            required: self.required,
            computed: self.computed,
            sensitive: self.sensitive,
            must_recreate: self.must_recreate,
            local_asset: self.local_asset,
        }
    }

    pub fn from_proto(f: pb::SchemaField) -> Field {
        Field {
            schema: f.schema.map_or_else(Schema::any, Schema::from_proto),
            required: f.required,
            computed: f.computed,
            sensitive: f.sensitive,
            must_recreate: f.must_recreate,
            local_asset: f.local_asset,
        }
    }
}

/// A typed, path-aware view of an object value (a spec, a config, a nested
/// object). Every accessor returns a BAD_INPUT [`PluginError`] whose `path`
/// is the attribute, so `?` gives the engine (and the user) the exact line.
///
/// ```
/// use trellis_plugin_sdk::{Spec, Value, ErrorClass};
/// let v = Value::map().with("path", "a.txt").with("size", "big");
/// let spec = Spec::new(&v);
/// assert_eq!(spec.get_str("path").ok(), Some("a.txt"));
/// let e = spec.get_i64("size").err().map(|e| (e.class, e.path.map(|p| p.to_string())));
/// assert_eq!(e, Some((ErrorClass::BadInput, Some("size".to_owned()))));
/// ```
#[derive(Clone, Debug)]
pub struct Spec<'a> {
    value: &'a Value,
    path: AttrPath,
}

impl<'a> Spec<'a> {
    /// A view of `value` at the root path.
    pub fn new(value: &'a Value) -> Spec<'a> {
        Spec {
            value,
            path: AttrPath::root(),
        }
    }

    /// A view of `value`, which sits at `path`.
    pub fn at(value: &'a Value, path: AttrPath) -> Spec<'a> {
        Spec { value, path }
    }

    /// The value viewed.
    pub fn value(&self) -> &'a Value {
        self.value
    }

    /// Where the viewed value sits.
    pub fn path(&self) -> &AttrPath {
        &self.path
    }

    /// The path of field `key` of this value.
    pub fn path_of(&self, key: &str) -> AttrPath {
        self.path.join(key)
    }

    /// The raw value of `key`; None when absent or null.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    /// True when `key` is set (not null) but not known until deploy.
    pub fn is_unknown(&self, key: &str) -> bool {
        self.get(key).is_some_and(Value::is_unknown)
    }

    /// The value of `key`, which must be set and known.
    pub fn require(&self, key: &str) -> Result<&'a Value> {
        match self.get(key) {
            None => Err(
                PluginError::bad_input(format!("`{}` is required", self.path_of(key)))
                    .at(self.path_of(key)),
            ),
            Some(v) if v.is_unknown() => Err(PluginError::bad_input(format!(
                "`{}` is not known yet (known only after deploy)",
                self.path_of(key)
            ))
            .at(self.path_of(key))),
            Some(v) => Ok(v),
        }
    }

    fn typed<T>(
        &self,
        key: &str,
        want: &str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let p = self.path_of(key);
        if v.is_unknown() {
            return Err(PluginError::bad_input(format!(
                "`{p}` is not known yet (known only after deploy)"
            ))
            .at(p));
        }
        match f(v) {
            Some(t) => Ok(Some(t)),
            None => Err(PluginError::bad_input(format!(
                "`{p}` must be {want}, found {}",
                v.kind_name()
            ))
            .at(p)),
        }
    }

    fn required<T>(&self, key: &str, got: Result<Option<T>>) -> Result<T> {
        got?.ok_or_else(|| {
            PluginError::bad_input(format!("`{}` is required", self.path_of(key)))
                .at(self.path_of(key))
        })
    }

    /// An optional string: Ok(None) when absent or null, BAD_INPUT when mistyped.
    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.typed(key, "a string", Value::as_str)
    }
    /// A required string.
    pub fn get_str(&self, key: &str) -> Result<&'a str> {
        self.required(key, self.opt_str(key))
    }
    pub fn opt_i64(&self, key: &str) -> Result<Option<i64>> {
        self.typed(key, "an integer", Value::as_i64)
    }
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.required(key, self.opt_i64(key))
    }
    /// A non-negative integer.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", |v| {
            v.as_i64().and_then(|i| u64::try_from(i).ok())
        })
    }
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.required(key, self.opt_u64(key))
    }
    /// A float (integers are accepted).
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", Value::as_f64)
    }
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.required(key, self.opt_f64(key))
    }
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a boolean", Value::as_bool)
    }
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.required(key, self.opt_bool(key))
    }
    /// A nested object, as a view at its path.
    pub fn opt_object(&self, key: &str) -> Result<Option<Spec<'a>>> {
        let p = self.path_of(key);
        Ok(self.typed(key, "an object", Value::as_map)?.map(|_| Spec {
            value: self.value.get(key).map_or(self.value, Value::revealed),
            path: p,
        }))
    }
    pub fn get_object(&self, key: &str) -> Result<Spec<'a>> {
        self.required(key, self.opt_object(key))
    }
    /// A map, as its entries.
    pub fn opt_map(&self, key: &str) -> Result<Option<&'a Map>> {
        self.typed(key, "an object", Value::as_map)
    }
    pub fn get_map(&self, key: &str) -> Result<&'a Map> {
        self.required(key, self.opt_map(key))
    }
    /// A list, as views of its elements (each at `key[i]`).
    pub fn opt_list(&self, key: &str) -> Result<Option<Vec<Spec<'a>>>> {
        let p = self.path_of(key);
        Ok(self.typed(key, "an array", Value::as_list)?.map(|items| {
            items
                .iter()
                .enumerate()
                .map(|(i, v)| Spec {
                    value: v,
                    path: p.join_index(i),
                })
                .collect()
        }))
    }
    pub fn get_list(&self, key: &str) -> Result<Vec<Spec<'a>>> {
        self.required(key, self.opt_list(key))
    }
    /// A list of strings.
    pub fn opt_str_list(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let Some(items) = self.opt_list(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .map(|s| {
                s.value.as_str().ok_or_else(|| {
                    PluginError::bad_input(format!(
                        "`{}` must be a string, found {}",
                        s.path,
                        s.value.kind_name()
                    ))
                    .at(s.path.clone())
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
    /// This value as a string (for list elements).
    pub fn as_str(&self) -> Result<&'a str> {
        self.value.as_str().ok_or_else(|| {
            PluginError::bad_input(format!(
                "`{}` must be a string, found {}",
                self.path,
                self.value.kind_name()
            ))
            .at(self.path.clone())
        })
    }
    /// A BAD_INPUT error about field `key`.
    pub fn error(&self, key: &str, message: impl std::fmt::Display) -> PluginError {
        PluginError::bad_input(format!("`{}` {message}", self.path_of(key))).at(self.path_of(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;

    fn schema() -> Schema {
        Schema::object()
            .field(
                "path",
                Field::string().required().must_recreate().describe("where"),
            )
            .field(
                "mode",
                Field::string().default("0644").allowed(["0644", "0600"]),
            )
            .field("size", Field::integer())
            .field("tags", Field::map(Schema::string()))
            .field(
                "items",
                Field::array(Schema::object().field("n", Field::integer().required())),
            )
            .field("token", Field::string().computed().sensitive())
    }

    #[test]
    fn builds_the_manifest_schema() {
        let p = schema().to_proto();
        assert_eq!(p.r#type, pb::SchemaType::Object as i32);
        let path = &p.fields[0];
        assert_eq!(path.name, "path");
        assert!(path.required && path.must_recreate && !path.computed);
        assert_eq!(
            path.schema.as_ref().map(|s| s.description.as_str()),
            Some("where")
        );
        assert_eq!(
            p.fields[1].schema.as_ref().map(|s| s.allowed_values.len()),
            Some(2)
        );
        assert!(p.fields[5].sensitive && p.fields[5].computed);
        assert_eq!(Schema::from_proto(p), schema());
    }

    #[test]
    fn check_reports_every_problem_with_paths() {
        let v = Value::from(serde_json::json!({
            "mode": "0777", "size": "x", "tags": {"a": 1},
            "items": [{"n": 1}, {}], "token": "t", "extra": true
        }));
        let codes: Vec<(String, String)> = schema()
            .check(&v)
            .into_iter()
            .map(|d| (d.code, d.path.map(|p| p.to_string()).unwrap_or_default()))
            .collect();
        let want = [
            ("schema.required", "path"),
            ("schema.not-allowed", "mode"),
            ("schema.type", "size"),
            ("schema.type", "tags.a"),
            ("schema.required", "items[1].n"),
            ("schema.computed", "token"),
            ("schema.unknown-field", "extra"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(codes, want);
        let ok = Value::map().with("path", Value::Unknown).with("size", 3);
        assert!(schema().check(&ok).is_empty());
        assert_eq!(schema().check(&Value::from(3)).len(), 1);
    }

    #[test]
    fn defaults_and_sensitive_marking() {
        let mut v = Value::map().with("path", "p");
        schema().apply_defaults(&mut v);
        assert_eq!(v.get("mode").and_then(Value::as_str), Some("0644"));
        let mut st = Value::map().with("token", "abc").with("path", "p");
        schema().mark_sensitive(&mut st);
        assert!(st.get("token").is_some_and(Value::is_sensitive));
        assert!(!st.get("path").is_some_and(Value::is_sensitive));
    }

    #[test]
    fn spec_accessors() {
        let v = Value::from(serde_json::json!({
            "s": "x", "i": 3, "f": 1.5, "b": true, "n": null, "neg": -1,
            "o": {"inner": {"deep": 5}}, "l": ["a", 2]
        }))
        .with("u", Value::Unknown)
        .with("secret", Value::sensitive("pw"));
        let s = Spec::new(&v);
        assert_eq!(s.get_str("s").ok(), Some("x"));
        assert_eq!(s.get_str("secret").ok(), Some("pw"));
        assert_eq!(s.get_i64("i").ok(), Some(3));
        assert_eq!(s.get_f64("i").ok(), Some(3.0));
        assert_eq!(s.get_f64("f").ok(), Some(1.5));
        assert_eq!(s.get_bool("b").ok(), Some(true));
        assert_eq!(s.opt_str("n").ok(), Some(None));
        assert_eq!(s.opt_str("missing").ok(), Some(None));
        let err = |r: Result<_>| {
            r.err()
                .map(|e: PluginError| (e.class, e.path.map(|p| p.to_string()), e.message))
        };
        assert_eq!(
            err(s.get_str("missing").map(|_| ())),
            Some((
                ErrorClass::BadInput,
                Some("missing".into()),
                "`missing` is required".into()
            ))
        );
        assert_eq!(
            err(s.get_i64("f").map(|_| ())),
            Some((
                ErrorClass::BadInput,
                Some("f".into()),
                "`f` must be an integer, found float".into()
            ))
        );
        assert!(s.get_u64("neg").is_err());
        assert!(s.get_str("u").is_err());
        assert!(s.is_unknown("u"));
        let deep = s.get_object("o").and_then(|o| o.get_object("inner"));
        assert_eq!(
            deep.as_ref().ok().and_then(|d| d.get_i64("deep").ok()),
            Some(5)
        );
        let e = deep
            .and_then(|d| d.get_str("deep"))
            .err()
            .and_then(|e| e.path);
        assert_eq!(e.map(|p| p.to_string()), Some("o.inner.deep".to_owned()));
        let list = s.get_list("l").unwrap_or_default();
        assert_eq!(list.len(), 2);
        assert_eq!(
            list[1]
                .as_str()
                .err()
                .and_then(|e| e.path)
                .map(|p| p.to_string()),
            Some("l[1]".into())
        );
        assert!(s.opt_str_list("l").is_err());
    }
}
