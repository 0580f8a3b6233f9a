//! `tree -o dot` and `tree -o mermaid`: the topology the labels describe, as a picture.
//!
//! Network nodes are nested boxes, the top layer outermost, each with its node counts; a
//! Kubernetes node sits in the box of the network node its instance hangs off, NotReady and
//! tainted ones marked. A leaf with many nodes shows its marked ones first and folds the rest
//! into one "+N more" box (the switch boxes still grow with the fleet, about one per leaf). One
//! walk ([`draw`]) feeds both formats; each only spells what it is given.
//!
//! Owns: the pictures. Pure: no I/O.

use std::fmt::Write as _;

use crate::tree::{Domain, Forest, TreeNode};

/// At most this many Kubernetes nodes are drawn in one box; the rest are counted in one.
pub const SHOWN_PER_BOX: usize = 8;

/// What a box is, for its colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A network node at this layer (1: the top).
    Layer(usize),
    Ready,
    NotReady,
    Tainted,
    /// Nodes folded into one box.
    More,
    /// The box of nodes without topology labels.
    Unlabelled,
    /// Labels that do not form one tree.
    Warning,
}

impl Class {
    fn name(self) -> String {
        match self {
            Class::Layer(n) => format!("layer{n}"),
            Class::Ready => "ready".into(),
            Class::NotReady => "notready".into(),
            Class::Tainted => "tainted".into(),
            Class::More => "more".into(),
            Class::Unlabelled => "unlabelled".into(),
            Class::Warning => "warning".into(),
        }
    }

    /// (fill, stroke, dashed).
    fn colours(self) -> (&'static str, &'static str, bool) {
        match self {
            Class::Layer(n) => (
                match (n.max(1) - 1) % 4 {
                    0 => "#e3f2fd",
                    1 => "#e8f5e9",
                    2 => "#fff8e1",
                    _ => "#f3e5f5",
                },
                "#78909c",
                false,
            ),
            Class::Ready => ("#ffffff", "#607d8b", false),
            Class::NotReady => ("#ffcdd2", "#c62828", false),
            Class::Tainted => ("#ffe0b2", "#ef6c00", false),
            Class::More => ("#ffffff", "#90a4ae", true),
            Class::Unlabelled => ("#eeeeee", "#757575", true),
            Class::Warning => ("#fff59d", "#f9a825", false),
        }
    }

    const ALL_BUT_LAYERS: [Class; 6] = [
        Class::Ready,
        Class::NotReady,
        Class::Tainted,
        Class::More,
        Class::Unlabelled,
        Class::Warning,
    ];
}

/// What a picture format is told, in drawing order.
trait Sink {
    /// A box holding what follows until its [`Sink::close`].
    fn open(&mut self, id: &str, lines: &[String], class: Class, depth: usize);
    fn close(&mut self, depth: usize);
    fn item(&mut self, id: &str, lines: &[String], class: Class, depth: usize);
    fn finish(self, title: &str, layers: usize) -> String;
}

/// The whole forest as a Graphviz graph (`dot -Tsvg`).
pub fn dot(forest: &Forest) -> String {
    draw(forest, Dot::default())
}

/// The whole forest as a Mermaid flowchart (GitHub and most Markdown viewers draw it).
pub fn mermaid(forest: &Forest) -> String {
    draw(forest, Mermaid::default())
}

fn draw(forest: &Forest, mut sink: impl Sink) -> String {
    let mut ids = Ids::default();
    let mut layers = 0;
    for d in forest.roots.values() {
        domain(&mut sink, &mut ids, d, 1, &mut layers);
    }
    if !forest.missing.is_empty() {
        let nodes: Vec<TreeNode> = forest
            .missing
            .iter()
            .map(|name| TreeNode {
                name: name.clone(),
                // Readiness is not what this box is about.
                ready: Some(true),
                note: forest.missing_notes.get(name).cloned(),
                tainted: forest.missing_tainted.contains(name),
                ultraserver: None,
            })
            .collect();
        let id = ids.next("u");
        let lines = vec![
            "without topology labels".to_string(),
            count_line(nodes.len(), None, forest.missing_tainted.len()),
        ];
        sink.open(&id, &lines, Class::Unlabelled, 1);
        members(&mut sink, &mut ids, &nodes, 2);
        sink.close(1);
    }
    for c in forest.conflicts.iter().take(SHOWN_PER_BOX) {
        let lines = vec![
            "inconsistent labels".to_string(),
            format!(
                "{} (layer {}) under {}",
                c.network_node,
                c.layer,
                c.parents.join(", ")
            ),
        ];
        sink.item(&ids.next("w"), &lines, Class::Warning, 1);
    }
    if let Some(rest) = forest
        .conflicts
        .len()
        .checked_sub(SHOWN_PER_BOX)
        .filter(|n| *n > 0)
    {
        let lines = vec![format!("+{rest} more inconsistent labels (see `tree`)")];
        sink.item(&ids.next("w"), &lines, Class::Warning, 1);
    }
    let title = format!(
        "{} top-level network nodes, {} nodes labelled, {} without topology labels",
        forest.roots.len(),
        forest.nodes_labelled(),
        forest.missing.len()
    );
    sink.finish(&title, layers)
}

fn domain(sink: &mut impl Sink, ids: &mut Ids, d: &Domain, depth: usize, layers: &mut usize) {
    *layers = (*layers).max(d.layer);
    let lines = vec![
        d.id.clone(),
        format!(
            "layer {} · {}",
            d.layer,
            count_line(d.nodes_total, Some(d.nodes_ready), tainted_under(d))
        ),
    ];
    let id = ids.next("d");
    sink.open(&id, &lines, Class::Layer(d.layer), depth);
    for c in d.children.values() {
        domain(sink, ids, c, depth + 1, layers);
    }
    members(sink, ids, &d.nodes, depth + 1);
    sink.close(depth);
}

/// "12 nodes, 11 ready, 1 tainted".
fn count_line(total: usize, ready: Option<usize>, tainted: usize) -> String {
    let mut s = format!("{total} node{}", if total == 1 { "" } else { "s" });
    if let Some(r) = ready {
        let _ = write!(s, ", {r} ready");
    }
    if tainted > 0 {
        let _ = write!(s, ", {tainted} tainted");
    }
    s
}

fn tainted_under(d: &Domain) -> usize {
    d.nodes.iter().filter(|n| n.tainted).count()
        + d.children.values().map(tainted_under).sum::<usize>()
}

fn class_of(n: &TreeNode) -> Class {
    if n.ready != Some(true) {
        Class::NotReady
    } else if n.tainted {
        Class::Tainted
    } else {
        Class::Ready
    }
}

/// The nodes of one box: the marked ones first, then by name, at most [`SHOWN_PER_BOX`]; the
/// rest counted in one box.
fn members(sink: &mut impl Sink, ids: &mut Ids, nodes: &[TreeNode], depth: usize) {
    let mut order: Vec<&TreeNode> = nodes.iter().collect();
    order.sort_by(|a, b| {
        let rank = |n: &TreeNode| match class_of(n) {
            Class::NotReady => 0,
            Class::Tainted => 1,
            _ => 2,
        };
        (rank(a), &a.name).cmp(&(rank(b), &b.name))
    });
    let shown = if order.len() > SHOWN_PER_BOX {
        // Room for the "+N more" box.
        SHOWN_PER_BOX - 1
    } else {
        order.len()
    };
    let (first, rest) = order.split_at(shown.min(order.len()));
    for n in first {
        let mut lines = vec![n.name.clone()];
        match n.ready {
            Some(true) => {}
            Some(false) => lines.push("NotReady".into()),
            None => lines.push("Ready unknown".into()),
        }
        if let Some(note) = &n.note {
            lines.push(note.clone());
        }
        sink.item(&ids.next("n"), &lines, class_of(n), depth);
    }
    if !rest.is_empty() {
        let not_ready = rest.iter().filter(|n| n.ready != Some(true)).count();
        let tainted = rest.iter().filter(|n| n.tainted).count();
        let mut lines = vec![format!("+{} more", rest.len())];
        if not_ready + tainted > 0 {
            lines.push(format!("{not_ready} not ready, {tainted} tainted"));
        }
        sink.item(&ids.next("n"), &lines, Class::More, depth);
    }
}

/// Ids for the picture's boxes: names and network-node IDs are what the boxes say, not what
/// they are called (neither format takes every character in an id).
#[derive(Default)]
struct Ids(usize);

impl Ids {
    fn next(&mut self, prefix: &str) -> String {
        self.0 += 1;
        format!("{prefix}{}", self.0)
    }
}

#[derive(Default)]
struct Dot {
    body: String,
}

/// A DOT quoted string: `"` and `\` escaped, lines joined by DOT's `\n`.
fn dot_label(lines: &[String]) -> String {
    let escaped: Vec<String> = lines
        .iter()
        .map(|l| l.replace('\\', "\\\\").replace('"', "\\\""))
        .collect();
    format!("\"{}\"", escaped.join("\\n"))
}

/// A box's DOT style, fill and stroke attributes, joined by `sep` (`; ` in a cluster, `, ` in a
/// node's list).
fn dot_style(class: Class, sep: &str) -> String {
    let (fill, stroke, dashed) = class.colours();
    let style = if dashed {
        "rounded,filled,dashed"
    } else {
        "rounded,filled"
    };
    [
        format!("style=\"{style}\""),
        format!("fillcolor=\"{fill}\""),
        format!("color=\"{stroke}\""),
    ]
    .join(sep)
}

fn indent(depth: usize) -> String {
    "  ".repeat(depth)
}

impl Sink for Dot {
    fn open(&mut self, id: &str, lines: &[String], class: Class, depth: usize) {
        let pad = indent(depth);
        let _ = writeln!(
            self.body,
            "{pad}subgraph cluster_{id} {{\n{pad}  label={}; {};",
            dot_label(lines),
            dot_style(class, "; ")
        );
    }

    fn close(&mut self, depth: usize) {
        let _ = writeln!(self.body, "{}}}", indent(depth));
    }

    fn item(&mut self, id: &str, lines: &[String], class: Class, depth: usize) {
        let _ = writeln!(
            self.body,
            "{}{id} [label={}, {}];",
            indent(depth),
            dot_label(lines),
            dot_style(class, ", ")
        );
    }

    fn finish(self, title: &str, _layers: usize) -> String {
        format!(
            "digraph topology {{\n  graph [label={}, labelloc=t, fontname=\"Helvetica\", rankdir=TB];\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n{}}}\n",
            dot_label(&[title.to_string()]),
            self.body
        )
    }
}

#[derive(Default)]
struct Mermaid {
    body: String,
    /// (class, ids) for the `class` lines at the end.
    classed: Vec<(Class, String)>,
}

/// A Mermaid label: quoted, with `"`, `#`, `<` and `>` as entity codes, lines joined by
/// `<br>`.
fn mermaid_label(lines: &[String]) -> String {
    let escaped: Vec<String> = lines
        .iter()
        .map(|l| {
            l.replace('#', "#35;")
                .replace('"', "#quot;")
                .replace('<', "#lt;")
                .replace('>', "#gt;")
        })
        .collect();
    format!("\"{}\"", escaped.join("<br>"))
}

impl Sink for Mermaid {
    fn open(&mut self, id: &str, lines: &[String], class: Class, depth: usize) {
        let _ = writeln!(
            self.body,
            "{}subgraph {id}[{}]",
            indent(depth),
            mermaid_label(lines)
        );
        self.classed.push((class, id.to_string()));
    }

    fn close(&mut self, depth: usize) {
        let _ = writeln!(self.body, "{}end", indent(depth));
    }

    fn item(&mut self, id: &str, lines: &[String], class: Class, depth: usize) {
        let _ = writeln!(
            self.body,
            "{}{id}[{}]:::{}",
            indent(depth),
            mermaid_label(lines),
            class.name()
        );
    }

    fn finish(self, title: &str, layers: usize) -> String {
        let mut out = format!(
            "---\ntitle: {}\n---\nflowchart TB\n{}",
            mermaid_label(&[title.to_string()]),
            self.body
        );
        let classes = (1..=layers.max(1))
            .map(Class::Layer)
            .chain(Class::ALL_BUT_LAYERS);
        for class in classes {
            let (fill, stroke, dashed) = class.colours();
            let dash = if dashed { ",stroke-dasharray:4 3" } else { "" };
            let _ = writeln!(
                out,
                "  classDef {} fill:{fill},stroke:{stroke}{dash}",
                class.name()
            );
        }
        // Subgraphs take their class by id (the `:::` shorthand is for nodes).
        for class in (1..=layers.max(1))
            .map(Class::Layer)
            .chain([Class::Unlabelled])
        {
            let ids: Vec<&str> = self
                .classed
                .iter()
                .filter(|(c, _)| *c == class)
                .map(|(_, id)| id.as_str())
                .collect();
            if !ids.is_empty() {
                let _ = writeln!(out, "  class {} {}", ids.join(","), class.name());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        labels::LabelScheme,
        tree::{Forest, NodeView},
    };

    fn view(name: &str, ready: Option<bool>, tainted: bool, path: &[&str]) -> NodeView {
        NodeView {
            ready,
            tainted,
            note: tainted.then(|| "startup taint ec2-topology-labeler.io/topology-pending".into()),
            ..NodeView::labelled(name, &LabelScheme::default(), path)
        }
    }

    fn fleet() -> Forest {
        Forest::build(
            &LabelScheme::default(),
            &[
                view(
                    "gpu-a",
                    Some(true),
                    false,
                    &["nn-spine", "nn-agg-1", "nn-leaf-1"],
                ),
                view(
                    "gpu-b",
                    Some(false),
                    false,
                    &["nn-spine", "nn-agg-1", "nn-leaf-1"],
                ),
                view(
                    "gpu-c",
                    Some(true),
                    true,
                    &["nn-spine", "nn-agg-2", "nn-leaf-2"],
                ),
                NodeView {
                    labels: Default::default(),
                    ..view("fresh", None, true, &[])
                },
            ],
        )
    }

    /// The line of `text` that contains `needle`.
    fn line<'a>(text: &'a str, needle: &str) -> &'a str {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in\n{text}"))
    }

    #[test]
    fn dot_nests_network_nodes_top_first_and_marks_not_ready_and_tainted_nodes() {
        let text = dot(&fleet());
        assert!(text.starts_with("digraph topology {\n"), "{text}");
        assert!(
            text.contains("1 top-level network nodes, 3 nodes labelled, 1 without topology labels"),
            "{text}"
        );
        // Nesting: each box opens inside the one above it, by indentation.
        let spine = line(&text, "cluster_d1 {");
        let agg = line(&text, "cluster_d2 {");
        let leaf = line(&text, "cluster_d3 {");
        assert!(spine.starts_with("  subgraph") && agg.starts_with("    subgraph"));
        assert!(leaf.starts_with("      subgraph"), "{text}");
        assert!(
            text.contains("label=\"nn-spine\\nlayer 1 · 3 nodes, 2 ready, 1 tainted\""),
            "{text}"
        );
        assert!(
            text.contains("label=\"nn-leaf-1\\nlayer 3 · 2 nodes, 1 ready\""),
            "{text}"
        );
        assert!(line(&text, "\"gpu-b\\nNotReady\"").contains("fillcolor=\"#ffcdd2\""));
        assert!(line(&text, "\"gpu-c\\nstartup taint").contains("fillcolor=\"#ffe0b2\""));
        assert!(line(&text, "label=\"gpu-a\"").contains("fillcolor=\"#ffffff\""));
        assert!(
            text.contains(
                "  subgraph cluster_u9 {\n    label=\"without topology labels\\n1 node, 1 tainted\""
            ),
            "{text}"
        );
        assert!(line(&text, "\"fresh\\nstartup taint").contains("fillcolor=\"#ffe0b2\""));
        assert_eq!(
            text.matches('{').count(),
            text.matches('}').count(),
            "{text}"
        );
    }

    #[test]
    fn mermaid_nests_subgraphs_and_classes_every_box() {
        let text = mermaid(&fleet());
        assert!(text.contains("\nflowchart TB\n"), "{text}");
        assert_eq!(
            text.lines()
                .filter(|l| l.trim_start().starts_with("subgraph "))
                .count(),
            text.lines().filter(|l| l.trim() == "end").count(),
            "{text}"
        );
        assert!(
            line(&text, "subgraph d1[")
                .contains("nn-spine<br>layer 1 · 3 nodes, 2 ready, 1 tainted")
        );
        assert!(line(&text, "gpu-b<br>NotReady").ends_with(":::notready"));
        assert!(line(&text, "\"gpu-c<br>startup taint").ends_with(":::tainted"));
        assert!(line(&text, "\"gpu-a\"").ends_with(":::ready"));
        assert!(text.contains("  class d1 layer1\n"), "{text}");
        assert!(text.contains("  class d2,d6 layer2\n"), "{text}");
        assert!(text.contains("classDef notready fill:#ffcdd2,stroke:#c62828\n"));
        assert!(text.contains("  class u9 unlabelled\n"), "{text}");
    }

    #[test]
    fn a_big_box_shows_its_marked_nodes_first_and_folds_the_rest() {
        let path = ["nn-s", "nn-a", "nn-l"];
        let mut nodes: Vec<NodeView> = (0..30)
            .map(|i| view(&format!("n{i:02}"), Some(true), false, &path))
            .collect();
        nodes[25].ready = Some(false);
        nodes[27].tainted = true;
        nodes[3].ready = None;
        let text = mermaid(&Forest::build(&LabelScheme::default(), &nodes));
        let drawn: Vec<&str> = text.lines().filter(|l| l.contains(":::")).collect();
        assert_eq!(drawn.len(), SHOWN_PER_BOX, "{text}");
        assert!(drawn[0].contains("n03<br>Ready unknown") && drawn[0].ends_with(":::notready"));
        assert!(drawn[1].contains("n25<br>NotReady"));
        assert!(drawn[2].contains("\"n27\"") && drawn[2].ends_with(":::tainted"));
        assert!(drawn[3].contains("\"n00\""), "then by name: {text}");
        let more = drawn[SHOWN_PER_BOX - 1];
        assert!(
            more.contains("+23 more") && more.ends_with(":::more"),
            "{more}"
        );
        assert!(
            !more.contains("not ready"),
            "the marked ones are all drawn: {more}"
        );
    }

    #[test]
    fn what_a_label_says_cannot_break_out_of_it() {
        let lines = vec!["a\"b\\c".to_string(), "<x>#y".to_string()];
        assert_eq!(dot_label(&lines), r#""a\"b\\c\n<x>#y""#);
        assert_eq!(mermaid_label(&lines), "\"a#quot;b\\c<br>#lt;x#gt;#35;y\"");
    }

    #[test]
    fn conflicts_beyond_a_box_are_counted_not_dropped() {
        let f = Forest {
            conflicts: (0..10)
                .map(|i| crate::tree::Conflict {
                    network_node: format!("nn-{i}"),
                    layer: 3,
                    parents: vec!["nn-a".into(), "nn-b".into()],
                })
                .collect(),
            ..Forest::default()
        };
        let text = mermaid(&f);
        let warned: Vec<&str> = text.lines().filter(|l| l.ends_with(":::warning")).collect();
        assert_eq!(warned.len(), SHOWN_PER_BOX + 1, "{text}");
        assert!(
            warned[SHOWN_PER_BOX].contains("+2 more inconsistent labels"),
            "{text}"
        );
    }

    #[test]
    fn an_empty_cluster_is_a_titled_empty_picture() {
        let f = Forest::default();
        assert_eq!(
            dot(&f),
            "digraph topology {\n  graph [label=\"0 top-level network nodes, 0 nodes labelled, 0 without topology labels\", labelloc=t, fontname=\"Helvetica\", rankdir=TB];\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n}\n"
        );
        assert!(mermaid(&f).contains("flowchart TB\n  classDef layer1"));
    }
}
