//! Tests that keep generated parts of the docs in step with the code: each part sits between
//! `<!-- BEGIN GENERATED: NAME -->` and `<!-- END GENERATED: NAME -->` in its Markdown file and
//! is rewritten with `UPDATE_DOCS=1 cargo test --workspace --lib docs`.

/// Compare (or, with `UPDATE_DOCS=1`, rewrite) the part `name` of `file` (relative to the
/// repository's root) with `text`.
pub(crate) fn check_generated(file: &str, name: &str, text: &str) {
    // Tests run in parallel: one at a time reads and rewrites a file.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let begin = format!("<!-- BEGIN GENERATED: {name} -->\n");
    let end = format!("<!-- END GENERATED: {name} -->");
    let (Some(b), Some(e)) = (doc.find(&begin), doc.find(&end)) else {
        panic!("{file} lacks the markers of the generated part {name}");
    };
    let current = &doc[b + begin.len()..e];
    if current == text {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        let updated = format!("{}{text}{}", &doc[..b + begin.len()], &doc[e..]);
        std::fs::write(&path, updated).unwrap_or_else(|e| panic!("{file}: {e}"));
        return;
    }
    panic!(
        "{file}: the generated part {name} is stale; run `UPDATE_DOCS=1 cargo test --workspace --lib docs` (or `make docs`)\n--- in the file ---\n{current}\n--- from the code ---\n{text}"
    );
}

/// A Markdown table cell: pipes escaped, one line.
pub(crate) fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}
