//! The operator's command line: every flag, with the environment variable
//! that can set it instead. Kept in the library so that a test binary can
//! add flags of its own around the same [`Args`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args as ClapArgs, Parser};
use petstore_process::parse_duration;

/// Kubernetes operator that keeps each Pet resource in the gRPC pet store.
///
/// Every flag can also be set through the environment variable shown.
/// Durations take units: 500ms, 30s, 5m, 1h, 1.5h, 1h30m (the pet store's
/// flags read the same grammar).
#[derive(Parser, Debug)]
#[command(version)]
pub struct Args {
    /// Pet store address, host:port or http://host:port.
    #[arg(
        long,
        env = "PETSTORE_ADDR",
        default_value = "petstore-service.petstore.svc.cluster.local:6742"
    )]
    pub petstore_addr: String,

    #[command(flatten)]
    pub petstore_tls: StoreTlsArgs,

    /// Make the store channel's mutual TLS here, as `config/` does: the
    /// store's serving certificate, for the host of --petstore-addr and
    /// loopback, in the Secret `<NAMESPACE>/<NAME>` that the store mounts,
    /// and beside it a CA and this operator's client certificate in the
    /// Secret `petstore-store-client`. Both are renewed with a third of
    /// their 90 days left. Instead of --petstore-ca-file and the client
    /// files.
    #[arg(
        long,
        env = "PETSTORE_STORE_CERTIFICATES",
        value_name = "NAMESPACE/NAME",
        conflicts_with_all = ["petstore_ca_file", "petstore_cert_file"]
    )]
    pub store_certificates: Option<crate::shared_object::NamespacedName>,

    /// Publish this cluster's ServiceAccount token issuer (its name and
    /// its keys, from the API server's OIDC discovery) to the ConfigMap
    /// `<NAMESPACE>/<NAME>`, as `issuer` and `jwks.json`, and keep it
    /// current: what a store with --tenancy mounts to check tokens by.
    #[arg(
        long,
        env = "PETSTORE_PUBLISH_TOKEN_ISSUER",
        value_name = "NAMESPACE/NAME"
    )]
    pub publish_token_issuer: Option<crate::shared_object::NamespacedName>,

    /// Where --store-certificates writes this operator's own CA,
    /// certificate and key, which its store client reads.
    #[arg(
        long,
        env = "PETSTORE_STORE_CERTIFICATES_DIR",
        default_value = "/var/run/petstore-operator/store-tls"
    )]
    pub store_certificates_dir: PathBuf,

    /// The audience of the --petstore-addr store's tokens, when that store
    /// checks tenants (`petstore-server --tenancy`): each Pet's calls there
    /// then carry a token of its namespace's `petstore-tenant`, as on a
    /// PetStore, and the operator's other calls (its change feed, the
    /// installation claim, probes) one of --service-account, which the
    /// store must name an observer. Unset: no tokens, as before tenancy.
    #[arg(long, env = "PETSTORE_AUDIENCE", value_parser = parse_audience)]
    pub petstore_audience: Option<String>,

    /// Timeout for each pet store call (and for connecting). The old
    /// spelling --store-timeout is still accepted.
    #[arg(long, env = "PETSTORE_TIMEOUT", alias = "store-timeout", default_value = "5s", value_parser = parse_duration)]
    pub petstore_timeout: Duration,

    /// How often an in-sync Pet is re-checked against the store, so records
    /// changed or lost out of band are put back.
    #[arg(long, env = "POLL_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub poll_interval: Duration,

    /// Most drift-poll reads per second the store gets, on average. Polls
    /// are spread evenly over the interval; with more Pets than the interval
    /// allows at this rate, the interval stretches. 0 = no bound.
    #[arg(long, env = "POLL_MAX_RATE", default_value_t = 100.0, value_parser = parse_rate)]
    pub poll_max_rate: f64,

    /// How often each in-sync Pet is still read from the store while the
    /// store's change feed is followed (drift then shows on the feed within
    /// a second). An audit, for what the feed cannot see: a record changed
    /// in the store's database directly. One hour keeps the idle cost at N
    /// reads an hour (20,000 Pets: 20,000 reads, against 240,000 at the
    /// poll interval), and bounds such a change's life to an hour.
    #[arg(long, env = "AUDIT_INTERVAL", default_value = "1h", value_parser = parse_duration)]
    pub audit_interval: Duration,

    /// The drift-storm brake: once more than this share of a store's Pets
    /// (and at least --drift-storm-min) drifted within
    /// --drift-storm-window, drift is not written back to that store until
    /// each Pet's plan is approved: a store restored from an old backup, come
    /// back empty or serving wrong data would otherwise be overwritten.
    #[arg(long, env = "DRIFT_STORM_SHARE", default_value_t = 0.05, value_parser = parse_share)]
    pub drift_storm_share: f64,

    /// The fewest drifted Pets that make a drift storm (0: no brake).
    #[arg(long, env = "DRIFT_STORM_MIN", default_value_t = 50)]
    pub drift_storm_min: usize,

    /// The window in which drift counts toward a storm; a storm ends once a
    /// whole window passes with no new Pet drifting.
    #[arg(long, env = "DRIFT_STORM_WINDOW", default_value = "60s", value_parser = parse_duration)]
    pub drift_storm_window: Duration,

    /// Follow the store's change feed (`WatchPets`), so drift is put back
    /// within a second. `false` finds drift by polling alone, every
    /// --poll-interval, as against a store without the feed: for comparing
    /// the two, or a feed that misbehaves.
    #[arg(long, env = "FOLLOW_STORE_CHANGES", default_value_t = true, action = ArgAction::Set)]
    pub follow_store_changes: bool,

    /// Most calls a second to the store, on average, from reconciles, the
    /// audit and re-reads together (0: no limit). Above what converging
    /// 20,000 Pets or catching up after a restart asks (about 4,000 a
    /// second), so it only bounds a runaway.
    #[arg(long, env = "STORE_QPS", default_value_t = 5000.0, value_parser = parse_rate)]
    pub store_qps: f64,

    /// Most store calls at once above `--store-qps`, before calls wait.
    #[arg(long, env = "STORE_BURST", default_value_t = 500)]
    pub store_burst: u32,

    /// Calls at once to each store: `auto` adapts the limit to the store's
    /// answers (grows while they are quick, halves on RESOURCE_EXHAUSTED
    /// or a timeout, falls by a tenth when they queue), up to
    /// `--store-concurrency-max`; a number fixes it.
    #[arg(long, env = "STORE_CONCURRENCY", default_value = "auto", value_parser = parse_store_concurrency)]
    pub store_concurrency: StoreConcurrency,

    /// The most calls at once the adaptive limit may reach, per store.
    #[arg(long, env = "STORE_CONCURRENCY_MAX", default_value_t = crate::store::limiter::DEFAULT_MAX_LIMIT, value_parser = clap::value_parser!(u32).range(1..))]
    pub store_concurrency_max: u32,

    /// How long a create waits for others to share its `AddPets` call,
    /// when creates come close together (a burst of new Pets); a lone
    /// create is sent at once. 0 sends every create alone. Not used while
    /// traces are exported: a traced create gets a call of its own, so the
    /// store's spans are children of that Pet's reconcile. The store commits
    /// and fsyncs once a call: 25ms, against 10ms, cut the durable store's
    /// CPU per Pet by about a quarter while 1,000 Pets converged.
    #[arg(long, env = "CREATE_BATCH_WAIT", default_value = "25ms", value_parser = parse_duration)]
    pub create_batch_wait: Duration,

    /// How often each PetStore's and ClusterPetStore's status (does it
    /// answer, its extensions, how many Pets use it) is checked again; a
    /// store whose spec changes is checked at once.
    #[arg(long, env = "STORE_STATUS_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub store_status_interval: Duration,

    /// This installation's name, kept for the life of the records it makes:
    /// a record's key is `<installation>/<Pet UID>`. A cluster rebuilt or
    /// restored with the same name, against the same store, takes its
    /// Pets' records back by namespace and name; two clusters that share a
    /// store must use different names. Empty (the default) is the unnamed
    /// installation, whose keys are bare UIDs, as before installations. A
    /// lowercase DNS label (at most 63 characters). `kubectl petstore`
    /// reads the same variable.
    #[arg(long, env = INSTALLATION_ENV, default_value = "", value_parser = parse_installation)]
    pub installation: String,

    /// The installation's variable as operators before this one named it,
    /// refused unless it agrees with [`INSTALLATION_ENV`]: a deployment
    /// that still sets only the old name would otherwise start as the
    /// unnamed installation, whose keys are not its records'.
    #[arg(long = "old-installation-env", value_name = "INSTALLATION", hide = true, env = OLD_INSTALLATION_ENV, value_parser = refuse_old_installation_env)]
    #[doc(hidden)]
    pub old_installation_env: Option<String>,
    /// How long the cluster's claim on its installation's name in the store
    /// lasts unless renewed; the leader renews it every third of this. A
    /// second live cluster with the same name is refused while the claim
    /// lasts, and a cluster rebuilt or restored under the name waits at
    /// most this long for a dead one's claim to expire. Whole seconds, 3s
    /// to 1h. The unnamed installation claims nothing.
    #[arg(long, env = "INSTALLATION_CLAIM_TTL", default_value = "60s", value_parser = parse_claim_ttl)]
    pub installation_claim_ttl: Duration,

    /// Pets reconciled concurrently; while more wait, each namespace takes
    /// its turn. 0: no bound, and then no turns either.
    #[arg(long, env = "CONCURRENCY", default_value_t = crate::controller::DEFAULT_CONCURRENCY)]
    pub concurrency: u16,

    /// First retry delay after a failure; it doubles per consecutive failure.
    #[arg(long, env = "BACKOFF_BASE", default_value = "1s", value_parser = parse_duration)]
    pub backoff_base: Duration,

    /// Longest retry delay after repeated failures.
    #[arg(long, env = "BACKOFF_MAX", default_value = "5m", value_parser = parse_duration)]
    pub backoff_max: Duration,

    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Address for the conversion webhook (HTTPS, `POST /convert`), which
    /// every replica serves, leader or not.
    #[arg(long, env = "WEBHOOK_LISTEN", default_value = "0.0.0.0:9443")]
    pub webhook_listen: SocketAddr,

    /// URL at which the API server reaches this operator's webhook, such as
    /// https://127.0.0.1:9443/convert, for an operator run as a local
    /// process. The operator writes it into the Pet CRD at start. Without
    /// it the CRD points at the Service petstore-operator-metrics in this
    /// operator's namespace (--lease-namespace).
    #[arg(long, env = "WEBHOOK_URL", value_parser = parse_webhook_url)]
    pub webhook_url: Option<String>,

    /// Serve the webhook with the certificate in this directory (tls.crt,
    /// tls.key; a cert-manager Certificate's Secret, mounted), followed
    /// as the files change, instead of the Secret the operator makes. A
    /// ca.crt there goes into the CRD's and the deletion guards'
    /// caBundle; without one, they are left to cert-manager's CA injector.
    #[arg(long, env = "WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,

    /// Elect a leader through a Lease so only one replica reconciles.
    /// Turn off for a single local process.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    pub leader_election: bool,

    /// The operator's namespace (in a pod: its own): where the leader Lease,
    /// the webhook's certificate Secret and its --service-account live.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// The operator's own ServiceAccount, in --lease-namespace (in a pod:
    /// the one it runs as). The change feed of each PetStore and
    /// ClusterPetStore is read with a token of it, minted for the store's
    /// audience; a store with tenancy must name it an observer:
    /// `--observer system:serviceaccount:<namespace>:<name>`. Never used
    /// to write.
    #[arg(long, env = "SERVICE_ACCOUNT_NAME", default_value = "petstore-operator", value_parser = parse_service_account)]
    pub service_account: String,

    /// Name of the leader Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "petstore-operator")]
    pub lease_name: String,

    /// Lease duration: how long a dead leader blocks a standby.
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// This replica's identity in the Lease and in Events (in a pod: its name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Log format. The level comes from RUST_LOG (default `info`).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

pub use petstore_telemetry::LogFormat;

/// An https URL: the API server calls webhooks over TLS only.
pub fn parse_webhook_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    match text.strip_prefix("https://") {
        Some(rest) if !rest.is_empty() && !rest.contains(char::is_whitespace) => {
            Ok(text.to_owned())
        }
        _ => Err(format!(
            "{text:?} is not an https URL such as https://127.0.0.1:9443/convert"
        )),
    }
}

pub fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a rate: give reads per second, such as 100 (0: no bound)"
        )),
    }
}

/// `--store-concurrency`: adaptive, or fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreConcurrency {
    Auto,
    Fixed(u32),
}

/// `auto`, or a fixed limit of calls at once.
pub fn parse_store_concurrency(text: &str) -> Result<StoreConcurrency, String> {
    match text.trim() {
        "auto" => Ok(StoreConcurrency::Auto),
        number => match number.parse::<u32>() {
            Ok(limit) if limit > 0 => Ok(StoreConcurrency::Fixed(limit)),
            _ => Err(format!(
                "{text:?} is neither auto nor a number of calls at least 1, such as 32"
            )),
        },
    }
}

impl Args {
    /// How each store's calls at once are limited.
    pub fn store_concurrency_limit(&self) -> crate::store::limiter::ConcurrencyLimit {
        use crate::store::limiter::ConcurrencyLimit;
        match self.store_concurrency {
            StoreConcurrency::Fixed(limit) => ConcurrencyLimit::Fixed(limit),
            StoreConcurrency::Auto => ConcurrencyLimit::Adaptive {
                max: self.store_concurrency_max,
            },
        }
    }
}

/// A share of a store's Pets: a fraction from 0 to 1, such as 0.05.
pub fn parse_share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!(
            "{text:?} is not a share: give a fraction from 0 to 1, such as 0.05 for 5%"
        )),
    }
}

/// Logging (and span export, if configured) for a binary that cannot keep
/// the guard `petstore_telemetry::init` returns, such as the end-to-end
/// tests' fault-injection build: its last spans are not flushed at exit.
/// The operator's own `main` keeps the guard.
pub fn init_tracing(format: LogFormat) {
    match petstore_telemetry::init("petstore-operator", format, None) {
        Ok(guard) => std::mem::forget(guard),
        Err(err) => eprintln!("cannot set up logging and tracing: {err}"),
    }
}

/// The environment variable of `--installation`, for the operator and
/// `kubectl petstore` alike.
pub const INSTALLATION_ENV: &str = "PETSTORE_INSTALLATION";

/// Its name before it took the `PETSTORE_` prefix the other settings the
/// operator shares with `kubectl petstore` carry.
pub const OLD_INSTALLATION_ENV: &str = "INSTALLATION";

fn refuse_old_installation_env(old: &str) -> Result<String, String> {
    old_installation_env(old, std::env::var(INSTALLATION_ENV).ok().as_deref())
}

/// `old`, the value of [`OLD_INSTALLATION_ENV`], if [`INSTALLATION_ENV`]
/// (`new`, unset: empty) names the same installation: a deployment may set
/// both while it can still be rolled back to an operator that reads only
/// the old name.
fn old_installation_env(old: &str, new: Option<&str>) -> Result<String, String> {
    if new.unwrap_or_default() == old {
        Ok(old.to_owned())
    } else {
        Err(format!(
            "{OLD_INSTALLATION_ENV} is no longer read: set {INSTALLATION_ENV}={old:?} instead, or both to the same name"
        ))
    }
}

/// A ServiceAccount's name: a DNS subdomain (lowercase letters, digits, '-'
/// and '.'), as the API server takes it.
/// A token audience: not empty, no spaces.
pub fn parse_audience(value: &str) -> Result<String, String> {
    if value.is_empty() || value.chars().any(char::is_whitespace) {
        return Err(format!(
            "{value:?} is not an audience (a non-empty word, e.g. petstore)"
        ));
    }
    Ok(value.to_owned())
}

pub fn parse_service_account(value: &str) -> Result<String, String> {
    let valid = !value.is_empty()
        && value.len() <= 253
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a ServiceAccount name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
        ))
    }
}

/// A claim's TTL: whole seconds (the store counts in seconds), 3s to 1h,
/// so a renewal every third of it is at least a second apart.
pub fn parse_claim_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text).map_err(|err| err.to_string())?;
    if ttl.subsec_nanos() != 0 || !(3..=3600).contains(&ttl.as_secs()) {
        return Err(format!(
            "{text:?} must be whole seconds from 3s to 1h (the claim's renewal comes every third of it)"
        ));
    }
    Ok(ttl)
}

/// An installation name: empty (the unnamed one), or
/// [`crate::crd::is_installation_name`].
pub fn parse_installation(value: &str) -> Result<String, String> {
    if value.is_empty() || crate::crd::is_installation_name(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a lowercase DNS label: at most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every duration flag reads the shared grammar; a bare number is
    // refused rather than given a guessed unit.
    #[test]
    fn duration_flags_take_units() {
        let poll = |value: &str| {
            Args::try_parse_from(["petstore-operator", "--poll-interval", value])
                .map(|args| args.poll_interval)
        };
        assert_eq!(poll("1h30m").ok(), Some(Duration::from_secs(5400)));
        assert_eq!(poll("1.5h").ok(), Some(Duration::from_secs(5400)));
        assert_eq!(poll("500ms").ok(), Some(Duration::from_millis(500)));
        for bad in ["7", "-5m", "soon"] {
            assert!(poll(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_own_store_takes_tokens_only_with_an_audience() {
        let args = Args::try_parse_from(["petstore-operator"]).expect("defaults");
        assert_eq!(args.petstore_audience, None, "no tokens, as before tenancy");
        let args = Args::try_parse_from(["petstore-operator", "--petstore-audience", "petstore"])
            .expect("an audience");
        assert_eq!(args.petstore_audience.as_deref(), Some("petstore"));
        for bad in ["", "two words"] {
            assert!(
                Args::try_parse_from(["petstore-operator", "--petstore-audience", bad]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_store_timeout_flag_matches_its_variable_and_keeps_its_old_name() {
        let args = Args::try_parse_from(["petstore-operator", "--petstore-timeout", "7s"])
            .expect("new name");
        assert_eq!(args.petstore_timeout, Duration::from_secs(7));
        let args =
            Args::try_parse_from(["petstore-operator", "--store-timeout", "3s"]).expect("old name");
        assert_eq!(args.petstore_timeout, Duration::from_secs(3));
    }

    #[test]
    fn the_change_feed_is_followed_unless_turned_off() {
        let args = Args::try_parse_from(["petstore-operator"]).expect("defaults");
        assert!(args.follow_store_changes);
        let args = Args::try_parse_from(["petstore-operator", "--follow-store-changes=false"])
            .expect("turned off");
        assert!(!args.follow_store_changes);
        assert!(
            Args::try_parse_from(["petstore-operator", "--follow-store-changes=maybe"]).is_err()
        );
    }

    #[test]
    fn the_feed_reads_as_the_operators_own_service_account() {
        let args = Args::try_parse_from(["petstore-operator"]).expect("defaults");
        assert_eq!(args.service_account, "petstore-operator", "config/rbac's");
        let named = |value: &str| {
            Args::try_parse_from(["petstore-operator", "--service-account", value])
                .map(|args| args.service_account)
        };
        assert_eq!(named("ops.reader-2").ok().as_deref(), Some("ops.reader-2"));
        for bad in [
            "",
            "Petstore",
            "ns:name",
            "system:serviceaccount:a:b",
            "-x",
            "x/y",
        ] {
            assert!(named(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// The release binary must not offer fault injection: the faults exist
    /// only in the end-to-end tests' own binary (see [`crate::Fault`]).
    #[test]
    fn a_default_build_has_no_fault_flag() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        assert!(
            !help.contains("--fault") && !help.contains("FAULT"),
            "{help}"
        );
        assert!(
            Args::try_parse_from(["petstore-operator", "--fault", "hang-after-create"]).is_err()
        );
    }

    #[test]
    fn the_claim_ttl_is_whole_seconds_from_3s_to_an_hour() {
        let args = Args::try_parse_from(["petstore-operator"]).expect("defaults");
        assert_eq!(args.installation_claim_ttl, Duration::from_secs(60));
        let ttl = |value: &str| {
            Args::try_parse_from(["petstore-operator", "--installation-claim-ttl", value])
                .map(|args| args.installation_claim_ttl)
        };
        assert_eq!(ttl("6s").ok(), Some(Duration::from_secs(6)));
        assert_eq!(ttl("1h").ok(), Some(Duration::from_secs(3600)));
        for bad in ["2s", "2500ms", "61m", "0s", "7"] {
            assert!(ttl(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn rates_are_non_negative_numbers() {
        assert_eq!(parse_rate("100"), Ok(100.0));
        assert_eq!(parse_rate("0"), Ok(0.0));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        assert!(parse_rate("-1").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("inf").is_err());
    }

    #[test]
    fn the_webhook_listens_on_9443_and_takes_only_https_urls() {
        let args = Args::try_parse_from(["petstore-operator"]).expect("defaults");
        assert_eq!(args.webhook_listen.to_string(), "0.0.0.0:9443");
        assert_eq!(args.webhook_url, None);
        let args = Args::try_parse_from([
            "petstore-operator",
            "--webhook-listen",
            "127.0.0.1:0",
            "--webhook-url",
            "https://127.0.0.1:4443/convert",
        ])
        .expect("local");
        assert_eq!(args.webhook_listen.to_string(), "127.0.0.1:0");
        assert_eq!(
            args.webhook_url.as_deref(),
            Some("https://127.0.0.1:4443/convert")
        );
        for bad in [
            "http://127.0.0.1:9443/convert",
            "127.0.0.1:9443",
            "https://",
        ] {
            assert!(
                Args::try_parse_from(["petstore-operator", "--webhook-url", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_installation_is_read_from_petstore_installation() {
        use clap::CommandFactory;
        let command = Args::command();
        let env = |id: &str| {
            command
                .get_arguments()
                .find(|arg| arg.get_id() == id)
                .and_then(|arg| arg.get_env())
                .and_then(|env| env.to_str())
                .map(str::to_owned)
        };
        assert_eq!(
            env("installation").as_deref(),
            Some("PETSTORE_INSTALLATION")
        );
        assert_eq!(env("old_installation_env").as_deref(), Some("INSTALLATION"));
    }

    /// A deployment that still names the installation only by the old
    /// variable must not start as the unnamed installation.
    #[test]
    fn the_old_installation_variable_is_refused_unless_it_agrees() {
        assert_eq!(
            old_installation_env("blue", Some("blue")),
            Ok("blue".into())
        );
        assert_eq!(old_installation_env("", None), Ok(String::new()));
        assert_eq!(old_installation_env("", Some("")), Ok(String::new()));
        let refused = old_installation_env("blue", None).expect_err("only the old name");
        assert_eq!(
            refused,
            r#"INSTALLATION is no longer read: set PETSTORE_INSTALLATION="blue" instead, or both to the same name"#
        );
        assert!(old_installation_env("blue", Some("green")).is_err());
        assert!(old_installation_env("blue", Some("")).is_err());
        // Through clap, the hidden flag standing for the variable, with a
        // value no PETSTORE_INSTALLATION of the test's environment holds.
        assert!(
            Args::try_parse_from(["petstore-operator", "--old-installation-env", "(old)"]).is_err()
        );
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}

/// TLS to the store: the operator's flags, shared with `kubectl petstore`.
#[derive(ClapArgs, Debug, Clone, Default)]
pub struct StoreTlsArgs {
    /// Use TLS to the store, trusting this CA (PEM) for its certificate.
    #[arg(long, env = "PETSTORE_CA_FILE")]
    pub petstore_ca_file: Option<PathBuf>,

    /// Client certificate (PEM) for mutual TLS with the store. Needs
    /// --petstore-key-file.
    #[arg(long, env = "PETSTORE_CERT_FILE", requires = "petstore_key_file")]
    pub petstore_cert_file: Option<PathBuf>,

    /// Private key (PEM) for --petstore-cert-file.
    #[arg(long, env = "PETSTORE_KEY_FILE", requires = "petstore_cert_file")]
    pub petstore_key_file: Option<PathBuf>,

    /// Name to verify in the store's certificate, if not the address's host.
    #[arg(long, env = "PETSTORE_TLS_SERVER_NAME")]
    pub petstore_tls_server_name: Option<String>,
}

impl StoreTlsArgs {
    /// The files to read, or `None` for plaintext.
    pub fn files(&self) -> Option<crate::store::grpc::TlsFiles> {
        (self.petstore_ca_file.is_some() || self.petstore_cert_file.is_some()).then(|| {
            crate::store::grpc::TlsFiles {
                ca: self.petstore_ca_file.clone(),
                client_cert_and_key: self
                    .petstore_cert_file
                    .clone()
                    .zip(self.petstore_key_file.clone()),
                server_name: self.petstore_tls_server_name.clone(),
            }
        })
    }
}
