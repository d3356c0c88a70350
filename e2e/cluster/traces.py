#!/usr/bin/env python3
"""What a real OpenTelemetry Collector received from the installed product (issue 33 item 1).

The collector's file exporter writes OTLP JSON, one export request a line (e2e/cluster/otelcol.sh).
  traces.py joined FILE ATTEMPTS_JSON   each attempt ([{uid, namespace, name}]) has one trace
        holding the operator's runner.create, broker.exchange and the JIT mint's github.request
        and the agent's launch with its steps, each span with the attributes
        docs/observability.md names, parented as it says; prints each trace as a tree
  traces.py any FILE                   at least one launch joined to its operator spans
  traces.py scan FILE SECRETS_FILE     no secret (one a line; a JIT also as a slice) and nothing
        shaped like a GitHub token, a JWT or a private key in any span, attribute or resource
Exit 1 with the reason on stderr when a check fails (the caller retries while spans arrive).
"""

import json
import re
import sys

OPERATOR = "runner-manager-operator"
AGENT = "runner-manager-node-agent"
# The agent's steps under its launch (docs/observability.md's table).
STEPS = ["admit", "materialize", "prepare", "register", "spawn", "journal_started"]  # and "placeholder" when placeholders are on
RESUMED_STEPS = ["register", "spawn", "journal_started"]


def value(v):
    for k in ("stringValue", "intValue", "boolValue", "doubleValue"):
        if k in v:
            return str(v[k]).lower() if k == "boolValue" else str(v[k])
    return json.dumps(v)


def attrs(lst):
    return {a["key"]: value(a.get("value", {})) for a in lst or []}


def load(path):
    spans = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                res = attrs(rs.get("resource", {}).get("attributes"))
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        spans.append({
                            "trace": s["traceId"], "id": s["spanId"],
                            "parent": s.get("parentSpanId", ""), "name": s["name"],
                            "service": res.get("service.name", "?"),
                            "attrs": attrs(s.get("attributes")),
                        })
    return spans


def need(span, want):
    """The attributes a span must carry: {name: value, or None for present with any value}."""
    for k, v in want.items():
        got = span["attrs"].get(k)
        if got is None or (v is not None and got != v):
            raise Check(f"{span['service']} span {span['name']} ({span['id']}): attribute {k} is "
                        f"{got!r}, want {v if v is not None else 'present'}; it has {sorted(span['attrs'])}")


class Check(Exception):
    pass


def tree(trace_spans):
    by_parent = {}
    for s in trace_spans:
        by_parent.setdefault(s["parent"], []).append(s)
    ids = {s["id"] for s in trace_spans}
    roots = [s for s in trace_spans if s["parent"] not in ids]
    lines = []

    def walk(s, depth):
        extra = ""
        if s["name"] == "github.request":
            extra = f"  {s['attrs'].get('http.request.method', '')} {s['attrs'].get('http.route', '')} {s['attrs'].get('http.response.status_code', '')}"
        lines.append(f"  {s['service']:<26} {'  ' * depth}{s['name']:<{28 - 2 * depth}} (span {s['id']}, parent {s['parent'] or '-'}){extra}")
        for c in by_parent.get(s["id"], []):
            walk(c, depth + 1)

    for r in roots:
        walk(r, 0)
    return "\n".join(lines)


def joined(spans, attempt):
    """The attempt's launch trace: checks it and returns its spans."""
    uid, ns, name = attempt["uid"], attempt["namespace"], attempt["name"]
    launches = [s for s in spans if s["service"] == AGENT and s["name"] in ("launch", "launch.resume")
                and s["attrs"].get("attempt.uid") == uid]
    if not launches:
        raise Check(f"attempt {ns}/{name} ({uid}): no agent launch span with its attempt.uid yet")
    # The launch that started the runner (`journal_started` under it). An agent restarted at
    # `Prepared` resumes it (`launch.resume`: the JIT request and the start); the steps before
    # are under the first agent's `launch`.
    started = [l for l in launches
               if any(s["name"] == "journal_started" and s["parent"] == l["id"] for s in spans)]
    launch = (started or launches)[0]
    need(launch, {"attempt.uid": uid, "attempt.namespace": ns, "attempt.name": name, "node": None})
    trace = [s for s in spans if s["trace"] == launch["trace"]]
    by_id = {s["id"]: s for s in trace}
    create = by_id.get(launch["parent"])
    if create is None or create["service"] != OPERATOR or create["name"] != "runner.create":
        raise Check(f"attempt {ns}/{name}: the agent's launch (trace {launch['trace']}) has parent "
                    f"{launch['parent'] or '-'}, not the operator's runner.create in the same trace: the trace is not joined")
    need(create, {"attempt.namespace": ns, "attempt.name": name, "node": launch["attrs"]["node"]})
    exchanges = [s for s in trace if s["service"] == OPERATOR and s["name"] == "broker.exchange"
                 and s["attrs"].get("attempt.uid") == uid]
    if not exchanges:
        raise Check(f"attempt {ns}/{name}: no broker.exchange with its attempt.uid in trace {launch['trace']}")
    # The exchange that issued the JIT. A request its agent abandoned (the agent restarted while
    # it was in flight) ends with no outcome, and the resumed launch asks again.
    issued = [s for s in exchanges if s["attrs"].get("outcome") == "issued"]
    ex = (issued or exchanges)[0]
    need(ex, {"attempt.namespace": ns, "attempt.name": name, "outcome": "issued"})
    if ex["parent"] != create["id"]:
        raise Check(f"attempt {ns}/{name}: broker.exchange's parent is {ex['parent']}, not runner.create {create['id']}")
    mints = [s for s in trace if s["name"] == "github.request" and s["parent"] == ex["id"]
             and s["attrs"].get("http.route", "").endswith("/actions/runners/generate-jitconfig")]
    if not mints:
        raise Check(f"attempt {ns}/{name}: no github.request for the JIT mint under broker.exchange")
    # The mint that answered 201 (a retried mint first meets the registration a lost one left:
    # 409, deleted, minted again).
    minted = [m for m in mints if m["attrs"].get("http.response.status_code") == "201"]
    need((minted or mints)[0], {"http.request.method": "POST", "github.endpoint": "generate_jitconfig",
                    "http.response.status_code": "201", "github.ratelimit.remaining": None})
    for s in trace:
        if s["name"] == "github.request" and re.search(r"[?]|//|acme|[0-9]{3,}", s["attrs"].get("http.route", "")):
            raise Check(f"github.request {s['id']}: http.route {s['attrs']['http.route']!r} is not a template")
    # A resumed launch holds the steps from the JIT request on; the rest are under the first.
    steps = STEPS if launch["name"] == "launch" else RESUMED_STEPS
    for step in steps:
        if not any(s["name"] == step and s["service"] == AGENT and s["parent"] == launch["id"] for s in trace):
            raise Check(f"attempt {ns}/{name}: no agent span {step} under its {launch['name']} {launch['id']}")
    return trace


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    try:
        if cmd == "joined" and len(argv) == 4:
            spans = load(argv[2])
            with open(argv[3]) as f:
                attempts = json.load(f)
            if not attempts:
                raise Check("no attempt to look for")
            for a in attempts:
                trace = joined(spans, a)
                ops = sum(1 for s in trace if s["service"] == OPERATOR)
                ags = sum(1 for s in trace if s["service"] == AGENT)
                print(f"attempt {a['namespace']}/{a['name']}: trace {trace[0]['trace']}, "
                      f"{ops} operator span(s) and {ags} agent span(s):")
                print(tree(trace))
        elif cmd == "any" and len(argv) == 3:
            spans = load(argv[2])
            found = []
            for s in spans:
                if s["service"] == AGENT and s["name"] in ("launch", "launch.resume"):
                    a = {"uid": s["attrs"].get("attempt.uid"), "namespace": s["attrs"].get("attempt.namespace"),
                         "name": s["attrs"].get("attempt.name")}
                    try:
                        joined(spans, a)
                        if f"{a['namespace']}/{a['name']}" not in found:
                            found.append(f"{a['namespace']}/{a['name']}")
                    except Check:
                        pass
            if not found:
                raise Check(f"no launch joined to its operator spans among {len(spans)} span(s)")
            print(f"{len(found)} launch(es) joined to their operator spans: {' '.join(found)}")
        elif cmd == "scan" and len(argv) == 4:
            with open(argv[2]) as f:
                text = f.read()
            spans = load(argv[2])
            with open(argv[3]) as f:
                secrets = [l.strip() for l in f if len(l.strip()) >= 16]
            needles = []
            for sec in secrets:
                needles.append(sec)
                # A JIT (long base64) cut by a length limit: a slice past the prefix all JITs share.
                if len(sec) > 80:
                    needles.append(sec[40:72])
            def hits(t):
                return [n[:12] + "…" for n in needles if n in t]
            # The scan finds what it looks for: a secret planted in a copy of the text is found.
            if secrets and not hits(text + "|" + needles[-1] + "|"):
                raise Check("the scan did not find a secret planted in the text")
            found = hits(text)
            if found:
                raise Check(f"{len(found)} secret value(s) in the exported spans (starting {', '.join(found)})")
            shapes = {
                "a GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{20,}",
                "a JWT": r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.",
                "a private key": r"PRIVATE KEY",
                "a Bearer credential": r"(?i)\b(bearer|token) [A-Za-z0-9_.-]{20,}",
            }
            for what, rx in shapes.items():
                m = re.search(rx, text)
                if m:
                    raise Check(f"something shaped like {what} in the exported spans: {m.group(0)[:16]}…")
            nattrs = sum(len(s["attrs"]) for s in spans)
            print(f"{len(spans)} span(s), {nattrs} attribute(s): none holds any of {len(secrets)} secret value(s) "
                  f"(JITs, webhook secret, App key, runner.env) or anything shaped like a token, JWT or key")
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Check as e:
        print(f"traces.py {cmd}: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as e:
        print(f"traces.py {cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
