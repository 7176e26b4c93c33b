#!/usr/bin/env bash
# Writes the chart's CRD templates from config/crd/bases: each CRD wrapped in
# crd.enabled, with the crd.keep resource policy (what kubebuilder's helm
# plugin generates; used where that plugin is not installed).
set -euo pipefail
cd "$(dirname "$0")/.."
for f in config/crd/bases/egressip.io_*.yaml; do
  name=$(awk '/^  name: /{print $2; exit}' "$f")
  out="charts/chart/templates/crd/${name}.yaml"
  {
    echo '{{- if .Values.crd.enabled }}'
    sed -e '/^---$/d' "$f" | awk '
      /^  annotations:$/ && !done {print; print "    {{- if .Values.crd.keep }}"; print "    \"helm.sh/resource-policy\": keep"; print "    {{- end }}"; done=1; next}
      {print}'
    echo '{{- end }}'
  } > "$out.tmp"
  mv "$out.tmp" "$out"
done
