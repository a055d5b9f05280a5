//! Slurm hostlists: `gpu[001-004,010],login1` names gpu001..gpu004, gpu010
//! and login1. Zero padding is kept (the width of the range's first bound),
//! several bracket groups in one name multiply out (`r[1-2]n[1-2]`), and
//! commas inside brackets do not split hosts.
//!
//! Slurm compresses task counts per node the same way:
//! SLURM_TASKS_PER_NODE=`2(x3),1` is 2, 2, 2, 1 (`counts`).

/// More hosts than any real job has: a typo like `n[1-99999999]` must be an
/// error, not an allocation of gigabytes.
const MAX_HOSTS: usize = 1 << 20;

pub fn expand(list: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for item in split_top_level(list)? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let mut expanded = expand_one(item)?;
        if hosts.len() + expanded.len() > MAX_HOSTS {
            return Err(format!(
                "hostlist `{list}` names more than {MAX_HOSTS} hosts"
            ));
        }
        hosts.append(&mut expanded);
    }
    Ok(hosts)
}

/// `2(x3),1` to [2, 2, 2, 1]: a count, optionally repeated `(xN)` times,
/// per item.
pub fn counts(list: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = || format!("`{list}`: `{item}` is not a count such as 2 or 2(x3)");
        let (count, times) = match item.split_once('(') {
            Some((count, rest)) => {
                let times = rest
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(bad)?;
                (count, times.trim().parse::<usize>().map_err(|_| bad())?)
            }
            None => (item, 1),
        };
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if times == 0 || out.len() + times > MAX_HOSTS {
            return Err(format!("`{list}`: `{item}`: 1 to {MAX_HOSTS} nodes"));
        }
        out.extend(std::iter::repeat_n(count, times));
    }
    Ok(out)
}

/// Splits at commas outside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err(format!("hostlist `{list}`: nested `[` at byte {i}"));
                }
                depth += 1;
            }
            ']' => {
                if depth == 0 {
                    return Err(format!("hostlist `{list}`: `]` without `[` at byte {i}"));
                }
                depth -= 1;
            }
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("hostlist `{list}`: unclosed `[`"));
    }
    items.push(&list[start..]);
    Ok(items)
}

/// One host pattern, possibly with several bracket groups.
fn expand_one(pattern: &str) -> Result<Vec<String>, String> {
    let Some(open) = pattern.find('[') else {
        return Ok(vec![pattern.to_string()]);
    };
    let close = pattern[open..]
        .find(']')
        .map(|i| open + i)
        .ok_or_else(|| format!("hostlist item `{pattern}`: unclosed `[`"))?;
    let prefix = &pattern[..open];
    let ranges = &pattern[open + 1..close];
    let suffixes = expand_one(&pattern[close + 1..])?;
    let mut out = Vec::new();
    for part in ranges.split(',') {
        for number in expand_range(pattern, part.trim())? {
            for suffix in &suffixes {
                if out.len() >= MAX_HOSTS {
                    return Err(format!("hostlist item `{pattern}` names too many hosts"));
                }
                out.push(format!("{prefix}{number}{suffix}"));
            }
        }
    }
    Ok(out)
}

/// `001-004` to 001, 002, 003, 004; `7` to 7.
fn expand_range(pattern: &str, part: &str) -> Result<Vec<String>, String> {
    let bad = || format!("hostlist item `{pattern}`: `{part}` is not a number or range");
    let (lo, hi) = match part.split_once('-') {
        Some((lo, hi)) => (lo.trim(), hi.trim()),
        None => (part, part),
    };
    if lo.is_empty() || !lo.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if hi.is_empty() || !hi.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let width = lo.len();
    let start: u64 = lo.parse().map_err(|_| bad())?;
    let end: u64 = hi.parse().map_err(|_| bad())?;
    if end < start {
        return Err(format!(
            "hostlist item `{pattern}`: range `{part}` runs backwards"
        ));
    }
    if end - start >= MAX_HOSTS as u64 {
        return Err(format!(
            "hostlist item `{pattern}`: range `{part}` is too large"
        ));
    }
    Ok((start..=end).map(|n| format!("{n:0width$}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases: &[(&str, &[&str])] = &[
            ("node1", &["node1"]),
            ("a,b", &["a", "b"]),
            (
                "gpu[001-004,010],login1",
                &["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "login1"],
            ),
            ("n[8-11]", &["n8", "n9", "n10", "n11"]),
            ("n[09-11]", &["n09", "n10", "n11"]),
            ("r[1-2]n[1-2]", &["r1n1", "r1n2", "r2n1", "r2n2"]),
            ("x[3]", &["x3"]),
            ("a[1-2]-ib", &["a1-ib", "a2-ib"]),
            ("h[0-1],g[2,4]", &["h0", "h1", "g2", "g4"]),
            ("", &[]),
            ("a,,b", &["a", "b"]),
        ];
        for (input, want) in cases {
            let got = expand(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(got, *want, "{input}");
        }
    }

    #[test]
    fn task_counts() {
        assert_eq!(counts("2(x3),1").unwrap(), vec![2, 2, 2, 1]);
        assert_eq!(counts("4").unwrap(), vec![4]);
        assert_eq!(counts("1,3(x2)").unwrap(), vec![1, 3, 3]);
        assert_eq!(counts("").unwrap(), Vec::<u32>::new());
        for bad in ["x", "2(3)", "2(x)", "2(x0)", "2(x3", "-1", "2(x99999999)"] {
            let e = counts(bad).unwrap_err();
            assert!(e.starts_with(&format!("`{bad}`")), "{bad}: {e}");
        }
    }

    #[test]
    fn errors() {
        for bad in [
            "n[1-",
            "n1]",
            "n[a-b]",
            "n[5-2]",
            "n[1-99999999]",
            "n[[1]]",
            "n[-3]",
            "n[]",
        ] {
            assert!(expand(bad).is_err(), "{bad} should be an error");
        }
    }
}
