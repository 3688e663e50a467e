//! The plugin through krew, as a user installs it: the release step
//! (`cargo xtask krew`'s code) packs the built `kubectl-petstore` for this
//! machine (linux/amd64) and the ones cross-built for linux/arm64 and
//! windows/amd64, and
//! writes their manifest with each archive's URI on a local HTTP server;
//! the manifest goes into a local index (a git repository,
//! `plugins/petstore.yaml`); the real krew adds that index, refuses an
//! archive whose sha256 is not the manifest's, installs the real one, and
//! `kubectl petstore plan`, found by kubectl in `$KREW_ROOT/bin`, plans
//! against the control plane and store. krew told it runs on linux/arm64
//! installs the arm64 archive, whose binary plans the same under qemu; told
//! it runs on windows/amd64, the Windows archive, whose `.exe` plans the
//! same under Wine.

use std::path::{Path, PathBuf};
use std::process::Output;

use fixtures::cosign::{Cosign, assert_refused, assert_verified, blob_statements};
use fixtures::krew::{FileServer, Krew, commit_index};
use fixtures::wine::Wine;
use fixtures::{
    ARM64_TARGET, Env, Storage, WINDOWS_TARGET, cargo_bin, cross_bin, io, printed, repo_root,
};
use xtask::krew::{Platform, archive, release_from_repo, sha256_hex};

/// Where Debian's arm64 C library is (libc6-arm64-cross): qemu-user's root
/// for the arm64 binary's dynamic loader and libraries.
const ARM64_SYSROOT: &str = "/usr/aarch64-linux-gnu";

fn sha256_of(path: &Path) -> fixtures::Result<String> {
    let bytes = std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
    Ok(sha256_hex(&bytes))
}

/// `kubectl petstore plan` on a Pet not created yet: a create planned
/// (exit 2), and nothing written to the store.
fn assert_planned_a_create(planned: &Output, env: &Env) -> fixtures::Result<()> {
    assert_eq!(planned.status.code(), Some(2), "{}", printed(planned));
    let plan = String::from_utf8_lossy(&planned.stdout);
    assert!(plan.contains(r#""summary":"create""#), "{plan}");
    assert!(
        env.store_pets()?.is_empty(),
        "the plugin wrote to the store"
    );
    Ok(())
}

/// `krew`, told it runs on `archive`'s platform, installs the plugin from
/// `index` with `archive` served at `served_at`: downloaded once, and the
/// binary it links is `cross_built`, byte for byte, whose own header names
/// that platform. Returns the binary's path in `$KREW_ROOT/bin`.
fn install_on_its_platform(
    krew: &Krew,
    server: &FileServer,
    served_at: &str,
    index: &Path,
    archive: &xtask::krew::Archive,
    cross_built: &Path,
) -> fixtures::Result<PathBuf> {
    let bytes = std::fs::read(&archive.path).map_err(io("reading the archive"))?;
    server.serve(served_at, bytes);
    krew.run(&["index", "add", "local", &index.to_string_lossy()])?;
    krew.run(&["install", "local/petstore"])?;
    assert_eq!(server.requests(served_at), 1, "krew did not download it");
    let installed = krew.bin_dir().join(archive.platform.bin());
    assert_eq!(sha256_of(&installed)?, sha256_of(cross_built)?);
    let binary = std::fs::read(&installed).map_err(io("reading the binary"))?;
    assert_eq!(Platform::of_binary(&binary).as_ref(), Ok(&archive.platform));
    Ok(installed)
}

#[test]
fn krew_installs_the_released_plugin_from_a_local_index_and_refuses_a_tampered_archive()
-> fixtures::Result<()> {
    let work = tempfile::tempdir().map_err(io("making a temporary directory"))?;
    let server = FileServer::start()?;
    let plugin = cargo_bin("kubectl-petstore")?;
    let arm64_plugin = cross_bin(ARM64_TARGET, "kubectl-petstore")?;
    let windows_plugin = cross_bin(WINDOWS_TARGET, "kubectl-petstore")?;

    // The release step, for archives served at /releases/: one archive a
    // platform, each named for the platform its binary's header says.
    let released = release_from_repo(
        &repo_root(),
        &[&plugin, &arm64_plugin, &windows_plugin],
        &format!("http://{}/releases", server.addr),
        &work.path().join("release"),
    )
    .map_err(|e| io("the release step")(std::io::Error::other(e)))?;
    let [built, arm64, windows] = released.archives.as_slice() else {
        panic!("three archives: {:?}", released.archives);
    };
    assert_eq!(built.platform, Platform::host().expect("a krew platform"));
    let arm64_platform = Platform {
        os: "linux".into(),
        arch: "arm64".into(),
    };
    assert_eq!(arm64.platform, arm64_platform);
    // The path the file server serves an archive at: its URI less the
    // server's address.
    let path_of = |archive: &xtask::krew::Archive| {
        archive
            .uri
            .strip_prefix(&format!("http://{}", server.addr))
            .unwrap_or_else(|| panic!("{} is not on the file server", archive.uri))
            .to_owned()
    };
    let served_at = path_of(built);
    let real = std::fs::read(&built.path).map_err(io("reading the archive"))?;
    assert_eq!(sha256_hex(&real), built.sha256);

    let manifest =
        std::fs::read_to_string(&released.manifest).map_err(io("reading the manifest"))?;
    let index = work.path().join("index");
    commit_index(&index, &[("petstore", &manifest)])?;

    let krew = Krew::new()?;
    // A local path is what `git clone` takes, and all krew does with it.
    krew.run(&["index", "add", "local", &index.to_string_lossy()])?;
    let indexes = krew.run(&["index", "list"])?;
    assert!(indexes.contains("local"), "{indexes}");

    // A swapped archive at the manifest's URI (another program packed as
    // kubectl-petstore, the same way): krew downloads it, finds its sha256
    // is not the manifest's, and installs nothing.
    let tampered = archive(b"#!/bin/sh\necho tampered\n", None)
        .map_err(|e| io("packing the tampered archive")(std::io::Error::other(e)))?;
    server.serve(&served_at, tampered);
    let refused = krew.output(&["install", "local/petstore"])?;
    assert!(!refused.status.success(), "{}", printed(&refused));
    assert!(
        printed(&refused).contains(&format!("checksum does not match, want: {}", built.sha256)),
        "{}",
        printed(&refused)
    );
    assert_eq!(server.requests(&served_at), 1, "krew did not download it");
    assert!(
        !krew.bin_dir().join("kubectl-petstore").exists(),
        "the tampered plugin was installed"
    );

    // The real archive: installed, and the binary in $KREW_ROOT is the one
    // cargo built, byte for byte.
    server.serve(&served_at, real);
    krew.run(&["install", "local/petstore"])?;
    let installed = krew.bin_dir().join("kubectl-petstore");
    assert_eq!(sha256_of(&installed)?, sha256_of(&plugin)?);
    let listed = krew.run(&["list"])?;
    assert!(listed.contains("local/petstore"), "{listed}");
    // kubectl finds krew's copy, and no other.
    let plugins = krew
        .kubectl()?
        .args(["plugin", "list"])
        .output()
        .map_err(io("kubectl plugin list"))?;
    let found: Vec<&str> = std::str::from_utf8(&plugins.stdout)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.ends_with("/kubectl-petstore"))
        .collect();
    assert_eq!(
        found,
        [installed.to_string_lossy()],
        "{}",
        printed(&plugins)
    );

    // Run through kubectl against the control plane and the store: a Pet
    // not created yet plans a create (exit 2), and nothing is written.
    let env = Env::start(Storage::Memory)?;
    let pets = work.path().join("pets.yaml");
    std::fs::write(
        &pets,
        fixtures::env::pet_manifest(
            "rex",
            &[],
            r#" {name: Rex, type: dog, birthday: "2021-04-01"}"#,
        ),
    )
    .map_err(io("writing the Pet"))?;
    let planned = krew
        .kubectl()?
        .env("KUBECONFIG", &env.cp.kubeconfig)
        .args(["petstore", "plan", "--petstore-addr", &env.store.addr, "-f"])
        .arg(&pets)
        .output()
        .map_err(io("running kubectl petstore plan"))?;
    assert_planned_a_create(&planned, &env)?;
    assert!(env.pet("default", "rex").is_err(), "the plugin created rex");

    // krew on linux/arm64 picks the arm64 archive from the same manifest,
    // checks its sha256, and installs the cross-built binary, byte for
    // byte, which plans the same under qemu.
    let krew_arm64 = Krew::for_platform("linux", "arm64")?;
    let installed_arm64 = install_on_its_platform(
        &krew_arm64,
        &server,
        &path_of(arm64),
        &index,
        arm64,
        &arm64_plugin,
    )?;
    let planned = std::process::Command::new("qemu-aarch64")
        .args(["-L", ARM64_SYSROOT])
        .arg(&installed_arm64)
        .env("KUBECONFIG", &env.cp.kubeconfig)
        .args(["plan", "--petstore-addr", &env.store.addr, "-f"])
        .arg(&pets)
        .output()
        .map_err(io("running the arm64 kubectl-petstore under qemu-aarch64"))?;
    assert_planned_a_create(&planned, &env)?;

    // The same on windows/amd64: krew installs the Windows archive's
    // `kubectl-petstore.exe`, which plans the same under Wine.
    let krew_windows = Krew::for_platform("windows", "amd64")?;
    let installed_windows = install_on_its_platform(
        &krew_windows,
        &server,
        &path_of(windows),
        &index,
        windows,
        &windows_plugin,
    )?;
    assert_eq!(
        installed_windows.file_name(),
        Some("kubectl-petstore.exe".as_ref())
    );
    assert_eq!(
        windows.platform,
        Platform {
            os: "windows".into(),
            arch: "amd64".into(),
        }
    );
    let planned = Wine::new(work.path())?
        .command(&installed_windows)
        .env("KUBECONFIG", &env.cp.kubeconfig)
        .args(["plan", "--petstore-addr", &env.store.addr, "-f"])
        .arg(&pets)
        .output()
        .map_err(io("running the Windows kubectl-petstore under Wine"))?;
    assert_planned_a_create(&planned, &env)?;
    Ok(())
}

/// The plugin's archive as a release signs it (docs/install.md): `cosign
/// sign-blob` and `attest-blob` of its CycloneDX SBOM with the release key,
/// into bundles shipped beside it. Both verify with the release key's public
/// half; another key's, a tampered archive, or the SBOM checked as another
/// type, do not.
#[test]
fn cosign_verifies_the_plugin_archive_and_its_sbom_and_refuses_the_rest() -> fixtures::Result<()> {
    let work = tempfile::tempdir().map_err(io("making a temporary directory"))?;
    let released = release_from_repo(
        &repo_root(),
        &[
            &cargo_bin("kubectl-petstore")?,
            &cross_bin(ARM64_TARGET, "kubectl-petstore")?,
            &cross_bin(WINDOWS_TARGET, "kubectl-petstore")?,
        ],
        "https://releases.example.com/petstore",
        &work.path().join("release"),
    )
    .map_err(|e| io("the release step")(std::io::Error::other(e)))?;
    let cosign = Cosign::new()?;
    let (key, public) = cosign.generate_key_pair("release")?;
    let (other_key, other_public) = cosign.generate_key_pair("other")?;

    // Every archive, each with the SBOM of its own platform's build (the
    // dependencies that apply to that target).
    let mut signed = Vec::new();
    let targets = [None, Some(ARM64_TARGET), Some(WINDOWS_TARGET)];
    for (archive, target) in released.archives.iter().zip(targets) {
        let sbom = xtask::sbom::generate(&repo_root(), xtask::sbom::PLUGIN, target)
            .map_err(|e| io("making the SBOM")(std::io::Error::other(e)))?;
        let name = format!(
            "kubectl-petstore-{}-{}",
            archive.platform.os, archive.platform.arch
        );
        let sbom_file = cosign.sbom_file(&name, &sbom)?;
        let signature = cosign.sign_blob(&key, &archive.path)?;
        let attestation = cosign.attest_blob_sbom(&key, &sbom_file, &archive.path)?;
        assert_verified(&cosign.verify_blob(&public, &signature, &archive.path)?);
        assert_verified(&cosign.verify_blob_sbom(&public, &attestation, &archive.path)?);
        // The attestation is of this archive (the sha256 the krew manifest
        // has), and carries the SBOM made, whose subject is the plugin.
        let statements = blob_statements(&attestation)?;
        let [statement] = statements.as_slice() else {
            panic!("one statement: {statements:?}");
        };
        assert_eq!(statement["predicateType"], "https://cyclonedx.org/bom");
        assert_eq!(statement["subject"][0]["digest"]["sha256"], archive.sha256);
        assert_eq!(statement["predicate"], sbom);
        assert_eq!(
            statement["predicate"]["metadata"]["component"]["name"],
            "kubectl-petstore"
        );
        assert_eq!(
            statement["predicate"]["metadata"]["properties"][0]["value"],
            target
                .map_or_else(xtask::sbom::host_target, |t| Ok(t.to_owned()))
                .map_err(|e| io("the host's target")(std::io::Error::other(e)))?
        );
        signed.push((archive, signature, attestation));
    }
    let [
        (built, signature, attestation),
        (arm64, arm64_signature, _),
        (windows, windows_signature, _),
    ] = signed.as_slice()
    else {
        panic!("three archives: {:?}", released.archives);
    };
    // Another program packed the same way, in the archive's place, with the
    // real archive's bundles; and that program signed by the other key.
    let tampered = work.path().join("tampered.tar.gz");
    std::fs::write(
        &tampered,
        archive(b"#!/bin/sh\necho tampered\n", None)
            .map_err(|e| io("packing the tampered archive")(std::io::Error::other(e)))?,
    )
    .map_err(io("writing the tampered archive"))?;
    let other_signature = cosign.sign_blob(&other_key, &tampered)?;
    // Each refusal: what cosign was asked, and what it must say.
    for (answer, what, says) in [
        (
            cosign.verify_blob(&public, signature, &arm64.path)?,
            "the arm64 archive with the amd64 archive's signature",
            "invalid signature",
        ),
        (
            cosign.verify_blob(&public, arm64_signature, &built.path)?,
            "the amd64 archive with the arm64 archive's signature",
            "invalid signature",
        ),
        (
            cosign.verify_blob(&public, windows_signature, &built.path)?,
            "the amd64 archive with the Windows archive's signature",
            "invalid signature",
        ),
        (
            cosign.verify_blob(&public, signature, &windows.path)?,
            "the Windows archive with the amd64 archive's signature",
            "invalid signature",
        ),
        (
            cosign.verify_blob(&other_public, signature, &built.path)?,
            "the archive with another key",
            "invalid signature",
        ),
        (
            cosign.verify_blob_sbom(&other_public, attestation, &built.path)?,
            "the archive's SBOM with another key",
            "accepted signatures do not match threshold",
        ),
        (
            cosign.verify_blob(&public, signature, &tampered)?,
            "the tampered archive",
            "invalid signature",
        ),
        (
            cosign.verify_blob_sbom(&public, attestation, &tampered)?,
            "the tampered archive's SBOM",
            "no matching subject digest found",
        ),
        (
            cosign.verify_blob(&public, &other_signature, &tampered)?,
            "an archive another key signed",
            "invalid signature",
        ),
    ] {
        assert_refused(&answer, what, says);
    }
    assert_verified(&cosign.verify_blob(&other_public, &other_signature, &tampered)?);
    Ok(())
}
