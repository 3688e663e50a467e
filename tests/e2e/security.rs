//! Mutual TLS between the operator and the store, with certificates from
//! files: the user story works over it, and clients without the right
//! credentials are refused.

use std::ffi::OsStr;

use fixtures::certs::Pki;
use fixtures::petstore::grpcurl_with;
use fixtures::{Env, Storage, repo_root};

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
    // A refused handshake makes grpcurl retry until its deadline; keep it short.
    let refused = |flags: &[&OsStr]| {
        let flags = [&["-connect-timeout".as_ref(), "2".as_ref()], flags].concat();
        grpcurl_with(
            &flags,
            &env.store.addr,
            "petstore.PetStore/SearchPets",
            "{}",
        )
        .is_err()
    };
    assert!(refused(&["-plaintext".as_ref()]), "plaintext");
    assert!(
        refused(&["-cacert".as_ref(), tls.ca.as_os_str()]),
        "TLS without a client certificate"
    );
    assert!(
        refused(&[
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
