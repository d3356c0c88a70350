#!/usr/bin/env python3
"""docs-check: what README.md and docs/*.md name must exist in the code.

Usage: e2e/docs-check.py [--root DIR] [BINARY ...]
  BINARY: built runner-manager-operator / runner-manager-node-agent (any path; told apart by
  their file names). `make test` passes target/debug/<bin> after its build stage. Without them
  the flags are read from the clap definitions in operator/src/cli.rs and node-agent/src/cli.rs.
Exit 0: nothing found; 1: problems (each printed as `file:line: what: why; fix: how`); 2: the
check itself could not run (a binary that does not answer --help, a file it needs is missing).
Python 3 standard library only; it reads text and runs each binary's --help once (well under
5 s).

What is checked, and where (the matching rules; nothing outside them is looked at):

1. Command-line flags of our binaries (`--name`). The real flags: `--help` of the operator and
   the node agent; for the entry helper (`runner-manager-runner-entry`, which has no --help) the
   `"--name"` string literals of node-agent/src/entry.rs and node-agent/src/providers/sandbox.rs
   (its probe mode). A flag is checked only
   a. in a code span or a fenced-code line whose command (first word after `VAR=value`
      assignments, `sudo`, `env`; a path counts by its file name) is one of our three binaries:
      every `--name` on it, against that binary's flags; or
   b. in a code span that begins with a flag (`--node-lost-grace`, `--apply-crds=false`,
      `--package-max-*`, `--only burst --runs 5`): a flag named on its own, as the docs name
      ours. Every `--name` in it is checked against the union of our binaries' flags, except the
      flags of other tools that the docs name this way, listed in FOREIGN_FLAGS below with their
      tool. `*` in a flag is a wildcard. A new bare flag of another tool: add it to
      FOREIGN_FLAGS, or write the tool's command in the same code span (`helm ... --set x`).
   Not checked: flags in plain text, and code spans or code lines of any other command
   (kubectl, helm, cargo, make, systemd-run, scripts, ...).
2. ScalePolicy / RunnerAttempt field paths, against crds/generated/*.yaml:
   a. a code span that is a path starting `spec.` or `status.` (optionally followed by `: value`
      or `=value`; `[]`, `[*]`, `[N]` step into a list, `<key>` stands for any key). It is taken
      for ours when its first field after spec/status exists in either kind (so a Pod's
      `status.podIP` or a Node's `status.allocatable` is not ours and is skipped), and must then
      resolve in ScalePolicy or RunnerAttempt;
   b. a code span that is a path relative to a ScalePolicy's spec starting with one of
      RELATIVE_ROOTS (`execution.image`, `workspace.mode: Persistent`); other relative dotted
      names (`runner.env` is a ConfigMap key, `runner.create` a span name, `github.endpoint` a
      log field) are not field paths and are not checked;
   c. a fenced ```yaml block holding a document with `kind: ScalePolicy` or `kind:
      RunnerAttempt` (apiVersion runner-manager.dev/...): every key under `spec` and `status`
      must be in the schema, and a value of a field with an enum must be one of it.
3. Metric names `runner_manager_...` anywhere (prose, code spans, code blocks): the names the
   code registers are `Registry::with_prefix("P")` + `_` + each name given to `register(...)` or
   to the telemetry crate's `registered(&mut registry, "name", ..)`
   (or listed as `("name", "help")` pairs or `name: "…", help:` table rows) in the same source file; a doc name matches with or
   without the exposition suffixes _total, _info, _bucket, _sum, _count, _created. A name ending
   in `*` matches any registered name it prefixes. Crate paths and log targets
   (`runner_manager_crds::...`, `runner_manager_node_agent=debug`) are not metric names.
4. Closed vocabularies, read from the source text: policy and attempt condition types and
   reasons (crds/src/policy.rs, crds/src/attempt.rs), outcome kinds and reasons
   (core/src/outcome.rs), Event reasons (operator/src/controller/applying/events.rs `Reason`,
   node-agent/src/agent/reporting/labels.rs `EventReason`). A backticked word is checked
   a. as `Kind(Reason)` (`Failed(JitExpired)`): the kind's reasons;
   b. as `Type=True|False|Unknown` or `Type/Reason` where Type is a condition type: the type,
      and the reason among that kind's condition reasons;
   c. when the text right before it ends with `Event`/`event`/`Events` (+ optional `Normal`/
      `Warning`) or right after it starts with ` Event`, ` event`, ` Warning event`, ...: an
      Event reason;
   d. when the text right before it ends with `reason` / `reason:` / `reasons`: a condition,
      outcome or Event reason (or one of the other closed reason lists in REASON_ENUMS);
   e. when the text right before it ends with `condition` or right after it starts with
      ` condition`: a condition type;
   f. in a table with a column headed `reason`: each backticked word of that column is an
      Event reason when the table has a `source`/`from` column, else a reason of the condition
      named in the row's `condition` column; a column headed `kind (reason)` holds outcome
      kinds.
   Only CamelCase words are taken (`Ready`, `TargetClaimedElsewhere`): labels such as
   `scale_up` are metric label values, not reasons.
5. Repository paths: a code span (or a line of a ```sh block) naming a path whose first segment
   is a top-level entry of the repository (`operator/src/cli.rs`, `Makefile`); in a command
   (`e2e/run-tests.sh --node-only`, `kubectl apply -f deploy/samples/x.yaml`) its first word
   and the arguments that look like files (an extension, or a trailing `/`): `kubectl logs
   deploy/runner-manager-operator` names an object, not a path. And every markdown link target
   that is not a URL (relative to the doc). `::item`, `#anchor` and `:line` suffixes are
   dropped, `{a,b}` is expanded, `<placeholder>`, `*` and `…` match anything, a Rust module
   `dir/name` may be `dir/name.rs`; it must exist, and a link's `#anchor` must be a heading of
   the page it links (GitHub's slugs). `target/` (build output) and absolute paths are not
   repository paths.
6. `make <target>` in code spans and code lines: the Makefile has the target.
7. README.md: under README_MAX_BYTES; it is checked by 1-6 like the docs (its `make` targets
   and every path it names exist).
8. README.md's figures against docs/benchmarks.md's latest figures: every number (or range
   `a–b`, `a and b`, `a / b`) in the README's prose followed by a unit of FIGURE_UNITS (`ms`,
   `s`, `min`, `MiB`, `GiB`, `MB`, `%`, `writes`) must be, at the README's precision and in its
   unit, one of the figures with a unit in the section of docs/benchmarks.md whose heading
   begins `## Latest figures` (numbers listed before a unit, `4.4 / 4.6 / 4.9 s`, each count).
   A README figure the section does not hold is stale or unmeasured: measure it and put it in
   that section, or drop it from the README. `--self-test` runs this rule on samples.

False positives are kept at zero by the rules above, not by exceptions per doc: a new kind of
mention that trips a rule is either a real error or a new rule here, said in this header.
"""

import difflib
import glob
import os
import re
import subprocess
import sys

README_MAX_BYTES = 6000

OUR_BINARIES = ("runner-manager-operator", "runner-manager-node-agent", "runner-manager-runner-entry")

# Flags of other tools that the docs name on their own (rule 1b), with the tool.
FOREIGN_FLAGS = {
    "--force-conflicts": "helm install/upgrade",
    "--set": "helm",
    "--bench": "cargo bench",
    "--quick": "the benches (criterion's quick mode)",
    "--only": "the e2e benches",
    "--runs": "the e2e benches",
    "--collect": "systemd-run",
    "--property": "systemd-run",
    "--setenv": "systemd-run",
    "--cluster-cidr": "kube-controller-manager",
    "--service-cluster-ip-range": "kube-apiserver",
    "--jit-config-file": "the Actions runner's Runner.Listener",
}

# Rule 2b: relative field paths taken for a ScalePolicy's spec.
RELATIVE_ROOTS = ("execution", "workspace", "scaling", "timeouts")

# Rule 4d: closed lists a "reason `X`" may name besides conditions, outcomes and Events.
REASON_ENUMS = (
    ("core/src/recovery.rs", "TerminationReason"),
    ("core/src/lease.rs", "RecoveryBlocked"),
    ("core/src/lease.rs", "NativeRefusal"),
)

# Rule 8: units of a figure, with their dimension and factor to it.
FIGURE_UNITS = {"ms": ("s", 0.001), "s": ("s", 1.0), "min": ("s", 60.0), "MiB": ("MiB", 1.0),
                "GiB": ("MiB", 1024.0), "MB": ("MB", 1.0), "%": ("%", 1.0), "writes": ("writes", 1.0)}
FIGURE_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
FIGURE_SEP = r"\s*(?:–|-|/|and|to|or)\s*"
FIGURE = re.compile(rf"(?<![\w.,/-])((?:(?:{FIGURE_NUM}){FIGURE_SEP})*(?:{FIGURE_NUM}))\s*"
                    rf"(ms|s|min|MiB|GiB|MB|%|(?:API )?writes)(?![\w])")
LATEST_FIGURES = "## Latest figures"

CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*$")


class Problem(Exception):
    pass


def figures(text):
    """(number as written, decimals, value in its dimension's base unit, dimension, unit) of each
    figure in `text` (rule 8)."""
    out = []
    for m in FIGURE.finditer(text):
        unit = m.group(2).replace("API ", "")
        dim, factor = FIGURE_UNITS[unit]
        for num in re.findall(FIGURE_NUM, m.group(1)):
            plain = num.replace(",", "")
            decimals = len(plain.split(".")[1]) if "." in plain else 0
            out.append((num, decimals, float(plain) * factor, dim, unit))
    return out


def stale_figures(readme_prose, latest_section):
    """The README's figures (rule 8) that the latest benchmarks section does not hold."""
    have = figures(latest_section)
    stale = []
    for num, decimals, value, dim, unit in figures(readme_prose):
        factor = FIGURE_UNITS[unit][1]
        if not any(d == dim and round(v / factor, decimals) == round(value / factor, decimals)
                   for _, _, v, d, _ in have):
            stale.append(f"{num} {unit}")
    return stale


def self_test():
    """Rule 8 on samples: what must match matches, and a changed figure does not."""
    latest = ("| burst | **4.4 / 4.6 / 4.9 s** |\n| warm | **p50 119 ms** |\n"
              "| cold | **2,341 ms** |\n| writes | **mean 9.0–9.2 writes** |\nload: 5.0–13.3 s")
    ok = "burst 4.4–4.9 s, p50 0.12 s, cold 2.3 s, 9.0–9.2 API writes, under load 13 s"
    assert stale_figures(ok, latest) == [], stale_figures(ok, latest)
    for bad, want in (("burst 4.4–5.9 s", ["5.9 s"]), ("p50 0.13 s", ["0.13 s"]),
                      ("cold 2,300 ms", ["2,300 ms"]), ("9.0–9.3 API writes", ["9.3 writes"]),
                      ("takes 3–7 s", ["3 s", "7 s"])):
        assert stale_figures(bad, latest) == want, (bad, stale_figures(bad, latest))
    # Not figures: versions, counts, a 2-core machine, a path.
    assert figures("Kubernetes 1.37.2, 1,000 policies, 2-core, v1.20 to 1.37, e2e/s") == []
    print("docs-check: self-test passed")


# ---------------------------------------------------------------------------------------------
# A small YAML reader: block mappings and sequences, plain/quoted/multi-line scalars, block
# scalars, flow collections. Enough for the generated CRDs and the docs' examples.


class KMap(dict):
    """A mapping that remembers the line of each key."""

    def __init__(self):
        super().__init__()
        self.lines = {}


def _strip_comment(s):
    out, q = [], None
    for i, c in enumerate(s):
        if q:
            if c == q:
                q = None
        elif c in "'\"" and (i == 0 or s[i - 1] in " \t:[{,-"):
            q = c
        elif c == "#" and (i == 0 or s[i - 1] in " \t"):
            break
        out.append(c)
    return "".join(out).rstrip()


def _scalar(s):
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1].replace("''", "'") if s[0] == "'" else s[1:-1]
    return s


def _flow(s, i=0):
    """Parse a flow collection or scalar at s[i:]; returns (value, next index)."""
    while i < len(s) and s[i] in " \t":
        i += 1
    if i < len(s) and s[i] in "{[":
        close = "}" if s[i] == "{" else "]"
        node = KMap() if close == "}" else []
        i += 1
        while True:
            while i < len(s) and s[i] in " \t,":
                i += 1
            if i >= len(s):
                raise ValueError("unclosed flow collection")
            if s[i] == close:
                return node, i + 1
            if close == "}":
                m = re.compile(r"\s*(\"[^\"]*\"|'[^']*'|[^:,{}\[\]]+?)\s*:(?=\s|[{\[])").match(s, i)
                if not m:
                    raise ValueError("flow mapping key expected at: " + s[i:])
                key = _scalar(m.group(1))
                value, i = _flow(s, m.end())
                node[key] = value
            else:
                value, i = _flow(s, i)
                node.append(value)
    j = i
    if j < len(s) and s[j] in "'\"":
        k = s.index(s[j], j + 1)
        return _scalar(s[j:k + 1]), k + 1
    while j < len(s) and s[j] not in ",}]":
        j += 1
    return _scalar(s[i:j]), j


def _split_key(content):
    q = None
    for i, c in enumerate(content):
        if q:
            if c == q:
                q = None
        elif c in "'\"" and i == 0:
            q = c
        elif c == ":" and (i + 1 == len(content) or content[i + 1] in " \t"):
            return _scalar(content[:i]), content[i + 1:].strip()
    return None, None


def yaml_load(text, first_line=1):
    """Parse one YAML document; returns the root node."""
    lines = []
    for n, raw in enumerate(text.split("\n")):
        if not raw.strip() or raw.lstrip().startswith("#"):
            lines.append(None)
            continue
        lines.append([len(raw) - len(raw.lstrip(" ")), raw.strip(), n + first_line, raw])
    lines = [l for l in lines if l is not None]

    def more(i, indent):
        """The raw text of the lines after i indented deeper than indent; and the next i."""
        parts = []
        while i < len(lines) and lines[i][0] > indent:
            parts.append(lines[i][1])
            i += 1
        return parts, i

    def value_of(rest, i, indent):
        if rest in ("|", ">", "|-", ">-", "|+", ">+"):
            parts, i = more(i, indent)
            return "\n".join(parts), i
        rest = _strip_comment(rest)
        parts, i = more(i, indent)
        if rest.startswith(("{", "[")):
            return _flow(" ".join([rest] + [_strip_comment(p) for p in parts]))[0], i
        return _scalar(" ".join([rest] + parts)), i

    def block(i, indent):
        if lines[i][1].startswith("- ") or lines[i][1] == "-":
            seq = []
            while i < len(lines) and lines[i][0] == indent and (lines[i][1].startswith("- ") or lines[i][1] == "-"):
                rest = lines[i][1][2:].strip() if lines[i][1] != "-" else ""
                if not rest:
                    if i + 1 < len(lines) and lines[i + 1][0] > indent:
                        node, i = block(i + 1, lines[i + 1][0])
                    else:
                        node, i = None, i + 1
                elif _split_key(_strip_comment(rest))[0] is not None and not rest.startswith(("{", "[", "'", '"')):
                    # `- key: value`: a mapping whose keys sit two columns in.
                    lines[i] = [indent + 2, rest, lines[i][2], lines[i][3]]
                    node, i = block(i, indent + 2)
                else:
                    node, i = value_of(rest, i + 1, indent)
                seq.append(node)
            return seq, i
        node = KMap()
        while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("- "):
            content = _strip_comment(lines[i][1]) if not lines[i][1].startswith(("'", '"')) else lines[i][1]
            key, rest = _split_key(content)
            if key is None:
                raise ValueError(f"line {lines[i][2]}: a mapping key expected: {lines[i][1]}")
            node.lines[key] = lines[i][2]
            if rest == "":
                if i + 1 < len(lines) and lines[i + 1][0] > indent:
                    node[key], i = block(i + 1, lines[i + 1][0])
                elif i + 1 < len(lines) and lines[i + 1][0] == indent and lines[i + 1][1].startswith("- "):
                    node[key], i = block(i + 1, indent)
                else:
                    node[key], i = None, i + 1
            else:
                node[key], i = value_of(rest, i + 1, indent)
        return node, i

    if not lines:
        return None
    node, i = block(0, lines[0][0])
    if i != len(lines):
        raise ValueError(f"line {lines[i][2]}: unexpected indentation")
    return node


# ---------------------------------------------------------------------------------------------
# What the code says.


def read(root, rel):
    path = os.path.join(root, rel)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise Problem(f"cannot read {rel}: {e}") from e


def enum_variants(root, rel, name):
    text = read(root, rel)
    m = re.search(r"pub enum " + name + r"\s*\{", text)
    if not m:
        raise Problem(f"{rel}: enum {name} not found")
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    body = re.sub(r"//[^\n]*", "", text[m.end():i - 1])
    body = re.sub(r"#\[[^\]]*\]", "", body)
    return [v for v in re.findall(r"(?m)^\s*([A-Z][A-Za-z0-9]*)\s*(?:\(|,|\{|$)", body)]


class Vocab:
    def __init__(self, root):
        v = lambda rel, name: set(enum_variants(root, rel, name))
        self.policy_types = v("crds/src/policy.rs", "PolicyConditionType")
        self.policy_reasons = v("crds/src/policy.rs", "PolicyReason")
        self.attempt_types = v("crds/src/attempt.rs", "AttemptConditionType")
        self.attempt_reasons = v("crds/src/attempt.rs", "AttemptReason")
        self.outcome_kinds = v("core/src/outcome.rs", "OutcomeKind")
        self.kind_reasons = {
            "Failed": v("core/src/outcome.rs", "FailureReason"),
            "Orphaned": v("core/src/outcome.rs", "OrphanReason"),
            "Rejected": v("core/src/outcome.rs", "RejectReason"),
        }
        self.events = v("operator/src/controller/applying/events.rs", "Reason") | v(
            "node-agent/src/agent/reporting/labels.rs", "EventReason")
        self.condition_types = self.policy_types | self.attempt_types
        self.other_reasons = set()
        for rel, name in REASON_ENUMS:
            self.other_reasons |= v(rel, name)
        self.reasons = (self.policy_reasons | self.attempt_reasons | set().union(*self.kind_reasons.values())
                        | self.events | self.other_reasons)

    def reasons_of_type(self, t):
        return self.policy_reasons if t in self.policy_types else self.attempt_reasons


def metric_names(root):
    names = set()
    # Families the telemetry crate registers on a binary's registry (spans::register): named
    # under each prefix whose file calls it.
    with open(os.path.join(root, "telemetry/src/spans.rs"), encoding="utf-8") as f:
        shared = re.findall(r'\.register\(\s*"([a-z][a-z0-9_]*)"', f.read())
    for d in ("operator/src", "node-agent/src", "telemetry/src"):
        for path in glob.glob(os.path.join(root, d, "**", "*.rs"), recursive=True):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            prefixes = re.findall(r'Registry::with_prefix\(\s*"([a-z0-9_]+)"', text)
            if not prefixes:
                continue
            found = re.findall(r'\.register(?:_with_unit)?\(\s*"([a-z][a-z0-9_]*)"', text)
            # `telemetry::registry::registered(_as)(&mut registry, "name", "help", ..)`.
            found += re.findall(r'\bregistered(?:_as)?\(\s*&mut \w+,\s*"([a-z][a-z0-9_]*)"', text)
            found += re.findall(r'\(\s*"([a-z][a-z0-9_]*)",\s*"', text)
            # A table of families (`metrics::POLICY_GAUGES`): rows `name: "…", help: "…"`.
            found += re.findall(r'\bname:\s*"([a-z][a-z0-9_]*)",\s*help:', text)
            if "spans::register(" in text:
                found += shared
            for p in prefixes:
                names |= {p + "_" + n for n in found}
    if not names:
        raise Problem("no metric registrations found under operator/src, node-agent/src")
    return names


def crate_names(root):
    names = set()
    for path in glob.glob(os.path.join(root, "*", "Cargo.toml")):
        with open(path, encoding="utf-8") as f:
            m = re.search(r'(?m)^name\s*=\s*"([^"]+)"', f.read())
        if m:
            names.add(m.group(1).replace("-", "_"))
    return names


def flags_from_help(binary):
    try:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=20)
    except OSError as e:
        raise Problem(f"{binary}: {e}") from e
    if out.returncode != 0:
        raise Problem(f"{binary} --help exited {out.returncode}: {out.stderr.strip()[:300]}")
    # Only the option lines (`  -h, --help`, `      --name <NAME>`): a description may name
    # another tool's flag (`the kube-controller-manager's --cluster-cidr`).
    flags = set(re.findall(r"(?m)^\s+(?:-\w, )?--([a-z][a-z0-9-]*)", out.stdout))
    if not flags:
        raise Problem(f"{binary} --help lists no flags")
    return flags


def flags_from_clap(root, rel):
    text = read(root, rel)
    flags = {"help", "version"}
    for m in re.finditer(r"#\[arg\(([^\]]*?)\)\]\s*(?:///[^\n]*\n\s*|#\[[^\n]*\n\s*)*pub ([a-z_0-9]+)\s*:", text, re.S):
        attrs, field = m.group(1), m.group(2)
        if not re.search(r"\blong\b", attrs):
            continue
        explicit = re.search(r'\blong\s*=\s*"([^"]+)"', attrs)
        flags.add(explicit.group(1) if explicit else field.replace("_", "-"))
    return flags


def entry_flags(root):
    flags = set()
    for rel in ("node-agent/src/entry.rs", "node-agent/src/providers/sandbox.rs"):
        flags |= set(re.findall(r'"--([a-z][a-z0-9-]*)"', read(root, rel)))
    return flags


def crd_schemas(root):
    out = {}
    for rel, kind in (("crds/generated/scalepolicies.yaml", "ScalePolicy"),
                      ("crds/generated/runnerattempts.yaml", "RunnerAttempt")):
        try:
            doc = yaml_load(read(root, rel))
            out[kind] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise Problem(f"{rel}: cannot read the schema ({e})") from e
    return out


# ---------------------------------------------------------------------------------------------
# Schema walking.


def _alternatives(node):
    alts = [node]
    for k in ("anyOf", "oneOf", "allOf"):
        if isinstance(node, dict) and isinstance(node.get(k), list):
            alts += [a for a in node[k] if isinstance(a, dict)]
    return alts


def child(node, seg):
    """The schema of field `seg` under node; True: anything goes below; None: no such field."""
    if node is True:
        return True
    for alt in _alternatives(node):
        if alt.get("x-kubernetes-preserve-unknown-fields") in (True, "true"):
            return True
        props = alt.get("properties")
        if isinstance(props, dict) and seg in props:
            return props[seg]
        if seg.startswith("<") and (props or alt.get("additionalProperties")):
            return True
        ap = alt.get("additionalProperties")
        if isinstance(ap, dict):
            return ap
        if ap in (True, "true"):
            return True
    return None


def items(node):
    if node is True:
        return True
    for alt in _alternatives(node):
        if isinstance(alt.get("items"), dict):
            return alt["items"]
    return None


def resolve(schema, segments):
    node = schema
    for seg in segments:
        if node is True:
            return True
        if seg == "[]":
            node = items(node)
        else:
            node = child(node, seg)
        if node is None:
            return None
    return node


def split_path(path):
    segs = []
    for part in path.split("."):
        m = re.match(r"^([^\[]*)((?:\[[^\]]*\])*)$", part)
        if not m:
            return None
        if m.group(1):
            segs.append(m.group(1))
        segs += ["[]"] * m.group(2).count("[")
    return segs


# ---------------------------------------------------------------------------------------------
# Markdown.


def fences(text):
    """(masked text with fenced blocks blanked, [(lang, first line number, [lines])])."""
    out, blocks, cur, fence = [], [], None, None
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", line)
        if cur is None and m:
            fence, cur = m.group(1), (m.group(2).lower(), n + 1, [])
            out.append("")
        elif cur is not None and line.strip().startswith(fence) and line.strip() == line.strip()[0] * len(line.strip()):
            blocks.append(cur)
            cur = None
            out.append("")
        elif cur is not None:
            cur[2].append(line)
            out.append("")
        else:
            out.append(line)
    if cur is not None:
        blocks.append(cur)
    return "\n".join(out), blocks


SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def spans(masked):
    """Each code span: (text, start offset, end offset)."""
    for m in SPAN.finditer(masked):
        if "\n\n" in m.group(2):
            continue
        yield m.group(2).replace("\n", " ").strip(), m.start(), m.end()


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def slug(heading):
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return set()
    masked, _ = fences(text)
    seen, out = {}, set()
    for h in re.findall(r"(?m)^#{1,6}\s+(.*?)\s*#*\s*$", masked):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


# ---------------------------------------------------------------------------------------------
# The checks.


class Checker:
    def __init__(self, root, binaries):
        self.root = root
        self.problems = []
        self.checked = {}
        self.vocab = Vocab(root)
        self.metrics = metric_names(root)
        self.crates = crate_names(root)
        self.schemas = crd_schemas(root)
        self.top = {e for e in os.listdir(root) if e not in (".git", "target")}
        makefile = read(root, "Makefile")
        self.make_targets = set(re.findall(r"(?m)^([A-Za-z0-9][A-Za-z0-9_.-]*)\s*:(?!=)", makefile))
        self.flags = {"runner-manager-runner-entry": entry_flags(root)}
        given = {os.path.basename(b): b for b in binaries}
        unknown = [b for b in given if b not in OUR_BINARIES[:2]]
        if unknown:
            raise Problem(f"not one of our binaries: {', '.join(unknown)} (expected {OUR_BINARIES[0]}, {OUR_BINARIES[1]})")
        self.flag_source = {OUR_BINARIES[2]: "string literals of node-agent/src/entry.rs and providers/sandbox.rs"}
        for name, cli in ((OUR_BINARIES[0], "operator/src/cli.rs"), (OUR_BINARIES[1], "node-agent/src/cli.rs")):
            if name in given:
                self.flags[name] = flags_from_help(given[name])
                self.flag_source[name] = f"{given[name]} --help"
            else:
                self.flags[name] = flags_from_clap(root, cli)
                self.flag_source[name] = f"{cli} (no binary given)"
        self.all_flags = set().union(*self.flags.values())

    def count(self, category):
        self.checked[category] = self.checked.get(category, 0) + 1

    def report(self, doc, line, what, why, fix):
        self.problems.append(f"{doc}:{line}: {what}: {why}; fix: {fix}")

    @staticmethod
    def near(word, choices):
        m = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
        return f" (closest: {m[0]})" if m else ""

    # 1. flags
    def flag_ok(self, flag, allowed):
        if "*" in flag:
            pat = re.compile("^" + re.escape(flag).replace(r"\*", ".*") + "$")
            return any(pat.match(f) for f in allowed)
        return flag in allowed

    def check_flags(self, doc, line, text, binary):
        allowed = self.flags[binary] if binary else self.all_flags
        for flag in re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*\*?)", text):
            if not binary and "--" + flag.rstrip("*") in FOREIGN_FLAGS:
                continue
            self.count("flags")
            if not self.flag_ok(flag, allowed):
                owner = binary or "runner-manager-operator / -node-agent / -runner-entry"
                src = self.flag_source.get(binary) or "their --help and the entry helper's source"
                self.report(doc, line, f"command-line flag `--{flag}` of {owner}",
                            f"no such flag ({src})",
                            f"name a flag that exists{self.near(flag, allowed)}; if it is another tool's flag, "
                            "write that tool's command in the same code span or add it to FOREIGN_FLAGS in e2e/docs-check.py")

    @staticmethod
    def command_of(text):
        words = text.split()
        while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] in ("sudo", "env", "$", "exec")):
            words = words[1:]
        return os.path.basename(words[0]) if words else ""

    def flags_in_span(self, doc, line, text):
        if re.match(r"^--[a-z]", text):
            self.check_flags(doc, line, text, None)
        elif self.command_of(text) in OUR_BINARIES:
            self.check_flags(doc, line, text, self.command_of(text))

    # 2. field paths
    def check_path(self, doc, line, path, kinds, prefix=()):
        segs = split_path(path)
        if not segs:
            return
        full = list(prefix) + segs
        if not prefix and len(full) >= 2:
            # Ours only when the first field under spec/status exists in one of the kinds.
            if all(child(child(s, full[0]) or {}, full[1]) is None for s in kinds.values()):
                return
        self.count("field paths")
        if any(resolve(s, full) is not None for s in kinds.values()):
            return
        known = set()
        for s in kinds.values():
            for i in range(len(full), 0, -1):
                node = resolve(s, full[:i - 1])
                if isinstance(node, dict):
                    for alt in _alternatives(node):
                        known |= set((alt.get("properties") or {}).keys())
                    break
        shown = ".".join(prefix) + "." + path if prefix else path
        self.report(doc, line, f"field path `{shown}` of {' / '.join(kinds)}",
                    "not in the CRD schema (crds/generated/)",
                    f"use a field that exists{self.near(full[-1], known)} (docs/scalepolicy-reference.md lists every ScalePolicy field)")

    def field_paths_in_span(self, doc, line, text):
        m = re.match(r"^((?:spec|status)(?:\.[A-Za-z0-9_<>-]+(?:\[[^\]]*\])*)+)(?:\s*[:=].*)?$", text)
        if m:
            self.check_path(doc, line, m.group(1), self.schemas)
            return
        m = re.match(r"^((?:" + "|".join(RELATIVE_ROOTS) + r")(?:\.[A-Za-z0-9_<>-]+(?:\[[^\]]*\])*)+)(?:\s*[:=].*)?$", text)
        if m:
            self.check_path(doc, line, m.group(1), {"ScalePolicy": self.schemas["ScalePolicy"]}, ("spec",))

    def check_example(self, doc, first, lines):
        docs, cur, start = [], [], first
        for i, l in enumerate(lines):
            if l.strip() == "---":
                docs.append((start, cur))
                cur, start = [], first + i + 1
            else:
                cur.append(l)
        docs.append((start, cur))
        for start, body in docs:
            text = "\n".join(body)
            kind = re.search(r"(?m)^kind:\s*(ScalePolicy|RunnerAttempt)\s*$", text)
            if not kind or not re.search(r"(?m)^apiVersion:\s*runner-manager\.dev/", text):
                continue
            try:
                obj = yaml_load(text, start)
            except (ValueError, IndexError) as e:
                self.report(doc, start, f"{kind.group(1)} example", f"not YAML this check can read ({e})",
                            "write it as plain YAML (block or flow style)")
                continue
            schema = self.schemas[kind.group(1)]
            for top in ("spec", "status"):
                if isinstance(obj, dict) and top in obj:
                    self.walk_example(doc, obj.lines.get(top, start), obj[top], schema["properties"][top], top, kind.group(1))

    def walk_example(self, doc, line, value, schema, path, kind):
        if schema is True or schema is None:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                kline = value.lines.get(k, line) if isinstance(value, KMap) else line
                self.count("example fields")
                sub = child(schema, k)
                if sub is None:
                    known = set()
                    for alt in _alternatives(schema):
                        known |= set((alt.get("properties") or {}).keys())
                    self.report(doc, kline, f"{kind} example field `{path}.{k}`", "not in the CRD schema (crds/generated/)",
                                f"use a field that exists{self.near(k, known)} (docs/scalepolicy-reference.md)")
                else:
                    self.walk_example(doc, kline, v, sub, f"{path}.{k}", kind)
        elif isinstance(value, list):
            sub = items(schema)
            for v in value:
                self.walk_example(doc, line, v, sub, path + "[]", kind)
        elif isinstance(value, str) and isinstance(schema, dict) and isinstance(schema.get("enum"), list):
            self.count("example fields")
            if value not in schema["enum"]:
                self.report(doc, line, f"{kind} example value `{path}: {value}`", f"not one of {', '.join(map(str, schema['enum']))}",
                            "use one of the listed values")

    # 3. metrics
    def check_metrics(self, doc, text):
        for m in re.finditer(r"(?<![\w.])(runner_manager_[a-z0-9_]*[a-z0-9](?:_\*|\*)?)(?![\w])", text):
            name, after = m.group(1), text[m.end():m.end() + 2]
            if after.startswith("::") or after.startswith("="):
                continue
            if name in self.crates:
                continue
            self.count("metrics")
            if name.endswith("*"):
                if any(n.startswith(name.rstrip("*")) for n in self.metrics):
                    continue
            elif name in self.metrics or any(name == n + s for n in self.metrics for s in ("_total", "_info", "_bucket", "_sum", "_count", "_created")):
                continue
            self.report(doc, line_of(text, m.start()), f"metric `{name}`", "no source file registers it (operator/src/metrics.rs, node-agent/src/agent/reporting/metrics.rs)",
                        f"use a registered name{self.near(name, self.metrics)}")

    # 4. vocabularies
    def vocab_in_span(self, doc, line, text, before, after):
        v = self.vocab
        m = re.match(r"^(Failed|Orphaned|Rejected)\((\w+)\)$", text)
        if m:
            self.count("vocabulary")
            if m.group(2) not in v.kind_reasons[m.group(1)]:
                self.report(doc, line, f"outcome `{text}`", f"{m.group(2)} is not a reason of {m.group(1)} (core/src/outcome.rs)",
                            f"use one of its reasons{self.near(m.group(2), v.kind_reasons[m.group(1)])}")
            return
        m = re.match(r"^([A-Z]\w+)=(True|False|Unknown)$", text)
        if m:
            self.count("vocabulary")
            if m.group(1) not in v.condition_types:
                self.report(doc, line, f"condition `{text}`", "no such condition type (crds/src/policy.rs, crds/src/attempt.rs)",
                            f"use a condition type{self.near(m.group(1), v.condition_types)}")
            return
        m = re.match(r"^([A-Z]\w+)/([A-Z]\w+)$", text)
        if m and m.group(1) in v.condition_types:
            self.count("vocabulary")
            if m.group(2) not in v.reasons_of_type(m.group(1)):
                self.report(doc, line, f"condition reason `{text}`", f"{m.group(2)} is not a reason of the {m.group(1)} condition's kind",
                            f"use a condition reason{self.near(m.group(2), v.reasons_of_type(m.group(1)))}")
            return
        if not CAMEL.match(text):
            return
        b = before[-40:].replace("\n", " ")
        a = after[:40].replace("\n", " ")
        if re.search(r"\b[Ee]vents?(?: (?:Normal|Warning))?\s*$", b) or re.match(r"^ (?:(?:Normal|Warning) )?[Ee]vents?\b", a):
            self.count("vocabulary")
            if text not in v.events:
                self.report(doc, line, f"Event reason `{text}`", "not in the closed Event reasons (operator/src/controller/applying/events.rs, node-agent/src/agent/reporting/labels.rs)",
                            f"use an Event reason{self.near(text, v.events)}")
        elif re.search(r"\breasons?:?\s*$", b):
            self.count("vocabulary")
            if text not in v.reasons:
                self.report(doc, line, f"reason `{text}`", "in none of the closed reason lists (conditions, outcomes, Events)",
                            f"use a reason the code has{self.near(text, v.reasons)}")
        elif text not in ("True", "False", "Unknown") and (re.search(r"\bconditions?\s*$", b) or re.match(r"^ conditions?\b", a)):
            self.count("vocabulary")
            if text not in v.condition_types:
                self.report(doc, line, f"condition type `{text}`", "no such condition type (crds/src/policy.rs, crds/src/attempt.rs)",
                            f"use a condition type{self.near(text, v.condition_types)}")

    def vocab_in_tables(self, doc, masked):
        lines = masked.split("\n")
        i, v = 0, self.vocab
        cells = lambda l: [c.strip() for c in l.strip().strip("|").split("|")]
        while i < len(lines):
            if lines[i].lstrip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
                head = [c.lower() for c in cells(lines[i])]
                j = i + 2
                reason_col = head.index("reason") if "reason" in head else None
                kind_col = next((k for k, h in enumerate(head) if h.startswith("kind") and "reason" in h), None)
                cond_col = head.index("condition") if "condition" in head else None
                is_events = any(h in ("source", "from") for h in head)
                while j < len(lines) and lines[j].lstrip().startswith("|"):
                    row = cells(lines[j])
                    if reason_col is not None and reason_col < len(row):
                        for word in re.findall(r"`([^`]+)`", row[reason_col]):
                            if not CAMEL.match(word):
                                continue
                            self.count("vocabulary")
                            if is_events:
                                if word not in v.events:
                                    self.report(doc, j + 1, f"Event reason `{word}`", "not in the closed Event reasons",
                                                f"use an Event reason{self.near(word, v.events)}")
                                continue
                            ctype = None
                            if cond_col is not None and cond_col < len(row):
                                cm = re.match(r"^`?([A-Z]\w+)`?", row[cond_col])
                                ctype = cm.group(1) if cm else None
                            if ctype and ctype not in v.condition_types:
                                self.report(doc, j + 1, f"condition type `{ctype}`", "no such condition type",
                                            f"use a condition type{self.near(ctype, v.condition_types)}")
                                continue
                            allowed = v.reasons_of_type(ctype) if ctype else v.reasons
                            if word not in allowed:
                                self.report(doc, j + 1, f"condition reason `{word}`" + (f" of {ctype}" if ctype else ""),
                                            "not in the code's closed list", f"use a reason the code has{self.near(word, allowed)}")
                    if kind_col is not None and kind_col < len(row):
                        for word in re.findall(r"`([^`(]+)`", row[kind_col]):
                            if CAMEL.match(word):
                                self.count("vocabulary")
                                if word not in v.outcome_kinds:
                                    self.report(doc, j + 1, f"outcome kind `{word}`", "not an outcome kind (core/src/outcome.rs)",
                                                f"use an outcome kind{self.near(word, v.outcome_kinds)}")
                    j += 1
                i = j
            else:
                i += 1

    # 5. paths
    def path_ok(self, rel, base):
        """None when every expansion of rel exists; else the first that does not."""
        rel = re.sub(r"(::|#|:\d).*$", "", rel)
        rel = rel.replace("…", "*").replace("...", "*")
        rel = re.sub(r"<[^>/]*>", "*", rel)
        variants = [rel]
        while any("{" in v for v in variants):
            out = []
            for v in variants:
                m = re.search(r"\{([^{}]*)\}", v)
                out += [v[:m.start()] + p + v[m.end():] for p in m.group(1).split(",")] if m else [v]
            variants = out
        for v in variants:
            path = os.path.normpath(os.path.join(base, v))
            # A Rust module named by its path (`node-agent/src/handoff`) is a file or a directory.
            if not any(glob.glob(c) if "*" in c else os.path.exists(c) for c in (path, path + ".rs")):
                return v
        return None

    def repo_paths_in_span(self, doc, line, text):
        if "://" in text:
            return
        words = text.split()
        command = len(words) > 1
        for n, word in enumerate(words):
            word = word.strip("(),;'\"")
            if "=" in word or word.startswith(("-", "/", "~", "$")):
                continue
            # In a command, arguments count only when they look like files (`x.yaml`, `dir/`):
            # `deploy/runner-manager-operator` after `kubectl logs` is an object, not a path.
            if command and n > 0 and not re.search(r"(\.[A-Za-z0-9]+|/)$", word):
                continue
            first = re.split(r"[/:]", word, 1)[0]
            if first not in self.top or (first == word and "." not in word and word not in ("Makefile", "LICENSE")):
                continue
            if not re.match(r"^[\w.@+{},<>*…-]+(/[\w.@+{},<>*…-]*)*(::[\w:]+)?(#[\w-]+)?$", word):
                continue
            self.count("paths")
            missing = self.path_ok(word, self.root)
            if missing:
                self.report(doc, line, f"path `{word}`", f"{missing} does not exist in the repository",
                            "name a file that exists (paths are relative to the repository root)")

    def check_links(self, doc, docdir, masked):
        # Links are read outside code spans (a regex in a span is not a link).
        masked = SPAN.sub(lambda m: " " * len(m.group(0)) if "\n\n" not in m.group(2) else m.group(0), masked)
        for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", masked):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                if target.startswith("#"):
                    self.check_anchor(doc, line_of(masked, m.start()), os.path.join(self.root, doc), target[1:])
                continue
            self.count("links")
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(docdir, file))
            line = line_of(masked, m.start())
            if not os.path.exists(path):
                self.report(doc, line, f"link `{target}`", f"{os.path.relpath(path, self.root)} does not exist",
                            "link a file that exists (relative to the doc)")
            elif anchor and path.endswith(".md"):
                self.check_anchor(doc, line, path, anchor)

    def check_anchor(self, doc, line, path, anchor):
        self.count("links")
        have = anchors(path)
        if anchor not in have:
            self.report(doc, line, f"link anchor `#{anchor}`", f"{os.path.relpath(path, self.root)} has no such heading",
                        f"link a heading that exists{self.near(anchor, have)}")

    # 6. make targets
    def make_in(self, doc, line, text):
        for m in re.finditer(r"(?:^|[\s;&(])make\s+([a-z][a-z0-9-]*)", text):
            self.count("make targets")
            if m.group(1) not in self.make_targets:
                self.report(doc, line, f"`make {m.group(1)}`", "the Makefile has no such target",
                            f"use a target the Makefile has{self.near(m.group(1), self.make_targets)}")

    # One document.
    def check_doc(self, rel):
        path = os.path.join(self.root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        masked, blocks = fences(text)
        docdir = os.path.dirname(path)
        for span, start, end in spans(masked):
            line = line_of(masked, start)
            self.flags_in_span(rel, line, span)
            self.field_paths_in_span(rel, line, span)
            self.repo_paths_in_span(rel, line, span)
            self.vocab_in_span(rel, line, span, masked[max(0, start - 60):start], masked[end:end + 60])
            self.make_in(rel, line, span)
        self.vocab_in_tables(rel, masked)
        self.check_links(rel, docdir, masked)
        self.check_metrics(rel, text)
        for lang, first, lines in blocks:
            joined = []
            for n, l in enumerate(lines):
                if joined and joined[-1][1].endswith("\\"):
                    joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + l.strip())
                else:
                    joined.append((first + n, l.strip()))
            for n, l in joined:
                cmd = re.sub(r"\s#.*$", "", l)
                if self.command_of(cmd) in OUR_BINARIES:
                    self.check_flags(rel, n, cmd, self.command_of(cmd))
                self.make_in(rel, n, cmd)
                if lang in ("sh", "bash", "shell", "console", ""):
                    self.repo_paths_in_span(rel, n, cmd)
            if lang in ("yaml", "yml"):
                self.check_example(rel, first, lines)

    def run(self, docs):
        for rel in docs:
            self.check_doc(rel)
        readme = os.path.join(self.root, "README.md")
        size = os.path.getsize(readme)
        self.count("readme size")
        if size >= README_MAX_BYTES:
            self.report("README.md", 1, f"README size {size} bytes", f"not under {README_MAX_BYTES}",
                        "move detail into the right file under docs/ and link it")
        self.check_readme_figures()

    # 8. README figures against the latest benchmarks
    def check_readme_figures(self):
        with open(os.path.join(self.root, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        with open(os.path.join(self.root, "docs", "benchmarks.md"), encoding="utf-8") as f:
            bench = f.read()
        start = bench.find("\n" + LATEST_FIGURES)
        if start < 0:
            raise Problem(f"docs/benchmarks.md has no heading beginning `{LATEST_FIGURES}`")
        end = bench.find("\n## ", start + 1)
        latest = bench[start:end if end >= 0 else len(bench)]
        masked, _ = fences(readme)
        for n, line in enumerate(masked.split("\n"), 1):
            prose = re.sub(r"`[^`]*`|\]\([^)]*\)", " ", line)
            for fig in stale_figures(prose, latest):
                self.report("README.md", n, f"figure `{fig}`",
                            f"docs/benchmarks.md's `{LATEST_FIGURES}` section does not hold it",
                            "measure it and put it in that section, or drop it from the README")
            self.checked["readme figures"] = self.checked.get("readme figures", 0) + len(figures(prose))


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = argv[1:]
    if args == ["--self-test"]:
        self_test()
        return 0
    if args[:1] == ["--root"]:
        root, args = os.path.abspath(args[1]), args[2:]
    if any(a.startswith("-") for a in args):
        print(__doc__)
        return 2
    try:
        checker = Checker(root, args)
        docs = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
        checker.run(docs)
    except Problem as e:
        print(f"docs-check: cannot run: {e}", file=sys.stderr)
        return 2
    for p in checker.problems:
        print(p)
    sources = "; ".join(f"{b}: {s}" for b, s in checker.flag_source.items() if b != OUR_BINARIES[2])
    counts = ", ".join(f"{k} {v}" for k, v in sorted(checker.checked.items()))
    print(f"docs-check: {len(docs)} files; checked {counts}; {len(checker.problems)} problems (flags from {sources})")
    return 1 if checker.problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
