//! The chart from an OCI registry, as platform teams install it
//! (docs/install.md, "From an OCI registry"): `helm package` and `helm push`
//! to a real registry on 127.0.0.1, `helm show chart` and `helm pull` give
//! the same chart back, `helm install oci://...` installs it; cosign signs
//! it with a key pair and attests its CycloneDX SBOM (`cargo xtask sbom`'s
//! code), and verification refuses an unsigned chart, another key's
//! signature and a chart re-pushed under the same tag.

use std::path::{Path, PathBuf};
use std::process::Command;

use fixtures::cosign::{Cosign, assert_refused, assert_verified, statements};
use fixtures::helm::{CHART, CHART_VERSION, Helm, chart_dir, digest_line};
use fixtures::printed;
use fixtures::registry::Registry;
use fixtures::{ControlPlane, io, repo_root};
use serde_json::Value;

/// The media type of a Helm chart's archive in an OCI manifest.
const CHART_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

fn sha256_of(path: &Path) -> fixtures::Result<String> {
    let bytes = std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
    Ok(format!("sha256:{}", xtask::krew::sha256_hex(&bytes)))
}

/// The chart's reference for `helm`: `oci://<registry>/charts/<chart>`.
fn chart_ref(registry: &Registry) -> String {
    format!("oci://{}/charts/{CHART}", registry.addr)
}

#[test]
fn helm_pushes_the_chart_to_an_oci_registry_pulls_it_back_and_installs_it() -> fixtures::Result<()>
{
    let registry = Registry::start()?;
    let work = tempfile::tempdir().map_err(io("making a folder"))?;
    let helm = Helm::new()?;
    let archive = helm.package(&chart_dir(), work.path())?;
    let pushed = helm.push(&archive, &registry.addr, "charts")?;
    assert!(
        pushed.starts_with("sha256:") && pushed.len() == 71,
        "{pushed}"
    );

    // What the registry holds under the tag: the manifest push printed, with
    // the archive, byte for byte, as its chart layer.
    let repository = format!("charts/{CHART}");
    assert_eq!(registry.tags(&repository)?, [CHART_VERSION]);
    let (manifest, digest) = registry.manifest(&repository, CHART_VERSION)?;
    assert_eq!(digest, pushed, "{manifest}");
    let layers = manifest["layers"].as_array().expect("layers");
    let [layer] = layers.as_slice() else {
        panic!("one layer: {manifest}");
    };
    assert_eq!(layer["mediaType"], CHART_LAYER, "{manifest}");
    assert_eq!(layer["digest"], sha256_of(&archive)?.as_str(), "{manifest}");

    // `helm show chart` reads Chart.yaml from the registry.
    let shown = helm.run(&[
        "show",
        "chart",
        &chart_ref(&registry),
        "--version",
        CHART_VERSION,
        "--plain-http",
    ])?;
    let shown: Value = serde_norway::from_str(&shown).expect("helm show chart prints YAML");
    let local: Value = serde_norway::from_str(
        &std::fs::read_to_string(chart_dir().join("Chart.yaml"))
            .map_err(io("reading Chart.yaml"))?,
    )
    .expect("Chart.yaml is YAML");
    for field in ["name", "version", "appVersion", "description", "type"] {
        assert_eq!(shown[field], local[field], "{field}");
    }

    // `helm pull` gets the same manifest and the same archive.
    let pulled_dir = work.path().join("pulled");
    std::fs::create_dir(&pulled_dir).map_err(io("making a folder"))?;
    let out = helm.output(&[
        "pull",
        &chart_ref(&registry),
        "--version",
        CHART_VERSION,
        "--plain-http",
        "--destination",
        &pulled_dir.to_string_lossy(),
    ])?;
    assert!(out.status.success(), "helm pull: {}", printed(&out));
    assert_eq!(digest_line(&printed(&out)), Some(pushed.clone()));
    let pulled = pulled_dir.join(format!("{CHART}-{CHART_VERSION}.tgz"));
    assert_eq!(sha256_of(&pulled)?, sha256_of(&archive)?);

    // Installed from the registry onto a fresh API server: the CRDs and the
    // operator's objects, as the admin sees them.
    let cp = ControlPlane::start()?;
    let helm = Helm::with_kubeconfig(&cp.kubeconfig)?;
    let out = helm.run(&[
        "install",
        "petstore",
        &chart_ref(&registry),
        "--version",
        CHART_VERSION,
        "--plain-http",
        "--namespace",
        "default",
    ])?;
    assert!(out.contains("STATUS: deployed"), "{out}");
    for name in [
        "pets.petstore.example.com",
        "petstores.petstore.example.com",
        "clusterpetstores.petstore.example.com",
    ] {
        cp.kubectl(&["get", "crd", name])?;
    }
    for object in [
        &["namespace", "petstore-system"][..],
        &["deployment", "petstore-operator", "-n", "petstore-system"][..],
        &[
            "serviceaccount",
            "petstore-operator",
            "-n",
            "petstore-system",
        ][..],
        &["clusterrole", "petstore-operator"][..],
        &["deployment", "petstore", "-n", "petstore"][..],
    ] {
        cp.kubectl(&[&["get"], object].concat())?;
    }
    let release = helm.run(&["list", "--namespace", "default", "--output", "json"])?;
    let release: Value = serde_json::from_str(&release).expect("helm list prints JSON");
    assert_eq!(
        release[0]["chart"],
        format!("{CHART}-{CHART_VERSION}"),
        "{release}"
    );
    Ok(())
}

/// A copy of the chart at `dir` whose operator image is another's: what an
/// attacker with push rights would publish under the same tag.
fn tampered_chart(dir: &Path) -> fixtures::Result<PathBuf> {
    let chart = dir.join(CHART);
    std::fs::create_dir_all(dir).map_err(io("making a folder"))?;
    fixtures::run(Command::new("cp").arg("-r").arg(chart_dir()).arg(&chart))?;
    let values = chart.join("values.yaml");
    let text = std::fs::read_to_string(&values).map_err(io("reading values.yaml"))?;
    let swapped = text.replacen(
        "repository: petstore-operator",
        "repository: evil.example/petstore-operator",
        1,
    );
    assert_ne!(
        swapped, text,
        "the operator's image repository moved in values.yaml"
    );
    std::fs::write(&values, swapped).map_err(io("writing values.yaml"))?;
    Ok(chart)
}

#[test]
fn cosign_verifies_the_signed_chart_and_its_sbom_and_refuses_the_rest() -> fixtures::Result<()> {
    let registry = Registry::start()?;
    let work = tempfile::tempdir().map_err(io("making a folder"))?;
    let helm = Helm::new()?;
    let cosign = Cosign::new()?;
    let (key, public) = cosign.generate_key_pair("release")?;
    let (other_key, other_public) = cosign.generate_key_pair("other")?;
    let key_text = std::fs::read_to_string(&key).map_err(io("reading the key"))?;
    assert!(
        key_text.contains("ENCRYPTED SIGSTORE PRIVATE KEY"),
        "{key_text}"
    );

    let archive = helm.package(&chart_dir(), work.path())?;
    let pushed = helm.push(&archive, &registry.addr, "charts")?;
    let image = format!("{}/charts/{CHART}", registry.addr);
    let (by_tag, by_digest) = (
        format!("{image}:{CHART_VERSION}"),
        format!("{image}@{pushed}"),
    );

    // Unsigned: nothing to verify.
    assert_refused(
        &cosign.verify(&public, &by_tag)?,
        "the unsigned chart",
        "no signatures found",
    );

    // Signed by digest, as the docs say; verified by tag, it names that digest.
    cosign.sign(&key, &by_digest)?;
    let out = cosign.verify(&public, &by_tag)?;
    assert_verified(&out);
    let payloads: Value = serde_json::from_slice(&out.stdout).expect("cosign verify prints JSON");
    assert_eq!(
        payloads[0]["critical"]["image"]["docker-manifest-digest"],
        pushed.as_str(),
        "{payloads}"
    );
    assert!(
        printed(&out).contains("The signatures were verified against the specified public key")
    );
    // Another key's public half does not verify it.
    assert_refused(
        &cosign.verify(&other_public, &by_tag)?,
        "the chart with another key",
        "no matching signatures",
    );

    // The same chart signed only by another key, in another repository.
    helm.push(&archive, &registry.addr, "mirror")?;
    let mirror = format!("{}/mirror/{CHART}@{pushed}", registry.addr);
    cosign.sign(&other_key, &mirror)?;
    assert_refused(
        &cosign.verify(&public, &mirror)?,
        "another key's signature",
        "no matching signatures",
    );
    assert_verified(&cosign.verify(&other_public, &mirror)?);

    // The SBOM, attested to the chart with the release key.
    let sbom = xtask::sbom::generate(&repo_root(), xtask::sbom::CHART, None)
        .map_err(|e| io("making the SBOM")(std::io::Error::other(e)))?;
    let sbom_file = cosign.sbom_file("chart", &sbom)?;
    assert_refused(
        &cosign.verify_sbom(&public, &by_tag)?,
        "an SBOM not yet attested",
        "no matching attestations",
    );
    cosign.attest_sbom(&key, &sbom_file, &by_digest)?;
    let out = cosign.verify_sbom(&public, &by_tag)?;
    assert_verified(&out);
    let statements = statements(&out.stdout);
    let [statement] = statements.as_slice() else {
        panic!("one attestation: {statements:?}");
    };
    assert_eq!(statement["predicateType"], "https://cyclonedx.org/bom");
    assert_eq!(
        statement["predicate"], sbom,
        "the attested SBOM is not the one made"
    );
    assert_eq!(
        format!(
            "sha256:{}",
            statement["subject"][0]["digest"]["sha256"]
                .as_str()
                .unwrap_or("")
        ),
        pushed
    );
    assert_refused(
        &cosign.verify_sbom(&other_public, &by_tag)?,
        "the SBOM with another key",
        "no matching attestations",
    );

    // Re-pushed under the same tag: the tag names a chart nobody signed, so
    // neither its signature nor its SBOM verifies, while the signed digest
    // still does and still pulls the original.
    let tampered = tampered_chart(&work.path().join("tampered"))?;
    let tampered_dir = work.path().join("tampered-out");
    std::fs::create_dir(&tampered_dir).map_err(io("making a folder"))?;
    let tampered_archive = helm.package(&tampered, &tampered_dir)?;
    let repushed = helm.push(&tampered_archive, &registry.addr, "charts")?;
    assert_ne!(repushed, pushed);
    assert_eq!(
        registry
            .manifest(&format!("charts/{CHART}"), CHART_VERSION)?
            .1,
        repushed
    );
    assert_refused(
        &cosign.verify(&public, &by_tag)?,
        "the re-pushed chart",
        "no signatures found",
    );
    assert_refused(
        &cosign.verify_sbom(&public, &by_tag)?,
        "the re-pushed chart's SBOM",
        "no matching attestations",
    );
    assert_verified(&cosign.verify(&public, &by_digest)?);
    let pulled = work.path().join("pulled");
    std::fs::create_dir(&pulled).map_err(io("making a folder"))?;
    helm.run(&[
        "pull",
        &format!("oci://{by_digest}"),
        "--plain-http",
        "--destination",
        &pulled.to_string_lossy(),
    ])?;
    assert_eq!(
        // helm names an archive pulled by digest after the digest.
        sha256_of(&pulled.join(format!("{CHART}@{}.tgz", pushed.replace(':', "-"))))?,
        sha256_of(&archive)?,
        "the signed digest pulled another chart"
    );
    Ok(())
}
