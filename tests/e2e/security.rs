//! Mutual TLS between the operator and the store, with certificates from
//! files: the user story works over it, and clients without the right
//! credentials are refused.

use std::time::Duration;

use fixtures::petstore::grpcurl_with;
use fixtures::{Env, Storage, repo_root};

#[test]
fn operator_and_store_speak_mutual_tls_and_strangers_are_refused() -> fixtures::Result<()> {
    let env = Env::start_with(Storage::Durable, true)?;
    let _operator = env.start_operator("operator")?;
    let samples = repo_root().join("config/samples");
    env.cp
        .kubectl(&["apply", "-k", &samples.to_string_lossy()])?;
    let thor = env.wait_ready("default", "pet-sample1", Duration::from_secs(60))?;
    let pets = env.store_pets()?;
    assert!(pets.iter().any(|p| p["id"] == thor.as_str()));

    let tls = env.tls.as_ref().expect("mutual TLS is on");
    let search = "petstore.PetStore/SearchPets";
    // A refused handshake makes grpcurl retry until its deadline; keep it short.
    let quick = ["-connect-timeout".as_ref(), "2".as_ref()];
    // Plaintext is refused.
    assert!(
        grpcurl_with(
            &[quick[0], quick[1], "-plaintext".as_ref()],
            &env.store.addr,
            search,
            "{}"
        )
        .is_err()
    );
    // TLS without a client certificate is refused.
    assert!(
        grpcurl_with(
            &[quick[0], quick[1], "-cacert".as_ref(), tls.ca.as_os_str()],
            &env.store.addr,
            search,
            "{}"
        )
        .is_err()
    );
    // A client certificate from another CA is refused.
    let stranger = fixtures::certs::Pki::create(&env.cp.dir().join("stranger"), "stranger", &[])?;
    let (stranger_cert, stranger_key) = stranger.issue_client("stranger")?;
    assert!(
        grpcurl_with(
            &[
                quick[0],
                quick[1],
                "-cacert".as_ref(),
                tls.ca.as_os_str(),
                "-cert".as_ref(),
                stranger_cert.as_os_str(),
                "-key".as_ref(),
                stranger_key.as_os_str(),
            ],
            &env.store.addr,
            search,
            "{}"
        )
        .is_err()
    );
    Ok(())
}
