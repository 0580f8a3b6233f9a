//! Docs as tests: every shell block of the docs an operator follows says, in a comment on the line
//! before it, whether the kind suite runs it as written or why not:
//!
//! ```text
//! <!-- doc-test: kind -->                          run against the kind cluster
//! <!-- doc-test: kind; expect: nn- -->             run, and its output must hold `nn-`
//! <!-- doc-test: kind-release -->                  the kind suite's release: e2e/kind/run.sh runs it
//!                                                  (REGISTRY: the suite's registry)
//! <!-- doc-test: kind-install -->                  the kind suite's install step runs it (REGISTRY
//!                                                  as above; its `helm` adds the kind values)
//! <!-- doc-test: aws-only: <why> -->               needs AWS itself (IAM, EKS, a real account)
//! <!-- doc-test: not-run: <why> -->                anything else, with the reason
//! ```
//!
//! `make test` checks that every block is marked (a block added without a mark fails); the kind
//! suite runs the `kind` blocks in the order of the docs, after the chart is installed and
//! upgraded, with `kubectl`, `helm` and `ec2-topology-labeler` on the PATH and the kind cluster
//! as the current context.

use std::path::Path;

use anyhow::{Context, bail};

/// The docs whose shell blocks are marked.
pub const DOCS: &[&str] = &[
    "README.md",
    "docs/install-eks.md",
    "docs/operations.md",
    "docs/upgrading.md",
    "docs/schedulers.md",
    "docs/startup-taint.md",
    "docs/migrating-from-hyperpod.md",
    "docs/migrating-from-topograph.md",
    "charts/ec2-topology-labeler/README.md",
    "SECURITY.md",
];

/// The languages of a shell block.
const SHELL: &[&str] = &["sh", "bash", "shell", "console"];

/// What a block's mark says.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    /// Run against the kind cluster; its output must hold each of these.
    Kind { expect: Vec<String> },
    /// The release the kind suite installs is made by this block (e2e/kind/run.sh).
    KindRelease,
    /// The kind suite installs the chart with this block.
    KindInstall,
    /// Needs AWS itself.
    AwsOnly { why: String },
    /// Not run, for this reason.
    NotRun { why: String },
}

/// One shell block of a doc.
#[derive(Debug, Clone)]
pub struct Block {
    pub file: String,
    /// Line of its opening fence (1-based).
    pub line: usize,
    pub code: String,
    pub mark: Option<Mark>,
}

impl Block {
    /// `file:line`, for messages.
    pub fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// The mark in `line`, if it is one (`Err` when it is a malformed one).
pub fn parse_mark(line: &str) -> anyhow::Result<Option<Mark>> {
    let Some(body) = line
        .trim()
        .strip_prefix("<!--")
        .and_then(|l| l.strip_suffix("-->"))
        .map(str::trim)
        .and_then(|l| l.strip_prefix("doc-test:"))
        .map(str::trim)
    else {
        return Ok(None);
    };
    let why = |rest: &str| -> anyhow::Result<String> {
        let why = rest.trim();
        if why.is_empty() {
            bail!("{line:?}: say why the block is not run");
        }
        Ok(why.to_string())
    };
    if let Some(rest) = body.strip_prefix("aws-only:") {
        return Ok(Some(Mark::AwsOnly { why: why(rest)? }));
    }
    if let Some(rest) = body.strip_prefix("not-run:") {
        return Ok(Some(Mark::NotRun { why: why(rest)? }));
    }
    match body {
        "kind-release" => return Ok(Some(Mark::KindRelease)),
        "kind-install" => return Ok(Some(Mark::KindInstall)),
        _ => {}
    }
    let mut parts = body.split(';').map(str::trim);
    if parts.next() != Some("kind") {
        bail!(
            "{line:?}: a doc-test mark is `kind`, `kind-release`, `kind-install`, `aws-only: why` or `not-run: why`"
        );
    }
    let expect = parts
        .map(|p| {
            p.strip_prefix("expect:")
                .map(|e| e.trim().to_string())
                .filter(|e| !e.is_empty())
                .with_context(|| format!("{line:?}: after `kind`, only `expect: TEXT`"))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Some(Mark::Kind { expect }))
}

/// The shell blocks of `text` (the doc `file`), each with the mark on the last non-blank line
/// before its fence.
pub fn blocks_of(file: &str, text: &str) -> anyhow::Result<Vec<Block>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(line) = lines.get(i) {
        let trimmed = line.trim_start();
        let Some(lang) = trimmed.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = line.len() - trimmed.len();
        let lang = lang.trim().to_string();
        let start = i;
        let mut code = Vec::new();
        i += 1;
        while let Some(l) = lines.get(i) {
            if l.trim() == "```" {
                break;
            }
            code.push(
                l.get(indent.min(l.len() - l.trim_start().len())..)
                    .unwrap_or(l),
            );
            i += 1;
        }
        i += 1;
        if !SHELL.contains(&lang.as_str()) {
            continue;
        }
        let before = lines
            .get(..start)
            .unwrap_or_default()
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .copied()
            .unwrap_or_default();
        let mark = parse_mark(before).with_context(|| format!("{file}:{start}"))?;
        out.push(Block {
            file: file.to_string(),
            line: start + 1,
            code: code.join("\n"),
            mark,
        });
    }
    Ok(out)
}

/// Every shell block of [`DOCS`] under `root`.
pub fn blocks(root: &Path) -> anyhow::Result<Vec<Block>> {
    let mut all = Vec::new();
    for file in DOCS {
        let text =
            std::fs::read_to_string(root.join(file)).with_context(|| format!("reading {file}"))?;
        all.extend(blocks_of(file, &text)?);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_read_as_written_and_refuse_what_they_do_not_know() {
        assert_eq!(parse_mark("text").unwrap(), None);
        assert_eq!(
            parse_mark("<!-- doc-test: kind -->").unwrap(),
            Some(Mark::Kind { expect: vec![] })
        );
        assert_eq!(
            parse_mark("  <!-- doc-test: kind; expect: nn-; expect: a b -->").unwrap(),
            Some(Mark::Kind {
                expect: vec!["nn-".into(), "a b".into()]
            })
        );
        assert_eq!(
            parse_mark("<!-- doc-test: aws-only: IAM -->").unwrap(),
            Some(Mark::AwsOnly { why: "IAM".into() })
        );
        assert!(
            parse_mark("<!-- doc-test: not-run: -->").is_err(),
            "a reason"
        );
        assert!(parse_mark("<!-- doc-test: maybe -->").is_err());
        assert!(parse_mark("<!-- doc-test: kind; expects: x -->").is_err());
    }

    #[test]
    fn blocks_carry_their_mark_line_and_code_dedented() {
        let doc = "intro\n<!-- doc-test: kind; expect: ok -->\n```sh\necho ok\n```\n\n1. step\n   <!-- doc-test: not-run: why -->\n   ```sh\n   kubectl get nodes\n     --indented\n   ```\n```json\n{}\n```\n```sh\nunmarked\n```\n";
        let b = blocks_of("d.md", doc).unwrap();
        assert_eq!(b.len(), 3, "{b:?}");
        assert_eq!(b[0].line, 3);
        assert_eq!(b[0].code, "echo ok");
        assert_eq!(
            b[0].mark,
            Some(Mark::Kind {
                expect: vec!["ok".into()]
            })
        );
        assert_eq!(b[1].code, "kubectl get nodes\n  --indented");
        assert_eq!(b[1].mark, Some(Mark::NotRun { why: "why".into() }));
        assert_eq!(b[2].mark, None);
    }
}
