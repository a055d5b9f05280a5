//! What the script prints: one JSON object per line after `MARK`, read
//! past whatever else the libraries print on the same stream.

use serde_json::Value;

/// Marks the script's own lines.
const MARK: &str = "PREFLIGHT-TORCH ";

/// What the script reported, line by line.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub(super) python: Option<String>,
    pub(super) python_version: Option<String>,
    pub(super) torch: Option<String>,
    pub(super) backend: Option<String>,
    pub(super) device: Option<String>,
    pub(super) device_id: Option<String>,
    pub(super) takes_device_id: Option<bool>,
    /// The last step the script announced.
    pub(super) step: Option<String>,
    pub(super) missing: Option<String>,
    pub(super) error: Option<(String, String)>,
    pub(super) done: bool,
    pub(super) world_size: Option<u64>,
}

impl Report {
    pub(super) fn parse(stdout: &str) -> Report {
        let mut r = Report::default();
        for line in stdout.lines() {
            let Some(json) = line.strip_prefix(MARK) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(json) else {
                continue;
            };
            let text = |key: &str| v.get(key).and_then(Value::as_str).map(String::from);
            if let Some(step) = text("step") {
                if step == "done" {
                    r.done = v.get("ok").and_then(Value::as_bool).unwrap_or(false);
                    r.world_size = v.get("world_size").and_then(Value::as_u64);
                } else {
                    r.step = Some(step);
                }
            }
            r.python = text("python").or(r.python.take());
            r.python_version = text("python_version").or(r.python_version.take());
            r.torch = text("torch").or(r.torch.take());
            r.backend = text("backend").or(r.backend.take());
            r.device = text("device").or(r.device.take());
            r.device_id = text("device_id").or(r.device_id.take());
            if let Some(b) = v.get("takes_device_id").and_then(Value::as_bool) {
                r.takes_device_id = Some(b);
            }
            if let Some(m) = text("missing") {
                r.missing = Some(m);
            }
            if let Some(e) = text("error") {
                r.error = Some((text("type").unwrap_or_default(), e));
            }
        }
        r
    }

    /// "torch 2.5.1, nccl (cuda), device_id=cuda:0" as far as known.
    pub(super) fn measured(&self) -> String {
        let mut parts = vec![match &self.torch {
            Some(v) => format!("torch {v}"),
            None => "torch (version unknown)".to_string(),
        }];
        if let Some(b) = &self.backend {
            parts.push(match &self.device {
                Some(d) => format!("{b} ({d})"),
                None => b.clone(),
            });
        }
        if let Some(id) = &self.device_id {
            parts.push(format!("device_id={id}"));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_are_read_past_foreign_output() {
        let out = "2026:11:22 oneCCL: some log line\n\
            PREFLIGHT-TORCH {\"step\": \"start\", \"python\": \"/usr/bin/python3\", \"python_version\": \"3.11.2\"}\n\
            PREFLIGHT-TORCH {\"step\": \"import\", \"torch\": \"2.5.1\"}\n\
            PREFLIGHT-TORCH {\"step\": \"device\", \"backend\": \"xccl\", \"device\": \"xpu\", \"device_id\": \"xpu:0\", \"takes_device_id\": true}\n\
            PREFLIGHT-TORCH {\"step\": \"new_group\"}\n\
            PREFLIGHT-TORCH {\"error\": \"No backend type associated with device type xpu\", \"type\": \"RuntimeError\", \"step\": \"new_group\"}\n";
        let r = Report::parse(out);
        assert_eq!(r.step.as_deref(), Some("new_group"));
        assert_eq!(r.measured(), "torch 2.5.1, xccl (xpu), device_id=xpu:0");
        assert_eq!(
            r.error,
            Some((
                "RuntimeError".into(),
                "No backend type associated with device type xpu".into()
            ))
        );
        assert!(!r.done);
    }
}
