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
