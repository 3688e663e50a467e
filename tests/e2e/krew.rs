//! The plugin through krew, as a user installs it: the release step
//! (`cargo xtask krew`'s code) packs the built `kubectl-petstore` and writes
//! its manifest with the archive's URI on a local HTTP server; the manifest
//! goes into a local index (a git repository, `plugins/petstore.yaml`); the
//! real krew adds that index, refuses an archive whose sha256 is not the
//! manifest's, installs the real one, and `kubectl petstore plan`, found by
//! kubectl in `$KREW_ROOT/bin`, plans against the control plane and store.

use std::path::Path;
use std::process::Output;

use fixtures::cosign::{Cosign, assert_refused, assert_verified, blob_statements};
use fixtures::krew::{FileServer, Krew, commit_index};
use fixtures::{Env, Storage, cargo_bin, io, repo_root};
use xtask::krew::{archive, release_from_repo, sha256_hex};

fn sha256_of(path: &Path) -> fixtures::Result<String> {
    let bytes = std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
    Ok(sha256_hex(&bytes))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn krew_installs_the_released_plugin_from_a_local_index_and_refuses_a_tampered_archive()
-> fixtures::Result<()> {
    let work = tempfile::tempdir().map_err(io("making a temporary directory"))?;
    let server = FileServer::start()?;
    let plugin = cargo_bin("kubectl-petstore")?;

    // The release step, for archives served at /releases/.
    let released = release_from_repo(
        &repo_root(),
        &plugin,
        &format!("http://{}/releases", server.addr),
        &work.path().join("release"),
    )
    .map_err(|e| io("the release step")(std::io::Error::other(e)))?;
    let [built] = released.archives.as_slice() else {
        panic!("one archive, for this machine: {:?}", released.archives);
    };
    let served_at = built
        .uri
        .strip_prefix(&format!("http://{}", server.addr))
        .unwrap_or_else(|| panic!("{} is not on the file server", built.uri))
        .to_owned();
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
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains(&format!("checksum does not match, want: {}", built.sha256)),
        "{}",
        text(&refused)
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
    assert_eq!(found, [installed.to_string_lossy()], "{}", text(&plugins));

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
    assert_eq!(planned.status.code(), Some(2), "{}", text(&planned));
    let printed = String::from_utf8_lossy(&planned.stdout);
    assert!(printed.contains(r#""summary":"create""#), "{printed}");
    assert!(env.pet("default", "rex").is_err(), "the plugin created rex");
    assert!(
        env.store_pets()?.is_empty(),
        "the plugin wrote to the store"
    );
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
        &cargo_bin("kubectl-petstore")?,
        "https://releases.example.com/petstore",
        &work.path().join("release"),
    )
    .map_err(|e| io("the release step")(std::io::Error::other(e)))?;
    let [built] = released.archives.as_slice() else {
        panic!("one archive, for this machine: {:?}", released.archives);
    };
    let cosign = Cosign::new()?;
    let (key, public) = cosign.generate_key_pair("release")?;
    let (other_key, other_public) = cosign.generate_key_pair("other")?;
    let sbom = xtask::sbom::generate(&repo_root(), xtask::sbom::PLUGIN, None)
        .map_err(|e| io("making the SBOM")(std::io::Error::other(e)))?;
    let sbom_file = cosign.sbom_file("kubectl-petstore", &sbom)?;

    let signature = cosign.sign_blob(&key, &built.path)?;
    let attestation = cosign.attest_blob_sbom(&key, &sbom_file, &built.path)?;
    assert_verified(&cosign.verify_blob(&public, &signature, &built.path)?);
    assert_verified(&cosign.verify_blob_sbom(&public, &attestation, &built.path)?);
    // The attestation is of this archive (the sha256 the krew manifest
    // has), and carries the SBOM made, whose subject is the plugin.
    let statements = blob_statements(&attestation)?;
    let [statement] = statements.as_slice() else {
        panic!("one statement: {statements:?}");
    };
    assert_eq!(statement["predicateType"], "https://cyclonedx.org/bom");
    assert_eq!(statement["subject"][0]["digest"]["sha256"], built.sha256);
    assert_eq!(statement["predicate"], sbom);
    assert_eq!(
        statement["predicate"]["metadata"]["component"]["name"],
        "kubectl-petstore"
    );

    // Another key's public half.
    assert_refused(
        &cosign.verify_blob(&other_public, &signature, &built.path)?,
        "the archive with another key",
        "invalid signature",
    );
    assert_refused(
        &cosign.verify_blob_sbom(&other_public, &attestation, &built.path)?,
        "the archive's SBOM with another key",
        "accepted signatures do not match threshold",
    );
    // Another program packed the same way, in the archive's place, with the
    // real archive's bundles.
    let tampered = work.path().join("tampered.tar.gz");
    std::fs::write(
        &tampered,
        archive(b"#!/bin/sh\necho tampered\n", None)
            .map_err(|e| io("packing the tampered archive")(std::io::Error::other(e)))?,
    )
    .map_err(io("writing the tampered archive"))?;
    assert_refused(
        &cosign.verify_blob(&public, &signature, &tampered)?,
        "the tampered archive",
        "invalid signature",
    );
    assert_refused(
        &cosign.verify_blob_sbom(&public, &attestation, &tampered)?,
        "the tampered archive's SBOM",
        "no matching subject digest found",
    );
    // Signed with the other key only: the release key refuses it.
    let other_signature = cosign.sign_blob(&other_key, &tampered)?;
    assert_refused(
        &cosign.verify_blob(&public, &other_signature, &tampered)?,
        "an archive another key signed",
        "invalid signature",
    );
    assert_verified(&cosign.verify_blob(&other_public, &other_signature, &tampered)?);
    Ok(())
}
