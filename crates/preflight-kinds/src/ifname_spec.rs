//! The interface selectors that communication libraries read from the
//! environment. NCCL (NCCL_SOCKET_IFNAME, and HCCL after it) takes a
//! comma-separated list of name prefixes, `=` for exact names and a leading
//! `^` to exclude instead of include. Gloo (GLOO_SOCKET_IFNAME) takes exact
//! names only and has no `^`; oneCCL and libfabric take one exact name.

use preflight_facts::Interface;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// Prefixes, `=` exact, `^` exclusion.
    Nccl,
    /// Exact names, comma-separated; no `^`.
    Gloo,
    /// One exact name.
    Single,
}

impl Syntax {
    /// How the variable's library reads it.
    pub fn of(variable: &str) -> Option<Syntax> {
        match variable {
            "NCCL_SOCKET_IFNAME" | "HCCL_SOCKET_IFNAME" => Some(Syntax::Nccl),
            "GLOO_SOCKET_IFNAME" => Some(Syntax::Gloo),
            "CCL_KVS_IFACE" | "FI_TCP_IFACE" => Some(Syntax::Single),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub exclude: bool,
    pub exact: bool,
    pub names: Vec<String>,
}

impl Spec {
    /// Parses a value; the error says what the library would do with it.
    pub fn parse(variable: &str, syntax: Syntax, value: &str) -> Result<Spec, String> {
        let mut rest = value.trim();
        if rest.is_empty() {
            return Err(format!("{variable} is set but empty"));
        }
        let mut exclude = false;
        let mut exact = false;
        if syntax == Syntax::Nccl {
            if let Some(r) = rest.strip_prefix('^') {
                exclude = true;
                rest = r;
            }
            if let Some(r) = rest.strip_prefix('=') {
                exact = true;
                rest = r;
            }
        } else {
            exact = true;
            if rest.starts_with('^') {
                return Err(format!(
                    "{variable}=`{value}`: {} does not support `^` exclusion; it looks for an interface literally named `{}` and fails",
                    if syntax == Syntax::Gloo {
                        "Gloo"
                    } else {
                        "this library"
                    },
                    rest.split(',').next().unwrap_or(rest)
                ));
            }
        }
        let names: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(format!("{variable}=`{value}` names no interface"));
        }
        if syntax == Syntax::Single && names.len() > 1 {
            return Err(format!(
                "{variable}=`{value}`: takes one interface name, not a list"
            ));
        }
        Ok(Spec {
            exclude,
            exact,
            names,
        })
    }

    fn entry_matches(&self, entry: &str, interface: &str) -> bool {
        if self.exact {
            interface == entry
        } else {
            interface.starts_with(entry)
        }
    }

    /// Whether the library would use this interface.
    pub fn selects(&self, interface: &str) -> bool {
        let listed = self.names.iter().any(|n| self.entry_matches(n, interface));
        listed != self.exclude
    }

    /// The entries of an inclusion list that match no interface.
    pub fn unmatched<'a>(&'a self, interfaces: &[Interface]) -> Vec<&'a str> {
        self.names
            .iter()
            .filter(|n| !interfaces.iter().any(|i| self.entry_matches(n, &i.name)))
            .map(String::as_str)
            .collect()
    }

    /// The interfaces the library could use: selected, and for an
    /// exclusion list not loopback (NCCL skips `lo` unless named).
    pub fn selected<'a>(&self, interfaces: &'a [Interface]) -> Vec<&'a Interface> {
        interfaces
            .iter()
            .filter(|i| self.selects(&i.name))
            .filter(|i| !(self.exclude && i.is_loopback()))
            .collect()
    }
}

/// Whether `variable=value` makes its library use `interface`. A value
/// the library cannot read picks nothing.
pub fn picks(variable: &str, value: &str, interface: &str) -> bool {
    Syntax::of(variable)
        .and_then(|syntax| Spec::parse(variable, syntax, value).ok())
        .is_some_and(|spec| spec.selects(interface))
}

/// Checks a selector against this node's interfaces: `Err` with the reason
/// when the library would find no usable interface.
pub fn check(
    variable: &str,
    value: &str,
    interfaces: &[Interface],
    route: Option<&str>,
) -> Result<String, String> {
    let Some(syntax) = Syntax::of(variable) else {
        return Ok(String::new());
    };
    let spec = Spec::parse(variable, syntax, value)?;
    let names = || {
        interfaces
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !spec.exclude {
        let missing = spec.unmatched(interfaces);
        // Gloo and oneCCL fail on any missing name; NCCL only when nothing
        // in the list matches.
        let fatal = match syntax {
            Syntax::Nccl => missing.len() == spec.names.len(),
            Syntax::Gloo | Syntax::Single => !missing.is_empty(),
        };
        if fatal {
            let mut message = format!(
                "{variable}=`{value}`: no interface {} `{}` on this node (have: {})",
                if spec.exact { "named" } else { "matching" },
                missing.join("`, `"),
                names()
            );
            // What carries traffic first: the interface of the route to
            // rank 0; spelling only after, and never loopback or a
            // traffic-shaping ifb device, which no library should use.
            if let Some(r) = route {
                message.push_str(&format!(
                    "; the route to MASTER_ADDR goes through `{r}`: {variable}={r}"
                ));
                return Err(message);
            }
            let candidates: Vec<&str> = interfaces
                .iter()
                .filter(|i| !i.is_loopback() && !i.name.starts_with("ifb"))
                .map(|i| i.name.as_str())
                .collect();
            if let Some(s) = missing
                .first()
                .and_then(|m| preflight_ground::suggest::did_you_mean(m, candidates))
            {
                message.push_str(&format!("; did you mean `{s}`?"));
            }
            return Err(message);
        }
    }
    let selected = spec.selected(interfaces);
    if selected.is_empty() {
        return Err(format!(
            "{variable}=`{value}` leaves no usable interface (have: {})",
            names()
        ));
    }
    let up: Vec<&&Interface> = selected.iter().filter(|i| i.is_up()).collect();
    if up.is_empty() {
        return Err(format!(
            "{variable}=`{value}` selects only interfaces that are down: {}",
            selected
                .iter()
                .map(|i| i.describe())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(up
        .iter()
        .map(|i| i.name.as_str())
        .collect::<Vec<_>>()
        .join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_interface_a_selector_picks() {
        let nccl = |v: &str, i: &str| picks("NCCL_SOCKET_IFNAME", v, i);
        assert!(nccl("eth", "eth0"));
        assert!(!nccl("ib", "eth0"));
        assert!(nccl("^docker,lo", "eth0"));
        assert!(!nccl("^eth", "eth0"));
        assert!(nccl("=eth0", "eth0"));
        assert!(!nccl("=eth", "eth0"));
        assert!(nccl("ib,eth", "eth1"));
        assert!(!nccl("", "eth0"));
        let gloo = |v: &str, i: &str| picks("GLOO_SOCKET_IFNAME", v, i);
        assert!(gloo("eth1,eth0", "eth0"));
        assert!(!gloo("eth", "eth0"));
        // Gloo has no exclusion: it looks for an interface named `^eth1`.
        assert!(!gloo("^eth1", "eth0"));
        assert!(!picks("NOT_A_SELECTOR", "eth0", "eth0"));
    }

    fn iface(name: &str, up: bool) -> Interface {
        Interface {
            name: name.into(),
            operstate: if up { "up" } else { "down" }.into(),
            carrier: Some(up),
            link_type: if name == "lo" { "loopback" } else { "ether" }.into(),
            ..Interface::default()
        }
    }

    fn node() -> Vec<Interface> {
        vec![
            iface("lo", true),
            iface("eth0", true),
            iface("eth1", false),
            iface("docker0", true),
        ]
    }

    #[test]
    fn nccl_prefixes_exact_and_exclusion() {
        let n = node();
        assert_eq!(
            check("NCCL_SOCKET_IFNAME", "eth", &n, None).unwrap(),
            "eth0"
        );
        assert_eq!(
            check("NCCL_SOCKET_IFNAME", "=eth0", &n, None).unwrap(),
            "eth0"
        );
        assert!(check("NCCL_SOCKET_IFNAME", "=eth", &n, None).is_err());
        assert_eq!(
            check("NCCL_SOCKET_IFNAME", "^docker,lo", &n, None).unwrap(),
            "eth0"
        );
        assert!(
            check("NCCL_SOCKET_IFNAME", "eth1", &n, None)
                .unwrap_err()
                .contains("down")
        );
        let e = check("NCCL_SOCKET_IFNAME", "ib0", &n, None).unwrap_err();
        assert!(e.contains("no interface matching `ib0`"), "{e}");
        assert!(check("NCCL_SOCKET_IFNAME", "^eth,docker", &n, None).is_err());
    }

    #[test]
    fn gloo_has_no_exclusion_and_needs_every_name() {
        let n = node();
        let e = check("GLOO_SOCKET_IFNAME", "^docker0", &n, None).unwrap_err();
        assert!(e.contains("does not support `^`"), "{e}");
        assert!(check("GLOO_SOCKET_IFNAME", "eth0,eth9", &n, None).is_err());
        assert!(check("GLOO_SOCKET_IFNAME", "eth", &n, None).is_err());
        assert_eq!(
            check("GLOO_SOCKET_IFNAME", "eth0", &n, None).unwrap(),
            "eth0"
        );
        let e = check("CCL_KVS_IFACE", "eth0,eth1", &n, None).unwrap_err();
        assert!(e.contains("one interface"), "{e}");
    }

    #[test]
    fn typo_gets_a_suggestion() {
        let e = check("GLOO_SOCKET_IFNAME", "eht0", &node(), None).unwrap_err();
        assert!(e.contains("did you mean `eth0`"), "{e}");
    }

    /// What carries traffic first: the interface of the route to rank 0,
    /// whatever the spelling; never a traffic-shaping ifb device.
    #[test]
    fn the_route_to_the_master_comes_before_spelling() {
        let mut n = node();
        n.push(iface("ifb0", true));
        n.push(iface("vB", true));
        let e = check("NCCL_SOCKET_IFNAME", "ib0", &n, None).unwrap_err();
        assert!(!e.contains("ifb0`?"), "{e}");
        let e = check("NCCL_SOCKET_IFNAME", "ib0", &n, Some("vB")).unwrap_err();
        assert!(
            e.ends_with("; the route to MASTER_ADDR goes through `vB`: NCCL_SOCKET_IFNAME=vB"),
            "{e}"
        );
    }
}
