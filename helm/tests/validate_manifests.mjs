// Validates the manifests `helm template` rendered, as kubeconform -strict
// would, with no network: every object against the Kubernetes API schemas of
// the npm package kubernetes-models (Prometheus Operator kinds from
// @kubernetes-models/prometheus-operator; cert-manager's Certificate against
// the minimal schema below), plus checks the schemas cannot express.
//
//   node validate_manifests.mjs --node_modules=DIR [--helpfull=BINARY:FILE]... RENDERED.yaml...
//
// Checks, for every object of every file:
//   - a schema exists for its apiVersion and kind, and the object passes it;
//   - no unknown field anywhere (the schemas allow any; the packages' type
//     declarations list each type's fields, which this reads);
//   - names and labels are valid Kubernetes names and label values, no two
//     objects share kind, namespace and name, and a workload's selector
//     matches its pod template's labels;
//   - Trident's own rules: every service container has gRPC startup,
//     liveness and readiness probes on its gRPC port or, when it serves TLS
//     (--tls_cert_file; the kubelet's gRPC probe cannot speak TLS), TCP
//     startup and readiness probes on that port and a liveness probe that
//     GETs /metrics on its metrics port; TLS comes with its key and CA
//     files; the files of --tls_cert_file, --tls_key_file, --tls_ca_file
//     and --api_keys_file come from a Secret mounted as a directory (no
//     subPath: those never update, and the services reload the files); and
//     attention pods are Guaranteed QoS with integer CPUs;
//   - with --helpfull: every `--flag` a container passes to a Trident binary
//     (by its command's basename) is one that binary defines, as its
//     `--helpfull` output (FILE) lists.
// Prints one line per problem and exits 1 if there is any; else prints how
// many manifests it validated.

import { readFileSync, readdirSync, statSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
  const options = { nodeModules: "", helpfull: new Map(), files: [] };
  for (const arg of argv) {
    if (arg.startsWith("--node_modules=")) {
      options.nodeModules = arg.slice("--node_modules=".length);
    } else if (arg.startsWith("--helpfull=")) {
      const [binary, file] = arg.slice("--helpfull=".length).split(":");
      options.helpfull.set(binary, file);
    } else if (arg.startsWith("--")) {
      throw new Error(`unknown option ${arg}`);
    } else {
      options.files.push(arg);
    }
  }
  if (!options.nodeModules || options.files.length === 0) {
    throw new Error("usage: validate_manifests.mjs --node_modules=DIR [--helpfull=BINARY:FILE]... FILE...");
  }
  return options;
}

// ---------------------------------------------------------------------------
// The packages' type declarations: each interface's fields and their types.

// Reads every .d.ts under `dir` into `types`: exported alias (e.g.
// IIoK8sApiAppsV1DeploymentSpec) -> Map(field -> type text). Returns
// Map(.d.ts path -> the first interface's fields), the roots of kinds.
function indexDeclarations(dir, types) {
  const roots = new Map();
  const walk = (current) => {
    for (const entry of readdirSync(current)) {
      const full = path.join(current, entry);
      if (entry === "_schemas" || entry === "node_modules") continue;
      if (statSync(full).isDirectory()) {
        walk(full);
      } else if (entry.endsWith(".d.ts")) {
        const local = parseDeclarationFile(readFileSync(full, "utf8"), types);
        if (local) roots.set(full, local);
      }
    }
  };
  walk(dir);
  return roots;
}

function parseDeclarationFile(text, types) {
  const interfaces = new Map();
  let first = null;
  let current = null;
  for (const line of text.split("\n")) {
    const open = /^export interface (\w+)\b.*\{$/.exec(line);
    if (open) {
      current = new Map();
      interfaces.set(open[1], current);
      if (!first) first = current;
      continue;
    }
    if (current && line === "}") {
      current = null;
      continue;
    }
    if (current) {
      // Fields are indented by exactly four spaces; deeper lines belong to
      // inline map types ({ [key: string]: T }).
      const field = /^ {4}"([^"]+)"\??: (.*?);?$/.exec(line);
      if (field) current.set(field[1], field[2]);
    }
    const exported = /^export type \{ (\w+) as (\w+),/.exec(line);
    if (exported && interfaces.has(exported[1])) types.set(exported[2], interfaces.get(exported[1]));
  }
  return first;
}

// The fields of a type text, or null where it is not an object type this
// can check (scalars, maps, int-or-string, quantities, raw extensions).
function resolveType(typeText, types) {
  const array = /^Array<(.+)>$/.exec(typeText);
  if (array) return { array: resolveType(array[1], types) };
  return types.has(typeText) ? { fields: types.get(typeText) } : null;
}

function checkUnknownFields(value, type, where, types, problems) {
  if (type === null || value === null || value === undefined) return;
  if (type.array) {
    if (Array.isArray(value)) {
      value.forEach((item, i) => checkUnknownFields(item, type.array, `${where}/${i}`, types, problems));
    }
    return;
  }
  if (typeof value !== "object" || Array.isArray(value)) return;
  for (const [key, child] of Object.entries(value)) {
    if (!type.fields.has(key)) {
      problems.push(`${where}/${key}: unknown field "${key}"`);
      continue;
    }
    checkUnknownFields(child, resolveType(type.fields.get(key), types), `${where}/${key}`, types, problems);
  }
}

// ---------------------------------------------------------------------------
// cert-manager's Certificate (cert-manager.io/v1), which no npm package here
// describes: its spec's fields and types, minimally. A type is a scalar name
// ("string", "integer", "boolean", "object": any object, "duration": a Go
// duration), { enum }, { array: type }, or { fields, required }.

const GO_DURATION = /^([0-9]+(\.[0-9]+)?(ns|us|\u00b5s|ms|s|m|h))+$/;
const KEY_USAGES = [
  "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
  "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
  "server auth", "client auth", "code signing", "email protection", "s/mime",
  "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
  "microsoft sgc", "netscape sgc",
];
const STRING_MAP = { map: "string" };
const CERTIFICATE_SPEC = {
  fields: {
    secretName: "string",
    secretTemplate: { fields: { annotations: STRING_MAP, labels: STRING_MAP } },
    issuerRef: { fields: { name: "string", kind: "string", group: "string" }, required: ["name"] },
    commonName: "string",
    dnsNames: { array: "string" },
    ipAddresses: { array: "string" },
    uris: { array: "string" },
    emailAddresses: { array: "string" },
    otherNames: { array: "object" },
    literalSubject: "string",
    subject: "object",
    duration: "duration",
    renewBefore: "duration",
    renewBeforePercentage: "integer",
    usages: { array: { enum: KEY_USAGES } },
    privateKey: {
      fields: {
        algorithm: { enum: ["RSA", "ECDSA", "Ed25519"] },
        encoding: { enum: ["PKCS1", "PKCS8"] },
        size: "integer",
        rotationPolicy: { enum: ["Never", "Always"] },
      },
    },
    isCA: "boolean",
    keystores: "object",
    revisionHistoryLimit: "integer",
    additionalOutputFormats: { array: "object" },
    encodeUsagesInRequest: "boolean",
    nameConstraints: "object",
  },
  required: ["secretName", "issuerRef"],
};

function checkValue(value, type, where, problems) {
  const scalar = (ok, what) => { if (!ok) problems.push(`${where}: must be ${what}`); };
  if (type === "string") return scalar(typeof value === "string", "string");
  if (type === "integer") return scalar(Number.isInteger(value), "integer");
  if (type === "boolean") return scalar(typeof value === "boolean", "boolean");
  if (type === "object") return scalar(value !== null && typeof value === "object" && !Array.isArray(value), "object");
  if (type === "duration") return scalar(typeof value === "string" && GO_DURATION.test(value), "a duration such as 2160h");
  if (type.enum) return scalar(type.enum.includes(value), `one of ${type.enum.join(", ")}`);
  if (type.array) {
    if (!Array.isArray(value)) return scalar(false, "array");
    value.forEach((item, i) => checkValue(item, type.array, `${where}/${i}`, problems));
    return;
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) return scalar(false, "object");
  if (type.map) {
    for (const [key, item] of Object.entries(value)) checkValue(item, type.map, `${where}/${key}`, problems);
    return;
  }
  for (const [key, item] of Object.entries(value)) {
    if (!(key in type.fields)) problems.push(`${where}/${key}: unknown field "${key}"`);
    else checkValue(item, type.fields[key], `${where}/${key}`, problems);
  }
  for (const key of type.required ?? []) {
    if (value[key] === undefined || value[key] === null || value[key] === "") {
      problems.push(`${where}: must have required property '${key}'`);
    }
  }
}

// The problems of a Certificate; its metadata is checked as any object's.
function validateCertificate(object, types) {
  const problems = [];
  for (const key of Object.keys(object)) {
    if (!["apiVersion", "kind", "metadata", "spec", "status"].includes(key)) {
      problems.push(`/${key}: unknown field "${key}"`);
    }
  }
  checkUnknownFields(object.metadata, resolveType("IIoK8sApimachineryPkgApisMetaV1ObjectMeta", types),
    "/metadata", types, problems);
  if (object.spec === undefined) {
    problems.push("/: must have required property 'spec'");
    return problems;
  }
  checkValue(object.spec, CERTIFICATE_SPEC, "/spec", problems);
  const spec = object.spec ?? {};
  if (!(spec.dnsNames?.length > 0) && !spec.commonName) {
    problems.push("/spec: needs dnsNames or commonName");
  }
  return problems;
}

// ---------------------------------------------------------------------------
// Schemas by apiVersion and kind.

function modelFile(nodeModules, apiVersion, kind) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return path.join(nodeModules, "@kubernetes-models/prometheus-operator", apiVersion, `${kind}.js`);
  }
  return path.join(nodeModules, "kubernetes-models", apiVersion, `${kind}.js`);
}

async function validateSchema(nodeModules, object, types) {
  if (object.apiVersion === "cert-manager.io/v1" && object.kind === "Certificate") {
    return { problems: validateCertificate(object, types), declaration: null };
  }
  const file = modelFile(nodeModules, object.apiVersion, object.kind);
  if (!existsSync(file)) return { missing: true };
  const module = await import(pathToFileURL(file).href);
  const Model = module[object.kind];
  try {
    new Model(object).validate();
    return { problems: [], declaration: file.replace(/\.js$/, ".d.ts") };
  } catch (error) {
    const details = error.errors ?? [{ instancePath: "", message: String(error) }];
    return {
      problems: details.map((e) => {
        const extra = e.params?.allowedValues ? ` (${e.params.allowedValues.join(", ")})` : "";
        return `${e.instancePath || "/"}: ${e.message}${extra}`;
      }),
      declaration: file.replace(/\.js$/, ".d.ts"),
    };
  }
}

// ---------------------------------------------------------------------------
// Names, labels and selectors.

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const LABEL_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
// Kinds whose names become DNS labels (Service names, pod hostnames).
const LABEL_NAMED_KINDS = new Set(["Service", "StatefulSet", "Deployment"]);

function checkLabels(labels, where, problems) {
  for (const [key, value] of Object.entries(labels ?? {})) {
    const slash = key.lastIndexOf("/");
    const prefix = slash >= 0 ? key.slice(0, slash) : "";
    const name = slash >= 0 ? key.slice(slash + 1) : key;
    if ((prefix && (prefix.length > 253 || !DNS_SUBDOMAIN.test(prefix))) ||
        name.length > 63 || !LABEL_NAME.test(name)) {
      problems.push(`${where}: invalid label key "${key}"`);
    }
    if (typeof value !== "string" || value.length > 63 || !LABEL_VALUE.test(value)) {
      problems.push(`${where}: invalid value ${JSON.stringify(value)} of label "${key}"`);
    }
  }
}

function checkNames(object, problems) {
  const name = object.metadata?.name;
  if (typeof name !== "string" || !name) {
    problems.push("/metadata/name: missing");
    return;
  }
  if (name.length > 253 || !DNS_SUBDOMAIN.test(name)) {
    problems.push(`/metadata/name: "${name}" is not a DNS-1123 subdomain`);
  }
  if (LABEL_NAMED_KINDS.has(object.kind) && (name.length > 63 || !DNS_LABEL.test(name))) {
    problems.push(`/metadata/name: "${name}" is not a DNS-1123 label (at most 63 characters)`);
  }
  checkLabels(object.metadata.labels, "/metadata/labels", problems);
  const template = object.spec?.template;
  if (template) {
    checkLabels(template.metadata?.labels, "/spec/template/metadata/labels", problems);
    const selector = object.spec.selector?.matchLabels ?? {};
    for (const [key, value] of Object.entries(selector)) {
      if (template.metadata?.labels?.[key] !== value) {
        problems.push(`/spec/selector: matchLabels ${key}=${value} does not select the pod template`);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Trident's own rules for its pods.

const BINARIES = new Set(["router", "worker", "attention", "controller"]);

function binaryOf(container) {
  const command = container.command?.[0];
  return command ? path.basename(command) : "";
}

// A container's `--name=value` arguments: Map(name -> value).
function flagValues(container) {
  const values = new Map();
  for (const arg of container.args ?? []) {
    const match = /^--([A-Za-z0-9_]+)=(.*)$/s.exec(arg);
    if (match) values.set(match[1], match[2]);
  }
  return values;
}

// Flags naming files the services reload when they change, so that they
// must come from a Secret mounted as a directory.
const RELOADED_FILE_FLAGS = ["tls_cert_file", "tls_key_file", "tls_ca_file", "api_keys_file"];

function checkReloadedFile(pod, container, flag, file, problems) {
  const where = `container ${container.name}: --${flag}=${file}`;
  let mount = null;
  for (const candidate of container.volumeMounts ?? []) {
    const dir = String(candidate.mountPath).replace(/\/+$/, "");
    // A directory holding the file, or the file itself (a subPath mount).
    if ((file === dir || file.startsWith(`${dir}/`)) && (!mount || dir.length > mount.dir.length)) {
      mount = { dir, candidate };
    }
  }
  if (!mount) {
    problems.push(`${where} is on no volume mount`);
    return;
  }
  if (mount.candidate.subPath || mount.candidate.subPathExpr) {
    problems.push(`${where} is mounted with subPath, whose files never update: mount the Secret as a directory`);
  }
  const volume = (pod.volumes ?? []).find((v) => v.name === mount.candidate.name);
  const relative = file === mount.dir ? mount.candidate.subPath ?? "" : file.slice(mount.dir.length + 1);
  let sources = null;
  if (volume?.secret) sources = [volume.secret];
  else if (volume?.projected) sources = (volume.projected.sources ?? []).map((s) => s.secret).filter(Boolean);
  if (!sources || sources.length === 0) {
    problems.push(`${where}: volume ${mount.candidate.name} is not a Secret`);
    return;
  }
  const provided = sources.some((s) => !s.items || s.items.some((item) => item.path === relative));
  if (!provided) problems.push(`${where}: volume ${mount.candidate.name} has no item ${relative}`);
}

function checkTridentPod(object, problems) {
  const pod = object.spec?.template?.spec;
  if (!pod) return;
  for (const container of pod.containers ?? []) {
    if (!BINARIES.has(binaryOf(container))) continue;
    const ports = container.ports ?? [];
    const grpcPort = ports.find((p) => p.name === "grpc")?.containerPort;
    const metricsPort = ports.find((p) => p.name === "metrics")?.containerPort;
    const flags = flagValues(container);
    const tls = flags.has("tls_cert_file") || flags.has("tls_key_file");
    if (tls) {
      for (const needed of ["tls_cert_file", "tls_key_file", "tls_ca_file"]) {
        if (!flags.get(needed)) problems.push(`container ${container.name}: serves TLS without --${needed}`);
      }
      // The kubelet's gRPC probe speaks plaintext only.
      const isPort = (port, name, number) => port !== undefined && (port === name || port === number);
      for (const probe of ["startupProbe", "readinessProbe"]) {
        if (container[probe]?.grpc) {
          problems.push(`container ${container.name}: ${probe} is a gRPC probe, but the gRPC port serves TLS, which the kubelet's gRPC probe cannot speak`);
        } else if (!isPort(container[probe]?.tcpSocket?.port, "grpc", grpcPort)) {
          problems.push(`container ${container.name}: ${probe} is not a TCP probe on its grpc port ${grpcPort} (TLS)`);
        }
      }
      const liveness = container.livenessProbe?.httpGet;
      if (container.livenessProbe?.grpc) {
        problems.push(`container ${container.name}: livenessProbe is a gRPC probe, but the gRPC port serves TLS, which the kubelet's gRPC probe cannot speak`);
      } else if (!liveness || liveness.path !== "/metrics" || !isPort(liveness.port, "metrics", metricsPort) ||
          (liveness.scheme ?? "HTTP") !== "HTTP") {
        problems.push(`container ${container.name}: livenessProbe does not GET /metrics on its metrics port ${metricsPort} (TLS)`);
      }
    } else {
      for (const probe of ["startupProbe", "livenessProbe", "readinessProbe"]) {
        if (container[probe]?.grpc?.port !== grpcPort) {
          problems.push(`container ${container.name}: ${probe} is not a gRPC probe on its grpc port ${grpcPort}`);
        }
      }
    }
    for (const flag of RELOADED_FILE_FLAGS) {
      if (flags.get(flag)) checkReloadedFile(pod, container, flag, flags.get(flag), problems);
    }
  }
  if (object.spec.template.metadata?.labels?.["app.kubernetes.io/component"] !== "attention") return;
  for (const container of [...(pod.initContainers ?? []), ...(pod.containers ?? [])]) {
    const { requests = {}, limits = {} } = container.resources ?? {};
    for (const resource of ["cpu", "memory"]) {
      if (limits[resource] === undefined || String(requests[resource]) !== String(limits[resource])) {
        problems.push(`container ${container.name}: attention pods must be Guaranteed QoS: ${resource} request ${requests[resource]} != limit ${limits[resource]}`);
      }
    }
    if (!/^[1-9][0-9]*$/.test(String(limits.cpu))) {
      problems.push(`container ${container.name}: attention pods need an integer CPU count, got ${limits.cpu}`);
    }
  }
}

// ---------------------------------------------------------------------------
// Flags against the binaries' --helpfull.

function readFlags(file) {
  const flags = new Set();
  for (const line of readFileSync(file, "utf8").split("\n")) {
    const match = /^ {4}--([A-Za-z0-9_]+) /.exec(line);
    if (match) flags.add(match[1]);
  }
  if (flags.size === 0) throw new Error(`${file}: no flags found in --helpfull output`);
  return flags;
}

function checkFlags(object, flagsByBinary, problems, checked) {
  const pod = object.spec?.template?.spec;
  if (!pod) return;
  for (const container of [...(pod.initContainers ?? []), ...(pod.containers ?? [])]) {
    const binary = binaryOf(container);
    const flags = flagsByBinary.get(binary);
    if (!flags) {
      if (BINARIES.has(binary) || binary === "make_model") {
        problems.push(`container ${container.name}: no --helpfull given for ${binary}`);
      }
      continue;
    }
    for (const arg of container.args ?? []) {
      if (!arg.startsWith("--")) continue;
      const name = arg.slice(2).split("=")[0];
      const known = flags.has(name) || (name.startsWith("no") && flags.has(name.slice(2)));
      checked.count++;
      if (!known) problems.push(`container ${container.name}: ${binary} has no flag --${name}`);
    }
  }
}

// ---------------------------------------------------------------------------

async function main() {
  const options = parseArgs(process.argv.slice(2));
  const nodeModules = path.resolve(options.nodeModules);
  const require = createRequire(path.join(nodeModules, "..", "resolve.js"));
  const YAML = require("yaml");

  const types = new Map();
  const roots = new Map();
  for (const dir of ["kubernetes-models", "@kubernetes-models/apimachinery", "@kubernetes-models/prometheus-operator"]) {
    for (const [file, fields] of indexDeclarations(path.join(nodeModules, dir), types)) roots.set(file, fields);
  }
  const flagsByBinary = new Map();
  for (const [binary, file] of options.helpfull) flagsByBinary.set(binary, readFlags(file));

  const problems = [];
  const kinds = new Map();
  const checkedFlags = { count: 0 };
  let manifests = 0;
  for (const file of options.files) {
    const seen = new Set();
    const documents = YAML.parseAllDocuments(readFileSync(file, "utf8"));
    for (const document of documents) {
      for (const error of document.errors) problems.push(`${path.basename(file)}: YAML: ${error.message}`);
      const object = document.toJS();
      if (object === null || object === undefined) continue;
      manifests++;
      const id = `${object.kind}/${object.metadata?.name}`;
      const report = (message) => problems.push(`${path.basename(file)}: ${id}: ${message}`);
      if (typeof object.apiVersion !== "string" || typeof object.kind !== "string") {
        report("apiVersion and kind are required");
        continue;
      }
      kinds.set(object.kind, (kinds.get(object.kind) ?? 0) + 1);
      const key = `${object.kind}/${object.metadata?.namespace ?? ""}/${object.metadata?.name}`;
      if (seen.has(key)) report("a second object of this kind, namespace and name");
      seen.add(key);

      const result = await validateSchema(nodeModules, object, types);
      if (result.missing) {
        report(`no schema for apiVersion ${object.apiVersion}, kind ${object.kind}`);
        continue;
      }
      const local = [...result.problems];
      const root = roots.get(result.declaration);
      if (root) checkUnknownFields(object, { fields: root }, "", types, local);
      checkNames(object, local);
      checkTridentPod(object, local);
      checkFlags(object, flagsByBinary, local, checkedFlags);
      for (const message of local) report(message);
    }
  }

  const summary = [...kinds.entries()].sort().map(([kind, n]) => `${n} ${kind}`).join(", ");
  if (problems.length > 0) {
    for (const problem of problems) console.log(`INVALID ${problem}`);
    console.log(`${problems.length} problem(s) in ${manifests} manifests from ${options.files.length} render(s)`);
    process.exit(1);
  }
  const flagNote = flagsByBinary.size > 0 ? `; ${checkedFlags.count} flags known to their binaries` : "";
  console.log(`validated ${manifests} manifests from ${options.files.length} render(s) (${summary})${flagNote}`);
}

main().catch((error) => {
  console.log(`ERROR ${error.stack ?? error}`);
  process.exit(2);
});
