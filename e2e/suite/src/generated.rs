//! A part of a doc written by a test: between `<!-- BEGIN GENERATED: NAME -->` and
//! `<!-- END GENERATED: NAME -->`, compared with what the test computes, or rewritten with
//! `UPDATE_DOCS=1` (`make docs`). The same markers as the controller's own doc tables
//! (`src/testing/docs.rs`, which only the controller crate's unit tests can reach).

/// Compare (or, with `UPDATE_DOCS=1`, rewrite) the part `name` of `file` (relative to the
/// repository's root) with `want`; `how` says which test writes it.
pub fn check(file: &str, name: &str, want: &str, how: &str) {
    let path = crate::repo_root().join(file);
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let (begin, end) = (
        format!("<!-- BEGIN GENERATED: {name} -->\n"),
        format!("<!-- END GENERATED: {name} -->"),
    );
    let (head, rest) = doc
        .split_once(&begin)
        .unwrap_or_else(|| panic!("{file} lacks the markers of the generated part {name}"));
    let (have, tail) = rest
        .split_once(&end)
        .unwrap_or_else(|| panic!("{file} lacks the end marker of {name}"));
    if have == want {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{head}{begin}{want}{end}{tail}"))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        return;
    }
    panic!(
        "{file}: the generated part {name} is stale; run `UPDATE_DOCS=1 {how}` (or `make docs`)\n--- in the file ---\n{have}\n--- computed ---\n{want}"
    );
}
