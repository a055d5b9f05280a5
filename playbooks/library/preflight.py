#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the preflight developers
# SPDX-License-Identifier: MIT
"""Ansible module: run preflight on a managed host and return its verdict."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: preflight
short_description: Run preflight on a host and return its readiness verdict
description:
  - Runs the C(preflight) binary on the managed host with C(--format json) and
    returns its report as structured data, with the failing checks as
    C(problems).
  - A host that is not ready fails the task, with C(msg) listing its
    problems (check id and message, one per line). Other hosts go on.
  - With O(command=run) and O(cluster), the host takes part in the cluster
    and collective stages in node mode. When the cluster is not ready and its
    verdict names the node(s) at fault, only those hosts fail; the others
    return the cluster verdict and the culprits without failing.
  - preflight only reads the host, so the module never reports C(changed),
    and it runs in check mode as well (the report file is then not written).
  - Needs Python 3.8 or later on the managed host, and only its standard
    library.
version_added: "0.1.0"
author:
  - preflight developers
options:
  binary:
    description: Path of the preflight binary on the managed host.
    type: path
    default: /usr/local/bin/preflight
  command:
    description:
      - V(check) runs the node's checklist only (no rendezvous).
      - V(run) adds the cluster and collective stages; give O(cluster) for a
        job across the play's hosts.
    type: str
    choices: [check, run]
    default: check
  checks:
    description: Checklist files or directories on the host (C(--checks)).
    type: list
    elements: path
    default: []
  no_shipped:
    description: Leave out the shipped checklist (C(--no-shipped)).
    type: bool
    default: false
  only:
    description: Run only checks with these ids or tags (C(--only)).
    type: list
    elements: str
    default: []
  skip:
    description: Leave out checks with these ids or tags (C(--skip)).
    type: list
    elements: str
    default: []
  strict:
    description: Warnings make the host not ready (C(--strict)).
    type: bool
    default: false
  timeout:
    description:
      - preflight's deadline for the whole run (C(--timeout)), e.g. V(60s).
      - The module kills preflight and fails if it is still running 30
        seconds after this deadline.
    type: str
    default: 60s
  incomplete:
    description:
      - What a verdict of C(incomplete) (exit code 3, a required check could
        not be evaluated) does to the task.
    type: str
    choices: [fail, warn]
    default: fail
  output:
    description:
      - Also write the JSON report to this path on the host, atomically (for
        M(ansible.builtin.fetch)). Not written in check mode.
    type: path
  environment:
    description:
      - Variables added to preflight's environment, e.g. C(MASTER_ADDR),
        C(NCCL_SOCKET_IFNAME) or C(GLOO_SOCKET_IFNAME).
    type: dict
    default: {}
  cluster:
    description: Node mode for O(command=run), one process per host.
    type: dict
    suboptions:
      nnodes:
        description: Number of hosts in the job (C(--nnodes)).
        type: int
        required: true
      node_rank:
        description: This host's index, 0 to O(cluster.nnodes)-1; node 0 serves the rendezvous.
        type: int
        required: true
      master_addr:
        description: Address of node 0, where the rendezvous is served.
        type: str
        required: true
      master_port:
        description: The rendezvous port.
        type: int
        default: 29500
      nproc_per_node:
        description: Ranks per host, or V(auto) (one per local accelerator, else one).
        type: str
        default: "1"
      probe_ports:
        description: Port range of the reachability probe listener, e.g. V(29600-29699).
        type: str
      collective:
        description: The collective stage.
        type: str
        choices: ["off", short, full]
        default: short
      token:
        description:
          - The job's secret, passed in C(PREFLIGHT_TOKEN) (never on the
            command line). The same on every host of the job.
        type: str
      blame:
        description:
          - When the cluster is not ready and the verdict names the node(s) at
            fault, fail only those hosts. With V(false), every host of a
            cluster that is not ready fails.
        type: bool
        default: true
notes:
  - Supports check mode.
  - Exit codes of preflight are 0 ready, 1 not ready, 2 bad invocation or
    invalid checklist, 3 incomplete.
"""

EXAMPLES = r"""
- name: Check the node
  preflight:
    binary: /opt/preflight/bin/preflight
    checks: [/opt/preflight/checks.d]
    skip: [nvidia.persistence]
  register: preflight_result

- name: Check the network only, warnings fail the host
  preflight:
    only: [network]
    strict: true

- name: Rendezvous and collectives across the play's hosts
  preflight:
    command: run
    cluster:
      nnodes: "{{ ansible_play_hosts_all | length }}"
      node_rank: "{{ ansible_play_hosts_all.index(inventory_hostname) }}"
      master_addr: "{{ hostvars[ansible_play_hosts_all[0]].ansible_host }}"
      token: "{{ job_token }}"
    environment:
      GLOO_SOCKET_IFNAME: eth0
"""

RETURN = r"""
verdict:
  description: The host's verdict.
  returned: when preflight produced a report
  type: str
  sample: not_ready
exit_code:
  description: preflight's exit code (0 ready, 1 not ready, 2 invalid, 3 incomplete).
  returned: always
  type: int
  sample: 1
problems:
  description: Every check that failed, warned or could not be evaluated, node and cluster checks alike.
  returned: when preflight produced a report
  type: list
  elements: dict
  contains:
    id:
      description: The check's id.
      type: str
      sample: net.firewall
    status:
      description: fail, warn or error.
      type: str
      sample: fail
    message:
      description: What is wrong.
      type: str
    hint:
      description: How to fix it.
      type: str
  sample:
    - id: net.firewall
      status: fail
      message: "iptables drops tcp dport 29500:29510"
      hint: "Allow the cluster network"
report:
  description: The whole JSON report (schema C(preflight.report/v1)).
  returned: when preflight produced a report
  type: dict
cluster_verdict:
  description: With O(cluster), the cluster's verdict, which every host receives from node 0.
  returned: when the cluster stage ran
  type: str
  sample: not_ready
culprits:
  description: With O(cluster), the nodes the cluster's verdict holds responsible, each with C(node), C(ranks) and C(reasons).
  returned: when the cluster stage ran
  type: list
  elements: dict
culprit:
  description: Whether this host is one of the culprits.
  returned: when the cluster stage ran
  type: bool
reason:
  description:
    - "One line naming the first failing check, C(preflight: ID: message), at
      most 200 characters: for a Slurm drain reason or a ticket title."
  returned: when the task failed
  type: str
  sample: "preflight: net.firewall: iptables drops tcp dport 29500:29510"
cmd:
  description: The command line that ran (the token is never on it).
  returned: always
  type: list
  elements: str
stderr:
  description: What preflight wrote to stderr (errors, progress).
  returned: always
  type: str
"""

import json
import os
import re
import signal
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule

# Exit codes, as preflight defines them (crates/preflight-ground/src/exit.rs).
READY = 0
NOT_READY = 1
INVALID = 2
INCOMPLETE = 3
PROBLEM_STATUSES = ("fail", "warn", "error")
# What the module adds to preflight's own deadline before it kills it.
GRACE_SECONDS = 30
UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def seconds(text):
    """A preflight duration (60s, 2m, 1h30m, 500ms) in seconds, or None."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s", "", text.lower()):
        return None
    total = 0.0
    for number, unit in parts:
        if unit not in UNITS:
            return None
        total += float(number) * UNITS[unit]
    return total


def command_line(params):
    argv = [params["binary"], params["command"], "--format", "json", "--color", "never"]
    for path in params["checks"]:
        argv += ["--checks", path]
    if params["no_shipped"]:
        argv.append("--no-shipped")
    for sel in params["only"]:
        argv += ["--only", sel]
    for sel in params["skip"]:
        argv += ["--skip", sel]
    if params["strict"]:
        argv.append("--strict")
    argv += ["--timeout", params["timeout"]]
    cluster = params["cluster"]
    if cluster:
        argv += [
            "--nnodes", str(cluster["nnodes"]),
            "--node-rank", str(cluster["node_rank"]),
            "--master-addr", cluster["master_addr"],
            "--master-port", str(cluster["master_port"]),
            "--nproc-per-node", cluster["nproc_per_node"],
            "--collective", cluster["collective"],
        ]
        if cluster.get("probe_ports"):
            argv += ["--probe-ports", cluster["probe_ports"]]
    return argv


def run(argv, env, limit):
    """Runs preflight in its own process group; kills the group at the limit."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limit)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return proc.returncode, out, err, True


def problems_of(report):
    """Failed, warned and unevaluated checks: the node's, then the cluster's and the collective stage's."""
    found, seen = [], set()
    sections = [report.get("checks") or []]
    for extra in ("cluster", "collective"):
        part = report.get(extra) or {}
        sections.append(part.get("checks") or [])
    for checks in sections:
        for check in checks:
            if check.get("status") not in PROBLEM_STATUSES:
                continue
            key = (check.get("id"), check.get("message"))
            if key in seen:
                continue
            seen.add(key)
            found.append({
                "id": check.get("id"),
                "status": check.get("status"),
                "message": check.get("message"),
                "hint": check.get("hint"),
            })
    return found


def lines(problems):
    return "\n".join("%s: %s" % (p["id"], p["message"]) for p in problems)


def write_atomically(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".preflight-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def reason_of(problems, fallback):
    """preflight: ID: message, one line, bounded, for a drain reason."""
    first = next((p for p in problems if p["status"] == "fail"), None) or (problems[0] if problems else None)
    text = "preflight: %s: %s" % (first["id"], first["message"]) if first else "preflight: %s" % fallback
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


def signal_name(code):
    try:
        return signal.Signals(-code).name
    except ValueError:
        return "signal %d" % -code


def main():
    module = AnsibleModule(
        argument_spec=dict(
            binary=dict(type="path", default="/usr/local/bin/preflight"),
            command=dict(type="str", choices=["check", "run"], default="check"),
            checks=dict(type="list", elements="path", default=[]),
            no_shipped=dict(type="bool", default=False),
            only=dict(type="list", elements="str", default=[]),
            skip=dict(type="list", elements="str", default=[]),
            strict=dict(type="bool", default=False),
            timeout=dict(type="str", default="60s"),
            incomplete=dict(type="str", choices=["fail", "warn"], default="fail"),
            output=dict(type="path"),
            environment=dict(type="dict", default={}),
            cluster=dict(
                type="dict",
                options=dict(
                    nnodes=dict(type="int", required=True),
                    node_rank=dict(type="int", required=True),
                    master_addr=dict(type="str", required=True),
                    master_port=dict(type="int", default=29500),
                    nproc_per_node=dict(type="str", default="1"),
                    probe_ports=dict(type="str"),
                    collective=dict(type="str", choices=["off", "short", "full"], default="short"),
                    token=dict(type="str", no_log=True),
                    blame=dict(type="bool", default=True),
                ),
            ),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["cluster"] and params["command"] != "run":
        module.fail_json(msg="cluster needs command: run (check never takes part in a rendezvous)")
    if module.check_mode:
        # A checklist the play would copy first is not there in check mode:
        # run without it rather than fail on the play's own dry run.
        absent = [p for p in params["checks"] if not os.path.exists(p)]
        for path in absent:
            module.warn("check mode: %s is not installed yet; run without it" % path)
        params["checks"] = [p for p in params["checks"] if p not in absent]
    argv = command_line(params)
    result = dict(changed=False, cmd=argv, exit_code=None, stderr="")

    def fail(text, problems=()):
        result["reason"] = reason_of(list(problems), text.splitlines()[0])
        module.fail_json(msg=text, **result)

    binary = params["binary"]
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        why = "no such file" if not os.path.exists(binary) else "not an executable file"
        if module.check_mode:
            # The play's copy task does not copy in check mode: nothing to run yet.
            module.exit_json(
                skipped=True,
                msg="check mode: %s is not installed yet (%s); nothing was run" % (binary, why),
                **result
            )
        fail(
            "preflight binary %s: %s (install it first: playbooks/validate.yml copies it)" % (binary, why)
        )

    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in params["environment"].items()})
    cluster = params["cluster"] or {}
    if cluster.get("token"):
        env["PREFLIGHT_TOKEN"] = cluster["token"]
    deadline = seconds(params["timeout"])
    limit = (deadline if deadline is not None else 60.0) + GRACE_SECONDS

    code, out, err, killed = run(argv, env, limit)
    stdout = out.decode("utf-8", "replace")
    result["stderr"] = err.decode("utf-8", "replace")
    result["exit_code"] = code
    tail = result["stderr"].strip()[-2000:]

    if killed:
        fail(
            "preflight did not finish within %.0f s (its --timeout %s plus %d s); killed" % (limit, params["timeout"], GRACE_SECONDS)
        )
    if code < 0:
        fail(
            "preflight crashed: killed by %s%s" % (signal_name(code), ("\n" + tail) if tail else "")
        )
    if code == INVALID:
        fail("preflight refused the invocation (exit 2): %s" % (tail or "no error text"))
    try:
        report = json.loads(stdout)
    except ValueError as e:
        fail(
            "preflight exited %d without a JSON report (%s)%s" % (code, e, ("\n" + tail) if tail else "")
        )

    if params["output"] and not module.check_mode:
        try:
            write_atomically(params["output"], stdout)
        except OSError as e:
            fail("cannot write the report to %s: %s" % (params["output"], e))

    problems = problems_of(report)
    result.update(verdict=report.get("verdict"), problems=problems, report=report)
    warnings = [p for p in problems if p["status"] == "warn"]
    for p in warnings:
        module.warn("%s: %s" % (p["id"], p["message"]))

    verdict_section = report.get("cluster")
    if verdict_section is not None and cluster:
        culprits = verdict_section.get("culprits") or []
        rank = (report.get("node") or {}).get("rank")
        mine = [c for c in culprits if rank is not None and rank in (c.get("ranks") or [])]
        result.update(
            cluster_verdict=verdict_section.get("verdict"),
            culprits=culprits,
            culprit=bool(mine),
        )
        if code == NOT_READY and culprits and cluster.get("blame", True):
            if mine:
                reasons = mine[0].get("reasons") or []
                as_problems = [
                    dict(zip(("id", "message"), r.split(": ", 1)), status="fail") for r in reasons if ": " in r
                ]
                fail("not ready: this host is at fault\n%s" % "\n".join(reasons), as_problems)
            module.warn(
                "the cluster is not ready; at fault: %s"
                % "; ".join("%s (%s)" % (c.get("node"), "; ".join(c.get("reasons") or [])) for c in culprits)
            )
            module.exit_json(msg="this host is not at fault; the cluster is not ready", **result)

    if code == READY:
        module.exit_json(msg="ready", **result)
    if code == INCOMPLETE:
        text = "incomplete: a required check could not be evaluated\n%s" % lines(problems)
        if params["incomplete"] == "warn":
            module.warn(text)
            module.exit_json(msg=text, **result)
        fail(text, problems)
    if code == NOT_READY:
        failing = [p for p in problems if p["status"] != "warn"] or problems
        fail("not ready\n%s" % lines(failing), failing)
    fail("preflight exited %d%s" % (code, ("\n" + tail) if tail else ""))


if __name__ == "__main__":
    main()
