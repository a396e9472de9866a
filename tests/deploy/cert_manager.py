"""A structural check of cert-manager's v1 Issuer and Certificate objects,
for the schema check of tests/deploy (kubernetes-validate ships only the
Kubernetes API's schemas, not those of CRDs). It knows the fields of
cert-manager.io/v1 that deploy/k8s may use, their types and the rules the
cert-manager webhook enforces on them (one issuer type per Issuer, an
issuerRef and a secretName per Certificate, known usages and key
algorithms), and rejects anything else: an unknown or misspelt field is an
error, as in the strict Kubernetes schemas."""

API_VERSION = "cert-manager.io/v1"
KINDS = ("Issuer", "ClusterIssuer", "Certificate")

STR, INT, BOOL, LIST_STR, OBJ = "string", "integer", "boolean", "[]string", \
    "object"
METADATA = {"name": STR, "namespace": STR, "labels": OBJ,
            "annotations": OBJ}
ISSUER_SPEC = {"selfSigned": {"crlDistributionPoints": LIST_STR},
               "ca": {"secretName": STR, "crlDistributionPoints": LIST_STR,
                      "ocspServers": LIST_STR}}
CERTIFICATE_SPEC = {
    "secretName": STR, "commonName": STR, "duration": STR,
    "renewBefore": STR, "isCA": BOOL, "uris": LIST_STR,
    "dnsNames": LIST_STR, "ipAddresses": LIST_STR, "emailAddresses": LIST_STR,
    "usages": LIST_STR, "revisionHistoryLimit": INT,
    "subject": {"organizations": LIST_STR, "organizationalUnits": LIST_STR,
                "countries": LIST_STR},
    "privateKey": {"algorithm": STR, "size": INT, "encoding": STR,
                   "rotationPolicy": STR},
    "issuerRef": {"name": STR, "kind": STR, "group": STR},
    "secretTemplate": {"labels": OBJ, "annotations": OBJ},
}
USAGES = {"signing", "digital signature", "content commitment",
          "key encipherment", "key agreement", "data encipherment",
          "cert sign", "crl sign", "encipher only", "decipher only", "any",
          "server auth", "client auth", "code signing", "email protection",
          "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user",
          "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"}
KEY_SIZES = {"RSA": (2048, 3072, 4096), "ECDSA": (256, 384, 521),
             "Ed25519": (None,)}
ROTATION = ("Never", "Always")
DURATION_UNITS = "hms"


def _type_error(value, kind):
    checks = {STR: lambda v: isinstance(v, str),
              INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
              BOOL: lambda v: isinstance(v, bool),
              LIST_STR: lambda v: isinstance(v, list) and all(
                  isinstance(x, str) for x in v),
              OBJ: lambda v: isinstance(v, dict)}
    return None if checks[kind](value) else f"want {kind}, got {value!r}"


def _fields(obj, schema, path):
    """Errors of obj under schema: a dict of field -> type or sub-schema."""
    if not isinstance(obj, dict):
        return [f"{path}: want object, got {obj!r}"]
    errors = []
    for key, value in obj.items():
        if key not in schema:
            errors.append(f"{path}.{key}: unknown field")
            continue
        kind = schema[key]
        if isinstance(kind, dict):
            errors += _fields(value, kind, f"{path}.{key}")
        else:
            e = _type_error(value, kind)
            if e:
                errors.append(f"{path}.{key}: {e}")
    return errors


def _duration_error(value):
    """cert-manager takes Go durations; deploy/k8s writes whole hours,
    minutes or seconds (e.g. 720h)."""
    if not value or value[-1] not in DURATION_UNITS or \
            not value[:-1].isdigit() or int(value[:-1]) == 0:
        return f"'{value}' is not a duration like 720h"
    return None


def error(o):
    """None when o is a valid cert-manager v1 object of a known kind, else
    what is wrong."""
    if o.get("apiVersion") != API_VERSION or o.get("kind") not in KINDS:
        return (f"not a cert-manager object: {o.get('apiVersion')} "
                f"{o.get('kind')}")
    unknown = set(o) - {"apiVersion", "kind", "metadata", "spec"}
    if unknown:
        return f"unknown top-level fields {sorted(unknown)}"
    errors = _fields(o.get("metadata", {}), METADATA, "metadata")
    if not o.get("metadata", {}).get("name"):
        errors.append("metadata.name: required")
    spec = o.get("spec")
    if not isinstance(spec, dict):
        return "; ".join(errors + ["spec: required"])
    if o["kind"] in ("Issuer", "ClusterIssuer"):
        errors += _fields(spec, ISSUER_SPEC, "spec")
        if len(spec) != 1:
            errors.append(f"spec: exactly one issuer type, got {sorted(spec)}")
        if "ca" in spec and not spec["ca"].get("secretName"):
            errors.append("spec.ca.secretName: required")
        return "; ".join(errors) or None
    errors += _fields(spec, CERTIFICATE_SPEC, "spec")
    for field in ("secretName", "issuerRef"):
        if field not in spec:
            errors.append(f"spec.{field}: required")
    ref = spec.get("issuerRef", {})
    if isinstance(ref, dict):
        if not ref.get("name"):
            errors.append("spec.issuerRef.name: required")
        if ref.get("group", "cert-manager.io") == "cert-manager.io" and \
                ref.get("kind", "Issuer") not in ("Issuer", "ClusterIssuer"):
            errors.append(f"spec.issuerRef.kind: '{ref.get('kind')}' is not "
                          "Issuer or ClusterIssuer")
    if not any(spec.get(k) for k in ("commonName", "dnsNames", "uris",
                                     "ipAddresses", "emailAddresses")):
        errors.append("spec: at least one of commonName, dnsNames, uris, "
                      "ipAddresses, emailAddresses")
    for u in spec.get("usages", []) if isinstance(
            spec.get("usages"), list) else []:
        if u not in USAGES:
            errors.append(f"spec.usages: unknown usage '{u}'")
    for field in ("duration", "renewBefore"):
        if isinstance(spec.get(field), str):
            e = _duration_error(spec[field])
            if e:
                errors.append(f"spec.{field}: {e}")
    key = spec.get("privateKey", {})
    if isinstance(key, dict) and "algorithm" in key:
        sizes = KEY_SIZES.get(key["algorithm"])
        if sizes is None:
            errors.append(f"spec.privateKey.algorithm: '{key['algorithm']}'")
        elif key.get("size") not in sizes:
            errors.append(f"spec.privateKey.size: {key.get('size')} is not "
                          f"one of {sizes} for {key['algorithm']}")
    if isinstance(key, dict) and key.get("rotationPolicy", "Never") \
            not in ROTATION:
        errors.append(f"spec.privateKey.rotationPolicy: "
                      f"'{key['rotationPolicy']}'")
    return "; ".join(errors) or None
