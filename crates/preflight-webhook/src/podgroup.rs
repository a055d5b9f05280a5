//! A gang's size from the scheduler's PodGroup: where a pod's labels,
//! annotations or spec point to one, the webhook reads it from the API
//! server (a GET, as its own ServiceAccount, within a deadline under the
//! API server's wait for the review) and gives the gate its size. Read
//! from each scheduler's own marks:
//!
//! - Kubernetes' own (the `GenericWorkloadPodGroup` gate):
//!   `spec.schedulingGroup.podGroupName` (or `spec.workloadRef.podGroupName`),
//!   a `scheduling.k8s.io/v1alpha2` PodGroup, its gang's `minCount`;
//! - Volcano: the annotation `scheduling.k8s.io/group-name`, a
//!   `scheduling.volcano.sh/v1beta1` PodGroup, `spec.minMember`;
//! - KAI: the annotation `pod-group-name`, a `scheduling.run.ai/v2alpha2`
//!   PodGroup, `spec.minMember`;
//! - the scheduler-plugins' coscheduling: the label
//!   `scheduling.x-k8s.io/pod-group`, a `scheduling.x-k8s.io/v1alpha1`
//!   PodGroup, `spec.minMember`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

/// A PodGroup a pod belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRef {
    /// Whose: `Volcano`, `KAI`, `coscheduling`, `Kubernetes`.
    pub scheduler: &'static str,
    /// Its API group and version.
    pub api: &'static str,
    pub namespace: String,
    pub name: String,
}

impl GroupRef {
    /// The API server's path for it.
    pub fn path(&self) -> String {
        format!(
            "/apis/{}/namespaces/{}/podgroups/{}",
            self.api, self.namespace, self.name
        )
    }

    /// `Volcano PodGroup train/job-pg`.
    pub fn words(&self) -> String {
        format!(
            "{} PodGroup {}/{}",
            self.scheduler, self.namespace, self.name
        )
    }
}

/// A name the API server would take: a DNS subdomain (nothing that could
/// change the path it is put in).
fn dns_name(n: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    n.len() <= 253
        && n.bytes().next().is_some_and(alnum)
        && n.bytes().last().is_some_and(alnum)
        && n.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
}

/// The PodGroup `pod` (in `namespace`, the review's: the pod's own
/// field is the creator's to write) belongs to, where a scheduler marked
/// one.
pub fn reference(pod: &Value, namespace: &str) -> Option<GroupRef> {
    let meta = &pod["metadata"];
    let spec = &pod["spec"];
    let marks: [(&'static str, &'static str, Option<&str>); 5] = [
        (
            "Kubernetes",
            "scheduling.k8s.io/v1alpha2",
            spec["schedulingGroup"]["podGroupName"].as_str(),
        ),
        (
            "Kubernetes",
            "scheduling.k8s.io/v1alpha2",
            spec["workloadRef"]["podGroupName"].as_str(),
        ),
        (
            "Volcano",
            "scheduling.volcano.sh/v1beta1",
            meta["annotations"]["scheduling.k8s.io/group-name"].as_str(),
        ),
        (
            "KAI",
            "scheduling.run.ai/v2alpha2",
            meta["annotations"]["pod-group-name"].as_str(),
        ),
        (
            "coscheduling",
            "scheduling.x-k8s.io/v1alpha1",
            meta["labels"]["scheduling.x-k8s.io/pod-group"].as_str(),
        ),
    ];
    marks.into_iter().find_map(|(scheduler, api, name)| {
        let name = name.filter(|n| dns_name(n))?;
        dns_name(namespace).then(|| GroupRef {
            scheduler,
            api,
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    })
}

/// How many pods the PodGroup gangs: `spec.minMember`, else the
/// `minCount` of its gang policy (searched for under `spec`, a few levels
/// deep, since the alpha API has moved it).
pub fn size(group: &Value) -> Option<u32> {
    fn min_count(v: &Value, depth: u32) -> Option<u64> {
        let m = v.as_object()?;
        if let Some(n) = m.get("minCount").and_then(Value::as_u64) {
            return Some(n);
        }
        if depth == 0 {
            return None;
        }
        m.values().find_map(|c| min_count(c, depth - 1))
    }
    let spec = &group["spec"];
    spec["minMember"]
        .as_u64()
        .or_else(|| min_count(spec, 4))
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
}

/// The most of a PodGroup read.
const MAX_OBJECT: usize = 1 << 20;

/// PodGroups read at once; a review past them waits its turn, within
/// its deadline.
const READS_AT_ONCE: usize = 16;
/// How long a group's size is taken as read: a gang's pods are created
/// together, and its size does not change under them.
const KEEP: Duration = Duration::from_secs(60);

/// The API server, as the webhook's ServiceAccount reaches it.
#[derive(Debug)]
pub struct ApiServer {
    base: String,
    /// Re-read for every call: the kubelet renews a projected token.
    token: PathBuf,
    client: reqwest::Client,
    reads: tokio::sync::Semaphore,
    /// The sizes read lately, by path.
    known: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, u32)>>,
}

impl ApiServer {
    /// `base` (`https://HOST:PORT`), trusting only the CA in `ca`.
    pub fn new(base: &str, ca: &Path, token: &Path) -> Result<ApiServer, String> {
        let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
        let ca_cert = reqwest::Certificate::from_pem(&pem)
            .map_err(|e| format!("{}: not a PEM certificate: {e}", ca.display()))?;
        std::fs::metadata(token).map_err(|e| format!("{}: {e}", token.display()))?;
        let client = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca_cert)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(1))
            .build()
            .map_err(|e| format!("the API server's client: {e}"))?;
        Ok(ApiServer {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_path_buf(),
            client,
            reads: tokio::sync::Semaphore::new(READS_AT_ONCE),
            known: Default::default(),
        })
    }

    /// The size of the PodGroup `group`, within `within` (a size read in
    /// the last minute is taken as it is).
    pub async fn group_size(&self, group: &GroupRef, within: Duration) -> Result<u32, String> {
        let path = group.path();
        let fresh = |known: &std::collections::HashMap<String, (std::time::Instant, u32)>| {
            known
                .get(&path)
                .filter(|(at, _)| at.elapsed() < KEEP)
                .map(|(_, n)| *n)
        };
        if let Some(n) = self.known.lock().ok().and_then(|k| fresh(&k)) {
            return Ok(n);
        }
        let read = tokio::time::timeout(within, async {
            let _turn = self.reads.acquire().await.map_err(|e| e.to_string())?;
            self.read_size(group).await
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {} ms", within.as_millis())));
        let n = read.map_err(|e| format!("{} not read: {e}", group.words()))?;
        if let Ok(mut k) = self.known.lock() {
            k.retain(|_, (at, _)| at.elapsed() < KEEP);
            k.insert(path, (std::time::Instant::now(), n));
        }
        Ok(n)
    }

    async fn read_size(&self, group: &GroupRef) -> Result<u32, String> {
        let token = std::fs::read_to_string(&self.token)
            .map_err(|e| format!("{}: {e}", self.token.display()))?;
        let mut r = self
            .client
            .get(format!("{}{}", self.base, group.path()))
            .bearer_auth(token.trim())
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(|e| preflight_facts::http::causes(&e))?;
        let status = r.status();
        let mut body = Vec::new();
        while let Some(chunk) = r
            .chunk()
            .await
            .map_err(|e| preflight_facts::http::causes(&e))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_OBJECT {
                return Err(format!("an answer over {} KiB", MAX_OBJECT >> 10));
            }
        }
        // The status alone: the API server's message is not repeated
        // to whoever created the pod.
        if !status.is_success() {
            return Err(format!("the API server answered {status}"));
        }
        let v: Value = serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))?;
        size(&v).ok_or_else(|| "it names no minMember or minCount".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_schedulers_mark_names_its_podgroup() {
        let cases = [
            (
                json!({"spec": {"schedulingGroup": {"podGroupName": "train-0"}}}),
                "Kubernetes",
                "/apis/scheduling.k8s.io/v1alpha2/namespaces/ml/podgroups/train-0",
            ),
            (
                json!({"metadata": {"annotations": {"scheduling.k8s.io/group-name": "train-pg"}}}),
                "Volcano",
                "/apis/scheduling.volcano.sh/v1beta1/namespaces/ml/podgroups/train-pg",
            ),
            (
                json!({"metadata": {"annotations": {"pod-group-name": "pg-train-1a2b"}}}),
                "KAI",
                "/apis/scheduling.run.ai/v2alpha2/namespaces/ml/podgroups/pg-train-1a2b",
            ),
            (
                json!({"metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "train"}}}),
                "coscheduling",
                "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups/train",
            ),
        ];
        for (pod, scheduler, path) in cases {
            let r = reference(&pod, "ml").unwrap();
            assert_eq!((r.scheduler, r.path().as_str()), (scheduler, path));
        }
        assert_eq!(reference(&json!({"metadata": {}}), "ml"), None);
        // A name that could change the path is no name.
        for odd in ["../../secrets/x", "..", "-x", "x."] {
            let pod = json!({"metadata": {"annotations": {"pod-group-name": odd}}});
            assert_eq!(reference(&pod, "ml"), None, "{odd}");
        }
    }

    #[test]
    fn the_size_is_min_member_or_the_gangs_min_count() {
        assert_eq!(size(&json!({"spec": {"minMember": 4}})), Some(4));
        assert_eq!(
            size(&json!({"spec": {"schedulingPolicy": {"gang": {"minCount": 8}}}})),
            Some(8)
        );
        assert_eq!(size(&json!({"spec": {"minMember": 0}})), None);
        assert_eq!(size(&json!({"spec": {}})), None);
    }
}
