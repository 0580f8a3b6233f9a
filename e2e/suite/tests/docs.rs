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

/// docs/architecture.md names only paths that exist, every module under `src/` (a file, or a
/// folder of them) and every crate under `crates/`: a room renamed, removed or added without the
/// page fails here.
#[test]
fn the_architecture_page_names_every_room_and_only_rooms_that_exist() {
    let root = e2e::repo_root();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the page");
    let named: Vec<&str> = page
        .split(|c: char| c.is_whitespace() || "`()[]<>\",".contains(c))
        .map(|w| w.trim_end_matches(['.', ':', ';']))
        .filter(|w| w.starts_with("src/") || w.starts_with("crates/"))
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
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let name = entry
            .expect("an entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let path = format!("crates/{name}/src/");
        if !named.iter().any(|n| n.starts_with(&path)) {
            unnamed.push(path);
        }
    }
    assert!(
        unnamed.is_empty(),
        "modules the page does not name: {unnamed:?}"
    );
}

/// The order of the rooms docs/architecture.md states ("The order of the rooms": a numbered
/// list, lowest first) holds in the code: every `crate::` path of a room's code (its tests
/// aside) names a room lower in the list, or its own. A room the list does not place fails
/// here too.
#[test]
fn the_rooms_import_only_downward() {
    let root = e2e::repo_root();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the page");
    let list = page
        .split("\n## The order of the rooms\n")
        .nth(1)
        .expect("the page has a section \"The order of the rooms\"");
    // Rank of each room: `src/NAME/` → NAME, `crates/NAME` → crates/NAME.
    let mut rank = std::collections::BTreeMap::new();
    for line in list.lines().take_while(|l| !l.starts_with("## ")) {
        let Some((n, rest)) = line.split_once(". ") else {
            continue;
        };
        let Ok(n) = n.parse::<usize>() else { continue };
        for room in rest.split('`').skip(1).step_by(2) {
            let key = room
                .strip_prefix("src/")
                .map_or(room, |r| r.trim_end_matches('/'));
            rank.insert(key.to_string(), n);
        }
    }
    // What `crate::NAME` means in the controller: a room, or a module lib.rs re-exports.
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("src/lib.rs");
    let reexported = |krate: &str| -> Vec<String> {
        let at = lib
            .find(&format!("pub use {krate}::{{"))
            .unwrap_or_else(|| panic!("src/lib.rs re-exports {krate}"));
        let list = &lib[at..];
        list[list.find('{').unwrap_or(0) + 1..list.find('}').unwrap_or(0)]
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let mut owner = std::collections::BTreeMap::new();
    for (krate, room) in [
        ("ec2_topology_core", "crates/core"),
        ("ec2_topology_kit", "crates/kit"),
    ] {
        for name in reexported(krate) {
            owner.insert(name, room.to_string());
        }
    }
    owner.insert("lookup".into(), "crates/lookup".into());
    let mut unplaced = Vec::new();
    let mut rooms = Vec::new();
    for entry in std::fs::read_dir(root.join("src")).expect("src/") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            owner.insert(name.clone(), name.clone());
            if name != "testing" {
                rooms.push((name, path));
            }
        }
    }
    for (name, _) in &rooms {
        if !rank.contains_key(name) {
            unplaced.push(format!("src/{name}/"));
        }
    }
    for c in ["crates/core", "crates/kit", "crates/lookup"] {
        if !rank.contains_key(c) {
            unplaced.push(c.to_string());
        }
    }
    assert!(
        unplaced.is_empty(),
        "rooms the order does not place: {unplaced:?}"
    );
    let mut upward = Vec::new();
    let mut seen = 0;
    for (room, dir) in &rooms {
        for file in rust_files(dir) {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue; // a test module of its own file
            }
            let text = std::fs::read_to_string(&file).expect("a source file");
            for path in module_paths(&without_tests(&text)) {
                if path[0] != "crate" || path.len() < 2 {
                    continue;
                }
                let name = &path[1];
                seen += 1;
                let Some(to) = owner.get(name) else {
                    continue; // the crate root's own items: Error, Result, FIELD_MANAGER
                };
                if to != room && rank[to] >= rank[room] {
                    upward.push(format!(
                        "{} -> {to} ({room} is {}, {to} is {})",
                        file.strip_prefix(&root).unwrap_or(&file).display(),
                        rank[room],
                        rank[to]
                    ));
                }
            }
        }
    }
    assert!(seen > 100, "the code's paths are read ({seen})");
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports going up docs/architecture.md's order of the rooms:\n{}",
        upward.join("\n")
    );
}

fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The code of a file without its comments and its `#[cfg(test)]` modules (rustfmt puts a
/// top-level module's closing brace alone at the start of a line).
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "#[cfg(test)]"
            && lines.peek().is_some_and(|l| {
                l.trim_start_matches("pub(crate) ").starts_with("mod ") && l.ends_with('{')
            })
        {
            for inner in lines.by_ref() {
                if inner == "}" {
                    break;
                }
            }
            continue;
        }
        if !line.trim_start().starts_with("//") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every `crate::` and `super::` path of the code, as its segments (`crate::a::b::C` → crate, a,
/// b, C; `crate::{a::b, c}` → crate, a, b and crate, c; a group's own groups end the path).
fn module_paths(code: &str) -> Vec<Vec<String>> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let segments = |s: &str| -> (Vec<String>, usize) {
        // `a::b::c` from the start of s, and where it ends.
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let rest = &s[at..];
            let word: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if word.is_empty() {
                break;
            }
            at += word.len();
            out.push(word);
            if s[at..].starts_with("::") && s[at + 2..].starts_with(is_ident) {
                at += 2;
            } else {
                break;
            }
        }
        (out, at)
    };
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = ["crate::", "super::"]
        .iter()
        .filter_map(|k| code[from..].find(k).map(|i| from + i))
        .min()
    {
        from = found + "crate".len(); // both keywords are five letters
        if code[..found]
            .chars()
            .next_back()
            .is_some_and(|c| is_ident(c) || c == '$')
        {
            continue; // a name ending in "crate" or "super", or a macro's $crate
        }
        let (head, end) = segments(&code[found..]);
        let after = &code[found + end..];
        let Some(group) = after.strip_prefix("::{") else {
            out.push(head);
            continue;
        };
        let mut depth = 1;
        let mut item = String::new();
        let mut items = Vec::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                break;
            }
            if depth == 1 && c == ',' {
                items.push(std::mem::take(&mut item));
            } else {
                item.push(c);
            }
        }
        items.push(item);
        for item in items {
            let (tail, _) = segments(item.trim());
            if !tail.is_empty() {
                out.push(head.iter().cloned().chain(tail).collect());
            }
        }
    }
    out
}

/// No module of the controller imports back one that imports it, directly or through others
/// (a module's own parent and children aside: `super::` and `mod.rs`'s re-exports): the module
/// graph is derived from every `crate::` and `super::` path of the code, tests aside.
#[test]
fn no_module_imports_itself_back() {
    let root = e2e::repo_root();
    let src = root.join("src");
    let mut modules: std::collections::BTreeMap<Vec<String>, std::path::PathBuf> =
        Default::default();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap_or(&file).with_extension("");
        let mut path: Vec<String> = rel
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if path.last().is_some_and(|l| l == "mod") {
            path.pop();
        }
        let top = path.first().cloned().unwrap_or_default();
        if path.len() < 2 && (top == "lib" || top == "main")
            || top == "testing"
            || path.last().is_some_and(|l| l == "tests")
        {
            continue;
        }
        modules.insert(path, file);
    }
    let mut edges: std::collections::BTreeMap<
        Vec<String>,
        std::collections::BTreeSet<Vec<String>>,
    > = Default::default();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("a source file");
        for path in module_paths(&without_tests(&text)) {
            let mut full: Vec<String> = if path[0] == "crate" {
                Vec::new()
            } else {
                module.clone()
            };
            for seg in &path {
                match seg.as_str() {
                    "crate" => {}
                    "super" => {
                        full.pop();
                    }
                    s => full.push(s.to_string()),
                }
            }
            // The module the path names: its longest prefix that is one.
            let target = (1..=full.len())
                .rev()
                .map(|k| full[..k].to_vec())
                .find(|p| modules.contains_key(p));
            if let Some(target) = target
                && !module.starts_with(&target)
                && !target.starts_with(module)
            {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    assert!(
        edges.values().map(|e| e.len()).sum::<usize>() > 100,
        "the module graph is read"
    );
    // A loop: a module reached again from itself.
    let mut loops = Vec::new();
    for start in modules.keys() {
        let mut stack = vec![(start.clone(), vec![start.join("::")])];
        let mut seen = std::collections::BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    loops.push(format!("{} -> {}", trail.join(" -> "), start.join("::")));
                } else if seen.insert(next.clone()) {
                    let mut t = trail.clone();
                    t.push(next.join("::"));
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    assert!(loops.is_empty(), "import loops:\n{}", loops.join("\n"));
}

/// The walls the architecture page states between crates hold in what is built: everything
/// `ec2-topology-lookup` links, all the way down (`cargo tree`, normal and build dependencies,
/// every feature, every target; its tests' mock-ec2 is not linked), includes nothing of
/// Kubernetes and of ours only core and kit, and `ec2-topology-core` and `ec2-topology-kit`
/// link no crate of ours.
#[test]
fn the_crates_walls_hold_in_what_is_linked() {
    let linked = |package: &str| -> Vec<String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .current_dir(e2e::repo_root())
            .args([
                "tree",
                "--locked",
                "--offline",
                "-e",
                "normal,build",
                "--prefix",
                "none",
            ])
            .args(["--all-features", "--target", "all"])
            .args(["--format", "{p}", "-p", package])
            .output()
            .expect("cargo tree runs");
        assert!(
            out.status.success(),
            "cargo tree -p {package}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1) // the package itself
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    let lookup = linked("ec2-topology-lookup");
    assert!(
        lookup.iter().any(|n| n == "aws-sigv4"),
        "the tree is read: {lookup:?}"
    );
    let kubernetes: Vec<&String> = lookup
        .iter()
        .filter(|n| n.starts_with("kube") || n.starts_with("k8s-"))
        .collect();
    assert!(
        kubernetes.is_empty(),
        "ec2-topology-lookup links {kubernetes:?}"
    );
    let mut ours: Vec<&str> = lookup
        .iter()
        .map(String::as_str)
        .filter(|n| n.starts_with("ec2-topology-") || *n == "mock-ec2" || *n == "e2e")
        .collect();
    ours.sort_unstable();
    ours.dedup();
    assert_eq!(
        ours,
        ["ec2-topology-core", "ec2-topology-kit"],
        "ec2-topology-lookup links of ours only the core and the kit"
    );
    for leaf in ["ec2-topology-core", "ec2-topology-kit"] {
        let ours: Vec<String> = linked(leaf)
            .into_iter()
            .filter(|n| n.starts_with("ec2-topology-") || n == "mock-ec2" || n == "e2e")
            .collect();
        assert!(ours.is_empty(), "{leaf} links crates of ours: {ours:?}");
    }
}

/// A figure a doc copies from a benchmark's CSV carries its source in a comment right after it,
/// and equals it, written with as many decimals as the doc gives:
///
/// ```text
/// 10,000 nodes installed in 23.0 s<!-- fig: scale nodes=10000 build=musl install_s -->
/// about 430<!-- fig: scale nodes=100000 build=musl nodes/install_s --> nodes a second
/// ```
///
/// `scale` is docs/benchmarks-scale.csv, `everything` docs/benchmarks-scale-everything.csv; each
/// `column=value` picks rows (the latest date of those left); then one column, or one divided by
/// another. `UPDATE_DOCS=1` writes the CSV's figures into the docs.
#[test]
fn figures_in_the_docs_are_the_measurements() {
    let root = e2e::repo_root();
    let mut files: Vec<std::path::PathBuf> = ["README.md", "CHANGELOG.md", "SECURITY.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    for dir in ["docs", "charts/ec2-topology-labeler"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("a doc folder") {
            let path = entry.expect("an entry").path();
            let name = path.to_string_lossy();
            if name.ends_with(".md") || name.ends_with(".gotmpl") {
                files.push(path);
            }
        }
    }
    let update = std::env::var_os("UPDATE_DOCS").is_some();
    let (mut checked, mut wrong) = (0, Vec::new());
    for path in files {
        let text = std::fs::read_to_string(&path).expect("a doc");
        let mut out = String::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("<!-- fig:") {
            let (before, from) = rest.split_at(at);
            let end = from.find("-->").expect("a fig comment ends") + 3;
            let spec = from[9..end - 3].trim();
            let value = figure(&root, spec)
                .unwrap_or_else(|e| panic!("{}: <!-- fig: {spec} -->: {e}", path.display()));
            let (head, written) = number_before(before).unwrap_or_else(|| {
                panic!("{}: no figure before <!-- fig: {spec} -->", path.display())
            });
            let decimals = written.split_once('.').map_or(0, |(_, d)| d.len());
            let want = written_like(value, decimals, written.contains(','));
            checked += 1;
            if want != written {
                wrong.push(format!(
                    "{}: {written:?} where {spec} is {want}",
                    path.strip_prefix(&root).unwrap_or(&path).display()
                ));
            }
            let tail = &before[head.len() + written.len()..];
            out.push_str(head);
            out.push_str(if update { &want } else { written });
            out.push_str(tail);
            out.push_str(&from[..end]);
            rest = &from[end..];
        }
        out.push_str(rest);
        if update && out != text {
            std::fs::write(&path, out).expect("the doc written");
        }
    }
    assert!(
        update || wrong.is_empty(),
        "figures that differ from their measurements (UPDATE_DOCS=1 writes them):\n{}",
        wrong.join("\n")
    );
    assert!(checked >= 5, "only {checked} figures are tied to the CSVs");
}

/// The text before `s`'s last number (within the last 16 characters: a unit may follow it) and
/// that number as written (`23.0`, `100,000`).
fn number_before(s: &str) -> Option<(&str, &str)> {
    let window = s.len().saturating_sub(16);
    let window = (window..=s.len()).find(|&i| s.is_char_boundary(i))?;
    let tail = &s[window..];
    let end = tail.rfind(|c: char| c.is_ascii_digit())? + 1;
    let start = tail[..end]
        .rfind(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .map_or(0, |i| i + 1);
    let number = tail[start..end].trim_start_matches([',', '.']);
    let start = end - number.len();
    Some((&s[..window + start], &s[window + start..window + end]))
}

/// `value` with `decimals` decimals (halves away from zero), thousands separated when `commas`.
fn written_like(value: f64, decimals: usize, commas: bool) -> String {
    let scale = 10f64.powi(decimals as i32);
    let s = format!("{:.decimals$}", (value * scale).round() / scale);
    if !commas {
        return s;
    }
    let (whole, frac) = s
        .split_once('.')
        .map_or((s.as_str(), None), |(w, f)| (w, Some(f)));
    let mut out = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(f) = frac {
        out.push('.');
        out.push_str(f);
    }
    out
}

/// The value a `fig` comment names (see [`figures_in_the_docs_are_the_measurements`]).
fn figure(root: &std::path::Path, spec: &str) -> Result<f64, String> {
    let mut words = spec.split_whitespace();
    let file = match words.next() {
        Some("scale") => "docs/benchmarks-scale.csv",
        Some("everything") => "docs/benchmarks-scale-everything.csv",
        other => return Err(format!("{other:?} is not a source (scale, everything)")),
    };
    let csv = std::fs::read_to_string(root.join(file)).map_err(|e| format!("{file}: {e}"))?;
    let header: Vec<&str> = csv.lines().next().unwrap_or_default().split(',').collect();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("{file} has no column {name}"))
    };
    let words: Vec<&str> = words.collect();
    let (expr, filters) = words.split_last().ok_or("no column")?;
    let mut picked: Vec<&Vec<&str>> = rows.iter().collect();
    for f in filters {
        let (k, v) = f
            .split_once('=')
            .ok_or_else(|| format!("{f:?} is not column=value"))?;
        let i = col(k)?;
        picked.retain(|r| r.get(i) == Some(&v));
    }
    let date = col("date")?;
    let row = picked
        .into_iter()
        .max_by_key(|r| r.get(date).copied().unwrap_or_default())
        .ok_or_else(|| format!("no row of {file} has {filters:?}"))?;
    let num = |name: &str| -> Result<f64, String> {
        let v = row.get(col(name)?).copied().unwrap_or_default();
        v.parse()
            .map_err(|_| format!("{name}={v:?} is not a number"))
    };
    match expr.split_once('/') {
        Some((a, b)) => Ok(num(a)? / num(b)?),
        None => num(expr),
    }
}

/// docs/startup-taint.md's table of how long a node is held is the "join N/s, startup taint"
/// rows of docs/benchmarks.md (`make bench` writes those); `UPDATE_DOCS=1` writes it.
#[test]
fn startup_taint_join_rates_are_the_benchmarks_rows() {
    let root = e2e::repo_root();
    let bench = std::fs::read_to_string(root.join("docs/benchmarks.md")).expect("benchmarks.md");
    let mut want = String::from(
        "| join rate | nodes | release p50 / p99 (s) | first label p50 / p99 (s) | EC2 calls | node writes |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    // The columns read below, by position: refuse a table laid out otherwise.
    assert!(
        bench.contains("| scenario | nodes | time (s) | p50 / p99 latency (s) | EC2 calls (throttled) | node writes | peak RSS (MiB) | CPU (s) | notes |"),
        "docs/benchmarks.md's table has other columns: update this test"
    );
    let mut rows = 0;
    for line in bench.lines() {
        let f: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let Some(rate) = f
            .first()
            .and_then(|s| s.strip_prefix("join "))
            .and_then(|s| s.strip_suffix(", startup taint"))
        else {
            continue;
        };
        let first_label = f[8]
            .split("to the first label p50/p99 ")
            .nth(1)
            .and_then(|s| s.strip_suffix(" s"))
            .expect("the first label's latency in the notes");
        let calls = f[4].split(' ').next().unwrap_or_default();
        let thousands = |n: &str| {
            let n: u64 = n.parse().expect("a count");
            if n >= 1000 {
                format!("{},{:03}", n / 1000, n % 1000)
            } else {
                n.to_string()
            }
        };
        want += &format!(
            "| {rate} | {} | {} | {first_label} | {calls} | {} |\n",
            thousands(f[1]),
            f[3],
            thousands(f[5])
        );
        rows += 1;
    }
    assert!(rows >= 3, "{rows} join-rate rows in benchmarks.md");
    e2e::generated::check(
        "docs/startup-taint.md",
        "join-rates",
        &want,
        "cargo test --workspace --test docs",
    );
}

/// The first word after `key` on a line of `file` that starts with it (`key v1.2.3 // ...`).
fn pinned(file: &str, key: &str) -> String {
    let text = std::fs::read_to_string(e2e::repo_root().join(file)).expect("a pin file");
    text.lines()
        .map(str::trim)
        .map(|l| l.strip_prefix("require ").unwrap_or(l))
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .map(|v| v.trim_matches(['"', '=']).to_string())
        .unwrap_or_else(|| panic!("{file}: no {key}"))
}

/// docs/compatibility.md's matrix is written from the pins the tests build: the two control
/// planes the e2e suite runs on, the chart's kubeVersion, the schedulers, Helm, the
/// architectures of the release.
#[test]
fn compatibility_matrix_is_the_pins() {
    let newest = pinned("e2e/controlplane/go.mod", "k8s.io/kubernetes ");
    let oldest = pinned("e2e/controlplane/oldest/go.mod", "k8s.io/kubernetes ");
    let etcd_new = pinned("e2e/controlplane/go.mod", "go.etcd.io/etcd/server/v3 ");
    let etcd_old = pinned(
        "e2e/controlplane/oldest/go.mod",
        "go.etcd.io/etcd/server/v3 ",
    );
    let kube_version = pinned("charts/ec2-topology-labeler/Chart.yaml", "kubeVersion: ");
    let minor = |v: &str| {
        v.trim_start_matches('v')
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join(".")
    };
    assert!(
        kube_version.starts_with(&format!(">={}.0", minor(&oldest))),
        "the chart accepts {kube_version}, the oldest tested is {oldest}"
    );
    // What runs at the oldest version: the scenarios AT_THE_OLDEST names in the e2e suite (it
    // refuses a name that is no scenario), never KAI's placement (its scheduler needs 1.34).
    let suite =
        std::fs::read_to_string(e2e::repo_root().join("e2e/suite/tests/e2e.rs")).expect("e2e.rs");
    let list = suite
        .split_once("const AT_THE_OLDEST: &[&str] = &[")
        .and_then(|(_, rest)| rest.split_once("];"))
        .expect("AT_THE_OLDEST in e2e/suite/tests/e2e.rs")
        .0;
    let at_oldest = list
        .lines()
        .filter(|l| l.trim_start().starts_with('"'))
        .count();
    let all = suite.matches("        scenario!(").count();
    assert!(
        at_oldest > 0 && at_oldest < all,
        "{at_oldest} of {all} scenarios"
    );
    assert!(
        !list.contains("\"kai_places_gangs_on_our_topology\""),
        "KAI's scheduler at its pinned commit needs Kubernetes 1.34"
    );
    let makefile = std::fs::read_to_string(e2e::repo_root().join("Makefile")).expect("Makefile");
    assert!(
        makefile.contains(
            "E2E_AT_THE_OLDEST=1 E2E_CONTROLPLANE_BIN=$$(e2e/controlplane/build.sh --oldest)"
        ),
        "make test runs the oldest pass"
    );
    let kueue = pinned("e2e/schedulers/kueue/go.mod", "sigs.k8s.io/kueue ");
    let volcano = pinned("e2e/schedulers/volcano/go.mod", "volcano.sh/volcano ");
    let kai = pinned("e2e/schedulers/kai/source.sh", "KAI_COMMIT=");
    let karpenter = pinned("e2e/schedulers/karpenter/crds.sh", "version=");
    let helm = pinned("e2e/tools/go.mod", "helm.sh/helm/v3 ");
    let release =
        std::fs::read_to_string(e2e::repo_root().join("hack/release.sh")).expect("release.sh");
    let platforms: Vec<&str> = ["linux/amd64", "linux/arm64"]
        .into_iter()
        .filter(|p| release.contains(&format!("]={p}")))
        .collect();
    assert_eq!(platforms.len(), 2, "hack/release.sh's platforms");
    let want = format!(
        "| Part | Tested | How |\n\
         | --- | --- | --- |\n\
         | Kubernetes | {newest} (etcd {etcd_new}) | the e2e suite on a real kube-apiserver and etcd (`make test`, e2e/controlplane/go.mod); the kind suite's nodes (`make kind`) |\n\
         | Kubernetes, oldest the chart accepts (`kubeVersion: {kube_version}`) | {oldest} (etcd {etcd_old}) | the e2e scenarios that rest on what the API server does, again (`make test`, e2e/controlplane/oldest/go.mod; {at_oldest} scenarios, `AT_THE_OLDEST` in e2e/suite/tests/e2e.rs): server-side apply, the status subresource, Leases, watches, RBAC, Events, admission policies, CRDs and the schedulers reading them, Helm's hooks |\n\
         | Kueue | {kueue} | its manager against the e2e API server: Topology, TAS admission (e2e/schedulers/kueue/go.mod) |\n\
         | Volcano | {volcano} | its scheduler and controllers: HyperNodes and gang placement (e2e/schedulers/volcano/go.mod) |\n\
         | KAI Scheduler | commit {short} | its scheduler, binder and pod grouper: Topology placement (e2e/schedulers/kai/source.sh), at {newest} only: KAI's scheduler lists `resource.k8s.io/v1` (GA in Kubernetes 1.34); our KAI Topologies are checked at both |\n\
         | Karpenter | {karpenter} (CRDs) | the startup-taint recipes' NodePools accepted by its CRDs (e2e/schedulers/karpenter/crds.sh) |\n\
         | Slurm | 22.05 (Debian bookworm) and Debian sid's (25.05 or later) | the real slurmctld reads our `topology.conf` and `topology.yaml` (e2e/slurm/install.sh) |\n\
         | Helm | {helm} (3.14 or later for `--reset-then-reuse-values`) | install, upgrade, test, hooks (e2e/tools/go.mod) |\n\
         | Architectures | {} | one image index; amd64 runs in every suite, arm64 is cross-built and its ELF machine checked (hack/release.sh) |\n",
        platforms.join(", "),
        short = &kai[..12.min(kai.len())],
    );
    e2e::generated::check(
        "docs/compatibility.md",
        "matrix",
        &want,
        "cargo test --workspace --test docs",
    );
}
