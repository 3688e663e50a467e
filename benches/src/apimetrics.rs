//! Counts from the API server's own `apiserver_request_total`.

use std::collections::BTreeMap;

use fixtures::{ControlPlane, Result};

/// (resource[/subresource], VERB) -> requests.
pub type RequestCounts = BTreeMap<(String, String), u64>;

fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or("")
}

pub fn parse(text: &str) -> RequestCounts {
    let mut counts = RequestCounts::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let resource = label(labels, "resource");
        let subresource = label(labels, "subresource");
        let key = if subresource.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}/{subresource}")
        };
        let value: f64 = value.trim().parse().unwrap_or(0.0);
        *counts
            .entry((key, label(labels, "verb").to_owned()))
            .or_default() += value as u64;
    }
    counts
}

pub fn scrape(cp: &ControlPlane) -> Result<RequestCounts> {
    Ok(parse(&cp.kubectl(&["get", "--raw", "/metrics"])?))
}

/// after - before, keeping only the given resources and non-zero entries.
pub fn diff(before: &RequestCounts, after: &RequestCounts, resources: &[&str]) -> RequestCounts {
    after
        .iter()
        .filter(|((resource, _), _)| {
            resources
                .iter()
                .any(|r| resource == r || resource.starts_with(&format!("{r}/")))
        })
        .map(|(key, n)| (key.clone(), n - before.get(key).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_labels_and_sums_codes() {
        let text = r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="petstore.example.com",resource="pets",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="petstore.example.com",resource="pets",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="petstore.example.com",resource="pets",scope="resource",subresource="",verb="POST",version="v1alpha1"} 3
"#;
        let counts = super::parse(text);
        assert_eq!(counts[&("pets/status".into(), "PATCH".into())], 9);
        assert_eq!(counts[&("pets".into(), "POST".into())], 3);
    }
}
