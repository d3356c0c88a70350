#!/usr/bin/env python3
"""kube-schemas.py SWAGGER_JSON [CRD_YAML...] OUTDIR: kubeconform's schema directory, offline.

SWAGGER_JSON is a Kubernetes release's OpenAPI v2 spec (api/openapi-spec/swagger.json of the
k8s.io/kubernetes Go module); each CRD_YAML holds CustomResourceDefinitions (apiextensions.k8s.io/v1).
One JSON schema (draft 4, what kubeconform compiles them as) is written per kind and served version,
named as kubeconform's `-schema-location '<OUTDIR>/{{ .ResourceKind }}{{ .KindSuffix }}.json'`
looks it up (schema_file below). e2e/kubeconform.sh runs it; CI cannot reach the schema sets
published on GitHub.

Each file is standalone: the definitions it reaches are copied into its own `definitions` and
referenced as `#/definitions/NAME`, so nothing depends on how a validator resolves a reference to
another file, and recursive types (a CRD's JSONSchemaProps) need no inlining.

Strict as openapi2jsonschema --strict: an object schema with `properties` and neither
`additionalProperties` nor `x-kubernetes-preserve-unknown-fields` gets `additionalProperties: false`
(a field the API server would drop is an error), except inside allOf/anyOf/oneOf/not, whose
branches name only part of an object's fields. The Kubernetes quirks: `format: int-or-string`,
IntOrString and `x-kubernetes-int-or-string` take an integer or a string; a Quantity a string or a
number (the API server reads `cpu: 1`); meta/v1 Time and MicroTime may be null (their JSON decoding
takes null; `kubectl create -o yaml` writes `creationTimestamp: null`); `nullable: true` adds null;
`apiVersion` and `kind` are enums of the file's own group-version-kind (current kubeconform also
takes a schema only when its `kind` enum names the resource's kind). Descriptions, defaults and
`x-kubernetes-*` annotations are dropped once read: the files are for a validator. Other nulls are
refused, as kubeconform's published schemas refuse them below the top level.

Bad input exits 2 with the file and what is wrong.
"""
import json
import os
import sys

import yaml

DEF = "#/definitions/"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
# Definitions whose swagger form is narrower than what the API server decodes.
OVERRIDES = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"anyOf": [{"type": "string"}, {"type": "number"}]},
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": {"type": ["string", "null"], "format": "date-time"},
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": {"type": ["string", "null"], "format": "date-time"},
}
# Draft 4 validation keywords kept as they are; the schema-valued ones are converted below.
SCALARS = {"type", "enum", "format", "pattern", "minimum", "maximum", "exclusiveMinimum",
           "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "minItems", "maxItems",
           "uniqueItems", "minProperties", "maxProperties", "required"}
JUNCTORS = ("allOf", "anyOf", "oneOf")
DRAFT4_TYPES = {"array", "boolean", "integer", "null", "number", "object", "string"}


class Bad(Exception):
    """Input the generator refuses; the message names the file and the place."""


def convert(s, where, strict=True):
    """One OpenAPI schema (swagger v2 or a CRD's v3 structural one) as strict draft-4 JSON schema."""
    if not isinstance(s, dict):
        raise Bad(f"{where}: a schema must be a mapping, not {type(s).__name__}")
    if "$ref" in s:
        ref = s["$ref"]
        if not isinstance(ref, str) or not ref.startswith(DEF):
            raise Bad(f"{where}: $ref {ref!r} is not a local '{DEF}NAME' reference")
        return {"$ref": ref}  # draft 4 ignores a $ref's siblings; swagger's are descriptions
    out = {}
    for k, v in s.items():
        if k in SCALARS:
            out[k] = v
        elif k in ("properties", "patternProperties"):
            if not isinstance(v, dict):
                raise Bad(f"{where}: {k} must be a mapping")
            out[k] = {n: convert(x, f"{where}.{n}", strict) for n, x in v.items()}
        elif k == "items":
            out[k] = ([convert(x, f"{where}[{i}]", strict) for i, x in enumerate(v)]
                      if isinstance(v, list) else convert(v, f"{where}[]", strict))
        elif k in ("additionalProperties", "additionalItems"):
            out[k] = v if isinstance(v, bool) else convert(v, f"{where}.{k}", strict)
        elif k in JUNCTORS:
            if not isinstance(v, list) or not v:
                raise Bad(f"{where}: {k} must be a non-empty list")
            out[k] = [convert(x, f"{where}.{k}[{i}]", False) for i, x in enumerate(v)]
        elif k == "not":
            out[k] = convert(v, f"{where}.not", False)
    t = out.get("type")
    if t is not None and not (t in DRAFT4_TYPES if isinstance(t, str)
                              else isinstance(t, list) and t and set(t) <= DRAFT4_TYPES):
        raise Bad(f"{where}: type {t!r} is not a JSON schema type")
    if out.get("required") == []:
        del out["required"]  # draft 4's meta-schema wants at least one name
    if s.get("format") == "int-or-string" or s.get("x-kubernetes-int-or-string") is True:
        out.pop("format", None)
        out.pop("type", None)
        # A CRD generator may have spelled the alternatives out already (anyOf integer, string).
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if s.get("nullable") is True:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        elif isinstance(out.get("type"), list) and "null" not in out["type"]:
            out["type"] = out["type"] + ["null"]
        elif "type" not in out and "anyOf" in out:
            out["anyOf"] = out["anyOf"] + [{"type": "null"}]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = out["enum"] + [None]
    if s.get("x-kubernetes-embedded-resource") is True and "properties" in out:
        for name, sch in (("apiVersion", {"type": "string"}), ("kind", {"type": "string"}),
                          ("metadata", {"type": "object"})):
            out["properties"].setdefault(name, sch)
    if (strict and "properties" in out and "additionalProperties" not in out
            and s.get("x-kubernetes-preserve-unknown-fields") is not True):
        out["additionalProperties"] = False
    return out


def refs(s, found):
    """The definition names a converted schema references, into found."""
    if isinstance(s, dict):
        r = s.get("$ref")
        if isinstance(r, str):
            found.add(r[len(DEF):])
        for v in s.values():
            if isinstance(v, (dict, list)):
                refs(v, found)
    elif isinstance(s, list):
        for v in s:
            refs(v, found)
    return found


def closure(roots, direct):
    seen, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(direct[n])
    return seen


def schema_file(kind, api_version):
    """kubeconform's file name for a resource, as pkg/registry/registry.go's schemaPath computes
    {{ .ResourceKind }}{{ .KindSuffix }}: the lower-case kind, then "-" and the lower-case first
    DNS label of the group, then "-" and the version (the core group: "-" and the version)."""
    group_parts = api_version.split("/")
    version_parts = group_parts[0].split(".")
    suffix = "-" + version_parts[0].lower()
    if len(group_parts) > 1:
        suffix += "-" + group_parts[1].lower()
    return kind.lower() + suffix + ".json"


def with_gvk(root, api_version, kind):
    """The root schema with apiVersion and kind fixed to this file's resource."""
    root = dict(root)
    props = dict(root.get("properties", {}))
    props["apiVersion"] = {"type": "string", "enum": [api_version]}
    props["kind"] = {"type": "string", "enum": [kind]}
    root["properties"] = props
    return root


def load_swagger(path):
    try:
        with open(path, "rb") as f:
            spec = json.load(f)
    except OSError as e:
        raise Bad(f"{path}: cannot read it: {e.strerror}")
    except ValueError as e:
        raise Bad(f"{path}: not JSON: {e}")
    defs = spec.get("definitions") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or str(spec.get("swagger", "")) != "2.0" or not isinstance(defs, dict):
        raise Bad(f"{path}: not an OpenAPI v2 spec with definitions (want api/openapi-spec/swagger.json "
                  "of the k8s.io/kubernetes module)")
    if OBJECT_META not in defs:
        raise Bad(f"{path}: has no {OBJECT_META}: not a Kubernetes API spec")
    return defs


def load_crds(path):
    try:
        with open(path, encoding="utf-8") as f:
            docs = list(yaml.safe_load_all(f))
    except OSError as e:
        raise Bad(f"{path}: cannot read it: {e.strerror}")
    except yaml.YAMLError as e:
        raise Bad(f"{path}: not YAML: {e}")
    crds = []
    for i, d in enumerate(docs, 1):
        if d is None:
            continue
        if not isinstance(d, dict) or d.get("kind") != "CustomResourceDefinition":
            what = d.get("kind") if isinstance(d, dict) else type(d).__name__
            raise Bad(f"{path}: document {i} is a {what}, not a CustomResourceDefinition")
        if d.get("apiVersion") != "apiextensions.k8s.io/v1":
            raise Bad(f"{path}: document {i} is {d.get('apiVersion')}, not apiextensions.k8s.io/v1 "
                      "(the only CustomResourceDefinition version read)")
        crds.append((f"{path}: document {i}", d))
    if not crds:
        raise Bad(f"{path}: holds no CustomResourceDefinition")
    return crds


def crd_schemas(where, crd, converted, direct):
    """(file name, what, schema) for each served version of one CRD."""
    spec = crd.get("spec") or {}
    group = spec.get("group")
    kind = (spec.get("names") or {}).get("kind")
    name = (crd.get("metadata") or {}).get("name", "?")
    if not isinstance(group, str) or not group or not isinstance(kind, str) or not kind:
        raise Bad(f"{where} ({name}): spec.group and spec.names.kind must be set")
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        raise Bad(f"{where} ({name}): spec.versions is empty")
    out = []
    for v in versions:
        vname = v.get("name") if isinstance(v, dict) else None
        if not isinstance(vname, str) or not vname:
            raise Bad(f"{where} ({name}): a spec.versions entry has no name")
        if v.get("served") is not True:
            continue  # the API server refuses an unserved version: no file, so kubeconform fails
        s = (v.get("schema") or {}).get("openAPIV3Schema")
        if not isinstance(s, dict):
            raise Bad(f"{where} ({name}): served version {vname} has no schema.openAPIV3Schema")
        vwhere = f"{where} ({name} {vname})"
        root = convert(s, f"{vwhere} openAPIV3Schema")
        props = dict(root.get("properties", {}))
        # metadata is the API server's ObjectMeta whatever the CRD says (it may only narrow it).
        meta = props.get("metadata", {})
        extra = {k: x for k, x in meta.items() if k not in ("type", "additionalProperties")}
        props["metadata"] = ({"allOf": [extra, {"$ref": DEF + OBJECT_META}]} if extra
                             else {"$ref": DEF + OBJECT_META})
        root["properties"] = props
        if "additionalProperties" not in root and s.get("x-kubernetes-preserve-unknown-fields") is not True:
            root["additionalProperties"] = False  # apiVersion, kind and metadata made it a properties object
        api_version = f"{group}/{vname}"
        root = with_gvk(root, api_version, kind)
        root["definitions"] = {n: converted[n] for n in sorted(closure([OBJECT_META], direct))}
        unknown = refs(root, set()) - set(root["definitions"])
        if unknown:
            raise Bad(f"{vwhere}: $ref to {sorted(unknown)[0]}, which is not a definition")
        out.append((schema_file(kind, api_version), f"{vwhere}", root))
    return out


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print("usage: " + __doc__.split("\n\n")[0], file=sys.stderr)
        return 2
    swagger, crd_files, outdir = argv[1], argv[2:-1], argv[-1]
    defs = load_swagger(swagger)
    converted = {}
    for name, d in defs.items():
        converted[name] = OVERRIDES.get(name) or convert(d, f"{swagger}: definitions.{name}")
    direct = {n: refs(s, set()) for n, s in converted.items()}
    for n, rs in direct.items():
        for r in rs:
            if r not in converted:
                raise Bad(f"{swagger}: definitions.{n} references {r}, which is not a definition")

    files = {}  # file name -> (what, schema)

    def add(fname, what, schema):
        if fname in files and files[fname][1] != schema:
            raise Bad(f"{what} and {files[fname][0]} are both {fname} in kubeconform's naming "
                      "(same kind, version and first label of the group): it cannot tell them apart")
        files.setdefault(fname, (what, schema))

    kinds = 0
    for name, d in defs.items():
        gvks = d.get("x-kubernetes-group-version-kind")
        if gvks is None:
            continue
        if not isinstance(gvks, list) or not all(
                isinstance(g, dict) and isinstance(g.get("group"), str)
                and isinstance(g.get("version"), str) and g.get("version")
                and isinstance(g.get("kind"), str) and g.get("kind") for g in gvks):
            raise Bad(f"{swagger}: definitions.{name}: x-kubernetes-group-version-kind is not a list "
                      "of {group, version, kind}")
        defs_of = {n: converted[n] for n in sorted(closure(direct[name], direct))}
        for g in gvks:
            api_version = f"{g['group']}/{g['version']}" if g["group"] else g["version"]
            root = with_gvk(converted[name], api_version, g["kind"])
            if defs_of:
                root["definitions"] = defs_of
            add(schema_file(g["kind"], api_version), f"{swagger}: definitions.{name}", root)
            kinds += 1
    crds = 0
    for path in crd_files:
        for where, crd in load_crds(path):
            for fname, what, schema in crd_schemas(where, crd, converted, direct):
                add(fname, what, schema)
                crds += 1

    try:
        os.makedirs(outdir, exist_ok=True)
        for fname, (_, schema) in files.items():
            with open(os.path.join(outdir, fname), "w", encoding="utf-8") as f:
                json.dump(schema, f, separators=(",", ":"), sort_keys=True)
    except OSError as e:
        raise Bad(f"{outdir}: cannot write the schemas: {e}")
    print(f"kube-schemas: {kinds} Kubernetes kinds of {swagger} and {crds} CRD versions "
          f"in {len(files)} files in {outdir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Bad as e:
        print(f"kube-schemas: {e}", file=sys.stderr)
        sys.exit(2)
