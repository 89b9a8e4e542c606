//! Drawing a resource graph for people: Graphviz DOT and Mermaid, each edge kind drawn its own way.
//!
//! Nodes show `type.class#id` and the definition; nodes are grouped by app. No input or output
//! value is drawn, so no secret can reach a picture.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{EdgeKind, ResourceGraph, ResourceNode};

/// How each edge kind looks: (DOT attributes, Mermaid arrow, colour).
fn style(kind: EdgeKind) -> (&'static str, &'static str, &'static str) {
    match kind {
        EdgeKind::Reference => ("style=solid, color=\"#1f77b4\"", "-->", "#1f77b4"),
        EdgeKind::Dependency => ("style=bold, color=\"#333333\"", "==>", "#333333"),
        EdgeKind::Coprovision => ("style=dashed, color=\"#2ca02c\"", "-.->", "#2ca02c"),
        EdgeKind::Selector => ("style=dotted, color=\"#d62728\"", "-.->", "#d62728"),
        EdgeKind::Implicit => ("style=dashed, color=\"#999999\"", "-.->", "#999999"),
    }
}

fn by_app(graph: &ResourceGraph) -> BTreeMap<Option<&str>, Vec<&ResourceNode>> {
    let mut apps: BTreeMap<Option<&str>, Vec<&ResourceNode>> = BTreeMap::new();
    for n in graph.nodes() {
        apps.entry(n.app.as_deref()).or_default().push(n);
    }
    for nodes in apps.values_mut() {
        nodes.sort_by_key(|n| (&n.res_type, &n.res_id, &n.class));
    }
    apps
}

fn node_id(n: &ResourceNode) -> String {
    format!("r{}", &n.guresid.as_str()[..16])
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The graph in Graphviz DOT; render with `dot -Tsvg`.
pub fn to_dot(graph: &ResourceGraph, commit: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", dot_escape(&graph.env));
    let _ = writeln!(
        out,
        "  label=\"{} @ {}\"; labelloc=t; rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\", fontsize=10];",
        dot_escape(&graph.env),
        &commit[..commit.len().min(12)]
    );
    for (i, (app, nodes)) in by_app(graph).into_iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_{i} {{");
        let _ = writeln!(
            out,
            "    label=\"{}\"; style=dashed; color=\"#bbbbbb\";",
            dot_escape(app.unwrap_or("(global)"))
        );
        for n in nodes {
            let _ = writeln!(
                out,
                "    {} [label=\"{}.{}#{}\\n{}\"];",
                node_id(n),
                dot_escape(&n.res_type),
                dot_escape(&n.class),
                dot_escape(&n.res_id),
                dot_escape(&n.definition)
            );
        }
        let _ = writeln!(out, "  }}");
    }
    for e in graph.edges() {
        let (Some(from), Some(to)) = (graph.get(&e.from), graph.get(&e.to)) else {
            continue;
        };
        let (attrs, _, _) = style(e.kind);
        let _ = writeln!(
            out,
            "  {} -> {} [{attrs}, label=\"{}\"];",
            node_id(from),
            node_id(to),
            e.kind
        );
    }
    out.push_str("}\n");
    out
}

fn mermaid_escape(s: &str) -> String {
    s.replace('"', "#quot;")
        .replace('<', "#lt;")
        .replace('>', "#gt;")
}

/// The graph as a Mermaid flowchart; GitHub renders it in a ```mermaid block.
pub fn to_mermaid(graph: &ResourceGraph, commit: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "---\ntitle: {} @ {}\n---\nflowchart LR",
        mermaid_escape(&graph.env),
        &commit[..commit.len().min(12)]
    );
    for (i, (app, nodes)) in by_app(graph).into_iter().enumerate() {
        let _ = writeln!(
            out,
            "  subgraph app{i} [\"{}\"]",
            mermaid_escape(app.unwrap_or("(global)"))
        );
        for n in nodes {
            let _ = writeln!(
                out,
                "    {}[\"{}.{}#{}<br/><i>{}</i>\"]",
                node_id(n),
                mermaid_escape(&n.res_type),
                mermaid_escape(&n.class),
                mermaid_escape(&n.res_id),
                mermaid_escape(&n.definition)
            );
        }
        let _ = writeln!(out, "  end");
    }
    let mut link_styles = String::new();
    for (i, e) in graph.edges().iter().enumerate() {
        let (Some(from), Some(to)) = (graph.get(&e.from), graph.get(&e.to)) else {
            continue;
        };
        let (_, arrow, colour) = style(e.kind);
        let _ = writeln!(
            out,
            "  {} {arrow}|{}| {}",
            node_id(from),
            e.kind,
            node_id(to)
        );
        let dash = match e.kind {
            EdgeKind::Selector => ",stroke-dasharray:2 2",
            EdgeKind::Coprovision | EdgeKind::Implicit => ",stroke-dasharray:6 4",
            _ => "",
        };
        let _ = writeln!(link_styles, "  linkStyle {i} stroke:{colour}{dash}");
    }
    out.push_str(&link_styles);
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::template_files;
    use super::*;

    fn graph() -> ResourceGraph {
        let repo = crate::model::load(&template_files()).unwrap();
        super::super::build(&repo, &repo.environments[0]).unwrap()
    }

    #[test]
    fn dot_has_every_node_and_edge_with_its_style() {
        let g = graph();
        let dot = to_dot(&g, "0123456789abcdef");
        assert!(dot.starts_with("digraph \"development\" {"));
        assert!(dot.contains("label=\"development @ 0123456789ab\""));
        assert_eq!(dot.matches(" [label=\"").count(), g.len());
        assert_eq!(dot.matches(" -> ").count(), g.edges().len());
        assert!(dot.contains("postgres.default#modules.backend.externals.db\\npostgres-dev"));
        assert!(dot.contains("style=solid, color=\"#1f77b4\", label=\"reference\""));
        assert!(dot.contains("subgraph cluster_0 {\n    label=\"shop\""));
        assert!(!dot.contains("dev-password"), "no input values are drawn");
    }

    #[test]
    fn mermaid_draws_each_kind_differently() {
        let g = graph();
        let m = to_mermaid(&g, "abc");
        assert!(m.contains("flowchart LR"));
        assert_eq!(m.matches("-->|reference|").count(), g.edges().len());
        assert_eq!(m.matches("linkStyle ").count(), g.edges().len());
        assert!(m.contains("subgraph app0 [\"shop\"]"));
        assert_eq!(style(EdgeKind::Dependency).1, "==>");
        assert_ne!(style(EdgeKind::Coprovision), style(EdgeKind::Selector));
    }
}
