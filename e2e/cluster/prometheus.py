#!/usr/bin/env python3
"""A real Prometheus over the real node's product (issue 33 item 2): its configuration from the
chart's own ServiceMonitor, and every query a user is given evaluated against it.

Usage:
  prometheus.py config SERVICEMONITOR_YAML TARGETS_FILE SCRAPE_INTERVAL
      A scrape job for each endpoint of each ServiceMonitor in SERVICEMONITOR_YAML (`helm
      template ... --set serviceMonitor.enabled=true`) with its path, scheme and honorLabels,
      its targets read from TARGETS_FILE (file_sd). Printed as JSON, which Prometheus reads as
      YAML. SCRAPE_INTERVAL replaces the ServiceMonitor's interval (a test of minutes scrapes
      every few seconds). Debian's Prometheus is built without Kubernetes discovery, hence:
  prometheus.py targets SERVICEMONITOR_YAML TARGETS_FILE
      What Prometheus Operator's endpoints discovery finds for those ServiceMonitors, written
      to TARGETS_FILE: the Services its selector (matchLabels, matchExpressions In, NotIn,
      Exists, DoesNotExist) selects in its namespaces, their Endpoints' ready addresses at the
      endpoint's port name, labelled namespace, service, pod, endpoint and job as the operator
      labels them. Read through $KUBECTL (default kubectl). Run again when pods change.
  prometheus.py rules OBSERVABILITY_MD
      The alert examples of docs/observability.md (the ```yaml block under `## Alert examples`),
      as a rules file for `promtool check rules`.
  prometheus.py queries URL DASHBOARD_JSON OBSERVABILITY_MD WINDOW NAMESPACE POLICY
      Evaluates at Prometheus URL every query of the Grafana dashboard (each panel's targets,
      each variable's `label_values`) with $namespace and $policy set to NAMESPACE and POLICY and
      the rate windows ($__rate_interval) set to WINDOW; and every alert example: its whole
      expression must evaluate, and each operand of its comparisons and set operators (an alert
      that does not fire returns nothing, what it compares must exist) must return series. A
      variable must offer NAMESPACE and POLICY among its values.
Exit 0: all good; 1: the panels, variables or alerts whose query errs or returns nothing, one a
line; 2: bad usage or an input that cannot be read. Python 3 and PyYAML only.
"""

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import yaml


def monitors(path):
    with open(path, encoding="utf-8") as f:
        found = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "ServiceMonitor"]
    if not found:
        raise ValueError(f"{path}: no ServiceMonitor (render the chart with serviceMonitor.enabled=true)")
    return found


def selects(selector, labels):
    """Whether a ServiceMonitor's label selector selects an object with `labels`."""
    if any(labels.get(k) != str(v) for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], [str(v) for v in e.get("values", [])]
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": labels.get(key) not in values,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}.get(op)
        if ok is None:
            raise ValueError(f"matchExpressions operator {op!r}")
        if not ok:
            return False
    return True


def job_name(monitor, i):
    return f"serviceMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/{i}"


def config(path, targets_file, interval):
    """One scrape job per ServiceMonitor endpoint, its targets from TARGETS_FILE (`targets`)."""
    jobs = []
    for m in monitors(path):
        for i, ep in enumerate(m["spec"]["endpoints"]):
            jobs.append({
                "job_name": job_name(m, i),
                "honor_labels": bool(ep.get("honorLabels", False)),
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "metrics_path": ep.get("path", "/metrics"),
                "scheme": ep.get("scheme", "http"),
                "file_sd_configs": [{"files": [targets_file], "refresh_interval": interval}],
                # The targets file holds every job's targets: each job keeps its own.
                "relabel_configs": [{"source_labels": ["__job"], "regex": re.escape(job_name(m, i)),
                                     "action": "keep"}],
            })
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": jobs}


def kubectl_json(kubectl, namespace, kind):
    out = subprocess.run([kubectl, "-n", namespace, "get", kind, "-o", "json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["items"]


def targets(path, kubectl):
    """What Prometheus Operator's endpoints discovery finds for each ServiceMonitor endpoint:
    the ready addresses of the Endpoints of each Service its selector selects in its
    namespaces, at the port of the endpoint's name; labelled as the operator labels them
    (namespace, service, pod, endpoint, job = the Service's name)."""
    groups = []
    for m in monitors(path):
        spec = m["spec"]
        names = spec.get("namespaceSelector", {}).get("matchNames") or [m["metadata"]["namespace"]]
        for ns in names:
            endpoints = {e["metadata"]["name"]: e for e in kubectl_json(kubectl, ns, "endpoints")}
            for svc in kubectl_json(kubectl, ns, "services"):
                if not selects(spec.get("selector", {}), svc["metadata"].get("labels", {})):
                    continue
                for i, ep in enumerate(spec["endpoints"]):
                    for subset in endpoints.get(svc["metadata"]["name"], {}).get("subsets", []):
                        for port in subset.get("ports", []):
                            if port.get("name") != ep["port"]:
                                continue
                            for addr in subset.get("addresses", []):
                                labels = {"__job": job_name(m, i), "namespace": ns,
                                          "service": svc["metadata"]["name"], "endpoint": ep["port"],
                                          "job": svc["metadata"]["name"]}
                                ref = addr.get("targetRef", {})
                                if ref.get("kind") == "Pod":
                                    labels["pod"] = ref["name"]
                                groups.append({"targets": [f"{addr['ip']}:{port['port']}"], "labels": labels})
    return groups


def alert_block(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Alert examples\n(?:.*\n)*?```yaml\n((?:.*\n)*?)```", text, re.M)
    if not m:
        raise ValueError(f"{path}: no ```yaml block under `## Alert examples`")
    return m.group(1)


def operands(expr):
    """The operands of `expr`'s top-level comparisons and set operators (`and`, `or`,
    `unless`), number literals left out; the whole expression when it has none."""
    parts, depth, quote, start, i = [], 0, None, 0, 0
    ops = re.compile(r"\s*(==|!=|>=|<=|>|<|\band\b|\bor\b|\bunless\b)\s*(?:bool\b)?")
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            m = ops.match(expr, i)
            if m and m.group(1) and (m.start(1) == i or expr[i].isspace()):
                parts.append(expr[start:i])
                start = i = m.end()
                continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip() and not re.fullmatch(r"-?[\d.]+", p.strip())]


def query(url, q):
    """(series, error)."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': q})}", timeout=30) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        try:
            body = json.load(e)
        except ValueError:
            return [], f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return [], str(e)
    if body.get("status") != "success":
        return [], body.get("error", "no status")
    return body["data"]["result"], None


def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def queries(url, dashboard_path, observability_path, window, namespace, policy):
    with open(dashboard_path, encoding="utf-8") as f:
        dashboard = json.load(f)

    def substitute(q):
        for name, value in (("namespace", namespace), ("policy", policy)):
            q = q.replace(f"${{{name}}}", value).replace(f"${name}", value)
        return re.sub(r"\$\{?__(rate_interval|interval|range)\}?", window, q)

    problems, lines = [], []
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
        if not m:
            problems.append(f"variable {v['name']}: `{q}` is not label_values(selector, label)")
            continue
        series, err = query(url, substitute(m.group(1)))
        values = sorted({s["metric"].get(m.group(2), "") for s in series} - {""})
        want = {"namespace": namespace, "policy": policy}.get(v["name"])
        if err or not values or (want and want not in values):
            problems.append(f"variable {v['name']}: `{q}` offers {values or 'nothing'}"
                            f"{' (' + err + ')' if err else ''}{f', not {want}' if want else ''}")
        lines.append(f"variable {v['name']}: {values}")
    for p in panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            q = substitute(t["expr"])
            series, err = query(url, q)
            what = f"panel {p.get('title')!r} ({t.get('refId', '?')})"
            if err or not series:
                problems.append(f"{what}: `{q}` {'fails: ' + err if err else 'returns no series'}")
            lines.append(f"{what}: {len(series)} series")
    for group in yaml.safe_load(alert_block(observability_path))["groups"]:
        for rule in group["rules"]:
            what = f"alert {rule.get('alert') or rule.get('record')}"
            whole, err = query(url, rule["expr"])
            if err:
                problems.append(f"{what}: `{rule['expr']}` fails: {err}")
                continue
            counts = []
            for operand in operands(rule["expr"]):
                series, err = query(url, operand)
                if err or not series:
                    problems.append(f"{what}: its operand `{operand}` {'fails: ' + err if err else 'returns no series'}")
                counts.append(len(series))
            lines.append(f"{what}: operands {counts} series, firing now: {len(whole)} series")
    return lines, problems


def main(argv):
    try:
        if argv[1:2] == ["config"] and len(argv) == 5:
            print(json.dumps(config(argv[2], argv[3], argv[4]), indent=1))
            return 0
        if argv[1:2] == ["targets"] and len(argv) == 4:
            groups = targets(argv[2], os.environ.get("KUBECTL", "kubectl"))
            # Replaced whole: Prometheus never reads a half-written file. The temporary name is
            # this process's own: prometheus.sh's discovery loop and a check may resolve at once.
            tmp = f"{argv[3]}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(groups, f, indent=1)
            os.replace(tmp, argv[3])
            print(" ".join(f"{g['labels'].get('pod', g['labels']['service'])}={g['targets'][0]}" for g in groups))
            return 0
        if argv[1:2] == ["rules"] and len(argv) == 3:
            sys.stdout.write(alert_block(argv[2]))
            return 0
        if argv[1:2] == ["queries"] and len(argv) == 8:
            lines, problems = queries(*argv[2:8])
            for line in lines:
                print(f"  {line}")
            for p in problems:
                print(f"prometheus.py: {p}", file=sys.stderr)
            return 1 if problems else 0
    except (OSError, ValueError, KeyError, yaml.YAMLError, subprocess.CalledProcessError) as e:
        print(f"prometheus.py: {e}", file=sys.stderr)
        return 2
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
