//! How this node reaches an HTTP endpoint, as the job would: the proxy its
//! environment names for a URL, a URL as it may be shown (no password),
//! and the part of a failed request's error that says why. The `http`
//! kind and `--post` both go through here.

use super::Facts;

/// The first set variable, in either case.
fn env_either<'a>(facts: &'a Facts, name: &str) -> Option<&'a str> {
    facts
        .env(name)
        .or_else(|| facts.env(&name.to_ascii_lowercase()))
        .filter(|v| !v.trim().is_empty())
}

/// The proxy the job would use for `url`, per the usual conventions:
/// HTTPS_PROXY or HTTP_PROXY by scheme, else ALL_PROXY, unless NO_PROXY
/// names the host (exactly, as a domain suffix, or `*`).
pub fn proxy_for(facts: &Facts, url: &reqwest::Url) -> Option<String> {
    let host = url
        .host_str()?
        .trim_matches(['[', ']'])
        .to_ascii_lowercase();
    if let Some(list) = env_either(facts, "NO_PROXY") {
        let exempt = list.split(',').map(str::trim).any(|entry| {
            let entry = entry.trim_start_matches("*.").trim_start_matches('.');
            let entry = entry.to_ascii_lowercase();
            entry == "*"
                || (!entry.is_empty() && (host == entry || host.ends_with(&format!(".{entry}"))))
        });
        if exempt {
            return None;
        }
    }
    let var = if url.scheme() == "https" {
        "HTTPS_PROXY"
    } else {
        "HTTP_PROXY"
    };
    env_either(facts, var)
        .or_else(|| env_either(facts, "ALL_PROXY"))
        .map(String::from)
}

/// A URL as it may be shown (reports, stderr, logs): a password in it,
/// the collector's or a proxy's, as `***` (the user name stays: it says
/// which account, and is no secret).
pub fn redact_credentials(text: &str) -> String {
    // `user:secret@proxy:3128`, without a scheme, is a proxy too.
    let start = text.find("://").map_or(0, |i| i + 3);
    let rest = &text[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            let secret = rest[..at].contains(':');
            if secret {
                format!("{}{user}:***@{}", &text[..start], &rest[at + 1..])
            } else {
                text.to_string()
            }
        }
        None => text.to_string(),
    }
}

/// The innermost cause, which is where reqwest keeps the useful part
/// ("Connection refused", "invalid peer certificate"); the outer layers
/// only repeat the URL.
pub fn causes(e: &dyn std::error::Error) -> String {
    let mut innermost = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        innermost = s.to_string();
        source = s.source();
    }
    innermost
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn facts(env: &[(&str, &str)]) -> Facts {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Facts::new("/".into(), env, vec![])
    }

    fn proxy(env: &[(&str, &str)], url: &str) -> Option<String> {
        proxy_for(&facts(env), &reqwest::Url::parse(url).unwrap())
    }

    #[test]
    fn the_proxy_follows_the_scheme_and_no_proxy() {
        let env = [
            ("https_proxy", "http://p:3128"),
            ("HTTP_PROXY", "http://plain:3128"),
            ("NO_PROXY", "localhost, .internal,registry.example"),
        ];
        assert_eq!(
            proxy(&env, "https://a.example/").as_deref(),
            Some("http://p:3128")
        );
        assert_eq!(
            proxy(&env, "http://a.example/").as_deref(),
            Some("http://plain:3128")
        );
        assert_eq!(proxy(&env, "https://x.internal/"), None);
        assert_eq!(proxy(&env, "https://REGISTRY.example/v2/"), None);
        assert_eq!(
            proxy(&env, "https://notregistry.example/").as_deref(),
            Some("http://p:3128")
        );
        assert_eq!(proxy(&env, "http://localhost:9/"), None);
        let all = [("ALL_PROXY", "socks5://s:1080"), ("no_proxy", "*")];
        assert_eq!(
            proxy(&all[..1], "https://a.example/").as_deref(),
            Some("socks5://s:1080")
        );
        assert_eq!(proxy(&all, "https://a.example/"), None);
        assert_eq!(proxy(&[("HTTPS_PROXY", " ")], "https://a.example/"), None);
    }

    #[test]
    fn passwords_in_urls_are_never_shown() {
        assert_eq!(
            redact_credentials("https://ops:s3cret@collector.example/reports?x=1"),
            "https://ops:***@collector.example/reports?x=1"
        );
        assert_eq!(
            redact_credentials("http://u:p@ss@proxy:3128"),
            "http://u:***@proxy:3128"
        );
        assert_eq!(
            redact_credentials("ops:s3cret@proxy:3128"),
            "ops:***@proxy:3128"
        );
        assert_eq!(
            redact_credentials("http://ops@proxy:3128/a@b"),
            "http://ops@proxy:3128/a@b"
        );
        assert_eq!(
            redact_credentials("https://collector.example/a:b@c"),
            "https://collector.example/a:b@c"
        );
    }
}
