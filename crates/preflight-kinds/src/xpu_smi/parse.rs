//! What Intel's `xpu-smi` (xpumanager 1.x, the line that supports Data
//! Center GPU Max) prints, read as its CLI writes it (fixtures/intel-tools
//! names the source of each field). xpu-smi numbers cards (`device_id`)
//! and their tiles (`tile_id`) itself, in PCI order, whatever the job's
//! Level Zero hierarchy.
//! - `diag -l LEVEL -j`: `result` (`Pass`, `Fail`, `Unknown`), `level`,
//!   and `component_list` of `{component_type, result, message}`; run on
//!   every device, `device_id` is the text `"0, 1, 2, 3"`.
//! - `health -l -j`: `device_list` of objects with `device_id` and one
//!   object per component (`core_temperature`, `memory_temperature`,
//!   `power`, `memory`, `xe_link_port`, `frequency`) holding `status`
//!   (`OK`, `Warning`, `Critical`, `Unknown`) and `description`.
//! - `topology -m`: a matrix of tiles (`GPU d/t`): `S` itself, `MDF` the
//!   other tile of its card, `XLn` a direct Xe Link of n lanes, `XL*` Xe
//!   Link through another tile, `NODE`/`SYS` PCIe only. The user guide
//!   shows the cells between `|`, the CLI pads them with spaces: both read.
//! - Any of them may be `{"error": ..., "errno": N}` instead.

use serde_json::Value;

fn document(source: &str, text: &str) -> Result<serde_json::Map<String, Value>, String> {
    let start = text
        .find('{')
        .ok_or_else(|| format!("{source}: no JSON object in the output"))?;
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    let doc = match stream.next() {
        Some(Ok(Value::Object(o))) => o,
        Some(Ok(_)) | None => return Err(format!("{source}: no JSON object in the output")),
        Some(Err(e)) => return Err(format!("{source}: not JSON, or cut short: {e}")),
    };
    if let Some(e) = doc.get("error") {
        let errno = doc
            .get("errno")
            .map(|n| format!(" (errno {n})"))
            .unwrap_or_default();
        return Err(format!(
            "{source}: xpu-smi said: {}{errno}",
            e.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string())
        ));
    }
    Ok(doc)
}

fn text_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Component {
    /// `XPUM_DIAG_...`.
    pub kind: String,
    pub result: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Diag {
    pub result: String,
    pub level: Option<u64>,
    /// `0` or, over every device, `0, 1, 2, 3`.
    pub devices: String,
    pub components: Vec<Component>,
}

pub fn parse_diag(source: &str, text: &str) -> Result<Diag, String> {
    let doc = document(source, text)?;
    let result = doc
        .get("result")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{source}: no `result`: not an `xpu-smi diag -j` document"))?
        .to_string();
    let list = doc
        .get("component_list")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let components = list
        .iter()
        .map(|c| Component {
            kind: text_of(c.get("component_type")),
            result: text_of(c.get("result")),
            message: text_of(c.get("message")).trim().to_string(),
        })
        .collect();
    Ok(Diag {
        result,
        level: doc.get("level").and_then(Value::as_u64),
        devices: text_of(doc.get("device_id")),
        components,
    })
}

#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub device: u64,
    /// (component, status, description), as printed.
    pub components: Vec<(String, String, String)>,
}

impl Health {
    pub fn component(&self, name: &str) -> Option<(&str, &str)> {
        self.components
            .iter()
            .find(|(c, _, _)| c == name)
            .map(|(_, s, d)| (s.as_str(), d.as_str()))
    }
}

/// `health -l -j`, or one device's `health -d N -j`.
pub fn parse_health(source: &str, text: &str) -> Result<Vec<Health>, String> {
    let doc = document(source, text)?;
    let devices: Vec<&serde_json::Map<String, Value>> = match doc.get("device_list") {
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_object).collect(),
        Some(_) => return Err(format!("{source}: `device_list` is not a list")),
        None => vec![&doc],
    };
    let mut out = Vec::new();
    for d in devices {
        let device = d
            .get("device_id")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("{source}: a device without its `device_id`"))?;
        let components = d
            .iter()
            .filter_map(|(name, v)| {
                let o = v.as_object()?;
                let status = o.get("status")?.as_str()?;
                Some((
                    name.clone(),
                    status.to_string(),
                    text_of(o.get("description")).trim().to_string(),
                ))
            })
            .collect();
        out.push(Health { device, components });
    }
    Ok(out)
}

/// A tile, `(card, tile)`.
pub type Tile = (u32, u32);

fn tile(label: &str) -> Option<Tile> {
    let (d, t) = label.split_once('/')?;
    Some((d.parse().ok()?, t.parse().ok()?))
}

/// `topology -m`: every cell, (row tile, column tile, cell).
pub fn parse_matrix(source: &str, text: &str) -> Result<Vec<(Tile, Tile, String)>, String> {
    let tokens = |line: &str| -> Vec<String> {
        line.replace('|', " ")
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let mut columns: Vec<Tile> = Vec::new();
    let mut cells = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = tokens(line);
        if t.is_empty() {
            continue;
        }
        if t[0] == "GPU" && columns.is_empty() {
            // The header: `GPU 0/0 GPU 0/1 ... CPU Affinity`.
            columns = t
                .windows(2)
                .filter(|w| w[0] == "GPU")
                .filter_map(|w| tile(&w[1]))
                .collect();
            if columns.is_empty() {
                return Err(format!(
                    "{source}:{}: a header without `GPU d/t` columns",
                    n + 1
                ));
            }
            continue;
        }
        if t[0] != "GPU" {
            continue;
        }
        let row = t.get(1).and_then(|l| tile(l)).ok_or_else(|| {
            format!(
                "{source}:{}: `{}` does not start with `GPU d/t`",
                n + 1,
                line.trim()
            )
        })?;
        if t.len() < 2 + columns.len() {
            return Err(format!(
                "{source}:{}: {} cells where the header has {} columns",
                n + 1,
                t.len() - 2,
                columns.len()
            ));
        }
        for (col, cell) in columns.iter().zip(&t[2..2 + columns.len()]) {
            cells.push((row, *col, cell.clone()));
        }
    }
    if columns.is_empty() {
        return Err(format!(
            "{source}: no `GPU d/t` header: not `xpu-smi topology -m`"
        ));
    }
    Ok(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diag_health_and_errors() {
        let d = parse_diag("d", r#"{"component_list": [{"component_type": "XPUM_DIAG_SOFTWARE_LIBRARY", "finished": true, "message": "Pass to check libraries.", "result": "Pass"}], "device_id": "0, 1", "level": 1, "result": "Pass"}"#).unwrap();
        assert_eq!(d.devices, "0, 1");
        assert_eq!(d.components[0].result, "Pass");
        assert!(
            parse_diag(
                "d",
                r#"{"errno": 15, "error": "last diagnostic task on the device is not completed"}"#
            )
            .unwrap_err()
            .contains("not completed (errno 15)")
        );
        let h = parse_health("h", r#"{"device_list": [{"device_id": 2, "memory": {"description": "All memory channels are healthy.", "status": "OK"}}]}"#).unwrap();
        assert_eq!(h[0].device, 2);
        assert_eq!(h[0].component("memory").unwrap().0, "OK");
        let one = parse_health(
            "h",
            r#"{"device_id": 0, "power": {"status": "Warning", "description": "x"}}"#,
        )
        .unwrap();
        assert_eq!(one[0].component("power"), Some(("Warning", "x")));
    }

    #[test]
    fn the_matrix_with_bars_or_spaces() {
        let guide = "\n         GPU 0/0|GPU 0/1|GPU 1/0|GPU 1/1|CPU Affinity\nGPU 0/0 |S      |MDF    |XL*    |XL16   |0-23,48-71\nGPU 0/1 |MDF    |S      |XL16   |XL*    |0-23,48-71\n";
        let m = parse_matrix("t", guide).unwrap();
        assert_eq!(m.len(), 8);
        assert_eq!(m[3], ((0, 0), (1, 1), "XL16".to_string()));
        let cli = "         GPU 0/0  GPU 1/0  CPU Affinity\nGPU 0/0  S        XL8      0-23\nGPU 1/0  XL8      S        24-47\n";
        assert_eq!(parse_matrix("t", cli).unwrap()[1].2, "XL8");
        assert!(parse_matrix("t", "GPU 0/0 GPU 0/1\nGPU 0/0 S\n").is_err());
        assert!(parse_matrix("t", "nothing\n").is_err());
    }
}
