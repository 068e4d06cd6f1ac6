//! Links: which resources a `linkSelector` selects, which selected pairs a
//! provider can link, the annotations those links read, and the deployment
//! order hard links add. The rules are in docs/links.md.
//!
//! Pure: everything comes from the blueprint and the providers' manifests.
//! [`select_links`] is the selection on its own, for the planner; [`check`]
//! reports what is wrong with it (codes T09xx).

use super::Options;
use super::graph::strongly_connected;
use super::providers::{Manifests, literal_value, render, same};
use super::refs::{self, NodeRef, describe};
use super::types::{Static, Typer};
use crate::blueprint::{Blueprint, LinkSelector, Resource, TKind, TNode, article_of};
use crate::diag::{Diagnostic, Diagnostics, codes, did_you_mean};
use crate::functions::FunctionCatalog;
use crate::source::{SourceFile, Span};
use std::collections::{HashMap, HashSet, VecDeque};
use trellis_proto::plugin::v1::{self as pb, AnnotationDef, LinkTypeDef, SchemaType};

/// Whether a link orders deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// The priority resource is deployed first.
    Hard,
    /// No ordering: the link is applied once both resources exist.
    Soft,
}

/// One end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The resource whose `linkSelector` selects the other.
    A,
    /// The selected resource.
    B,
}

/// A link the blueprint asks for: resource A's `linkSelector` selects
/// resource B, and a provider declares the link type `<type A>::<type B>`.
///
/// Either end may be an `each` template; the link then holds between every
/// element of A and every element of B ([`LinkPlan::element_pairs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkPlan {
    pub resource_a: String,
    pub resource_b: String,
    /// Positions of the two resources in [`Blueprint::resources`].
    pub index_a: usize,
    pub index_b: usize,
    /// Whether A (B) is an `each` template.
    pub each_a: bool,
    pub each_b: bool,
    /// `<resource type A>::<resource type B>`, as `LinkContext.link_type` names it.
    pub link_type: String,
    /// The namespace of the provider that declares the link type.
    pub provider: String,
    pub kind: LinkKind,
    /// The side deployed first; meaningful for hard links only.
    pub priority: Side,
}

impl LinkPlan {
    /// For a hard link, the resource deployed first and the one deployed
    /// after it; `None` for a soft link, which adds no order.
    pub fn order(&self) -> Option<(&str, &str)> {
        match (self.kind, self.priority) {
            (LinkKind::Soft, _) => None,
            (LinkKind::Hard, Side::A) => Some((&self.resource_a, &self.resource_b)),
            (LinkKind::Hard, Side::B) => Some((&self.resource_b, &self.resource_a)),
        }
    }

    /// The concrete links once `each` is expanded: every element of A with
    /// every element of B, A's elements outermost. `elements_a` and
    /// `elements_b` are the element counts of templates (ignored for a plain
    /// resource). Element names follow evaluation: `name_<i>`.
    pub fn element_pairs(&self, elements_a: usize, elements_b: usize) -> Vec<(String, String)> {
        let names = |name: &str, each: bool, n: usize| -> Vec<String> {
            if each {
                (0..n).map(|i| format!("{name}_{i}")).collect()
            } else {
                vec![name.to_owned()]
            }
        };
        let a = names(&self.resource_a, self.each_a, elements_a);
        let b = names(&self.resource_b, self.each_b, elements_b);
        a.iter()
            .flat_map(|x| b.iter().map(move |y| (x.clone(), y.clone())))
            .collect()
    }
}

/// Every link of the blueprint, ordered by A's declaration, then B's.
pub fn select_links(bp: &Blueprint, manifests: &Manifests) -> Vec<LinkPlan> {
    plans(bp, manifests, &selections(bp, &Labels::new(bp)))
        .into_iter()
        .map(|s| s.plan)
        .collect()
}

/// Reports what is wrong with the blueprint's links: selectors that select
/// nothing or what cannot be linked, link annotations, hard-link cycles.
pub fn check(
    manifests: &Manifests,
    bp: &Blueprint,
    functions: &dyn FunctionCatalog,
    diags: &mut Diagnostics,
) {
    let labels = Labels::new(bp);
    let sels = selections(bp, &labels);
    let links = plans(bp, manifests, &sels);
    report_selectors(bp, manifests, &labels, &sels, &links, diags);
    check_annotations(bp, manifests, &links, functions, diags);
    check_required(bp, &links, diags);
    check_cycles(bp, &links, functions, diags);
}

/// One resource's selector and what it selects.
struct Selection<'a> {
    /// The selecting resource (A).
    index: usize,
    selector: &'a LinkSelector,
    /// Every selected resource, in declaration order.
    matched: Vec<usize>,
}

impl Selection<'_> {
    /// Where diagnostics about the selector point: its first label.
    fn span(&self) -> Span {
        self.selector
            .by_label
            .first()
            .map_or(self.selector.span, |(k, _)| k.span)
    }
}

/// A link with what diagnostics need.
struct Selected<'m> {
    plan: LinkPlan,
    def: &'m LinkTypeDef,
    /// The selector's first label.
    span: Span,
}

/// Whether `b` carries every label of the selector (ALL, not ANY). A
/// selector without labels selects nothing.
fn selects(selector: &LinkSelector, b: &Resource) -> bool {
    !selector.by_label.is_empty()
        && selector
            .by_label
            .iter()
            .all(|(k, v)| has_label(b, &k.name, &v.value))
}

fn has_label(r: &Resource, key: &str, value: &str) -> bool {
    r.metadata
        .labels
        .iter()
        .any(|(k, v)| k.name == key && v.value == value)
}

/// Resources by label, for selection without comparing every pair.
struct Labels<'a> {
    /// (key, value) -> resources carrying it, in declaration order.
    by: HashMap<(&'a str, &'a str), Vec<usize>>,
    /// Every distinct (key, value), in order of first appearance.
    order: Vec<(&'a str, &'a str)>,
}

impl<'a> Labels<'a> {
    fn new(bp: &'a Blueprint) -> Labels<'a> {
        let mut by: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        let mut order = Vec::new();
        for (j, r) in bp.resources.iter().enumerate() {
            for (k, v) in &r.metadata.labels {
                let key = (k.name.as_str(), v.value.as_str());
                let list = by.entry(key).or_insert_with(|| {
                    order.push(key);
                    Vec::new()
                });
                if list.last() != Some(&j) {
                    list.push(j);
                }
            }
        }
        Labels { by, order }
    }

    /// Whether a resource other than `except` carries the label.
    fn carried(&self, key: &str, value: &str, except: usize) -> bool {
        self.by
            .get(&(key, value))
            .is_some_and(|l| l.iter().any(|&j| j != except))
    }
}

fn selections<'a>(bp: &'a Blueprint, labels: &Labels<'_>) -> Vec<Selection<'a>> {
    bp.resources
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let selector = a.link_selector.as_ref()?;
            // Candidates: the resources with the selector's rarest label.
            let rarest = selector
                .by_label
                .iter()
                .map(|(k, v)| labels.by.get(&(k.name.as_str(), v.value.as_str())))
                .min_by_key(|l| l.map_or(0, Vec::len))
                .flatten();
            let matched = rarest
                .into_iter()
                .flatten()
                .copied()
                .filter(|&j| j != i && selects(selector, &bp.resources[j]))
                .collect();
            Some(Selection {
                index: i,
                selector,
                matched,
            })
        })
        .collect()
}

/// The resource's type, when a provider declares it (unknown types and
/// missing providers are reported by the provider checks).
fn known_type<'b>(r: &'b Resource, manifests: &Manifests) -> Option<&'b str> {
    let ty = r.ty.as_ref()?.value.as_str();
    manifests.resource_type(ty).map(|_| ty)
}

/// The first link type (provider order, then declaration order) from `a` to `b`.
fn link_type<'m>(manifests: &'m Manifests, a: &str, b: &str) -> Option<(&'m str, &'m LinkTypeDef)> {
    manifests
        .link_types()
        .find(|(_, l)| l.resource_type_a == a && l.resource_type_b == b)
}

fn plans<'m>(
    bp: &Blueprint,
    manifests: &'m Manifests,
    sels: &[Selection<'_>],
) -> Vec<Selected<'m>> {
    let mut out = Vec::new();
    for sel in sels {
        let a = &bp.resources[sel.index];
        let Some(ta) = known_type(a, manifests) else {
            continue;
        };
        for &j in &sel.matched {
            let b = &bp.resources[j];
            let Some(tb) = known_type(b, manifests) else {
                continue;
            };
            let Some((provider, def)) = link_type(manifests, ta, tb) else {
                continue;
            };
            // An unspecified kind is SOFT and an unspecified priority
            // RESOURCE_A, as the plugin SDK's defaults are.
            let kind = match pb::LinkKind::try_from(def.kind) {
                Ok(pb::LinkKind::Hard) => LinkKind::Hard,
                _ => LinkKind::Soft,
            };
            let priority = match pb::LinkPriority::try_from(def.priority) {
                Ok(pb::LinkPriority::ResourceB) => Side::B,
                _ => Side::A,
            };
            out.push(Selected {
                plan: LinkPlan {
                    resource_a: a.name.value.clone(),
                    resource_b: b.name.value.clone(),
                    index_a: sel.index,
                    index_b: j,
                    each_a: a.has_each,
                    each_b: b.has_each,
                    link_type: format!("{ta}::{tb}"),
                    provider: provider.to_owned(),
                    kind,
                    priority,
                },
                def,
                span: sel.span(),
            });
        }
    }
    out
}

/// `` `a` `` or `` `a`, `b` ``.
fn quoted(names: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report_selectors(
    bp: &Blueprint,
    manifests: &Manifests,
    labels: &Labels<'_>,
    sels: &[Selection<'_>],
    links: &[Selected<'_>],
    diags: &mut Diagnostics,
) {
    let linked_b: HashSet<usize> = links.iter().map(|l| l.plan.index_b).collect();
    for sel in sels {
        let a = &bp.resources[sel.index];
        let name = &a.name.value;
        if sel.selector.by_label.is_empty() {
            diags.push(
                Diagnostic::new(
                    &codes::LINK_SELECTS_NOTHING,
                    sel.selector.span,
                    format!("the linkSelector of `{name}` has no labels, so it selects nothing"),
                )
                .with_hint("add labels under `byLabel`, or remove the linkSelector"),
            );
            continue;
        }
        if sel.matched.is_empty() {
            report_nothing(bp, labels, sel, diags);
            continue;
        }
        let Some(ta) = known_type(a, manifests) else {
            continue;
        };
        // Selected resources that cannot be linked, grouped by type in
        // order of first appearance.
        let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
        for &j in &sel.matched {
            let Some(tb) = known_type(&bp.resources[j], manifests) else {
                continue;
            };
            if link_type(manifests, ta, tb).is_some() {
                continue;
            }
            match groups.iter_mut().find(|(t, _)| *t == tb) {
                Some((_, v)) => v.push(j),
                None => groups.push((tb, vec![j])),
            }
        }
        for (tb, members) in groups {
            // A resource that another selector links is only caught by a
            // broad label here: its labels serve that link.
            let stray: Vec<&str> = members
                .iter()
                .filter(|j| !linked_b.contains(j))
                .map(|&j| bp.resources[j].name.value.as_str())
                .collect();
            if stray.is_empty() {
                continue;
            }
            let targets: Vec<&str> = manifests
                .link_types()
                .filter(|(_, l)| l.resource_type_a == ta)
                .map(|(_, l)| l.resource_type_b.as_str())
                .collect();
            let can = if targets.is_empty() {
                format!("no installed provider declares links from {ta}")
            } else {
                format!("{ta} links to {}", targets.join(", "))
            };
            diags.push(
                Diagnostic::new(
                    &codes::LINK_UNSUPPORTED,
                    sel.span(),
                    format!(
                        "the linkSelector of `{name}` ({ta}) selects {} ({tb}), but no provider links {ta} to {tb}",
                        quoted(&stray)
                    ),
                )
                .with_hint(format!(
                    "{can}; add a label to the selector, or remove its labels from {}",
                    quoted(&stray)
                )),
            );
        }
    }
}

/// A selector with labels that selects nothing: points at the first label
/// no other resource carries, if there is one.
fn report_nothing(
    bp: &Blueprint,
    labels: &Labels<'_>,
    sel: &Selection<'_>,
    diags: &mut Diagnostics,
) {
    let name = &bp.resources[sel.index].name.value;
    let lonely = sel
        .selector
        .by_label
        .iter()
        .find(|(k, v)| !labels.carried(&k.name, &v.value, sel.index));
    let d = match lonely {
        Some((k, v)) => {
            let existing: Vec<String> = labels
                .order
                .iter()
                .filter(|(lk, lv)| labels.carried(lk, lv, sel.index))
                .map(|(lk, lv)| format!("{lk}: {lv}"))
                .collect();
            let written = format!("{}: {}", k.name, v.value);
            let hint = did_you_mean(&written, existing.iter().map(String::as_str))
                .map(|s| format!("did you mean `{s}`?"))
                .unwrap_or_else(|| {
                    "labels match exactly, in the same blueprint (not in child blueprints)"
                        .to_owned()
                });
            Diagnostic::new(
                &codes::LINK_SELECTS_NOTHING,
                k.span,
                format!(
                    "the linkSelector of `{name}` selects nothing: no other resource has the label `{written}`"
                ),
            )
            .with_hint(hint)
        }
        None => {
            let all: Vec<String> = sel
                .selector
                .by_label
                .iter()
                .map(|(k, v)| format!("{}: {}", k.name, v.value))
                .collect();
            Diagnostic::new(
                &codes::LINK_SELECTS_NOTHING,
                sel.span(),
                format!(
                    "the linkSelector of `{name}` selects nothing: no other resource has all of the labels {}",
                    quoted(&all)
                ),
            )
            .with_hint("a selector selects the resources that carry ALL of its labels")
        }
    };
    diags.push(d);
}

/// Whether an annotation definition of link type `l` applies to resources of
/// type `ty`: its `applies_to` names the type, or is empty and the type is
/// either end of the link type.
fn applies(d: &AnnotationDef, l: &LinkTypeDef, ty: &str) -> bool {
    d.applies_to == ty
        || (d.applies_to.is_empty() && (l.resource_type_a == ty || l.resource_type_b == ty))
}

fn static_of(t: SchemaType) -> Static {
    match t {
        SchemaType::String => Static::String,
        SchemaType::Integer => Static::Integer,
        SchemaType::Float => Static::Float,
        SchemaType::Boolean => Static::Boolean,
        SchemaType::Array => Static::Array,
        SchemaType::Object | SchemaType::Map => Static::Object,
        SchemaType::Any | SchemaType::Unspecified => Static::Any,
    }
}

/// Type and allowed values of every annotation a link type defines for the
/// resource's type (whether or not the resource is linked: a wrong value is
/// wrong either way), and unknown annotations in a linking provider's
/// namespace.
fn check_annotations(
    bp: &Blueprint,
    manifests: &Manifests,
    links: &[Selected<'_>],
    functions: &dyn FunctionCatalog,
    diags: &mut Diagnostics,
) {
    let typer = Typer { bp, functions };
    for (i, r) in bp.resources.iter().enumerate() {
        if r.metadata.annotations.is_empty() {
            continue;
        }
        let Some(ty) = known_type(r, manifests) else {
            continue;
        };
        let applicable: Vec<(&LinkTypeDef, &AnnotationDef)> = manifests
            .link_types()
            .flat_map(|(_, l)| {
                l.annotations
                    .iter()
                    .filter(move |d| applies(d, l, ty))
                    .map(move |d| (l, d))
            })
            .collect();
        // The link types this resource takes part in: their definitions
        // come first when several define the same annotation.
        let linked: Vec<&LinkTypeDef> = links
            .iter()
            .filter(|s| s.plan.index_a == i || s.plan.index_b == i)
            .map(|s| s.def)
            .collect();
        for (k, v) in &r.metadata.annotations {
            let named: Vec<&(&LinkTypeDef, &AnnotationDef)> = applicable
                .iter()
                .filter(|(_, d)| d.name == k.name)
                .collect();
            let chosen = named
                .iter()
                .find(|(l, _)| linked.iter().any(|x| std::ptr::eq(*x, *l)))
                .or(named.first());
            match chosen {
                Some(&&(l, d)) => check_value(r, &k.name, v, l, d, &typer, diags),
                None => unknown_annotation(r, ty, &k.name, k.span, manifests, &applicable, diags),
            }
        }
    }
}

fn check_value(
    r: &Resource,
    key: &str,
    node: &TNode,
    l: &LinkTypeDef,
    d: &AnnotationDef,
    typer: &Typer<'_>,
    diags: &mut Diagnostics,
) {
    let (got, literal) = match &node.kind {
        // Not a scalar: already reported when the blueprint was loaded.
        TKind::Null | TKind::List(_) | TKind::Map(_) => return,
        TKind::Bool(_) => (Static::Boolean, true),
        TKind::Int(_) => (Static::Integer, true),
        TKind::Float(_) => (Static::Float, true),
        TKind::Str(t) => (typer.template(t), !t.has_substitutions()),
    };
    // Allowed values are checked on literals here, on `${..}` once evaluated (at plan time).
    let value = if literal { literal_value(node) } else { None };
    if let Some((code, message, hint)) =
        annotation_problem(key, &r.name.value, l, d, got, value.as_ref(), literal)
    {
        diags.push(Diagnostic::new(code, node.span, message).with_hint(hint));
    }
}

/// An annotation value known only once evaluated (written with `${..}`) checked against its
/// definition in a link type: the type, then the allowed values. The problem, if any.
pub fn check_evaluated_annotation(
    key: &str,
    resource: &str,
    l: &LinkTypeDef,
    d: &AnnotationDef,
    value: &pb::Value,
) -> Option<(&'static crate::diag::Code, String, String)> {
    use pb::value::Kind;
    let got = match &value.kind {
        Some(Kind::String(_)) => Static::String,
        Some(Kind::Int(_)) => Static::Integer,
        Some(Kind::Float(_)) => Static::Float,
        Some(Kind::Bool(_)) => Static::Boolean,
        // Lists, maps and nulls are refused where the blueprint is read; unknown is checked
        // at deploy, when it is known.
        _ => return None,
    };
    annotation_problem(key, resource, l, d, got, Some(value), false)
}

/// What is wrong with an annotation of type `got` (and, when known, `value`) against its
/// definition `d` in link type `l`: its code, message and hint. `literal`: written as a plain
/// value in the document, so quoting it is a fix worth suggesting.
fn annotation_problem(
    key: &str,
    resource: &str,
    l: &LinkTypeDef,
    d: &AnnotationDef,
    got: Static,
    value: Option<&pb::Value>,
    literal: bool,
) -> Option<(&'static crate::diag::Code, String, String)> {
    let link = format!("{}::{}", l.resource_type_a, l.resource_type_b);
    let want = static_of(SchemaType::try_from(d.r#type).unwrap_or(SchemaType::Any));
    if !got.fits(want) {
        let mut hint = format!("defined by the link type `{link}`");
        if !d.description.is_empty() {
            hint.push_str(&format!(": {}", d.description));
        }
        if literal && want == Static::String {
            hint.push_str("; quote the value to make it a string");
        }
        return Some((
            &codes::LINK_ANNOTATION_TYPE,
            format!(
                "annotation `{key}` of resource `{resource}` must be {}, found {}",
                article_of(want.as_str()),
                article_of(got.as_str())
            ),
            hint,
        ));
    }
    let value = value?;
    if d.allowed_values.is_empty() || d.allowed_values.iter().any(|a| same(a, value)) {
        return None;
    }
    let allowed: Vec<String> = d.allowed_values.iter().map(render).collect();
    Some((
        &codes::LINK_ANNOTATION_NOT_ALLOWED,
        format!(
            "annotation `{key}` of resource `{resource}` is {}, which is not an allowed value",
            render(value)
        ),
        format!("allowed: {} (the link type `{link}`)", allowed.join(", ")),
    ))
}

/// An annotation no link type defines for the resource's type: reported
/// only when its first segment is the namespace of a provider that declares
/// link types (`local.envFile.nmae`), since other annotations may mean
/// something to tools outside the engine.
fn unknown_annotation(
    r: &Resource,
    ty: &str,
    key: &str,
    span: Span,
    manifests: &Manifests,
    applicable: &[(&LinkTypeDef, &AnnotationDef)],
    diags: &mut Diagnostics,
) {
    let Some((ns, _)) = key.split_once('.') else {
        return;
    };
    if !manifests.link_types().any(|(p, _)| p == ns) {
        return;
    }
    let mut names: Vec<&str> = Vec::new();
    for (_, d) in applicable {
        if !names.contains(&d.name.as_str()) {
            names.push(&d.name);
        }
    }
    // Types the annotation is defined for, when it exists for other types.
    let mut elsewhere: Vec<&str> = Vec::new();
    for (_, l) in manifests.link_types() {
        for d in l.annotations.iter().filter(|d| d.name == key) {
            let on = if d.applies_to.is_empty() {
                l.resource_type_b.as_str()
            } else {
                d.applies_to.as_str()
            };
            if !elsewhere.contains(&on) {
                elsewhere.push(on);
            }
        }
    }
    let hint = if !elsewhere.is_empty() {
        format!("`{key}` is set on {}", elsewhere.join(", "))
    } else if let Some(s) = did_you_mean(key, names.iter().copied()) {
        format!("did you mean `{s}`?")
    } else if !names.is_empty() {
        format!("annotations of {ty}: {}", quoted(&names))
    } else {
        format!("no link type defines annotations for {ty}")
    };
    diags.push(
        Diagnostic::new(
            &codes::LINK_ANNOTATION_UNKNOWN,
            span,
            format!(
                "annotation `{key}` of resource `{}` is in the `{ns}` namespace, but no link type defines it for {ty}",
                r.name.value
            ),
        )
        .with_hint(hint),
    );
}

/// Required annotations (without a default) missing on a linked resource:
/// one error per resource and annotation, at the resource's name.
fn check_required(bp: &Blueprint, links: &[Selected<'_>], diags: &mut Diagnostics) {
    let mut seen: HashSet<(usize, &str)> = HashSet::new();
    for s in links {
        let p = &s.plan;
        for d in s
            .def
            .annotations
            .iter()
            .filter(|d| d.required && d.default.is_none())
        {
            for (side, i) in [(Side::A, p.index_a), (Side::B, p.index_b)] {
                let r = &bp.resources[i];
                let ty = r.ty.as_ref().map_or("", |t| t.value.as_str());
                if !applies(d, s.def, ty)
                    || r.metadata.annotations.iter().any(|(k, _)| k.name == d.name)
                    || !seen.insert((i, d.name.as_str()))
                {
                    continue;
                }
                let how = match side {
                    Side::A => format!("links to `{}`", p.resource_b),
                    Side::B => format!("is linked from `{}`", p.resource_a),
                };
                let mut hint = format!("add `{}` under `metadata.annotations`", d.name);
                if !d.description.is_empty() {
                    hint.push_str(&format!(": {}", d.description));
                }
                diags.push(
                    Diagnostic::new(
                        &codes::LINK_ANNOTATION_MISSING,
                        r.name.span,
                        format!(
                            "resource `{}` {how} by the link type `{}`, which requires the annotation `{}` on it",
                            r.name.value, p.link_type, d.name
                        ),
                    )
                    .with_hint(hint),
                );
            }
        }
    }
}

/// Cycles in the deployment order once hard links are added to the
/// reference graph (references and `dependsOn`). Cycles of references alone
/// are T0601's; a cycle is reported here when a hard link closes it. One
/// report per strongly connected component, naming a cycle through its
/// first hard link, from the member declared first.
fn check_cycles(
    bp: &Blueprint,
    links: &[Selected<'_>],
    functions: &dyn FunctionCatalog,
    diags: &mut Diagnostics,
) {
    if !links.iter().any(|s| s.plan.kind == LinkKind::Hard) {
        return;
    }
    // The reference graph again (validation built it before the provider
    // checks ran); its diagnostics were reported then.
    let opts = Options {
        functions,
        providers: None,
        variables: &[],
        unchecked_functions: false,
    };
    let src = SourceFile::new("", String::new());
    let graph = refs::check(bp, &src, &opts, &mut Diagnostics::default());
    let mut edges = graph.edges.clone();
    // (from, to, link): `from` is deployed after `to`.
    let mut link_edges: Vec<(usize, usize, usize)> = Vec::new();
    for (n, s) in links.iter().enumerate() {
        let Some((first, then)) = (match (s.plan.kind, s.plan.priority) {
            (LinkKind::Soft, _) => None,
            (LinkKind::Hard, Side::A) => Some((s.plan.index_a, s.plan.index_b)),
            (LinkKind::Hard, Side::B) => Some((s.plan.index_b, s.plan.index_a)),
        }) else {
            continue;
        };
        let u = graph.index(NodeRef::Resource(then));
        let v = graph.index(NodeRef::Resource(first));
        if edges[u].iter().any(|&(w, _)| w == v) {
            continue;
        }
        edges[u].push((v, s.span));
        link_edges.push((u, v, n));
    }
    for comp in strongly_connected(&edges) {
        if comp.len() < 2 {
            continue;
        }
        let inside = |x: usize| comp.binary_search(&x).is_ok();
        let Some(&(u, v, _)) = comp.iter().find_map(|&m| {
            link_edges
                .iter()
                .find(|&&(from, to, _)| from == m && inside(to))
        }) else {
            continue;
        };
        let Some(path) = shortest_path(&edges, v, u, &inside) else {
            continue;
        };
        let mut cycle = vec![u];
        cycle.extend_from_slice(&path[..path.len() - 1]);
        let start = cycle
            .iter()
            .enumerate()
            .min_by_key(|&(_, &x)| x)
            .map_or(0, |(p, _)| p);
        cycle.rotate_left(start);
        let name = |x: usize| describe(bp, graph.nodes[x]);
        let mut chain: Vec<String> = cycle.iter().map(|&x| name(x)).collect();
        chain.push(name(cycle[0]));
        let mut details = Vec::new();
        let mut span = None;
        for (p, &x) in cycle.iter().enumerate() {
            let y = cycle[(p + 1) % cycle.len()];
            if let Some(&(_, _, n)) = link_edges.iter().find(|&&(f, t, _)| f == x && t == y) {
                let s = &links[n];
                span.get_or_insert(s.span);
                details.push(format!(
                    "{} -> {} is the hard link `{}`, which deploys `{}` first",
                    name(x),
                    name(y),
                    s.plan.link_type,
                    s.plan.order().map_or("", |(first, _)| first)
                ));
            }
        }
        let Some(span) = span else { continue };
        diags.push(
            Diagnostic::new(
                &codes::LINK_CYCLE,
                span,
                format!(
                    "hard links make a deployment cycle: {} ({})",
                    chain.join(" -> "),
                    details.join("; ")
                ),
            )
            .with_hint(
                "each resource in the cycle waits for the next one; remove a reference or `dependsOn`, or change labels so these resources are not linked",
            ),
        );
    }
}

/// The shortest path from `from` to `to` (both included) through nodes
/// `inside`, following edges in the order they were written.
fn shortest_path(
    edges: &[Vec<(usize, Span)>],
    from: usize,
    to: usize,
    inside: &dyn Fn(usize) -> bool,
) -> Option<Vec<usize>> {
    let mut prev = vec![usize::MAX; edges.len()];
    let mut seen = vec![false; edges.len()];
    let mut queue = VecDeque::from([from]);
    seen[from] = true;
    while let Some(x) = queue.pop_front() {
        if x == to {
            let mut path = vec![to];
            let mut cur = to;
            while cur != from {
                cur = prev[cur];
                path.push(cur);
            }
            path.reverse();
            return Some(path);
        }
        for &(w, _) in &edges[x] {
            if inside(w) && !seen[w] {
                seen[w] = true;
                prev[w] = x;
                queue.push_back(w);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(each_a: bool, each_b: bool, kind: LinkKind, priority: Side) -> LinkPlan {
        LinkPlan {
            resource_a: "env".into(),
            resource_b: "conf".into(),
            index_a: 0,
            index_b: 1,
            each_a,
            each_b,
            link_type: "local/envFile::local/file".into(),
            provider: "local".into(),
            kind,
            priority,
        }
    }

    #[test]
    fn element_pairs_cross_every_element() {
        let p = plan(false, true, LinkKind::Soft, Side::A);
        assert_eq!(
            p.element_pairs(5, 2),
            [
                ("env".to_owned(), "conf_0".to_owned()),
                ("env".to_owned(), "conf_1".to_owned())
            ]
        );
        let p = plan(true, true, LinkKind::Soft, Side::A);
        assert_eq!(p.element_pairs(2, 2).len(), 4);
        assert!(p.element_pairs(0, 2).is_empty());
    }

    #[test]
    fn order_follows_priority_for_hard_links_only() {
        assert_eq!(plan(false, false, LinkKind::Soft, Side::B).order(), None);
        assert_eq!(
            plan(false, false, LinkKind::Hard, Side::B).order(),
            Some(("conf", "env"))
        );
        assert_eq!(
            plan(false, false, LinkKind::Hard, Side::A).order(),
            Some(("env", "conf"))
        );
    }

    #[test]
    fn evaluated_annotations_are_checked_for_type_and_allowed_values() {
        let string = |s: &str| pb::Value {
            kind: Some(pb::value::Kind::String(s.into())),
            sensitive: false,
        };
        let def = AnnotationDef {
            name: "x.tier".into(),
            applies_to: "x/b".into(),
            r#type: SchemaType::String as i32,
            allowed_values: vec![string("gold"), string("silver")],
            ..AnnotationDef::default()
        };
        let link = LinkTypeDef {
            resource_type_a: "x/a".into(),
            resource_type_b: "x/b".into(),
            annotations: vec![def.clone()],
            ..LinkTypeDef::default()
        };
        let check = |v: &pb::Value| check_evaluated_annotation("x.tier", "b", &link, &def, v);
        assert_eq!(check(&string("gold")), None);
        let (code, message, hint) = check(&string("bronze")).unwrap();
        assert_eq!(code.id, codes::LINK_ANNOTATION_NOT_ALLOWED.id);
        assert_eq!(
            message,
            "annotation `x.tier` of resource `b` is \"bronze\", which is not an allowed value"
        );
        assert_eq!(
            hint,
            "allowed: \"gold\", \"silver\" (the link type `x/a::x/b`)"
        );
        let int = pb::Value {
            kind: Some(pb::value::Kind::Int(3)),
            sensitive: false,
        };
        assert_eq!(check(&int).unwrap().0.id, codes::LINK_ANNOTATION_TYPE.id);
        // Unknown until deploy: nothing to say yet.
        assert_eq!(check(&pb::Value::default()), None);
    }
}
