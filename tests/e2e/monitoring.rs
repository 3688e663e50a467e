//! config/monitoring against a real promtool and the real binaries: the
//! alert rules are valid and their unit tests pass; both processes' scrapes
//! pass `promtool check metrics`; and every metric the alerts and the Grafana
//! dashboard query exists in those scrapes, so a renamed metric fails here
//! rather than in an empty panel or a silent alert. And every alert links
//! its own section of docs/runbooks.md, which has none for a gone alert.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fixtures::env::{OPERATOR_ACCOUNT, OPERATOR_NAMESPACE, start_installed};
use fixtures::monitoring::{
    alert_names, dashboard_queries, missing_metrics, monitoring_dir, prometheus_rule_groups,
    promql_metric_names, rule_expressions, run_promtool, scrape, scraped_families,
    to_prometheus_text,
};
use fixtures::petstore::grpcurl;
use fixtures::{
    ControlPlane, Kubectl, Operator, OperatorOptions, Process, cargo_bin, free_port, repo_root,
    wait_for,
};

use crate::typed;

const TIMEOUT: Duration = Duration::from_secs(60);

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn prometheus_rule() -> String {
    read(&monitoring_dir().join("prometheusrule.yaml"))
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(&monitoring_dir().join("grafana-dashboard.json")))
        .expect("grafana-dashboard.json is JSON")
}

/// Every query of the PrometheusRule and the dashboard.
fn all_queries() -> Vec<String> {
    let mut queries = rule_expressions(&prometheus_rule());
    queries.extend(dashboard_queries(&dashboard()));
    queries
}

fn promtool_report(output: &std::process::Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `promtool check rules` on the PrometheusRule's groups, and `promtool test
/// rules` on every file of config/monitoring/tests; and each alert has a
/// test case that fires it and one that does not.
#[test]
fn alert_rules_are_valid_and_their_unit_tests_pass() -> fixtures::Result<()> {
    let work = tempfile::tempdir().map_err(fixtures::io("making a temporary directory"))?;
    // The tests name ../petstore.rules.yaml, as hack/monitoring/test-rules.sh lays it out.
    let rules = work.path().join("petstore.rules.yaml");
    let groups = prometheus_rule_groups(&prometheus_rule())?;
    std::fs::write(&rules, &groups).map_err(fixtures::io("writing the rules file"))?;
    let check = run_promtool(
        &[OsStr::new("check"), OsStr::new("rules"), rules.as_os_str()],
        "",
    )?;
    assert!(check.status.success(), "{}", promtool_report(&check));
    let alerts = alert_names(&groups);
    assert!(
        String::from_utf8_lossy(&check.stdout).contains(&format!("{} rules found", alerts.len())),
        "promtool saw every alert of {alerts:?}: {}",
        promtool_report(&check)
    );

    let tests_dir = work.path().join("tests");
    std::fs::create_dir(&tests_dir).map_err(fixtures::io("making the tests directory"))?;
    let mut test_texts = String::new();
    let mut test_files = Vec::new();
    for entry in std::fs::read_dir(monitoring_dir().join("tests"))
        .map_err(fixtures::io("listing config/monitoring/tests"))?
    {
        let path = entry.map_err(fixtures::io("listing tests"))?.path();
        if path.extension() != Some(OsStr::new("yaml")) {
            continue;
        }
        let text = read(&path);
        let copy = tests_dir.join(path.file_name().expect("a file name"));
        std::fs::write(&copy, &text).map_err(fixtures::io("copying a test"))?;
        test_texts.push_str(&text);
        test_files.push(copy);
    }
    assert!(!test_files.is_empty(), "no alert tests found");
    for file in &test_files {
        let run = run_promtool(
            &[OsStr::new("test"), OsStr::new("rules"), file.as_os_str()],
            "",
        )?;
        assert!(
            run.status.success(),
            "{}: {}",
            file.display(),
            promtool_report(&run)
        );
    }

    // Each alert: a case expecting it to fire and a case expecting silence.
    let lines: Vec<&str> = test_texts.lines().map(str::trim).collect();
    for alert in &alerts {
        let expectations: Vec<&str> = lines
            .windows(2)
            .filter(|pair| pair[0] == format!("alertname: {alert}"))
            .map(|pair| pair[1])
            .collect();
        assert!(
            expectations.contains(&"exp_alerts: []"),
            "{alert} has no test case where it stays silent"
        );
        assert!(
            expectations.contains(&"exp_alerts:"),
            "{alert} has no test case where it fires"
        );
    }
    Ok(())
}

/// The name extractor finds metric names and nothing else, so a renamed
/// metric in a scrape is reported as missing.
#[test]
fn metric_name_extractor_catches_a_renamed_metric() {
    let expr = r#"sum by (method, le) (rate(petstore_operator_store_call_duration_seconds_bucket{outcome!="OK", method=~"Add.*|{x}"}[$__rate_interval]))
        / on (namespace) group_left(pod) max without (instance) (petstore_operator_leader offset 5m) > bool 0.5
        unless histogram_quantile(0.95, petstore_server_rpc_duration_seconds_bucket) or up{job="petstore"} == 0
        and label_replace(petstore_operator_queue_depth, "dst", "$1", "src", "(.*)")"#;
    let names: Vec<String> = promql_metric_names(expr).into_iter().collect();
    assert_eq!(
        names,
        [
            "petstore_operator_leader",
            "petstore_operator_queue_depth",
            "petstore_operator_store_call_duration_seconds_bucket",
            "petstore_server_rpc_duration_seconds_bucket",
            "up",
        ]
    );

    // An OpenMetrics scrape as prometheus-client writes it: a counter's
    // family without `_total`, a labelled counter with no sample yet.
    let scrape = "\
# HELP petstore_operator_reconciles Reconciliations started.
# TYPE petstore_operator_reconciles counter
petstore_operator_reconciles_total 3
# HELP petstore_operator_reconcile_errors Reconciliations that failed, by reason.
# TYPE petstore_operator_reconcile_errors counter
# HELP petstore_operator_reconcile_duration_seconds Time spent in one reconciliation.
# TYPE petstore_operator_reconcile_duration_seconds histogram
petstore_operator_reconcile_duration_seconds_sum 0.25
petstore_operator_reconcile_duration_seconds_count 3
petstore_operator_reconcile_duration_seconds_bucket{le=\"+Inf\"} 3
# EOF
";
    let scraped = scraped_families(scrape);
    let queries = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .map(|name| format!("sum(rate({name}[5m]))"))
            .collect()
    };
    let present = queries(&[
        "petstore_operator_reconciles_total",
        "petstore_operator_reconcile_errors_total",
        "petstore_operator_reconcile_duration_seconds_bucket",
        "petstore_operator_reconcile_duration_seconds_count",
        "up",
    ]);
    assert_eq!(missing_metrics(&present, &scraped), Vec::<String>::new());
    // Renamed in the code (or misspelled in a query): reported.
    let renamed = queries(&[
        "petstore_operator_reconcile_total",
        "petstore_operator_reconcile_latency_seconds_bucket",
    ]);
    assert_eq!(
        missing_metrics(&renamed, &scraped),
        [
            "petstore_operator_reconcile_latency_seconds_bucket (in `sum(rate(petstore_operator_reconcile_latency_seconds_bucket[5m]))`)",
            "petstore_operator_reconcile_total (in `sum(rate(petstore_operator_reconcile_total[5m]))`)",
        ]
    );
}

/// promtool's lint reads the Prometheus text format, in which an OpenMetrics
/// counter looks like two families with a problem each; converted, the same
/// metrics pass.
#[test]
fn openmetrics_scrapes_are_linted_as_prometheus_text() -> fixtures::Result<()> {
    let openmetrics = "\
# HELP petstore_operator_reconciles Reconciliations started.
# TYPE petstore_operator_reconciles counter
petstore_operator_reconciles_total 3
# HELP petstore_operator_leader 1 while this replica holds the leader lease.
# TYPE petstore_operator_leader gauge
petstore_operator_leader 1
# EOF
";
    let check = |text: &str| run_promtool(&[OsStr::new("check"), OsStr::new("metrics")], text);
    let raw = check(openmetrics)?;
    assert!(
        !raw.status.success()
            && String::from_utf8_lossy(&raw.stderr)
                .contains("petstore_operator_reconciles_total no help text"),
        "{}",
        promtool_report(&raw)
    );
    let text = to_prometheus_text(openmetrics);
    assert_eq!(
        text,
        "\
# HELP petstore_operator_reconciles_total Reconciliations started.
# TYPE petstore_operator_reconciles_total counter
petstore_operator_reconciles_total 3
# HELP petstore_operator_leader 1 while this replica holds the leader lease.
# TYPE petstore_operator_leader gauge
petstore_operator_leader 1
"
    );
    let converted = check(&text)?;
    assert!(
        converted.status.success() && converted.stderr.is_empty(),
        "{}",
        promtool_report(&converted)
    );
    // A real problem still shows: a counter whose samples lack `_total`.
    let bad = check("# HELP requests Requests.\n# TYPE requests counter\nrequests 1\n")?;
    assert!(!bad.status.success(), "{}", promtool_report(&bad));
    Ok(())
}

/// The rules and the dashboard query what the alerts and panels promise.
#[test]
fn rules_and_dashboard_query_the_documented_metrics() {
    // The expression reader missed none: one per alert, one per target.
    let rule = prometheus_rule();
    assert_eq!(rule_expressions(&rule).len(), alert_names(&rule).len());
    let targets = dashboard()["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| panel["targets"].as_array().into_iter().flatten())
        .count();
    assert_eq!(dashboard_queries(&dashboard()).len(), targets);

    assert_metrics_named(
        &rule_expressions(&rule),
        &[
            "petstore_operator_store_call_duration_seconds_count",
            "petstore_operator_reconcile_errors_total",
            "petstore_operator_not_ready_oldest_seconds",
            "petstore_operator_repeated_drift_pets",
            "up",
        ],
    );
    assert_metrics_named(
        &dashboard_queries(&dashboard()),
        &[
            "petstore_operator_reconciles_total",
            "petstore_operator_reconcile_errors_total",
            "petstore_operator_reconcile_duration_seconds_bucket",
            "petstore_operator_store_call_duration_seconds_bucket",
            "petstore_operator_store_call_duration_seconds_count",
            "petstore_operator_store_actions_total",
            "petstore_operator_time_to_ready_seconds_bucket",
            "petstore_operator_drift_detected_total",
            "petstore_operator_queue_depth",
            "petstore_operator_queue_oldest_age_seconds",
            "petstore_operator_not_ready_pets",
            "petstore_operator_leader",
            "petstore_server_rpc_duration_seconds_count",
            "petstore_server_rpc_duration_seconds_bucket",
            "petstore_server_rpcs_in_flight",
        ],
    );
}

/// Every one of `names` is a metric some of `expressions` query.
fn assert_metrics_named(expressions: &[String], names: &[&str]) {
    let queried: Vec<String> = expressions
        .iter()
        .flat_map(|expr| promql_metric_names(expr))
        .collect();
    for name in names {
        assert!(queried.iter().any(|n| n == name), "{name} in {queried:?}");
    }
}

/// `kubectl apply -k config/monitoring` gets both ServiceMonitors, the
/// PrometheusRule, and the dashboard in a ConfigMap the Grafana sidecar
/// loads.
#[test]
fn kustomization_renders_every_object() -> fixtures::Result<()> {
    let rendered = fixtures::run(
        Command::new(fixtures::Tools::get()?.kubectl())
            .args(["kustomize", &monitoring_dir().to_string_lossy()]),
    )?;
    let kinds: Vec<&str> = rendered
        .lines()
        .filter_map(|line| line.strip_prefix("kind: "))
        .collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "PrometheusRule",
            "ServiceMonitor",
            "ServiceMonitor"
        ],
        "{rendered}"
    );
    assert!(
        rendered.contains("    grafana_dashboard: \"1\"\n  name: petstore-grafana-dashboard\n"),
        "{rendered}"
    );
    assert!(
        rendered.contains("  grafana-dashboard.json: |\n"),
        "{rendered}"
    );
    assert!(
        rendered.contains("\"uid\": \"petstore-operator\""),
        "{rendered}"
    );
    Ok(())
}

/// The real store (with --metrics-listen) and operator on the real control
/// plane: after a Pet turns Ready, both scrapes pass `promtool check metrics`
/// and hold every metric the alerts and the dashboard query.
#[test]
fn scrapes_pass_promtool_and_hold_every_queried_metric() -> fixtures::Result<()> {
    let cp = start_installed(ControlPlane::builder())?;
    let kubeconfig = cp.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)?;

    let store_addr = format!("127.0.0.1:{}", free_port()?);
    let store_metrics_addr = format!("127.0.0.1:{}", free_port()?);
    let start_store = || -> fixtures::Result<Process> {
        let mut command = Command::new(cargo_bin("petstore-server")?);
        command.args([
            "--listen",
            &store_addr,
            "--storage",
            "memory",
            "--metrics-listen",
            &store_metrics_addr,
        ]);
        let mut store = Process::spawn("petstore-server", command, &cp.dir().join("petstore.log"))?;
        wait_for(Duration::from_secs(30), "the pet store SERVING", || {
            assert!(
                store.is_running(),
                "the pet store exited (does it have --metrics-listen?):\n{}",
                store.log_tail(20)
            );
            grpcurl(&store_addr, "grpc.health.v1.Health/Check", "{}")
                .ok()
                .filter(|out| out.first().is_some_and(|v| v["status"] == "SERVING"))
        })?;
        Ok(store)
    };
    let mut store = start_store()?;

    let operator = Operator::start(
        &OperatorOptions {
            kubeconfig,
            store_addr: store_addr.clone(),
            leader_election: true,
            lease_namespace: OPERATOR_NAMESPACE.into(),
            identity: "operator-monitoring".into(),
            poll_interval: "2s",
            backoff_max: "2s",
            petstore_timeout: "2s",
            fault: None,
            log_filter: "info,petstore_operator=debug",
            extra_args: fixtures::env::webhook_args()?,
        },
        &cp.dir().join("operator-monitoring.log"),
    )?;

    let sample = repo_root().join("config/samples/pet-sample1.yaml");
    cp.kubectl(&["apply", "-f", &sample.to_string_lossy()])?;
    let id = typed::wait_ready(&cp, "default", "pet-sample1", TIMEOUT)?;

    // prometheus-client leaves a labelled family out of the scrape until it
    // has a sample, so make the drift and the reconcile error happen that
    // the drift and error metrics count. Drift: the record renamed behind
    // the operator's back, put back by the next poll.
    grpcurl(
        &store_addr,
        "petstore.PetStore/UpdatePets",
        &format!(
            r#"{{"pets":[{{"id":"{id}","name":"Changed behind its back","type":"PTCanine","birthday":{{"year":2021,"month":4,"day":1}}}}]}}"#
        ),
    )?;
    wait_for(TIMEOUT, "the drift to be put back", || {
        let pets = grpcurl(&store_addr, "petstore.PetStore/SearchPets", "{}").ok()?;
        pets.iter()
            .any(|p| p["id"] == id.as_str() && p["name"] == "Thor")
            .then_some(())
    })?;
    // Reconcile errors (store_unavailable): the store down while a rename
    // needs it. Back up with no records (memory), it gets the Pet recreated.
    store.kill();
    cp.rename_pet("pet-sample1", "Thorbert")?;
    let what = "Synced reason StoreUnavailable";
    typed::wait_pet(&cp, "default", "pet-sample1", TIMEOUT, what, |pet| {
        (pet.condition("Synced")?.reason == "StoreUnavailable").then_some(())
    })?;
    let _store = start_store()?;
    let what = "Ready again";
    typed::wait_pet(&cp, "default", "pet-sample1", TIMEOUT, what, |pet| {
        typed::is_ready(pet).then_some(())
    })?;

    let mut problems = Vec::new();
    let mut scraped = std::collections::BTreeSet::new();
    for (process, addr) in [
        ("operator", operator.metrics_addr.as_str()),
        ("pet store", store_metrics_addr.as_str()),
    ] {
        let body = scrape(addr)?;
        let check = run_promtool(
            &[OsStr::new("check"), OsStr::new("metrics")],
            &to_prometheus_text(&body),
        )?;
        if !check.status.success() || !check.stderr.is_empty() {
            problems.push(format!(
                "promtool check metrics on the {process}'s scrape: {}",
                promtool_report(&check)
            ));
        }
        scraped.extend(scraped_families(&body));
    }
    for missing in missing_metrics(&all_queries(), &scraped) {
        problems.push(format!("queried but in neither scrape: {missing}"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// docs/runbooks.md as GitHub shows it: `repository` of the workspace's
/// `[workspace.package]`, on branch main.
fn runbooks_url() -> String {
    let manifest = read(&repo_root().join("Cargo.toml"));
    let mut section = "";
    let repository = manifest
        .lines()
        .map(str::trim)
        .find_map(|line| {
            if line.starts_with('[') {
                section = line;
                return None;
            }
            (section == "[workspace.package]")
                .then(|| line.strip_prefix("repository"))?
                .and_then(|rest| rest.trim_start().strip_prefix('='))
                .map(|value| value.trim().trim_matches('"').to_owned())
        })
        .expect("Cargo.toml's [workspace.package] has a repository");
    format!("{repository}/blob/main/docs/runbooks.md")
}

/// The anchor GitHub gives a heading: lower case, spaces to `-`, every
/// other character but letters, digits, `-` and `_` dropped.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// A Markdown document's ATX headings outside fenced code (where `#`
/// starts a shell comment), as (level, text).
fn headings(markdown: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut found = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if fenced || !(1..=6).contains(&level) {
            continue;
        }
        if let Some(text) = line[level..].strip_prefix(' ') {
            found.push((level, text.trim().trim_end_matches('#').trim().to_owned()));
        }
    }
    found
}

/// Every anchor of a document's headings; a repeated heading's anchor gets
/// `-1`, `-2`, ... as on GitHub.
fn anchors(markdown: &str) -> Vec<String> {
    let mut anchors: Vec<String> = Vec::new();
    for (_, text) in headings(markdown) {
        let base = github_anchor(&text);
        let mut anchor = base.clone();
        let mut n = 0;
        while anchors.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        anchors.push(anchor);
    }
    anchors
}

/// What is wrong between the alerts of `prometheus_rule` and `runbooks`, the
/// runbooks document published at `url`: an alert without a `runbook_url`,
/// one that points elsewhere, at no heading, or at a section not its own;
/// and a section (a `##` heading) named after no alert.
fn runbook_problems(prometheus_rule: &str, runbooks: &str, url: &str) -> Vec<String> {
    let rule: serde_json::Value =
        serde_norway::from_str(prometheus_rule).expect("the PrometheusRule is YAML");
    let alerts: Vec<(String, Option<String>)> = rule["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("a group's rules"))
        .filter_map(|rule| {
            let alert = rule["alert"].as_str()?.to_owned();
            let link = rule["annotations"]["runbook_url"]
                .as_str()
                .map(str::to_owned);
            Some((alert, link))
        })
        .collect();
    let anchors = anchors(runbooks);
    let mut problems = Vec::new();
    for (alert, link) in &alerts {
        let Some(link) = link else {
            problems.push(format!("{alert} has no runbook_url"));
            continue;
        };
        let Some(anchor) = link
            .strip_prefix(url)
            .and_then(|rest| rest.strip_prefix('#'))
        else {
            problems.push(format!(
                "{alert}'s runbook_url {link} is not {url}#<its section>"
            ));
            continue;
        };
        if !anchors.iter().any(|a| a == anchor) {
            problems.push(format!(
                "{alert}'s runbook_url anchor #{anchor} is no heading of the runbooks"
            ));
        } else if anchor != github_anchor(alert) {
            problems.push(format!(
                "{alert}'s runbook_url points at #{anchor}, not its own section #{}",
                github_anchor(alert)
            ));
        }
    }
    let sections = headings(runbooks)
        .into_iter()
        .filter(|(level, _)| *level == 2)
        .map(|(_, text)| text);
    for section in sections {
        if !alerts.iter().any(|(alert, _)| *alert == section) {
            problems.push(format!(
                "the runbooks have a section \"{section}\" for no alert"
            ));
        }
    }
    problems
}

/// Each alert's runbook_url is its own section of docs/runbooks.md, at the
/// repository's address, and the runbooks have no section for an alert
/// that is gone. Reads files only: no promtool, no control plane.
#[test]
fn every_alert_links_its_own_runbook_section() {
    let runbooks = read(&repo_root().join("docs/runbooks.md"));
    let problems = runbook_problems(&prometheus_rule(), &runbooks, &runbooks_url());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(
        runbooks_url(),
        "https://github.com/petstore-operator/petstore-operator/blob/main/docs/runbooks.md"
    );
}

/// The checker itself: a rule without a runbook, a broken anchor, a link
/// elsewhere, one to another alert's section and a section left behind by
/// a removed alert are each reported; the fixed document passes.
#[test]
fn runbook_checker_reports_each_broken_link_and_stale_section() {
    let url = "https://example.com/o/r/blob/main/docs/runbooks.md";
    let alerts = ["StoreDown", "NoRunbook", "BadAnchor", "Elsewhere"];
    // The four alerts with these runbook_urls ("" for none).
    let rule = |links: [String; 4]| {
        let mut yaml = String::from("spec:\n  groups:\n    - name: g\n      rules:\n");
        for (alert, link) in alerts.into_iter().zip(links) {
            yaml.push_str(&format!(
                "        - alert: {alert}\n          expr: vector(1)\n          annotations:\n            summary: s\n"
            ));
            if !link.is_empty() {
                yaml.push_str(&format!("            runbook_url: {link}\n"));
            }
        }
        // A recording rule needs no runbook.
        yaml.push_str("        - record: job:up:sum\n          expr: sum(up)\n");
        yaml
    };
    let doc = "# Runbooks\n\n```sh\n# a shell comment, not a heading\n```\n\n\
        ## StoreDown\n\n**Confirm.**\n\n## Bad anchor: the store's `up` == 0\n\n\
        ## OldAlert\n";
    let broken = rule([
        format!("{url}#storedown"),
        String::new(),
        format!("{url}#badanchor"),
        "https://wiki.example.com/runbooks#elsewhere".to_owned(),
    ]);
    assert_eq!(
        runbook_problems(&broken, doc, url),
        [
            "NoRunbook has no runbook_url".to_owned(),
            "BadAnchor's runbook_url anchor #badanchor is no heading of the runbooks".to_owned(),
            format!(
                "Elsewhere's runbook_url https://wiki.example.com/runbooks#elsewhere is not {url}#<its section>"
            ),
            "the runbooks have a section \"Bad anchor: the store's `up` == 0\" for no alert"
                .to_owned(),
            "the runbooks have a section \"OldAlert\" for no alert".to_owned(),
        ]
    );
    assert_eq!(
        github_anchor("Bad anchor: the store's `up` == 0"),
        "bad-anchor-the-stores-up--0"
    );

    let fixed = "# Runbooks\n\n## StoreDown\n\n## NoRunbook\n\n## BadAnchor\n\n## Elsewhere\n";
    let all_to_one = rule(alerts.map(|_| format!("{url}#storedown")));
    assert_eq!(
        runbook_problems(&all_to_one, fixed, url),
        ["NoRunbook", "BadAnchor", "Elsewhere"].map(|alert| format!(
            "{alert}'s runbook_url points at #storedown, not its own section #{}",
            alert.to_lowercase()
        ))
    );
    let own = rule(alerts.map(|alert| format!("{url}#{}", alert.to_lowercase())));
    assert_eq!(runbook_problems(&own, fixed, url), Vec::<String>::new());
    // A repeated heading's anchor is numbered, as on GitHub.
    assert_eq!(
        anchors("## Confirm\n## Confirm\n### Confirm\n"),
        ["confirm", "confirm-1", "confirm-2"]
    );
}
