{{- /*
Written by hand (`make helm-chart` keeps this directory): the webhook's
serving certificate when cert-manager is not used (certManager.enabled=false,
webhook.enabled=true). Helm generates a CA (genCA) and a serving certificate
signed by it (genSignedCert) for the webhook Service's DNS names; the Secret
(selfsigned-secret.yaml) holds both and the ValidatingWebhookConfiguration
gets the CA as caBundle (`make helm-chart` inserts the include into the
plugin's validating-webhook-configuration.yaml).

On `helm upgrade` the Secret in the cluster is reused (lookup) as long as it
was made for the same DNS names, so the certificate stays stable. Delete the
Secret and run `helm upgrade` to get a new one. `helm template` and
`--dry-run=client` cannot look up and always generate a new pair.
*/ -}}

{{/* Name of the Secret the controller mounts at --webhook-cert-path (the same name cert-manager's Certificate writes). */}}
{{- define "egressip.webhookCertSecretName" -}}
webhook-server-cert
{{- end }}

{{/* True (non-empty) when the chart, not cert-manager, makes the webhook certificate. */}}
{{- define "egressip.webhookSelfSigned" -}}
{{- if and .Values.webhook.enabled (not .Values.certManager.enabled) }}true{{ end }}
{{- end }}

{{/* DNS names of the webhook Service, as a comma-separated string. */}}
{{- define "egressip.webhookDNSNames" -}}
{{- $svc := include "egressip.resourceName" (dict "suffix" "webhook-service" "context" .) -}}
{{- printf "%s.%s.svc,%s.%s.svc.cluster.local" $svc .Release.Namespace $svc .Release.Namespace -}}
{{- end }}

{{/*
The certificate as a dict of base64 Secret data (ca.crt, tls.crt, tls.key).
Made once per rendering and kept in .Values (every template of a chart shares
that map), so the Secret and the caBundle agree.
*/}}
{{- define "egressip.webhookCert" -}}
{{- if not (hasKey .Values "__egressipWebhookCert") }}
{{- $dnsNames := include "egressip.webhookDNSNames" . }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "egressip.webhookCertSecretName" .) }}
{{- $data := dict }}
{{- if $secret }}
{{- $old := $secret.data | default dict }}
{{- $madeFor := index ($secret.metadata.annotations | default dict) "egressip.io/webhook-dns-names" | default "" }}
{{- if and (eq $madeFor $dnsNames) (index $old "ca.crt") (index $old "tls.crt") (index $old "tls.key") }}
{{- $data = dict "ca.crt" (index $old "ca.crt") "tls.crt" (index $old "tls.crt") "tls.key" (index $old "tls.key") }}
{{- end }}
{{- end }}
{{- if not $data }}
{{- $names := list }}
{{- range splitList "," $dnsNames }}{{ $names = append $names . }}{{ end }}
{{- $ca := genCA (printf "%s-webhook-ca" (include "egressip.fullname" .)) 3650 }}
{{- $cert := genSignedCert (first $names) nil $names 3650 $ca }}
{{- $data = dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) }}
{{- end }}
{{- $_ := set .Values "__egressipWebhookCert" $data }}
{{- end }}
{{- toJson (index .Values "__egressipWebhookCert") }}
{{- end }}

{{/* caBundle of the ValidatingWebhookConfiguration: empty unless self-signed. */}}
{{- define "egressip.webhookCABundle" -}}
{{- if include "egressip.webhookSelfSigned" . }}
{{- index (include "egressip.webhookCert" . | fromJson) "ca.crt" }}
{{- end }}
{{- end }}
