//! v1alpha1 and v1 on the real API server, through the operator's conversion
//! webhook: the book's unchanged v1alpha1 sample applies and reads back
//! exactly as written, `kubectl get pets` (v1) shows the calendar date,
//! kubectl prints the deprecation warning, the Pets become Ready with the
//! right store records, and replicas starting at once share one Secret, so
//! that the one that did not create it converts with the writer gone; or,
//! with `--webhook-cert-dir`, the webhook serves cert-manager's files and
//! follows them as they change.

use std::process::Command;
use std::time::Duration;

use fixtures::env::{
    OPERATOR_NAMESPACE, install_crd_guard, install_store_guard, wait_until_converting, webhook_args,
};
use fixtures::{Env, Operator, Storage, Tools, repo_root};
use petstore_operator::certs::{CaAndLeaf, unix_now};
use petstore_operator::crd::{CRD_GUARD_CONFIGURATION, STORE_GUARD_CONFIGURATION};
use petstore_operator::webhook::certs::WEBHOOK;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);
const SECRET: &str = "petstore-operator-webhook-tls";
const BIRTHDAY_ANNOTATION: &str = "petstore.example.com/v1alpha1-birthday";
/// A birthday late on 1 April at -05:00, already 2 April in UTC.
const OFFSET_PET: &str = "apiVersion: petstore.example.com/v1alpha1
kind: Pet
metadata:
  name: late-bird
  namespace: default
spec:
  name: Late Bird
  type: bird
  birthday: 2021-04-01T23:30:00-05:00
";

/// `kubectl args...` as the admin: (stdout, stderr), failing on an error.
fn kubectl(env: &Env, args: &[&str], stdin: Option<&str>) -> fixtures::Result<(String, String)> {
    use std::io::Write as _;
    let mut command = Command::new(Tools::get()?.kubectl());
    command
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().map_err(fixtures::io("starting kubectl"))?;
    if let (Some(mut pipe), Some(input)) = (child.stdin.take(), stdin) {
        pipe.write_all(input.as_bytes())
            .map_err(fixtures::io("writing to kubectl"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(fixtures::io("waiting for kubectl"))?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    if !out.status.success() {
        return Err(fixtures::Error::Command {
            command: format!("kubectl {}", args.join(" ")),
            status: out.status.to_string(),
            stderr,
        });
    }
    Ok((stdout, stderr))
}

fn alpha_pet(env: &Env, name: &str) -> fixtures::Result<Value> {
    env.cp.kubectl_json(&[
        "get",
        "pets.v1alpha1.petstore.example.com",
        name,
        "-n",
        "default",
    ])
}

/// The object as the user's last `kubectl apply` sent it.
fn last_applied(pet: &Value) -> Value {
    let text = pet["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .unwrap_or("{}");
    serde_json::from_str(text).unwrap_or(Value::Null)
}

#[test]
fn the_books_v1alpha1_sample_reads_back_exactly_and_is_stored_as_v1() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;

    // The book's file, unchanged, in the deprecated version.
    let book = repo_root().join("config/samples/petstore_v1alpha1_pet.yaml");
    let (_, warnings) = kubectl(&env, &["apply", "-f", &book.to_string_lossy()], None)?;
    assert!(
        warnings.contains(
            "petstore.example.com/v1alpha1 Pet is deprecated; use petstore.example.com/v1"
        ),
        "kubectl prints the deprecation warning: {warnings:?}"
    );
    kubectl(&env, &["apply", "-f", "-"], Some(OFFSET_PET))?;

    // Ready, with the right calendar dates in the store.
    let thor = env.wait_ready("default", "pet-sample1", TIMEOUT)?;
    let tron = env.wait_ready("default", "pet-sample2", TIMEOUT)?;
    let late = env.wait_ready("default", "late-bird", TIMEOUT)?;
    let store = env.store_pets()?;
    let birthday = |id: &str| {
        store
            .iter()
            .find(|p| p["id"] == id)
            .map(|p| p["birthday"].clone())
    };
    assert_eq!(
        birthday(&thor),
        Some(json!({"year": 2021, "month": 4, "day": 1}))
    );
    assert_eq!(
        birthday(&tron),
        Some(json!({"year": 2020, "month": 6, "day": 25}))
    );
    // 1 April in its own offset, not 2 April in UTC.
    assert_eq!(
        birthday(&late),
        Some(json!({"year": 2021, "month": 4, "day": 1}))
    );

    // v1alpha1 reads back exactly what was applied, offset and all, with no
    // trace of the conversion's annotation.
    for name in ["pet-sample1", "pet-sample2", "late-bird"] {
        let pet = alpha_pet(&env, name)?;
        assert_eq!(pet["apiVersion"], "petstore.example.com/v1alpha1");
        assert_eq!(pet["spec"], last_applied(&pet)["spec"], "{name}: {pet}");
        assert!(
            pet["metadata"]["annotations"]
                .get(BIRTHDAY_ANNOTATION)
                .is_none(),
            "{name}: {pet}"
        );
    }
    assert_eq!(
        alpha_pet(&env, "late-bird")?["spec"]["birthday"],
        "2021-04-01T23:30:00-05:00"
    );
    assert_eq!(
        alpha_pet(&env, "pet-sample1")?["spec"]["birthday"],
        "2021-04-01T00:00:00Z"
    );

    // v1, the default: the calendar date; the timestamp kept aside only
    // where the date alone would lose it.
    let late_v1 = env.pet("default", "late-bird")?;
    assert_eq!(late_v1["apiVersion"], "petstore.example.com/v1");
    assert_eq!(late_v1["spec"]["birthday"], "2021-04-01");
    assert_eq!(
        late_v1["metadata"]["annotations"][BIRTHDAY_ANNOTATION],
        "2021-04-01T23:30:00-05:00"
    );
    let thor_v1 = env.pet("default", "pet-sample1")?;
    assert_eq!(thor_v1["spec"]["birthday"], "2021-04-01");
    assert!(
        thor_v1["metadata"]["annotations"]
            .get(BIRTHDAY_ANNOTATION)
            .is_none(),
        "midnight UTC needs no annotation: {thor_v1}"
    );
    let (table, warnings) = kubectl(&env, &["get", "pets"], None)?;
    assert!(
        table.contains("2021-04-01") && table.contains("2020-06-25"),
        "{table}"
    );
    assert!(!table.contains("T00:00:00Z"), "{table}");
    assert!(!warnings.contains("deprecated"), "v1 is not: {warnings}");

    // A date changed through v1 wins over the kept timestamp, which goes.
    env.patch_spec("default", "late-bird", r#"{"birthday":"2021-05-02"}"#)?;
    let moved = alpha_pet(&env, "late-bird")?;
    assert_eq!(moved["spec"]["birthday"], "2021-05-02T00:00:00Z");
    env.wait_ready("default", "late-bird", TIMEOUT)?;
    let store = env.store_pets()?;
    let moved_record = store.iter().find(|p| p["id"] == late.as_str());
    assert_eq!(
        moved_record.map(|p| p["birthday"].clone()),
        Some(json!({"year": 2021, "month": 5, "day": 2}))
    );
    Ok(())
}

fn secret(env: &Env) -> fixtures::Result<Value> {
    env.cp
        .kubectl_json(&["get", "secret", SECRET, "-n", OPERATOR_NAMESPACE])
}

#[test]
fn two_operators_starting_at_once_share_one_secret_and_either_converts() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    assert!(secret(&env).is_err(), "no Secret before the operators");

    // Both processes start before either is waited for: they race to
    // create the Secret.
    let webhook = |identity: &str| -> fixtures::Result<_> {
        let args = webhook_args()?;
        let url = args[3].to_string_lossy().into_owned();
        let mut options = env.operator_options(identity);
        options.extra_args = args;
        Ok((options, url))
    };
    let (options_a, url_a) = webhook("operator-a")?;
    let (options_b, url_b) = webhook("operator-b")?;
    let log = |identity: &str| env.cp.dir().join(format!("{identity}.log"));
    let mut a = Operator::start(&options_a, &log("operator-a"))?;
    let mut b = Operator::start(&options_b, &log("operator-b"))?;
    wait_until_converting(&env.cp, &mut a)?;
    wait_until_converting(&env.cp, &mut b)?;
    assert!(
        a.process().is_running() && b.process().is_running(),
        "both serve: a: {} b: {}",
        a.process().log_tail(20),
        b.process().log_tail(20)
    );

    // One Secret, never replaced: its CA is the CRD's bundle.
    let first = secret(&env)?;
    let ca = first["data"]["ca.crt"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!ca.is_empty(), "{first}");
    let crd = env
        .cp
        .kubectl_json(&["get", "crd", "pets.petstore.example.com"])?;
    let client_config = &crd["spec"]["conversion"]["webhook"]["clientConfig"];
    assert_eq!(client_config["caBundle"], ca.as_str());
    assert!(client_config["url"].as_str().is_some(), "{client_config}");

    // Exactly one replica created the Secret (and so the certificate the
    // CRD's bundle trusts); the other read it.
    const CREATED: &str = "created the shared Secret petstore-operator-webhook-tls";
    let (a_created, b_created) = (a.log_contains(CREATED), b.log_contains(CREATED));
    assert!(
        a_created != b_created,
        "one replica creates the Secret: a {a_created}, b {b_created}"
    );
    let (mut writer, mut reader, reader_url) = if a_created {
        (a, b, url_b)
    } else {
        (b, a, url_a)
    };
    // The writer gone, the API server pointed at the other replica: it
    // must serve a certificate the CRD's bundle trusts, the Secret's, for
    // the v1alpha1 create (converted to the stored v1) and the v1alpha1
    // read (converted back) to work.
    writer.process().terminate(Duration::from_secs(10));
    env.cp.kubectl(&[
        "patch",
        "crd",
        "pets.petstore.example.com",
        "--type=merge",
        "-p",
        &json!({"spec": {"conversion": {"webhook": {"clientConfig": {"url": reader_url}}}}})
            .to_string(),
    ])?;
    kubectl(&env, &["apply", "-f", "-"], Some(OFFSET_PET))?;
    let pet = alpha_pet(&env, "late-bird")?;
    assert_eq!(pet["spec"]["birthday"], "2021-04-01T23:30:00-05:00");
    env.wait_ready("default", "late-bird", TIMEOUT)?;
    assert!(
        reader.process().is_running() && !writer.process().is_running(),
        "only the replica that read the Secret serves: {}",
        reader.process().log_tail(20)
    );

    let after = secret(&env)?;
    assert_eq!(
        after["metadata"]["resourceVersion"], first["metadata"]["resourceVersion"],
        "nobody replaced the Secret"
    );
    assert_eq!(after["metadata"]["uid"], first["metadata"]["uid"]);
    Ok(())
}

/// The PEM of the certificate the server at `addr` presents, from
/// `openssl s_client`, as a client sees it.
fn served_leaf(addr: &str) -> Option<String> {
    let output = Command::new("openssl")
        .args(["s_client", "-connect", addr, "-showcerts"])
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let start = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text[start..].find("-----END CERTIFICATE-----")? + start;
    Some(format!("{}-----END CERTIFICATE-----", &text[start..end]))
}

/// cert-manager's Secret as the kubelet mounts it: tls.crt, tls.key, ca.crt.
fn write_cert_files(dir: &std::path::Path, certs: &CaAndLeaf) -> fixtures::Result<()> {
    for (name, pem) in [
        ("tls.crt", &certs.cert),
        ("tls.key", &certs.key),
        ("ca.crt", &certs.ca_cert),
    ] {
        std::fs::write(dir.join(name), pem).map_err(fixtures::io(format!("writing {name}")))?;
    }
    Ok(())
}

/// The CAs the CRD's conversion webhook and the two deletion guards trust,
/// PEM, in that order.
fn ca_bundles(env: &Env) -> fixtures::Result<[String; 3]> {
    use base64::Engine as _;
    let bundle = |args: &[&str]| -> fixtures::Result<String> {
        let (bundle, _) = kubectl(env, args, None)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(bundle.trim())
            .unwrap_or_default();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    let guard = |name: &str| {
        bundle(&[
            "get",
            "validatingwebhookconfiguration",
            name,
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ])
    };
    Ok([
        bundle(&[
            "get",
            "crd",
            "pets.petstore.example.com",
            "-o",
            "jsonpath={.spec.conversion.webhook.clientConfig.caBundle}",
        ])?,
        guard(CRD_GUARD_CONFIGURATION)?,
        guard(STORE_GUARD_CONFIGURATION)?,
    ])
}

#[test]
fn the_webhook_serves_cert_managers_files_and_follows_them_live()
-> Result<(), Box<dyn std::error::Error>> {
    const FOLLOWED_WITHIN: Duration = Duration::from_secs(5);
    let env = Env::start(Storage::Durable)?;
    install_crd_guard(&env.cp)?;
    install_store_guard(&env.cp)?;
    let dir = tempfile::tempdir().map_err(fixtures::io("making a folder"))?;
    let names = ["127.0.0.1".to_owned()];
    let now = unix_now();
    let first = CaAndLeaf::generate(&WEBHOOK, &names, now)?;
    write_cert_files(dir.path(), &first)?;

    let mut options = env.operator_options("cert-files");
    let listen = options
        .extra_args
        .iter()
        .skip_while(|arg| *arg != "--webhook-listen")
        .nth(1)
        .map(|addr| addr.to_string_lossy().into_owned())
        .ok_or("no --webhook-listen")?;
    options.extra_args.push("--webhook-cert-dir".into());
    options.extra_args.push(dir.path().into());
    // Converting: the CRD trusts ca.crt, and the server presents tls.crt.
    let mut operator = env.start_operator_with(&options)?;
    assert_eq!(served_leaf(&listen).as_deref(), Some(first.cert.trim()));
    assert_eq!(ca_bundles(&env)?, [(); 3].map(|()| first.ca_cert.clone()));
    assert!(
        secret(&env).is_err(),
        "with files, the operator makes no Secret of its own"
    );
    kubectl(&env, &["apply", "-f", "-"], Some(OFFSET_PET))?;
    assert_eq!(alpha_pet(&env, "late-bird")?["spec"]["name"], "Late Bird");

    // A renewed leaf of the same CA (what cert-manager does before expiry):
    // presented within the bound, by the same process.
    let second = first.renew_leaf(&WEBHOOK, &names, now)?;
    write_cert_files(dir.path(), &second)?;
    fixtures::wait_for(FOLLOWED_WITHIN, "the renewed leaf presented", || {
        (served_leaf(&listen).as_deref() == Some(second.cert.trim())).then_some(())
    })?;

    // A new CA and its leaf: ca.crt reaches the CRD and the deletion
    // guards, and conversions go on.
    let third = CaAndLeaf::generate(&WEBHOOK, &names, now)?;
    write_cert_files(dir.path(), &third)?;
    let trusted = [(); 3].map(|()| third.ca_cert.clone());
    fixtures::wait_for(
        FOLLOWED_WITHIN,
        "the new CA's leaf presented and trusted",
        || {
            (served_leaf(&listen).as_deref() == Some(third.cert.trim())
                && ca_bundles(&env).ok().as_ref() == Some(&trusted))
            .then_some(())
        },
    )?;
    wait_until_converting(&env.cp, &mut operator)?;
    assert_eq!(alpha_pet(&env, "late-bird")?["spec"]["name"], "Late Bird");
    assert!(operator.process().is_running(), "no restart");
    assert!(secret(&env).is_err(), "still no Secret of its own");
    Ok(())
}
