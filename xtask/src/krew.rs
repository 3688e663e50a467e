//! `cargo xtask krew`: the release step of the kubectl plugin for krew. It
//! packs each built `kubectl-petstore` (and the repository's LICENSE, when
//! there is one) into a `.tar.gz` for the platform it was built for, and
//! writes the krew manifest `petstore.yaml` that names each archive's
//! platform, URI and sha256, ready for a krew index
//! (`plugins/petstore.yaml`).
//!
//! A binary's platform is read from its own header (ELF, PE or Mach-O), not
//! from a flag or a path, so an archive cannot be labelled for a platform
//! its binary does not run on. The archives are reproducible: the same
//! binary gives the same bytes, so the same sha256 (fixed order, mtimes,
//! owners and modes, and a gzip header without a time or name).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The plugin's name in krew: `kubectl krew install petstore`, run as
/// `kubectl petstore`.
pub const PLUGIN: &str = "petstore";
/// The binary krew links into its bin folder.
pub const BINARY: &str = "kubectl-petstore";
const API_VERSION: &str = "krew.googlecontainertools.github.com/v1alpha2";
const SHORT_DESCRIPTION: &str = "Plan and import Pets of the petstore operator";
const DESCRIPTION: &str = "Tools for the petstore operator's Pets, acting with your own rights.
`kubectl petstore plan -f pets.yaml` prints the store writes the operator
would make for these Pets, without applying them (exit 0: none; 2: some;
1: an error). `kubectl petstore import` prints Pet manifests that adopt
records already in the store. Neither writes anything.
";
/// The workspace's `repository`.
const HOMEPAGE: &str = env!("CARGO_PKG_REPOSITORY");

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("krew has no platform name for {0}")]
    Platform(String),
    #[error("{0} is not an executable for a platform krew knows: {1}")]
    NotExecutable(String, String),
    #[error("two binaries for {os}/{arch}: {first} and {second}")]
    SamePlatform {
        os: String,
        arch: String,
        first: String,
        second: String,
    },
    #[error("the archive base URI must be http:// or https://, not {0:?}")]
    UriBase(String),
    #[error("writing the manifest: {0}")]
    Yaml(#[from] serde_norway::Error),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// A platform as krew's selectors name it (Go's GOOS and GOARCH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub arch: String,
}

impl Platform {
    /// The platform this program runs on, which is the one the plugin binary
    /// beside it was built for.
    pub fn host() -> Result<Self, Error> {
        Self::from_rust(std::env::consts::OS, std::env::consts::ARCH)
    }

    /// Rust's names (`std::env::consts`) in Go's, which krew uses.
    pub fn from_rust(os: &str, arch: &str) -> Result<Self, Error> {
        let os = match os {
            "linux" | "darwin" | "windows" => os,
            "macos" => "darwin",
            other => return Err(Error::Platform(other.into())),
        };
        let arch = match arch {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "arm" => "arm",
            other => return Err(Error::Platform(other.into())),
        };
        Ok(Self {
            os: os.into(),
            arch: arch.into(),
        })
    }

    /// The platform the executable `binary` runs on, from its header: ELF
    /// (Linux), PE (Windows) or Mach-O (macOS), and the machine it names.
    pub fn of_binary(binary: &[u8]) -> Result<Self, String> {
        let u16_at = |at: usize| {
            binary
                .get(at..at + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        let u32_at = |at: usize| {
            binary
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let (os, arch) = if binary.starts_with(b"\x7fELF") {
            // Little-endian (EI_DATA 1), e_machine at 18.
            if binary.get(5) != Some(&1) {
                return Err("a big-endian ELF".into());
            }
            let arch = match u16_at(18) {
                Some(0x3e) => "x86_64",
                Some(0xb7) => "aarch64",
                Some(0x28) => "arm",
                other => return Err(format!("an ELF for machine {other:?}")),
            };
            ("linux", arch)
        } else if binary.starts_with(b"MZ") {
            // e_lfanew at 0x3c points at "PE\0\0", the machine after it.
            let pe = u32_at(0x3c).map_or(usize::MAX, |at| at as usize);
            if binary.get(pe..pe.saturating_add(4)) != Some(b"PE\0\0".as_slice()) {
                return Err("an MZ file without a PE header".into());
            }
            let arch = match u16_at(pe + 4) {
                Some(0x8664) => "x86_64",
                Some(0xaa64) => "aarch64",
                other => return Err(format!("a PE for machine {other:?}")),
            };
            ("windows", arch)
        } else if u32_at(0) == Some(0xfeed_facf) {
            let arch = match u32_at(4) {
                Some(0x0100_0007) => "x86_64",
                Some(0x0100_000c) => "aarch64",
                other => return Err(format!("a Mach-O for CPU {other:?}")),
            };
            ("macos", arch)
        } else {
            return Err("not an ELF, PE or Mach-O executable".into());
        };
        Self::from_rust(os, arch).map_err(|e| e.to_string())
    }

    /// The binary's name in the archive and the manifest's `bin`: Windows
    /// runs only `.exe` files.
    pub fn bin(&self) -> String {
        if self.os == "windows" {
            format!("{BINARY}.exe")
        } else {
            BINARY.to_owned()
        }
    }
}

/// What the release step makes from.
pub struct Release<'a> {
    /// The built `kubectl-petstore`s, at most one for each platform.
    pub binaries: &'a [&'a Path],
    /// Packed beside the binary when given.
    pub license: Option<&'a Path>,
    /// The workspace version, without the `v`.
    pub version: &'a str,
    /// Where the archives will be served from: each archive's URI is this,
    /// a slash, and its file name.
    pub uri_base: &'a str,
    /// The folder the archives and the manifest are written to.
    pub out: &'a Path,
}

/// One packed archive.
#[derive(Debug, Clone)]
pub struct Archive {
    pub platform: Platform,
    pub path: PathBuf,
    pub uri: String,
    pub sha256: String,
}

/// What [`release`] wrote.
#[derive(Debug)]
pub struct Released {
    /// `<out>/petstore.yaml`, the krew manifest.
    pub manifest: PathBuf,
    pub archives: Vec<Archive>,
}

/// What `cargo xtask krew` does: packs each of `binaries`, with the LICENSE
/// of the repository at `root` when it has one, as the workspace's version.
pub fn release_from_repo(
    root: &Path,
    binaries: &[&Path],
    uri_base: &str,
    out: &Path,
) -> Result<Released, Error> {
    let license = root.join("LICENSE");
    release(&Release {
        binaries,
        license: license.is_file().then_some(license.as_path()),
        // xtask's version is the workspace's.
        version: env!("CARGO_PKG_VERSION"),
        uri_base,
        out,
    })
}

/// Packs an archive for each binary's platform into `out`, and writes the
/// manifest beside them.
pub fn release(release: &Release) -> Result<Released, Error> {
    let base = release.uri_base.trim_end_matches('/');
    if !(base.starts_with("https://") || base.starts_with("http://")) {
        return Err(Error::UriBase(release.uri_base.into()));
    }
    std::fs::create_dir_all(release.out)
        .map_err(io(format!("making {}", release.out.display())))?;
    let license = match release.license {
        Some(path) => Some(std::fs::read(path).map_err(io(format!("reading {}", path.display())))?),
        None => None,
    };
    let version = format!("v{}", release.version);
    let mut archives: Vec<(Archive, &Path)> = Vec::new();
    for &path in release.binaries {
        let binary = std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
        let platform = Platform::of_binary(&binary)
            .map_err(|why| Error::NotExecutable(path.display().to_string(), why))?;
        if let Some((_, first)) = archives.iter().find(|(a, _)| a.platform == platform) {
            return Err(Error::SamePlatform {
                os: platform.os,
                arch: platform.arch,
                first: first.display().to_string(),
                second: path.display().to_string(),
            });
        }
        let name = archive_name(&version, &platform);
        let bytes = archive_as(&platform.bin(), &binary, license.as_deref())?;
        let file = release.out.join(&name);
        std::fs::write(&file, &bytes).map_err(io(format!("writing {}", file.display())))?;
        let archive = Archive {
            platform,
            path: file,
            uri: format!("{base}/{name}"),
            sha256: sha256_hex(&bytes),
        };
        archives.push((archive, path));
    }
    let archives: Vec<Archive> = archives.into_iter().map(|(a, _)| a).collect();
    let manifest = release.out.join(format!("{PLUGIN}.yaml"));
    std::fs::write(&manifest, manifest_yaml(&version, &archives)?)
        .map_err(io(format!("writing {}", manifest.display())))?;
    Ok(Released { manifest, archives })
}

/// `kubectl-petstore_v0.1.0_linux_amd64.tar.gz`.
pub fn archive_name(version: &str, platform: &Platform) -> String {
    format!(
        "{BINARY}_{version}_{}_{}.tar.gz",
        platform.os, platform.arch
    )
}

/// The `.tar.gz` of `binary` (as `kubectl-petstore`, mode 0755) and, when
/// given, `license` (as `LICENSE`, mode 0644), in that order, owned by 0:0
/// with mtime 0, gzipped without a time or file name in its header: the
/// same inputs give the same bytes.
pub fn archive(binary: &[u8], license: Option<&[u8]>) -> Result<Vec<u8>, Error> {
    archive_as(BINARY, binary, license)
}

/// [`archive`] with the binary named `name` (Windows' has `.exe`).
fn archive_as(name: &str, binary: &[u8], license: Option<&[u8]>) -> Result<Vec<u8>, Error> {
    let gzip = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gzip);
    let mut entries = vec![(name, 0o755, binary)];
    if let Some(license) = license {
        entries.push(("LICENSE", 0o644, license));
    }
    for (name, mode, data) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        tar.append_data(&mut header, name, data)
            .map_err(io(format!("packing {name}")))?;
    }
    let mut gzip = tar.into_inner().map_err(io("ending the tar stream"))?;
    gzip.flush().map_err(io("compressing the archive"))?;
    gzip.finish().map_err(io("compressing the archive"))
}

/// The lowercase hex sha256 of `bytes`, as krew's manifests carry it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest<'a> {
    api_version: &'a str,
    kind: &'a str,
    metadata: Metadata<'a>,
    spec: Spec<'a>,
}

#[derive(Serialize)]
struct Metadata<'a> {
    name: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    version: &'a str,
    homepage: &'a str,
    short_description: &'a str,
    description: &'a str,
    platforms: Vec<PlatformSpec<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PlatformSpec<'a> {
    selector: Selector<'a>,
    uri: &'a str,
    sha256: &'a str,
    bin: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Selector<'a> {
    match_labels: MatchLabels<'a>,
}

#[derive(Serialize)]
struct MatchLabels<'a> {
    os: &'a str,
    arch: &'a str,
}

/// The krew manifest (`kind: Plugin`) of `version` (with its `v`) for
/// these archives.
pub fn manifest_yaml(version: &str, archives: &[Archive]) -> Result<String, Error> {
    let manifest = Manifest {
        api_version: API_VERSION,
        kind: "Plugin",
        metadata: Metadata { name: PLUGIN },
        spec: Spec {
            version,
            homepage: HOMEPAGE,
            short_description: SHORT_DESCRIPTION,
            description: DESCRIPTION,
            platforms: archives
                .iter()
                .map(|archive| PlatformSpec {
                    selector: Selector {
                        match_labels: MatchLabels {
                            os: &archive.platform.os,
                            arch: &archive.platform.arch,
                        },
                    },
                    uri: &archive.uri,
                    sha256: &archive.sha256,
                    bin: archive.platform.bin(),
                })
                .collect(),
        },
    };
    Ok(serde_norway::to_string(&manifest)?)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    /// Every entry of a `.tar.gz`: name, mode, uid, gid, mtime, contents.
    fn entries(archive: &[u8]) -> Vec<(String, u32, u64, u64, u64, Vec<u8>)> {
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
        tar.entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let header = entry.header().clone();
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                (
                    entry.path().unwrap().to_string_lossy().into_owned(),
                    header.mode().unwrap(),
                    header.uid().unwrap(),
                    header.gid().unwrap(),
                    header.mtime().unwrap(),
                    data,
                )
            })
            .collect()
    }

    /// The first bytes of a little-endian 64-bit ELF executable for
    /// `machine` (e_machine), as far as [`Platform::of_binary`] reads.
    fn elf(machine: u16) -> Vec<u8> {
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 2; // 64-bit
        header[5] = 1; // little-endian
        header[6] = 1; // version
        header[18..20].copy_from_slice(&machine.to_le_bytes());
        header
    }

    /// An MZ stub whose PE header (at 0x40) names `machine`.
    fn pe(machine: u16) -> Vec<u8> {
        let mut header = vec![0u8; 0x80];
        header[..2].copy_from_slice(b"MZ");
        header[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
        header[0x40..0x44].copy_from_slice(b"PE\0\0");
        header[0x44..0x46].copy_from_slice(&machine.to_le_bytes());
        header
    }

    fn mach_o(cpu: u32) -> Vec<u8> {
        [0xfeed_facfu32.to_le_bytes(), cpu.to_le_bytes()].concat()
    }

    #[test]
    fn a_binarys_platform_is_read_from_its_header() {
        let platform = |os: &str, arch: &str| Platform {
            os: os.into(),
            arch: arch.into(),
        };
        for (binary, expected, bin) in [
            (elf(0x3e), platform("linux", "amd64"), "kubectl-petstore"),
            (elf(0xb7), platform("linux", "arm64"), "kubectl-petstore"),
            (
                pe(0x8664),
                platform("windows", "amd64"),
                "kubectl-petstore.exe",
            ),
            (
                mach_o(0x0100_000c),
                platform("darwin", "arm64"),
                "kubectl-petstore",
            ),
        ] {
            let found = Platform::of_binary(&binary).unwrap();
            assert_eq!(found, expected);
            assert_eq!(found.bin(), bin);
        }
        let mut big_endian = elf(0xb7);
        big_endian[5] = 2;
        for (binary, says) in [
            (
                b"#!/bin/sh\necho plugin\n".to_vec(),
                "not an ELF, PE or Mach-O",
            ),
            (elf(0xf3), "an ELF for machine Some(243)"),
            (big_endian, "big-endian"),
            (b"MZ".to_vec(), "without a PE header"),
            (Vec::new(), "not an ELF"),
        ] {
            let refused = Platform::of_binary(&binary).unwrap_err();
            assert!(refused.contains(says), "{refused}");
        }
        // The binary this test runs as is the host's.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(Platform::of_binary(&me).unwrap(), Platform::host().unwrap());
    }

    #[test]
    fn release_packs_one_archive_a_platform_and_refuses_two_for_one() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let (amd64, arm64, windows) = (
            write("amd64", &elf(0x3e)),
            write("arm64", &elf(0xb7)),
            write("windows", &pe(0x8664)),
        );
        let out = dir.path().join("out");
        // v1.2.3 of `binaries`, without a license, into `out`.
        let release_of = |binaries: &[&Path]| {
            release(&Release {
                binaries,
                license: None,
                version: "1.2.3",
                uri_base: "https://downloads.example.com/petstore",
                out: &out,
            })
        };
        let released = release_of(&[&amd64, &arm64, &windows]).unwrap();
        let yaml = std::fs::read_to_string(&released.manifest).unwrap();
        let manifest: serde_json::Value = serde_norway::from_str(&yaml).unwrap();
        let platforms = manifest["spec"]["platforms"].as_array().unwrap();
        assert_eq!(platforms.len(), 3, "{yaml}");
        for ((archive, platform), (binary, os, arch, bin)) in
            released.archives.iter().zip(platforms).zip([
                (elf(0x3e), "linux", "amd64", "kubectl-petstore"),
                (elf(0xb7), "linux", "arm64", "kubectl-petstore"),
                (pe(0x8664), "windows", "amd64", "kubectl-petstore.exe"),
            ])
        {
            let name = format!("kubectl-petstore_v1.2.3_{os}_{arch}.tar.gz");
            assert_eq!(archive.path, out.join(&name));
            let bytes = std::fs::read(&archive.path).unwrap();
            assert_eq!(entries(&bytes)[0].0, bin);
            assert_eq!(entries(&bytes)[0].5, binary);
            assert_eq!(platform["selector"]["matchLabels"]["os"], os);
            assert_eq!(platform["selector"]["matchLabels"]["arch"], arch);
            assert_eq!(platform["sha256"], sha256_hex(&bytes));
            assert_eq!(
                platform["uri"],
                format!("https://downloads.example.com/petstore/{name}")
            );
            assert_eq!(platform["bin"], bin);
        }

        let again = write("arm64-again", &elf(0xb7));
        let refused = release_of(&[&arm64, &amd64, &again]);
        assert!(
            matches!(&refused, Err(Error::SamePlatform { os, arch, .. }) if os == "linux" && arch == "arm64"),
            "{refused:?}"
        );
        let script = write("script", b"#!/bin/sh\n");
        let refused = release_of(&[&script]);
        assert!(
            matches!(refused, Err(Error::NotExecutable(..))),
            "{refused:?}"
        );
    }

    #[test]
    fn sha256_is_the_standard_digest() {
        // FIPS 180-2's test vector for "abc".
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_archive_holds_the_binary_then_the_license_with_fixed_metadata() {
        let packed = archive(b"#!/bin/sh\necho plugin\n", Some(b"Apache-2.0\n")).unwrap();
        assert_eq!(
            entries(&packed),
            vec![
                (
                    BINARY.to_owned(),
                    0o755,
                    0,
                    0,
                    0,
                    b"#!/bin/sh\necho plugin\n".to_vec()
                ),
                (
                    "LICENSE".to_owned(),
                    0o644,
                    0,
                    0,
                    0,
                    b"Apache-2.0\n".to_vec()
                ),
            ]
        );
        let without = archive(b"bin", None).unwrap();
        assert_eq!(entries(&without).len(), 1);
    }

    #[test]
    fn the_archive_is_reproducible() {
        let first = archive(b"the same binary", Some(b"license")).unwrap();
        let second = archive(b"the same binary", Some(b"license")).unwrap();
        assert_eq!(first, second);
        // gzip's header: no mtime (bytes 4..8) and no file name (FLG 0).
        assert_eq!(&first[..4], &[0x1f, 0x8b, 8, 0]);
        assert_eq!(&first[4..8], &[0, 0, 0, 0]);
        assert_ne!(first, archive(b"another binary", Some(b"license")).unwrap());
    }

    #[test]
    fn a_known_archive_has_a_known_sha256() {
        // Pinned: a change here changes every released archive's sha256
        // (the tar layout, the gzip header or the compressor's output), and
        // with it what a reproducible build promises.
        let packed = archive(b"kubectl-petstore\n", Some(b"LICENSE\n")).unwrap();
        assert_eq!(
            sha256_hex(&packed),
            "c4312dd54ded4328a7703551df4327ccdc9bdbd362fc5728e2514f8c22225194"
        );
    }

    #[test]
    fn rust_platform_names_become_krews() {
        assert_eq!(
            Platform::from_rust("linux", "x86_64").unwrap(),
            Platform {
                os: "linux".into(),
                arch: "amd64".into()
            }
        );
        assert_eq!(
            Platform::from_rust("macos", "aarch64").unwrap(),
            Platform {
                os: "darwin".into(),
                arch: "arm64".into()
            }
        );
        assert!(Platform::from_rust("freebsd", "x86_64").is_err());
        assert!(Platform::from_rust("linux", "riscv64").is_err());
    }

    #[test]
    fn release_writes_the_archive_and_a_manifest_naming_its_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join(BINARY);
        std::fs::write(&binary, elf(0x3e)).unwrap();
        let license = dir.path().join("LICENSE");
        std::fs::write(&license, b"license text").unwrap();
        let out = dir.path().join("out");
        let released = release(&Release {
            binaries: &[&binary],
            license: Some(&license),
            version: "1.2.3",
            uri_base: "https://downloads.example.com/petstore/v1.2.3/",
            out: &out,
        })
        .unwrap();

        let name = "kubectl-petstore_v1.2.3_linux_amd64.tar.gz";
        assert_eq!(released.manifest, out.join("petstore.yaml"));
        assert_eq!(released.archives.len(), 1);
        let archive_file = &released.archives[0];
        assert_eq!(archive_file.path, out.join(name));
        let bytes = std::fs::read(&archive_file.path).unwrap();
        // The manifest's sha256 is the written file's, and the file is what
        // archive() makes of the inputs.
        assert_eq!(bytes, archive(&elf(0x3e), Some(b"license text")).unwrap());
        let sha256 = sha256_hex(&bytes);

        let yaml = std::fs::read_to_string(&released.manifest).unwrap();
        let manifest: serde_json::Value = serde_norway::from_str(&yaml).unwrap();
        assert_eq!(
            manifest,
            serde_json::json!({
                "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
                "kind": "Plugin",
                "metadata": {"name": "petstore"},
                "spec": {
                    "version": "v1.2.3",
                    "homepage": HOMEPAGE,
                    "shortDescription": SHORT_DESCRIPTION,
                    "description": DESCRIPTION,
                    "platforms": [{
                        "selector": {"matchLabels": {"os": "linux", "arch": "amd64"}},
                        "uri": format!("https://downloads.example.com/petstore/v1.2.3/{name}"),
                        "sha256": sha256,
                        "bin": "kubectl-petstore",
                    }],
                },
            })
        );
        // krew refuses a short description over one line.
        assert!(!SHORT_DESCRIPTION.contains('\n'));
    }

    #[test]
    fn the_manifest_carries_a_known_archive_sha256() {
        // An archive whose digest is known: "abc" (FIPS 180-2).
        let archives = [Archive {
            platform: Platform::from_rust("linux", "x86_64").unwrap(),
            path: PathBuf::from("unused"),
            uri: "http://127.0.0.1:1/a.tar.gz".into(),
            sha256: sha256_hex(b"abc"),
        }];
        let yaml = manifest_yaml("v0.1.0", &archives).unwrap();
        let manifest: serde_json::Value = serde_norway::from_str(&yaml).unwrap();
        assert_eq!(
            manifest["spec"]["platforms"][0]["sha256"],
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(manifest["spec"]["version"], "v0.1.0");
    }

    #[test]
    fn a_base_uri_that_is_not_http_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let refused = release(&Release {
            binaries: &[&dir.path().join("missing")],
            license: None,
            version: "0.1.0",
            uri_base: "file:///srv/archives",
            out: dir.path(),
        });
        assert!(matches!(refused, Err(Error::UriBase(_))), "{refused:?}");
    }
}
