//! docs/capabilities.md answers the Operator Framework's capability
//! questions of levels 4 and 5 with the tests that show each answer, named
//! `path::function`. A test renamed or removed fails here, and so does a
//! question answered with neither a test nor "no test yet". Reads files
//! only: no control plane.

use fixtures::repo_root;

/// Every `path::function` the document names in backticks, `path` being a
/// Rust file of the repository.
fn named_tests(markdown: &str) -> Vec<(String, String)> {
    markdown
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| {
            let (path, function) = code.split_once(".rs::")?;
            Some((format!("{path}.rs"), function.to_owned()))
        })
        .collect()
}

/// Whether `source` has a test function `name`: `fn name(` under
/// `#[test]` or `#[tokio::test]`, other attributes and comments between.
fn has_test(source: &str, name: &str) -> bool {
    let mut under_test = false;
    for line in source.lines().map(str::trim) {
        if line.starts_with("#[test]") || line.starts_with("#[tokio::test") {
            under_test = true;
        } else if line.starts_with("#[") || line.starts_with("//") {
            // Keeps what the attributes above said.
        } else {
            let signature = line
                .trim_start_matches("pub ")
                .trim_start_matches("async ")
                .strip_prefix("fn ");
            if under_test
                && signature
                    .and_then(|rest| rest.strip_prefix(name))
                    .is_some_and(|rest| rest.starts_with('('))
            {
                return true;
            }
            under_test = false;
        }
    }
    false
}

/// What is wrong with `markdown`'s answers: a named file that `read` does
/// not find, a test it does not hold, a question (a table row numbered in
/// its first cell) with neither a test nor "no test yet", a document that
/// names no test at all.
fn capability_problems(markdown: &str, read: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let named = named_tests(markdown);
    if named.is_empty() {
        problems.push("no test is named".to_owned());
    }
    for (path, function) in named {
        // Only files of the repository.
        if path.starts_with('/') || path.split('/').any(|part| part == "..") {
            problems.push(format!("{path}::{function}: not a path in the repository"));
            continue;
        }
        match read(&path) {
            None => problems.push(format!("{path}::{function}: no file {path}")),
            Some(source) if !has_test(&source, &function) => {
                problems.push(format!("{path}::{function}: no such test in {path}"));
            }
            Some(_) => {}
        }
    }
    for row in markdown.lines().filter(|line| line.starts_with("| ")) {
        let first = row.split('|').nth(1).unwrap_or_default().trim();
        let answered = row.contains(".rs::") || row.contains("no test yet");
        if first.parse::<u32>().is_ok() && !answered {
            problems.push(format!("question {first} names no test: {row}"));
        }
    }
    problems
}

/// Every test docs/capabilities.md names exists as a test function.
#[test]
fn every_test_the_capability_claims_name_exists() {
    let doc = std::fs::read_to_string(repo_root().join("docs/capabilities.md"))
        .expect("reading docs/capabilities.md");
    let problems = capability_problems(&doc, |path| {
        std::fs::read_to_string(repo_root().join(path)).ok()
    });
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checker itself: a test renamed, a file moved, a test that is a
/// plain function and a question left unanswered are each reported.
#[test]
fn capability_checker_reports_a_missing_test_and_an_unanswered_question() {
    let source = "\
#[cfg(test)]
mod tests {
    #[test]
    fn kept() {}

    /// Waits.
    #[tokio::test(flavor = \"multi_thread\")]
    #[ignore]
    async fn kept_async() {}

    fn helper() {}

    #[test]
    fn kept_longer_name() {}
}
";
    let read = |path: &str| (path == "src/a.rs").then(|| source.to_owned());
    let doc = "\
| # | question | answer | tests |
| --- | --- | --- | --- |
| 1 | Metrics? | Yes. | `src/a.rs::kept`, `src/a.rs::kept_async` |
| 2 | Events? | Yes. | `src/a.rs::renamed`, `src/a.rs::helper`, `src/a.rs::kept_longer` |
| 3 | Moved? | Yes. | `src/b.rs::kept`, `../a.rs::kept` |
| 4 | Scaling? | No. | none |
| 5 | Tuning? | No. | no test yet: not built |
";
    assert_eq!(
        capability_problems(doc, read),
        [
            "src/a.rs::renamed: no such test in src/a.rs",
            "src/a.rs::helper: no such test in src/a.rs",
            "src/a.rs::kept_longer: no such test in src/a.rs",
            "src/b.rs::kept: no file src/b.rs",
            "../a.rs::kept: not a path in the repository",
            "question 4 names no test: | 4 | Scaling? | No. | none |",
        ]
    );
    assert_eq!(
        capability_problems("| 1 | Metrics? | Yes. | no test yet |", read),
        ["no test is named"]
    );
}
