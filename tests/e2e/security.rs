//! Mutual TLS between the operator and the store, with certificates from
//! files, or made by the operator itself (`--store-certificates`, as
//! `config/` runs it): the user story works over it, and clients without
//! the right credentials are refused.

use std::ffi::OsStr;

use fixtures::certs::Pki;
use fixtures::petstore::{StoreTls, grpcurl_with};
use fixtures::{Env, Kubectl, Storage, repo_root, wait_for};

#[test]
fn operator_and_store_speak_mutual_tls_and_strangers_are_refused() -> fixtures::Result<()> {
    let env = Env::start_with(Storage::Durable, true)?;
    let _operator = env.start_operator("operator")?;
    let (thor, _) = env.apply_samples()?;
    // Read over mutual TLS, with the operator's CA and a client certificate.
    let pets = env.store_pets()?;
    assert!(pets.iter().any(|p| p["id"] == thor.as_str()));
    // With only the shipped RBAC, the operator made its webhook's Secret
    // and put its CA into the CRD: the API server converts over TLS.
    let alpha = env.cp.kubectl(&[
        "get",
        "pets.v1alpha1.petstore.example.com",
        "pet-sample1",
        "-o",
        "jsonpath={.spec.birthday}",
    ])?;
    assert_eq!(alpha, "2021-04-01T00:00:00Z");

    let tls = env.tls.as_ref().expect("mutual TLS is on");
    // kubectl petstore plan speaks the operator's TLS flags: the samples
    // plan nothing (exit 0); without the flags the store refuses it (1).
    let samples = std::fs::read_to_string(repo_root().join("config/samples/petstore_v1_pet.yaml"))
        .map_err(fixtures::io("reading the samples"))?;
    let addr = ["--petstore-addr".into(), env.store.addr.clone().into()];
    let with_tls = tls.client_flags();
    let planned = env.kubectl_petstore_plan(&samples, &[&addr[..], &with_tls].concat())?;
    assert_eq!(
        planned.code,
        Some(0),
        "{}{}",
        planned.stdout,
        planned.stderr
    );
    assert_eq!(
        planned.stdout.matches(r#""summary":"none""#).count(),
        2,
        "{}",
        planned.stdout
    );
    let plaintext = env.kubectl_petstore_plan(&samples, &addr)?;
    assert_eq!(plaintext.code, Some(1), "{}", plaintext.stderr);
    assert!(
        plaintext.stderr.contains("reading the store"),
        "{}",
        plaintext.stderr
    );
    let stranger = Pki::create(&env.cp.dir().join("stranger"), "stranger", &[])?;
    let (stranger_cert, stranger_key) = stranger.issue_client("stranger")?;
    let is_refused = |flags: &[&OsStr]| refused(&env.store.addr, flags);
    assert!(is_refused(&["-plaintext".as_ref()]), "plaintext");
    assert!(
        is_refused(&["-cacert".as_ref(), tls.ca.as_os_str()]),
        "TLS without a client certificate"
    );
    assert!(
        is_refused(&[
            "-cacert".as_ref(),
            tls.ca.as_os_str(),
            "-cert".as_ref(),
            stranger_cert.as_os_str(),
            "-key".as_ref(),
            stranger_key.as_os_str(),
        ]),
        "a client certificate from another CA"
    );
    Ok(())
}

/// Whether the store at `addr` refuses a SearchPets made with grpcurl's
/// connection `flags`. A refused handshake makes grpcurl retry until its
/// deadline; keep it short.
fn refused(addr: &str, flags: &[&OsStr]) -> bool {
    let flags = [&["-connect-timeout".as_ref(), "2".as_ref()], flags].concat();
    grpcurl_with(&flags, addr, "petstore.PetStore/SearchPets", "{}").is_err()
}

/// One key of a Secret, decoded, as the README's quick start reads it:
/// `kubectl get secret -o go-template=...`.
fn secret_key(env: &Env, name: &str, key: &str) -> fixtures::Result<String> {
    env.cp.kubectl(&[
        "get",
        "secret",
        name,
        "-n",
        "petstore",
        "-o",
        &format!("go-template={{{{index .data \"{key}\" | base64decode}}}}"),
    ])
}

/// The subject CN of the PEM certificate at `path`, as openssl prints it.
fn common_name(path: &std::path::Path) -> fixtures::Result<String> {
    let subject = fixtures::run(
        std::process::Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-nameopt", "multiline", "-in"])
            .arg(path),
    )?;
    Ok(subject
        .lines()
        .find_map(|line| line.trim().strip_prefix("commonName"))
        .and_then(|rest| rest.split_once('='))
        .map(|(_, name)| name.trim().to_owned())
        .unwrap_or_default())
}

/// A client certificate for `common_name`, signed by the CA in `dir`
/// (`ca.crt`, `ca.key`), as openssl makes one: `<file>.crt`, `<file>.key`.
fn issue_client(
    dir: &std::path::Path,
    common_name: &str,
    file: &str,
) -> fixtures::Result<(std::path::PathBuf, std::path::PathBuf)> {
    let (cert, key, request) = (
        dir.join(format!("{file}.crt")),
        dir.join(format!("{file}.key")),
        dir.join(format!("{file}.csr")),
    );
    let usage = dir.join(format!("{file}.ext"));
    std::fs::write(
        &usage,
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .map_err(fixtures::io("writing the extensions"))?;
    fixtures::run(
        std::process::Command::new("openssl")
            .args(["req", "-new", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-subj"])
            .arg(format!("/CN={common_name}"))
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&request),
    )?;
    fixtures::run(
        std::process::Command::new("openssl")
            .args(["x509", "-req", "-days", "1", "-in"])
            .arg(&request)
            .arg("-CA")
            .arg(dir.join("ca.crt"))
            .arg("-CAkey")
            .arg(dir.join("ca.key"))
            .arg("-set_serial")
            .arg("4242")
            .arg("-extfile")
            .arg(&usage)
            .arg("-out")
            .arg(&cert),
    )?;
    Ok((cert, key))
}

/// `object` is `secrets/<name>` or `configmaps/<name>`, in `petstore`.
fn resource_version(env: &Env, object: &str) -> fixtures::Result<String> {
    let read = env
        .cp
        .get(&format!("/api/v1/namespaces/petstore/{object}"))?;
    Ok(read["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

/// `config/`'s defaults: the operator makes a CA, its own client
/// certificate and the store's certificate, and publishes the cluster's
/// token issuer, all in the store's namespace, with no RBAC but what
/// `config/` ships. The store, given those files as its Pod mounts them,
/// with tenancy, serves the user story over mutual TLS with each Pet's
/// namespace's token; it refuses plaintext, a client without a
/// certificate, and a call without a token, and shows another namespace
/// none of these records. A second replica, starting after, rewrites
/// nothing; one starting when the certificates are due renews them.
#[test]
fn the_store_set_up_as_config_does_trusts_only_the_operators_certificate_and_each_namespaces_token()
-> fixtures::Result<()> {
    let mut env = Env::start_with(Storage::Durable, false)?;
    // The store waits for its certificate, as its Pod does for its volume.
    env.store.kill();
    env.cp.ensure_namespace("petstore")?;
    let trust_role = repo_root().join("config/petstore/trust_role.yaml");
    env.cp
        .kubectl(&["apply", "-f", &trust_role.to_string_lossy()])?;
    let made_here = |dir: &str| {
        vec![
            "--store-certificates".into(),
            "petstore/petstore-tls".into(),
            "--store-certificates-dir".into(),
            env.cp.dir().join(dir).into_os_string(),
            "--publish-token-issuer".into(),
            "petstore/petstore-token-issuer".into(),
            "--petstore-audience".into(),
            "petstore".into(),
        ]
    };
    let mut options = env.operator_options("operator");
    options.extra_args.extend(made_here("operator-store-tls"));
    let _operator = env.start_operator_with(&options)?;

    let objects = [
        "secrets/petstore-tls",
        "secrets/petstore-store-client",
        "configmaps/petstore-token-issuer",
    ];
    for object in objects {
        wait_for(std::time::Duration::from_secs(30), object, || {
            resource_version(&env, object).ok()
        })?;
    }
    let files = env.cp.dir().join("store-files");
    std::fs::create_dir_all(&files).map_err(fixtures::io("creating the files' directory"))?;
    let mut pems = std::collections::BTreeMap::new();
    for (secret, key, file) in [
        ("petstore-tls", "tls.crt", "store.crt"),
        ("petstore-tls", "tls.key", "store.key"),
        ("petstore-tls", "ca.crt", "client-ca.crt"),
        ("petstore-store-client", "tls.crt", "client.crt"),
        ("petstore-store-client", "tls.key", "client.key"),
        ("petstore-store-client", "ca.crt", "ca.crt"),
    ] {
        let pem = secret_key(&env, secret, key)?;
        assert!(pem.contains("-----BEGIN"), "{secret} {key}: {pem}");
        std::fs::write(files.join(file), &pem).map_err(fixtures::io("writing a PEM"))?;
        pems.insert(file, pem);
    }
    assert_eq!(
        pems["client-ca.crt"], pems["ca.crt"],
        "the store checks clients by the operator's CA"
    );
    let store_secret = env
        .cp
        .get("/api/v1/namespaces/petstore/secrets/petstore-tls")?;
    assert!(
        store_secret["data"].get("ca.key").is_none(),
        "the store's Secret holds no CA key: {store_secret}"
    );
    // The operator reads its own certificate from the files it wrote.
    let own = std::fs::read_to_string(env.cp.dir().join("operator-store-tls/tls.crt"))
        .map_err(fixtures::io("reading the operator's certificate"))?;
    assert_eq!(own, pems["client.crt"]);
    // The issuer, as the API server describes it.
    let issuer = env
        .cp
        .get("/api/v1/namespaces/petstore/configmaps/petstore-token-issuer")?;
    let published = |key: &str| issuer["data"][key].as_str().unwrap_or_default().to_owned();
    assert_eq!(published("issuer"), fixtures::control_plane::DEFAULT_ISSUER);
    let jwks = env.cp.kubectl(&["get", "--raw", "/openid/v1/jwks"])?;
    assert_eq!(published("jwks.json").trim(), jwks.trim());
    let jwks_file = files.join("jwks.json");
    std::fs::write(&jwks_file, published("jwks.json")).map_err(fixtures::io("writing the JWKS"))?;

    let tls = StoreTls {
        ca: files.join("ca.crt"),
        cert: files.join("store.crt"),
        key: files.join("store.key"),
        client_cert: files.join("client.crt"),
        client_key: files.join("client.key"),
    };
    env.store.set_restart_args(vec![
        "--tenancy".into(),
        "--token-issuer".into(),
        format!("{}={}", published("issuer"), jwks_file.display()).into(),
        "--token-audience".into(),
        "petstore".into(),
        "--observer".into(),
        "system:serviceaccount:petstore-system:petstore-operator".into(),
    ]);
    env.store.restart_with_tls(tls.clone())?;
    let (thor, tron) = env.apply_samples()?;

    let with_certificate = tls.grpcurl_flags();
    let search_as = |namespace: &str| -> fixtures::Result<Vec<String>> {
        let header = format!(
            "authorization: Bearer {}",
            env.cp.tenant_token(namespace, "petstore")?
        );
        let flags: Vec<&OsStr> = with_certificate
            .iter()
            .map(|f| f.as_os_str())
            .chain(["-H".as_ref(), header.as_ref()])
            .collect();
        let pets = grpcurl_with(
            &flags,
            &env.store.addr,
            "petstore.PetStore/SearchPets",
            "{}",
        )?;
        Ok(pets
            .iter()
            .filter_map(|pet| pet["id"].as_str().map(str::to_owned))
            .collect())
    };
    let ids = search_as("default")?;
    assert!(ids.contains(&thor) && ids.contains(&tron), "{ids:?}");
    env.cp.ensure_namespace("team-b")?;
    env.cp.create_tenant("team-b")?;
    let team_b = search_as("team-b")?;
    assert!(
        team_b.is_empty(),
        "team-b reads default's records: {team_b:?}"
    );

    // The operator's certificate names its ServiceAccount, the store's
    // observer: the README's grpcurl carries each namespace's token with it.
    assert_eq!(
        common_name(&files.join("client.crt"))?,
        "system:serviceaccount:petstore-system:petstore-operator"
    );
    // The attack: a certificate from the store's own CA (its key taken from
    // the operator's Secret) for another account, carrying a stolen token
    // of namespace default. Refused, counted, nothing written; the same
    // certificate with its own account's token is team-b's.
    std::fs::write(
        files.join("ca.key"),
        secret_key(&env, "petstore-store-client", "ca.key")?,
    )
    .map_err(fixtures::io("writing the CA key"))?;
    let (other_cert, other_key) = issue_client(
        &files,
        "system:serviceaccount:team-b:petstore-tenant",
        "other",
    )?;
    let with_other: Vec<&OsStr> = [
        "-cacert".as_ref(),
        tls.ca.as_os_str(),
        "-cert".as_ref(),
        other_cert.as_os_str(),
        "-key".as_ref(),
        other_key.as_os_str(),
    ]
    .into();
    let call_as = |flags: &[&OsStr], namespace: &str, method: &str, data: &str| {
        let header = format!(
            "authorization: Bearer {}",
            env.cp.tenant_token(namespace, "petstore")?
        );
        let flags = [flags, &["-H".as_ref(), header.as_ref()]].concat();
        grpcurl_with(
            &flags,
            &env.store.addr,
            &format!("petstore.PetStore/{method}"),
            data,
        )
    };
    let refusals = || -> fixtures::Result<f64> {
        let scrape = fixtures::http::scrape(&env.store.metrics_addr)?;
        Ok(fixtures::http::sum_series(
            &scrape,
            "petstore_server_tenant_refusals_total",
            "reason=\"certificate_mismatch\"",
        ))
    };
    let counted = refusals()?;
    let stolen = r#"{"pets":[{"name":"Stolen","type":"PTCanine","birthday":{"year":2021,"month":4,"day":1}}]}"#;
    for (method, data) in [("AddPets", stolen), ("SearchPets", "{}")] {
        let refused = call_as(&with_other, "default", method, data)
            .expect_err("a certificate of another account with a stolen token");
        let said = refused.to_string();
        assert!(
            said.contains("PermissionDenied")
                && said.contains("system:serviceaccount:team-b:petstore-tenant")
                && said.contains("system:serviceaccount:default:petstore-tenant"),
            "{method}: {said}"
        );
    }
    assert_eq!(refusals()? - counted, 2.0, "both refusals counted");
    let after = search_as("default")?;
    assert_eq!(after.len(), ids.len(), "nothing written: {after:?}");
    let own = call_as(&with_other, "team-b", "SearchPets", "{}")?;
    assert!(own.is_empty(), "team-b's certificate as team-b: {own:?}");

    let is_refused = |flags: &[&OsStr]| refused(&env.store.addr, flags);
    assert!(is_refused(&["-plaintext".as_ref()]), "plaintext");
    assert!(
        is_refused(&["-cacert".as_ref(), tls.ca.as_os_str()]),
        "TLS without a client certificate"
    );
    let certificate: Vec<&OsStr> = with_certificate.iter().map(|f| f.as_os_str()).collect();
    assert!(is_refused(&certificate), "a call without a token");

    // A second replica, started now, reads all three and writes none.
    let versions = || -> fixtures::Result<Vec<String>> {
        objects
            .iter()
            .map(|object| resource_version(&env, object))
            .collect()
    };
    let before = versions()?;
    let mut standby = env.operator_options("standby");
    standby.extra_args.extend(made_here("standby-store-tls"));
    let standby = env.start_operator_with(&standby)?;
    // Starting waited for its webhook only; its store certificates and the
    // issuer come after.
    wait_for(
        std::time::Duration::from_secs(30),
        "the standby's store certificate and issuer checked",
        || {
            (standby.log_contains("the store's certificate is ready")
                && standby.log_contains("the token issuer is published"))
            .then_some(())
        },
    )?;
    assert_eq!(before, versions()?, "a second replica rewrote one");

    // The store's, the operator's and the webhook's certificates due for
    // renewal (their recorded validity ends in a minute, within its last
    // third), and the issuer's keys tampered with: a replica starting now
    // renews all three, keeping the CA, reads its renewed one, and puts the
    // keys back.
    let soon = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 60)
        .to_string();
    for secret in ["petstore-tls", "petstore-store-client"] {
        env.cp.kubectl(&[
            "annotate",
            "secret",
            secret,
            "-n",
            "petstore",
            "--overwrite",
            &format!("petstore.example.com/serving-not-after={soon}"),
        ])?;
    }
    env.cp.kubectl(&[
        "patch",
        "configmap",
        "petstore-token-issuer",
        "-n",
        "petstore",
        "--type=merge",
        "-p",
        r#"{"data":{"jwks.json":"{\"keys\":[]}"}}"#,
    ])?;
    // The webhook's certificate too, in the operator's namespace.
    let webhook_secret = "/api/v1/namespaces/petstore-system/secrets/petstore-operator-webhook-tls";
    let webhook_before = env.cp.get(webhook_secret)?["data"]["tls.crt"].clone();
    env.cp.kubectl(&[
        "annotate",
        "secret",
        "petstore-operator-webhook-tls",
        "-n",
        "petstore-system",
        "--overwrite",
        &format!("petstore.example.com/serving-not-after={soon}"),
    ])?;
    let mut renewer = env.operator_options("renewer");
    renewer.extra_args.extend(made_here("renewer-store-tls"));
    let _renewer = env.start_operator_with(&renewer)?;
    // The store channel's certificates come after the webhook is serving,
    // which is all that starting the replica waited for.
    for (secret, before) in [
        ("petstore-tls", &pems["store.crt"]),
        ("petstore-store-client", &pems["client.crt"]),
    ] {
        wait_for(
            std::time::Duration::from_secs(30),
            &format!("{secret} renewed"),
            || {
                secret_key(&env, secret, "tls.crt")
                    .ok()
                    .filter(|renewed| renewed != before)
            },
        )?;
    }
    assert_eq!(
        secret_key(&env, "petstore-store-client", "ca.crt")?,
        pems["ca.crt"],
        "the renewal keeps the CA"
    );
    assert_ne!(
        env.cp.get(webhook_secret)?["data"]["tls.crt"],
        webhook_before,
        "the webhook's certificate not renewed"
    );
    let restored = wait_for(
        std::time::Duration::from_secs(30),
        "the issuer's keys put back",
        || {
            let issuer = env
                .cp
                .get("/api/v1/namespaces/petstore/configmaps/petstore-token-issuer")
                .ok()?;
            let keys = issuer["data"]["jwks.json"].as_str()?.trim().to_owned();
            (keys == jwks.trim()).then_some(keys)
        },
    )?;
    assert!(restored.contains("\"kid\""), "{restored}");
    // The renewing replica reads the certificate it renewed.
    let renewed = secret_key(&env, "petstore-store-client", "tls.crt")?;
    let own = env.cp.dir().join("renewer-store-tls/tls.crt");
    wait_for(
        std::time::Duration::from_secs(30),
        "the renewer's own certificate file",
        || (std::fs::read_to_string(&own).ok()? == renewed).then_some(()),
    )?;
    Ok(())
}

/// One TLS handshake as a scanner tries it: `openssl s_client` offering
/// only `args`' protocol and suites. Whether it was made, and the output.
fn handshake(
    addr: &str,
    args: &[&str],
    client: Option<&fixtures::petstore::StoreTls>,
) -> (bool, String) {
    let mut command = std::process::Command::new("openssl");
    command
        .args(["s_client", "-brief", "-connect", addr])
        .args(args);
    if let Some(tls) = client {
        command
            .arg("-cert")
            .arg(&tls.client_cert)
            .arg("-key")
            .arg(&tls.client_key);
    }
    let output = command.stdin(std::process::Stdio::null()).output();
    match output {
        Ok(output) => {
            let text = fixtures::printed(&output);
            (text.contains("Protocol version:"), text)
        }
        Err(error) => (false, format!("openssl: {error}")),
    }
}

/// What a scanner offers, and whether a modern server may accept it.
/// `@SECLEVEL=0` lets the client offer what its own defaults would not.
/// Not probed, because no handshake can show them: RC4 and 3DES (Debian's
/// OpenSSL 3 cannot offer them), and RSA key exchange (it needs an RSA
/// certificate; the project's are ECDSA P-256).
const PROBES: [(&str, &[&str], bool); 6] = [
    ("TLS 1.3", &["-tls1_3"], true),
    (
        "TLS 1.2, ECDHE with AES-GCM",
        &["-tls1_2", "-cipher", "ECDHE+AESGCM"],
        true,
    ),
    ("TLS 1.0", &["-tls1", "-cipher", "ALL:@SECLEVEL=0"], false),
    ("TLS 1.1", &["-tls1_1", "-cipher", "ALL:@SECLEVEL=0"], false),
    (
        "TLS 1.2, CBC suites",
        &[
            "-tls1_2",
            "-cipher",
            "ECDHE+AES+SHA1:ECDHE+AES+SHA256:@SECLEVEL=0",
        ],
        false,
    ),
    (
        "TLS 1.2, NULL encryption",
        &["-tls1_2", "-cipher", "eNULL:@SECLEVEL=0"],
        false,
    ),
];

/// The store and the operator's webhook speak TLS 1.3 and TLS 1.2 with
/// AEAD suites only: a scanner offering TLS 1.0 or 1.1, or a weak TLS 1.2
/// suite, gets no handshake. The same probes first make a handshake with
/// a server that allows everything (`openssl s_server`, with the store's
/// certificate), so a probe the client itself could not offer passes
/// nothing.
#[test]
fn the_store_and_the_webhook_speak_modern_tls_only() -> fixtures::Result<()> {
    let env = Env::start_with(Storage::Memory, true)?;
    let tls = env.tls.clone().expect("mutual TLS is on");
    let options = env.operator_options("modern-tls");
    let webhook = options
        .extra_args
        .iter()
        .skip_while(|arg| arg.as_os_str() != OsStr::new("--webhook-listen"))
        .nth(1)
        .map(|addr| addr.to_string_lossy().into_owned())
        .expect("the fixtures give the webhook an address");
    let _operator = env.start_operator_with(&options)?;

    let control_addr = format!("127.0.0.1:{}", fixtures::free_port()?);
    let control = std::process::Command::new("openssl")
        .args([
            "s_server",
            "-quiet",
            "-accept",
            &control_addr,
            "-min_protocol",
            "TLSv1",
        ])
        .args(["-cipher", "ALL:eNULL:@SECLEVEL=0"])
        .arg("-cert")
        .arg(&tls.cert)
        .arg("-key")
        .arg(&tls.key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(fixtures::io("starting openssl s_server"))?;
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _control = Stop(control);
    fixtures::wait_for(
        std::time::Duration::from_secs(10),
        "openssl s_server",
        || std::net::TcpStream::connect(&control_addr).ok(),
    )?;

    let mut wrong = Vec::new();
    for (name, args, modern) in PROBES {
        let (made, text) = handshake(&control_addr, args, None);
        if !made {
            wrong.push(format!(
                "{name}: the probe made no handshake with a server that allows it: {text}"
            ));
            continue;
        }
        for (server, addr, client) in [
            ("the store", env.store.addr.as_str(), Some(&tls)),
            ("the webhook", webhook.as_str(), None),
        ] {
            let (made, text) = handshake(addr, args, client);
            if made != modern {
                let verdict = if modern { "refused" } else { "accepted" };
                wrong.push(format!("{server} {verdict} {name}: {text}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    Ok(())
}
