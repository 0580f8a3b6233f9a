//! Every shell block of the docs an operator follows is marked: run as written by the kind suite
//! (`<!-- doc-test: kind -->`), or not, with why (see `e2e::doctest`). A block added without a
//! mark fails here, in `make test`, before any cluster starts.

use e2e::doctest::{self, Mark};

#[test]
fn every_shell_block_of_the_docs_says_whether_it_is_run() {
    let blocks = doctest::blocks(&e2e::repo_root()).expect("the docs read");
    let unmarked: Vec<String> = blocks
        .iter()
        .filter(|b| b.mark.is_none())
        .map(|b| format!("{}: {}", b.at(), b.code.lines().next().unwrap_or_default()))
        .collect();
    assert!(
        unmarked.is_empty(),
        "shell blocks without a doc-test mark (`<!-- doc-test: kind -->` on the line before, or `aws-only: why` / `not-run: why`):\n{}",
        unmarked.join("\n")
    );
    // The install from a clone before the first release is how the kind suite installs: one
    // block makes the release (e2e/kind/run.sh runs it), one installs it (the install step).
    for mark in [Mark::KindRelease, Mark::KindInstall] {
        let at: Vec<String> = blocks
            .iter()
            .filter(|b| b.mark.as_ref() == Some(&mark))
            .map(doctest::Block::at)
            .collect();
        assert!(
            at.len() == 1 && at[0].starts_with("README.md:"),
            "{mark:?}: one block, in README.md, not {at:?}"
        );
    }
    // The runbooks an operator reaches first are run, not only marked.
    for file in ["README.md", "docs/operations.md", "docs/install-eks.md"] {
        assert!(
            blocks
                .iter()
                .any(|b| b.file == file && matches!(b.mark, Some(Mark::Kind { .. }))),
            "{file}: no block is run by the kind suite"
        );
    }
}

/// docs/architecture.md names only paths that exist, and every module under `src/` (a file, or
/// a folder of them) and `crates/core/src/`: a room renamed, removed or added without the page
/// fails here.
#[test]
fn the_architecture_page_names_every_room_and_only_rooms_that_exist() {
    let root = e2e::repo_root();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the page");
    let named: Vec<&str> = page
        .split(|c: char| c.is_whitespace() || "`()[]<>\",".contains(c))
        .map(|w| w.trim_end_matches(['.', ':', ';']))
        .filter(|w| w.starts_with("src/") || w.starts_with("crates/core/src/"))
        .collect();
    let missing: Vec<&&str> = named
        .iter()
        .filter(|p| !root.join(p.trim_start_matches("../")).exists())
        .collect();
    assert!(missing.is_empty(), "named but not there: {missing:?}");
    let mut unnamed = Vec::new();
    for entry in std::fs::read_dir(root.join("src")).expect("src/") {
        let name = entry
            .expect("an entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if matches!(name.as_str(), "lib.rs") {
            continue;
        }
        let path = if name.ends_with(".rs") {
            format!("src/{name}")
        } else {
            format!("src/{name}/")
        };
        if !named
            .iter()
            .any(|n| n.starts_with(&path) || *n == path.trim_end_matches('/'))
        {
            unnamed.push(path);
        }
    }
    assert!(page.contains("crates/core/src/"), "the pure core is a room");
    assert!(
        unnamed.is_empty(),
        "modules the page does not name: {unnamed:?}"
    );
}
