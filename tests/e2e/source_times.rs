//! CI's warm build of a fresh clone (hack/source-times.sh): files whose
//! content the last successful build compiled get back their time, so cargo
//! compiles only what changed; after a build that failed, nothing is taken
//! for fresh. Shown with real git and cargo on a one-crate workspace.

use std::path::{Path, PathBuf};
use std::process::Command;

use fixtures::repo_root;

struct Repo {
    dir: tempfile::TempDir,
    clones: usize,
}

impl Repo {
    /// The origin: one library crate and the script, committed.
    fn new() -> Repo {
        let dir = tempfile::tempdir().expect("tempdir");
        let origin = dir.path().join("origin");
        std::fs::create_dir_all(origin.join("hack")).expect("mkdir");
        std::fs::create_dir_all(origin.join("src")).expect("mkdir");
        std::fs::copy(
            repo_root().join("hack/source-times.sh"),
            origin.join("hack/source-times.sh"),
        )
        .expect("copy the script");
        std::fs::write(
            origin.join("Cargo.toml"),
            "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[workspace]\n",
        )
        .expect("write");
        let repo = Repo { dir, clones: 0 };
        run(&origin, "git", &["init", "-q"]);
        repo.commit("pub fn answer() -> u32 { 42 }\n");
        repo
    }

    fn origin(&self) -> PathBuf {
        self.dir.path().join("origin")
    }

    fn target(&self) -> PathBuf {
        self.dir.path().join("target")
    }

    fn manifest(&self) -> PathBuf {
        self.target().join("source-times")
    }

    fn commit(&self, lib: &str) {
        let origin = self.origin();
        std::fs::write(origin.join("src/lib.rs"), lib).expect("write");
        run(&origin, "git", &["add", "-A"]);
        run(
            &origin,
            "git",
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "commit",
                "-qm",
                "v",
            ],
        );
    }

    /// A fresh clone built as .ci/run builds: restore, build, keep if the
    /// build passed. Returns whether cargo compiled the crate, and whether
    /// the build passed.
    fn build_fresh_clone(&mut self) -> (bool, bool) {
        self.clones += 1;
        let clone = self.dir.path().join(format!("clone-{}", self.clones));
        run(
            self.dir.path(),
            "git",
            &[
                "clone",
                "-q",
                &self.origin().to_string_lossy(),
                &clone.to_string_lossy(),
            ],
        );
        let manifest = self.manifest().to_string_lossy().into_owned();
        run(
            &clone,
            "bash",
            &["hack/source-times.sh", "restore", &manifest],
        );
        let output = Command::new("cargo")
            .args(["build", "--offline"])
            .env("CARGO_TARGET_DIR", self.target())
            .current_dir(&clone)
            .output()
            .expect("cargo runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let compiled = stderr.contains("Compiling tiny");
        if output.status.success() {
            run(&clone, "bash", &["hack/source-times.sh", "keep", &manifest]);
        }
        (compiled, output.status.success())
    }
}

fn run(dir: &Path, program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_fresh_clone_compiles_only_what_changed_and_nothing_after_a_failed_build() {
    let mut repo = Repo::new();
    assert_eq!(repo.build_fresh_clone(), (true, true), "the first build");
    assert_eq!(
        repo.build_fresh_clone(),
        (false, true),
        "a fresh clone of the same content compiles nothing"
    );

    repo.commit("pub fn answer() -> u32 { 43 }\n");
    assert_eq!(repo.build_fresh_clone(), (true, true), "changed: compiled");
    assert_eq!(repo.build_fresh_clone(), (false, true));

    // A build that fails leaves no manifest: the next clone compiles,
    // even of content built before.
    repo.commit("pub fn answer() -> u32 { 44 }\npub fn broken() -> u32 { \"no\" }\n");
    assert_eq!(repo.build_fresh_clone(), (true, false), "refused by rustc");
    assert!(
        !repo.manifest().exists(),
        "no manifest after a failed build"
    );
    repo.commit("pub fn answer() -> u32 { 43 }\n");
    assert_eq!(
        repo.build_fresh_clone(),
        (true, true),
        "after a failed build, nothing is taken for fresh"
    );

    // Content built two builds ago is not taken for what the last compiled.
    repo.commit("pub fn answer() -> u32 { 45 }\n");
    assert_eq!(repo.build_fresh_clone(), (true, true));
    repo.commit("pub fn answer() -> u32 { 43 }\n");
    assert_eq!(
        repo.build_fresh_clone(),
        (true, true),
        "reverted to older content: compiled again"
    );
}
