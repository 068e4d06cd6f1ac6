//! The provider's reference (every resource type with its fields, every link, data source and
//! custom variable type) rendered from the schemas the provider serves, so README.md cannot
//! drift from the code: a test compares the README's reference section with this.

use std::fmt::Write;

use trellis_plugin_sdk::prelude::*;

/// Where the generated section sits in README.md.
pub const START: &str = "<!-- reference:start (generated from the schemas: TRELLIS_BLESS=1 cargo test -p trellis-provider-aws reference) -->";
pub const END: &str = "<!-- reference:end -->";

fn type_name(s: &Schema) -> String {
    match s.ty() {
        SchemaType::Array => format!("array of {}", s.items().map_or("any".to_owned(), type_name)),
        SchemaType::Map => format!("map of {}", s.values().map_or("any".to_owned(), type_name)),
        t => t.name().to_owned(),
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn rows(out: &mut String, prefix: &str, schema: &Schema) {
    for (name, f) in schema.fields() {
        let path = format!("{prefix}{name}");
        let mut notes = Vec::new();
        if f.is_required() {
            notes.push("required".to_owned());
        }
        if f.is_computed() {
            notes.push("computed".to_owned());
        }
        if f.is_must_recreate() {
            notes.push("replaces".to_owned());
        }
        if f.is_sensitive() {
            notes.push("sensitive".to_owned());
        }
        if let Some(d) = f.schema().default_value() {
            notes.push(format!("default `{}`", d.to_json()));
        }
        if !f.schema().allowed_values().is_empty() {
            let allowed: Vec<String> = f
                .schema()
                .allowed_values()
                .iter()
                .map(|v| format!("`{}`", v.to_json()))
                .collect();
            notes.push(format!("one of {}", allowed.join(", ")));
        }
        let _ = writeln!(
            out,
            "| `{path}` | {} | {} | {} |",
            type_name(f.schema()),
            cell(&notes.join(", ")),
            cell(f.schema().description())
        );
        let nested = match f.schema().ty() {
            SchemaType::Object => Some((f.schema(), format!("{path}."))),
            SchemaType::Array => f
                .schema()
                .items()
                .filter(|i| i.ty() == SchemaType::Object)
                .map(|i| (i, format!("{path}[]."))),
            _ => None,
        };
        if let Some((inner, p)) = nested {
            rows(out, &p, inner);
        }
    }
}

fn table(out: &mut String, schema: &Schema) {
    out.push_str("| field | type | notes | description |\n| --- | --- | --- | --- |\n");
    rows(out, "", schema);
    out.push('\n');
}

/// The reference section (between [`START`] and [`END`]).
pub fn markdown(p: &dyn Provider) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{START}\n");
    out.push_str("### Provider config\n\n");
    table(&mut out, &p.config_schema());

    let mut resources = p.resources();
    resources.sort_by(|a, b| a.type_name().cmp(b.type_name()));
    out.push_str("### Resource types\n\n");
    out.push_str("Notes: *replaces*: changing the field replaces the resource (AWS cannot update it in place); *computed*: set by the provider, readable as `${resources.<name>.spec.<field>}`.\n\n");
    for r in &resources {
        let _ = writeln!(out, "#### `{}`\n\n{}\n", r.type_name(), r.description());
        table(&mut out, &r.schema());
    }

    let mut links = p.links();
    links.sort_by_key(|l| l.link_type());
    out.push_str("### Links\n\n| A (selects) | B (selected) | what the link makes | annotations |\n| --- | --- | --- | --- |\n");
    for l in &links {
        let annotations: Vec<String> = l
            .annotations()
            .iter()
            .map(|a| format!("`{}` on `{}`: {}", a.name, a.applies_to, a.description))
            .collect();
        let _ = writeln!(
            out,
            "| `{}` | `{}` | {} | {} |",
            l.resource_type_a(),
            l.resource_type_b(),
            cell(l.description()),
            cell(&annotations.join("; "))
        );
    }
    out.push('\n');

    let mut sources = p.data_sources();
    sources.sort_by(|a, b| a.type_name().cmp(b.type_name()));
    if !sources.is_empty() {
        out.push_str("### Data sources\n\n");
        for d in &sources {
            let _ = writeln!(
                out,
                "#### `{}`\n\n{}\n\nExports:\n",
                d.type_name(),
                d.description()
            );
            table(&mut out, &d.exports());
        }
    }

    let mut vars = p.custom_variable_types();
    vars.sort_by(|a, b| a.type_name().cmp(b.type_name()));
    if !vars.is_empty() {
        out.push_str("### Custom variable types\n\n");
        for v in &vars {
            let _ = writeln!(out, "- `{}`: {}", v.type_name(), v.description());
        }
        out.push('\n');
    }
    out.push_str(END);
    out.push('\n');
    out
}
