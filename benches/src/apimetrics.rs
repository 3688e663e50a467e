//! Counts from the API server's own `apiserver_request_total`, and the
//! Prometheus text parsing they share with the operator's counters.

use std::collections::BTreeMap;

use fixtures::{ControlPlane, Result};

/// (resource[/subresource], VERB) -> requests.
pub type RequestCounts = BTreeMap<(String, String), u64>;

/// The value of one label in `a="x",b="y"`, or "" if it is not there.
pub fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or("")
}

/// The labelled samples of one metric in Prometheus text: (labels, value).
pub fn samples<'a>(text: &'a str, metric: &str) -> impl Iterator<Item = (&'a str, f64)> {
    let prefix = format!("{metric}{{");
    text.lines().filter_map(move |line| {
        let (labels, value) = line.strip_prefix(&prefix)?.split_once("} ")?;
        Some((labels, value.trim().parse().unwrap_or(0.0)))
    })
}

/// The bucket bound at or under which `q` of the observations that the
/// histogram `metric` gained between two scrapes fall: an upper bound on
/// that quantile, as coarse as the buckets (infinite past the last one);
/// `None` if it gained none.
pub fn histogram_quantile(before: &str, after: &str, metric: &str, q: f64) -> Option<f64> {
    let buckets = |text: &str| -> BTreeMap<String, f64> {
        samples(text, &format!("{metric}_bucket"))
            .map(|(labels, count)| (label(labels, "le").to_owned(), count))
            .collect()
    };
    let earlier = buckets(before);
    let mut gained: Vec<(f64, f64)> = buckets(after)
        .into_iter()
        .filter_map(|(le, count)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, count - earlier.get(&le).copied().unwrap_or(0.0)))
        })
        .collect();
    gained.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = gained.last()?.1;
    if total <= 0.0 {
        return None;
    }
    gained
        .iter()
        .find(|(_, cumulative)| *cumulative >= q * total)
        .map(|(bound, _)| *bound)
}

/// Requests that acted: a server-side dry run (a fixture's probe that the
/// webhook converts) stores nothing, so it is not counted.
pub fn parse(text: &str) -> RequestCounts {
    let mut counts = RequestCounts::new();
    for (labels, value) in samples(text, "apiserver_request_total") {
        if !label(labels, "dry_run").is_empty() {
            continue;
        }
        let resource = label(labels, "resource");
        let subresource = label(labels, "subresource");
        let key = if subresource.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}/{subresource}")
        };
        *counts
            .entry((key, label(labels, "verb").to_owned()))
            .or_default() += value as u64;
    }
    counts
}

pub fn scrape(cp: &ControlPlane) -> Result<RequestCounts> {
    Ok(parse(&cp.kubectl(&["get", "--raw", "/metrics"])?))
}

/// after - before for each counter, keeping those that grew.
pub fn increase<K: Ord + Clone>(
    before: &BTreeMap<K, u64>,
    after: &BTreeMap<K, u64>,
) -> BTreeMap<K, u64> {
    after
        .iter()
        .map(|(key, n)| {
            (
                key.clone(),
                n.saturating_sub(before.get(key).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// after - before, keeping only the given resources and non-zero entries.
pub fn diff(before: &RequestCounts, after: &RequestCounts, resources: &[&str]) -> RequestCounts {
    let mut counts = increase(before, after);
    counts.retain(|(resource, _), _| {
        resources
            .iter()
            .any(|r| resource == r || resource.starts_with(&format!("{r}/")))
    });
    counts
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_labels_sums_codes_and_leaves_out_dry_runs() {
        let text = r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="petstore.example.com",resource="pets",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="petstore.example.com",resource="pets",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="petstore.example.com",resource="pets",scope="resource",subresource="",verb="POST",version="v1alpha1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="All",group="petstore.example.com",resource="pets",scope="resource",subresource="",verb="POST",version="v1alpha1"} 2
"#;
        let counts = super::parse(text);
        assert_eq!(counts[&("pets/status".into(), "PATCH".into())], 9);
        assert_eq!(
            counts[&("pets".into(), "POST".into())],
            3,
            "dry runs left out"
        );
    }

    #[test]
    fn an_increase_keeps_the_counters_that_grew() {
        let before = [("GetPets", 4), ("AddPets", 2)].into_iter().collect();
        let after = [("GetPets", 4), ("AddPets", 5), ("UpdatePets", 1)]
            .into_iter()
            .collect();
        let grew: Vec<_> = super::increase(&before, &after).into_iter().collect();
        assert_eq!(grew, [("AddPets", 3), ("UpdatePets", 1)]);
    }

    const BEFORE: &str = "m_bucket{le=\"0.001\"} 5\nm_bucket{le=\"0.002\"} 5\nm_bucket{le=\"0.004\"} 5\nm_bucket{le=\"+Inf\"} 5\n";

    #[test]
    fn a_histogram_quantile_is_the_bound_of_the_bucket_it_falls_in() {
        // Gained 100: 90 under 1 ms, 9 more under 2 ms, the last under 4 ms.
        let after = "m_bucket{le=\"0.001\"} 95\nm_bucket{le=\"0.002\"} 104\nm_bucket{le=\"0.004\"} 105\nm_bucket{le=\"+Inf\"} 105\n";
        assert_eq!(
            super::histogram_quantile(BEFORE, after, "m", 0.50),
            Some(0.001)
        );
        assert_eq!(
            super::histogram_quantile(BEFORE, after, "m", 0.99),
            Some(0.002)
        );
        assert_eq!(
            super::histogram_quantile(BEFORE, after, "m", 1.0),
            Some(0.004)
        );
    }

    #[test]
    fn past_the_last_bucket_the_bound_is_infinite_and_nothing_gained_is_none() {
        let after = "m_bucket{le=\"0.001\"} 5\nm_bucket{le=\"0.002\"} 5\nm_bucket{le=\"0.004\"} 5\nm_bucket{le=\"+Inf\"} 7\n";
        assert_eq!(
            super::histogram_quantile(BEFORE, after, "m", 0.99),
            Some(f64::INFINITY)
        );
        assert_eq!(super::histogram_quantile(BEFORE, BEFORE, "m", 0.99), None);
    }
}
