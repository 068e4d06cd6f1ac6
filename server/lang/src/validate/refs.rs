//! Reference resolution: every `${..}` and export field names something that
//! exists, with the shape its kind allows. Builds the dependency graph that
//! cycle detection and the `each` rule use.

use super::Options;
use super::types::{Static, Typer};
use crate::blueprint::article_of;
use crate::blueprint::{Blueprint, Resource, Spanned, TKind};
use crate::diag::{Code, Diagnostic, Diagnostics, codes, did_you_mean};
use crate::source::{SourceFile, Span};
use crate::subst::{
    Accessor, Expr, ExprKind, Literal, Name, Part, SpanMap, Template, parse_expression,
};
use std::collections::HashMap;

/// The things that can depend on each other, numbered in declaration order:
/// values, then data sources, then resources, then children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRef {
    Value(usize),
    DataSource(usize),
    Resource(usize),
    Child(usize),
}

pub struct Graph {
    pub nodes: Vec<NodeRef>,
    /// Outgoing edges per node, in the order the references were written,
    /// each with the span of the reference.
    pub edges: Vec<Vec<(usize, Span)>>,
    /// For each resource with `each`: what its `each` expression references.
    pub each_targets: Vec<(usize, Vec<(usize, Span)>)>,
    offsets: [usize; 4],
}

impl Graph {
    fn new(bp: &Blueprint) -> Graph {
        let counts = [
            bp.values.len(),
            bp.datasources.len(),
            bp.resources.len(),
            bp.include.len(),
        ];
        let offsets = [
            0,
            counts[0],
            counts[0] + counts[1],
            counts[0] + counts[1] + counts[2],
        ];
        let mut nodes = Vec::with_capacity(counts.iter().sum());
        nodes.extend((0..counts[0]).map(NodeRef::Value));
        nodes.extend((0..counts[1]).map(NodeRef::DataSource));
        nodes.extend((0..counts[2]).map(NodeRef::Resource));
        nodes.extend((0..counts[3]).map(NodeRef::Child));
        Graph {
            edges: vec![Vec::new(); nodes.len()],
            nodes,
            each_targets: Vec::new(),
            offsets,
        }
    }

    /// The graph of an empty blueprint.
    pub fn empty() -> Graph {
        Graph {
            nodes: Vec::new(),
            edges: Vec::new(),
            each_targets: Vec::new(),
            offsets: [0; 4],
        }
    }

    pub fn index(&self, r: NodeRef) -> usize {
        match r {
            NodeRef::Value(i) => self.offsets[0] + i,
            NodeRef::DataSource(i) => self.offsets[1] + i,
            NodeRef::Resource(i) => self.offsets[2] + i,
            NodeRef::Child(i) => self.offsets[3] + i,
        }
    }
}

/// How a name is shown in messages: `values.x`, `resources.y`.
pub fn describe(bp: &Blueprint, r: NodeRef) -> String {
    match r {
        NodeRef::Value(i) => format!("values.{}", bp.values[i].name.value),
        NodeRef::DataSource(i) => format!("datasources.{}", bp.datasources[i].name.value),
        NodeRef::Resource(i) => format!("resources.{}", bp.resources[i].name.value),
        NodeRef::Child(i) => format!("children.{}", bp.include[i].name.value),
    }
}

pub fn name_span(bp: &Blueprint, r: NodeRef) -> Span {
    match r {
        NodeRef::Value(i) => bp.values[i].name.span,
        NodeRef::DataSource(i) => bp.datasources[i].name.span,
        NodeRef::Resource(i) => bp.resources[i].name.span,
        NodeRef::Child(i) => bp.include[i].name.span,
    }
}

#[derive(Clone, Copy)]
struct Ctx<'a> {
    /// The graph node whose definition holds the expression.
    owner: Option<usize>,
    /// Inside a resource with `each` (not in `each` itself): `elem` and `i` work.
    in_each: bool,
    /// The function this expression is an argument of.
    arg_of: Option<&'a str>,
}

struct Checker<'a, 'o> {
    bp: &'a Blueprint,
    opts: &'a Options<'o>,
    diags: &'a mut Diagnostics,
    variables: HashMap<&'a str, usize>,
    values: HashMap<&'a str, usize>,
    datasources: HashMap<&'a str, usize>,
    resources: HashMap<&'a str, usize>,
    children: HashMap<&'a str, usize>,
    graph: Graph,
    /// Collects targets while checking an `each` expression.
    collect: Option<Vec<(usize, Span)>>,
}

fn table<'a, T>(
    items: &'a [T],
    name: impl Fn(&'a T) -> &'a Spanned<String>,
) -> HashMap<&'a str, usize> {
    let mut m = HashMap::with_capacity(items.len());
    for (i, it) in items.iter().enumerate() {
        m.entry(name(it).value.as_str()).or_insert(i);
    }
    m
}

pub fn check(
    bp: &Blueprint,
    src: &SourceFile,
    opts: &Options<'_>,
    diags: &mut Diagnostics,
) -> Graph {
    let mut c = Checker::new(bp, opts, diags);
    c.run(src);
    c.graph
}

/// Checks one template with no owner in the graph (see `validate::check_template`).
pub fn check_detached(bp: &Blueprint, opts: &Options<'_>, t: &Template, diags: &mut Diagnostics) {
    let mut c = Checker::new(bp, opts, diags);
    let top = Ctx {
        owner: None,
        in_each: false,
        arg_of: None,
    };
    c.template(t, top);
}

impl Graph {
    /// Nodes in an order where everything a node references comes before it
    /// (dependencies first; declaration order among independent nodes).
    /// Meaningful only for an acyclic graph.
    pub fn dependency_order(&self) -> Vec<NodeRef> {
        let n = self.nodes.len();
        let mut state = vec![0u8; n]; // 0 new, 1 in progress, 2 done
        let mut order = Vec::with_capacity(n);
        for root in 0..n {
            if state[root] != 0 {
                continue;
            }
            let mut stack = vec![(root, 0usize)];
            state[root] = 1;
            while let Some(&mut (v, ref mut pos)) = stack.last_mut() {
                if let Some(&(w, _)) = self.edges[v].get(*pos) {
                    *pos += 1;
                    if state[w] == 0 {
                        state[w] = 1;
                        stack.push((w, 0));
                    }
                    continue;
                }
                stack.pop();
                state[v] = 2;
                order.push(self.nodes[v]);
            }
        }
        order
    }
}

impl<'a, 'o> Checker<'a, 'o> {
    fn new(
        bp: &'a Blueprint,
        opts: &'a Options<'o>,
        diags: &'a mut Diagnostics,
    ) -> Checker<'a, 'o> {
        Checker {
            bp,
            opts,
            diags,
            variables: table(&bp.variables, |v| &v.name),
            values: table(&bp.values, |v| &v.name),
            datasources: table(&bp.datasources, |d| &d.name),
            resources: table(&bp.resources, |r| &r.name),
            children: table(&bp.include, |i| &i.name),
            graph: Graph::new(bp),
            collect: None,
        }
    }

    fn run(&mut self, src: &SourceFile) {
        let bp = self.bp;
        for (i, v) in bp.values.iter().enumerate() {
            let ctx = self.ctx(NodeRef::Value(i), false);
            if let Some(t) = &v.value {
                self.template(t, ctx);
                let declared =
                    v.ty.as_ref()
                        .map_or(Static::Any, |t| Static::from_declared(&t.value));
                // Literal non-string values are parsed from text, checked in sections.rs.
                // Integers, floats and booleans may also come from a string,
                // which is parsed when the value is evaluated.
                let parsed_from_string =
                    matches!(declared, Static::Integer | Static::Float | Static::Boolean)
                        && self.typer().template(t) == Static::String;
                if declared != Static::String
                    && t.single_substitution().is_some()
                    && !parsed_from_string
                {
                    let what = format!("value `{}` (declared {})", v.name.value, declared.as_str());
                    self.expect_type(t, declared, &codes::VALUE_TYPE_MISMATCH, &what);
                }
            }
            if let Some(t) = &v.description {
                self.template(t, ctx);
            }
        }
        for (i, d) in bp.datasources.iter().enumerate() {
            let ctx = self.ctx(NodeRef::DataSource(i), false);
            let mut ts = Vec::new();
            d.metadata.templates(&mut |t| ts.push(t));
            for f in &d.filters {
                if let Some(s) = &f.search {
                    s.templates(&mut |t| ts.push(t));
                }
            }
            if let Some(t) = &d.description {
                ts.push(t);
            }
            for t in ts {
                self.template(t, ctx);
            }
            let name = &d.name.value;
            self.string_field(
                d.description.as_ref(),
                &format!("the description of data source `{name}`"),
            );
            self.string_field(
                d.metadata.display_name.as_ref(),
                &format!("the display name of data source `{name}`"),
            );
        }
        for (i, r) in bp.resources.iter().enumerate() {
            let node = self.graph.index(NodeRef::Resource(i));
            if let Some(each) = &r.each {
                self.collect = Some(Vec::new());
                self.template(each, self.ctx(NodeRef::Resource(i), false));
                let targets = self.collect.take().unwrap_or_default();
                self.graph.each_targets.push((i, targets));
            }
            let ctx = self.ctx(NodeRef::Resource(i), r.has_each);
            let mut ts = Vec::new();
            r.element_templates(&mut |t| ts.push(t));
            for t in ts {
                self.template(t, ctx);
            }
            if let Some(each) = &r.each
                && each.single_substitution().is_some()
            {
                let what = format!("`each` of resource `{}`", r.name.value);
                self.expect_type(each, Static::Array, &codes::EACH_TYPE, &what);
            }
            if let Some(c) = &r.condition {
                let mut cs = Vec::new();
                c.templates(&mut |t| cs.push(t));
                for t in cs {
                    let what = format!("a condition of resource `{}`", r.name.value);
                    self.expect_type(t, Static::Boolean, &codes::CONDITION_TYPE, &what);
                }
            }
            let name = &r.name.value;
            self.string_field(
                r.description.as_ref(),
                &format!("the description of resource `{name}`"),
            );
            self.string_field(
                r.metadata.display_name.as_ref(),
                &format!("the display name of resource `{name}`"),
            );
            self.depends_on(i, r, node);
        }
        for (i, inc) in bp.include.iter().enumerate() {
            let ctx = self.ctx(NodeRef::Child(i), false);
            let mut ts = Vec::new();
            if let Some(t) = &inc.path {
                ts.push(t);
            }
            for (_, v) in &inc.variables {
                v.templates(&mut |t| ts.push(t));
            }
            if let Some(m) = &inc.metadata {
                m.templates(&mut |t| ts.push(t));
            }
            if let Some(t) = &inc.description {
                ts.push(t);
            }
            for t in ts {
                self.template(t, ctx);
            }
            let name = &inc.name.value;
            self.string_field(
                inc.description.as_ref(),
                &format!("the description of include `{name}`"),
            );
            if let Some(t) = &inc.path
                && let Some(s) = t.single_substitution()
                && !t.broken
            {
                let got = self.typer().template(t);
                if !matches!(got, Static::String | Static::Any | Static::Func) {
                    self.push(
                        &codes::INCLUDE_PATH_TYPE,
                        s.span,
                        format!(
                            "the path of include `{name}` must be a string, but this substitution yields {}",
                            article_of(got.as_str())
                        ),
                        None,
                    );
                }
            }
        }
        let top = Ctx {
            owner: None,
            in_each: false,
            arg_of: None,
        };
        for x in &bp.exports {
            if let Some(t) = &x.description {
                self.template(t, top);
            }
            if let Some(field) = &x.field {
                let declared =
                    x.ty.as_ref()
                        .map_or(Static::Any, |t| Static::from_declared(&t.value));
                self.export_field(&x.name.value, field, declared, src, top);
            }
        }
        if let Some(m) = &bp.metadata {
            let mut ts = Vec::new();
            m.templates(&mut |t| ts.push(t));
            for t in ts {
                self.template(t, top);
            }
        }
    }

    fn ctx(&self, owner: NodeRef, in_each: bool) -> Ctx<'static> {
        Ctx {
            owner: Some(self.graph.index(owner)),
            in_each,
            arg_of: None,
        }
    }

    fn push(&mut self, code: &'static Code, span: Span, msg: String, hint: Option<String>) {
        let mut d = Diagnostic::new(code, span, msg);
        d.hint = hint;
        self.diags.push(d);
    }

    fn edge(&mut self, ctx: Ctx<'_>, target: NodeRef, span: Span) {
        let t = self.graph.index(target);
        if let Some(o) = ctx.owner
            && !self.graph.edges[o].iter().any(|(x, _)| *x == t)
        {
            self.graph.edges[o].push((t, span));
        }
        if let Some(c) = &mut self.collect {
            c.push((t, span));
        }
    }

    fn typer(&self) -> Typer<'a> {
        Typer {
            bp: self.bp,
            functions: self.opts.functions,
        }
    }

    fn template(&mut self, t: &Template, ctx: Ctx<'_>) {
        let typer = self.typer();
        for s in t.substitutions() {
            self.expr(&s.expr, ctx);
            typer.check_calls(&s.expr, self.diags);
        }
        typer.check_interpolation(t, self.diags);
    }

    /// A template whose whole result must have a type (conditions, `each`,
    /// typed values), checked where the type is known statically.
    fn expect_type(&mut self, t: &Template, want: Static, code: &'static Code, what: &str) {
        let got = self.typer().template(t);
        // A broken template or a function value is reported already.
        if !t.broken && got != Static::Func && !got.fits(want) {
            let span = t.single_substitution().map_or(t.span, |s| s.span);
            self.push(
                code,
                span,
                format!(
                    "{what} must be {}, but this is {}",
                    article_of(want.as_str()),
                    article_of(got.as_str())
                ),
                None,
            );
        }
    }

    /// A string field (description, display name) given one `${..}` that yields an
    /// array or object: an error, as interpolating one into a longer string is.
    fn string_field(&mut self, t: Option<&Template>, what: &str) {
        let Some(t) = t else { return };
        let Some(s) = t.single_substitution() else {
            return;
        };
        if t.broken {
            return;
        }
        let got = self.typer().template(t);
        if matches!(got, Static::Array | Static::Object) {
            self.push(
                &codes::STRING_FIELD_COMPLEX,
                s.span,
                format!(
                    "{what} must be a string, but this substitution yields {}",
                    article_of(got.as_str())
                ),
                Some("pick a scalar out of it (`join(..)`, `[0]`, `.field`)".to_owned()),
            );
        }
    }

    fn unknown(&mut self, code: &'static Code, kind: &str, name: &Name, candidates: Vec<&str>) {
        let hint = did_you_mean(&name.text, candidates).map(|s| format!("did you mean `{s}`?"));
        self.push(
            code,
            name.span,
            format!("unknown {kind} `{}`", name.text),
            hint,
        );
    }

    fn expr(&mut self, e: &Expr, ctx: Ctx<'_>) {
        match &e.kind {
            ExprKind::Lit(_) => {}
            ExprKind::Variable(n) => {
                if !self.variables.contains_key(n.text.as_str()) {
                    let cands = self.variables.keys().copied().collect();
                    self.unknown(&codes::UNKNOWN_VARIABLE, "variable", n, cands);
                }
            }
            ExprKind::Value(n, _) => match self.values.get(n.text.as_str()) {
                Some(&i) => self.edge(ctx, NodeRef::Value(i), e.span),
                None => {
                    let cands = self.values.keys().copied().collect();
                    self.unknown(&codes::UNKNOWN_VALUE, "value", n, cands);
                }
            },
            ExprKind::DataSource { name, field, index } => {
                let Some(&i) = self.datasources.get(name.text.as_str()) else {
                    let cands = self.datasources.keys().copied().collect();
                    self.unknown(&codes::UNKNOWN_DATASOURCE, "data source", name, cands);
                    return;
                };
                self.edge(ctx, NodeRef::DataSource(i), e.span);
                let ds = &self.bp.datasources[i];
                match ds.exports.iter().find(|x| x.name.value == field.text) {
                    None => {
                        let hint = did_you_mean(&field.text, ds.exports.iter().map(|x| x.name.value.as_str()))
                            .map(|s| format!("did you mean `{s}`?"))
                            .or_else(|| Some("only fields listed under the data source's `exports` can be referenced".into()));
                        self.push(
                            &codes::UNKNOWN_DATASOURCE_FIELD,
                            field.span,
                            format!(
                                "data source `{}` does not export `{}`",
                                name.text, field.text
                            ),
                            hint,
                        );
                    }
                    Some(x) => {
                        let is_array = x.ty.as_ref().is_some_and(|t| t.value == "array");
                        if let (Some(ix), false) = (index, is_array) {
                            self.push(
                                &codes::DATASOURCE_FIELD_NOT_ARRAY,
                                ix.span(),
                                format!(
                                    "`{}` of data source `{}` is exported as {}, not an array, so it cannot be indexed",
                                    field.text,
                                    name.text,
                                    x.ty.as_ref().map_or("an unknown type".to_owned(), |t| crate::blueprint::article_of(&t.value))
                                ),
                                None,
                            );
                        }
                    }
                }
            }
            ExprKind::Child(n, _) => match self.children.get(n.text.as_str()) {
                Some(&i) => self.edge(ctx, NodeRef::Child(i), e.span),
                None => {
                    let cands = self.children.keys().copied().collect();
                    self.unknown(&codes::UNKNOWN_CHILD, "child blueprint", n, cands);
                }
            },
            ExprKind::Resource {
                name,
                path,
                prefixed,
            } => self.resource_ref(e, name, path, *prefixed, ctx),
            ExprKind::Elem(_) | ExprKind::ElemIndex => {
                if !ctx.in_each {
                    let what = if matches!(e.kind, ExprKind::ElemIndex) {
                        "i"
                    } else {
                        "elem"
                    };
                    self.push(
                        &codes::ELEM_OUTSIDE_EACH,
                        e.span,
                        format!("`{what}` can only be used inside a resource with `each`"),
                        Some("`elem` is the current element and `i` its index when a resource template has `each`".into()),
                    );
                }
            }
            ExprKind::Call { name, args, path } => {
                let sig = self.opts.functions.lookup(&name.text);
                match sig {
                    None => {
                        let names = self.opts.functions.names();
                        let hint = did_you_mean(&name.text, names.iter().copied())
                            .map(|s| format!("did you mean `{s}`?"));
                        if self.opts.unchecked_functions {
                            let mut d = Diagnostic::new(
                                &codes::UNKNOWN_FUNCTION,
                                name.span,
                                format!(
                                    "function `{}` is not checked: it is not a core function and may be a provider function (provider checks were skipped)",
                                    name.text
                                ),
                            );
                            d.severity = crate::diag::Severity::Warning;
                            d.hint = hint;
                            self.diags.push(d);
                        } else {
                            self.push(
                                &codes::UNKNOWN_FUNCTION,
                                name.span,
                                format!("unknown function `{}`", name.text),
                                hint,
                            );
                        }
                    }
                    Some(sig) => {
                        let n = args.len();
                        let too_few = n < sig.min_args();
                        let too_many = sig.max_args().is_some_and(|m| n > m);
                        if too_few || too_many {
                            self.push(
                                &codes::FUNCTION_ARITY,
                                e.span,
                                format!(
                                    "`{}` takes {}, but {} {} given",
                                    name.text,
                                    sig.arity_text(),
                                    n,
                                    if n == 1 { "was" } else { "were" }
                                ),
                                None,
                            );
                        }
                        if sig.returns == crate::functions::Ty::Func && !path.is_empty() {
                            self.push(
                                &codes::FUNCTION_VALUE,
                                path[0].span(),
                                format!(
                                    "`{}(..)` returns a function, which has no fields or elements",
                                    name.text
                                ),
                                None,
                            );
                        } else if sig.returns == crate::functions::Ty::Func && ctx.arg_of.is_none()
                        {
                            self.push(
                                &codes::FUNCTION_VALUE,
                                e.span,
                                format!("`{}(..)` returns a function, which can only be passed to another function", name.text),
                                Some(format!("pass it to a function that takes one, e.g. `map(items, {}(..))`", name.text)),
                            );
                        }
                    }
                }
                if name.text == "link" {
                    for a in args {
                        if let ExprKind::Lit(Literal::Str(s)) = &a.value.kind {
                            self.link_name(s, a.value.span);
                        }
                    }
                }
                let inner = Ctx {
                    arg_of: Some(name.text.as_str()),
                    ..ctx
                };
                for a in args {
                    self.expr(&a.value, inner);
                }
            }
        }
    }

    /// A resource named by a string in `link("a", "b")`: a resource of the blueprint, or an
    /// element (`name_<i>`) of a template with `each`.
    fn link_name(&mut self, text: &str, span: Span) {
        let names_resource = |name: &str| self.resources.contains_key(name);
        let element_of_each = text.rsplit_once('_').is_some_and(|(template, index)| {
            !index.is_empty()
                && index.bytes().all(|b| b.is_ascii_digit())
                && self
                    .resources
                    .get(template)
                    .is_some_and(|&i| self.bp.resources[i].has_each)
        });
        if names_resource(text) || element_of_each {
            return;
        }
        let hint = did_you_mean(text, self.resources.keys().map(|k| k.as_ref()))
            .map(|s| format!("did you mean `{s}`?"));
        self.push(
            &codes::UNKNOWN_RESOURCE,
            span,
            format!("`link` names `{text}`, which is not a resource of this blueprint"),
            hint,
        );
    }

    fn resource_ref(
        &mut self,
        e: &Expr,
        name: &Name,
        path: &[Accessor],
        prefixed: bool,
        ctx: Ctx<'_>,
    ) {
        let found = self.resources.get(name.text.as_str()).copied();
        if path.is_empty() {
            // `link(a, b)` takes resources themselves.
            if ctx.arg_of == Some("link")
                && let Some(i) = found
            {
                self.edge(ctx, NodeRef::Resource(i), e.span);
                return;
            }
            // A bare name is a function value when a function has that name.
            if !prefixed && self.opts.functions.lookup(&name.text).is_some() {
                if ctx.arg_of.is_none() {
                    self.push(
                        &codes::FUNCTION_VALUE,
                        e.span,
                        format!(
                            "`{}` is a function; a function can only be passed to another function",
                            name.text
                        ),
                        Some(format!("call it: `{}(..)`", name.text)),
                    );
                }
                return;
            }
        }
        if found.is_none() && !prefixed && self.opts.functions.lookup(&name.text).is_some() {
            self.push(
                &codes::FUNCTION_VALUE,
                e.span,
                format!(
                    "`{}` is a function; a function value has no fields or elements",
                    name.text
                ),
                Some(format!("call it, `{}(..)`, and read the result", name.text)),
            );
            return;
        }
        let Some(i) = found else {
            let mut cands: Vec<&str> = self.resources.keys().copied().collect();
            if !prefixed {
                cands.extend(self.opts.functions.names());
            }
            let kind = if prefixed {
                "resource"
            } else {
                "resource or function"
            };
            let mut hint = did_you_mean(&name.text, cands).map(|s| format!("did you mean `{s}`?"));
            if !prefixed && hint.is_none() {
                hint = Some(
                    "a name without a prefix is a resource; use `variables.`, `values.`, `datasources.` or `children.` for the others".into(),
                );
            }
            self.push(
                &codes::UNKNOWN_RESOURCE,
                name.span,
                format!("unknown {kind} `{}`", name.text),
                hint,
            );
            return;
        };
        self.edge(ctx, NodeRef::Resource(i), e.span);
        let r: &Resource = &self.bp.resources[i];
        let mut rest = path;
        if r.has_each {
            match rest.first() {
                Some(Accessor::Index(..)) => rest = &rest[1..],
                _ if ctx.arg_of == Some("link") && rest.is_empty() => return,
                _ => {
                    self.push(
                        &codes::RESOURCE_INDEX,
                        e.span,
                        format!(
                            "resource `{}` is a template with `each`: pick an element",
                            name.text
                        ),
                        Some(format!("for example `resources.{}[0].spec..`", name.text)),
                    );
                    return;
                }
            }
        } else if let Some(ix @ Accessor::Index(..)) = rest.first() {
            self.push(
                &codes::RESOURCE_INDEX,
                ix.span(),
                format!(
                    "resource `{}` has no `each`, so it cannot be indexed",
                    name.text
                ),
                None,
            );
            return;
        }
        const METADATA: &[&str] = &["displayName", "labels", "annotations", "custom"];
        let problem = match rest.first() {
            Some(Accessor::Field(f)) if f.text == "spec" || f.text == "state" => None,
            Some(Accessor::Field(f)) if f.text == "metadata" => match rest.get(1) {
                Some(Accessor::Field(g)) if METADATA.contains(&g.text.as_str()) => None,
                Some(a) => Some((
                    a.span(),
                    "resource metadata is read through `.displayName`, `.labels`, `.annotations` or `.custom`".to_owned(),
                    match a {
                        Accessor::Field(g) => did_you_mean(&g.text, METADATA.iter().copied()).map(|s| format!("did you mean `{s}`?")),
                        _ => None,
                    },
                )),
                None => Some((
                    f.span,
                    "resource metadata is read through `.displayName`, `.labels`, `.annotations` or `.custom`".to_owned(),
                    None,
                )),
            },
            Some(a) => Some((
                a.span(),
                format!("a reference to resource `{}` must go through `.spec`, `.state` or `.metadata`", name.text),
                match a {
                    Accessor::Field(f) => did_you_mean(&f.text, ["spec", "state", "metadata"]).map(|s| format!("did you mean `{s}`?")),
                    _ => None,
                },
            )),
            None => Some((
                e.span,
                format!("a reference to resource `{}` must go through `.spec`, `.state` or `.metadata`", name.text),
                Some(format!("for example `resources.{}.spec.<field>`", name.text)),
            )),
        };
        if let Some((span, msg, hint)) = problem {
            self.push(&codes::RESOURCE_FIELD, span, msg, hint);
            return;
        }
        if let (Some(Accessor::Field(f)), Some(Accessor::Field(g))) = (rest.first(), rest.get(1)) {
            match f.text.as_str() {
                "spec" => self.spec_field_ref(r, g),
                "metadata" => self.metadata_ref(r, g, &rest[2..]),
                _ => {}
            }
        }
    }

    /// `resources.x.metadata.<g>..`: the display name and label values are strings, and a
    /// label or annotation read must be one the resource has (the blueprint alone decides
    /// both, so validation says so rather than the plan).
    fn metadata_ref(&mut self, r: &Resource, g: &Name, rest: &[Accessor]) {
        let md = &r.metadata;
        let string_has_no_parts = |this: &mut Self, what: &str, at: &Accessor| {
            this.push(
                &codes::RESOURCE_FIELD,
                at.span(),
                format!(
                    "{what} of resource `{}` is a string: it has no fields or elements",
                    r.name.value
                ),
                None,
            );
        };
        match g.text.as_str() {
            "displayName" => {
                if let Some(a) = rest.first() {
                    string_has_no_parts(self, "`metadata.displayName`", a);
                }
            }
            "labels" | "annotations" => {
                let Some(Accessor::Field(key)) = rest.first() else {
                    return;
                };
                let keys: Vec<&str> = if g.text == "labels" {
                    md.labels.iter().map(|(k, _)| k.name.as_str()).collect()
                } else {
                    md.annotations
                        .iter()
                        .map(|(k, _)| k.name.as_str())
                        .collect()
                };
                if !keys.contains(&key.text.as_str()) {
                    self.push(
                        &codes::RESOURCE_FIELD,
                        key.span,
                        format!(
                            "resource `{}` has no {} `{}`",
                            r.name.value,
                            if g.text == "labels" {
                                "label"
                            } else {
                                "annotation"
                            },
                            key.text
                        ),
                        did_you_mean(&key.text, keys.iter().copied())
                            .map(|s| format!("did you mean `{s}`?")),
                    );
                    return;
                }
                let Some(deeper) = rest.get(1) else { return };
                // A label is a string; an annotation written as a plain scalar has no parts
                // either (one computed by `${..}` may be anything).
                let plain = if g.text == "labels" {
                    true
                } else {
                    md.annotations
                        .iter()
                        .find(|(k, _)| k.name == key.text)
                        .is_some_and(|(_, v)| match &v.kind {
                            TKind::List(_) | TKind::Map(_) => false,
                            TKind::Str(t) => t.parts.iter().all(|p| matches!(p, Part::Lit(_))),
                            _ => true,
                        })
                };
                if plain {
                    let what = format!(
                        "{} `{}`",
                        if g.text == "labels" {
                            "label"
                        } else {
                            "annotation"
                        },
                        key.text
                    );
                    self.push(
                        &codes::RESOURCE_FIELD,
                        deeper.span(),
                        format!(
                            "{what} of resource `{}` is a scalar: it has no fields or elements",
                            r.name.value
                        ),
                        None,
                    );
                }
            }
            _ => {}
        }
    }

    /// `resources.x.spec.<g>`: a field the blueprint does not set must be one the type's
    /// schema declares (the provider computes it), or it will never have a value; caught here
    /// rather than after the deploy that was to compute it.
    fn spec_field_ref(&mut self, r: &Resource, g: &Name) {
        let (Some(providers), Some(ty)) = (self.opts.providers, &r.ty) else {
            return;
        };
        let set_by_blueprint = match r.spec.as_ref().map(|s| &s.kind) {
            Some(TKind::Map(entries)) => entries.iter().any(|(k, _)| k.name == g.text),
            _ => false,
        };
        if set_by_blueprint {
            return;
        }
        let Some(fields) = providers.spec_fields(&ty.value) else {
            return;
        };
        let (message, hint) = match fields.iter().find(|f| f.name == g.text) {
            // The provider computes it: known after deploy.
            Some(f) if f.computed => return,
            Some(_) => (
                format!(
                    "resource `{}` does not set spec field `{}`, and {} does not compute it: \
                     it will never have a value",
                    r.name.value, g.text, ty.value
                ),
                Some(format!(
                    "set `{}` in the spec of `{}`",
                    g.text, r.name.value
                )),
            ),
            None => (
                format!(
                    "resource `{}` ({}) has no spec field `{}`: the blueprint does not set it \
                     and the type's schema does not declare it",
                    r.name.value, ty.value, g.text
                ),
                did_you_mean(&g.text, fields.iter().map(|f| f.name.as_str()))
                    .map(|s| format!("did you mean `{s}`?")),
            ),
        };
        self.push(&codes::SPEC_FIELD_UNKNOWN, g.span, message, hint);
    }

    fn depends_on(&mut self, i: usize, r: &'a Resource, node: usize) {
        for dep in &r.depends_on {
            let target = if dep.value == r.name.value {
                self.push(
                    &codes::DEPENDS_ON_SELF,
                    dep.span,
                    format!("resource `{}` cannot depend on itself", dep.value),
                    None,
                );
                continue;
            } else if let Some(&j) = self.resources.get(dep.value.as_str()) {
                NodeRef::Resource(j)
            } else if let Some(&j) = self.children.get(dep.value.as_str()) {
                NodeRef::Child(j)
            } else {
                let cands = self.resources.keys().chain(self.children.keys()).copied();
                let hint = did_you_mean(&dep.value, cands).map(|s| format!("did you mean `{s}`?"));
                self.push(
                    &codes::DEPENDS_ON_UNKNOWN,
                    dep.span,
                    format!("resource `{}` depends on `{}`, which is neither a resource nor a child blueprint", r.name.value, dep.value),
                    hint,
                );
                continue;
            };
            let _ = i;
            let t = self.graph.index(target);
            if !self.graph.edges[node].iter().any(|(x, _)| *x == t) {
                self.graph.edges[node].push((t, dep.span));
            }
        }
    }

    /// An export `field` is a plain reference, written without `${..}`.
    fn export_field(
        &mut self,
        name: &str,
        field: &Spanned<String>,
        declared: Static,
        src: &SourceFile,
        ctx: Ctx<'_>,
    ) {
        let quoted = matches!(
            src.text.as_bytes().get(field.span.start as usize),
            Some(b'"' | b'\'')
        );
        let start = field.span.start + u32::from(quoted);
        let map = SpanMap::verbatim(field.span.file, start);
        let mut local = Diagnostics::default();
        let expr = parse_expression(&field.value, &map, &mut local);
        let reference = expr.filter(|e| {
            matches!(
                e.kind,
                ExprKind::Variable(_)
                    | ExprKind::Value(..)
                    | ExprKind::DataSource { .. }
                    | ExprKind::Child(..)
                    | ExprKind::Resource { .. }
            )
        });
        match reference {
            Some(e) => {
                self.expr(&e, ctx);
                let got = self.typer().infer(&e);
                if !got.fits(declared) {
                    self.push(
                        &codes::EXPORT_TYPE_MISMATCH,
                        field.span,
                        format!(
                            "export `{name}` declares type {} but `{}` is {}",
                            declared.as_str(),
                            field.value,
                            article_of(got.as_str())
                        ),
                        None,
                    );
                }
            }
            None => {
                let detail = local
                    .items
                    .first()
                    .map(|d| format!(" ({})", d.message))
                    .unwrap_or_default();
                self.push(
                    &codes::EXPORT_FIELD,
                    field.span,
                    format!("export field `{}` is not a reference{detail}", field.value),
                    Some("write a plain reference such as `resources.name.spec.field` or `values.name`; to compute an export, compute a value and export it".into()),
                );
            }
        }
    }
}
