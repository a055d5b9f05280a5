#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the preflight developers
# SPDX-License-Identifier: MIT
"""Ansible module: summarise the preflight results of many hosts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: preflight_summary
short_description: Summarise the preflight results of a play's hosts
description:
  - Takes the registered results of the M(preflight) module for every host
    and returns which hosts are ready, not ready, incomplete or without a
    result (unreachable, or failed before preflight ran), and each problem
    once with the hosts that have it.
  - With O(report_dir), also writes C(summary.json) and C(summary.txt) there,
    atomically (not in check mode).
  - Runs on the controller; never fails because a host is not ready (the
    host's own task did).
version_added: "0.1.0"
author:
  - preflight developers
options:
  hosts:
    description: Every host that was to be checked, in order.
    type: list
    elements: str
    required: true
  results:
    description: Host name to the result registered from the M(preflight) module (missing or empty when the host has none).
    type: dict
    required: true
  report_dir:
    description: Directory on the controller to write C(summary.json) and C(summary.txt) into.
    type: path
notes:
  - Supports check mode.
"""

EXAMPLES = r"""
- name: Summarise
  preflight_summary:
    hosts: "{{ checked }}"
    results: "{{ dict(checked | zip(checked | map('extract', hostvars) | map(attribute='preflight_result', default={}))) }}"
    report_dir: /var/tmp/preflight-reports
"""

RETURN = r"""
ready:
  description: Hosts whose verdict is ready.
  returned: always
  type: list
  elements: str
not_ready:
  description: Hosts whose verdict is not ready, or whose preflight failed to run (missing binary, invalid checklist, crash).
  returned: always
  type: list
  elements: str
incomplete:
  description: Hosts whose verdict is incomplete.
  returned: always
  type: list
  elements: str
no_result:
  description: Hosts with no result at all (unreachable, or failed before the check).
  returned: always
  type: list
  elements: str
problems:
  description: Each failing, warning or unevaluated check once, with the hosts that have it and one host's message.
  returned: always
  type: list
  elements: dict
  sample:
    - id: site.somaxconn
      status: fail
      hosts: [h1]
      message: "net.core.somaxconn is 128, below the minimum 4096"
msg:
  description: The summary as text, one line per group and per problem.
  returned: always
  type: str
"""

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

RANK = {"fail": 0, "error": 1, "warn": 2}


def classify(result):
    """ready, not_ready, incomplete or no_result, for one host's registered result."""
    if not result:
        return "no_result"
    verdict = result.get("verdict")
    if verdict in ("ready", "not_ready", "incomplete"):
        return verdict
    if result.get("skipped"):
        return "no_result"
    return "not_ready"


def summarise(hosts, results):
    groups = {"ready": [], "not_ready": [], "incomplete": [], "no_result": []}
    problems = {}
    order = []
    for host in hosts:
        result = results.get(host) or {}
        groups[classify(result)].append(host)
        found = result.get("problems")
        if found is None and result and result.get("failed"):
            # preflight did not produce a report: its own error is the problem.
            found = [{"id": "preflight", "status": "error", "message": (result.get("msg") or "").splitlines()[0]}]
        for p in found or []:
            key = p.get("id")
            if key not in problems:
                problems[key] = {"id": key, "status": p.get("status"), "hosts": [], "message": p.get("message")}
                order.append(key)
            entry = problems[key]
            if host not in entry["hosts"]:
                entry["hosts"].append(host)
            if RANK.get(p.get("status"), 3) < RANK.get(entry["status"], 3):
                entry["status"] = p.get("status")
    listed = sorted((problems[k] for k in order), key=lambda p: (RANK.get(p["status"], 3), -len(p["hosts"])))
    return groups, listed


def text_of(groups, problems):
    out = []
    for name in ("not_ready", "incomplete", "no_result", "ready"):
        hosts = groups[name]
        out.append("%s (%d): %s" % (name, len(hosts), ", ".join(hosts) if hosts else "-"))
    if problems:
        out.append("problems:")
        for p in problems:
            out.append("  %s %s on %s: %s" % (p["status"].upper(), p["id"], ", ".join(p["hosts"]), p["message"]))
    return "\n".join(out)


def write_atomically(path, text):
    """Writes text to path unless it already holds it; says whether it wrote."""
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=".summary-", dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hosts=dict(type="list", elements="str", required=True),
            results=dict(type="dict", required=True),
            report_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    groups, problems = summarise(module.params["hosts"], module.params["results"])
    text = text_of(groups, problems)
    changed = False
    directory = module.params["report_dir"]
    if directory and not module.check_mode:
        try:
            os.makedirs(directory, exist_ok=True)
            doc = dict(schema="preflight.ansible-summary/v1", problems=problems, **groups)
            changed |= write_atomically(os.path.join(directory, "summary.json"), json.dumps(doc, indent=2) + "\n")
            changed |= write_atomically(os.path.join(directory, "summary.txt"), text + "\n")
        except OSError as e:
            module.fail_json(msg="cannot write the summary into %s: %s" % (directory, e))
    module.exit_json(changed=changed, msg=text, problems=problems, **groups)


if __name__ == "__main__":
    main()
