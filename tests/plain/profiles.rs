//! Node profiles on the fixture nodes, run by the real binary: the
//! shipped profile each node's accelerators match (none for the others),
//! a degraded node failing against its profile with the profile named, a
//! profile captured from a healthy node passing it and failing degraded
//! ones, `--profile` over the shipped ones (and the kinds reading their
//! expectation from it), and a profile that does not read refused with
//! its place.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::fixture_run;
use crate::common::{CheckResult, Report, Status, Verdict};
use fixture_run::*;

fn root(name: &str) -> PathBuf {
    fixture(name).join("root")
}

/// `node.profile` alone over a fixture tree, with `--profile` when given.
fn profile_check(tree: &Path, profile: Option<&Path>) -> CheckResult {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "check",
        "--only",
        "node.profile",
        "--format",
        "json",
        "--root",
    ])
    .arg(tree)
    .env_remove("HABANA_VISIBLE_MODULES");
    if let Some(p) = profile {
        cmd.arg("--profile").arg(p);
    }
    let out = cmd.output().unwrap();
    crate::common::result(&crate::common::report_of(&out), "node.profile").clone()
}

/// A copy of the healthy HGX node's tree at `dir/name`, to break.
fn healthy_copy(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    let cp = Command::new("cp")
        .arg("-a")
        .arg(root("h100-ib-healthy"))
        .arg(&to)
        .status()
        .unwrap();
    assert!(cp.success());
    to
}

/// A site configuration directory whose health check runs `node.profile`
/// alone, reports under it; and its path as text.
fn site_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    std::fs::write(
        dir.path().join("settings.yaml"),
        format!("report_dir: {d}/reports\nscontrol: /bin/true\nhealthcheck:\n  only: [profile]\n"),
    )
    .unwrap();
    (dir, d)
}

/// `preflight slurm healthcheck` with the site directory `dir`, as slurmd
/// runs it (a clean environment): the report it kept.
fn healthcheck(dir: &Path) -> Report {
    let o = Command::new(BIN)
        .args(["slurm", "healthcheck"])
        .env_clear()
        .env("PREFLIGHT_CONFIG_DIR", dir)
        .env("SLURMD_NODENAME", "h1")
        .output()
        .unwrap();
    let text = std::fs::read_to_string(dir.join("reports/healthcheck.json")).unwrap_or_else(|e| {
        panic!(
            "no report ({e}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    crate::common::report(&text, &String::from_utf8_lossy(&o.stderr))
}

/// `preflight baseline diff PROFILE --root TREE`.
fn diff(profile: &Path, tree: &Path) -> (Option<i32>, String, String) {
    baseline(&[
        "diff",
        profile.to_str().unwrap(),
        "--root",
        tree.to_str().unwrap(),
    ])
}

fn baseline(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .arg("baseline")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn each_fixture_node_gets_its_profile_or_none() {
    let _shared = crate::common::shared();
    for (tree, profile) in [
        ("h100-ib-healthy", "hgx-h100-8"),
        ("amd-mi300x", "mi300x-8"),
        ("intel-max-xpu", "max1550-4"),
        ("gaudi2-hls", "gaudi2-8"),
    ] {
        let c = profile_check(&root(tree), None);
        assert_eq!(c.status, Status::Pass, "{tree}: {c:#?}");
        assert!(
            c.message
                .starts_with(&format!("matches profile {profile}: ")),
            "{tree}: {c:#?}"
        );
    }
    // Two H100 PCIe cards: no shipped profile is for them.
    let c = profile_check(&root("roce-node"), None);
    assert_eq!(c.status, Status::Skip);
    assert_eq!(
        c.message,
        "no profile matches 2 accelerators (NVIDIA 2331): this node is compared with its peers; `preflight baseline capture` writes one"
    );
    // A cloud VM without accelerators.
    assert_eq!(profile_check(&root("cpu-node"), None).status, Status::Skip);
}

/// The broken HGX node (one GPU off its driver, a link at x8, one at Gen4)
/// against the shipped profile; a copy of the healthy node with one IB
/// port at half rate against a profile captured from the healthy one.
#[test]
fn a_degraded_node_fails_against_its_profile_named() {
    let _shared = crate::common::shared();
    let c = profile_check(&root("h100-ib-broken"), None);
    assert_eq!(c.status, Status::Fail);
    assert_eq!(
        c.message,
        "against profile hgx-h100-8: 0000:9a:00.0: on the PCI bus but not usable (not bound to its driver); 7 of 8 accelerators usable; 0000:3a:00.0: PCIe Gen5 x8 where the profile has Gen5 x16; 0000:ab:00.0: PCIe Gen4 x16 where the profile has Gen5 x16"
    );
    assert_eq!(c.expected.as_deref(), Some("profile hgx-h100-8"));

    let dir = tempfile::tempdir().unwrap();
    let captured = dir.path().join("site.yaml");
    let (code, _, err) = baseline(&[
        "capture",
        "--root",
        root("h100-ib-healthy").to_str().unwrap(),
        "--name",
        "site-hgx",
        "--output",
        captured.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let text = std::fs::read_to_string(&captured).unwrap();
    for line in [
        "profile: \"site-hgx\"",
        "match: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8, virtual_machine: false}",
        "  pcie: {gen: 5, width: 16}",
        "  rdma: {ports: 8, rate: 400, link_layer: \"InfiniBand\"}",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    // A copy of the healthy node, one port of mlx5_2 at half rate.
    let half = healthy_copy(dir.path(), "half");
    let rate = std::fs::read_link(half.join("sys/class/infiniband/mlx5_2"))
        .map(|l| half.join("sys/class/infiniband").join(l))
        .unwrap()
        .join("ports/1/rate");
    std::fs::write(&rate, "200 Gb/sec (4X HDR)\n").unwrap();

    let (code, out, _) = diff(&captured, &root("h100-ib-healthy"));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out,
        format!(
            "gpu-h100-017: matches profile site-hgx ({})\n",
            captured.display()
        )
    );
    let (code, out, _) = diff(&captured, &half);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("  mlx5_2:1: 200 Gb/sec (4X HDR) where the profile has 400 Gb/s\n"),
        "{out}"
    );
    assert!(
        out.contains("  7 InfiniBand RDMA ports active at 400 Gb/s, the profile has 8\n"),
        "{out}"
    );
    // A port turned off on purpose is no fault, and a port is named only
    // when fewer than the profile's count are good.
    let state = half
        .join("sys/class/infiniband")
        .join(std::fs::read_link(half.join("sys/class/infiniband/mlx5_7")).unwrap());
    std::fs::write(state.join("ports/1/state"), "1: DOWN\n").unwrap();
    std::fs::write(state.join("ports/1/phys_state"), "3: Disabled\n").unwrap();
    let seven = dir.path().join("seven.yaml");
    let profile = |ports: usize| {
        format!(
            "profile: seven\nmatch: {{vendor: nvidia, device_ids: [\"0x2330\"], count: 8}}\nexpect:\n  rdma: {{ports: {ports}, rate: 400, link_layer: InfiniBand}}\n"
        )
    };
    std::fs::write(&seven, profile(6)).unwrap();
    let (code, out, _) = diff(&seven, &half);
    assert_eq!(code, Some(0), "{out}");
    std::fs::write(&seven, profile(7)).unwrap();
    let (code, out, _) = diff(&seven, &half);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("mlx5_2:1: 200 Gb/sec (4X HDR)"), "{out}");
    assert!(!out.contains("mlx5_7"), "a disabled port is named: {out}");
    let (code, out, _) = diff(&captured, &root("h100-ib-broken"));
    assert_eq!(code, Some(1));
    for d in [
        "0000:9a:00.0: on the PCI bus but not usable (not bound to its driver)",
        "0000:3a:00.0: PCIe Gen5 x8 where the profile has Gen5 x16",
        "mlx5_3:1: not active (10 Gb/sec (4X SDR))",
    ] {
        assert!(out.contains(d), "{d} not in:\n{out}");
    }

    // The same profile given to a run: the check names it and its file.
    let c = profile_check(&half, Some(&captured));
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.message.starts_with(&format!(
            "against profile site-hgx ({}): mlx5_2:1: 200 Gb/sec",
            captured.display()
        )),
        "{c:#?}"
    );
    assert_eq!(
        profile_check(&root("h100-ib-healthy"), Some(&captured)).status,
        Status::Pass
    );
}

/// A site's profile sets what the existing kinds expect where their
/// checks do not: a VM size with 12 NVLinks per GPU by design.
#[test]
fn the_kinds_read_their_expectation_from_the_profile() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let twelve = dir.path().join("twelve.yaml");
    std::fs::write(
        &twelve,
        "profile: vm-h100-12\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8}\nexpect:\n  nvlink: {links: 12}\n",
    )
    .unwrap();
    let checks = dir.path().join("checks.yaml");
    let recording = fixture("nvidia-tools").join("nvlink-vm-12-links.txt");
    std::fs::write(
        &checks,
        format!(
            "checks:\n  - {{id: nvlink, kind: nvlink, nvidia_smi_nvlink: \"{}\"}}\n",
            recording.display()
        ),
    )
    .unwrap();
    let run = |profile: Option<&Path>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["check", "--no-shipped", "--format", "json", "--checks"])
            .arg(&checks)
            .arg("--root")
            .arg(root("h100-ib-healthy"));
        if let Some(p) = profile {
            cmd.arg("--profile").arg(p);
        }
        let out = cmd.output().unwrap();
        crate::common::report_of(&out).checks[0].clone()
    };
    // The shipped HGX profile holds the board to 18; the site's VM
    // profile to 12.
    let shipped = run(None);
    assert_eq!(shipped.status, Status::Fail);
    assert!(
        shipped
            .message
            .ends_with("expected 18 as profile hgx-h100-8 sets"),
        "{shipped:#?}"
    );
    let site = run(Some(&twelve));
    assert_eq!(site.status, Status::Pass, "{site:#?}");
}

#[test]
fn a_profile_that_does_not_read_is_refused_with_its_place() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "profile: x\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8}\nexpect:\n  pcie: {gen: 5, widht: 16}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check", "--only", "node.profile", "--profile"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!("error: {}:4:", bad.display())) && err.contains("widht"),
        "{err}"
    );
    let (code, _, err) = baseline(&["diff", bad.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("widht"), "{err}");
    // The Slurm modes' profile is validated with the site.
    let site = tempfile::tempdir().unwrap();
    std::fs::copy(&bad, site.path().join("profile.yaml")).unwrap();
    let out = Command::new(BIN)
        .args(["validate", "--site", "--config-dir"])
        .arg(site.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:4:",
            site.path().join("profile.yaml").display()
        )) && err.contains("widht"),
        "{err}"
    );
    // A node with no accelerator has no profile to capture.
    let (code, _, err) = baseline(&["capture", "--root", root("cpu-node").to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("no accelerator on the PCI bus"), "{err}");
}

/// The Slurm modes take the site's profile from the configuration
/// directory (`profile.yaml`, beside `checks.d`).
#[test]
fn the_slurm_modes_hold_the_node_to_the_sites_profile() {
    let _shared = crate::common::shared();
    let (dir, d) = site_dir();
    std::fs::write(
        dir.path().join("profile.yaml"),
        "profile: site-a\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8}\nexpect:\n  accelerators: {count: 8}\n",
    )
    .unwrap();
    let report = healthcheck(dir.path());
    let check = &report.checks[0];
    assert_eq!(check.id, "node.profile", "{report}");
    assert_eq!(check.status, Status::Fail, "{report}");
    assert!(
        check.message.starts_with(&format!(
            "against profile site-a ({d}/profile.yaml): 0 NVIDIA accelerators of the profile's kind on the PCI bus, the profile has 8"
        )),
        "{report}"
    );
}

/// An Intel node's Xe Link matrix with no link at all: a failure on OAM
/// modules (Max 1550), nothing to judge on PCIe cards (Max 1100) that
/// have no bridge.
#[test]
fn no_xe_link_fails_oam_modules_only() {
    let _shared = crate::common::shared();
    let matrix = std::fs::read_to_string(fixture("intel-tools").join("topology-healthy.txt"))
        .unwrap()
        .replace("XL8 ", "SYS ")
        .replace("XL* ", "SYS ");
    for (device, status) in [("0x0bd5", "fail"), ("0x0bda", "skip")] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        for (i, bus) in ["16", "38", "98", "b8"].iter().enumerate() {
            let dev = root.join(format!("sys/devices/pci0000:{bus}/0000:{bus}:00.0"));
            std::fs::create_dir_all(&dev).unwrap();
            std::fs::write(dev.join("vendor"), "0x8086\n").unwrap();
            std::fs::write(dev.join("device"), format!("{device}\n")).unwrap();
            std::fs::write(dev.join("class"), "0x038000\n").unwrap();
            std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
            std::os::unix::fs::symlink(
                format!("../../../devices/pci0000:{bus}/0000:{bus}:00.0"),
                root.join(format!("sys/bus/pci/devices/0000:{bus}:00.0")),
            )
            .unwrap();
            let _ = i;
        }
        let topo = dir.path().join("topo.txt");
        std::fs::write(&topo, &matrix).unwrap();
        let checks = dir.path().join("checks.yaml");
        std::fs::write(
            &checks,
            format!(
                "checks:\n  - {{id: xe, kind: xpu_smi, subject: xe_link, xpu_smi_topology: \"{}\"}}\n",
                topo.display()
            ),
        )
        .unwrap();
        let out = Command::new(BIN)
            .args(["check", "--no-shipped", "--format", "json", "--checks"])
            .arg(&checks)
            .arg("--root")
            .arg(&root)
            .output()
            .unwrap();
        let r = crate::common::report_of(&out);
        assert_eq!(r.checks[0].status.name(), status, "{device}: {r}");
    }
}

/// Where their checks set nothing, `infiniband` takes the profile's RDMA
/// ports (rate, count, link layer), `pcie_link` the profile's generation
/// and width for the accelerators (a riser capable of x8 only looks
/// healthy against its own maximum), and `memory` the profile's total:
/// each says which profile set it.
#[test]
fn infiniband_pcie_link_and_memory_read_the_profile() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    // A copy of the healthy node: one port at half rate, one GPU on a
    // riser that trains and can train x8 only.
    let node = healthy_copy(dir.path(), "node");
    let linked = |link: &str| {
        let l = node.join(link);
        l.parent().unwrap().join(std::fs::read_link(&l).unwrap())
    };
    std::fs::write(
        linked("sys/class/infiniband/mlx5_2").join("ports/1/rate"),
        "200 Gb/sec (4X HDR)\n",
    )
    .unwrap();
    let gpu = linked("sys/bus/pci/devices/0000:3a:00.0");
    for f in ["current_link_width", "max_link_width"] {
        std::fs::write(gpu.join(f), "8\n").unwrap();
    }
    let checks = dir.path().join("checks.yaml");
    std::fs::write(
        &checks,
        "checks:\n  - {id: ib, kind: infiniband}\n  - {id: pci, kind: pcie_link, nics: false}\n  - {id: mem, kind: memory, min_nofile: 1}\n",
    )
    .unwrap();
    let site = dir.path().join("site.yaml");
    let run = |tree: &Path, profile: &str| {
        std::fs::write(&site, format!("profile: site\nmatch: {{vendor: nvidia, device_ids: [\"0x2330\"], count: 8}}\nexpect:\n{profile}")).unwrap();
        let out = Command::new(BIN)
            .args(["check", "--no-shipped", "--format", "json", "--checks"])
            .arg(&checks)
            .arg("--root")
            .arg(tree)
            .arg("--profile")
            .arg(&site)
            .output()
            .unwrap();
        let r = crate::common::report_of(&out);
        let of = |id: &str| {
            let c = crate::common::result(&r, id);
            (c.status.name().to_string(), c.message.clone())
        };
        [of("ib"), of("pci"), of("mem")]
    };
    let named = format!("profile site ({})", site.display());
    let expect = "  rdma: {ports: 8, rate: 400, link_layer: InfiniBand}\n  pcie: {gen: 5, width: 16}\n  memory: {min_total: 1TiB}\n";
    // The healthy node meets the profile; the degraded copy does not.
    for (status, message) in run(&root("h100-ib-healthy"), expect) {
        assert_eq!(status, "pass", "{message}");
    }
    let [ib, pci, mem] = run(&node, expect);
    assert_eq!(ib.0, "fail", "{ib:?}");
    assert!(
        ib.1.contains(&format!(
            "mlx5_2 port 1: rate 200 Gb/sec (4X HDR), where {named} has 400 Gb/sec"
        )),
        "{ib:?}"
    );
    assert!(
        ib.1.contains(&format!(
            "7 InfiniBand ports active at 400 Gb/sec, where {named} has 8"
        )),
        "{ib:?}"
    );
    assert_eq!(pci.0, "fail", "{pci:?}");
    assert!(
        pci.1.contains(&format!(
            "0000:3a:00.0 (GPU, numa 0): link x8 at 32 GT/s, where {named} has Gen5 x16"
        )),
        "{pci:?}"
    );
    assert_eq!(mem.0, "pass", "{mem:?}");
    // Without the profile the riser's link is at its own maximum.
    let [_, pci, _] = run(&node, "  nvlink: {links: 18}\n");
    assert_eq!(pci.0, "pass", "{pci:?}");
    // More memory than the node has.
    let [_, _, mem] = run(&node, "  memory: {min_total: 4TiB}\n");
    assert_eq!(mem.0, "fail", "{mem:?}");
    assert!(
        mem.1.contains(&format!(
            "2 TiB of RAM in all, where {named} has at least 4 TiB"
        )),
        "{mem:?}"
    );
}

/// A directory of site profiles: the one the node's facts match applies,
/// told by the cloud's instance type (cloud-init's instance metadata,
/// else the DMI product name), never the host name; a node none of them
/// matches gets the shipped profile its accelerators match.
#[test]
fn a_directory_of_profiles_is_chosen_from_by_the_instance_type() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("profiles.d");
    std::fs::create_dir(&site).unwrap();
    for (file, name, instance) in [
        ("azure.yaml", "ndv5", "Standard_ND96isr_H100_v5"),
        ("aws.yaml", "p5", "p5.48xlarge"),
    ] {
        std::fs::write(
            site.join(file),
            format!("profile: {name}\nmatch: {{vendor: nvidia, device_ids: [\"0x2330\"], count: 8, instance_type: {instance}}}\nexpect:\n  accelerators: {{count: 8}}\n"),
        )
        .unwrap();
    }
    let node = healthy_copy(dir.path(), "node");
    let message = |tree: &Path| profile_check(tree, Some(&site)).message;
    // No instance type anywhere: the shipped board profile.
    assert_eq!(
        message(&node),
        "matches profile hgx-h100-8: HGX H100 8-GPU, SXM5 80 GB"
    );
    // The DMI product name where a cloud writes the type there.
    let dmi = node.join("sys/class/dmi/id");
    std::fs::create_dir_all(&dmi).unwrap();
    std::fs::write(dmi.join("product_name"), "p5.48xlarge\n").unwrap();
    assert_eq!(
        message(&node),
        format!("matches profile p5 ({})", site.join("aws.yaml").display())
    );
    // cloud-init's instance metadata says the type on any cloud.
    let run = node.join("run/cloud-init");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(
        run.join("instance-data.json"),
        r#"{"v1": {"cloud_name": "azure", "instance_type": "Standard_ND96isr_H100_v5", "region": "eastus"}}"#,
    )
    .unwrap();
    assert_eq!(
        message(&node),
        format!(
            "matches profile ndv5 ({})",
            site.join("azure.yaml").display()
        )
    );
    // And a profile captured there is for that type.
    let (code, text, err) = baseline(&["capture", "--root", node.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.contains(", instance_type: \"Standard_ND96isr_H100_v5\"}"),
        "{text}"
    );
    // baseline diff chooses from the directory the same way.
    let (code, out, _) = diff(&site, &node);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("matches profile ndv5"), "{out}");
    // A bad file in the directory is refused with its place.
    std::fs::write(site.join("bad.yaml"), "profile: x\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8, instance_typ: y}\nexpect: {accelerators: {count: 8}}\n").unwrap();
    let out = Command::new(BIN)
        .args(["check", "--only", "node.profile", "--root"])
        .arg(&node)
        .arg("--profile")
        .arg(&site)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:2:", site.join("bad.yaml").display())),
        "{err}"
    );
}

/// Driver and firmware families: captured from a known-good node as the
/// driver's major and the firmware's first two parts, and a node with
/// another driver or one adapter on older firmware named against them.
#[test]
fn driver_and_firmware_families_are_captured_and_held() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let captured = dir.path().join("site.yaml");
    let (code, _, err) = baseline(&[
        "capture",
        "--root",
        root("h100-ib-healthy").to_str().unwrap(),
        "--output",
        captured.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let text = std::fs::read_to_string(&captured).unwrap();
    assert!(text.contains("\n  driver: {family: \"550\"}\n"), "{text}");
    assert!(text.contains("  firmware: {rdma: \"28.39\""), "{text}");
    let node = healthy_copy(dir.path(), "node");
    let (code, out, _) = diff(&captured, &node);
    assert_eq!(code, Some(0), "{out}");
    std::fs::write(node.join("sys/module/nvidia/version"), "535.104.05\n").unwrap();
    let hca = node.join("sys/class/infiniband/mlx5_3");
    let hca = hca
        .parent()
        .unwrap()
        .join(std::fs::read_link(&hca).unwrap());
    std::fs::write(hca.join("fw_ver"), "28.38.1002\n").unwrap();
    let (code, out, _) = diff(&captured, &node);
    assert_eq!(code, Some(1), "{out}");
    for d in [
        "  driver nvidia 535.104.05 where the profile has the 550 family\n",
        "  mlx5_3: RDMA adapter firmware 28.38.1002 where the profile has the 28.39 family\n",
    ] {
        assert!(out.contains(d), "{d} not in:\n{out}");
    }
    assert!(!out.contains("mlx5_2"), "{out}");
}

/// A fleet's profiles in the site's `profiles.d/`: `validate --site`
/// reads every one (a bad one refused with its place), and the Slurm
/// health check holds a node to the one its facts match: here none (this
/// machine has no accelerator), so `node.profile` skips.
#[test]
fn a_fleets_profiles_directory_is_validated_and_chosen_from() {
    let _shared = crate::common::shared();
    let (dir, d) = site_dir();
    let fleet = dir.path().join("profiles.d");
    std::fs::create_dir(&fleet).unwrap();
    std::fs::write(
        fleet.join("a.yaml"),
        "profile: site-a\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8, instance_type: p5.48xlarge}\nexpect:\n  accelerators: {count: 8}\n",
    )
    .unwrap();
    // An editor's lock file and a directory are not profiles.
    std::fs::write(fleet.join(".#a.yaml"), "not: a profile\n").unwrap();
    std::fs::create_dir(fleet.join("old.yaml")).unwrap();
    let validate = || {
        Command::new(BIN)
            .args(["validate", "--site"])
            .env("PREFLIGHT_CONFIG_DIR", dir.path())
            .output()
            .unwrap()
    };
    let o = validate();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains(&format!("node profile {d}/profiles.d")),
        "{out}"
    );
    let report = healthcheck(dir.path());
    assert_eq!(report.checks[0].id, "node.profile", "{report}");
    assert_eq!(report.checks[0].status, Status::Skip, "{report}");
    std::fs::write(
        fleet.join("b.yaml"),
        "profile: site-b\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8}\nexpect:\n  floors: {busbw: [{backend: tcp, op: alltoall, size: 1MiB, gbps: 1}]}\n",
    )
    .unwrap();
    let o = validate();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("{d}/profiles.d/b.yaml:4:")) && err.contains("op `alltoall`"),
        "{err}"
    );
}

/// `baseline capture --from` reads reports anyone may have written: a
/// world past what a rendezvous admits is refused before anything is
/// sized by it, and an unhealthy run is no baseline.
#[test]
fn capture_from_refuses_what_no_healthy_run_wrote() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let recorded = fixture("reports").join("run-4node/rank0.json");
    let mut report: preflight::schema::Report =
        serde_json::from_str(&std::fs::read_to_string(recorded).unwrap()).unwrap();
    let capture = |report: &preflight::schema::Report| {
        let file = dir.path().join("rank0.json");
        std::fs::write(&file, serde_json::to_string(report).unwrap()).unwrap();
        let started = std::time::Instant::now();
        let out = baseline(&[
            "capture",
            "--root",
            root("h100-ib-healthy").to_str().unwrap(),
            "--from",
            file.to_str().unwrap(),
        ]);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        out
    };
    let (code, _, err) = capture(&report);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("the run's verdict is not_ready, not ready"),
        "{err}"
    );
    let world = |report: &mut preflight::schema::Report, n: u32| {
        report
            .collective
            .as_mut()
            .expect("a collective section")
            .world_size = n;
        report
            .cluster
            .as_mut()
            .expect("a cluster section")
            .world_size = n;
    };
    report.verdict = Verdict::Ready;
    world(&mut report, 4_000_000_000);
    let (code, _, err) = capture(&report);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("a collective section of 4000000000 ranks (1 to 1048576 are possible)"),
        "{err}"
    );
    // The same report with its real world gives floors.
    world(&mut report, 4);
    let (code, text, err) = capture(&report);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.contains(
            "  floors:\n    busbw:\n      - {backend: tcp, op: allgather, size: 4MiB, gbps: "
        ),
        "{text}"
    );
}
